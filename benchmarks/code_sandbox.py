"""Code-task scoring throughput: sandboxed completions per second against the number of worker slots.

    python benchmarks/code_sandbox.py [--n 64] [--workers 1 2 4 8]

Each completion is the reference solution of a shipped procedural problem (4 tests, all passing), scored
through `CodeTask.score_many` (one bubblewrap sandbox per completion: harness + child process). Half of a
second set are `os._exit(0)` completions (killed early) to show that failures cost no more than passes.
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


def rate(workers: int, n: int, bad: bool) -> float:
    times = []
    for _ in range(3):
        task = make_task(parse({"task": {"name": "code", "num_train": n, "code_workers": workers}}).task)
        probs = task.problems("train")[:n]
        texts = [("import os\nos._exit(0)\n" if bad and i % 2 else p.answer) for i, p in enumerate(probs)]
        t0 = time.perf_counter()
        scores = task.score_many(probs, texts)
        times.append(time.perf_counter() - t0)
        assert sum(scores) == (len(probs) + 1) // 2 if bad else len(probs)
    return len(probs) / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    args = ap.parse_args()
    print("workers  passing completions/s  half os._exit completions/s")
    for w in args.workers:
        print(f"{w:7d}  {rate(w, args.n, False):21.1f}  {rate(w, args.n, True):27.1f}")


if __name__ == "__main__":
    main()
