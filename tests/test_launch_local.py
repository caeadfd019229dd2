"""The local executor end to end on the toy testbed (real worker processes through submitit)."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ablate.cli.sweep import sweep_app
from ablate.experiments.launch import cancel, launch
from ablate.experiments.manifest import read_manifest
from ablate.experiments.slurm_profile import load_profile, slurm_minutes
from ablate.experiments.status import effective_state, sweep_status
from ablate.experiments.sweep import SpecError, expand, parse_spec
from ablate.runs.store import RunStore

TOY = str(Path("configs/toy.yaml").resolve())


def toy_sweep(out, steps=10, **kw):
    overrides = {"steps": steps, "eval.every": 0, "tracking.wandb.mode": "disabled", **kw.pop("overrides", {})}
    return parse_spec({"name": "toy", "base": {"config": TOY, "overrides": overrides},
                       "executor": {"max_parallel": 2}, "out": str(out), **kw}, "toy.yaml", Path("."))


def states(out):
    return {r["run_id"]: r["state"] for r in sweep_status(out)}


def test_grid_completes_and_rerun_submits_nothing(tmp_path):
    sweep = toy_sweep(tmp_path / "runs", grid={"recipe.scale": ["none", "group"], "recipe.eps_high": [0.2, 0.28]},
                      seeds=[0, 1])
    runs = expand(sweep)
    res = launch(sweep, runs, poll_s=0.2)
    assert len(res["submitted"]) == 8
    assert set(states(sweep.out).values()) == {"completed"}
    for r in runs:
        assert RunStore(sweep.out / r.run_id).status()["state"] == "completed"
    m = read_manifest(sweep.out)
    assert m["spec"]["name"] == "toy" and set(m["runs"]) == {r.run_id for r in runs}
    assert all(len(e["jobs"]) == 1 and e["jobs"][0]["job_id"] for e in m["runs"].values())
    again = launch(sweep, runs, poll_s=0.2)
    assert again["submitted"] == [] and len(again["skipped"]) == 8
    assert all(len(e["jobs"]) == 1 for e in read_manifest(sweep.out)["runs"].values())
    res = CliRunner().invoke(sweep_app, ["status", str(sweep.out)])
    assert res.exit_code == 0 and "completed: 8" in res.output


def _worker_pid(out, run_id, timeout=120):
    """The pid of the process training `run_id` (written by TrainJob), once it has logged a step."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = read_manifest(out)
        jobs = (m or {}).get("runs", {}).get(run_id, {}).get("jobs")
        if jobs:
            info = out / jobs[-1]["folder"] / f"{jobs[-1]['job_id']}_worker.json"
            st = RunStore(out / run_id).status() or {}
            if info.exists() and st.get("step", 0) >= 2:
                return json.loads(info.read_text())["pid"]
        time.sleep(0.1)
    raise TimeoutError(run_id)


def test_kill9_worker_is_failed_and_rerun_resubmits_only_it(tmp_path):
    sweep = toy_sweep(tmp_path / "runs", steps=150, seeds=[0, 1])
    runs = expand(sweep)
    victim, other = runs[0].run_id, runs[1].run_id
    thread = threading.Thread(target=launch, args=(sweep, runs), kwargs={"poll_s": 0.2})
    thread.start()
    os.kill(_worker_pid(sweep.out, victim), signal.SIGKILL)
    thread.join(300)
    rows = {r["run_id"]: r for r in sweep_status(sweep.out)}
    assert rows[victim]["state"] == "failed" and "ended without a result" in rows[victim]["error"]
    assert rows[other]["state"] == "completed"
    res = launch(sweep, runs, poll_s=0.2)
    assert res["submitted"] == [victim]
    assert states(sweep.out) == {victim: "completed", other: "completed"}
    steps = [row["step"] for row in RunStore(sweep.out / victim).read("metrics")]
    assert steps == list(range(1, 151))  # every step exactly once after the restart


def test_run_that_raises_is_failed_with_traceback(tmp_path):
    import shutil

    # every file reads (the preflight passes), but the weights do not fit the config: loading fails in the worker
    shutil.copytree("models/tiny-arith", tmp_path / "no-such-model")
    config = json.loads((tmp_path / "no-such-model" / "config.json").read_text())
    (tmp_path / "no-such-model" / "config.json").write_text(json.dumps({**config, "intermediate_size": 200}))
    sweep = parse_spec({"name": "bad", "base": {"config": str(Path("configs/quickstart.yaml").resolve()),
                                                 "overrides": {"model.path": str(tmp_path / "no-such-model"),
                                                               "steps": 1, "tracking.wandb.mode": "disabled"}},
                        "out": str(tmp_path / "runs")}, "bad.yaml", Path("."))
    runs = expand(sweep)  # valid config: it only fails when the worker loads the (broken) model
    launch(sweep, runs, poll_s=0.2)
    (row,) = sweep_status(sweep.out)
    assert row["state"] == "failed" and row["scheduler"] == "FAILED"
    status = json.loads((sweep.out / runs[0].run_id / "status.json").read_text())
    assert status["state"] == "failed" and "Traceback" in status["error"] and "mismatch" in status["error"]


def test_cancel_stops_active_and_pending_runs(tmp_path):
    sweep = toy_sweep(tmp_path / "runs", steps=3000, seeds=[0, 1, 2], executor={"max_parallel": 1})
    runs = expand(sweep)
    thread = threading.Thread(target=launch, args=(sweep, runs), kwargs={"poll_s": 0.2})
    thread.start()
    _worker_pid(sweep.out, runs[0].run_id)
    assert sorted(cancel(sweep.out)) == sorted(r.run_id for r in runs)
    thread.join(120)
    assert not thread.is_alive()
    assert set(states(sweep.out).values()) == {"cancelled"}
    assert len(read_manifest(sweep.out)["runs"][runs[2].run_id]["jobs"]) == 0  # never started


def test_debug_executor_runs_in_process(tmp_path):
    sweep = toy_sweep(tmp_path / "runs", steps=3, executor={"name": "debug"})
    launch(sweep, expand(sweep))
    (row,) = sweep_status(sweep.out)
    assert row["state"] == "completed" and row["executor"] == "debug"


def test_effective_state_table():
    assert effective_state("completed", "LOST") == "completed"
    assert effective_state("failed", "RUNNING") == "running"  # requeued after preemption, not yet resumed
    assert effective_state("failed", "REQUEUED") == "pending"
    assert effective_state(None, "PENDING") == "pending"
    assert effective_state("running", "LOST") == "failed"  # worker killed: the store could not say so
    assert effective_state("running", "CANCELLED") == "cancelled"
    assert effective_state("failed", "FAILED") == "failed"
    assert effective_state(None, "CANCELLED") == "cancelled"
    assert effective_state(None, None) == "missing"
    assert effective_state(None, "UNKNOWN") == "pending"  # just submitted; sacct does not list it yet


def test_slurm_profile_parsing(tmp_path):
    p = tmp_path / "dev.yaml"
    p.write_text(yaml.safe_dump({"partition": "debug", "time": "1:30:00", "gpus": 1, "cpus": 4, "mem": "16G",
                                 "account": "lab", "qos": "low", "constraint": "a100",
                                 "setup": ["module load cuda"], "array_parallelism": 8}))
    assert load_profile(p) == {
        "slurm_partition": "debug", "timeout_min": 90, "gpus_per_node": 1, "cpus_per_task": 4, "slurm_mem": "16G",
        "slurm_account": "lab", "slurm_qos": "low", "slurm_constraint": "a100", "slurm_setup": ["module load cuda"],
        "slurm_array_parallelism": 8}
    assert [slurm_minutes(t) for t in (45, "45", "10:30", "2:00:00", "1-00", "1-02:30")] == [45, 45, 11, 120, 1440, 1590]
    with pytest.raises(SpecError, match="gpu: unknown key"):
        p.write_text("gpu: 1\n")
        load_profile(p)
    with pytest.raises(SpecError, match="no such SLURM profile"):
        load_profile(tmp_path / "missing.yaml")


def test_edited_spec_leaves_earlier_runs_stale_kept_and_out_of_the_report(tmp_path):
    """Changing a fixed override changes every run id: the earlier runs stay on disk, marked stale in the
    manifest; status and the report use only the current ones (else `steps` would show up as a factor)."""
    from ablate.analysis import build_report

    first = toy_sweep(tmp_path / "runs", steps=5, grid={"recipe.scale": ["none", "group"]}, seeds=[0])
    old = {r.run_id for r in expand(first)}
    launch(first, expand(first), poll_s=0.2)
    edited = toy_sweep(tmp_path / "runs", steps=6, grid={"recipe.scale": ["none", "group"]}, seeds=[0])
    new = {r.run_id for r in expand(edited)}
    launch(edited, expand(edited), poll_s=0.2)
    assert not old & new and all((tmp_path / "runs" / rid / "status.json").exists() for rid in old | new)
    m = read_manifest(edited.out)
    assert {rid for rid, e in m["runs"].items() if e["current"]} == new
    assert set(states(edited.out)) == new
    res = CliRunner().invoke(sweep_app, ["status", str(edited.out)])
    assert "2 run folder(s) from an earlier version of the spec" in res.output

    rep = build_report([edited.out], tmp_path / "r.html", metric="eval/pass@1_exact", reps=100, figures=False)
    assert [f.name for f in rep.study.factors] == ["scale"] and set(rep.study.runs["run_id"]) == new
    assert set(rep.study.stale["run_id"]) == old
    assert any("2 stale run folder(s) not used" in w for w in rep.warnings)
    listed = rep.runs.set_index("run_id")
    assert set(listed.index) == old | new and not listed.loc[sorted(old), "included"].any()
    assert "stale: not in the current spec" in (tmp_path / "r.md").read_text()


def test_wait_blocks_until_every_run_ended_and_run_wait_exits_1_naming_the_diverged_run(tmp_path):
    from ablate.experiments.status import wait

    spec = tmp_path / "w.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "w", "out": str(tmp_path / "runs"), "executor": {"max_parallel": 2},
        "base": {"config": TOY, "overrides": {"steps": 40, "eval.every": 0, "tracking.wandb.mode": "disabled"}},
        "arms": {"fine": {}, "blows_up": {"optim.optimizer": "adamw", "optim.lr": 3e38}}}))
    from ablate.experiments.sweep import load_spec

    sweep = load_spec(spec)
    runs = expand(sweep)
    thread = threading.Thread(target=launch, args=(sweep, runs), kwargs={"poll_s": 0.2})
    thread.start()  # as a SLURM array would: the runs go on elsewhere, this process only waits
    _worker_pid(sweep.out, next(r.run_id for r in runs if r.arm == "fine"))
    seen = []
    rows = {r["arm"]: r for r in wait(sweep.out, poll_s=0.2, log=lambda rows: seen.append({r["arm"]: r["state"] for r in rows}["fine"]))}
    thread.join(60)
    assert seen[0] == "running" and rows["fine"]["state"] == "completed" and rows["blows_up"]["state"] == "diverged"
    # every run of the sweep counts, also those finished by an earlier `sweep run`: nothing is resubmitted here
    res = CliRunner().invoke(sweep_app, ["run", str(spec), "--wait", "--quiet", "--poll", "0.2"])
    assert res.exit_code == 1, res.output
    assert f"diverged: {rows['blows_up']['run_id']} (blows_up) at step 1/40" in res.output
    assert rows["fine"]["run_id"] not in res.output.split("diverged:")[-1]
    assert CliRunner().invoke(sweep_app, ["run", str(spec), "--wait", "--poll", "0"]).exit_code == 2
