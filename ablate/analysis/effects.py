"""Comparisons between arms and factorial effects of toggles, on one metric's final value per run.

Every effect is a contrast: a weighted sum of arm (cell) means. With seeds shared across the cells the
contrast is computed per seed and those per-seed values are the sample (paired: same seed = same
prompts); else the cells are independent samples. The interval comes from ablate.analysis.stats
(`method`: Student t by default, or the percentile / BCa bootstrap).

- Arm vs reference: mean(arm) - mean(reference arm).
- Main effect of a factor level L: the difference L - reference, averaged over every combination of
  the other factors' levels (the usual 2^k main effect for two-level factors).
- Two-way interaction of (F=L, G=M): the difference of differences
  [y(L,M) - y(ref,M)] - [y(L,refG) - y(ref,refG)], averaged over the remaining factors: how much the
  effect of F changes when G is switched on.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from ablate.analysis import stats
from ablate.analysis.design import arm_order

INCLUDED_STATES = ("completed",)


def final_scores(study, metric: str, states=INCLUDED_STATES) -> pd.DataFrame:
    """One row per run: run_id, arm, seed, state, level columns, value (the run's last logged value of
    `metric`) and `included` (used by the statistics) with `reason` when not."""
    wide = study.evals if metric in study.evals.columns else study.metrics
    cols = ["run_id", "arm", "seed", "state", "last_step", "planned_steps"] + [f.column for f in study.factors]
    out = study.runs[[c for c in cols if c in study.runs]].copy()
    if metric in wide.columns:
        last = wide[["run_id", "step", metric]].dropna(subset=[metric]).sort_values("step")
        last = last.groupby("run_id", observed=True)[metric].last()
        out["value"] = out["run_id"].map(last).astype(float)
    else:
        out["value"] = np.nan
    reason = np.where(~out["state"].isin(states), "state " + out["state"].astype(str),
                      np.where(out["value"].isna(), f"no {metric}", ""))
    if "planned_steps" in out:
        short = (out["last_step"] < out["planned_steps"].fillna(-1)) & (reason == "")
        reason = np.where(short, "stopped before its last step", reason)
    out["reason"] = reason
    out["included"] = out["reason"] == ""
    return out


def _cells(scores: pd.DataFrame) -> dict[str, pd.Series]:
    inc = scores[scores["included"]]
    return {arm: g.set_index("seed")["value"] for arm, g in inc.groupby("arm", sort=False)}


def contrast(cells: dict[str, pd.Series], weights: dict[str, float], reps=stats.REPS, seed=0,
             ci=stats.CI, method="t") -> stats.Interval:
    """sum_c w_c * mean(cell c), paired by seed when >= 2 seeds have every cell, else unpaired."""
    used = {a: w for a, w in weights.items() if w != 0}
    if not used or any(a not in cells or len(cells[a]) == 0 for a in used):
        return stats.Interval(np.nan, np.nan, np.nan, 0)
    common = set.intersection(*(set(cells[a].index) for a in used))
    if len(common) >= 2:
        seeds = sorted(common)
        per_seed = sum(w * cells[a].loc[seeds].to_numpy(float) for a, w in used.items())
        iv = stats.mean_ci(per_seed, method, reps, ci, seed)
        return stats.Interval(iv.estimate, iv.lo, iv.hi, len(seeds), paired=True)
    iv = stats.contrast_ci([cells[a].to_numpy(float) for a in used], list(used.values()), method, reps, ci, seed)
    return stats.Interval(iv.estimate, iv.lo, iv.hi, iv.n, paired=False)


def compare_arms(scores: pd.DataFrame, reps=stats.REPS, seed=0, ci=stats.CI, method="t") -> pd.DataFrame:
    """Per arm: seeds used / runs, mean and IQM with CIs, difference to the reference arm (the first in
    design order) and probability of improvement over it, seed spread (sd, ddof=1)."""
    cells = _cells(scores)
    order = [a for a in dict.fromkeys(scores["arm"])]
    ref = order[0]
    rows = []
    for arm in order:
        v = cells.get(arm, pd.Series(dtype=float)).to_numpy(float)
        m = stats.mean_ci(v, method, reps, ci, seed)
        q = stats.bootstrap_ci(v, "iqm", reps, ci, seed)
        d = contrast(cells, {arm: 1.0, ref: -1.0}, reps, seed, ci, method) if arm != ref else None
        p = (stats.poi_ci(v, cells[ref].to_numpy(float), reps, ci, seed)
             if arm != ref and ref in cells and len(v) else None)
        sub = scores[scores["arm"] == arm]
        rows.append({"arm": arm, "n": len(v), "runs": len(sub),
                     "excluded": ", ".join(f"{r.run_id} ({r.reason})" for r in sub.itertuples() if not r.included),
                     "mean": m.estimate, "mean_lo": m.lo, "mean_hi": m.hi,
                     "iqm": q.estimate, "iqm_lo": q.lo, "iqm_hi": q.hi,
                     "sd": float(np.std(v, ddof=1)) if len(v) > 1 else np.nan,
                     "diff": d.estimate if d else 0.0, "diff_lo": d.lo if d else np.nan,
                     "diff_hi": d.hi if d else np.nan, "paired": d.paired if d else None,
                     "poi": p.estimate if p else np.nan, "poi_lo": p.lo if p else np.nan,
                     "poi_hi": p.hi if p else np.nan, "reference": arm == ref})
    return pd.DataFrame(rows)


def _levels_of(scores: pd.DataFrame, factors) -> dict[tuple, str]:
    """levels tuple -> arm."""
    cols = [f.column for f in factors]
    return {tuple(r[c] for c in cols): r["arm"] for _, r in scores.drop_duplicates("arm").iterrows()}


def factorial_effects(scores: pd.DataFrame, factors, reps=stats.REPS, seed=0, ci=stats.CI, method="t") -> pd.DataFrame:
    """Main effects of every non-reference level of every factor and two-way interactions between
    factors, each with a CI. Empty when fewer than one factor."""
    cols = ["term", "kind", "estimate", "lo", "hi", "n", "paired", "significant", "coverage",
            "factor", "level", "vs", "factor2", "level2"]
    if not factors:
        return pd.DataFrame(columns=cols)
    cells, arm_of = _cells(scores), _levels_of(scores, factors)
    rows = []

    def add(term, kind, weights, cover, total, **extra):
        iv = contrast(cells, weights, reps, seed, ci, method)
        rows.append({"term": term, "kind": kind, "estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": iv.n,
                     "paired": iv.paired, "significant": iv.excludes, "coverage": f"{cover}/{total}", **extra})

    for i, f in enumerate(factors):
        others = [g for j, g in enumerate(factors) if j != i]
        combos = list(itertools.product(*(g.levels for g in others)))
        for lv in f.levels[1:]:
            w, k = {}, 0
            for c in combos:
                hi, lo = arm_of.get(_put(c, i, lv)), arm_of.get(_put(c, i, f.reference))
                if hi in cells and lo in cells:
                    k += 1
                    w[hi], w[lo] = w.get(hi, 0) + 1, w.get(lo, 0) - 1
            if k:
                add(f"{f.name}={lv}", "main", {a: v / k for a, v in w.items()}, k, len(combos),
                    factor=f.name, level=lv, vs=f.reference)
    for (i, f), (j, g) in itertools.combinations(enumerate(factors), 2):
        rest = [h for t, h in enumerate(factors) if t not in (i, j)]
        combos = list(itertools.product(*(h.levels for h in rest)))
        for lf, lg in itertools.product(f.levels[1:], g.levels[1:]):
            w, k = {}, 0
            for c in combos:
                corners = [(lf, lg, 1), (f.reference, lg, -1), (lf, g.reference, -1), (f.reference, g.reference, 1)]
                arms = [(arm_of.get(_put2(c, i, a, j, b)), s) for a, b, s in corners]
                if all(a in cells for a, _ in arms):
                    k += 1
                    for a, s in arms:
                        w[a] = w.get(a, 0) + s
            if k:
                add(f"{f.name}={lf} x {g.name}={lg}", "interaction", {a: v / k for a, v in w.items()}, k,
                    len(combos), factor=f.name, level=lf, vs=f.reference, factor2=g.name, level2=lg)
    return pd.DataFrame(rows, columns=cols)


def _put(combo: tuple, i: int, level) -> tuple:
    return combo[:i] + (level,) + combo[i:]


def _put2(combo: tuple, i: int, a, j: int, b) -> tuple:
    out = list(combo)
    for pos, v in sorted([(i, a), (j, b)]):
        out.insert(pos, v)
    return tuple(out)


def seed_warnings(scores: pd.DataFrame, arms: pd.DataFrame, effects: pd.DataFrame, min_seeds: int = 3) -> list[str]:
    """Too few seeds per arm; seed-to-seed spread larger than an effect."""
    out = [f"arm '{r.arm}' has {r.n} usable seed(s) (< {min_seeds}): its CIs are unreliable or undefined"
           for r in arms.itertuples() if r.n < min_seeds]
    spread = float(np.nanmean(arms["sd"])) if arms["sd"].notna().any() else np.nan
    if np.isfinite(spread):
        terms = list(effects[effects["kind"] == "main"].itertuples()) if len(effects) else []
        for t in terms:
            if abs(t.estimate) < spread:
                out.append(f"seed-to-seed spread (sd {spread:.3g}) exceeds the effect of {t.term} "
                           f"({t.estimate:+.3g}): more seeds are needed to pin it down")
        if not terms:
            for r in arms[~arms["reference"]].itertuples():
                if abs(r.diff) < spread:
                    out.append(f"seed-to-seed spread (sd {spread:.3g}) exceeds the difference of '{r.arm}' "
                               f"to the reference ({r.diff:+.3g})")
    return out


def ordered_arms(study) -> list[str]:
    return arm_order(study.runs)
