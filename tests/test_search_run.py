"""Searches for real on the toy testbed: 2 worker processes against a SQLite file and a PostgreSQL server
(scripts/postgres-dev start), pruning, and a worker killed with kill -9 (heartbeats, PostgreSQL)."""

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import optuna
import pytest
import yaml

from ablate.cli.tune import launch, summary
from ablate.config import parse
from ablate.experiments import search
from ablate.runs.store import RunStore
from ablate.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
FINISHED = {"complete": "completed", "pruned": "pruned"}


@pytest.fixture(scope="module")
def postgres_url():
    url = os.environ.get("ABLATE_TEST_POSTGRES_URL") or subprocess.run(
        [str(ROOT / "scripts" / "postgres-dev"), "url"], capture_output=True, text=True).stdout.strip()
    try:
        import psycopg2

        psycopg2.connect(url, connect_timeout=3).close()
    except Exception as err:  # noqa: BLE001
        pytest.fail(f"PostgreSQL is not up at {url!r} ({err}); start it with `scripts/postgres-dev start` "
                    f"(or set ABLATE_TEST_POSTGRES_URL)")
    return url


def make_spec(tmp_path, storage=None, **changes):
    d = {"name": f"t{uuid.uuid4().hex[:8]}",  # unique: the PostgreSQL database is shared between test runs
         "base": {"config": str(ROOT / "configs" / "toy.yaml"),
                  "overrides": {"steps": 10, "eval.every": 5, "tracking.wandb.mode": "disabled"}},
         "search": {"optim.lr": {"type": "float", "low": 0.05, "high": 2.0, "log": True},
                    "recipe.scale": ["group", "none"]},
         "objective": {"metric": "eval/pass@1_exact", "direction": "maximize"},
         "trials": 4, "sampler": {"name": "random", "seed": 0}, "pruner": {"name": "none"},
         "heartbeat": {"interval_s": 1, "grace_period_s": 4}}
    d.update(changes)
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return search.load_search(p, out=tmp_path / "runs", storage=storage)


def check_study(spec, min_trials):
    """Every trial ended in exactly one state matching its run folders; none lost, none duplicated."""
    trials = search.open_study(spec).get_trials()
    assert [t.number for t in trials] == list(range(len(trials)))
    fresh = [t for t in trials if search.Retry.retried_trial_number(t) is None]
    assert min_trials <= len(fresh) <= min_trials + 1  # +1: two workers may ask at the same instant
    for t in trials:
        assert t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                           optuna.trial.TrialState.FAIL), (t.number, t.state)
        if t.state.name.lower() in FINISHED:
            assert len(t.user_attrs["run_ids"]) == 1
            st = RunStore(spec.out / t.user_attrs["run_ids"][0]).status()
            assert st["state"] == FINISHED[t.state.name.lower()], (t.number, st)
    by_run = {}
    for t in trials:  # one run folder per distinct config
        for rid in t.user_attrs.get("run_ids", []):
            assert by_run.setdefault(rid, t.params) == t.params
    return trials


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_two_workers_best_trial_reproduces(tmp_path, backend, request):
    storage = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    spec = make_spec(tmp_path, storage)
    t0 = time.perf_counter()
    jobs = launch(spec, "local", workers=2)
    elapsed = time.perf_counter() - t0
    ran = [j.result() for j in jobs]
    trials = check_study(spec, 4)
    assert sum(ran) == len(trials) and all(n >= 1 for n in ran)  # both workers pulled trials
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    print(f"\n{backend}: {len(trials)} trials, 2 workers, {elapsed:.1f}s (worker start-up included) -> "
          f"{3600 * len(trials) / elapsed:.0f} trials/hour")

    info = summary(spec)
    best = info["best"]
    assert best["value"] == max(t.value for t in trials)
    cfg = yaml.safe_load((spec.out / best["run_ids"][0] / "config.yaml").read_text())
    cfg.pop("run_id")
    train(parse(cfg), str(tmp_path / "rerun"), progress=False)  # the best config, rerun from scratch
    assert search.objective(RunStore(tmp_path / "rerun").read("evals"), spec.metric, 1) == pytest.approx(best["value"])
    if backend == "postgres":
        optuna.delete_study(study_name=spec.name, storage=search.make_storage(spec.storage))


def test_pruner_stops_a_hopeless_trial(tmp_path):
    # lr 1e-4 leaves the tabular policy where it started; the median pruner stops it at its first evaluation
    spec = make_spec(tmp_path, trials=4, search={"optim.lr": [1.0, 1e-4, 1e-3]},
                     pruner={"name": "median", "n_startup_trials": 1, "n_warmup_steps": 0})
    study = search.open_study(spec, create=True)
    for lr in (1.0, 1e-4, 1e-3, 1.0):
        study.enqueue_trial({"optim.lr": lr})
    assert search.run_worker(spec, log=lambda *a: None) == 4
    trials = check_study(spec, 4)
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "PRUNED", "COMPLETE"]
    for t in trials[1:3]:
        st = RunStore(spec.out / t.user_attrs["run_ids"][0]).status()
        assert st["state"] == "pruned" and st["step"] == 5 and t.last_step == 5
    # a repeated config shares the run folder: the finished run is read back, not retrained
    assert trials[3].user_attrs["run_ids"] == trials[0].user_attrs["run_ids"] and trials[3].value == trials[0].value
    assert summary(spec)["best"]["params"] == {"optim.lr": 1.0}


def test_journal_storage_inline(tmp_path):
    spec = make_spec(tmp_path, f"journal:{tmp_path / 'journal.log'}", trials=2,
                     base={"config": str(ROOT / "configs" / "toy.yaml"),
                           "overrides": {"steps": 5, "eval.every": 5, "tracking.wandb.mode": "disabled"}})
    launch(spec, "inline")
    check_study(spec, 2)
    assert (tmp_path / "journal.log").stat().st_size > 0


def test_killed_worker_trial_fails_and_is_retried_on_postgres(tmp_path, postgres_url):
    spec = make_spec(tmp_path, postgres_url, trials=2, search={"optim.lr": [0.5, 1.0]},
                     sampler={"name": "grid", "seed": 0},
                     base={"config": str(ROOT / "configs" / "toy.yaml"),
                           "overrides": {"steps": 150, "eval.every": 50, "tracking.wandb.mode": "disabled"}})
    jobs = launch(spec, "local", workers=2, wait=False)
    study = search.open_study(spec)
    deadline, victim = time.time() + 90, None
    while victim is None and time.time() < deadline:
        running = [t for t in study.get_trials() if t.state.name == "RUNNING" and "worker" in t.user_attrs
                   and RunStore(spec.out / t.user_attrs["run_ids"][0]).status()]
        victim = running[0] if running else time.sleep(0.2)
    assert victim is not None, "no trial started"
    os.kill(int(victim.user_attrs["worker"].rsplit(":", 1)[1]), signal.SIGKILL)
    while not all(j.done() for j in jobs):
        assert time.time() < deadline + 120, "workers did not finish"
        time.sleep(0.5)
    trials = check_study(spec, 2)
    killed = study._storage.get_trial(victim._trial_id)
    assert killed.state == optuna.trial.TrialState.FAIL  # failed by the surviving worker's stale check
    retries = [t for t in trials if search.Retry.retried_trial_number(t) == killed.number]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert retries[0].params == killed.params and retries[0].user_attrs["run_ids"] == killed.user_attrs["run_ids"]
    assert RunStore(spec.out / killed.user_attrs["run_ids"][0]).status()["state"] == "completed"
    optuna.delete_study(study_name=spec.name, storage=search.make_storage(spec.storage))


@pytest.mark.slurm
def test_slurm_array_workers_and_a_killed_task_on_postgres(tmp_path, postgres_url, slurm_cluster):
    """`ablate tune --executor slurm --workers 2` on the dev cluster: one sbatch, one array of 2 tasks
    pulling trials from PostgreSQL. One task is killed (scancel --signal=KILL, as a node failure would)
    while it trains: its trial goes stale, is failed and retried by the surviving task."""
    from typer.testing import CliRunner

    from ablate.cli.tune import tune_app

    spec_path = tmp_path / "spec.yaml"
    spec = make_spec(tmp_path, postgres_url, trials=3, search={"optim.lr": [0.5, 1.0, 2.0]},
                     sampler={"name": "grid", "seed": 0}, executor={"name": "slurm", "workers": 2},
                     base={"config": str(ROOT / "configs" / "toy.yaml"),  # ~5-10 s per trial on one core
                           "overrides": {"steps": 1500, "eval.every": 500, "tracking.wandb.mode": "disabled"}})
    res = CliRunner().invoke(tune_app, [str(spec_path), "--storage", postgres_url, "--out", str(spec.out),
                                        "--profile", str(ROOT / "slurm" / "profiles" / "dev.yaml")])
    assert res.exit_code == 0 and "submitted 2 workers: SLURM array" in res.output, res.output
    array = res.output.split("SLURM array ")[1].split()[0]
    script = next((spec.out / ".submitit").glob("*/*_submission.sh")).read_text()
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --partition=debug" in script

    study = search.open_study(spec)
    deadline, victim = time.time() + 120, None
    while victim is None and time.time() < deadline:
        running = [t for t in study.get_trials() if t.state.name == "RUNNING" and t.user_attrs.get("slurm_job")
                   and (RunStore(spec.out / t.user_attrs["run_ids"][0]).status() or {}).get("step", 0) >= 2]
        victim = running[0] if running else time.sleep(0.2)
    assert victim is not None, "no trial started on the cluster"
    assert victim.user_attrs["slurm_job"].startswith(f"{array}_")
    subprocess.run(["scancel", "--signal=KILL", "--full", victim.user_attrs["slurm_job"]], check=True)

    def array_done():
        out = subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True).stdout
        return not out.strip()
    while not array_done():
        assert time.time() < deadline + 180, "array tasks did not finish"
        time.sleep(1)
    trials = check_study(spec, 3)
    killed = study._storage.get_trial(victim._trial_id)
    assert killed.state == optuna.trial.TrialState.FAIL  # failed by the surviving task's stale-heartbeat check
    retries = [t for t in trials if search.Retry.retried_trial_number(t) == killed.number]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert retries[0].user_attrs["slurm_job"] != killed.user_attrs["slurm_job"]
    assert {t.user_attrs["slurm_job"] for t in trials} == {f"{array}_0", f"{array}_1"}  # both tasks pulled trials
    assert sorted(t.params["optim.lr"] for t in trials if t.state.name == "COMPLETE") == [0.5, 1.0, 2.0]
    for t in trials:
        if t.state.name == "COMPLETE":
            assert RunStore(spec.out / t.user_attrs["run_ids"][0]).status()["state"] == "completed"
    optuna.delete_study(study_name=spec.name, storage=search.make_storage(spec.storage))
