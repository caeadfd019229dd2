"""A table of hostile inputs: configs, --set values, sweep specs, SLURM profiles, search specs and run
folders. Each must exit 2 with a message naming the file and the field (and the allowed values where
there is a set), and leave every file as it was: nothing written, nothing changed. In-process through
typer's CliRunner; nothing here trains (bad input is refused before a run starts)."""

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ablate.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
TOY = (ROOT / "configs" / "toy.yaml").read_text()
SPEC = {"name": "s", "base": {"config": "toy.yaml", "overrides": {"steps": 2}}, "seeds": [0]}
SEARCH = {"name": "t", "base": {"config": "toy.yaml", "overrides": {"steps": 2}}, "seeds": [0], "trials": 2,
          "search": {"optim.lr": {"type": "float", "low": 0.1, "high": 1.0}},
          "objective": {"metric": "eval/pass@1"}}
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def y(data) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def spec(**kw) -> str:
    return y({**SPEC, **kw})


def search(**kw) -> str:
    return y({**SEARCH, **kw})


def toy(extra: str) -> str:
    return TOY + extra


def run_folder(files: dict) -> dict:
    """A run folder `r/` with the given files (config.yaml of the toy run unless given)."""
    return {f"r/{k}": v for k, v in files.items()}


# (id, files to create, argv, substrings the message must contain)
# argv may use {d} for the temporary folder; files are relative to it ({cwd} in a file: the folder's name).
CASES = [
    # --- run configs (ablate train) ---
    ("cfg-non-utf8", {"c.yaml": b"steps: 5\nname: \xff\xfe\n"}, ["train", "c.yaml"], ["c.yaml", "not UTF-8"]),
    ("cfg-bad-yaml", {"c.yaml": "steps: [1, 2\n"}, ["train", "c.yaml"], ["c.yaml", "not valid YAML"]),
    ("cfg-duplicate-key", {"c.yaml": "steps: 5\nsteps: 6\n"}, ["train", "c.yaml"], ["c.yaml", "duplicate key 'steps'"]),
    ("cfg-duplicate-nested", {"c.yaml": toy("optim:\n  lr: 1\n")}, ["train", "c.yaml"], ["c.yaml", "duplicate key 'optim'"]),
    ("cfg-alias-bomb", {"c.yaml": BOMB}, ["train", "c.yaml"], ["c.yaml", "aliases"]),
    ("cfg-empty", {"c.yaml": ""}, ["train", "c.yaml"], ["c.yaml", "empty config"]),
    ("cfg-list", {"c.yaml": "- steps\n"}, ["train", "c.yaml"], ["c.yaml", "expected a mapping"]),
    ("cfg-missing", {}, ["train", "nope.yaml"], ["nope.yaml", "no such config file"]),
    ("cfg-unknown-top", {"c.yaml": toy("nope: 1\n")}, ["train", "c.yaml"], ["c.yaml", "nope: unknown key", "prompts_per_step"]),
    ("cfg-unknown-recipe", {"c.yaml": "recipe:\n  bogus: 1\n"}, ["train", "c.yaml"], ["c.yaml", "recipe.bogus", "group_size"]),
    ("cfg-baseline-literal", {"c.yaml": "recipe:\n  baseline: mean\n"}, ["train", "c.yaml"],
     ["c.yaml", "recipe.baseline", "'group_mean'", "'leave_one_out'"]),
    ("cfg-preset-list", {"c.yaml": "preset: [grpo]\n"}, ["train", "c.yaml"], ["c.yaml", "preset", "grpo", "dr_grpo"]),
    ("cfg-preset-unknown", {"c.yaml": "preset: ppo2\n"}, ["train", "c.yaml"], ["c.yaml", "preset", "rloo"]),
    ("cfg-steps-string", {"c.yaml": "steps: ten\n"}, ["train", "c.yaml"], ["c.yaml", "steps", "expected int"]),
    ("cfg-steps-zero", {"c.yaml": toy("").replace("steps: 250", "steps: 0")}, ["train", "c.yaml"], ["c.yaml", "steps: 0 is not allowed; allowed: an integer >= 1"]),
    ("cfg-seed-negative", {"c.yaml": toy("seed: -1\n")}, ["train", "c.yaml"], ["c.yaml", "seed: -1 is not allowed; allowed: an integer >= 0"]),
    ("cfg-lr-inf", {"c.yaml": "optim:\n  lr: .inf\n"}, ["train", "c.yaml"], ["c.yaml", "optim.lr: inf is not allowed; allowed: a number > 0"]),
    ("cfg-lr-nan", {"c.yaml": "optim:\n  lr: .nan\n"}, ["train", "c.yaml"], ["c.yaml", "optim.lr: nan is not allowed"]),
    ("cfg-lr-negative", {"c.yaml": "optim:\n  lr: -1\n"}, ["train", "c.yaml"], ["c.yaml", "optim.lr: -1.0 is not allowed; allowed: a number > 0"]),
    ("cfg-ks-too-big", {"c.yaml": "eval:\n  ks: [1, 99]\n"}, ["train", "c.yaml"], ["c.yaml", "eval.ks"]),
    ("cfg-task-name", {"c.yaml": "task:\n  name: chess\n"}, ["train", "c.yaml"], ["c.yaml", "task.name", "'arithmetic'", "'jsonl'"]),
    ("cfg-device", {"c.yaml": "device: gpu\n"}, ["train", "c.yaml"], ["c.yaml", "device", "'cpu'", "'cuda'"]),
    ("cfg-device-cuda-without-cuda", {"c.yaml": toy("device: cuda\n")}, ["train", "c.yaml", "--out", "o"],
     ["c.yaml", "device", "'cpu'"]),
    ("cfg-dtype", {"c.yaml": "model:\n  dtype: float16\n"}, ["train", "c.yaml"], ["c.yaml", "model.dtype", "'bfloat16'"]),
    ("cfg-wandb-mode", {"c.yaml": "tracking:\n  wandb:\n    mode: cloud\n"}, ["train", "c.yaml"],
     ["c.yaml", "tracking.wandb.mode", "'offline'"]),
    ("cfg-model-missing", {"c.yaml": "model:\n  path: ./no/such/model\n"}, ["train", "c.yaml"],
     ["c.yaml", "model.path: no such folder"]),
    ("cfg-model-no-config", {"c.yaml": "model:\n  path: m\n", "m/weights.bin": "x"}, ["train", "c.yaml"],
     ["c.yaml", "model.path", "config.json"]),
    ("cfg-hub-id-offline", {"c.yaml": "model:\n  path: nobody/no-such-model-xyz\n"}, ["train", "c.yaml"],
     ["c.yaml", "model.path", "HF_HUB_OFFLINE"]),
    ("cfg-jsonl-missing", {"c.yaml": "task:\n  name: jsonl\n  path: data.jsonl\n"}, ["train", "c.yaml"],
     ["c.yaml", "task.path: no such file"]),
    ("cfg-jsonl-empty", {"c.yaml": "task:\n  name: jsonl\n  path: data.jsonl\n", "data.jsonl": ""}, ["train", "c.yaml"],
     ["c.yaml", "task.path", "empty"]),
    ("cfg-digits", {"c.yaml": "task:\n  digits: [9]\n"}, ["train", "c.yaml"], ["c.yaml", "task.digits"]),
    ("cfg-group-size-1", {"c.yaml": "recipe:\n  group_size: 1\n"}, ["train", "c.yaml"], ["c.yaml", "recipe.group_size"]),
    ("cfg-toy-kl", {"c.yaml": toy("").replace("kl_coef: 0.0", "kl_coef: 0.1")}, ["train", "c.yaml"],
     ["c.yaml", "recipe.kl_coef must be 0"]),
    ("cfg-eps-low", {"c.yaml": "recipe:\n  eps_low: 1.5\n"}, ["train", "c.yaml"], ["c.yaml", "recipe.eps_low"]),
    ("cfg-ks-type", {"c.yaml": "eval:\n  ks: 8\n"}, ["train", "c.yaml"], ["c.yaml", "eval.ks", "expected a list"]),
    # --- --set ---
    ("set-bad-yaml", {"c.yaml": TOY}, ["train", "c.yaml", "--set", "eval.ks=[1, 8"], ["--set", "eval.ks", "not valid YAML"]),
    ("set-section", {"c.yaml": TOY}, ["train", "c.yaml", "--set", "recipe=5"], ["--set recipe=5", "c.yaml", "section", "recipe.baseline"]),
    ("set-no-equals", {"c.yaml": TOY}, ["train", "c.yaml", "--set", "steps"], ["--set 'steps'", "expected key=value"]),
    ("set-empty-key", {"c.yaml": TOY}, ["train", "c.yaml", "--set", "=5"], ["--set '=5'", "expected key=value"]),
    ("set-unknown", {"c.yaml": TOY}, ["train", "c.yaml", "--set", "recipe.nope=1"], ["--set recipe.nope=1", "c.yaml", "unknown key", "group_size"]),
    ("set-literal", {"c.yaml": TOY}, ["train", "c.yaml", "--set", "recipe.baseline=foo"],
     ["--set", "recipe.baseline", "'group_mean'"]),
    ("set-type", {"c.yaml": TOY}, ["train", "c.yaml", "--set", "steps=abc"], ["--set", "steps", "expected int"]),
    ("set-preset", {"c.yaml": TOY}, ["train", "c.yaml", "--set", "preset=nope"], ["--set preset", "c.yaml", "grpo"]),
    ("set-under-value", {"c.yaml": TOY}, ["train", "c.yaml", "--set", "seed.x=1"], ["--set seed.x=1", "c.yaml", "seed is a value"]),
    ("set-lr-inf", {"c.yaml": TOY}, ["train", "c.yaml", "--set", "optim.lr=.inf"], ["c.yaml", "optim.lr: inf is not allowed"]),
    # --- --out ---
    ("out-empty", {"c.yaml": TOY}, ["train", "c.yaml", "--out", ""], ["--out", "give a folder"]),
    ("out-file", {"c.yaml": TOY, "f.txt": "x"}, ["train", "c.yaml", "--out", "f.txt"], ["--out f.txt", "is a file"]),
    ("out-sweep-root", {"c.yaml": TOY, "sw/manifest.json": json.dumps({"name": "x", "runs": {}})},
     ["train", "c.yaml", "--out", "sw"], ["--out sw", "manifest.json"]),
    # --- run folders ---
    ("run-no-config", run_folder({"metrics.jsonl": '{"step": 1}\n', "status.json": '{"state": "failed", "step": 1}'}),
     ["train", "{root}/configs/toy.yaml", "--out", "r"], ["r", "metrics.jsonl", "status.json", "no config.yaml"]),
    ("run-corrupt-config", run_folder({"config.yaml": "run_id: [x\n"}), ["train", "{root}/configs/toy.yaml", "--out", "r"],
     ["r/config.yaml", "unreadable run config"]),
    ("run-other-run", run_folder({"config.yaml": "run_id: abcabcabcabc\n"}), ["train", "{root}/configs/toy.yaml", "--out", "r"],
     ["r", "holds another run (abcabcabcabc)"]),
    ("run-corrupt-status", "toy-run", ["train", "{root}/configs/toy.yaml", "--out", "r"], ["r/status.json", "unreadable run status"]),
    ("run-truncated-checkpoint", "toy-run", ["train", "{root}/configs/toy.yaml", "--out", "r"],
     ["r/checkpoint.pt", "not a readable checkpoint"]),
    ("run-foreign-checkpoint", "toy-run", ["train", "{root}/configs/toy.yaml", "--out", "r"],
     ["r/checkpoint.pt", "not of run"]),
    ("run-corrupt-log", "toy-run", ["train", "{root}/configs/toy.yaml", "--out", "r"], ["r/metrics.jsonl:2", "corrupt line"]),
    # --- sweep specs (ablate sweep plan) ---
    ("spec-non-utf8", {"toy.yaml": TOY, "s.yaml": b"name: \xff\n"}, ["sweep", "plan", "s.yaml"], ["s.yaml", "not UTF-8"]),
    ("spec-bad-yaml", {"toy.yaml": TOY, "s.yaml": "name: [x\n"}, ["sweep", "plan", "s.yaml"], ["s.yaml", "not valid YAML"]),
    ("spec-duplicate", {"toy.yaml": TOY, "s.yaml": spec() + "seeds: [1]\n"}, ["sweep", "plan", "s.yaml"], ["s.yaml", "duplicate key 'seeds'"]),
    ("spec-alias-bomb", {"toy.yaml": TOY, "s.yaml": BOMB}, ["sweep", "plan", "s.yaml"], ["s.yaml", "aliases"]),
    ("spec-list", {"toy.yaml": TOY, "s.yaml": "- a\n"}, ["sweep", "plan", "s.yaml"], ["s.yaml", "expected a mapping"]),
    ("spec-unknown-top", {"toy.yaml": TOY, "s.yaml": spec(grids={})}, ["sweep", "plan", "s.yaml"], ["s.yaml", "grids: unknown key", "grid"]),
    ("spec-name-newline", {"toy.yaml": TOY, "s.yaml": spec(name="a\ntouch x")}, ["sweep", "plan", "s.yaml"], ["s.yaml", "name", "control"]),
    ("spec-name-missing", {"toy.yaml": TOY, "s.yaml": y({"base": SPEC["base"]})}, ["sweep", "plan", "s.yaml"], ["s.yaml", "name: required"]),
    ("spec-empty-grid", {"toy.yaml": TOY, "s.yaml": spec(grid={})}, ["sweep", "plan", "s.yaml"], ["s.yaml", "grid: empty"]),
    ("spec-grid-not-list", {"toy.yaml": TOY, "s.yaml": spec(grid={"recipe.eps_high": 0.2})}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "grid.recipe.eps_high", "expected a list"]),
    ("spec-grid-empty-axis", {"toy.yaml": TOY, "s.yaml": spec(grid={"recipe.eps_high": []})}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "grid.recipe.eps_high", "empty axis"]),
    ("spec-grid-unknown-field", {"toy.yaml": TOY, "s.yaml": spec(grid={"recipe.nope": [1]})}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "grid.recipe.nope", "not a config field"]),
    ("spec-grid-literal", {"toy.yaml": TOY, "s.yaml": spec(grid={"recipe.scale": ["std"]})}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "grid.recipe.scale[0]", "'group'"]),
    ("spec-base-config-missing", {"s.yaml": spec()}, ["sweep", "plan", "s.yaml"], ["s.yaml", "base.config", "no such config file"]),
    ("spec-base-config-duplicate", {"toy.yaml": TOY + "steps: 3\n", "s.yaml": spec()}, ["sweep", "plan", "s.yaml"],
     ["toy.yaml", "duplicate key 'steps'"]),
    ("spec-arm-preset", {"toy.yaml": TOY, "s.yaml": spec(arms={"a": {"preset": "ppo2"}})}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "arms.a.preset", "dapo"]),
    ("spec-seed-type", {"toy.yaml": TOY, "s.yaml": spec(seeds=["a"])}, ["sweep", "plan", "s.yaml"], ["s.yaml", "seeds[0]"]),
    ("spec-zip-lengths", {"toy.yaml": TOY, "s.yaml": spec(zip=[{"recipe.eps_high": [0.2, 0.3], "optim.lr": [0.5]}])},
     ["sweep", "plan", "s.yaml"], ["s.yaml", "zip[0]", "equal length"]),
    ("spec-exclude-arm", {"toy.yaml": TOY, "s.yaml": spec(exclude=[{"arm": "zz"}])}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "exclude[0].arm", "unknown arm"]),
    ("spec-executor-name", {"toy.yaml": TOY, "s.yaml": spec(executor={"name": "k8s"})}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "executor.name", "local", "slurm"]),
    ("spec-invalid-run", {"toy.yaml": TOY, "s.yaml": spec(grid={"recipe.eps_high": [0.1, 0.3]})}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "invalid run", "recipe.eps_high"]),
    ("spec-grid-out-of-domain", {"toy.yaml": TOY, "s.yaml": spec(grid={"recipe.eps_low": [0.1, 2.0]})},
     ["sweep", "plan", "s.yaml"], ["s.yaml", "grid.recipe.eps_low[1]", "2.0 is not allowed", "[0, 1)"]),
    ("spec-model-missing", {"toy.yaml": "model:\n  path: ./gone\n", "s.yaml": spec()}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "model.path: no such folder"]),
    ("spec-out-empty", {"toy.yaml": TOY, "s.yaml": spec()}, ["sweep", "plan", "s.yaml", "--out", ""], ["--out", "'.' is not allowed", "a path naming"]),
    ("spec-out-file", {"toy.yaml": TOY, "s.yaml": spec(out="f.txt"), "f.txt": "x"}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "out", "is a file"]),
    ("sweep-status-corrupt-manifest", {"sw/manifest.json": "{not json"}, ["sweep", "status", "sw"],
     ["sw/manifest.json", "unreadable sweep manifest"]),
    ("sweep-status-not-a-sweep", {"sw/x": ""}, ["sweep", "status", "sw"], ["sw", "manifest.json"]),
    ("sweep-run-other-sweeps-root", {"toy.yaml": TOY, "s.yaml": spec(out="sw"),
                                     "sw/manifest.json": json.dumps({"name": "other", "runs": {}})},
     ["sweep", "run", "s.yaml", "--executor", "debug"], ["s.yaml", "out", "another sweep ('other')"]),
    # --- SLURM profiles (ablate sweep run --profile, refused before anything runs) ---
    ("profile-bad-yaml", {"toy.yaml": TOY, "s.yaml": spec(), "p.yaml": "partition: [x\n"},
     ["sweep", "run", "s.yaml", "--profile", "p.yaml"], ["p.yaml", "not valid YAML"]),
    ("profile-unknown-key", {"toy.yaml": TOY, "s.yaml": spec(), "p.yaml": "partitions: gpu\n"},
     ["sweep", "run", "s.yaml", "--profile", "p.yaml"], ["p.yaml", "partitions: unknown key", "partition"]),
    ("profile-newline", {"toy.yaml": TOY, "s.yaml": spec(), "p.yaml": y({"partition": "gpu\ntouch x"})},
     ["sweep", "run", "s.yaml", "--profile", "p.yaml"], ["p.yaml", "partition", "control characters"]),
    ("profile-time", {"toy.yaml": TOY, "s.yaml": spec(), "p.yaml": "time: soon\n"},
     ["sweep", "run", "s.yaml", "--profile", "p.yaml"], ["p.yaml", "time", "SLURM time"]),
    ("profile-additional-key", {"toy.yaml": TOY, "s.yaml": spec(), "p.yaml": y({"additional": {"a b": 1}})},
     ["sweep", "run", "s.yaml", "--profile", "p.yaml"], ["p.yaml", "additional", "option name"]),
    ("profile-nodes", {"toy.yaml": TOY, "s.yaml": spec(), "p.yaml": "nodes: 0\n"},
     ["sweep", "run", "s.yaml", "--profile", "p.yaml"], ["p.yaml", "nodes: 0", ">= 1"]),
    ("profile-tasks-vs-gpus", {"toy.yaml": TOY, "s.yaml": spec(), "p.yaml": "gpus: 8\ntasks_per_node: 2\n"},
     ["sweep", "run", "s.yaml", "--profile", "p.yaml"], ["p.yaml", "tasks_per_node: 2", "must be 8"]),
    ("profile-missing", {"toy.yaml": TOY, "s.yaml": spec()}, ["sweep", "run", "s.yaml", "--profile", "p.yaml"],
     ["p.yaml", "no such SLURM profile"]),
    # --- search specs (ablate tune status: validation only) ---
    ("tune-no-search", {"toy.yaml": TOY, "t.yaml": y({k: v for k, v in SEARCH.items() if k != "search"})},
     ["tune", "status", "t.yaml"], ["t.yaml", "search: required"]),
    ("tune-sampler-type", {"toy.yaml": TOY, "t.yaml": search(sampler={"name": "tpe", "n_startup_trials": "five"})},
     ["tune", "status", "t.yaml"], ["t.yaml", "sampler.n_startup_trials", "expected int"]),
    ("tune-sampler-name", {"toy.yaml": TOY, "t.yaml": search(sampler={"name": "bayes"})}, ["tune", "status", "t.yaml"],
     ["t.yaml", "sampler.name", "tpe", "random"]),
    ("tune-storage", {"toy.yaml": TOY, "t.yaml": search(storage="foo://x")}, ["tune", "status", "t.yaml"],
     ["t.yaml", "storage", "sqlite:///", "journal:"]),
    ("tune-metric", {"toy.yaml": TOY, "t.yaml": search(objective={"metric": "loss"})}, ["tune", "status", "t.yaml"],
     ["t.yaml", "objective.metric", "eval/pass@1"]),
    ("tune-low-high", {"toy.yaml": TOY, "t.yaml": search(search={"optim.lr": {"type": "float", "low": 2, "high": 1}})},
     ["tune", "status", "t.yaml"], ["t.yaml", "search.optim.lr", "low < high"]),
    ("tune-trials", {"toy.yaml": TOY, "t.yaml": search(trials=0)}, ["tune", "status", "t.yaml"], ["t.yaml", "trials"]),
    ("tune-duplicate", {"toy.yaml": TOY, "t.yaml": search() + "trials: 3\n"}, ["tune", "status", "t.yaml"],
     ["t.yaml", "duplicate key 'trials'"]),
    ("tune-status-new-study", {"toy.yaml": TOY, "t.yaml": search(out="tr")}, ["tune", "status", "t.yaml"],
     ["study.db", "does not exist"]),
    # --- spec and storage errors (issue 22, item 5): wrong YAML types, meaningless values, storages ---
    ("spec-name-list", {"toy.yaml": TOY, "s.yaml": spec(name=["a", "b"])}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "name", "expected str"]),
    ("spec-name-dotdot", {"toy.yaml": TOY, "s.yaml": spec(name="..")}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "name", "not '.' or '..'"]),
    ("spec-out-dot", {"toy.yaml": TOY, "s.yaml": spec(out=".")}, ["sweep", "plan", "s.yaml"],
     ["s.yaml", "out", "a path naming a file or folder"]),
    ("spec-out-is-cwd", {"toy.yaml": TOY, "s.yaml": spec(out="../{cwd}")}, ["sweep", "plan", "s.yaml"],
     ["s.yaml: out", "the working folder or a folder above it"]),
    ("spec-out-root", {"toy.yaml": TOY, "s.yaml": spec(out="/")}, ["sweep", "plan", "s.yaml"], ["s.yaml", "out"]),
    ("spec-timeout-negative", {"toy.yaml": TOY, "s.yaml": spec(executor={"timeout_min": -5})},
     ["sweep", "plan", "s.yaml"], ["s.yaml", "executor.timeout_min", "allowed: a number > 0"]),
    ("spec-timeout-mapping", {"toy.yaml": TOY, "s.yaml": spec(executor={"timeout_min": {"a": 1}})},
     ["sweep", "plan", "s.yaml"], ["s.yaml", "executor.timeout_min", "expected float"]),
    ("spec-grid-weight-decay", {"toy.yaml": TOY, "s.yaml": spec(grid={"optim.weight_decay": [0.0, -0.1]})},
     ["sweep", "plan", "s.yaml"], ["s.yaml", "grid.optim.weight_decay[1]", "allowed: a number >= 0"]),
    ("sweep-out-dotdot", {"toy.yaml": TOY, "s.yaml": spec()}, ["sweep", "plan", "s.yaml", "--out", ".."],
     ["--out", "'..' is not allowed"]),
    ("tune-name-list", {"toy.yaml": TOY, "t.yaml": search(name=["t"])}, ["tune", "status", "t.yaml"],
     ["t.yaml", "name", "expected str"]),
    ("tune-inf-bound", {"toy.yaml": TOY, "t.yaml": search(search={"optim.lr": {"type": "float", "low": 0.1,
                                                                              "high": float("inf")}})},
     ["tune", "status", "t.yaml"], ["t.yaml", "search.optim.lr.high", "a finite number"]),
    ("tune-bound-outside-field", {"toy.yaml": TOY, "t.yaml": search(search={"optim.weight_decay": {
        "type": "float", "low": -1.0, "high": 1.0}})}, ["tune", "status", "t.yaml"],
     ["t.yaml", "search.optim.weight_decay.low", "optim.weight_decay: -1.0 is not allowed"]),
    ("tune-timeout-negative", {"toy.yaml": TOY, "t.yaml": search(executor={"timeout_min": -1})},
     ["tune", "status", "t.yaml"], ["t.yaml", "executor.timeout_min", "a number > 0"]),
    ("tune-heartbeat-mapping", {"toy.yaml": TOY, "t.yaml": search(heartbeat={"interval_s": {"a": 1}})},
     ["tune", "status", "t.yaml"], ["t.yaml", "heartbeat.interval_s", "expected int"]),
    ("tune-storage-folder", {"toy.yaml": TOY, "t.yaml": search(), "adir/x": ""},
     ["tune", "run", "t.yaml", "--executor", "inline", "--storage", "sqlite:///adir"], ["--storage", "is a folder"]),
    ("tune-storage-not-sqlite", {"toy.yaml": TOY, "t.yaml": search(), "db.txt": "not a database\n"},
     ["tune", "run", "t.yaml", "--executor", "inline", "--storage", "sqlite:///db.txt"],
     ["--storage", "not an SQLite database"]),
    ("tune-storage-unreachable", {"toy.yaml": TOY, "t.yaml": search()},
     ["tune", "run", "t.yaml", "--executor", "inline", "--storage", "postgresql://nobody@127.0.0.1:1/x"],
     ["--storage", "cannot connect"]),
    ("tune-storage-not-a-url", {"toy.yaml": TOY, "t.yaml": search()},
     ["tune", "run", "t.yaml", "--executor", "inline", "--storage", "not-a-url"], ["--storage", "sqlite:///PATH"]),
    ("tune-storage-parent-file", {"toy.yaml": TOY, "t.yaml": search(storage="sqlite:///f.txt/s.db"), "f.txt": "x"},
     ["tune", "run", "t.yaml", "--executor", "inline"], ["t.yaml: storage", "is a file, not a folder"]),
    ("tune-storage-journal-garbage", {"toy.yaml": TOY, "t.yaml": search(storage="journal:j.log"), "j.log": "x\n"},
     ["tune", "run", "t.yaml", "--executor", "inline"], ["t.yaml: storage", "not an Optuna journal"]),
    ("profile-cpus-negative", {"toy.yaml": TOY, "s.yaml": spec(), "p.yaml": "cpus: -2\n"},
     ["sweep", "run", "s.yaml", "--profile", "p.yaml"], ["p.yaml", "cpus", "an integer >= 1"]),
    ("profile-setup-mapping", {"toy.yaml": TOY, "s.yaml": spec(), "p.yaml": "setup: {a: 1}\n"},
     ["sweep", "run", "s.yaml", "--profile", "p.yaml"], ["p.yaml", "setup", "expected a list"]),
    # --- report ---
    ("report-reps-0", {"r/x": ""}, ["report", "r", "--reps", "0"], ["--reps 0", ">= 1"]),
    ("report-ci", {"r/x": ""}, ["report", "r", "--ci", "magic"], ["--ci 'magic'", "percentile", "bca"]),
    ("report-missing", {}, ["report", "gone"], ["gone", "no such folder"]),
]


def make_toy_run(d: Path, case: str) -> None:
    """A real toy run folder of configs/toy.yaml (config, status, a log, a checkpoint), then the damage."""
    from ablate.config import load
    from ablate.runs.store import RunStore

    cfg = load(ROOT / "configs" / "toy.yaml")
    store = RunStore(d / "r")
    store.write_config(cfg)
    store.set_status("failed", 2, "node lost")
    for s in (1, 2):
        store.append("metrics", {"step": s})
    store.save_checkpoint({"step": 2}, "000000000000" if case == "run-foreign-checkpoint" else
                          __import__("ablate.config", fromlist=["run_id"]).run_id(cfg))
    if case == "run-corrupt-status":
        (d / "r" / "status.json").write_text("{")
    if case == "run-truncated-checkpoint":
        data = (d / "r" / "checkpoint.pt").read_bytes()
        (d / "r" / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    if case == "run-corrupt-log":
        (d / "r" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, \n{"step": 3}\n')


def snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


def invoke(d: Path, argv: list[str], monkeypatch):
    monkeypatch.chdir(d)
    return CliRunner().invoke(app, [a.replace("{root}", str(ROOT)) for a in argv])


@pytest.mark.parametrize("case, files, argv, expected", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_exits_2_naming_file_and_field_and_writes_nothing(tmp_path, monkeypatch, case, files, argv,
                                                                        expected):
    if files == "toy-run":
        make_toy_run(tmp_path, case)
    else:
        for name, body in files.items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            body = body if isinstance(body, bytes) else body.replace("{cwd}", tmp_path.name).encode()
            (tmp_path / name).write_bytes(body)
    before = snapshot(tmp_path)
    res = invoke(tmp_path, argv, monkeypatch)
    out = res.output
    assert res.exit_code == 2, (res.exit_code, out, res.exception)
    assert "Traceback" not in out
    missing = [e for e in expected if e not in out]
    assert not missing, (missing, out)
    assert snapshot(tmp_path) == before  # nothing written, nothing changed


def test_table_is_large_enough():
    assert len(CASES) >= 60
