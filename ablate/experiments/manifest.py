"""A sweep's `<out>/manifest.json`: what only the launcher knows (the spec, each run's arm, seed and
toggles, which job ran it, when). The run folders are the source of truth for each run's state.

A manifest is data from disk (a shared file system, an edited file), read in one place, `read_manifest`,
and checked there against its format (`manifest_problem`): its run ids become folder names and its job ids
process ids and scheduler arguments, so a crafted one must never reach a path outside the sweep folder.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from ablate.experiments.sweep import RunSpec, SpecError, Sweep
from ablate.runs.store import atomic_write, is_run_id, read_json

MANIFEST = "manifest.json"


def read_manifest(out: str | Path) -> dict | None:
    p = Path(out) / MANIFEST
    if not p.exists():
        return None
    m = read_json(p, "sweep manifest", "move it aside and rerun `ablate sweep run` (run folders are the source "
                                        "of truth: finished runs are kept)", SpecError)
    if not isinstance(m, dict) or not isinstance(m.get("runs"), dict):
        raise SpecError(f"{p}: not a sweep manifest (expected a mapping with `runs`)")
    problem = manifest_problem(m)
    if problem:  # a manifest is data from disk: its ids name folders and processes, so each keeps its format
        raise SpecError(f"{p}: {problem}; not a manifest ablate wrote: refusing to use it (move it aside and "
                        f"rerun `ablate sweep run`: run folders are the source of truth)")
    return m


JOB_IDS = {"local": re.compile(r"\d+"), "slurm": re.compile(r"\d+(_\d+)?"), "debug": re.compile(r"DEBUG_\d+")}
ENTRY_TYPES = {"arm": (str, type(None)), "seed": (int, type(None)), "toggles": dict, "steps": (int, type(None)),
               "current": bool, "jobs": list}


def manifest_problem(m: dict) -> str | None:
    """What in a manifest read from disk breaks its format, or None: run ids are 12 hex digits (a config's
    content hash), job ids the executor's (digits; DEBUG_digits), job folders relative paths below the runs
    root; so none becomes a path outside the sweep folder, another process's id or a scheduler option."""
    if not isinstance(m.get("name", ""), str):
        return f"name: {m.get('name')!r} is not a sweep name"
    spec = m.get("spec", {})
    if not (isinstance(spec, dict) and isinstance(spec.get("arms") or {}, dict) and isinstance(spec.get("grid") or {}, dict)
            and all(isinstance(v, list) for v in (spec.get("grid") or {}).values())):
        return "spec: expected the sweep spec (a mapping; arms a mapping, grid a mapping of lists)"
    for rid, entry in m["runs"].items():
        if not is_run_id(rid):
            return f"runs: {rid!r} is not a run id (12 hexadecimal digits, the hash of a config)"
        if not isinstance(entry, dict):
            return f"runs.{rid}: expected a mapping"
        bad = [k for k, tp in ENTRY_TYPES.items() if k in entry and not isinstance(entry[k], tp)]
        if bad or "jobs" not in entry:
            return f"runs.{rid}.{(bad or ['jobs'])[0]}: missing or of the wrong type"
        for i, job in enumerate(entry["jobs"]):
            where = f"runs.{rid}.jobs[{i}]"
            if not isinstance(job, dict) or job.get("executor") not in JOB_IDS:
                return f"{where}: expected a mapping with executor one of {', '.join(JOB_IDS)}"
            if not (isinstance(job.get("job_id"), str) and JOB_IDS[job["executor"]].fullmatch(job["job_id"])):
                return f"{where}.job_id: {job.get('job_id')!r} is not a {job['executor']} job id"
            folder = job.get("folder")
            if not (isinstance(folder, str) and folder and not Path(folder).is_absolute()
                    and ".." not in Path(folder).parts):
                return f"{where}.folder: {folder!r} is not a folder below the runs root"
            if not isinstance(job.get("submitted", 0), (int, float)):
                return f"{where}.submitted: expected a time"
    return None


def write_manifest(out: Path, manifest: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest["updated"] = time.time()
    atomic_write(out / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))


def manifest_for(sweep: Sweep, runs: list[RunSpec]) -> dict:
    """The manifest with `runs` (the spec's whole expansion) as its current runs. Entries of earlier
    expansions (an edited spec, or a config field added by a newer ablate: new content hashes) are kept,
    marked `current: false`: their folders stay on disk, and status and reports leave them out."""
    m = read_manifest(sweep.out) or {"name": sweep.name, "created": time.time(), "runs": {}}
    m.update(spec_path=sweep.source, spec=sweep.raw)
    for entry in m["runs"].values():
        entry["current"] = False
    for r in runs:
        entry = m["runs"].setdefault(r.run_id, {"jobs": []})
        entry.update(arm=r.arm, seed=r.seed, toggles=r.toggles, steps=r.config.steps, current=True)
    return m


def record(m: dict, run_id: str, executor: str, job_id: str, folder: Path, out: Path) -> None:
    m["runs"][run_id]["jobs"].append({"executor": executor, "job_id": str(job_id), "submitted": time.time(),
                                      "folder": os.path.relpath(folder, out)})
