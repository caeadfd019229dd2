"""The local run store, the source of truth: one folder per run.

    config.yaml       the fully resolved config (plus its run id)
    provenance.json   versions, git SHA, device, host, seed, SLURM job id
    status.json       {"state": running|completed|failed|diverged|cancelled|pruned, "step", "error", ...}
    metrics.jsonl     one line per optimizer step: {"step": s, "train/...": v, "perf/...": v}
    evals.jsonl       one line per held-out evaluation: {"step": s, "eval/...": v}
    samples.jsonl     sample completions: {"step", "split", "prompt", "completion", "reward", ...}
    checkpoint.pt     trainer state for resuming (atomic replace)

Appends are line-buffered so a crash loses at most the step in flight; readers skip a half-written
last line. Files that are replaced (config, status, checkpoint) are written to a temporary file and
renamed, so a reader never sees a partial one.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
import warnings
from pathlib import Path

import yaml

from ablate.config import RunConfig, run_id, to_dict

LOGS = ("metrics", "evals", "samples")
STATES = ("running", "completed", "failed", "diverged", "cancelled", "pruned")


def atomic_write(path: Path, write) -> None:
    """`write(file)` into a temporary sibling, then rename over `path`."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    """All complete lines; a torn last line (crash mid-write) is skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class RunStore:
    """The run folder. Optional `mirrors` (e.g. W&B) receive every appended row and status change;
    a mirror that fails is dropped with one warning, and the local store carries on regardless."""

    def __init__(self, root: str | Path, mirrors: list | None = None):
        self.root = Path(root)
        self.mirrors = list(mirrors or [])

    def _mirror(self, method: str, *args) -> None:
        for m in list(self.mirrors):
            try:
                getattr(m, method)(*args)
            except Exception as err:  # noqa: BLE001 - a dashboard must never stop training
                self.mirrors.remove(m)
                warnings.warn(f"{type(m).__name__} disabled after an error: {err!r}; the local run store "
                              f"in {self.root} stays complete", RuntimeWarning, stacklevel=3)

    def close(self, state: str) -> None:
        self._mirror("close", state)

    def path(self, name: str) -> Path:
        return self.root / name

    # --- config and provenance ---
    def write_config(self, cfg: RunConfig) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        text = yaml.safe_dump({"run_id": run_id(cfg), **to_dict(cfg)}, sort_keys=False)
        atomic_write(self.path("config.yaml"), lambda f: f.write(text.encode()))

    def read_config(self) -> dict | None:
        p = self.path("config.yaml")
        return yaml.safe_load(p.read_text()) if p.exists() else None

    def write_provenance(self, cfg: RunConfig, device: str) -> None:
        import torch  # here and in the checkpoint methods only: reading a run store needs no torch
        import transformers

        import ablate

        info = {
            "ablate": ablate.__version__, "git_sha": _git_sha(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "device": device, "host": socket.gethostname(), "seed": cfg.seed, "run_id": run_id(cfg),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        atomic_write(self.path("provenance.json"), lambda f: f.write(json.dumps(info, indent=2).encode()))

    # --- status ---
    def status(self) -> dict | None:
        p = self.path("status.json")
        return json.loads(p.read_text()) if p.exists() else None

    def set_status(self, state: str, step: int, error: str | None = None) -> None:
        assert state in STATES, state
        row = {"state": state, "step": step, "error": error, "updated": time.time()}
        atomic_write(self.path("status.json"), lambda f: f.write(json.dumps(row, indent=2).encode()))
        self._mirror("status", state, step, error)

    # --- append-only logs ---
    def append(self, log: str, row: dict) -> None:
        with open(self.path(f"{log}.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        self._mirror("append", log, row)

    def read(self, log: str) -> list[dict]:
        return read_jsonl(self.path(f"{log}.jsonl"))

    def truncate_after(self, step: int) -> None:
        """Drop rows logged after `step` (work lost since the last checkpoint is redone on resume)."""
        for log in LOGS:
            p = self.path(f"{log}.jsonl")
            if p.exists():
                keep = "".join(json.dumps(r) + "\n" for r in read_jsonl(p) if r["step"] <= step)
                atomic_write(p, lambda f: f.write(keep.encode()))

    # --- checkpoint ---
    def save_checkpoint(self, state: dict) -> None:
        import torch

        atomic_write(self.path("checkpoint.pt"), lambda f: torch.save(state, f))

    def load_checkpoint(self) -> dict | None:
        p = self.path("checkpoint.pt")
        import torch

        return torch.load(p, weights_only=False) if p.exists() else None


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None
