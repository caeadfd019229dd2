"""Files a run reads are read before anything is written (ablate/train/preflight.py).

The principle: every file a run will read (each task kind's data file and held-out file, a mixture entry's,
each JSON file and the weights of the model folder, the tokenizer's chat template, the pass-rate cache) is
read and checked by `train`, `sweep plan`, `sweep run`, `tune` and `difficulty` before any folder exists; a
damaged one exits 2 with `field: file:line: what is wrong`, no traceback, nothing written. The cases are
generated: every data file of every task kind x every way to damage one of its lines, every JSON file of
the model folder, every entry point. In-process through typer's CliRunner; nothing here trains."""

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from conftest import assert_refused
from typer.testing import CliRunner

from ablate.cli.main import app
from ablate.config import load
from ablate.train import preflight

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "models" / "tiny-arith"
LM = {"preset": "grpo", "steps": 2, "prompts_per_step": 2, "recipe": {"group_size": 2, "max_new_tokens": 4},
      "eval": {"every": 0, "n_samples": 2, "ks": [1]}, "tracking": {"wandb": {"mode": "disabled"}}, "model": {"path": "m"}}
QA = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(20)]
QA_HELDOUT = [{"prompt": f"{i} * 3 =", "answer": str(3 * i)} for i in range(5)]
CODE = [{"prompt": f"Write `f(x)` returning x + {i}.", "tests": [f"assert candidate(1) == {1 + i}"], "entry_point": "f"}
        for i in range(25)]
# a user's multi-turn environments (`task.environment: module:Class`), imported from a folder on sys.path
ENVS = """
import time
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class Echo(BaseTextEnv):
    \"\"\"One turn: reward 1 when the turn is the answer.\"\"\"

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        self.answer = extras["reward_spec"]["ground_truth"]

    def init(self, prompt):
        return prompt, {}

    def step(self, action):
        return BaseTextEnvStepOutput(observations=[], reward=float(action == self.answer), done=True, metadata={})


class BuildFails(Echo):
    def __init__(self, env_config=None, extras=None):
        raise KeyError("extras has no 'tools'")


class InitFails(Echo):
    def init(self, prompt):
        raise ConnectionError("the tool server is down")


class StepFails(Echo):
    def step(self, action):
        raise RuntimeError("the grader crashed")


class WrongTypes(Echo):
    def step(self, action):
        return {"observations": "not a list", "reward": "1", "done": 1, "metadata": {}}


class Hangs(Echo):
    def step(self, action):
        while True:
            time.sleep(0.01)
"""
ENV = "preflight_envs:Echo"

# every data file a task reads: (task section, the field naming the file, the file, its rows, a row of the
# right shape with a wrong type)
DATA_FILES = {
    "jsonl.path": ({"name": "jsonl", "path": "d.jsonl"}, "task.path", "d.jsonl", QA, {"prompt": 1, "answer": "2"}),
    "jsonl.heldout_path": ({"name": "jsonl", "path": "d.jsonl", "heldout_path": "h.jsonl"}, "task.heldout_path",
                           "h.jsonl", QA_HELDOUT, {"prompt": "x", "answer": [2]}),
    "code.path": ({"name": "code", "path": "d.jsonl", "num_heldout": 2}, "task.path", "d.jsonl", CODE[:20],
                  {"prompt": "x", "tests": 5, "entry_point": "f"}),
    "code.heldout_path": ({"name": "code", "path": "d.jsonl", "heldout_path": "h.jsonl"}, "task.heldout_path",
                          "h.jsonl", CODE[20:], {"prompt": "x", "tests": ["assert True"], "entry_point": "not an id"}),
    "env.path": ({"name": "env", "environment": ENV, "path": "d.jsonl"}, "task.path", "d.jsonl", QA,
                 {"prompt": 1, "answer": "2"}),
    "env.heldout_path": ({"name": "env", "environment": ENV, "path": "d.jsonl", "heldout_path": "h.jsonl"},
                         "task.heldout_path", "h.jsonl", QA_HELDOUT, {"prompt": "x", "answer": {"a": 3}}),
    "env-code.path": ({"name": "env", "environment": "code", "path": "d.jsonl", "num_heldout": 2}, "task.path", "d.jsonl",
                      CODE[:20], {"prompt": "x", "tests": 5, "entry_point": "f"}),
    "mixture[1].path": ({"name": "mixture", "num_train": 20, "mixture": [{"name": "arithmetic", "num_heldout": 4},
                                                                        {"name": "jsonl", "path": "d.jsonl"}]},
                        "task.mixture[1].path", "d.jsonl", QA, {"prompt": "x", "answer": None}),
}
# ways to damage line 3 of a JSONL data file: (name, the line's bytes (None: the wrong-type row), the message)
LINE_DAMAGES = [("bad-json", b'{"prompt": "x", ', "bad JSON"), ("not-utf8", b'{"prompt": "\xff\xfe"}', "not UTF-8"),
                ("not-an-object", b'["x", "2"]', "expected an object"), ("missing-key", b'{"answer": "2"}', "missing key"),
                ("wrong-type", None, "must be")]
ENTRIES = {"train": ["train", "c.yaml", "--out", "run"], "sweep plan": ["sweep", "plan", "s.yaml"],
           "sweep run": ["sweep", "run", "s.yaml", "--executor", "debug", "--quiet"],
           "tune": ["tune", "run", "t.yaml", "--executor", "inline"], "difficulty": ["difficulty", "c.yaml", "--quiet"]}


@pytest.fixture(scope="module")
def envs_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("envs")
    (d / "preflight_envs.py").write_text(ENVS)
    return d


@pytest.fixture(autouse=True)
def user_environments(envs_folder, monkeypatch):
    """`preflight_envs:CLASS` importable, as a user's environment module on PYTHONPATH (outside the tested folder,
    which must stay unchanged: its bytecode is written there)."""
    monkeypatch.syspath_prepend(str(envs_folder))


def jsonl(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def write_inputs(d: Path, task: dict, model: Path = TINY, **cfg) -> None:
    """c.yaml (an LM run of `task` on a copy of `model` in m/), a sweep spec s.yaml and a search spec t.yaml."""
    shutil.copytree(model, d / "m")
    (d / "c.yaml").write_text(yaml.safe_dump({**LM, "task": task, **cfg}))
    (d / "s.yaml").write_text(yaml.safe_dump({"name": "s", "base": {"config": "c.yaml"}, "seeds": [0, 1], "out": "sw"}))
    (d / "t.yaml").write_text(yaml.safe_dump({
        "name": "t", "base": {"config": "c.yaml"}, "seeds": [0], "trials": 1, "out": "tr",
        "search": {"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-3}}, "objective": {"metric": "eval/pass@1"}}))


def damage_line(rows, line: bytes | None, wrong: dict) -> bytes:
    data = jsonl(rows).splitlines(keepends=True)
    data[2] = (line if line is not None else json.dumps(wrong).encode()) + b"\n"
    return b"".join(data)


def data_inputs(d: Path, case: str, damage: bytes | None) -> tuple[str, str]:
    """The inputs of DATA_FILES[case] with line 3 of its file damaged; (the field, the file)."""
    task, field, name, rows, wrong = DATA_FILES[case]
    write_inputs(d, task)
    code = "code" in (task["name"], task.get("environment"))
    for f, good in (("d.jsonl", CODE[:20] if code else QA), ("h.jsonl", rows)):
        (d / f).write_bytes(jsonl(good))
    (d / name).write_bytes(damage_line(rows, damage, wrong))
    return field, name


@pytest.mark.parametrize("damage, line, what", LINE_DAMAGES, ids=[c[0] for c in LINE_DAMAGES])
@pytest.mark.parametrize("case", DATA_FILES)
def test_every_line_damage_of_every_data_file_is_named_with_its_line(tmp_path, monkeypatch, case, damage, line, what):
    field, name = data_inputs(tmp_path, case, line)
    assert_refused(tmp_path, ENTRIES["sweep plan"], monkeypatch, "s.yaml", f"{field}: {name}:3: ", what)


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_point_reads_the_data_before_writing(tmp_path, monkeypatch, entry):
    field, name = data_inputs(tmp_path, "jsonl.path", LINE_DAMAGES[0][1])
    source = "s.yaml" if entry.startswith("sweep") else "t.yaml" if entry == "tune" else "c.yaml"
    assert_refused(tmp_path, ENTRIES[entry], monkeypatch, source, f"{field}: {name}:3: bad JSON")


MODEL_JSON = sorted(p.name for p in TINY.glob("*.json") if p.name in preflight.MODEL_JSON)


def test_the_model_folder_cases_cover_what_transformers_reads():
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(MODEL_JSON)


@pytest.mark.parametrize("name", MODEL_JSON)
def test_every_json_file_of_the_model_folder_is_parsed_before_writing(tmp_path, monkeypatch, name):
    write_inputs(tmp_path, {"name": "arithmetic"})
    text = (tmp_path / "m" / name).read_text()
    (tmp_path / "m" / name).write_text(text[: len(text) // 2])  # cut mid-file: not JSON
    assert_refused(tmp_path, ENTRIES["train"], monkeypatch, "c.yaml", f"model.path: m/{name}:", "not valid JSON")


@pytest.mark.parametrize("damage, expected", [
    ("truncated-weights", "model.safetensors: not a whole safetensors file"),
    ("no-weights", "no weights"),
    ("unknown-model-type", "config.json: transformers cannot read it"),
    ("no-chat-template", "task.chat_template: true, but the tokenizer of m has no chat template"),
])
def test_model_weights_config_and_chat_template_are_checked(tmp_path, monkeypatch, damage, expected):
    write_inputs(tmp_path, {"name": "jsonl", "path": "d.jsonl", "chat_template": damage == "no-chat-template"})
    (tmp_path / "d.jsonl").write_bytes(jsonl(QA))
    weights = tmp_path / "m" / "model.safetensors"
    if damage == "truncated-weights":
        weights.write_bytes(weights.read_bytes()[:1000])
    if damage == "no-weights":
        weights.unlink()
    if damage == "unknown-model-type":
        config = json.loads((tmp_path / "m" / "config.json").read_text())
        (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "model_type": "no-such-architecture"}))
    for entry in ("train", "sweep plan"):
        assert_refused(tmp_path, ENTRIES[entry], monkeypatch, expected)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from ablate.train.chat_model import build_chat_model

    return build_chat_model(tmp_path_factory.mktemp("chat") / "model", QA, sft_steps=0)


def test_a_chat_template_that_does_not_render_is_named(tmp_path, monkeypatch, chat_model):
    write_inputs(tmp_path, {"name": "jsonl", "path": "d.jsonl", "chat_template": True}, model=chat_model)
    (tmp_path / "d.jsonl").write_bytes(jsonl(QA))
    for f in (tmp_path / "m").glob("*"):
        if f.name in ("tokenizer_config.json", "chat_template.jinja"):
            f.write_text(f.read_text().replace("{% endfor %}", ""))  # an unclosed for loop: a Jinja error
    assert_refused(tmp_path, ENTRIES["train"], monkeypatch, "task: the prompt of problem", "cannot be formatted")


def test_a_corrupt_pass_rate_cache_is_named(tmp_path, monkeypatch):
    from ablate.train.difficulty import band_defaults, cache_path

    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    write_inputs(tmp_path, {"name": "arithmetic", "pass_rate_band": [0.1, 0.9]})
    monkeypatch.chdir(tmp_path)
    cfg = load("c.yaml")
    path = cache_path(cfg, *band_defaults(cfg))
    path.parent.mkdir(parents=True)
    path.write_text('{"rates": {"x": ')
    assert_refused(tmp_path, ENTRIES["train"], monkeypatch, "task.pass_rate_band:", str(path), "not a pass-rate cache")


def test_good_inputs_of_every_task_kind_pass(tmp_path, monkeypatch, chat_model):
    """No false alarm: each task kind's valid inputs (and a chat model's template) pass the preflight."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_bytes(jsonl(QA))
    (tmp_path / "c.jsonl").write_bytes(jsonl(CODE))
    tasks = [{"name": "arithmetic"}, {"name": "jsonl", "path": "d.jsonl"}, {"name": "code", "path": "c.jsonl"},
             {"name": "code"}, {"name": "reasoning_gym", "dataset": "chain_sum", "num_train": 50, "num_heldout": 8},
             {"name": "mixture", "num_train": 20, "mixture": [{"name": "arithmetic"}, {"name": "jsonl", "path": "d.jsonl"}]},
             {"name": "env", "environment": "calculator"}, {"name": "env", "environment": "code"},
             {"name": "env", "environment": "code", "path": "c.jsonl"}, {"name": "env", "environment": ENV, "path": "d.jsonl"}]
    for task in tasks:
        (tmp_path / "c.yaml").write_text(yaml.safe_dump({**LM, "model": {"path": str(TINY)}, "task": task}))
        assert preflight.problems_of(load("c.yaml")) == (), task
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**LM, "model": {"path": str(chat_model)},
                                                     "task": {"name": "jsonl", "path": "d.jsonl", "chat_template": True}}))
    assert preflight.problems_of(load("c.yaml")) == ()
    assert preflight.problems_of(load(ROOT / "configs" / "toy.yaml")) == ()


@pytest.mark.parametrize("env, expected", [
    ("BuildFails", "cannot be built for problem"), ("InitFails", "ConnectionError: the tool server is down"),
    ("StepFails", "RuntimeError: the grader crashed"), ("WrongTypes", "step() returned done=1; expected a bool"),
    ("Hangs", "no answer within 0.3 s (episode.env_timeout_s)")])
def test_an_environment_that_fails_its_first_episode_is_named(tmp_path, monkeypatch, env, expected):
    """A multi-turn task's environment is its verifier: built for the first held-out problem, given its prompt
    and its reference answer through the episode loop's guarded calls. One that fails there would end every
    episode with reward 0; every entry point names it instead, writing nothing."""
    write_inputs(tmp_path, {"name": "env", "environment": f"preflight_envs:{env}", "path": "d.jsonl",
                            "episode": {"env_timeout_s": 0.3}})
    (tmp_path / "d.jsonl").write_bytes(jsonl(QA))
    for entry in ENTRIES:
        source = "s.yaml" if entry.startswith("sweep") else "t.yaml" if entry == "tune" else "c.yaml"
        if entry != "difficulty":  # an environment task has no pass-rate band (config.validate refuses one)
            assert_refused(tmp_path, ENTRIES[entry], monkeypatch, source, f"task.environment 'preflight_envs:{env}'",
                           expected)


def test_a_100_run_sweep_reads_its_data_file_once(tmp_path, monkeypatch):
    """Cached per file version: `sweep plan` of 100 runs (and the tasks built in this process after it)
    open the data file once; a changed file is read again."""
    write_inputs(tmp_path, {"name": "jsonl", "path": "d.jsonl"})
    (tmp_path / "d.jsonl").write_bytes(jsonl(QA))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "s", "base": {"config": "c.yaml"}, "seeds": list(range(50)),
                                                     "grid": {"optim.lr": [1e-4, 2e-4]}}))
    data, opened, watching = os.path.realpath(tmp_path / "d.jsonl"), [], [True]

    def hook(event, args):  # every read of the data file in this process, whoever opens it
        if watching and event == "open" and isinstance(args[0], (str, os.PathLike)) and "r" in str(args[1]):
            if os.path.realpath(args[0]) == data:
                opened.append(args[0])

    sys.addaudithook(hook)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["sweep", "plan", "s.yaml"])
    assert res.exit_code == 0, res.output
    assert "100 runs" in res.output and len(opened) == 1
    from ablate.tasks import make_task

    make_task(load("c.yaml").task)  # what the trainer builds in this process: the same rows, not read again
    assert len(opened) == 1
    (tmp_path / "d.jsonl").write_bytes(jsonl(QA[:10]))  # a new version: read again
    assert CliRunner().invoke(app, ["sweep", "plan", "s.yaml"]).exit_code == 0
    assert len(opened) == 2
    watching.clear()


def test_the_trainer_checks_before_it_writes(tmp_path):
    """Runs started from Python (a sweep worker, a notebook) pass the same preflight before the run folder
    exists; the CLI's check and the trainer's read the file once between them (the cache)."""
    from ablate.train.trainer import train

    field, name = data_inputs(tmp_path, "jsonl.path", b"{")
    cfg = load(tmp_path / "c.yaml", [f"task.path={tmp_path / name}", f"model.path={tmp_path / 'm'}"])
    with pytest.raises(preflight.PreflightError, match=re.escape(f"task.path: {tmp_path / name}:3: bad JSON")):
        train(cfg, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()
