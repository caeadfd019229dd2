"""Power of the t test behind a contrast: the minimum detectable effect at the seeds a study has and
the seeds needed to detect a given effect (Colas, Sigaud & Oudeyer 2018, "How many random seeds?
Statistical power analysis in deep RL experiments", arXiv 1806.08295).

A contrast is sum_i w_i mean_i over cells with sd sigma_i and n_i seeds. A paired contrast is one cell:
the per-seed contrast values (sd sigma_D, n seeds, weight 1). Then

    SE = sqrt(sum_i w_i^2 sigma_i^2 / n_i)
    nu = SE^4 / sum_i (w_i^2 sigma_i^2 / n_i)^2 / (n_i - 1)      (Welch-Satterthwaite; n - 1 for one cell)
    T ~ noncentral t(nu, lambda = delta / SE)
    power(delta) = 1 - F_nct(t_c; nu, lambda) + F_nct(-t_c; nu, lambda),   t_c = t_{1 - alpha/2, nu}

MDE = the delta with power 0.8 (alpha 0.05, two-sided). Seeds needed: the smallest n, the same in
every cell, with power >= 0.8 (the continuous solution is also returned). With n_1 = n_2 and equal sds
this is the pooled two-sample t (statsmodels TTestIndPower); one cell is statsmodels TTestPower.
The sds come from the study itself (a pilot): an sd from 3-5 seeds is itself noisy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.optimize
import scipy.stats

ALPHA = 0.05
POWER = 0.8


@dataclass(frozen=True)
class TDesign:
    weights: tuple      # w_i per cell
    sds: tuple          # sigma_i per cell (ddof 1)
    ns: tuple           # seeds per cell

    def _parts(self, n=None) -> np.ndarray:
        ns = np.asarray(self.ns, float) if n is None else np.full(len(self.ns), float(n))
        return np.asarray(self.weights, float) ** 2 * np.asarray(self.sds, float) ** 2 / ns, ns

    def se(self, n=None) -> float:
        return float(np.sqrt(self._parts(n)[0].sum()))

    def df(self, n=None) -> float:
        v, ns = self._parts(n)
        used = v > 0
        if not used.any():
            return float(ns.min() - 1)
        return float(v.sum() ** 2 / (v[used] ** 2 / (ns[used] - 1)).sum())

    def p_value(self, estimate: float) -> float:
        """Two-sided p-value of H0: contrast = 0."""
        se = self.se()
        if not np.isfinite(estimate) or min(self.ns) < 2:
            return np.nan
        if se == 0:
            return 0.0 if estimate != 0 else 1.0
        return float(2 * scipy.stats.t.sf(abs(estimate) / se, self.df()))

    def power(self, delta: float, alpha: float = ALPHA, n=None) -> float:
        return power(delta, self.se(n), self.df(n), alpha)

    def mde(self, alpha: float = ALPHA, target: float = POWER) -> float:
        """Smallest |delta| detected with probability `target` at the seeds the contrast has."""
        if min(self.ns) < 2 or not np.isfinite(self.se()):
            return np.nan
        if self.se() == 0:
            return 0.0
        return mde(self.se(), self.df(), alpha, target)

    def seeds_for(self, delta: float, alpha: float = ALPHA, target: float = POWER,
                  max_n: int = 100_000) -> tuple[int, float]:
        """(seeds per cell, continuous solution) to detect |delta| with probability `target`."""
        if min(self.ns) < 2 or not np.isfinite(self.se()) or delta == 0:
            return (0, np.nan)
        if self.se() == 0:
            return (2, 2.0)

        def gap(n):
            return self.power(abs(delta), alpha, n) - target

        if gap(max_n) < 0:
            return (max_n, np.inf)
        if gap(2) >= 0:
            return (2, 2.0)
        n = float(scipy.optimize.brentq(gap, 2, max_n, xtol=1e-10))
        k = max(2, math.ceil(n - 1e-9))
        while self.power(abs(delta), alpha, k) < target:  # power is monotone in n; guards the rounding
            k += 1
        return (k, n)


def power(delta: float, se: float, df: float, alpha: float = ALPHA) -> float:
    """Two-sided t test power at true effect delta (noncentral t, scipy.stats.nct)."""
    tc = scipy.stats.t.ppf(1 - alpha / 2, df)
    lam = delta / se
    # 1 - F(t_c; nu, lam) + F(-t_c; nu, lam), with F(-x; nu, lam) = 1 - F(x; nu, -lam): scipy's nct.cdf
    # returns NaN far in the lower tail (e.g. cdf(-2.78, 4, 10)), its sf does not
    return float(scipy.stats.nct.sf(tc, df, lam) + scipy.stats.nct.sf(tc, df, -lam))


def mde(se: float, df: float, alpha: float = ALPHA, target: float = POWER) -> float:
    """delta with power(delta) = target."""
    hi = se * 10
    while power(hi, se, df, alpha) < target:
        hi *= 2
    return float(scipy.optimize.brentq(lambda d: power(d, se, df, alpha) - target, 0.0, hi, xtol=1e-12))
