"""Rerun the RLVR chapter's toy table through the normal trainer and print published vs measured.

    python reproductions/rlvr_chapter_toy/run.py [--seeds 6] [--steps 250] [--out runs/rlvr_chapter_toy]

Each run is `ablate train configs/toy.yaml` with the overrides of `overrides()` (printed with --commands),
trained in this process through `ablate.train.trainer.train`; a finished run folder is reused. The protocol
and the published numbers are in this folder's README.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from ablate.config import load, run_id
from ablate.rl.losses import entropy_from_logits
from ablate.runs.store import RunStore
from ablate.tasks.toy import build_policy, build_task
from ablate.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "toy.yaml"
# the chapter's four estimators as (recipe.baseline, recipe.scale); GRPO uses the config's std_ddof 1, eps 1e-6
METHODS = {"REINFORCE": ("none", "none"), "batch mean": ("batch_mean", "none"),
           "RLOO": ("leave_one_out", "none"), "GRPO": ("group_mean", "group")}

# name -> (published value, how it is compared): "round" = measured rounded to the published digits
# equals the published value; "rounding" = a float64 rounding-level number (<= 1e-14), not a digit to match
PUBLISHED: dict[str, tuple[float, str]] = {
    "initial mean pass@1": (0.175, "round"),
    "share of prompts with pass@1 < 0.05": (0.50, "round"),
    "share of prompts with pass@1 > 0.5": (0.11, "round"),
    "P(group of 8 all-equal) at start": (0.52, "round"),
    **{f"final pass@1 {m}, {o}": (v, "round") for m, (raw, off) in {
        "REINFORCE": (0.910, 0.617), "batch mean": (0.797, 0.603), "RLOO": (0.843, 0.843),
        "GRPO": (0.851, 0.851)}.items() for o, v in (("raw", raw), ("offset", off))},
    "max |curve(offset) - curve(raw)| RLOO": (2.2e-16, "rounding"),
    "max |curve(offset) - curve(raw)| GRPO": (2.2e-16, "rounding"),
    "GRPO dead-group share, first 10 steps": (0.49, "round"),
    "GRPO dead-group share, last 10 steps": (0.79, "round"),
    "entropy check: actual change": (-0.002730, "round"),
    "entropy check: -eta Cov(log pi, A)": (-0.002733, "round"),
}


def overrides(method: str, offset: bool, seed: int, steps: int = 250) -> list[str]:
    baseline, scale = METHODS[method]
    return ["task.toy_instance=chapter", f"task.reward_offset={str(offset).lower()}",
            f"recipe.baseline={baseline}", f"recipe.scale={scale}", f"seed={seed}", f"steps={steps}",
            "optim.min_grad_norm=1e-8",  # the chapter's rule: step only if the gradient norm is > 1e-8
            "eval.every=1", "eval.n_samples=1", "eval.ks=[1]"]  # the exact pass@1 after every step


def train_runs(out: Path, methods, seeds, steps: int) -> dict[tuple[str, bool, int], RunStore]:
    """Train (or reuse) every run; returns its store by (method, offset, seed)."""
    torch.set_num_threads(1)
    stores = {}
    for method in methods:
        for offset in (False, True):
            for seed in seeds:
                cfg = load(CONFIG, overrides(method, offset, seed, steps))
                path = out / run_id(cfg)
                if train(cfg, str(path), progress=False) != "completed":
                    raise RuntimeError(f"run {path} did not complete")
                stores[method, offset, seed] = RunStore(path)
    return stores


def curve(store: RunStore) -> np.ndarray:  # [steps + 1] exact pass@1, step 0 = before training
    return np.array([r["eval/pass@1_exact"] for r in store.read("evals")])


def dead(store: RunStore) -> np.ndarray:  # [steps] dead-group share of each step (before the offset)
    return np.array([r["train/dead_group_frac"] for r in store.read("metrics")])


def initial_stats() -> dict[str, float]:
    """Statistics of the starting policy of the chapter's instance (no training involved)."""
    cfg = load(CONFIG, ["task.toy_instance=chapter"])
    task = build_task(cfg.task)
    p = np.array(build_policy(task).pass1_per_prompt(task.problems("heldout")))  # [64]
    return {"initial mean pass@1": p.mean(), "share of prompts with pass@1 < 0.05": (p < 0.05).mean(),
            "share of prompts with pass@1 > 0.5": (p > 0.5).mean(),
            "P(group of 8 all-equal) at start": (p ** 8 + (1 - p) ** 8).mean()}


def entropy_check(eta: float = 1e-3) -> dict[str, float]:
    """First-order entropy change of a softmax policy under a logit step eta*A: dH ~ -eta Cov_pi(log pi, A)
    (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    arXiv:2505.22617), on the chapter's 50-logit example."""
    rng = np.random.default_rng(3)
    z = torch.from_numpy(rng.normal(0, 2, 50))  # float64 logits
    pi = z.softmax(-1)
    logp = pi.log()
    A = 0.8 * logp + torch.from_numpy(rng.normal(0, 1, 50))
    A = A - pi @ A  # centred under pi
    actual = entropy_from_logits(z + eta * A) - entropy_from_logits(z)
    cov = pi @ (logp * A) - (pi @ logp) * (pi @ A)
    return {"entropy check: actual change": float(actual), "entropy check: -eta Cov(log pi, A)": float(-eta * cov)}


def measure(stores: dict, methods, seeds) -> dict[str, float]:
    """The chapter's table from the run stores: means over seeds."""
    out = {**initial_stats(), **entropy_check()}
    for m in methods:
        for offset, tag in ((False, "raw"), (True, "offset")):
            out[f"final pass@1 {m}, {tag}"] = float(np.mean([curve(stores[m, offset, s])[-1] for s in seeds]))
        out[f"max |curve(offset) - curve(raw)| {m}"] = float(max(
            np.abs(curve(stores[m, True, s]) - curve(stores[m, False, s])).max() for s in seeds))
    if "GRPO" in methods:
        d = np.array([dead(stores["GRPO", False, s]) for s in seeds])  # [seeds, steps]
        out["GRPO dead-group share, first 10 steps"] = float(d[:, :10].mean())
        out["GRPO dead-group share, last 10 steps"] = float(d[:, -10:].mean())
    return out


def matches(name: str, value: float) -> bool:
    published, how = PUBLISHED[name]
    if how == "rounding":
        return abs(value) <= 1e-14
    digits = len(f"{published:.6f}".rstrip("0").split(".")[1])
    return round(value, digits) == round(published, digits)


def table(measured: dict[str, float]) -> str:
    rows = [f"{'quantity':<42} {'published':>11} {'measured':>13}  match"]
    for name, value in measured.items():
        if name in PUBLISHED:
            rows.append(f"{name:<42} {PUBLISHED[name][0]:>11.4g} {value:>13.6g}  {'yes' if matches(name, value) else 'NO'}")
        else:
            rows.append(f"{name:<42} {'-':>11} {value:>13.6g}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "rlvr_chapter_toy")
    ap.add_argument("--seeds", type=int, default=6, help="seeds 0..N-1 (the chapter: 6)")
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--commands", action="store_true", help="print the equivalent `ablate train` commands")
    args = ap.parse_args(argv)
    seeds = range(args.seeds)
    if args.commands:
        for m in args.methods:
            for offset in (False, True):
                for s in seeds:
                    print("ablate train configs/toy.yaml " + " ".join(f"--set {o}" for o in overrides(m, offset, s, args.steps)))
        return 0
    measured = measure(train_runs(args.out, args.methods, seeds, args.steps), args.methods, seeds)
    print(table(measured))
    full = args.seeds == 6 and args.steps == 250 and len(args.methods) == len(METHODS)
    ok = all(matches(n, v) for n, v in measured.items() if n in PUBLISHED)
    print(("all published numbers matched" if ok else "some published numbers NOT matched")
          + ("" if full else " (reduced run: published numbers are for 6 seeds x 250 steps x 4 methods)"))
    return 0 if ok or not full else 1


if __name__ == "__main__":
    sys.exit(main())
