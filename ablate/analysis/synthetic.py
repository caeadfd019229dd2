"""Synthetic run folders with planted effects, in the run-store layout: for tests, docs and the
load/report benchmark. Nothing is trained.

    write_sweep("/tmp/s", {"recipe.eps_high": [0.2, 0.28], "recipe.scale": ["group", "none"]},
                seeds=range(5), effects={"recipe.eps_high": 0.03}, interactions={}, steps=100)

Final held-out pass@1 of a run = base + sum of planted main effects (of the non-reference values) +
planted interactions + a per-seed offset (shared by every arm: same seed = same prompts) + run noise.
With `scaling=(B, C_mid)` the held-out curve is instead the ScaleRL sigmoid in generated tokens,
R(C) = 0.1 + (A - 0.1) / (1 + (C_mid / C)^B), whose ceiling A is that planted value (plus
`eval_noise` per evaluation): for the compute-scaling fit.

With `problems=M`, every run also writes per-problem counts of its last evaluation (eval_problems.jsonl,
`repeats` rows): problem m of a run with final pass@1 f is solved with probability clip(f + b_m, 0, 1),
b_m ~ N(0, problem_sd) drawn once per sweep (one held-out set shared by every run), and each of the
`problem_n` samples of each repeat is a Bernoulli draw: planted seed, problem and sampling noise.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import yaml

STEP_KEYS = ["train/reward_mean", "train/reward_std", "train/reward_correct_mean", "train/reward_format_mean",
             "train/dead_group_frac", "train/dead_all_correct_frac", "train/dead_all_wrong_frac",
             "train/nonzero_adv_token_frac", "train/adv_std", "train/entropy", "train/kl", "train/clip_frac_low",
             "train/clip_frac_high", "train/ratio_mean", "train/completion_len_mean", "train/truncation_rate",
             "train/loss", "train/grad_norm", "train/lr", "counters/samples", "counters/tokens",
             "perf/wall_seconds", "perf/step_seconds"]
EVAL_KS = (1, 8)


def _nest(flat: dict) -> dict:
    out: dict = {}
    for k, v in flat.items():
        d = out
        *head, last = k.split(".")
        for h in head:
            d = d.setdefault(h, {})
        d[last] = v
    return out


def write_eval_problems(run_dir: Path, step: int, counts, n: int, problems: list | None = None) -> None:
    """eval_problems.jsonl rows of one evaluation: counts (repeats, M) correct out of n per problem."""
    counts = np.atleast_2d(np.asarray(counts, dtype=int))
    ids = problems or [f"p{m}" for m in range(counts.shape[1])]
    with open(Path(run_dir) / "eval_problems.jsonl", "a") as f:
        for r, c in enumerate(counts):
            f.write(json.dumps({"step": step, "repeat": r, "n": n, "problems": ids, "correct": c.tolist()}) + "\n")


def write_run(run_dir: Path, config: dict, final: float, steps: int, rng: np.random.Generator, state="completed",
              stop_at: int | None = None, eval_every: int = 25, torn: bool = False, samples: bool = True,
              entropy_drop: float = 0.3, scaling: tuple | None = None, eval_noise: float = 0.0) -> None:
    """One run folder whose held-out pass@1 climbs linearly from 0.1 to `final` (noise on train metrics)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    last = steps if stop_at is None else stop_at
    t = np.arange(1, last + 1) / steps
    noise = rng.normal(0, 0.03, size=(last, len(STEP_KEYS)))
    prog = 0.1 + (final - 0.1) * t
    vals = {
        "train/reward_mean": prog + noise[:, 0], "train/reward_std": 0.4 + noise[:, 1],
        "train/reward_correct_mean": prog + noise[:, 2], "train/reward_format_mean": np.ones(last),
        "train/dead_group_frac": 0.3 + 0.3 * t, "train/dead_all_correct_frac": 0.05 + 0.3 * t,
        "train/dead_all_wrong_frac": 0.25 - 0.05 * t + noise[:, 6] / 3, "train/nonzero_adv_token_frac": 0.7 - 0.3 * t,
        "train/adv_std": 0.8 - 0.2 * t, "train/entropy": 2.0 * (1 - entropy_drop * t) + noise[:, 9],
        "train/kl": 0.05 * np.sqrt(t), "train/clip_frac_low": 0.02 + noise[:, 11] / 10,
        "train/clip_frac_high": 0.03 + noise[:, 12] / 10, "train/ratio_mean": 1 + noise[:, 13] / 10,
        "train/completion_len_mean": 40 + 10 * t, "train/truncation_rate": 0.01 * t, "train/loss": noise[:, 16],
        "train/grad_norm": 1 + noise[:, 17], "train/lr": np.full(last, 1e-6),
        "counters/samples": 128.0 * np.arange(1, last + 1), "counters/tokens": 128.0 * np.cumsum(40 + 10 * t),
        "perf/wall_seconds": 2.0 * np.arange(1, last + 1), "perf/step_seconds": 2.0 + noise[:, 22],
    }
    with open(run_dir / "metrics.jsonl", "w") as f:
        for i in range(last):
            f.write(json.dumps({"step": i + 1, **{k: float(v[i]) for k, v in vals.items()}}) + "\n")
        if torn:
            f.write('{"step": ' + str(last + 1) + ', "train/reward_mean": 0.')
    with open(run_dir / "evals.jsonl", "w") as f:
        for s in range(0, last + 1, eval_every):
            p1 = 0.1 + (final - 0.1) * s / steps
            if scaling is not None and s:
                b, c_mid = scaling
                p1 = 0.1 + (final - 0.1) / (1 + (c_mid / vals["counters/tokens"][s - 1]) ** b)
            if eval_noise and s:
                p1 += rng.normal(0, eval_noise)
            row = {"step": s, "eval/pass@1": p1, "eval/pass@8": 1 - (1 - p1) ** 3, "eval/greedy_acc": p1,
                   "eval/reward_mean": p1, "eval/completion_len_mean": 40 + 10 * s / steps}
            if s:
                row["eval/train_minus_heldout_reward"] = 0.01
            f.write(json.dumps(row) + "\n")
    if samples:
        with open(run_dir / "samples.jsonl", "w") as f:
            for i in range(2):
                f.write(json.dumps({"step": last, "split": "heldout", "prompt": f"{i}+{i}=<b>?",
                                    "completion": f"\\boxed{{{2 * i}}}", "reward": 1.0, "correct": True}) + "\n")
    status = {"state": state, "step": last, "error": "RuntimeError: boom" if state == "failed" else None}
    (run_dir / "status.json").write_text(json.dumps(status))


def run_name(combo: int, seed: int) -> str:
    """The run id (and folder) of a grid cell and seed in a run id's format (12 hex digits): `c00003d00001` is
    combination 3, seed 1."""
    return f"c{combo:05d}d{seed:05d}"


def write_sweep(root, grid: dict, seeds=range(3), effects: dict | None = None, interactions: dict | None = None,
                base: float = 0.5, seed_sd: float = 0.02, noise: float = 0.0, steps: int = 100, eval_every: int = 25,
                manifest: bool = True, name: str = "synthetic", fail: tuple = (), rng_seed: int = 0,
                samples: bool = True, scaling: tuple | None = None, eval_noise: float = 0.0, problems: int = 0,
                problem_n: int = 8, repeats: int = 1, problem_sd: float = 0.1) -> list[Path]:
    """A full grid x seeds; `effects`: key -> effect of its non-first values; `interactions`:
    (key1, key2) -> extra effect when both are at their non-first value. `fail`: (combo index, seed)
    pairs written as failed half-way. Returns the run folders."""
    root = Path(root)
    effects, interactions = effects or {}, interactions or {}
    rng = np.random.default_rng(rng_seed)
    seed_off = {s: rng.normal(0, seed_sd) for s in seeds}
    b = rng.normal(0, problem_sd, problems)  # per-problem difficulty, shared by every run
    keys = list(grid)
    dirs, entries = [], {}
    for ci, combo in enumerate(itertools.product(*grid.values())):
        on = {k: grid[k].index(v) > 0 for k, v in zip(keys, combo)}
        mu = base + sum(e for k, e in effects.items() if on[k]) + \
            sum(e for (a, b), e in interactions.items() if on[a] and on[b])
        for s in seeds:
            flat = {"task.name": "synthetic", "model.path": "none", "steps": steps, "seed": s,
                    "recipe.group_size": 8, "recipe.kl_coef": 0.04, "optim.lr": 1e-6, **dict(zip(keys, combo))}
            rid = run_name(ci, s)
            cfg = {"run_id": rid, **_nest(flat)}
            failed = (ci, s) in fail
            d = root / rid
            f = mu + seed_off[s] + rng.normal(0, noise) if noise else mu + seed_off[s]
            write_run(d, cfg, f, steps, rng, state="failed" if failed else "completed",
                      stop_at=steps // 2 if failed else None, eval_every=eval_every, samples=samples, scaling=scaling,
                      eval_noise=eval_noise)
            if problems:
                last = (steps // 2 if failed else steps) // eval_every * eval_every
                write_eval_problems(d, last, rng.binomial(problem_n, np.clip(f + b, 0, 1), (repeats, problems)),
                                    problem_n)
            dirs.append(d)
            entries[rid] = {"arm": None, "seed": s, "toggles": dict(zip(keys, combo)), "steps": steps, "jobs": []}
    if manifest:
        m = {"name": name, "spec": {"name": name, "grid": grid, "seeds": list(seeds)}, "runs": entries}
        (root / "manifest.json").write_text(json.dumps(m, indent=1))
    return dirs
