"""Sampling throughput of multi-turn episodes against single-turn sampling of the same model, same run.

Episodes (ablate/train/episodes.py) on the calculator environment with the committed tiny calculator model
sample turn by turn through the native engine, each turn re-prefilling the episode's context; the peer is
one single-turn `LMPolicy.sample` call over the same prompts with the episode budget as its limit. Printed:
tokens per second of each (policy tokens; for episodes also all tokens, the environment's included) and the
ratio episodes / single-turn, measured in the same process, alternating, median of `--repeats`.

    python benchmarks/episodes.py [--problems 16] [--group 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ablate.config import load
from ablate.rl.sampling import TRAIN, RowNoise
from ablate.tasks import make_task
from ablate.train.episodes import run_episodes
from ablate.train.models import load_model, load_tokenizer
from ablate.train.rollout import LMPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load("configs/calculator.yaml")
    task = make_task(cfg.task)
    tok = load_tokenizer(cfg.model.path)
    policy = LMPolicy(load_model(cfg.model.path), tok, torch.device("cpu"))
    problems = task.problems("train")[:args.problems]
    N, budget = len(problems) * args.group, cfg.recipe.max_new_tokens
    episode_rate, all_rate, single_rate = [], [], []
    for rep in range(args.repeats):
        key = (0, rep, 0, TRAIN)
        t0 = time.perf_counter()
        ro, _ = run_episodes(policy, tok, task, problems, args.group, 1.0, budget, key, 0, N)
        t1 = time.perf_counter()
        single = policy.sample([task.prompt_text(p, tok) for p in problems], args.group, 1.0, budget,
                               noise=RowNoise(key, N))
        t2 = time.perf_counter()
        episode_rate.append(float(ro.policy_mask.sum()) / (t1 - t0))
        all_rate.append(float(ro.completion_mask.sum()) / (t1 - t0))
        single_rate.append(float(single.completion_mask.sum()) / (t2 - t1))
    med = statistics.median
    print(f"{N} rows ({len(problems)} problems x {args.group}), budget {budget} tokens, median of {args.repeats}")
    print(f"single-turn sampling   {med(single_rate):9.0f} tokens/s")
    print(f"episodes, policy       {med(episode_rate):9.0f} tokens/s   ratio {med(episode_rate) / med(single_rate):.2f}")
    print(f"episodes, all tokens   {med(all_rate):9.0f} tokens/s   ratio {med(all_rate) / med(single_rate):.2f}")


if __name__ == "__main__":
    main()
