"""Compute-performance fits: the sigmoid of Khatri et al. (2025), "The Art of Scaling Reinforcement
Learning Compute for LLMs" (ScaleRL), arXiv 2510.13786, fitted per arm instead of comparing arms at one
point of their curves.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

C: compute (generated tokens, samples or wall seconds: the report labels which); R(C): held-out metric;
R0: the value before training, fixed to the measured step-0 evaluation (weakly identified once the
early points are noisy); A: the asymptote (ceiling); B > 0: the steepness (efficiency); C_mid: the
compute at half the gain. Compute to reach a fraction f of the gain: C_mid (f / (1 - f))^(1 / B).

- `fit`: nonlinear least squares (scipy.optimize.curve_fit) on every (C, y) point of the arm's seeds,
  bounds A in [lo, hi] of the metric (default [0, 1] for a rate), B in [0.1, 10], C_mid > 0.
- `bootstrap_fit`: CIs for A, B, C_mid by resampling seeds with replacement and refitting. Default
  interval "t": point +- t_{0.975, n-1} x sd of the refits x sqrt(n / (n - 1)), because at 3-10 seeds
  the percentile interval of a seed bootstrap is too narrow (as for means, ablate.analysis.stats): in
  100 simulated 5-seed studies (tests/test_analysis_scaling.py, 25 refits) the percentile interval
  covered the planted A, B, C_mid 74 / 83 / 78% of the time, the t-scaled one 97 / 92 / 93%. "percentile" is
  there for many seeds.
- `extrapolation`: fit on the points with C <= frac * max C, predict the rest, report the error.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.optimize
import scipy.stats

B_BOUNDS = (0.1, 10.0)
REPS = 200


def sigmoid(c, A: float, B: float, c_mid: float, r0: float):
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        return r0 + (A - r0) / (1 + (c_mid / c) ** B)


def compute_for(fraction: float, B: float, c_mid: float) -> float:
    """Compute at which a fraction of the gain A - R0 is reached."""
    return float(c_mid * (fraction / (1 - fraction)) ** (1 / B))


@dataclass(frozen=True)
class Fit:
    A: float
    B: float
    c_mid: float
    r0: float
    se: tuple = (np.nan, np.nan, np.nan)     # curve_fit standard errors of A, B, C_mid
    ok: bool = True

    def __call__(self, c):
        return sigmoid(c, self.A, self.B, self.c_mid, self.r0)


def fit(c, y, r0: float, a_bounds=(0.0, 1.0), p0=None) -> Fit:
    """Least-squares fit of A, B, C_mid with R0 fixed; points with C <= 0 or non-finite are dropped."""
    c, y = np.asarray(c, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    ok = np.isfinite(c) & np.isfinite(y) & (c > 0)
    c, y = c[ok], y[ok]
    if len(c) < 4 or np.ptp(c) == 0:
        return Fit(np.nan, np.nan, np.nan, r0, ok=False)
    scale = float(np.median(c))                                     # fit in units of the median compute
    lo_a, hi_a = a_bounds
    if p0 is None:
        a0 = float(np.clip(y.max() + 0.1 * (y.max() - r0), lo_a + 1e-6, hi_a - 1e-6))
        p0 = (a0, 1.0, 1.0)
    else:
        p0 = (float(np.clip(p0[0], lo_a + 1e-6, hi_a - 1e-6)), float(np.clip(p0[1], *B_BOUNDS)), p0[2] / scale)
    bounds = ([lo_a, B_BOUNDS[0], 1e-6], [hi_a, B_BOUNDS[1], 1e6])

    def jac(x, A, B, m):  # (points, 3): d/dA, d/dB, d/dC_mid of R, with u = (C_mid / C)^B
        u = (m / x) ** B
        return np.stack([1 / (1 + u), -(A - r0) * u * np.log(m / x) / (1 + u) ** 2,
                         -(A - r0) * B * u / (m * (1 + u) ** 2)], axis=-1)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p, cov = scipy.optimize.curve_fit(lambda x, A, B, m: sigmoid(x, A, B, m, r0), c / scale, y, p0=p0,
                                              bounds=bounds, jac=jac, maxfev=5000)
    except (RuntimeError, ValueError):
        return Fit(np.nan, np.nan, np.nan, r0, ok=False)
    se = np.sqrt(np.diag(cov)) if np.all(np.isfinite(cov)) else np.full(3, np.nan)
    return Fit(float(p[0]), float(p[1]), float(p[2] * scale), r0, (float(se[0]), float(se[1]), float(se[2] * scale)))


@dataclass(frozen=True)
class ScalingResult:
    fit: Fit
    lo: dict          # "A", "B", "c_mid" -> lower bound of the percentile CI over seeds
    hi: dict
    n: int            # seeds
    reps: int         # bootstrap refits that converged


def bootstrap_fit(curves: list, r0: float, reps: int = REPS, ci: float = 0.95, seed: int = 0,
                  a_bounds=(0.0, 1.0), method: str = "t") -> ScalingResult:
    """curves: one (c, y) pair of arrays per seed. Point fit on all seeds' points; CIs by resampling
    seeds with replacement and refitting (started from the point fit), by `method` ("t" or
    "percentile", see the module docstring)."""
    if method not in ("t", "percentile"):
        raise ValueError(f"method must be t or percentile; got {method!r}")
    c_all = np.concatenate([np.asarray(c, float) for c, _ in curves]) if curves else np.array([])
    y_all = np.concatenate([np.asarray(y, float) for _, y in curves]) if curves else np.array([])
    point = fit(c_all, y_all, r0, a_bounds)
    names = ("A", "B", "c_mid")
    nan = {k: np.nan for k in names}
    if not point.ok or len(curves) < 2:
        return ScalingResult(point, nan, dict(nan), len(curves), 0)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(reps):
        idx = rng.integers(0, len(curves), len(curves))
        f = fit(np.concatenate([curves[i][0] for i in idx]), np.concatenate([curves[i][1] for i in idx]), r0,
                a_bounds, p0=(point.A, point.B, point.c_mid))
        if f.ok:
            draws.append((f.A, f.B, f.c_mid))
    if not draws:
        return ScalingResult(point, nan, dict(nan), len(curves), 0)
    d = np.array(draws)                                              # (refits, 3)
    n = len(curves)
    if method == "t":
        est = np.array([point.A, point.B, point.c_mid])
        half = scipy.stats.t.ppf(0.5 + ci / 2, n - 1) * d.std(axis=0, ddof=1) * np.sqrt(n / (n - 1))
        lo, hi = est - half, est + half
    else:
        a = (1 - ci) / 2 * 100
        lo, hi = np.percentile(d, a, axis=0), np.percentile(d, 100 - a, axis=0)
    return ScalingResult(point, dict(zip(names, lo.tolist())), dict(zip(names, hi.tolist())), len(curves), len(d))


def extrapolation(curves: list, r0: float, frac: float = 0.5, a_bounds=(0.0, 1.0)) -> dict:
    """Fit on the points with C <= frac * max C, predict the held-out rest: RMSE over the held-out
    points, and predicted vs measured at the largest C (measured = mean over seeds there)."""
    c = np.concatenate([np.asarray(c, float) for c, _ in curves])
    y = np.concatenate([np.asarray(y, float) for _, y in curves])
    cut = frac * np.nanmax(c)
    early = fit(c[c <= cut], y[c <= cut], r0, a_bounds)
    late = c > cut
    if not early.ok or not late.any():
        return {"cut": cut, "rmse": np.nan, "c_last": np.nan, "predicted": np.nan, "measured": np.nan, "fit": early}
    last = np.nanmax(c)
    near = np.isclose(c, last, rtol=0.02)
    return {"cut": float(cut), "rmse": float(np.sqrt(np.mean((early(c[late]) - y[late]) ** 2))), "c_last": float(last),
            "predicted": float(early(last)), "measured": float(np.mean(y[near])), "fit": early}


def arm_curves(study, metric: str, x: str, run_arm) -> dict:
    """{arm: (r0, [(c, y) per run])}: each used run's evaluations of `metric` against the compute axis `x`
    (ablate.analysis.plots.X_AXES; step 0 excluded, it is R0: the mean of the arm's step-0 values)."""
    from ablate.analysis.plots import _xmap

    ev = study.evals[["run_id", "step", metric]].dropna()
    ev = ev[ev["run_id"].isin(run_arm.index)]
    if x == "steps":
        ev = ev.assign(_x=ev["step"].astype(float))
    else:
        ev = ev.merge(_xmap(study, x), on=["run_id", "step"], how="left")
    out = {}
    for arm in dict.fromkeys(run_arm):
        runs = run_arm.index[run_arm == arm]
        sub = ev[ev["run_id"].isin(runs)]
        r0 = sub.loc[sub["step"] == 0, metric].mean()
        later = sub[(sub["step"] > 0) & sub["_x"].notna()].sort_values("step")
        curves = [(g["_x"].to_numpy(float), g[metric].to_numpy(float)) for _, g in later.groupby("run_id", observed=True)
                  if len(g)]
        if curves and np.isfinite(r0):
            out[arm] = (float(r0), curves)
    return out


def scaling_table(study, metric: str, x: str, run_arm, a_bounds=(0.0, 1.0), reps: int = REPS, seed: int = 0,
                  frac: float = 0.5) -> tuple:
    """(one row per arm: R0, A, B, C_mid with CIs, compute to 90% of the gain, seeds, the extrapolation
    check; {arm: (ScalingResult, extrapolation dict, curves)} for the figure)."""
    rows, fits = [], {}
    for arm, (r0, curves) in arm_curves(study, metric, x, run_arm).items():
        res = bootstrap_fit(curves, r0, reps, seed=seed, a_bounds=a_bounds)
        ex = extrapolation(curves, r0, frac, a_bounds)
        f = res.fit
        rows.append({"arm": arm, "r0": r0, "A": f.A, "A_lo": res.lo["A"], "A_hi": res.hi["A"], "B": f.B,
                     "B_lo": res.lo["B"], "B_hi": res.hi["B"], "c_mid": f.c_mid, "c_mid_lo": res.lo["c_mid"],
                     "c_mid_hi": res.hi["c_mid"], "c90": compute_for(0.9, f.B, f.c_mid) if f.ok else np.nan,
                     "n": res.n, "ok": f.ok, "extrap_cut": ex["cut"], "extrap_rmse": ex["rmse"],
                     "extrap_predicted": ex["predicted"], "extrap_measured": ex["measured"]})
        fits[arm] = (res, ex, curves)
    return pd.DataFrame(rows), fits
