"""Code-task scoring throughput: sandboxed completions per second against the number of worker slots.

    python benchmarks/code_sandbox.py [--n 64] [--workers 1 2 4 8]

Each completion is the reference solution of a shipped procedural problem (4 tests, all passing), scored
through `CodeTask.score_many` (one bubblewrap sandbox per completion: harness + child process). Half of a
second set are `os._exit(0)` completions (killed early) to show that failures cost no more than passes.
The passing set is also scored without the seccomp filter (`Limits(seccomp=False)`), the repetitions
interleaved with the filtered ones in rotating order, so that the ratio compares the same machine load.
The cache is bypassed (a fresh task per measurement). Medians of 3 repetitions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ablate.config import parse  # noqa: E402
from ablate.tasks import make_task  # noqa: E402
from ablate.tasks.sandbox import Limits  # noqa: E402


def seconds(workers: int, n: int, bad: bool, seccomp: bool) -> tuple[int, float]:
    """(completions, seconds) of one scoring pass."""
    task = make_task(parse({"task": {"name": "code", "num_train": n, "code_workers": workers}}).task)
    task.limits = Limits(seccomp=seccomp)
    probs = task.problems("train")[:n]
    texts = [("import os\nos._exit(0)\n" if bad and i % 2 else p.answer) for i, p in enumerate(probs)]
    t0 = time.perf_counter()
    scores = task.score_many(probs, texts)
    elapsed = time.perf_counter() - t0
    assert sum(scores) == ((len(probs) + 1) // 2 if bad else len(probs))
    return len(probs), elapsed


def rates(workers: int, n: int) -> dict[str, float]:
    """Completions/s (median of 3) of each setting, the repetitions interleaved in rotating order."""
    settings = {"passing": (False, True), "no_seccomp": (False, False), "half_exit": (True, True)}
    times: dict[str, list[float]] = {k: [] for k in settings}
    count = 0
    for rep in range(3):
        for k in list(settings)[rep:] + list(settings)[:rep]:  # each setting goes first once
            count, t = seconds(workers, n, *settings[k])
            times[k].append(t)
    return {k: count / statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    args = ap.parse_args()
    print("workers  passing completions/s  without seccomp  filtered/unfiltered  half os._exit completions/s")
    for w in args.workers:
        r = rates(w, args.n)
        print(f"{w:7d}  {r['passing']:21.1f}  {r['no_seccomp']:15.1f}  {r['passing'] / r['no_seccomp']:19.2f}"
              f"  {r['half_exit']:27.1f}")


if __name__ == "__main__":
    main()
