"""The executors a sweep's runs go through, behind one small interface (submitit's Executor/Job, one level up):

    executor.submit(submission)        start (local, debug) or queue (slurm) the runs, each job recorded in
                                       the manifest as it is submitted
    executor.states(out, jobs)         run id -> the scheduler's state of its latest job
    executor.cancel(out, manifest, rows)   stop the live jobs; returns whether they have all ended

`EXECUTORS` is the one registry (`executor.name` in a sweep spec, `--executor`, the manifest's job records).
Every job is a `TrainJob` (ablate/experiments/worker.py) submitted through submitit's own executor of that
kind; its logs and pickles live in `<out>/.submitit/<submission>/`.
"""

from __future__ import annotations

import abc
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import submitit

from ablate.experiments.manifest import record, write_manifest
from ablate.experiments.slurm_profile import check_sbatch_text
from ablate.experiments.sweep import RunSpec, SpecError, Sweep
from ablate.experiments.worker import LAUNCHER, TrainJob, cpu_count, importable, started
from ablate.runs.store import FINISHED, RunStore

# SLURM job states in which a job still holds (or waits for) its allocation
ACTIVE = ("RUNNING", "PENDING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING", "PREEMPTED")


class NoView:
    """The local executor's live view when there is none: `view(out, runs)` as a context manager with
    `update(active, done)`."""

    def __init__(self, out, runs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def update(self, active, done):
        pass


@dataclass(frozen=True)
class Submission:
    """One launch: the runs to submit and what their executor needs to know."""

    sweep: Sweep
    runs: list[RunSpec]          # the runs to (re)submit
    manifest: dict               # each job is recorded in it (and it is written) as it is submitted
    folder: Path                 # submitit's logs and pickles: <out>/.submitit/<time>-<pid>
    settings: dict               # the spec's `executor` section, with --max-parallel
    profile: dict                # submitit parameters of the SLURM profile ({} without one)
    where: str                   # the file a scheduler's refusal is blamed on (the profile, else the spec)
    view: Callable = NoView      # the local executor's live view
    poll_s: float = 0.5

    def job(self, run: RunSpec, threads: int | None = None) -> TrainJob:
        from ablate.config import to_dict

        return TrainJob(to_dict(run.config), str(self.sweep.out / run.run_id), threads)

    def record(self, run: RunSpec, executor: str, job_id: str) -> None:
        record(self.manifest, run.run_id, executor, job_id, self.folder, self.sweep.out)
        write_manifest(self.sweep.out, self.manifest)


class Executor(abc.ABC):
    """How a sweep's runs are run: submitted, followed and stopped."""

    name: ClassVar[str]
    uses_profile: ClassVar[bool] = False   # whether the spec's `slurm_profile` applies

    @abc.abstractmethod
    def submit(self, sub: Submission) -> None:
        """Run or queue `sub.runs`, recording each job in the manifest as it is submitted."""

    @abc.abstractmethod
    def states(self, out: Path, jobs: dict[str, dict]) -> dict[str, str]:
        """run id -> the scheduler's state of its latest job (`jobs`: the manifest's records, this executor's)."""

    @abc.abstractmethod
    def cancel(self, out: Path, manifest: dict, rows: list[dict]) -> Callable[[], bool]:
        """Stop the live jobs of `rows` (sweep status rows of this executor's runs); returns `ended()`, whether
        they have all ended (only then may the runs be marked cancelled: a live worker's last write wins)."""


def mark_cancelled(run_dir: Path) -> None:
    store = RunStore(run_dir)
    st = store.status() or {}
    if st.get("state") not in FINISHED:
        run_dir.mkdir(parents=True, exist_ok=True)
        store.set_status("cancelled", st.get("step", 0), "cancelled by the user")


def _pid_is_submitit(pid: int) -> bool:
    try:
        return b"submitit" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False


# --- local: foreground worker processes on this machine -------------------------------------------------

class LocalExecutor(Executor):
    name = "local"

    def submit(self, sub: Submission) -> None:
        """Foreground: keep up to max_parallel worker processes busy until every run has ended.
        Ctrl-C cancels the active runs; `ablate sweep cancel` from elsewhere stops the rest."""
        out, settings = sub.sweep.out, sub.settings
        write_manifest(out, sub.manifest)
        tasks = settings.get("tasks_per_node", 1)  # ranks per run: the tasks of its job (export_rank_env)
        max_parallel = settings.get("max_parallel") or max(1, cpu_count() // tasks)  # runs at a time
        threads = max(1, cpu_count() // (max_parallel * tasks))  # per rank
        ex = submitit.LocalExecutor(folder=sub.folder)
        ex.update_parameters(timeout_min=settings.get("timeout_min", 7 * 24 * 60),
                             signal_delay_s=settings.get("signal_delay_s", 30),
                             **({"tasks_per_node": tasks} if tasks > 1 else {}))
        pending, active, begun = list(sub.runs), {}, time.time()
        importable()
        os.environ[LAUNCHER] = f"{os.getpid()}:{started(os.getpid())}"  # workers stop when this process is gone
        with sub.view(out, sub.runs) as live:
            try:
                while pending or active:
                    while pending and len(active) < max_parallel:
                        r = pending.pop(0)
                        st = RunStore(out / r.run_id).status() or {}
                        if st.get("state") == "cancelled" and st.get("updated", 0) > begun:
                            continue  # cancelled by `ablate sweep cancel` while waiting
                        job = ex.submit(sub.job(r, threads))
                        sub.record(r, self.name, job.job_id)
                        active[r.run_id] = job
                    for rid, job in list(active.items()):
                        if job.done():
                            _settle(out / rid, job)
                            del active[rid]
                    live.update(list(active), len(sub.runs) - len(pending) - len(active))
                    time.sleep(sub.poll_s)
            except KeyboardInterrupt:
                _stop(list(active.values()))
                for rid in active:
                    mark_cancelled(out / rid)
                raise

    def states(self, out: Path, jobs: dict[str, dict]) -> dict[str, str]:
        """From the process table and the run store only: submitit's result pickle is never unpickled (a
        crafted one on a shared file system would run code); that it exists says the worker ended normally."""
        states = {}
        for rid, job in jobs.items():
            if job["job_id"].isdigit() and _pid_is_submitit(int(job["job_id"])):
                states[rid] = "RUNNING"
            elif (out / job["folder"] / f"{job['job_id']}_0_result.pkl").exists():
                states[rid] = "COMPLETED" if (RunStore(out / rid).status() or {}).get("state") in FINISHED else "FAILED"
            else:
                states[rid] = "LOST"  # ended without a result: killed (kill -9, OOM) or interrupted
        return states

    def cancel(self, out: Path, manifest: dict, rows: list[dict]) -> Callable[[], bool]:
        for r in rows:  # first the runs without a live job, so a foreground `sweep run` does not start them
            if r["scheduler"] != "RUNNING":
                mark_cancelled(out / r["run_id"])
        pids = [int(r["job_id"]) for r in rows if r["scheduler"] == "RUNNING"]
        for pid in pids:
            os.kill(pid, signal.SIGINT)  # submitit's local controller stops its worker (SIGINT, then SIGKILL)
        # and every local worker still alive, whatever the controller's state looked like (belt and braces: a
        # worker that outlives its cancel would finish and overwrite `cancelled` with `completed`)
        workers = [p for p in (_worker_pid_of(out, manifest, r["run_id"]) for r in rows) if p]
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pids += workers
        return lambda: not any(_pid_is_submitit(p) for p in pids)


def _settle(run_dir: Path, job) -> None:
    """A finished local job that left no result and a `running` store was killed: say so in the store."""
    store = RunStore(run_dir)
    st = store.status() or {}
    if not job.task(0).paths.result_pickle.exists() and st.get("state") in (None, "running"):  # rank 0's
        run_dir.mkdir(parents=True, exist_ok=True)
        store.set_status("failed", st.get("step", 0), f"worker process ended without a result (killed, e.g. "
                         f"kill -9 or out of memory); job {job.job_id}, logs in {job.paths.folder}")


def _stop(jobs) -> None:
    for job in jobs:
        job.cancel(check=False)
    deadline = time.time() + 15
    while time.time() < deadline and not all(job.done() for job in jobs):
        time.sleep(0.2)


def _worker_pid_of(out: Path, m: dict, run_id: str) -> int | None:
    """The live worker process of a local run's latest job (from the `_worker.json` TrainJob writes)."""
    jobs = m["runs"].get(run_id, {}).get("jobs") or []
    if not jobs:
        return None
    info = out / jobs[-1]["folder"] / f"{jobs[-1]['job_id']}_worker.json"
    try:
        pid = json.loads(info.read_text())["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if type(pid) is int and pid > 1 and _pid_is_submitit(pid) else None


def local_ranks(sweep: Sweep, executor: str, settings: dict, runs: list[RunSpec] = (),
                gpus: int | None = None) -> int:
    """The ranks of each run under the local executor: `executor.tasks_per_node` (default 1), started as
    the tasks of one submitit job on this machine (each task one rank, as `ablate train --nproc N`'s).
    SpecError when it is set for another executor (on SLURM the run's shape is the profile's `nodes`,
    `gpus`, `tasks_per_node`; the debug executor runs in this one process), or when a run would train on
    CUDA with more ranks than the `gpus` visible here (default: torch's count; nccl needs one per rank)."""
    tasks = settings.get("tasks_per_node", 1)
    if tasks > 1 and executor != LocalExecutor.name:
        where = "the profile's nodes, gpus and tasks_per_node" if EXECUTORS[executor].uses_profile else "one process"
        raise SpecError(f"{sweep.source}: executor.tasks_per_node: {tasks} applies to the local executor only "
                        f"(this launch uses {executor!r}: {where}); remove it or run with --executor local")
    if tasks > 1 and runs:
        import torch

        gpus = torch.cuda.device_count() if gpus is None else gpus
        if gpus and tasks > gpus and any(r.config.device in ("auto", "cuda") for r in runs):
            raise SpecError(f"{sweep.source}: executor.tasks_per_node: {tasks} ranks per run, but this machine has "
                            f"{gpus} GPU(s) and each rank of a CUDA run drives its own; use at most {gpus}, or "
                            f"device: cpu (gloo) for more")
    return tasks


# --- slurm: one job array ---------------------------------------------------------------------------------

class SlurmExecutor(Executor):
    name = "slurm"
    uses_profile = True

    def submit(self, sub: Submission) -> None:
        """One sbatch for all the runs (returns at once); `sub.where` names the culprit when sbatch refuses,
        e.g. a partition the cluster does not have. The manifest is written once the array is accepted."""
        sweep, settings, params = sub.sweep, sub.settings, sub.profile
        check_sbatch_text(sweep.source, "name", sweep.name)
        check_sbatch_text(sweep.source, "out (the runs root)", sub.folder)
        ex = submitit.AutoExecutor(folder=sub.folder, cluster="slurm")
        ex.update_parameters(name=sweep.name, timeout_min=settings.get("timeout_min", 60),
                             slurm_array_parallelism=settings.get("max_parallel", len(sub.runs)),
                             **({"slurm_signal_delay_s": settings["signal_delay_s"]} if "signal_delay_s" in settings else {}))
        ex.update_parameters(**params)
        importable()
        try:  # submitit prints sbatch's stderr itself: keep it for our message only
            with contextlib.redirect_stderr(io.StringIO()):
                jobs = ex.submit_array([sub.job(r) for r in sub.runs])  # one sbatch
        except Exception as err:  # noqa: BLE001 - e.g. sbatch: invalid partition; surface the scheduler's words
            shutil.rmtree(sub.folder, ignore_errors=True)  # the pickles of a submission that never happened
            part = params.get("slurm_partition")
            raise SpecError(f"{sub.where}: sbatch refused the job array of {len(sub.runs)} run(s)"
                            f"{f' (partition {part!r})' if part else ''}; nothing submitted:\n{str(err).strip()}") from None
        for r, job in zip(sub.runs, jobs):
            record(sub.manifest, r.run_id, self.name, job.job_id, sub.folder, sweep.out)
        write_manifest(sweep.out, sub.manifest)

    def states(self, out: Path, jobs: dict[str, dict]) -> dict[str, str]:
        """One sacct call for all the jobs (submitit's watcher)."""
        slurm = {rid: submitit.SlurmJob(folder=out / job["folder"], job_id=job["job_id"]) for rid, job in jobs.items()}
        if slurm:
            submitit.SlurmJob.watcher.update()
        return {rid: (j.watcher.get_state(j.job_id, mode="cache") or "UNKNOWN").split()[0].upper()
                for rid, j in slurm.items()}

    def cancel(self, out: Path, manifest: dict, rows: list[dict]) -> Callable[[], bool]:
        ids = [r["job_id"] for r in rows if r["scheduler"] in ACTIVE]
        if not ids:
            return lambda: True
        subprocess.run(["scancel", *ids], check=True)
        # submitit ignores SIGTERM, so a step ends at KillWait (SIGKILL)
        return lambda: not subprocess.run(["squeue", "-h", "-j", ",".join(ids)], capture_output=True, text=True,
                                          check=False).stdout.strip()


# --- debug: in this process, one run after another ---------------------------------------------------------

class DebugExecutor(Executor):
    name = "debug"

    def submit(self, sub: Submission) -> None:
        write_manifest(sub.sweep.out, sub.manifest)
        ex = submitit.DebugExecutor(folder=sub.folder)
        for r in sub.runs:  # in this process, one after another: breakpoints work; errors open a post-mortem
            job = ex.submit(sub.job(r))
            sub.record(r, self.name, job.job_id)
            with contextlib.suppress(Exception):  # the run store holds the traceback
                job.result()

    def states(self, out: Path, jobs: dict[str, dict]) -> dict[str, str]:
        return dict.fromkeys(jobs, "DONE")  # its runs ended before `launch` returned

    def cancel(self, out: Path, manifest: dict, rows: list[dict]) -> Callable[[], bool]:
        return lambda: True  # nothing of it outlives its launch


EXECUTORS: dict[str, Executor] = {ex.name: ex for ex in (LocalExecutor(), SlurmExecutor(), DebugExecutor())}


def executor_of(job: dict[str, Any]) -> Executor:
    """The executor of a manifest's job record."""
    return EXECUTORS[job["executor"]]
