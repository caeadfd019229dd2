"""Where a sweep stands: one row per run from the run store (the source of truth) and the scheduler's state
of the run's latest job (each executor's `states`), reconciled into one effective state.

    sweep_status(out)     per run: run-store state + scheduler state -> effective state
    wait(out)             until no run is running or pending
"""

from __future__ import annotations

import time
from pathlib import Path

from ablate.experiments.executors import ACTIVE, EXECUTORS
from ablate.experiments.manifest import MANIFEST, read_manifest
from ablate.runs.store import FINISHED, RunState, RunStore

RESUBMIT: tuple[RunState, ...] = ("failed", "cancelled", "missing")   # submitted again by `launch`; FINISHED runs never are


def scheduler_states(out: Path, jobs: dict[str, dict]) -> dict[str, str]:
    """run id -> scheduler state of its latest job (`jobs`: the manifest's records), asked of each executor
    once for all its jobs (one sacct call for all SLURM jobs)."""
    states = {}
    for name, ex in EXECUTORS.items():
        states.update(ex.states(out, {rid: job for rid, job in jobs.items() if job["executor"] == name}))
    return states


def effective_state(store_state: RunState | None, sched: str | None) -> RunState:
    """One state per run: the run store wins when finished; an active job wins over a stale store."""
    if store_state in FINISHED:
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


UNFINISHED: tuple[RunState, ...] = ("running", "pending")
UNSUCCESSFUL: tuple[RunState, ...] = ("failed", "diverged", "cancelled", "missing")


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
