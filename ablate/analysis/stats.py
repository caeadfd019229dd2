"""Statistics across seeds, following the conventions of rliable (Agarwal et al., NeurIPS 2021,
"Deep RL at the Edge of the Statistical Precipice"); the code is our own, numpy only.

Scores are matrices of shape (runs, tasks): one row per seed, one column per task (stratum). A 1-D
array is one task. Conventions:
- IQM: the mean of the middle 50% of all run x task scores (scipy.stats.trim_mean(x, 0.25, axis=None):
  int(0.25 * n) scores cut from each end).
- Stratified bootstrap: each replicate resamples, with replacement and independently per task, as many
  runs as the task has; CIs are percentile intervals (default 95%, 2,000 replicates, seeded).
- Probability of improvement P(X > Y): per task, the Mann-Whitney U statistic over all run pairs (ties
  count 1/2) divided by n*m, then averaged over tasks; CI by resampling X and Y independently.
- Paired difference: when two arms share seeds (same seed = same prompts), the per-seed differences are
  resampled (one index drawn per seed, for both arms), which removes the prompt-order noise both share.

Multi-task studies (several columns): `performance_profile` (share of runs above each threshold,
averaged over tasks) and the `optimality_gap` aggregate (gamma - mean(min(x, gamma))), as rliable.

Interval methods for means, differences and contrasts (`METHODS`; IQM and P(improvement) always use the
percentile bootstrap):
- "t" (default): Student t on the per-run values (tasks averaged), Welch-Satterthwaite degrees of freedom
  for independent arms. rliable's percentile bootstrap is built for many runs x tasks; on one task with
  3-10 seeds it is too narrow, because it resamples as if the few seeds were the population (at 5 normal
  seeds its "95%" interval covers the truth ~84% of the time, t covers 94-95%: benchmarks/ci_coverage.py).
- "percentile": rliable's stratified percentile bootstrap.
- "bca": bias-corrected and accelerated bootstrap (scipy.stats.bootstrap), for skewed scores with
  many seeds; it shares the percentile bootstrap's small-sample narrowness.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.stats

REPS = 2000
CI = 0.95
METHODS = ("t", "percentile", "bca")
MIN_BOOT_SEEDS = 5   # the report shows no bootstrap interval below this many seeds (it comes out too narrow)


@dataclass(frozen=True)
class Interval:
    estimate: float
    lo: float
    hi: float
    n: int = 0                     # seeds (rows) behind the estimate
    paired: bool | None = None     # for differences: paired by seed or not
    design: object = None          # ablate.analysis.power.TDesign of a contrast's t test (p-value, power)

    @property
    def excludes(self) -> bool:
        """True if the CI excludes 0 (for differences) -- 'significant' at the CI's level."""
        return bool(np.isfinite(self.lo) and (self.lo > 0 or self.hi < 0))

    def excludes_value(self, v: float) -> bool:
        return bool(np.isfinite(self.lo) and (self.lo > v or self.hi < v))


def _matrix(x) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise ValueError(f"scores must be (runs,) or (runs, tasks); got shape {x.shape}")
    return x


# --- aggregates: take (..., runs, tasks), reduce the last two axes --------------------------------------

def mean(x) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return x.mean(axis=(-2, -1)) if x.ndim >= 2 else x.mean()


def trimmed_mean(x, cut: float) -> np.ndarray:
    """Mean after cutting int(cut * n) values from each end of the flattened last two axes."""
    x = np.asarray(x, dtype=float)
    flat = x.reshape(*x.shape[:-2], -1) if x.ndim >= 2 else x
    n = flat.shape[-1]
    k = int(cut * n)
    s = np.sort(flat, axis=-1)
    return s[..., k:n - k].mean(axis=-1)


def iqm(x) -> np.ndarray:
    """Interquartile mean of all scores (rliable's aggregate_iqm)."""
    return trimmed_mean(x, 0.25)


def optimality_gap(x, gamma: float = 1.0) -> np.ndarray:
    """rliable's optimality gap: how far scores fall short of a target gamma, gamma - mean(min(x, gamma))
    (scores above the target earn nothing more; lower is better). Default target 1: a rate at 100%."""
    x = np.asarray(x, dtype=float)
    m = np.minimum(x, gamma)
    return gamma - (m.mean(axis=(-2, -1)) if x.ndim >= 2 else m.mean())


AGGREGATES = {"mean": mean, "iqm": iqm, "optimality_gap": optimality_gap}


def performance_profile(scores, taus, reps: int = REPS, ci: float = CI, seed: int = 0):
    """rliable's score distribution: for each threshold tau, the share of runs scoring above tau,
    averaged over tasks (scores (runs, tasks)); with stratified-bootstrap percentile bands.
    Returns (profile (taus,), lo (taus,), hi (taus,))."""
    x = _matrix(scores)
    taus = np.asarray(taus, dtype=float)

    def prof(a):  # a: (..., runs, tasks) -> (..., taus)
        return (a[..., None] > taus).mean(axis=-3).mean(axis=-2)

    point = prof(x)
    if len(x) < 2:
        return point, np.full_like(point, np.nan), np.full_like(point, np.nan)
    boot = prof(stratified_resample(x, reps, seed))
    a = (1 - ci) / 2 * 100
    lo, hi = np.percentile(boot, [a, 100 - a], axis=0)
    return point, lo, hi


# --- bootstrap ---------------------------------------------------------------------------------------

def stratified_resample(scores, reps: int = REPS, seed: int = 0) -> np.ndarray:
    """(reps, runs, tasks): each replicate resamples runs with replacement within each task."""
    x = _matrix(scores)
    n, t = x.shape
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(reps, n, t))
    return x[idx, np.arange(t)]


def percentile_ci(samples: np.ndarray, ci: float = CI) -> tuple[float, float]:
    a = (1 - ci) / 2 * 100
    lo, hi = np.percentile(samples, [a, 100 - a])
    return float(lo), float(hi)


def bootstrap_ci(scores, aggregate="mean", reps: int = REPS, ci: float = CI, seed: int = 0) -> Interval:
    """Point estimate and stratified-bootstrap percentile CI of an aggregate ('mean', 'iqm' or a
    function of a (..., runs, tasks) array)."""
    f = AGGREGATES.get(aggregate, aggregate) if isinstance(aggregate, str) else aggregate
    x = _matrix(scores)
    if len(x) == 0:
        return Interval(np.nan, np.nan, np.nan, 0)
    point = float(f(x))
    if len(x) < 2:
        return Interval(point, np.nan, np.nan, len(x))
    return Interval(point, *percentile_ci(f(stratified_resample(x, reps, seed)), ci), len(x))


def probability_of_improvement(x, y) -> float:
    """P(X > Y) + P(X = Y)/2 over all run pairs, per task, averaged over tasks."""
    x, y = _matrix(x), _matrix(y)
    gt = (x[:, None, :] > y[None, :, :]).mean(axis=(0, 1))
    eq = (x[:, None, :] == y[None, :, :]).mean(axis=(0, 1))
    return float((gt + 0.5 * eq).mean())


def _poi_batched(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    gt = (xs[:, :, None, :] > ys[:, None, :, :]).mean(axis=(1, 2))
    eq = (xs[:, :, None, :] == ys[:, None, :, :]).mean(axis=(1, 2))
    return (gt + 0.5 * eq).mean(axis=-1)


def poi_ci(x, y, reps: int = REPS, ci: float = CI, seed: int = 0) -> Interval:
    """Probability of improvement of X over Y with a CI (X and Y resampled independently)."""
    x, y = _matrix(x), _matrix(y)
    point = probability_of_improvement(x, y)
    if len(x) < 2 or len(y) < 2:
        return Interval(point, np.nan, np.nan, min(len(x), len(y)))
    boot = _poi_batched(stratified_resample(x, reps, seed), stratified_resample(y, reps, seed + 1))
    return Interval(point, *percentile_ci(boot, ci), min(len(x), len(y)))


def contrast_ci(samples, weights, method: str = "t", reps: int = REPS, ci: float = CI, seed: int = 0) -> Interval:
    """sum_i w_i * mean(samples_i) for independent samples (different seeds; each (runs,) or (runs, tasks))
    with a CI by `method` (see the module docstring). One sample with weight 1 is its mean."""
    if method not in METHODS:
        raise ValueError(f"CI method must be one of {', '.join(METHODS)}; got {method!r}")
    xs, w = [_matrix(x) for x in samples], np.asarray(weights, dtype=float)
    n = min(len(x) for x in xs)
    if n == 0:
        return Interval(np.nan, np.nan, np.nan, 0)
    point = float(sum(wi * x.mean() for wi, x in zip(w, xs)))
    if n < 2:
        return Interval(point, np.nan, np.nan, n)
    rows = [x.mean(axis=1) for x in xs]                    # per-run scores (tasks averaged)
    if all(np.ptp(r) == 0 for r in rows):                  # no spread at all: nothing to be unsure about
        return Interval(point, point, point, n)
    if method == "percentile":
        boot = sum(wi * mean(stratified_resample(x, reps, seed + i)) for i, (wi, x) in enumerate(zip(w, xs)))
        return Interval(point, *percentile_ci(boot, ci), n)
    if method == "t":
        v = np.array([wi ** 2 * r.var(ddof=1) / len(r) for wi, r in zip(w, rows)])
        df = v.sum() ** 2 / sum(vi ** 2 / (len(r) - 1) for vi, r in zip(v, rows) if vi > 0)
        half = scipy.stats.t.ppf(0.5 + ci / 2, df) * np.sqrt(v.sum())
        return Interval(point, float(point - half), float(point + half), n)
    with warnings.catch_warnings():  # bca
        warnings.simplefilter("ignore", scipy.stats.DegenerateDataWarning)
        res = scipy.stats.bootstrap(rows, lambda *s, axis=-1: sum(wi * np.mean(si, axis=axis) for wi, si in zip(w, s)),
                                    n_resamples=reps, confidence_level=ci, method="BCa", rng=seed)
    return Interval(point, float(res.confidence_interval.low), float(res.confidence_interval.high), n)


def mean_ci(x, method: str = "t", reps: int = REPS, ci: float = CI, seed: int = 0) -> Interval:
    """Mean over runs with a CI by `method`."""
    return contrast_ci([x], [1.0], method, reps, ci, seed)


def paired_difference(x, y, method: str = "t", reps: int = REPS, ci: float = CI, seed: int = 0) -> Interval:
    """Mean of x - y where row i of x and of y share a seed: the per-seed differences are the sample."""
    x, y = _matrix(x), _matrix(y)
    if x.shape != y.shape:
        raise ValueError(f"paired scores need equal shapes, got {x.shape} and {y.shape}")
    iv = mean_ci(x - y, method, reps, ci, seed)
    return Interval(iv.estimate, iv.lo, iv.hi, iv.n, paired=True)


def unpaired_difference(x, y, method: str = "t", reps: int = REPS, ci: float = CI, seed: int = 0) -> Interval:
    """mean(x) - mean(y) for independent samples (different seeds)."""
    iv = contrast_ci([x, y], [1.0, -1.0], method, reps, ci, seed)
    return Interval(iv.estimate, iv.lo, iv.hi, iv.n, paired=False)


def mean_band(y: np.ndarray, reps: int = 500, ci: float = CI, seed: int = 0):
    """Curves: y is (runs, points) with NaN where a run has no value; returns (mean, lo, hi) per point,
    bootstrapping runs (multinomial resampling weights; NaNs ignored per point)."""
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(y)
    cnt = ok.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.where(ok, y, 0).sum(0) / cnt
        n = len(y)
        if n < 2:
            return m, np.full_like(m, np.nan), np.full_like(m, np.nan)
        w = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=reps).astype(float)
        boot = (w @ np.where(ok, y, 0)) / (w @ ok)
        a = (1 - ci) / 2 * 100
        lo, hi = np.nanpercentile(boot, [a, 100 - a], axis=0)
    return m, lo, hi


def t_band(y: np.ndarray, ci: float = CI):
    """Curves: (mean, lo, hi) per point of y (runs, points), Student t over the runs with a value there
    (NaN where fewer than 2)."""
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(y)
    n = ok.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.where(ok, y, 0).sum(0) / n
        var = np.where(ok, (y - m) ** 2, 0).sum(0) / (n - 1)
        half = scipy.stats.t.ppf(0.5 + ci / 2, np.maximum(n - 1, 1)) * np.sqrt(var / n)
    half = np.where(n >= 2, half, np.nan)
    return m, m - half, m + half
