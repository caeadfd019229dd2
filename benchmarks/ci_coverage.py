"""Coverage of the report's 95% intervals for a mean over seeds, by method and number of seeds.

    python benchmarks/ci_coverage.py [--sims 1000]

Draws `sims` synthetic studies per cell (n seeds from a known distribution: normal, and a skewed
beta(2, 5) like per-seed pass rates), builds each method's interval (ablate.analysis.stats.mean_ci)
and prints how often it covers the true mean: 0.95 is right, lower means overconfident reports.
A paired difference between two arms is this same one-sample problem on per-seed differences.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ablate.analysis import stats

DISTS = {"normal(0.5, 0.05)": (lambda rng, n: rng.normal(0.5, 0.05, n), 0.5),
         "beta(2, 5)": (lambda rng, n: rng.beta(2, 5, n), 2 / 7)}


def coverage(draw, truth: float, n: int, method: str, sims: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for i in range(sims):
        iv = stats.mean_ci(draw(rng, n), method, reps=1000, seed=i)
        hits += iv.lo <= truth <= iv.hi
    return hits / sims


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[3, 5, 10, 20])
    args = ap.parse_args()
    t0 = time.time()
    print(f"coverage of nominal 95% intervals for the mean, {args.sims} simulated studies per cell")
    print(f"{'distribution':20s} {'seeds':>5s} " + " ".join(f"{m:>10s}" for m in stats.METHODS))
    for name, (draw, truth) in DISTS.items():
        for n in args.seeds:
            cells = [coverage(draw, truth, n, m, args.sims) for m in stats.METHODS]
            print(f"{name:20s} {n:5d} " + " ".join(f"{c:10.3f}" for c in cells))
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
