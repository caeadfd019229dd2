"""Run a sweep's runs through submitit, follow them, cancel them.

    launch(sweep, runs)              # local (default; foreground, <= max_parallel processes, live view),
                                     # debug (in-process, one by one) or slurm (ONE job array, returns at once)
    sweep_status(out)                # per run: run-store state + scheduler state -> effective state
    cancel(out)                      # stop active jobs, mark unfinished runs `cancelled`

The run store is the source of truth; `<out>/manifest.json` adds what only the launcher knows (the
spec, which run went to which job, when). Every submitted callable is a `TrainJob`; submitit's logs
and pickles live in `<out>/.submitit/<submission>/`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import submitit

from ablate.experiments.manifest import MANIFEST, manifest_for, read_manifest, record, write_manifest
from ablate.experiments.sweep import RunSpec, SpecError, Sweep
from ablate.runs.store import RunStore, atomic_write
from ablate.schema import Count, Line, Natural, NonEmptyLine, Text, parse_section

SKIP = ("completed", "diverged", "pruned")        # finished: never resubmitted
RESUBMIT = ("failed", "cancelled", "missing")
ACTIVE = ("RUNNING", "PENDING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING", "PREEMPTED")


@dataclass(frozen=True)
class SlurmProfile:
    """The keys of a SLURM profile YAML, their types and domains (null = unset); load_profile maps them to
    submitit's parameters. slurm/profiles/example.yaml shows every key."""

    partition: NonEmptyLine | None = None
    time: Count | NonEmptyLine | None = None       # minutes, or a SLURM time ('4:00:00', '1-00:00')
    gpus: Natural | None = None                     # per node
    cpus: Count | None = None                       # per task
    mem: Count | Annotated[str, Text(min_len=1, pattern=r"\d+[KMGT]?B?", what="digits and a unit K, M, G or T")] \
        | None = None                               # an integer is GB
    account: NonEmptyLine | None = None
    qos: NonEmptyLine | None = None
    constraint: NonEmptyLine | None = None
    setup: tuple[Line, ...] | None = None           # shell lines run before the job
    array_parallelism: Count | None = None
    signal_delay_s: Count | None = None
    additional: dict[str, Any] | None = None        # more sbatch options: name -> scalar
    nodes: Count | None = None
    tasks_per_node: Count | None = None


PROFILE_KEYS = tuple(f.name for f in dataclasses.fields(SlurmProfile))
# sbatch options that set a run's shape: only through the profile keys `nodes`, `gpus`, `tasks_per_node`
SHAPE_OPTIONS = ("nodes", "ntasks", "ntasks-per-node", "ntasks_per_node", "gpus-per-node", "gpus_per_node")


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# --- the submitted callable --------------------------------------------------------------------------

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


def _started(pid: int) -> str | None:
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
        while _started(int(pid)) == start:
            time.sleep(poll_s)
        preemption.request_stop(f"the sweep launcher (ablate sweep run, pid {pid}) is gone; rerun it to resume")

    threading.Thread(target=watch, name="launcher-watchdog", daemon=True).start()


def _importable() -> None:
    """Workers run `python -m submitit...` (inheriting our environment): let them import `ablate` anywhere."""
    root, paths = str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")
    if root not in paths.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, paths]))


# --- scheduler state ---------------------------------------------------------------------------------

def _pid_is_submitit(pid: int) -> bool:
    try:
        return b"submitit" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False


def _local_state(job: dict, out: Path, store_state: str | None) -> str:
    """From the process table and the run store only: submitit's result pickle is never unpickled (a
    crafted one on a shared file system would run code); that it exists says the worker ended normally."""
    if job["job_id"].isdigit() and _pid_is_submitit(int(job["job_id"])):
        return "RUNNING"
    if (out / job["folder"] / f"{job['job_id']}_0_result.pkl").exists():
        return "COMPLETED" if store_state in SKIP else "FAILED"
    return "LOST"  # ended without a result: killed (kill -9, OOM) or interrupted


def scheduler_states(out: Path, jobs: dict[str, dict]) -> dict[str, str]:
    """run id -> scheduler state of its latest job (one sacct call for all SLURM jobs)."""
    states, slurm = {}, {}
    for rid, job in jobs.items():
        if job["executor"] == "local":
            states[rid] = _local_state(job, out, (RunStore(out / rid).status() or {}).get("state"))
        elif job["executor"] == "debug":
            states[rid] = "DONE"
        else:
            slurm[rid] = submitit.SlurmJob(folder=out / job["folder"], job_id=job["job_id"])
    if slurm:
        submitit.SlurmJob.watcher.update()
        for rid, j in slurm.items():
            states[rid] = (j.watcher.get_state(j.job_id, mode="cache") or "UNKNOWN").split()[0].upper()
    return states


def effective_state(store_state: str | None, sched: str | None) -> str:
    """One state per run: the run store wins when finished; an active job wins over a stale store."""
    if store_state in SKIP:
        return store_state
    if sched in ACTIVE:
        return "running" if sched == "RUNNING" else "pending"
    if sched in ("UNKNOWN", "") and store_state in (None, "running"):  # not yet in SLURM accounting
        return store_state or "pending"
    if store_state in ("failed", "cancelled"):
        return store_state
    if sched and sched.startswith("CANCELLED"):
        return "cancelled"
    if store_state == "running" or sched is not None:
        return "failed"  # the job is gone but the run did not finish
    return "missing"


def arm_label(toggles: dict) -> str | None:
    """The arm of a run of a sweep without named arms: its toggle values, `kl_coef=0.04 scale=group` (the
    last part of each key, as the report's factor labels)."""
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in toggles.items()) or None


def stale_runs(out: str | Path) -> list[str]:
    """Run ids the manifest keeps from an earlier expansion of the spec (see _manifest_for)."""
    m = read_manifest(Path(out)) or {"runs": {}}
    return [rid for rid, e in m["runs"].items() if e.get("current") is False]


def sweep_status(out: str | Path) -> list[dict]:
    """One row per current run of the manifest: ids, toggles, store/scheduler/effective state, progress,
    error (runs of an earlier expansion of the spec: stale_runs)."""
    out = Path(out)
    m = read_manifest(out)
    if m is None:
        raise FileNotFoundError(f"{out}: no {MANIFEST} (not a sweep folder?)")
    current = {rid: e for rid, e in m["runs"].items() if e.get("current", True)}
    jobs = {rid: e["jobs"][-1] for rid, e in current.items() if e["jobs"]}
    sched = scheduler_states(out, jobs)
    rows = []
    for rid, e in current.items():
        st = RunStore(out / rid).status() or {}
        job = jobs.get(rid, {})
        store_state = st.get("state")
        if (sched.get(rid) in ("UNKNOWN", "") and store_state in ("failed", "cancelled")
                and job.get("submitted", 0) > st.get("updated", 0)):
            # resubmitted, and SLURM accounting does not list the new job yet (sacct lags sbatch by ~0-2 s):
            # the failed/cancelled store is the previous attempt's, not this job's
            store_state = None
        rows.append({"run_id": rid, "arm": e.get("arm") or arm_label(e.get("toggles", {})), "seed": e.get("seed"), "toggles": e.get("toggles", {}),
                     "state": effective_state(store_state, sched.get(rid)), "store": st.get("state"),
                     "scheduler": sched.get(rid), "step": st.get("step", 0), "steps": e.get("steps"),
                     "job_id": job.get("job_id"), "executor": job.get("executor"), "error": st.get("error")})
    return rows


UNFINISHED = ("running", "pending")
UNSUCCESSFUL = ("failed", "diverged", "cancelled", "missing")


def wait(out: str | Path, poll_s: float = 10.0, log=None) -> list[dict]:
    """Block until no run of the sweep in `out` is running or pending (any executor: the run store and the
    scheduler, as `sweep_status`); returns the final status rows. `log(rows)` is called when counts change."""
    last = None
    while True:
        rows = sweep_status(out)
        counts = sorted((st, sum(r["state"] == st for r in rows)) for st in {r["state"] for r in rows})
        if log is not None and counts != last:
            log(rows)
        last = counts
        if not any(r["state"] in UNFINISHED for r in rows):
            return rows
        time.sleep(poll_s)


# --- executors ---------------------------------------------------------------------------------------

def slurm_minutes(value: int | str) -> int:
    """SLURM time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS -> whole minutes (rounded up)."""
    if isinstance(value, int):
        return value
    days, rest = value.split("-", 1) if "-" in value else ("0", value)
    parts = [int(p) for p in rest.split(":")]
    if "-" in value:
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) <= 2:
        h, m, s = 0, parts[0], (parts[1] if len(parts) == 2 else 0)
    else:
        h, m, s = parts
    return int(days) * 1440 + h * 60 + m + (s > 0)


_SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def control_chars(text: str) -> list[str]:
    """The control characters (newline, tab, NUL, ...) in `text`, as escapes: the batch script is line based,
    so any of them in a value that reaches it could end an `#SBATCH` line and start a command."""
    return sorted({repr(c) for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")})


def check_sbatch_text(where: str, key: str, value: Any) -> None:
    """SpecError naming `where` and `key` when a value that goes into the batch script holds control
    characters (every other value is quoted by submitit, and setup lines are the profile's own shell)."""
    bad = control_chars(str(value))
    if bad:
        raise SpecError(f"{where}: {key}: {value!r} holds control characters ({', '.join(bad)}); values that reach "
                        f"the SLURM batch script must be one printable line")


def load_profile(path: str | Path) -> dict:
    """A SLURM profile YAML -> submitit AutoExecutor parameters. Errors name the file and the key."""
    from ablate.experiments.sweep import read_spec_file

    path = Path(path)
    data = read_spec_file(path, "SLURM profile") or {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of {', '.join(PROFILE_KEYS)}")
    parse_section(SlurmProfile, data, str(path), SpecError)  # keys, types and domains
    data = {k: v for k, v in data.items() if v is not None}
    for k, v in data.items():  # nothing that reaches the batch script may break a line
        entries = ([(f"{k}.{a}", a, b) for a, b in v.items()] if isinstance(v, dict) else
                   [(f"{k}[{i}]", None, b) for i, b in enumerate(v)] if isinstance(v, list) else [(k, None, v)])
        for key, sub, item in entries:
            if k == "setup" and not isinstance(item, str) or k == "additional" and not isinstance(
                    item, (str, int, float, bool)):
                raise SpecError(f"{path}: {key}: expected a {'string' if k == 'setup' else 'scalar'}, got {item!r}")
            check_sbatch_text(str(path), key, item)
            if k == "additional" and not _SBATCH_KEY.fullmatch(str(sub)):
                raise SpecError(f"{path}: additional: {sub!r} is not an sbatch option name (letters, digits, "
                                f"'-' and '_', without the leading dashes)")
    params = _shape(path, data)
    try:
        time_min = slurm_minutes(data["time"]) if "time" in data else None
    except (ValueError, KeyError):
        raise SpecError(f"{path}: time: {data['time']!r} is not a SLURM time (e.g. 90, '4:00:00', '1-00:00')") from None
    names = {"partition": "slurm_partition", "account": "slurm_account", "qos": "slurm_qos",
             "constraint": "slurm_constraint", "setup": "slurm_setup", "array_parallelism": "slurm_array_parallelism",
             "signal_delay_s": "slurm_signal_delay_s", "additional": "slurm_additional_parameters",
             "cpus": "cpus_per_task"}
    params.update({names[k]: v for k, v in data.items() if k in names})
    if time_min is not None:
        params["timeout_min"] = time_min
    if "mem" in data:
        params["slurm_mem"] = f"{data['mem']}G" if isinstance(data["mem"], int) else data["mem"]
    return params


def _shape(path: Path, data: dict) -> dict:
    """The profile's `nodes`, `gpus` (per node) and `tasks_per_node` -> submitit's `nodes`,
    `tasks_per_node`, `gpus_per_node`. One task is one rank of the run (torch.distributed): one rank per
    GPU, so with GPUs `tasks_per_node` is `gpus`; without GPUs `tasks_per_node` sets the CPU ranks.
    A job array has this shape for every array task: each task of the array is one multi-rank run."""
    gpus = data.get("gpus", 0)
    tasks = data.get("tasks_per_node", gpus or 1)
    if gpus and tasks != gpus:
        raise SpecError(f"{path}: tasks_per_node: {tasks} with gpus: {gpus}; each rank drives one GPU, so "
                        f"tasks_per_node must be {gpus} (or left out: it defaults to gpus)")
    for opt in data.get("additional", {}):
        if opt in SHAPE_OPTIONS:
            raise SpecError(f"{path}: additional.{opt}: sets the job's shape, which comes from the profile keys "
                            f"nodes, gpus and tasks_per_node; use those instead")
    shape = {"nodes": data["nodes"]} if "nodes" in data else {}
    if "tasks_per_node" in data or gpus > 1:  # 1 is submitit's default: a one-GPU profile stays as it was
        shape["tasks_per_node"] = tasks
    if "gpus" in data:
        shape["gpus_per_node"] = gpus
    return shape


def ranks(params: dict) -> int:
    """The number of ranks (torch.distributed processes) of each run under these executor parameters."""
    return params.get("nodes", 1) * params.get("tasks_per_node", 1)


def launch(sweep: Sweep, runs: list[RunSpec], executor: str | None = None, profile: str | Path | None = None,
           max_parallel: int | None = None, view=None, poll_s: float = 0.5) -> dict[str, list[str]]:
    """Submit every run that is failed, cancelled or missing (completed/diverged are skipped); `view(out,
    runs)` is an optional live view for the local executor (a context manager with `update(active, done)`).
    Returns {"submitted": [...], "skipped": [...], "active": [...]} run ids."""
    out = sweep.out
    name = executor or sweep.executor.get("name", "local")
    settings = {**sweep.executor, **({"max_parallel": max_parallel} if max_parallel else {})}
    local_ranks(sweep, name, settings, runs)  # executor.tasks_per_node: the local executor's alone
    params = load_profile(profile or sweep.slurm_profile) if name == "slurm" and (profile or sweep.slurm_profile) else {}
    if name != "slurm" and profile:
        load_profile(profile)  # still refuse a missing/bad profile
    other = read_manifest(out)
    if other is not None and other.get("name") not in (None, sweep.name):
        raise SpecError(f"{sweep.source}: out: {out} is the runs root of another sweep ({other.get('name')!r}); "
                        f"refusing to mark its runs stale (pick another --out)")
    m = manifest_for(sweep, runs)
    now = {r["run_id"]: r["state"] for r in (sweep_status(out) if (out / MANIFEST).exists() else [])}
    todo = [r for r in runs if now.get(r.run_id, "missing") in RESUBMIT]
    result = {"submitted": [r.run_id for r in todo], "skipped": [r.run_id for r in runs if now.get(r.run_id) in SKIP],
              "active": [r.run_id for r in runs if now.get(r.run_id) in ("running", "pending")]}
    if name != "slurm" or not todo:
        write_manifest(out, m)  # slurm: written once the array is accepted
    if not todo:
        return result
    folder = out / ".submitit" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    if name == "slurm":
        where = f"{profile or sweep.slurm_profile}" if (profile or sweep.slurm_profile) else sweep.source
        _submit_slurm(sweep, todo, m, folder, settings, params, where)
    elif name == "debug":
        _run_debug(out, todo, m, folder)
    else:
        _run_local(out, todo, m, folder, settings, view or _NoView, poll_s)
    return result


def local_ranks(sweep: Sweep, executor: str, settings: dict, runs: list[RunSpec] = (),
                gpus: int | None = None) -> int:
    """The ranks of each run under the local executor: `executor.tasks_per_node` (default 1), started as
    the tasks of one submitit job on this machine (each task one rank, as `ablate train --nproc N`'s).
    SpecError when it is set for another executor (on SLURM the run's shape is the profile's `nodes`,
    `gpus`, `tasks_per_node`; the debug executor runs in this one process), or when a run would train on
    CUDA with more ranks than the `gpus` visible here (default: torch's count; nccl needs one per rank)."""
    tasks = settings.get("tasks_per_node", 1)
    if tasks > 1 and executor != "local":
        where = "the profile's nodes, gpus and tasks_per_node" if executor == "slurm" else "one process"
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


def _submit_slurm(sweep: Sweep, todo: list[RunSpec], m: dict, folder: Path, settings: dict, params: dict,
                  where: str) -> None:
    """One sbatch for all `todo` runs; `where` (the profile file, else the spec) names the culprit when
    sbatch refuses, e.g. a partition the cluster does not have."""
    from ablate.config import to_dict

    check_sbatch_text(sweep.source, "name", sweep.name)
    check_sbatch_text(sweep.source, "out (the runs root)", folder)
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(name=sweep.name, timeout_min=settings.get("timeout_min", 60),
                         slurm_array_parallelism=settings.get("max_parallel", len(todo)),
                         **({"slurm_signal_delay_s": settings["signal_delay_s"]} if "signal_delay_s" in settings else {}))
    ex.update_parameters(**params)
    _importable()
    try:  # submitit prints sbatch's stderr itself: keep it for our message only
        with contextlib.redirect_stderr(io.StringIO()):
            jobs = ex.submit_array([TrainJob(to_dict(r.config), str(sweep.out / r.run_id)) for r in todo])  # one sbatch
    except Exception as err:  # noqa: BLE001 - e.g. sbatch: invalid partition; surface the scheduler's words
        shutil.rmtree(folder, ignore_errors=True)  # the pickles of a submission that never happened
        part = params.get("slurm_partition")
        raise SpecError(f"{where}: sbatch refused the job array of {len(todo)} run(s)"
                        f"{f' (partition {part!r})' if part else ''}; nothing submitted:\n{str(err).strip()}") from None
    for r, job in zip(todo, jobs):
        record(m, r.run_id, "slurm", job.job_id, folder, sweep.out)
    write_manifest(sweep.out, m)


def _run_debug(out: Path, todo: list[RunSpec], m: dict, folder: Path) -> None:
    from ablate.config import to_dict

    ex = submitit.DebugExecutor(folder=folder)
    for r in todo:  # in this process, one after another: breakpoints work; errors open a post-mortem
        job = ex.submit(TrainJob(to_dict(r.config), str(out / r.run_id)))
        record(m, r.run_id, "debug", job.job_id, folder, out)
        write_manifest(out, m)
        with contextlib.suppress(Exception):  # the run store holds the traceback
            job.result()


class _NoView:
    def __init__(self, out, runs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def update(self, active, done):
        pass


def _run_local(out: Path, todo: list[RunSpec], m: dict, folder: Path, settings: dict, view, poll_s: float) -> None:
    """Foreground: keep up to max_parallel worker processes busy until every run has ended.
    Ctrl-C cancels the active runs; `ablate sweep cancel` from elsewhere stops the rest."""
    from ablate.config import to_dict

    tasks = settings.get("tasks_per_node", 1)  # ranks per run: the tasks of its job (export_rank_env)
    max_parallel = settings.get("max_parallel") or max(1, cpu_count() // tasks)  # runs at a time
    threads = max(1, cpu_count() // (max_parallel * tasks))  # per rank
    ex = submitit.LocalExecutor(folder=folder)
    ex.update_parameters(timeout_min=settings.get("timeout_min", 7 * 24 * 60),
                         signal_delay_s=settings.get("signal_delay_s", 30),
                         **({"tasks_per_node": tasks} if tasks > 1 else {}))
    pending, active, started = list(todo), {}, time.time()
    _importable()
    os.environ[LAUNCHER] = f"{os.getpid()}:{_started(os.getpid())}"  # workers stop when this process is gone
    with view(out, todo) as live:
        try:
            while pending or active:
                while pending and len(active) < max_parallel:
                    r = pending.pop(0)
                    st = RunStore(out / r.run_id).status() or {}
                    if st.get("state") == "cancelled" and st.get("updated", 0) > started:
                        continue  # cancelled by `ablate sweep cancel` while waiting
                    job = ex.submit(TrainJob(to_dict(r.config), str(out / r.run_id), threads))
                    record(m, r.run_id, "local", job.job_id, folder, out)
                    write_manifest(out, m)
                    active[r.run_id] = job
                for rid, job in list(active.items()):
                    if job.done():
                        _settle(out / rid, job)
                        del active[rid]
                live.update(list(active), len(todo) - len(pending) - len(active))
                time.sleep(poll_s)
        except KeyboardInterrupt:
            _stop(list(active.values()))
            for rid in active:
                _mark_cancelled(out / rid)
            raise


def _settle(run_dir: Path, job) -> None:
    """A finished local job that left no result and a `running` store was killed: say so in the store."""
    store = RunStore(run_dir)
    st = store.status() or {}
    if not job.task(0).paths.result_pickle.exists() and st.get("state") in (None, "running"):  # rank 0's
        run_dir.mkdir(parents=True, exist_ok=True)
        store.set_status("failed", st.get("step", 0), f"worker process ended without a result (killed, e.g. "
                         f"kill -9 or out of memory); job {job.job_id}, logs in {job.paths.folder}")


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


def _mark_cancelled(run_dir: Path) -> None:
    store = RunStore(run_dir)
    st = store.status() or {}
    if st.get("state") not in SKIP:
        run_dir.mkdir(parents=True, exist_ok=True)
        store.set_status("cancelled", st.get("step", 0), "cancelled by the user")


def _stop(jobs) -> None:
    for job in jobs:
        job.cancel(check=False)
    deadline = time.time() + 15
    while time.time() < deadline and not all(job.done() for job in jobs):
        time.sleep(0.2)


def cancel(out: str | Path) -> list[str]:
    """Cancel every unfinished run of the sweep in `out` (active jobs are stopped); returns their ids."""
    out = Path(out)
    rows = sweep_status(out)
    m = read_manifest(out)
    hit = [r for r in rows if r["state"] in ("running", "pending", "missing")]
    local = [int(r["job_id"]) for r in hit if r["executor"] == "local" and r["scheduler"] == "RUNNING"]
    slurm = [r["job_id"] for r in hit if r["executor"] == "slurm" and r["scheduler"] in ACTIVE]
    for r in hit:  # first the runs without a live job, so a foreground `sweep run` does not start them
        if r["state"] == "missing" or r["executor"] == "local" and r["scheduler"] != "RUNNING":
            _mark_cancelled(out / r["run_id"])
    for pid in local:
        os.kill(pid, signal.SIGINT)  # submitit's local controller stops its worker (SIGINT, then SIGKILL)
    # and every local worker still alive, whatever the controller's state looked like (belt and braces: a
    # worker that outlives its cancel would finish and overwrite `cancelled` with `completed`)
    workers = [p for p in (_worker_pid_of(out, m, r["run_id"]) for r in hit if r["executor"] == "local") if p]
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    local += workers
    if slurm:
        subprocess.run(["scancel", *slurm], check=True)
    deadline = time.time() + 120  # mark only once workers are gone, or their last status write wins
    while time.time() < deadline and (any(_pid_is_submitit(p) for p in local) or slurm and subprocess.run(
            ["squeue", "-h", "-j", ",".join(slurm)], capture_output=True, text=True, check=False).stdout.strip()):
        time.sleep(0.5)  # SLURM: submitit ignores SIGTERM, so a step ends at KillWait (SIGKILL)
    for r in hit:
        _mark_cancelled(out / r["run_id"])
    m["cancelled"] = time.time()
    write_manifest(out, m)
    return [r["run_id"] for r in hit]
