"""The SLURM executor end to end on the real one-node dev cluster (`slurm/dev-cluster start`), toy testbed.

No mocks: runs are submitted with sbatch as one job array, cancelled with scancel, requeued by
submitit on SLURM's time-limit warning. The cluster has 2 cores shared with other work, so every run
is a few seconds of toy training; the time-limit test is the long one (about a minute). If the
cluster is down every test fails with a hint how to start it; deselect with `-m "not slurm"`.
"""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import SLURM_START_HINT
from typer.testing import CliRunner

from ablate.cli.sweep import sweep_app
from ablate.experiments.executors import ACTIVE
from ablate.experiments.launch import launch
from ablate.experiments.manifest import read_manifest, write_manifest
from ablate.experiments.status import sweep_status
from ablate.experiments.sweep import expand, load_spec
from ablate.runs.store import RunStore

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

ROOT = Path(__file__).resolve().parent.parent
TOY = str(ROOT / "configs/toy.yaml")
DEV_PROFILE = ROOT / "slurm/profiles/dev.yaml"
FINISHED = ("completed", "failed", "cancelled", "diverged", "pruned")


@pytest.fixture
def sbatch_calls(tmp_path, monkeypatch) -> Path:
    """Put a counting `sbatch` first on PATH (submitit runs `sbatch` from PATH): one line per call."""
    real = shutil.which("sbatch")
    assert real, SLURM_START_HINT
    bin_dir, log = tmp_path / "bin", tmp_path / "sbatch_calls.log"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{real}" "$@"\n')
    (bin_dir / "sbatch").chmod(0o755)
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def write_spec(tmp_path, name, steps, overrides=None, **kw) -> Path:
    """A toy sweep spec file (the CLI needs one); its runs go to <tmp_path>/runs."""
    spec = {"name": name, "base": {"config": TOY, "overrides": {
        "steps": steps, "eval.every": 0, "tracking.wandb.mode": "disabled", **(overrides or {})}},
            "out": str(tmp_path / "runs"), **kw}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_profile(tmp_path, **changes) -> Path:
    """The shipped dev profile with some keys changed."""
    data = {**yaml.safe_load(DEV_PROFILE.read_text()), **changes}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def rows_by_id(out) -> dict[str, dict]:
    return {r["run_id"]: r for r in sweep_status(out)}


def wait_for(what, check, timeout, every=0.5):
    """Poll `check()` until it returns something truthy; fail with `what` and the last value."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not after {timeout}s (last: {last})")


def wait_finished(out, timeout=300) -> dict[str, dict]:
    """Every run of the sweep in a final state (as `sweep status` sees it) and its job gone from the queue
    (a run store says `completed` a moment before its job has ended)."""
    def done():
        rows = rows_by_id(out)
        return rows if all(r["state"] in FINISHED and r["scheduler"] not in ACTIVE for r in rows.values()) else None
    try:
        return wait_for("sweep finished", done, timeout, every=1.0)
    except AssertionError:
        raise AssertionError(f"runs not finished after {timeout}s: "
                             f"{[(r['run_id'], r['state'], r['scheduler'], r['step']) for r in sweep_status(out)]}") from None


def squeue(job_id: str) -> tuple[str, str]:
    """(state, reason) of one job or array task, ('', '') once it has left the queue."""
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], capture_output=True, text=True, check=False)
    out = res.stdout.strip()
    return tuple(out.split("|")) if res.returncode == 0 and out else ("", "")  # type: ignore[return-value]


def scontrol(*args: str) -> None:
    res = subprocess.run(["scontrol", *args], capture_output=True, text=True, check=False)
    assert res.returncode == 0, f"scontrol {' '.join(args)}: {res.stderr.strip()}"


def metric_steps(run_dir) -> list[int]:
    return [row["step"] for row in RunStore(run_dir).read("metrics")]


# --- (a) one array for the whole grid --------------------------------------------------------------

def test_grid_is_one_job_array_and_completes(tmp_path, sbatch_calls):
    spec = write_spec(tmp_path, "grid", steps=10, seeds=[0, 1],
                      grid={"recipe.scale": ["none", "group"], "recipe.eps_high": [0.2, 0.28]})
    sweep = load_spec(spec)
    runs = expand(sweep)
    res = launch(sweep, runs, executor="slurm", profile=DEV_PROFILE)
    assert len(res["submitted"]) == 8
    calls = sbatch_calls.read_text().splitlines()
    assert len(calls) == 1, f"expected one sbatch call, got {calls}"
    m = read_manifest(sweep.out)
    jobs = [e["jobs"] for e in m["runs"].values()]
    assert all(len(j) == 1 and j[0]["executor"] == "slurm" for j in jobs)
    ids = [j[0]["job_id"] for j in jobs]
    assert len({i.split("_")[0] for i in ids}) == 1, f"not one array: {ids}"
    assert sorted(int(i.split("_")[1]) for i in ids) == list(range(8))
    assert len({j[0]["folder"] for j in jobs}) == 1
    assert len(list((sweep.out / jobs[0][0]["folder"]).glob("*_submission.sh"))) == 1

    rows = wait_finished(sweep.out)
    assert {r["state"] for r in rows.values()} == {"completed"}, rows
    assert {r["scheduler"] for r in rows.values()} == {"COMPLETED"}
    for r in runs:
        assert RunStore(sweep.out / r.run_id).status()["state"] == "completed"
        assert metric_steps(sweep.out / r.run_id) == list(range(1, 11))
        prov = json.loads((sweep.out / r.run_id / "provenance.json").read_text())
        assert prov["slurm_job_id"] and prov["slurm_array_task_id"] is not None
    res = CliRunner().invoke(sweep_app, ["status", str(sweep.out)])
    assert res.exit_code == 0 and "completed: 8" in res.output, res.output
    again = CliRunner().invoke(sweep_app, ["run", str(spec), "--executor", "slurm", "--profile", str(DEV_PROFILE),
                                           "--quiet"])
    assert again.exit_code == 0 and "0 submitted, 8 already finished" in again.output, again.output
    assert len(sbatch_calls.read_text().splitlines()) == 1  # nothing to submit: no sbatch at all


# --- (b) scancel -> cancelled -> resubmitted alone ---------------------------------------------------

def test_scancelled_run_is_cancelled_and_rerun_resubmits_only_it(tmp_path):
    # The victim trains ~30 s idle: still running when scancel's SIGKILL comes (KillWait, 2 s after a SIGTERM that
    # submitit ignores); the other run is short, so it has completed by the time `sweep run` comes again.
    steps = 6000  # ~30 s on an idle box: 600 steps (3 s) finished inside scancel's KillWait and completed
    spec = write_spec(tmp_path, "cancel", steps=steps, grid={"steps": [steps, 5]})
    sweep = load_spec(spec)
    runs = expand(sweep)
    victim, other = runs[0].run_id, runs[1].run_id
    assert runs[0].config.steps == steps
    launch(sweep, runs, executor="slurm", profile=DEV_PROFILE)
    job = read_manifest(sweep.out)["runs"][victim]["jobs"][0]["job_id"]
    wait_for(f"{victim} training", lambda: (RunStore(sweep.out / victim).status() or {}).get("step", 0) >= 2, 90, 0.1)
    subprocess.run(["scancel", job], check=True)

    def cancelled():
        res = CliRunner().invoke(sweep_app, ["status", str(sweep.out), "--json"])
        rows = {r["run_id"]: r for r in json.loads(res.output)}
        return rows if rows[victim]["state"] == "cancelled" else None
    rows = wait_for("scancelled run shown as cancelled", cancelled, 60)
    assert rows[victim]["scheduler"] == "CANCELLED" and rows[victim]["step"] < steps
    rows = wait_finished(sweep.out)
    assert rows[other]["state"] == "completed" and rows[victim]["state"] == "cancelled"

    res = CliRunner().invoke(sweep_app, ["run", str(spec), "--executor", "slurm", "--profile", str(DEV_PROFILE),
                                         "--quiet"])
    assert res.exit_code == 0 and "1 submitted, 1 already finished" in res.output, res.output
    m = read_manifest(sweep.out)
    assert len(m["runs"][victim]["jobs"]) == 2 and len(m["runs"][other]["jobs"]) == 1
    new = m["runs"][victim]["jobs"][1]["job_id"]
    assert new.split("_")[0] != job.split("_")[0]  # a new (one-task) array
    rows = wait_finished(sweep.out)
    assert rows[victim]["state"] == "completed" and rows[other]["state"] == "completed", rows
    assert metric_steps(sweep.out / victim) == list(range(1, steps + 1))  # restarted: every step exactly once


# --- (c) time limit -> checkpoint -> requeue -> resume ----------------------------------------------

def test_time_limit_requeues_and_resumes_from_checkpoint(tmp_path):
    # `time: 1` (minute) with USR2 12 s before the limit. slurmctld checks limits every 30 s and sends the
    # warning up to 30 s early, so USR2 lands 18-48 s into the job: after the trainer is up (start-up takes
    # 5 s, ~14 s on a busy box; a signal before submitit's handler would kill the worker, one before the
    # trainer's guard would requeue without a checkpoint), and the kill would follow 30 s later. The long
    # run needs 54-70 s of training (12-16 ms a toy step), so the warning finds it mid-run; checkpoint_every
    # 0: any checkpoint is the preemption's. A short second run makes the submission a real job array.
    # long enough that an idle machine (toy step ~5 ms; ~4 ms since tmp_path is on tmpfs, where the per-step
    # status fsync is free) is still training at 48 s: 12000 steps were, on disk
    steps = 15000
    spec = write_spec(tmp_path, "timeout", steps=steps, overrides={"checkpoint_every": 0}, grid={"steps": [steps, 3]})
    profile = write_profile(tmp_path, time=1, signal_delay_s=12)
    sweep = load_spec(spec)
    runs = expand(sweep)
    (run,) = [r for r in runs if r.config.steps == steps]
    run_dir = sweep.out / run.run_id
    launch(sweep, runs, executor="slurm", profile=profile)
    job = read_manifest(sweep.out)["runs"][run.run_id]["jobs"][0]
    job_id = job["job_id"]
    assert "_" in job_id  # an array task

    # submitit requeues the task itself (scontrol requeue); SLURM then holds it ~120 s (BeginTime):
    # release it, not in the same second as the kill, and lift its limit so the resumed part is not cut again.
    requeues, deadline = 0, time.monotonic() + 420
    while (RunStore(run_dir).status() or {}).get("state") != "completed":
        assert time.monotonic() < deadline, f"not completed: {RunStore(run_dir).status()}, squeue {squeue(job_id)}"
        state, reason = squeue(job_id)
        if state == "PENDING" and reason == "BeginTime":
            requeues += 1
            assert requeues <= 3, "requeued again and again"
            st = RunStore(run_dir).status()
            assert st["state"] == "running" and 0 < st["step"] < steps, st  # the preemption exit is not a failure
            time.sleep(2)
            scontrol("update", f"JobId={job_id}", "StartTime=now", "TimeLimit=5")
            wait_for("released task to leave BeginTime", lambda: squeue(job_id) != (state, reason), 30, 0.2)
        time.sleep(0.5)
    assert requeues >= 1, "the time limit warning never requeued the job"

    rows = wait_finished(sweep.out, timeout=60)
    assert {r["state"] for r in rows.values()} == {"completed"}, rows
    assert rows[run.run_id]["job_id"] == job_id  # the same task, requeued: no new submission
    assert metric_steps(run_dir) == list(range(1, steps + 1))  # each step exactly once
    assert [r["step"] for r in RunStore(run_dir).read("evals")] == [0, steps]
    resumed = json.loads((run_dir / "provenance.json").read_text())["resumed_from_steps"]
    assert resumed and 0 < resumed[0] < steps  # saved at a step boundary mid-run, by the warning (no scheduled
    assert RunStore(run_dir).load_checkpoint()["step"] == steps  # checkpoints); the final one is kept
    log = "".join((sweep.out / job["folder"] / f"{job_id}_0_log.{ext}").read_text() for ext in ("err", "out"))
    assert "Caught signal SIGUSR2" in log and "timed-out" in log, log[-3000:]
    assert "Exiting gracefully after preemption/timeout" in log
    assert log.count("Starting with JobEnvironment") == requeues + 1  # the requeued task ran again
    sacct = subprocess.run(["sacct", "-n", "-P", "-X", "-D", "-j", job_id, "-o", "JobID,State"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert any(line.endswith("|REQUEUED") for line in sacct) and sacct[-1].endswith("|COMPLETED"), sacct


# --- (d) a run that raises --------------------------------------------------------------------------

def test_run_that_raises_is_failed_with_traceback(tmp_path):
    import shutil

    # every file reads (the preflight passes), but the weights do not fit the config: loading fails in the worker
    shutil.copytree(ROOT / "models" / "tiny-arith", tmp_path / "no-such-model")
    config = json.loads((tmp_path / "no-such-model" / "config.json").read_text())
    (tmp_path / "no-such-model" / "config.json").write_text(json.dumps({**config, "intermediate_size": 200}))
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({"name": "bad", "out": str(tmp_path / "runs"), "base": {
        "config": str(ROOT / "configs/quickstart.yaml"),
        "overrides": {"model.path": str(tmp_path / "no-such-model"), "steps": 1, "tracking.wandb.mode": "disabled"}}}))
    sweep = load_spec(spec)
    runs = expand(sweep)  # a valid config: it fails only when the worker loads the (broken) model
    launch(sweep, runs, executor="slurm", profile=DEV_PROFILE)
    (row,) = wait_finished(sweep.out, timeout=90).values()
    assert row["state"] == "failed" and row["scheduler"] == "FAILED", row
    assert "mismatch" in row["error"]
    status = json.loads((sweep.out / runs[0].run_id / "status.json").read_text())
    assert status["state"] == "failed" and "Traceback" in status["error"] and "mismatch" in status["error"]


# --- (e) a partition the cluster does not have --------------------------------------------------------

def test_unknown_partition_is_a_clear_error_and_submits_nothing(tmp_path, sbatch_calls):
    spec = write_spec(tmp_path, "nopart", steps=5, seeds=[0, 1])
    profile = write_profile(tmp_path, partition="no-such-partition")
    res = CliRunner().invoke(sweep_app, ["run", str(spec), "--executor", "slurm", "--profile", str(profile)])
    assert res.exit_code == 2, res.output
    assert str(profile) in res.output and "no-such-partition" in res.output, res.output
    assert "nothing submitted" in res.output and "Invalid partition" in res.output, res.output  # sbatch's words
    assert len(sbatch_calls.read_text().splitlines()) == 1  # sbatch was asked once, and refused
    out = tmp_path / "runs"
    assert read_manifest(out) is None
    assert not list(out.glob(".submitit/*/*")) if out.exists() else True
    queued = subprocess.run(["squeue", "-h", "-n", "nopart", "-o", "%i"], capture_output=True, text=True, check=True)
    assert queued.stdout.strip() == ""


# --- sacct lag after a resubmission -------------------------------------------------------------------

def test_resubmitted_run_not_yet_in_sacct_is_pending(tmp_path):
    # sacct lists a job ~0-2 s after sbatch. Until then a resubmitted run's store still holds the previous
    # attempt's `failed`/`cancelled`, which must not be reported (`sweep run` would exit 1 on it).
    out = tmp_path / "runs"
    write_manifest(out, {"name": "lag", "runs": {}})
    m = read_manifest(out)
    for rid, state in [("a" * 12, "failed"), ("b" * 12, "cancelled")]:  # run ids of a run id's format
        RunStore(out / rid).root.mkdir(parents=True)
        RunStore(out / rid).set_status(state, 3, "previous attempt")
        m["runs"][rid] = {"steps": 10, "jobs": [{"executor": "slurm", "job_id": "999999990", "folder": ".submitit/x",
                                                  "submitted": time.time() + 1}]}  # after the store's update
    write_manifest(out, m)
    assert {r["state"] for r in sweep_status(out)} == {"pending"}
    for e in m["runs"].values():
        e["jobs"][0]["submitted"] = time.time() - 3600  # a job older than the store's state: the store stands
    write_manifest(out, m)
    assert {r["run_id"]: r["state"] for r in sweep_status(out)} == {"a" * 12: "failed", "b" * 12: "cancelled"}


# --- (f) one run over 2 ranks: slurm/profiles/dev-2task.yaml (2 tasks x 1 CPU, gloo) --------------------

DEV_2TASK = ROOT / "slurm/profiles/dev-2task.yaml"


def need_rank_aware_trainer() -> None:
    """Fail (never skip) without the trainer side of multi-rank runs: then each task would train the
    whole run into the same folder."""
    if not (ROOT / "ablate/train/distributed.py").exists():
        pytest.fail("needs the trainer side of multi-rank runs (ablate/train/distributed.py, issue 12: "
                    "init_from_env, rank split, rank-0 writer); the launcher side alone cannot run it", pytrace=False)


def same_rows(a: list[dict], b: list[dict]) -> bool:
    """Equal logs up to timing (perf/*): exact for everything but floats, floats to 1e-5 relative (and 1e-7
    absolute: a policy loss of zero-mean advantages is float32 rounding noise around 0, ~1e-8, at any split)."""
    def close(x, y) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return x == pytest.approx(y, rel=1e-5, abs=1e-7, nan_ok=True)
        return x == y

    return len(a) == len(b) and all(
        ra.keys() == rb.keys() and all(close(ra[k], rb[k]) for k in ra if not k.startswith("perf/"))
        for ra, rb in zip(a, b))


def test_two_rank_run_completes_with_the_one_process_result(tmp_path):
    need_rank_aware_trainer()
    from ablate.train.trainer import train

    spec = write_spec(tmp_path, "ranks", steps=4, overrides={"eval.every": 2, "prompts_per_step": 4})
    sweep = load_spec(spec)
    (run,) = expand(sweep)
    launch(sweep, [run], executor="slurm", profile=DEV_2TASK)
    one = tmp_path / "one"
    assert train(run.config, str(one), progress=False) == "completed"  # the same config in one process
    (row,) = wait_finished(sweep.out, timeout=300).values()
    assert row["state"] == "completed" and row["scheduler"] == "COMPLETED", row
    two = RunStore(sweep.out / run.run_id)
    assert json.loads((two.root / "provenance.json").read_text())["world_size"] == 2
    for log in ("metrics", "evals"):
        assert same_rows(two.read(log), RunStore(one).read(log)), log
    assert two.read("samples") == RunStore(one).read("samples")  # the same samples, exactly
    job = read_manifest(sweep.out)["runs"][run.run_id]["jobs"][0]
    logs = [sweep.out / job["folder"] / f"{job['job_id']}_{t}_log.out" for t in (0, 1)]
    assert all(p.exists() for p in logs), logs  # two tasks of one array task: the two ranks


def test_two_rank_run_requeued_at_the_time_limit_resumes_without_losing_or_repeating_a_step(tmp_path):
    # As (c), with 2 ranks: USR2 18-48 s into the job (time 1 min, signal 12 s before it) reaches both tasks,
    # not necessarily at the same step; they agree on one boundary (preemption.agree), rank 0 checkpoints
    # there and submitit requeues the job. The run is far longer than the test: once the released job has
    # trained a few steps past the checkpoint it is cancelled, and its log must hold every step exactly once.
    need_rank_aware_trainer()
    spec = write_spec(tmp_path, "ranks-timeout", steps=100000, overrides={"checkpoint_every": 0})
    profile = tmp_path / "dev-2task.yaml"
    profile.write_text(yaml.safe_dump({**yaml.safe_load(DEV_2TASK.read_text()), "time": 1, "signal_delay_s": 12}))
    sweep = load_spec(spec)
    (run,) = expand(sweep)
    run_dir = sweep.out / run.run_id
    launch(sweep, [run], executor="slurm", profile=profile)
    job = read_manifest(sweep.out)["runs"][run.run_id]["jobs"][0]
    job_id = job["job_id"]

    wait_for("requeued after the time-limit warning", lambda: squeue(job_id) == ("PENDING", "BeginTime"), 240, 0.5)
    st = RunStore(run_dir).status()
    assert st["state"] == "running" and st["step"] > 0, st  # the preemption exit is not a failure
    saved = RunStore(run_dir).load_checkpoint()["step"]
    assert saved == st["step"] == metric_steps(run_dir)[-1]  # saved at the last logged step boundary
    time.sleep(2)
    scontrol("update", f"JobId={job_id}", "StartTime=now", "TimeLimit=5")
    wait_for("resumed past the checkpoint", lambda: (RunStore(run_dir).status() or {}).get("step", 0) >= saved + 3,
             180, 0.5)
    subprocess.run(["scancel", job_id], check=True)
    wait_for("cancelled job gone", lambda: squeue(job_id) == ("", ""), 60, 0.5)
    steps = metric_steps(run_dir)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > saved  # each step exactly once
    assert json.loads((run_dir / "provenance.json").read_text())["resumed_from_steps"][0] == saved
    text = {t: "".join((sweep.out / job["folder"] / f"{job_id}_{t}_log.{ext}").read_text() for ext in ("err", "out"))
            for t in (0, 1)}
    assert "Caught signal SIGUSR2" in text[0] and "Exiting gracefully after preemption/timeout" in text[0]
    assert "Caught signal SIGUSR2" in text[1] and "Not checkpointing nor requeuing" in text[1]  # rank 1 left
    assert text[0].count("Starting with JobEnvironment") == 2  # the same job, requeued once
