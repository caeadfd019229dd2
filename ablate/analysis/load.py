"""Load run folders into one tidy DataFrame: one row per run x step x metric."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ablate.store import RunStore


def find_runs(path: str | Path) -> list[Path]:
    """`path` itself if it is a run folder, else every run folder below it."""
    path = Path(path)
    if (path / "config.yaml").is_file():
        return [path]
    return sorted(p.parent for p in path.rglob("config.yaml"))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v  # lists (e.g. eval.ks) as JSON text
    return out


def load_runs(*paths: str | Path) -> pd.DataFrame:
    """Tidy frame with columns run_id, run_dir, state, step, metric, value, plus the run's config
    (flattened dotted keys: recipe.*, task.*, seed, ...). Both per-step and evaluation metrics are
    included; incomplete and failed runs are kept, labelled by `state`."""
    frames = []
    for run_dir in (r for p in paths for r in find_runs(p)):
        store = RunStore(run_dir)
        cfg = store.read_config() or {}
        status = store.status() or {}
        rows = [{"step": row["step"], "metric": k, "value": v}
                for log in ("metrics", "evals") for row in store.read(log)
                for k, v in row.items() if k != "step" and isinstance(v, (int, float))]
        if not rows:
            continue
        df = pd.DataFrame(rows)
        meta = {"run_id": cfg.get("run_id"), "run_dir": str(run_dir), "state": status.get("state"),
                **_flatten({k: v for k, v in cfg.items() if k != "run_id"})}
        frames.append(df.assign(**meta))
    if not frames:
        return pd.DataFrame(columns=["run_id", "run_dir", "state", "step", "metric", "value"])
    df = pd.concat(frames, ignore_index=True)
    first = ["run_id", "run_dir", "state", "step", "metric", "value"]
    return df[first + [c for c in df.columns if c not in first]]
