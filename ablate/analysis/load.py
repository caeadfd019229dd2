"""Load run folders into pandas frames (statistics and reports build on them).

    load_runs(path, ...)   tidy frame: one row per run x step x metric (+ flattened config columns)
    load_study(path, ...)  Study: `runs` (one row per run, every run, whatever its state), `metrics` and
                           `evals` (wide: run_id, step, one column per metric), arms and factors
    final_table(x)         one row per run: state, arm, seed, last value of every metric
    eval_problems(study)   per-problem held-out counts of each run's last evaluation (eval_problems.jsonl)

Every run folder is kept, whatever its state (running, failed, diverged, ...); a run that logged nothing
still has its row in `Study.runs` and `final_table`. A torn last JSONL line is skipped.

Columnar cache: the JSONL logs are parsed once and stored as Parquet in `<run>/.ablate-cache/`
(`metrics.parquet`, `evals.parquet`, `meta.json` with the parsed config and status). The cache is keyed
on the size and mtime of config.yaml, status.json and the logs, so a run that is still writing is
re-read; a read-only run folder simply goes uncached.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq
import yaml

from ablate.analysis.design import assign_arms, flatten, read_manifests
from ablate.runs.store import RunFolderError, read_jsonl, status_problem

CACHE = ".ablate-cache"
SOURCES = ("config.yaml", "status.json", "metrics.jsonl", "evals.jsonl")
FIRST = ["run_id", "run_dir", "state", "step", "metric", "value"]
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it: ~7x faster


def find_runs(path: str | Path) -> list[Path]:
    """`path` itself if it is a run folder, else every run folder below it."""
    path = Path(path)
    if (path / "config.yaml").is_file():
        return [path]
    return sorted(p.parent for p in path.rglob("config.yaml") if CACHE not in p.parts)


# --- one run ---------------------------------------------------------------------------------------

def _wide(rows: list[dict]) -> pa.Table:
    """JSONL rows -> a table (step + one float64 column per numeric key); an absent key is null, a
    logged NaN stays NaN."""
    keys = list(dict.fromkeys(k for r in rows for k, v in r.items()
                              if k != "step" and isinstance(v, (int, float))))
    cols = {"step": pa.array([int(r.get("step", -1)) for r in rows], pa.int64())}
    for k in keys:
        vals = [r.get(k) for r in rows]
        cols[k] = pa.array([float(v) if isinstance(v, (int, float)) else None for v in vals], pa.float64())
    return pa.table(cols)


def _numeric(t: pa.Table) -> pa.Table:
    """step (int64) + every numeric/bool column as float64; text and nested columns are dropped."""
    cols = {"step": t["step"].cast(pa.int64()) if "step" in t.column_names else pa.array([-1] * t.num_rows, pa.int64())}
    for name, col in zip(t.column_names, t.columns):
        typ = col.type
        if name != "step" and (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)):
            cols[name] = col.cast(pa.float64())
    return pa.table(cols)


def read_log(path: Path) -> pa.Table:
    """A JSONL log as a wide table, parsed by Arrow's C++ JSON reader (~10x faster than json.loads per
    line). A torn last line (no newline yet, not valid JSON) is cut off; a file the fast reader rejects
    (a corrupt line in the middle, a key that changes type) goes through `read_jsonl`, line by line."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _wide([])
    except OSError as err:  # a folder where the log belongs, no permission: said, never read as "no rows"
        raise RunFolderError(f"{path}: cannot be read ({err.strerror or err}); a log is a regular file") from None
    end = data.rfind(b"\n") + 1
    tail = data[end:]
    if tail.strip():
        try:
            json.loads(tail)
            data += b"\n"
        except ValueError:
            data = data[:end]
    if not data.strip():
        return _wide([])
    try:
        return _numeric(pj.read_json(pa.BufferReader(data), read_options=pj.ReadOptions(block_size=len(data) + 1)))
    except pa.ArrowException:  # ArrowInvalid, ArrowTypeError, ...: the reader refused the file
        return _wide(read_jsonl(path))


def _signature(run_dir: Path) -> list:
    sig = []
    for name in SOURCES:
        try:
            st = os.stat(run_dir / name)
            sig.append([name, st.st_size, st.st_mtime_ns])
        except OSError:
            sig.append([name, None, None])
    return sig


def _checked(run_dir: Path, status: dict) -> dict:
    """A status.json read from disk, or in its place an error naming what breaks its format."""
    problem = status and status_problem(status)
    return {"error": f"{run_dir / 'status.json'}: not a run status ({problem})"} if problem else status


@dataclass
class RunData:
    run_dir: Path
    config: dict
    status: dict
    metrics: pa.Table
    evals: pa.Table


def read_run(run_dir: str | Path, cache: bool = True) -> RunData:
    """One run folder (config, status, metrics and evals tables), through the Parquet cache."""
    run_dir = Path(run_dir)
    cdir = run_dir / CACHE
    sig = _signature(run_dir)
    if cache:
        try:
            meta = json.loads((cdir / "meta.json").read_text())
            if meta["signature"] == sig:
                return RunData(run_dir, meta["config"], _checked(run_dir, meta["status"]),
                               pq.read_table(cdir / "metrics.parquet"), pq.read_table(cdir / "evals.parquet"))
        except (OSError, ValueError, KeyError, pa.ArrowException):
            pass
    try:
        config = yaml.load((run_dir / "config.yaml").read_text(), Loader=SafeLoader) or {}
    except (FileNotFoundError, yaml.YAMLError, UnicodeDecodeError):
        config = {}
    except OSError as err:
        raise RunFolderError(f"{run_dir / 'config.yaml'}: cannot be read ({err.strerror or err})") from None
    config = config if isinstance(config, dict) else {}
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        status = {}
    except OSError as err:
        raise RunFolderError(f"{run_dir / 'status.json'}: cannot be read ({err.strerror or err})") from None
    status = _checked(run_dir, status)
    data = RunData(run_dir, config, status, read_log(run_dir / "metrics.jsonl"), read_log(run_dir / "evals.jsonl"))
    if cache:
        try:
            cdir.mkdir(exist_ok=True)
            pq.write_table(data.metrics, cdir / "metrics.parquet")
            pq.write_table(data.evals, cdir / "evals.parquet")
            meta = {"signature": sig, "config": config, "status": status}
            tmp = cdir / "meta.json.tmp"
            tmp.write_text(json.dumps(meta, default=str))
            os.replace(tmp, cdir / "meta.json")  # meta last: a half-written cache is never trusted
        except OSError:
            pass
    return data


# --- many runs -------------------------------------------------------------------------------------

@dataclass
class Study:
    runs: pd.DataFrame                    # one row per run: run_id, run_dir, state, error, ..., config
    metrics: pd.DataFrame                 # wide per-step metrics: run_id, step, train/..., counters/..., perf/...
    evals: pd.DataFrame                   # wide held-out evaluations: run_id, step, eval/...
    factors: list = field(default_factory=list)   # ablate.analysis.design.Factor, what varies across runs
    stale: pd.DataFrame = field(default_factory=pd.DataFrame)  # runs a sweep manifest marks as not current
    data: list = field(default_factory=list, repr=False)  # RunData per run (same order as `runs`)

    def tidy(self) -> pd.DataFrame:
        return tidy_frame(self.data)


def _run_row(d: RunData) -> dict:
    cfg, st = d.config, d.status
    last = [int(pc.max(t["step"]).as_py()) for t in (d.metrics, d.evals) if t.num_rows]
    rid = cfg.get("run_id")
    return {"run_id": rid if isinstance(rid, str) and rid else d.run_dir.name, "run_dir": str(d.run_dir),
            "state": st.get("state") or ("missing" if not last else "unknown"),
            "error": st.get("error"), "last_step": max(last) if last else -1,
            "planned_steps": cfg.get("steps"), **flatten({k: v for k, v in cfg.items() if k != "run_id"})}


def _concat_wide(data: list[RunData], attr: str, ids: list[str]) -> pd.DataFrame:
    """One wide frame for all runs, concatenated in Arrow (one conversion to pandas, not one per run)."""
    tables = [getattr(d, attr) for d in data]
    counts = np.array([t.num_rows for t in tables], np.int64)
    used = [t for t in tables if t.num_rows]
    if not used:
        return pd.DataFrame({"run_id": pd.Categorical([], categories=ids), "step": np.array([], np.int64)})
    df = pa.concat_tables(used, promote_options="default").to_pandas()
    codes = np.repeat(np.arange(len(ids), dtype=np.int32), counts)
    df.insert(0, "run_id", pd.Categorical.from_codes(codes, categories=list(dict.fromkeys(ids))))
    return df


def load_study(*paths: str | Path, cache: bool = True) -> Study:
    """Every run folder under `paths` (a sweep root, a run folder, or several), with arms and factors
    inferred from the sweep manifest(s) and from which config keys differ (ablate.analysis.design)."""
    dirs = list(dict.fromkeys(r.resolve() for p in paths for r in find_runs(p)))
    data = [read_run(d, cache) for d in dirs]
    # folders of an earlier expansion of a sweep's spec (edited spec, newer ablate) are set apart, listed
    manifests = read_manifests(paths, dirs)
    entries = manifests[0]
    is_stale = [(entries.get(d.config.get("run_id") or d.run_dir.name) or {}).get("current") is False for d in data]
    stale = pd.DataFrame([_run_row(d) for d, s in zip(data, is_stale) if s])
    data = [d for d, s in zip(data, is_stale) if not s]
    runs = pd.DataFrame([_run_row(d) for d in data])
    if runs.empty:
        runs = pd.DataFrame(columns=["run_id", "run_dir", "state", "error", "last_step", "planned_steps"])
    if runs["run_id"].duplicated().any():  # the same run copied into two folders: keep both, apart
        runs["run_id"] = runs["run_id"] + runs.groupby("run_id").cumcount().map(lambda i: f"#{i + 1}" if i else "")
    runs, factors = assign_arms(runs, paths, manifests)
    by_dir = {str(d.run_dir): d for d in data}
    data = [by_dir[r] for r in runs["run_dir"]]
    ids = list(runs["run_id"])
    return Study(runs, _concat_wide(data, "metrics", ids), _concat_wide(data, "evals", ids), factors, stale, data)


def tidy_frame(data: list[RunData]) -> pd.DataFrame:
    """run_id, run_dir, state, step, metric, value + flattened config; string-like columns (and every
    config column) are pandas Categoricals so that 10^7 rows stay small."""
    parts, run_idx, metas = [], [], []
    for i, d in enumerate(data):
        metas.append(_run_row(d))
        for t in (d.metrics, d.evals):
            steps = t["step"].to_numpy()
            for name in t.column_names[1:]:
                col = t[name]
                valid = col.is_valid().to_numpy(zero_copy_only=False) if col.null_count else None
                vals = col.to_numpy()
                s = steps if valid is None else steps[valid]
                parts.append((name, s, vals if valid is None else vals[valid]))
                run_idx.append(np.full(len(s), i, np.int32))
    if not parts:
        return pd.DataFrame(columns=FIRST)
    names = list(dict.fromkeys(p[0] for p in parts))
    code = {n: j for j, n in enumerate(names)}
    idx = np.concatenate(run_idx)
    out = {"step": np.concatenate([p[1] for p in parts]),
           "metric": pd.Categorical.from_codes(
               np.concatenate([np.full(len(p[1]), code[p[0]], np.int32) for p in parts]), names),
           "value": np.concatenate([p[2] for p in parts])}
    keys = list(dict.fromkeys(k for m in metas for k in m if k not in ("error", "last_step", "planned_steps")))
    cols = {}
    for k in keys:
        per_run = [m.get(k) for m in metas]
        cats = list(dict.fromkeys(per_run))
        present = [c for c in cats if c is not None]
        ccode = np.array([present.index(v) if v is not None else -1 for v in per_run], np.int32)
        cols[k] = pd.Categorical.from_codes(ccode[idx], present)
    df = pd.DataFrame({**{k: cols[k] for k in ("run_id", "run_dir", "state")}, **out,
                       **{k: v for k, v in cols.items() if k not in ("run_id", "run_dir", "state")}})
    return df[FIRST + [c for c in df.columns if c not in FIRST]]


def load_runs(*paths: str | Path, cache: bool = True) -> pd.DataFrame:
    """Tidy frame with columns run_id, run_dir, state, step, metric, value, plus the run's config
    (flattened dotted keys: recipe.*, task.*, seed, ...; as Categoricals). Both per-step and evaluation
    metrics are included; incomplete and failed runs are kept, labelled by `state`."""
    dirs = list(dict.fromkeys(r for p in paths for r in find_runs(p)))
    return tidy_frame([read_run(d, cache) for d in dirs])


def eval_problems(study: Study) -> pd.DataFrame:
    """Held-out correct counts per problem at each run's last evaluation in `eval_problems.jsonl`, its
    repeats pooled: run_id, step, problem, n (eval.n_samples x eval.repeats), correct. Runs without the
    file (written before eval.repeats existed) have no rows."""
    rows = []
    for rid, d in zip(study.runs["run_id"], study.data):
        log = read_jsonl(d.run_dir / "eval_problems.jsonl")
        last = max((r.get("step", -1) for r in log), default=None)
        for r in log:
            if r.get("step") == last:
                rows += [(rid, last, pid, r["n"], c) for pid, c in zip(r["problems"], r["correct"])]
    df = pd.DataFrame(rows, columns=["run_id", "step", "problem", "n", "correct"])
    return df.groupby(["run_id", "step", "problem"], sort=False, as_index=False)[["n", "correct"]].sum()


def final_table(x: Study | pd.DataFrame) -> pd.DataFrame:
    """One row per run: run_id, state, (arm, seed when known), last_step and the last logged value of
    every metric. Accepts a Study (every run, even one that logged nothing) or a tidy frame."""
    if isinstance(x, Study):
        lasts = []
        for wide in (x.metrics, x.evals):
            if len(wide):
                lasts.append(wide.sort_values("step").groupby("run_id", observed=True).last().drop(columns="step"))
        base = x.runs[[c for c in ("run_id", "run_dir", "state", "arm", "seed", "last_step", "planned_steps", "error")
                       if c in x.runs]]
        out = base.set_index("run_id")
        for part in lasts:
            out = out.join(part, how="left")
        return out.reset_index()
    df = x.sort_values("step")
    keys = ["run_id", "run_dir", "state"] + (["seed"] if "seed" in df else [])
    meta = df.groupby("run_id", observed=True)[keys[1:]].first()
    meta["last_step"] = df.groupby("run_id", observed=True)["step"].max()
    last = df.groupby(["run_id", "metric"], observed=True)["value"].last().unstack("metric")
    return meta.join(last).reset_index()
