"""Optuna search throughput on the toy testbed: trials per hour with 1 and with 2 local workers.

    python benchmarks/tune_throughput.py [--trials 24] [--steps 200] [--storage sqlite|postgres] [--as-spec]

Runs sweeps/tune_toy.yaml's search space with `ablate tune` semantics (cli_tune.launch, local
executor, a fresh study per measurement) and prints wall time, trials/hour and the 2-worker /
1-worker ratio, worker start-up included. By default the search is a 24-point grid over the spec's
keys (lr x baseline x group size) with no pruner, so that 1 and 2 workers train the very same
trials; `--as-spec` keeps the spec's TPE + median pruner (then which trials are sampled and pruned,
hence the work, differs between the two). Compare figures from one run only: the
toy is CPU-bound, so anything else on the box changes both. Everything goes to a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import yaml  # noqa: E402


def measure(tmp: Path, workers: int, trials: int, steps: int, storage: str | None, as_spec: bool) -> tuple[float, dict]:
    from ablate.cli.tune import launch, summary
    from ablate.experiments.search import load_search

    spec = yaml.safe_load((ROOT / "sweeps" / "tune_toy.yaml").read_text())
    spec.update(name=f"bench_{workers}w_{uuid.uuid4().hex[:6]}", trials=trials)
    if not as_spec:
        spec.update(sampler={"name": "grid", "seed": 0}, pruner={"name": "none"},
                    search={"optim.lr": [0.3, 1.0, 3.0], "recipe.group_size": [8, 16],
                            "recipe.baseline": ["group_mean", "leave_one_out", "batch_mean", "none"]})
    spec["base"]["config"] = str(ROOT / "configs" / "toy.yaml")
    spec["base"]["overrides"].update({"steps": steps, "eval.every": max(1, steps // 4)})
    path = tmp / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    s = load_search(path, out=tmp / spec["name"], storage=storage)
    t0 = time.perf_counter()
    launch(s, "local", workers=workers)
    return time.perf_counter() - t0, summary(s)["counts"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=24, help="at most 24 without --as-spec (the grid)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--as-spec", action="store_true")
    ap.add_argument("--storage", choices=["sqlite", "postgres"], default="sqlite")
    args = ap.parse_args()
    storage = None
    if args.storage == "postgres":
        storage = subprocess.run([str(ROOT / "scripts" / "postgres-dev"), "url"], capture_output=True,
                                 text=True, check=True).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="ablate-tune-bench-"))
    rates = {}
    try:
        for workers in (1, 2):
            secs, counts = measure(tmp, workers, args.trials, args.steps, storage, args.as_spec)
            n = sum(counts.values())
            rates[workers] = 3600 * n / secs
            print(f"{workers} worker(s): {n} trials ({counts}) in {secs:.1f} s -> {rates[workers]:.0f} trials/hour")
        print(f"2 workers / 1 worker: {rates[2] / rates[1]:.2f}x ({os.cpu_count()} cores; storage {args.storage})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
