"""What runs in a sweep's worker process: `TrainJob`, the callable every executor submits (one run into its
run folder; requeued from its checkpoint on SLURM's warning signal), and the rank environment of a
multi-task job. Also the few process helpers the launcher shares with it (`cpu_count`, `importable`,
`started`, `LAUNCHER`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import submitit

from ablate.runs.store import atomic_write


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class TrainJob(submitit.helpers.Checkpointable):
    """Train one run into its run folder. On SLURM's warning signal submitit calls `checkpoint()` (at a
    step boundary, see ablate/train/preemption.py): the trainer's state is saved to the run folder and the
    requeued job is a fresh TrainJob with the same arguments, which resumes from that checkpoint."""

    def __init__(self, cfg_dict: dict, run_dir: str, threads: int | None = None):
        self.cfg_dict, self.run_dir, self.threads = cfg_dict, str(run_dir), threads

    def __call__(self) -> str:
        import torch

        from ablate.config import parse
        from ablate.train.trainer import train

        rank = export_rank_env()  # one rank of a multi-task job: torch.distributed's env:// variables
        threads = self.threads or _slurm_cpus()
        if threads:
            torch.set_num_threads(threads)
        if rank == 0:
            _note_worker()
        _watch_launcher()
        state = train(parse(self.cfg_dict), self.run_dir, progress=False)
        return state if rank == 0 else None  # rank 0 reports; the run store is the source of truth anyway

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        from ablate.train import preemption

        preemption.save_now()
        return submitit.helpers.DelayedSubmission(TrainJob(self.cfg_dict, self.run_dir, self.threads))


def export_rank_env() -> int:
    """In a submitit job of several tasks (SLURM `nodes` x `tasks_per_node`, or the local executor's
    `tasks_per_node`), each task is one rank of the run: export torchrun's variables (MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) from submitit's job environment, so the
    trainer's torch.distributed init (env://) finds them, and bind the rank to its GPU on the node.
    The rendezvous is the job's first node, on a port derived from the job id (the same on every task).
    One-task jobs (and the in-process debug executor) export nothing. Returns this task's global rank.

    Binding: `set_device(local_rank % visible GPUs)`, not submitit's CUDA_VISIBLE_DEVICES=local_rank, which
    is wrong on clusters that already narrow each task to its own GPUs (then each task sees one GPU)."""
    if "SUBMITIT_FOLDER" not in os.environ or submitit.JobEnvironment().num_tasks == 1:
        return 0
    import torch

    env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    return env.rank


def _slurm_cpus() -> int | None:
    """Under SLURM without task binding torch would start a thread per core of the node: use the CPUs
    allocated to this task instead (--cpus-per-task, else the job's CPUs on this node)."""
    for var in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        if os.environ.get(var, "").isdigit() and int(os.environ[var]) > 0:
            return int(os.environ[var])
    return None


def _note_worker() -> None:
    """<submitit folder>/<job id>_worker.json: where this run's process lives (for status and tests)."""
    if "SUBMITIT_FOLDER" not in os.environ:  # in-process (debug executor) or not under submitit
        return
    env = submitit.JobEnvironment()
    info = {"pid": os.getpid(), "host": env.hostname, "job_id": env.job_id, "started": time.time()}
    path = Path(env.paths.folder) / f"{env.job_id}_worker.json"
    atomic_write(path, lambda f: f.write(json.dumps(info).encode()))


LAUNCHER = "ABLATE_LAUNCHER"  # "<pid>:<start time>" of a foreground `ablate sweep run` (local executor)


def started(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, /proc/<pid>/stat), None when it is gone:
    with the pid it names one process, even once the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _watch_launcher(poll_s: float = 1.0) -> None:
    """In a local worker: when the foreground launcher that started it is gone (kill -9, a closed terminal),
    end the run `cancelled` instead of training on as an orphan nobody follows. submitit's local
    controller outlives its parent by design; it exits once its worker has."""
    import threading

    from ablate.train import preemption

    pid, _, start = os.environ.get(LAUNCHER, "").partition(":")
    if not pid.isdigit():
        return

    def watch():
        while started(int(pid)) == start:
            time.sleep(poll_s)
        preemption.request_stop(f"the sweep launcher (ablate sweep run, pid {pid}) is gone; rerun it to resume")

    threading.Thread(target=watch, name="launcher-watchdog", daemon=True).start()


def importable() -> None:
    """Workers run `python -m submitit...` (inheriting our environment): let them import `ablate` anywhere."""
    root, paths = str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")  # the folder holding ablate/
    if root not in paths.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, paths]))
