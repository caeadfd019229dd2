"""Does RL visibly learn on the quickstart? Trains configs/quickstart.yaml for several seeds and prints
held-out sampled pass@1 (temperature 1, strict verifier, problems never trained on) before and after.

    python benchmarks/quickstart_lift.py [--seeds 0 1 2] [--set steps=300 ...] [--out runs/lift]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from ablate.config import load  # noqa: E402
from ablate.runs.store import RunStore  # noqa: E402
from ablate.train.models import build_base_model  # noqa: E402
from ablate.train.trainer import train  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default="runs/lift")
    args = ap.parse_args()
    console = Console()
    build_base_model("models/tiny-arith")  # cached
    table = Table("seed", "steps", "pass@1 base", "pass@1 final", "lift (points)", "greedy base", "greedy final",
                  "train reward first→last 10", "minutes", title=f"{args.config} {' '.join(args.overrides)}")
    lifts = []
    for seed in args.seeds:
        cfg = load(args.config, [*args.overrides, f"seed={seed}"])
        out = f"{args.out}/s{seed}-{'-'.join(o.replace('=', '') for o in args.overrides) or 'default'}"
        t0 = time.time()
        train(cfg, out, progress=True)
        store = RunStore(out)
        evals, metrics = store.read("evals"), store.read("metrics")
        first, last = evals[0], evals[-1]
        lift = 100 * (last["eval/pass@1"] - first["eval/pass@1"])
        lifts.append(lift)
        r0 = statistics.mean(m["train/reward_mean"] for m in metrics[:10])
        r1 = statistics.mean(m["train/reward_mean"] for m in metrics[-10:])
        table.add_row(str(seed), str(last["step"]), f"{first['eval/pass@1']:.3f}", f"{last['eval/pass@1']:.3f}",
                      f"{lift:+.1f}", f"{first['eval/greedy_acc']:.3f}", f"{last['eval/greedy_acc']:.3f}",
                      f"{r0:.3f}→{r1:.3f}", f"{(time.time() - t0) / 60:.1f}")
    console.print(table)
    console.print(f"mean lift {statistics.mean(lifts):+.1f} points over {len(lifts)} seeds; "
                  f"every seed positive: {all(x > 0 for x in lifts)}")


if __name__ == "__main__":
    main()
