"""W&B mirror: offline files read back and compared with the local run store, step for step.

The offline `.wandb` transaction log is decoded with `python -m wandb leet inspect --json FILE` (one JSON
record per line; wandb >= 0.2x has no public Python reader for it).
"""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import crash_training_at

wandb = pytest.importorskip("wandb")

from ablate.config import load, run_id, to_dict
from ablate.runs import tracking
from ablate.runs.store import RunStore
from ablate.train import trainer

FAKE_KEY = "local-" + "f00dfeed" * 5


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path, monkeypatch):
    """Offline W&B with every W&B folder private to the test; no credentials."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var, sub in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / sub))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for var in ("WANDB_API_KEY", "WANDB_RUN_ID", "WANDB_DISABLED", "WANDB_BASE_URL", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)


def toy(*overrides):
    return load("configs/toy.yaml", list(overrides))


def run(cfg, path):
    assert trainer.train(cfg, str(path), progress=False) == "completed"
    return RunStore(path)


def records(run_dir) -> list[list[dict]]:
    """The records of each offline W&B session of a run folder, in the order they were written."""
    files = sorted(Path(run_dir, "wandb").glob("offline-run-*/run-*.wandb"), key=lambda p: p.stat().st_mtime)
    out = []
    for f in files:
        text = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(f)],
                              capture_output=True, text=True, check=True).stdout
        out.append([json.loads(line) for line in text.splitlines() if line.strip()])
    return out


def history(sessions) -> list[dict]:
    return [r["history"]["item"] for recs in sessions for r in recs if r["type"] == "history"]


def summary(sessions) -> dict:
    merged = {}
    for r in (r for recs in sessions for r in recs if r["type"] == "summary"):
        merged.update(r["summary"].get("update", {}))
    return merged


def no_perf(row):
    return {k: v for k, v in row.items() if not k.startswith("perf/")}


def assert_mirrors(store, rows, compare=lambda r: r):
    """Each local metrics/evals row is in the W&B row of its step, under its own names, same values."""
    by_step = {}
    for row in rows:
        assert row["_step"] not in by_step, f"step {row['_step']} logged twice"
        by_step[row["_step"]] = row
        assert row["train/step"] == row["_step"]
    local = {}
    for log in ("metrics", "evals"):
        for r in store.read(log):
            local.setdefault(r["step"], {}).update({k: v for k, v in r.items() if k != "step"})
    assert sorted(by_step) == sorted(local)
    for step, values in local.items():
        got = {k: by_step[step][k] for k in values if k in by_step[step]}
        assert compare(got) == compare(values), step


def test_offline_history_matches_local_store(tmp_path):
    store_cfg = toy("steps=6", "eval.every=3")
    store = run(store_cfg, tmp_path / "run")
    sessions = records(tmp_path / "run")
    assert len(sessions) == 1
    rows = history(sessions)
    assert [r["_step"] for r in rows] == list(range(7))
    assert_mirrors(store, rows)
    # counters ride along so x-axes can switch; step 0 (evaluation before training) has them at 0
    assert rows[0]["counters/samples"] == 0
    assert rows[6]["counters/samples"] == store.read("metrics")[-1]["counters/samples"]
    # x-axis: every family is plotted against train/step
    metric_defs = {r["metric"].get("glob_name"): r["metric"].get("step_metric")
                   for r in sessions[0] if r["type"] == "metric"}
    assert {metric_defs[f"{p}/*"] for p in ("train", "eval", "perf", "counters")} == {"train/step"}
    # samples: one table per evaluation, with every sample row of that step
    per_step = {}
    for s in store.read("samples"):
        per_step[s["step"]] = per_step.get(s["step"], 0) + 1
    assert {r["_step"]: r["samples.nrows"] for r in rows if "samples.nrows" in r} == per_step
    table_file = next((tmp_path / "run/wandb").glob("offline-run-*/files/media/table/samples_3_*.json"))
    table = json.loads(table_file.read_text())
    assert table["columns"] == list(tracking.SAMPLE_COLUMNS)
    assert {row[1] for row in table["data"]} == {"heldout", "train"}
    # run metadata: name, tags, full config, summary with final/best held-out metrics and status
    (meta,) = [r["run"] for r in sessions[0] if r["type"] == "run"]
    assert meta["display_name"] == "grpo-s0" and "baseline=group_mean" in meta["tags"]
    config = {k: v for k, v in meta["config"]["update"].items() if k != "_wandb"}
    assert config == {"run_id": run_id(store_cfg), **to_dict(store_cfg)}  # the full nested resolved config
    final = summary(sessions)
    evals = store.read("evals")
    assert final["status"] == "completed" and final["final_step"] == 6
    assert final["final/eval/pass@1"] == evals[-1]["eval/pass@1"]
    assert final["best/eval/pass@1"] == max(r["eval/pass@1"] for r in evals)
    assert json.loads((tmp_path / "run/wandb.json").read_text())["last_step"] == 6


def test_resume_continues_the_same_wandb_run_with_each_step_once(tmp_path, monkeypatch):
    cfg = toy("steps=12", "checkpoint_every=4", "eval.every=3")
    crash_training_at(monkeypatch, cfg, tmp_path / "run", step=7)
    wandb_id = json.loads((tmp_path / "run/wandb.json").read_text())["id"]
    store = run(cfg, tmp_path / "run")  # resumes from step 4 and re-logs 5..12 locally

    sessions = records(tmp_path / "run")
    assert len(sessions) == 2
    run_ids = [r["run"]["run_id"] for recs in sessions for r in recs if r["type"] == "run"]
    assert run_ids == [wandb_id, wandb_id]
    exits = [r["exit"].get("exit_code", 0) for recs in sessions for r in recs if r["type"] == "exit"]
    assert exits == [1, 0]
    rows = history(sessions)
    assert [r["_step"] for r in rows] == list(range(13))  # 0..7 from the crashed part, 8..12 after
    # steps 5..7 keep their first values in W&B; only timings may differ from the re-run
    assert_mirrors(store, rows, compare=no_perf)
    assert summary(sessions)["status"] == "completed"


def test_init_failure_warns_once_and_training_goes_on(tmp_path, monkeypatch):
    def broken_init(*args, **kwargs):
        raise wandb.errors.CommError("no route to W&B")

    monkeypatch.setattr(wandb, "init", broken_init)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = run(toy("steps=5"), tmp_path / "run")
    mine = [w for w in caught if "W&B" in str(w.message)]
    assert len(mine) == 1 and "failed to start" in str(mine[0].message) and "no route" in str(mine[0].message)
    assert [r["step"] for r in store.read("metrics")] == [1, 2, 3, 4, 5]
    assert store.status()["state"] == "completed"


def test_log_failure_mid_run_warns_once_and_store_stays_complete(tmp_path, monkeypatch):
    real_log, calls = wandb.Run.log, {"n": 0}

    def log_then_fail(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full under wandb/")
        return real_log(self, *args, **kwargs)

    monkeypatch.setattr(wandb.Run, "log", log_then_fail)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = run(toy("steps=6", "eval.every=3"), tmp_path / "run")
    mine = [w for w in caught if "WandbMirror" in str(w.message) or "W&B" in str(w.message)]
    assert len(mine) == 1 and "disk full" in str(mine[0].message)
    assert [r["step"] for r in store.read("metrics")] == list(range(1, 7))
    assert [r["step"] for r in store.read("evals")] == [0, 3, 6]
    assert store.status()["state"] == "completed"
    sessions = records(tmp_path / "run")
    assert [r["_step"] for r in history(sessions)] == [0, 1]  # what got through before the failure
    assert [r["exit"].get("exit_code", 0) for r in sessions[0] if r["type"] == "exit"] == [1]


@pytest.mark.parametrize("how", ["config", "env"])
def test_disabled_writes_nothing(tmp_path, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("WANDB_MODE", "disabled")
        cfg = toy("steps=3", "tracking.wandb.mode=offline")
    else:
        monkeypatch.delenv("WANDB_MODE")
        cfg = toy("steps=3", "tracking.wandb.mode=disabled")
    assert tracking.open_mirrors(cfg, tmp_path / "probe") == [] and not (tmp_path / "probe").exists()
    run(cfg, tmp_path / "run")
    assert not (tmp_path / "run/wandb").exists() and not (tmp_path / "run/wandb.json").exists()
    assert not (tmp_path / "wandb-home").exists()


def test_no_api_key_in_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    run(toy("steps=3", "eval.every=3"), tmp_path / "run")
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files)
    leaks = [p for p in files if FAKE_KEY.encode() in p.read_bytes() or b"f00dfeed" in p.read_bytes()]
    assert leaks == []


def test_mode_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE")
    cfg = toy()
    assert tracking.resolve_mode(cfg) == "offline"  # auto, no credentials
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    assert tracking.resolve_mode(cfg) == "online"
    monkeypatch.delenv("WANDB_API_KEY")
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {FAKE_KEY}\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert tracking.resolve_mode(cfg) == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")  # a self-hosted server without an entry
    assert tracking.resolve_mode(cfg) == "offline"
    monkeypatch.setenv("WANDB_MODE", "online")  # the env overrides the config ...
    assert tracking.resolve_mode(toy("tracking.wandb.mode=offline")) == "online"
    assert tracking.resolve_mode(toy("tracking.wandb.mode=disabled")) == "disabled"  # ... but not an opt-out


def test_auto_falls_back_to_offline_when_online_fails(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    real_init = wandb.init

    def no_network(*args, **kwargs):
        if kwargs.get("mode") == "online":
            raise wandb.errors.CommError("Timed out while retrying")
        return real_init(*args, **kwargs)

    monkeypatch.setattr(wandb, "init", no_network)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = run(toy("steps=2"), tmp_path / "run")
    assert ["offline instead" in str(w.message) for w in caught if "W&B" in str(w.message)] == [True]
    assert [r["_step"] for r in history(records(store.root))] == [0, 1, 2]


def test_run_name_and_tags():
    cfg = toy("seed=1", "recipe.eps_high=0.28")
    assert tracking.run_name(cfg) == "grpo-s1"
    assert tracking.run_name(cfg, {"recipe.eps_high": 0.28, "seed": 1}) == "grpo-eps_high=0.28-s1"
    assert tracking.run_name(load("configs/toy.yaml", ["preset=null"])) == "custom-s0"
    assert "clip_higher" in tracking.run_tags(cfg) and "preset=grpo" in tracking.run_tags(cfg)


def test_sweep_on_local_executor_mirrors_every_run_grouped_by_sweep(tmp_path):
    """One offline W&B run per run folder, grouped by the sweep, named by what differs, history equal
    to the local metrics."""
    from ablate.experiments.launch import launch
    from ablate.experiments.sweep import expand, parse_spec

    toy_cfg = str(Path("configs/toy.yaml").resolve())
    sweep = parse_spec({"name": "wb", "base": {"config": toy_cfg, "overrides": {"steps": 6, "eval.every": 3}},
                        "grid": {"recipe.eps_high": [0.2, 0.28]}, "seeds": [0, 1],
                        "executor": {"max_parallel": 2}, "out": str(tmp_path / "runs")}, "wb.yaml", Path("."))
    runs = expand(sweep)
    launch(sweep, runs, poll_s=0.2)
    names = set()
    for r in runs:
        store = RunStore(sweep.out / r.run_id)
        sessions = records(store.root)
        assert len(sessions) == 1
        run_rec = next(x["run"] for x in sessions[0] if x["type"] == "run")
        assert run_rec["run_group"] == "wb" and run_rec["job_type"] == "train"
        names.add(run_rec.get("display_name"))
        rows = history(sessions)
        local = {m["step"]: m for m in store.read("metrics")}
        assert sorted(row["_step"] for row in rows) == list(range(0, 7))  # step 0 = the base evaluation
        for row in rows:
            for k, v in no_perf(local.get(row["_step"], {})).items():
                if k != "step":
                    assert row[k] == v, (r.run_id, row["_step"], k)
    assert names == {"grpo-eps_high=0.2-s0", "grpo-eps_high=0.28-s0", "grpo-eps_high=0.2-s1", "grpo-eps_high=0.28-s1"}


def test_unreachable_wandb_costs_tracking_timeout_s_once_with_one_line(tmp_path, monkeypatch):
    """An online W&B whose server does not answer (a closed local port): start-up waits tracking.timeout_s
    (not wandb's 60-90 s), says so in one line, and the run goes on offline with the local store complete."""
    import time

    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_INIT_TIMEOUT", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # discard port: connection refused
    assert load("configs/toy.yaml").tracking.timeout_s <= 10  # the default is small
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = run(toy("steps=2", "tracking.timeout_s=1"), tmp_path / "run")
    took = time.perf_counter() - t0
    (msg,) = [str(w.message) for w in caught if "W&B" in str(w.message)]
    assert "offline instead" in msg and "no answer within 1 s, tracking.timeout_s" in msg and "\n" not in msg
    assert took < 20, took
    assert [r["step"] for r in store.read("metrics")] == [1, 2] and store.status()["state"] == "completed"


def test_offline_run_prints_one_line(tmp_path, capfd):
    run(toy("steps=1"), tmp_path / "run")
    err = [line for line in capfd.readouterr().err.splitlines() if "wandb" in line.lower()]
    assert len(err) == 1 and "wandb sync" in err[0], err


def test_episode_metrics_are_mirrored(tmp_path):
    """A multi-turn run (calculator episodes, the committed tiny-calc model): W&B holds every episode/* value
    the store logged, plotted against train/step."""
    cfg = load("configs/calculator.yaml", ["steps=2", "eval.every=0", "eval.n_samples=2", "eval.ks=[1, 2]",
                                           "task.num_heldout=4", "prompts_per_step=2"])
    store = run(cfg, tmp_path / "run")
    sessions = records(tmp_path / "run")
    rows = history(sessions)
    assert_mirrors(store, rows, no_perf)
    assert all("episode/turns" in r and "episode/env_token_frac" in r for r in rows if r["_step"] > 0)
    metric_defs = {r["metric"].get("glob_name"): r["metric"].get("step_metric")
                   for r in sessions[0] if r["type"] == "metric"}
    assert metric_defs["episode/*"] == "train/step"
