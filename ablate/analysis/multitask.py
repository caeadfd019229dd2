"""rliable's aggregates across the tasks of a task mixture (Agarwal et al. 2021, "Deep RL at the Edge of
the Statistical Precipice", arXiv 2108.13264): each arm's scores form a (runs, tasks) matrix of final
held-out `eval/<task>/pass@1` (rates, so already on one scale; the target of the optimality gap is 1).

- `task_matrices`: arm -> (runs, tasks) matrix, the runs used in the statistics with every task logged;
- `aggregate_table`: per arm, mean, IQM and optimality gap over all run x task scores, each with the
  stratified-bootstrap percentile CI (runs resampled within each task);
- `profiles`: per arm, the performance profile (share of runs scoring above tau, averaged over tasks)
  on a grid of tau in [0, 1], with stratified-bootstrap bands.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ablate.analysis import stats

TAUS = np.linspace(0.0, 1.0, 101)


def task_columns(study, k: int = 1) -> list[str]:
    return sorted(c for c in study.evals.columns if re.fullmatch(rf"eval/\w+/pass@{k}", c))


def task_matrices(study, scores: pd.DataFrame, k: int = 1) -> tuple[list[str], dict[str, np.ndarray]]:
    """(task names, {arm: (runs, tasks) final pass@k}); empty when fewer than two tasks were logged."""
    cols = task_columns(study, k)
    if len(cols) < 2:
        return [], {}
    last = study.evals.sort_values("step").groupby("run_id", observed=True)[cols].last()
    inc = scores[scores["included"]]
    out = {}
    for arm, g in inc.groupby("arm", sort=False):
        m = last.reindex(g["run_id"]).dropna().to_numpy(float)
        if len(m):
            out[arm] = m
    return [c.split("/")[1] for c in cols], out


def aggregate_table(mats: dict[str, np.ndarray], reps: int = stats.REPS, seed: int = 0) -> pd.DataFrame:
    rows = []
    for arm, m in mats.items():
        row = {"arm": arm, "n": len(m), "tasks": m.shape[1]}
        for name in ("mean", "iqm", "optimality_gap"):
            iv = stats.bootstrap_ci(m, name, reps, seed=seed)
            row.update({name: iv.estimate, f"{name}_lo": iv.lo, f"{name}_hi": iv.hi})
        rows.append(row)
    return pd.DataFrame(rows)


def profiles(mats: dict[str, np.ndarray], taus=TAUS, reps: int = stats.REPS, seed: int = 0) -> dict:
    """{arm: (taus, profile, lo, hi, runs)}."""
    return {arm: (np.asarray(taus), *stats.performance_profile(m, taus, reps, seed=seed), len(m))
            for arm, m in mats.items()}
