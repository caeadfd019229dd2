"""Training throughput of one run at 1 and 2 ranks on this machine, and the share of time in collectives.

    python benchmarks/scaling.py [--config configs/quickstart.yaml] [--steps 6] [--ranks 1 2] [--set KEY=VALUE]

Each size trains the same config from scratch the way `ablate train CONFIG --nproc N` does (`run_ranks`,
one process per rank, gloo on CPU; 1 rank: in this process), with every torch.distributed collective of each
rank timed (all_reduce, all_gather, all_gather_object, barrier, broadcast, and FSDP2's all-gathers and
reduce-scatters under `--set compute.parallel=fsdp`; an async all-reduce until its wait() returns). From rank 0's metrics.jsonl, after the first (warm-up) step:
  - train tokens/s: completion tokens x update_epochs / update seconds (perf/train_tokens_per_s);
  - step tokens/s: completion tokens / whole-step seconds (generation, scoring, update: what a run feels);
  - collectives: each rank's seconds inside collectives / its wall time in the loop, the mean over ranks.
    On a 2-core CPU box this is mostly waiting for the slower rank, not bytes on a wire.
Printed as ratios to the 1-rank figures, all measured in this one invocation (same machine, same load).
Threads: 1 per rank (the box has 2 cores; more would measure scheduler contention).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TIMED = ("all_reduce", "all_gather", "all_gather_object", "barrier", "broadcast", "broadcast_object_list",
         "all_gather_single", "reduce_scatter_single")  # the last two: FSDP2's (compute.parallel=fsdp)


class _TimedWork:
    """An async collective's handle whose wait() adds to the rank's collective time."""

    def __init__(self, work, clock: list[float]):
        self.work, self.clock = work, clock

    def wait(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.work.wait(*args, **kwargs)
        finally:
            self.clock[0] += time.perf_counter() - t0


def _time_collectives(clock: list[float]) -> None:
    """Wrap torch.distributed's collectives (the module attributes the trainer calls) with a timer."""
    import torch.distributed as dist

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                clock[0] += time.perf_counter() - t0
            return _TimedWork(out, clock) if kwargs.get("async_op") and out is not None else out
        return wrapper

    for name in TIMED:
        if hasattr(dist, name):
            setattr(dist, name, timed(getattr(dist, name)))


def _rank(cfg_dict: dict, out: str) -> None:
    """One rank: train the run with its collectives timed; write <out>/comm_<rank>.json."""
    import torch

    from ablate.config import parse
    from ablate.train.trainer import train

    torch.set_num_threads(1)
    clock = [0.0]
    _time_collectives(clock)
    t0 = time.perf_counter()
    train(parse(cfg_dict), out, progress=False)
    rank = int(os.environ.get("RANK", "0"))
    Path(out, f"comm_{rank}.json").write_text(json.dumps({"comm_s": clock[0], "wall_s": time.perf_counter() - t0}))


def run(cfg_dict: dict, nproc: int, out: Path) -> dict:
    from ablate.train.ranks import run_ranks

    if nproc == 1:  # no process group at world size 1: the same trainer, without spawning
        _rank(cfg_dict, str(out))
    else:
        run_ranks(nproc, _rank, cfg_dict, str(out))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    comm = [json.loads((out / f"comm_{r}.json").read_text()) for r in range(nproc)]
    step_tok_s = [(b["counters/tokens"] - a["counters/tokens"]) / b["perf/step_seconds"]
                  for a, b in zip(rows, rows[1:])]  # from step 2: step 1 is the warm-up
    return {"train_tok_s": statistics.median(r["perf/train_tokens_per_s"] for r in rows[1:]),
            "step_tok_s": statistics.median(step_tok_s),
            "comm_share": statistics.mean(c["comm_s"] / c["wall_s"] for c in comm)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs/quickstart.yaml"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    if not (REPO / "ablate/train/distributed.py").exists():
        sys.exit("benchmarks/scaling.py needs the trainer side of multi-rank runs (ablate/train/distributed.py)")
    from ablate.config import load, to_dict

    os.chdir(REPO)  # configs name models/ relative to the repository
    cfg = to_dict(load(args.config, [f"steps={args.steps}", "eval.every=0", "checkpoint_every=0",
                                     "tracking.wandb.mode=disabled", *args.sets]))
    with tempfile.TemporaryDirectory() as tmp:
        res = {n: run(cfg, n, Path(tmp) / f"ranks{n}") for n in args.ranks}
    base = res[args.ranks[0]]
    print(f"{Path(args.config).name}: {args.steps} steps, after a warm-up step; ratios to {args.ranks[0]} rank(s)")
    print(f"{'ranks':>5} {'train tok/s':>12} {'ratio':>6} {'step tok/s':>11} {'ratio':>6} {'in collectives':>15}")
    for n, r in res.items():
        print(f"{n:>5} {r['train_tok_s']:>12.0f} {r['train_tok_s'] / base['train_tok_s']:>6.2f} "
              f"{r['step_tok_s']:>11.0f} {r['step_tok_s'] / base['step_tok_s']:>6.2f} {r['comm_share']:>14.1%}")


if __name__ == "__main__":
    main()
