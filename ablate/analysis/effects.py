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

from ablate.analysis import multiplicity, stats
from ablate.analysis.design import arm_order
from ablate.analysis.power import TDesign
from ablate.runs.store import RunState

INCLUDED_STATES: tuple[RunState, ...] = ("completed",)


def final(steps: np.ndarray, values: np.ndarray, k: int) -> float:
    """The last evaluation."""
    return float(values[-1])


def last_k(steps: np.ndarray, values: np.ndarray, k: int) -> float:
    """Mean of the last k evaluations (less noisy than the last one alone)."""
    return float(values[-k:].mean())


def auc(steps: np.ndarray, values: np.ndarray, k: int) -> float:
    """Area under the curve over the logged steps (trapezoid), divided by their range: the curve's
    average level, which rewards getting there early."""
    if len(values) < 2 or steps[-1] == steps[0]:
        return float(values[-1])
    return float(np.sum((values[1:] + values[:-1]) / 2 * np.diff(steps)) / (steps[-1] - steps[0]))


def best(steps: np.ndarray, values: np.ndarray, k: int) -> float:
    """Max over training: the best of many noisy evaluations, biased upward (selection on the test set)."""
    return float(values.max())


# one score per run from its (steps,), (values,) sorted by step, NaNs dropped; same signature
SCORES = {"final": final, "last_k": last_k, "auc": auc, "max": best}
LAST_K = 3


def run_scores(study, metric: str, score: str = "final", k: int = LAST_K) -> pd.Series:
    """run_id -> SCORES[score] of the run's logged values of `metric` (held-out evals, else per-step)."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}; got {score!r}")
    wide = study.evals if metric in study.evals.columns else study.metrics
    if metric not in wide.columns:
        return pd.Series(dtype=float)
    d = wide[["run_id", "step", metric]].dropna(subset=[metric]).sort_values(["run_id", "step"], kind="stable")
    if score == "final":
        return d.groupby("run_id", observed=True)[metric].last()
    f = SCORES[score]
    return pd.Series({rid: f(g["step"].to_numpy(float), g[metric].to_numpy(float), k)
                      for rid, g in d.groupby("run_id", observed=True)}, dtype=float)


def final_scores(study, metric: str, states=INCLUDED_STATES, score: str = "final", k: int = LAST_K) -> pd.DataFrame:
    """One row per run: run_id, arm, seed, state, level columns, value (the run's score: by default its
    last logged value of `metric`; see SCORES) and `included` (used by the statistics) with `reason`
    when not."""
    cols = ["run_id", "arm", "seed", "state", "last_step", "planned_steps"] + [f.column for f in study.factors]
    out = study.runs[[c for c in cols if c in study.runs]].copy()
    out["value"] = out["run_id"].map(run_scores(study, metric, score, k)).astype(float)
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


def _sd(v: np.ndarray) -> float:
    return float(np.std(v, ddof=1)) if len(v) > 1 else np.nan


def contrast(cells: dict[str, pd.Series], weights: dict[str, float], reps=stats.REPS, seed=0,
             ci=stats.CI, method="t") -> stats.Interval:
    """sum_c w_c * mean(cell c), paired by seed when >= 2 seeds have every cell, else unpaired. The
    Interval's `design` is the t test behind it (p-value, minimum detectable effect)."""
    used = {a: w for a, w in weights.items() if w != 0}
    if not used or any(a not in cells or len(cells[a]) == 0 for a in used):
        return stats.Interval(np.nan, np.nan, np.nan, 0)
    common = set.intersection(*(set(cells[a].index) for a in used))
    if len(common) >= 2:
        seeds = sorted(common)
        per_seed = sum(w * cells[a].loc[seeds].to_numpy(float) for a, w in used.items())
        iv = stats.mean_ci(per_seed, method, reps, ci, seed)
        return stats.Interval(iv.estimate, iv.lo, iv.hi, len(seeds), paired=True,
                              design=TDesign((1.0,), (_sd(per_seed),), (len(seeds),)))
    vals = [cells[a].to_numpy(float) for a in used]
    iv = stats.contrast_ci(vals, list(used.values()), method, reps, ci, seed)
    return stats.Interval(iv.estimate, iv.lo, iv.hi, iv.n, paired=False,
                          design=TDesign(tuple(used.values()), tuple(_sd(v) for v in vals), tuple(len(v) for v in vals)))


def _test_columns(iv: stats.Interval | None, mde_target: float | None) -> dict:
    """p-value, minimum detectable effect at the seeds used, seeds per cell needed for `mde_target`."""
    d = iv.design if iv is not None else None
    if d is None:
        return {"p": np.nan, "mde": np.nan, "seeds_needed": np.nan}
    return {"p": d.p_value(iv.estimate), "mde": d.mde(),
            "seeds_needed": d.seeds_for(mde_target)[0] if mde_target else np.nan}


def adjust_family(table: pd.DataFrame, cells: dict, weights: list, adjust: str, reps=stats.REPS, seed=0,
                  ci=stats.CI, method="t", prefix: str = "") -> pd.DataFrame:
    """Add p_adj, adj_lo, adj_hi, adj_significant, adj_level to a table of contrasts (one family):
    adjusted p-values (ablate.analysis.multiplicity) and each contrast's interval recomputed at the
    family's adjusted level. `weights`: the contrast of each row (None for a row that is not one)."""
    p = table["p"].to_numpy(float) if len(table) else np.array([])
    level = multiplicity.adjusted_level(p, adjust, 1 - ci)
    lo, hi = np.full(len(table), np.nan), np.full(len(table), np.nan)
    for i, w in enumerate(weights):
        if w is not None and np.isfinite(p[i]):
            iv = contrast(cells, w, reps, seed, level, method)
            lo[i], hi[i] = iv.lo, iv.hi
    adj = multiplicity.adjust(p, adjust)
    return table.assign(p_adj=adj, adj_lo=lo, adj_hi=hi, adj_level=level,
                        adj_significant=np.isfinite(lo) & ((lo > 0) | (hi < 0)))


def compare_arms(scores: pd.DataFrame, reps=stats.REPS, seed=0, ci=stats.CI, method="t", adjust="none",
                 mde_target: float | None = None) -> pd.DataFrame:
    """Per arm: seeds used / runs, mean and IQM with CIs, difference to the reference arm (the first in
    design order) and probability of improvement over it, seed spread (sd, ddof=1); for each difference
    its t-test p-value, minimum detectable effect, seeds needed for `mde_target` and (one family, by
    `adjust`) the adjusted p-value and interval."""
    cells = _cells(scores)
    order = [a for a in dict.fromkeys(scores["arm"])]
    ref = order[0]
    rows, weights = [], []
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
                     "poi_hi": p.hi if p else np.nan, "reference": arm == ref, **_test_columns(d, mde_target)})
        weights.append({arm: 1.0, ref: -1.0} if d else None)
    return adjust_family(pd.DataFrame(rows), cells, weights, adjust, reps, seed, ci, method)


def _levels_of(scores: pd.DataFrame, factors) -> dict[tuple, str]:
    """levels tuple -> arm."""
    cols = [f.column for f in factors]
    return {tuple(r[c] for c in cols): r["arm"] for _, r in scores.drop_duplicates("arm").iterrows()}


def factorial_effects(scores: pd.DataFrame, factors, reps=stats.REPS, seed=0, ci=stats.CI, method="t",
                      adjust="none", mde_target: float | None = None) -> pd.DataFrame:
    """Main effects of every non-reference level of every factor and two-way interactions between
    factors, each with a CI, p-value, MDE and (all terms one family) adjusted p-value and interval.
    Empty when fewer than one factor."""
    cols = ["term", "kind", "estimate", "lo", "hi", "n", "paired", "significant", "coverage",
            "factor", "level", "vs", "factor2", "level2", "p", "mde", "seeds_needed"]
    if not factors:
        return adjust_family(pd.DataFrame(columns=cols), {}, [], adjust)
    cells, arm_of = _cells(scores), _levels_of(scores, factors)
    rows, contrasts = [], []

    def add(term, kind, weights, cover, total, **extra):
        iv = contrast(cells, weights, reps, seed, ci, method)
        rows.append({"term": term, "kind": kind, "estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": iv.n,
                     "paired": iv.paired, "significant": iv.excludes, "coverage": f"{cover}/{total}", **extra,
                     **_test_columns(iv, mde_target)})
        contrasts.append(weights)

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
    return adjust_family(pd.DataFrame(rows, columns=cols), cells, contrasts, adjust, reps, seed, ci, method)


def _put(combo: tuple, i: int, level) -> tuple:
    return combo[:i] + (level,) + combo[i:]


def _put2(combo: tuple, i: int, a, j: int, b) -> tuple:
    out = list(combo)
    for pos, v in sorted([(i, a), (j, b)]):
        out.insert(pos, v)
    return tuple(out)


def seed_warnings(scores: pd.DataFrame, arms: pd.DataFrame, effects: pd.DataFrame, min_seeds: int = 3,
                  scale: float = 1.0, unit: str = "") -> list[str]:
    """Too few seeds per arm; seed-to-seed spread larger than an effect (both shown x `scale`, in `unit`)."""
    u = f" {unit}" if unit else ""
    out = [f"arm '{r.arm}' has {r.n} usable seed(s) (< {min_seeds}): its CIs are unreliable or undefined"
           for r in arms.itertuples() if r.n < min_seeds]
    spread = float(np.nanmean(arms["sd"])) if arms["sd"].notna().any() else np.nan
    if np.isfinite(spread):
        terms = list(effects[effects["kind"] == "main"].itertuples()) if len(effects) else []
        for t in terms:
            if abs(t.estimate) < spread:
                out.append(f"seed-to-seed spread (sd {spread * scale:.3g}{u}) exceeds the effect of {t.term} "
                           f"({t.estimate * scale:+.3g}{u}): more seeds are needed to pin it down")
        if not terms:
            for r in arms[~arms["reference"]].itertuples():
                if abs(r.diff) < spread:
                    out.append(f"seed-to-seed spread (sd {spread * scale:.3g}{u}) exceeds the difference of "
                               f"'{r.arm}' to the reference ({r.diff * scale:+.3g}{u})")
    return out


def ordered_arms(study) -> list[str]:
    return arm_order(study.runs)
