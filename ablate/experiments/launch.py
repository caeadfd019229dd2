"""Run a sweep's runs through one of the executors, and cancel them.

    launch(sweep, runs)              # local (default; foreground, <= max_parallel processes, live view),
                                     # debug (in-process, one by one) or slurm (ONE job array, returns at once)
    cancel(out)                      # stop active jobs, mark unfinished runs `cancelled`

The run store is the source of truth; `<out>/manifest.json` adds what only the launcher knows (the
spec, which run went to which job, when). The executors (submit / states / cancel) live in
ablate/experiments/executors.py, the reconciled status of a sweep in ablate/experiments/status.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ablate.experiments.executors import EXECUTORS, NoView, Submission, local_ranks, mark_cancelled
from ablate.experiments.manifest import MANIFEST, manifest_for, read_manifest, write_manifest
from ablate.experiments.slurm_profile import load_profile
from ablate.experiments.status import RESUBMIT, UNFINISHED, sweep_status
from ablate.experiments.sweep import RunSpec, SpecError, Sweep
from ablate.runs.store import FINISHED


def launch(sweep: Sweep, runs: list[RunSpec], executor: str | None = None, profile: str | Path | None = None,
           max_parallel: int | None = None, view=None, poll_s: float = 0.5) -> dict[str, list[str]]:
    """Submit every run that is failed, cancelled or missing (completed/diverged are skipped); `view(out,
    runs)` is an optional live view for the local executor (a context manager with `update(active, done)`).
    Returns {"submitted": [...], "skipped": [...], "active": [...]} run ids."""
    out = sweep.out
    name = executor or sweep.executor.get("name", "local")
    ex = EXECUTORS[name]
    settings = {**sweep.executor, **({"max_parallel": max_parallel} if max_parallel else {})}
    local_ranks(sweep, name, settings, runs)  # executor.tasks_per_node: the local executor's alone
    path = profile or (sweep.slurm_profile if ex.uses_profile else None)
    params = load_profile(path) if path else {}  # an explicit --profile is checked whatever the executor
    other = read_manifest(out)
    if other is not None and other.get("name") not in (None, sweep.name):
        raise SpecError(f"{sweep.source}: out: {out} is the runs root of another sweep ({other.get('name')!r}); "
                        f"refusing to mark its runs stale (pick another --out)")
    m = manifest_for(sweep, runs)
    now = {r["run_id"]: r["state"] for r in (sweep_status(out) if (out / MANIFEST).exists() else [])}
    todo = [r for r in runs if now.get(r.run_id, "missing") in RESUBMIT]
    result = {"submitted": [r.run_id for r in todo], "skipped": [r.run_id for r in runs if now.get(r.run_id) in FINISHED],
              "active": [r.run_id for r in runs if now.get(r.run_id) in UNFINISHED]}
    if not todo:
        write_manifest(out, m)
        return result
    folder = out / ".submitit" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    ex.submit(Submission(sweep, todo, m, folder, settings, params if ex.uses_profile else {},
                         str(path) if path else sweep.source, view or NoView, poll_s))
    return result


def cancel(out: str | Path) -> list[str]:
    """Cancel every unfinished run of the sweep in `out` (active jobs are stopped); returns their ids."""
    out = Path(out)
    rows = sweep_status(out)
    m = read_manifest(out)
    hit = [r for r in rows if r["state"] in (*UNFINISHED, "missing")]
    for r in hit:  # first the runs without a job, so a foreground `sweep run` does not start them
        if r["state"] == "missing":
            mark_cancelled(out / r["run_id"])
    ended = [ex.cancel(out, m, [r for r in hit if r["executor"] == name]) for name, ex in EXECUTORS.items()]
    deadline = time.time() + 120  # mark only once workers are gone, or their last status write wins
    while time.time() < deadline and not all(done() for done in ended):
        time.sleep(0.5)
    for r in hit:
        mark_cancelled(out / r["run_id"])
    m["cancelled"] = time.time()
    write_manifest(out, m)
    return [r["run_id"] for r in hit]
