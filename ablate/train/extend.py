"""Extending a finished run to more steps (`ablate train CONFIG --extend-to N`).

The number of steps is part of a run's config, so of its run id: a run extended from S to N steps is a new
run, in a new folder beside the old one (`<parent>/<run id of the N-step config>`, the layout of `runs/`
and of a sweep's runs root). It starts as a copy of the S-step run: every logged row (metrics, evals,
samples) and the final checkpoint (re-keyed to the new run id), with `extended_from` recorded in
provenance.json; the trainer then resumes it at step S + 1, as after a preemption, and logs S + 1 .. N. The
S-step run is left untouched (a sweep or report that holds it still finds it), and nothing logged is lost.
Like `resume_from_checkpoint` with a larger step budget in TRL or veRL, except that the old run stays.

An extended run is not always the run a fresh N-step training would give: evaluation at step S (the old
run's last step is always evaluated) and any schedule written in terms of `steps` saw S, not N.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from ablate.config import RunConfig, run_id, to_dict
from ablate.runs.store import LOGS, RunFolderError, RunStore, atomic_write


def extend(cfg: RunConfig, src: str | Path, steps: int) -> tuple[RunConfig, Path]:
    """(the `steps`-step config, its run folder) for continuing the completed run of `cfg` in `src`; the
    folder is prepared once (an unfinished extension is resumed as it is). RunFolderError names the problem."""
    src = Path(src)
    old = RunStore(src)
    old.claim(run_id(cfg))  # src holds this config's run, readable, with its own checkpoint
    status = old.status() or {}
    if status.get("state") != "completed":
        raise RunFolderError(f"{src}: --extend-to continues a completed run; this one is "
                             f"{status.get('state', 'not started')} (a failed or cancelled run resumes with the "
                             f"same command without --extend-to)")
    if steps <= cfg.steps:
        raise RunFolderError(f"--extend-to {steps}: the run in {src} already has {cfg.steps} steps; give more")
    new = dataclasses.replace(cfg, steps=steps)
    dst = src.parent / run_id(new)
    store = RunStore(dst)
    if store.read_config() is not None:  # prepared before: resume (or find finished) as any run folder
        return new, dst
    ckpt = old.load_checkpoint(run_id(cfg))
    if ckpt is None or ckpt.get("step") != cfg.steps:
        raise RunFolderError(f"{src}: no checkpoint of the final step {cfg.steps} to continue from")
    dst.mkdir(parents=True, exist_ok=True)
    for log in LOGS:
        if old.path(f"{log}.jsonl").exists():
            shutil.copyfile(old.path(f"{log}.jsonl"), store.path(f"{log}.jsonl"))
    store.save_checkpoint({**ckpt, "config": to_dict(new)}, run_id(new))
    info = {"extended_from": {"run_id": run_id(cfg), "steps": cfg.steps, "folder": str(src.resolve())}}
    atomic_write(store.path("provenance.json"), lambda f: f.write(json.dumps(info, indent=2).encode()))
    store.write_config(new)  # last: a folder with a config is a prepared extension
    return new, dst
