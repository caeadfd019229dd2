"""Sequential seeds: add seeds in fixed rounds until every arm's CI is narrower than a target width.

Rule (fixed rounds, alpha spent equally over the planned looks): from n0 seeds, rounds add `step`
seeds up to `max_seeds`, so there are R = 1 + ceil((max_seeds - n0) / step) planned looks. At each
look every arm's mean gets a Student t interval at level 1 - alpha / R (Bonferroni over the looks);
the study stops when every such interval is narrower than `width`, or at `max_seeds`.

Optional stopping: the decision looks at the data, so the seeds are no longer fixed in advance. The
rule stops on the width of an interval, which depends on the seed spread and not on which arm is
ahead, so it cannot chase a significant difference; still, a sample that happened to look tight stops
early, and the spread it reports is then a little optimistic. Splitting alpha over the planned looks
keeps every look's interval honest at its level whatever the stopping time; the final report's
ordinary 95% intervals are fine as estimates, but report how the seed count was chosen.
"""

from __future__ import annotations

import math

import numpy as np

from ablate.analysis import stats


def looks(n0: int, max_seeds: int, step: int) -> int:
    """Planned looks R of the fixed-rounds design."""
    return 1 + max(0, math.ceil((max_seeds - n0) / step))


def arm_widths(values: dict, level: float) -> dict:
    """arm -> width of the Student t interval of its mean at `level` (NaN below two seeds)."""
    out = {}
    for arm, v in values.items():
        iv = stats.mean_ci(np.asarray(v, dtype=float), "t", ci=level)
        out[arm] = float(iv.hi - iv.lo) if np.isfinite(iv.lo) else np.nan
    return out


def next_round(values: dict, n0: int, width: float, max_seeds: int, step: int, alpha: float = 0.05) -> dict:
    """The decision at this look. values: arm -> its seeds' scores (metric units). Returns the level
    used, each arm's width, the arms still too wide and the seed count to run next (= the current
    count when the study stops)."""
    n = min(len(v) for v in values.values())
    level = 1 - alpha / looks(n0, max_seeds, step)
    w = arm_widths(values, level)
    wide = [a for a, x in w.items() if not x <= width]
    target = min(max_seeds, n + step) if wide and n < max_seeds else n
    return {"level": level, "widths": w, "wide": wide, "seeds": n, "next_seeds": target,
            "stop": target == n, "why": "every interval is narrower than the target" if not wide else
            ("max seeds reached" if n >= max_seeds else f"{len(wide)} arm(s) wider than {width:g}")}
