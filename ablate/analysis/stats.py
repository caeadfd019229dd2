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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REPS = 2000
CI = 0.95


@dataclass(frozen=True)
class Interval:
    estimate: float
    lo: float
    hi: float
    n: int = 0                     # seeds (rows) behind the estimate
    paired: bool | None = None     # for differences: paired by seed or not

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


AGGREGATES = {"mean": mean, "iqm": iqm}


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


def paired_difference(x, y, aggregate="mean", reps: int = REPS, ci: float = CI, seed: int = 0) -> Interval:
    """Aggregate of x - y where row i of x and of y share a seed; the seeds are resampled."""
    x, y = _matrix(x), _matrix(y)
    if x.shape != y.shape:
        raise ValueError(f"paired scores need equal shapes, got {x.shape} and {y.shape}")
    iv = bootstrap_ci(x - y, aggregate, reps, ci, seed)
    return Interval(iv.estimate, iv.lo, iv.hi, iv.n, paired=True)


def unpaired_difference(x, y, aggregate="mean", reps: int = REPS, ci: float = CI, seed: int = 0) -> Interval:
    """Aggregate(x) - aggregate(y) for independent samples (different seeds); both resampled."""
    f = AGGREGATES.get(aggregate, aggregate) if isinstance(aggregate, str) else aggregate
    x, y = _matrix(x), _matrix(y)
    point = float(f(x) - f(y))
    if len(x) < 2 or len(y) < 2:
        return Interval(point, np.nan, np.nan, min(len(x), len(y)), paired=False)
    boot = f(stratified_resample(x, reps, seed)) - f(stratified_resample(y, reps, seed + 1))
    return Interval(point, *percentile_ci(boot, ci), min(len(x), len(y)), paired=False)


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
