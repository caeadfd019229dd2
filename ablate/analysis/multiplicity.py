"""Adjustment for multiple comparisons across the contrasts of one report.

- Holm (1979), "A simple sequentially rejective multiple test procedure", Scand. J. Statist. 6:65-70:
  sort p_(1) <= ... <= p_(m); p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)). Controls the
  family-wise error rate under any dependence. The default, for a few planned contrasts.
- Benjamini & Hochberg (1995), "Controlling the false discovery rate", JRSS-B 57:289-300:
  p~_(i) = min_{j >= i} min(1, (m / j) p_(j)). Controls the false discovery rate under independence
  or positive dependence; for screens (every main effect and interaction of a factorial sweep).

Adjusted values come back in the input order; NaN p-values (a contrast with no interval) are left
out of the family and stay NaN. Each method is a pure function of the same signature (`ADJUST`).

Adjusted intervals (`adjusted_level`): Holm's step-down has no exact interval counterpart, so the
report shows the simultaneous (Bonferroni) interval at level 1 - alpha/m, which is what Holm's first
step tests; for BH, the false-coverage-rate interval of Benjamini & Yekutieli (2005, "False discovery
rate-adjusted multiple confidence intervals", JASA 100:71-81) at level 1 - R alpha/m, R = number of
contrasts BH rejects (at least 1).
"""

from __future__ import annotations

import numpy as np


def none(p: np.ndarray) -> np.ndarray:
    return np.asarray(p, dtype=float).copy()


def _ascending(p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p as floats, an all-NaN result to fill, the indices of the finite p-values in ascending order): a NaN
    p-value (a contrast that could not be tested) stays NaN and is not counted in m."""
    p = np.asarray(p, dtype=float)
    ok = np.flatnonzero(np.isfinite(p))
    return p, np.full(p.shape, np.nan), ok[np.argsort(p[ok], kind="stable")]


def holm(p: np.ndarray) -> np.ndarray:
    p, out, order = _ascending(p)
    m = len(order)
    if m:
        steps = np.minimum(1.0, (m - np.arange(m)) * p[order])          # (m - j + 1) p_(j), j = 1..m
        out[order] = np.maximum.accumulate(steps)
    return out


def bh(p: np.ndarray) -> np.ndarray:
    p, out, order = _ascending(p)
    m = len(order)
    if m:
        steps = np.minimum(1.0, m / np.arange(1, m + 1) * p[order])     # (m / j) p_(j)
        out[order] = np.minimum.accumulate(steps[::-1])[::-1]
    return out


ADJUST = {"none": none, "holm": holm, "bh": bh}


def adjust(p, method: str = "holm") -> np.ndarray:
    if method not in ADJUST:
        raise ValueError(f"adjustment must be one of {', '.join(ADJUST)}; got {method!r}")
    return ADJUST[method](p)


def adjusted_level(p, method: str = "holm", alpha: float = 0.05) -> float:
    """Confidence level of the adjusted intervals of a family with p-values `p` (see the module docstring)."""
    p = np.asarray(p, dtype=float)
    m = int(np.isfinite(p).sum())
    if method == "none" or m <= 1:
        return 1 - alpha
    if method == "holm":
        return 1 - alpha / m
    rejected = max(1, int((adjust(p, "bh") <= alpha).sum()))
    return 1 - rejected * alpha / m
