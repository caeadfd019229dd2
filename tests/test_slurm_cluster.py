"""Tests against the real one-node SLURM dev cluster (`slurm/dev-cluster start`, as root).

They never skip silently: if the cluster is not reachable every test fails with a message saying
how to start it. Deselect them with `-m "not slurm"` on machines without the cluster.
"""

import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL")
WAIT_S = 90


def _run(*args: str) -> str:
    res = subprocess.run(args, check=False, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout


def sbatch(*args: str) -> str:
    """Submit and return the job id (`--parsable` prints `id` or `id;cluster`)."""
    return _run("sbatch", "--parsable", *args).strip().split(";")[0]


def sacct(job_id: str) -> dict[str, dict[str, str]]:
    """Allocation rows (no steps) of a job or array, keyed by JobID ('12' or '12_3')."""
    out = _run("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,Start,End")
    rows = {}
    for line in out.splitlines():
        jid, state, start, end = line.split("|")
        rows[jid] = {"state": state, "start": start, "end": end}
    return rows


def wait_sacct(job_id: str, n: int = 1, timeout: float = WAIT_S) -> dict[str, dict[str, str]]:
    """Poll sacct until `n` allocations of `job_id` are in a terminal state."""
    deadline = time.monotonic() + timeout
    while True:
        rows = sacct(job_id)
        if len(rows) == n and all(r["state"].split()[0] in TERMINAL for r in rows.values()):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} not finished after {timeout}s: {rows}")
        time.sleep(0.5)


def squeue_state(job_id: str) -> tuple[str, str]:
    """(state, reason) from squeue, ('', '') once the job has left the queue."""
    out = _run("squeue", "-h", "-j", job_id, "-o", "%T|%r").strip()
    return tuple(out.split("|")) if out else ("", "")  # type: ignore[return-value]


def wait_squeue(job_id: str, state: str, timeout: float = WAIT_S, with_reason: bool = False) -> str:
    """Wait for `state`; returns squeue's reason. `with_reason`: also for the scheduler to give one (a job
    just put back in the queue shows 'None' until the scheduler's next pass sets it)."""
    deadline = time.monotonic() + timeout
    while (cur := squeue_state(job_id))[0] != state or with_reason and cur[1] == "None":
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} not {state} after {timeout}s (now {cur})")
        time.sleep(0.2)
    return cur[1]


def test_job_array_writes_outputs_and_sacct_completes(tmp_path: Path) -> None:
    job = sbatch(
        "--array=0-3",
        "-c",
        "1",
        f"--chdir={tmp_path}",
        f"--output={tmp_path}/slurm-%A_%a.out",
        "--wrap",
        'echo "task $SLURM_ARRAY_TASK_ID" > "out_$SLURM_ARRAY_TASK_ID.txt"',
    )
    rows = wait_sacct(job, n=4)
    assert {r["state"] for r in rows.values()} == {"COMPLETED"}, rows
    assert sorted(rows) == [f"{job}_{i}" for i in range(4)]
    for i in range(4):
        assert (tmp_path / f"out_{i}.txt").read_text() == f"task {i}\n"


def test_two_one_cpu_jobs_overlap(tmp_path: Path) -> None:
    # Needs select/cons_tres + CR_Core_Memory + DefMemPerCPU (else each job takes the whole node).
    job = sbatch("--array=0-1", "-c", "1", f"--chdir={tmp_path}", "--output=/dev/null", "--wrap", "sleep 4")
    rows = wait_sacct(job, n=2)
    assert {r["state"] for r in rows.values()} == {"COMPLETED"}, rows
    starts = [datetime.fromisoformat(r["start"]) for r in rows.values()]
    ends = [datetime.fromisoformat(r["end"]) for r in rows.values()]
    assert max(starts) < min(ends), f"1-CPU tasks ran one after another: {rows}"


@pytest.mark.parametrize("when", ["pending", "running"])
def test_scancel_shows_cancelled_in_sacct(tmp_path: Path, when: str) -> None:
    extra = ["--begin=now+3600"] if when == "pending" else []
    job = sbatch(*extra, f"--chdir={tmp_path}", "--output=/dev/null", "--wrap", "sleep 300")
    wait_squeue(job, when.upper())
    _run("scancel", job)
    rows = wait_sacct(job)
    assert rows[job]["state"].startswith("CANCELLED"), rows


def test_requeue_and_release(tmp_path: Path) -> None:
    # First run sleeps; after requeue SLURM_RESTART_COUNT=1 and the job finishes at once.
    script = (
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then echo "run $SLURM_RESTART_COUNT" > out.txt; else sleep 300; fi'
    )
    job = sbatch("--requeue", "--time=1", f"--chdir={tmp_path}", "--output=/dev/null", "--wrap", script)
    wait_squeue(job, "RUNNING")
    _run("scontrol", "requeue", job)
    # A requeued job gets BeginTime = now + ~120 s; releasing it must not take that long.
    reason = wait_squeue(job, "PENDING", with_reason=True)
    assert reason == "BeginTime", f"requeued job pending for {reason!r}, expected BeginTime"
    # Not within the same second as the kill: slurmd revokes the old job credential with 1 s
    # resolution, and a relaunch in that second fails ("Job credential revoked" -> FAILED).
    time.sleep(2)
    t0 = time.monotonic()
    _run("scontrol", "update", f"JobId={job}", "StartTime=now")
    rows = wait_sacct(job, timeout=60)
    assert rows[job]["state"] == "COMPLETED", rows
    assert time.monotonic() - t0 < 60
    assert (tmp_path / "out.txt").read_text() == "run 1\n"


def test_submitit_roundtrip(tmp_path: Path) -> None:
    submitit = pytest.importorskip("submitit")
    # Fresh folder per test (tmp_path): job ids restart at 1 on a new cluster, and stale
    # %j-named result files of an earlier cluster would be read back as this job's result.
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(slurm_partition="debug", timeout_min=5, cpus_per_task=1, mem_gb=1)

    def add(a: int, b: int) -> int:  # local function: cloudpickled by value (tests/ is not importable in the job)
        return a + b

    job = executor.submit(add, 2, 3)
    assert job.result() == 5
    assert wait_sacct(job.job_id)[job.job_id]["state"] == "COMPLETED"


def test_two_task_job_ranks_all_reduce_through_the_exported_env(tmp_path: Path, monkeypatch) -> None:
    # slurm/profiles/dev-2task.yaml: one job of 2 tasks x 1 CPU. Each task exports torchrun's variables from
    # SLURM's environment (ablate.experiments.worker.export_rank_env, what TrainJob does) and joins one
    # gloo group by env://; a real all_reduce proves both ranks met at the same rendezvous.
    import submitit

    from ablate.experiments.slurm_profile import load_profile

    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", str(root))  # sbatch exports our environment to the job

    def rank_task() -> dict:  # local function: cloudpickled by value (tests/ is not importable in the job)
        import os

        import torch
        import torch.distributed as dist

        from ablate.experiments.worker import export_rank_env

        rank = export_rank_env()
        dist.init_process_group("gloo")
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        out = {"rank": rank, "world": dist.get_world_size(), "sum": float(t.item()),
               "env": {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")},
               "slurm_procid": os.environ["SLURM_PROCID"], "job": os.environ["SLURM_JOB_ID"]}
        dist.destroy_process_group()
        return out

    params = load_profile(root / "slurm/profiles/dev-2task.yaml")
    assert params["tasks_per_node"] == 2 and params["cpus_per_task"] == 1
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(**{**params, "timeout_min": 3})
    job = executor.submit(rank_task)
    res = job.results()
    assert [r["rank"] for r in res] == [0, 1] and [r["slurm_procid"] for r in res] == ["0", "1"]
    assert [r["env"]["RANK"] for r in res] == ["0", "1"] and [r["env"]["LOCAL_RANK"] for r in res] == ["0", "1"]
    assert {r["world"] for r in res} == {2} and {r["env"]["WORLD_SIZE"] for r in res} == {"2"}
    assert {r["sum"] for r in res} == {3.0}  # 1 + 2: one all_reduce over both tasks
    assert len({(r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in res}) == 1
    assert len({r["job"] for r in res}) == 1  # two tasks of one job, not two jobs
    assert wait_sacct(job.job_id)[job.job_id]["state"] == "COMPLETED"
