"""GPU check: a Qwen2.5-0.5B-shaped random model (no download), 5 bf16 GRPO steps at 16 x 8 x 512 new
tokens under a token budget; prints the step-time breakdown, peak CUDA memory and tokens/s.

    python benchmarks/gpu_check.py                   # on a CUDA machine (benchmarks/gpu_check.sh runs it)
    python benchmarks/gpu_check.py --engine vllm     # rollouts from vLLM in bf16 (extra `vllm`), TIS on
    python benchmarks/gpu_check.py --tiny --device cpu   # the CPU smoke path the test suite runs

With `--engine vllm` the run samples through vLLM in the trainer's process (bf16, like the trainer's
autocast; sleep mode on; weights pushed every step) with token TIS (C = 2), so the old pass runs and the
`offpolicy/*` metrics print the bf16 engine-vs-trainer mismatch that TIS/MIS exist for.

Shape (Qwen2.5-0.5B): hidden 896, 24 layers, 14 heads / 2 KV heads, intermediate 4864, vocab 151,936,
tied embeddings. The tokenizer is the word-level one of benchmarks/real_shape.py padded to the vocabulary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

QWEN05 = dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151_936)
TINY = dict(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=1024)


def settings(a) -> dict:
    """The run config of the check (a pure function of the arguments: tested on CPU)."""
    recipe = {"group_size": a.group, "max_new_tokens": a.tokens, "kl_coef": 0.001}
    if a.engine == "vllm":  # the old pass runs and the mismatch is corrected (Yao et al. 2025: C = 2)
        recipe["is_correction"] = "tis"
    return {"model": {"path": a.model, "dtype": "bfloat16"}, "preset": "grpo", "device": a.device, "seed": 0,
            "task": {"num_train": 256, "num_heldout": 1, "digits": [2]},
            "prompts_per_step": a.prompts, "steps": a.steps, "checkpoint_every": 0,
            "eval": {"every": 0, "n_samples": 1, "ks": [1], "num_samples_logged": 1},
            "recipe": recipe, "compute": {"micro_batch_tokens": a.budget}, "rollout": {"engine": a.engine}}


def summary(rows: list[dict], peak_bytes: int | None) -> list[str]:
    """Printed lines: medians of the step-time parts, tokens/s, peak memory."""
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    lines = [f"step {med('perf/step_seconds'):.2f} s = generate {med('perf/generate_seconds'):.2f} + reward "
             f"{med('perf/reward_seconds'):.2f} + log-probs {med('perf/logprob_seconds'):.2f} + update "
             f"{med('perf/update_seconds'):.2f} (medians of {len(rows)} steps)",
             f"tokens/s: generate {med('perf/gen_tokens_per_s'):.0f}, train {med('perf/train_tokens_per_s'):.0f}"]
    if "offpolicy/kl_k3" in rows[0]:  # the behaviour -> old mismatch (an engine's kernels and precision)
        lines.append("mismatch (medians): " + ", ".join(
            f"{k.split('/')[1]} {med(k):.3g}" for k in ("offpolicy/kl_k3", "offpolicy/max_abs_prob_diff",
                                                          "offpolicy/ess_frac", "offpolicy/is_cap_frac")))
    if peak_bytes is not None:
        lines.append(f"peak CUDA memory {peak_bytes / 2**30:.2f} GiB")
    return lines


def build(out: Path, shape: dict) -> None:
    import torch
    from real_shape import build_model  # the padded word-level tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    build_model(out, shape["vocab"], 16, 1)  # tokenizer (and a placeholder model, replaced below)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
                      num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                      num_key_value_heads=shape["kv_heads"], max_position_embeddings=4096, tie_word_embeddings=True,
                      pad_token_id=0, eos_token_id=1, bos_token_id=2)
    Qwen2ForCausalLM(cfg).save_pretrained(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--budget", type=int, default=16384)
    ap.add_argument("--tiny", action="store_true", help="tiny shape, 2 x 2 x 4 tokens, 1 step")
    ap.add_argument("--engine", choices=["native", "vllm"], default="native", help="rollout.engine")
    a = ap.parse_args()
    import torch

    from ablate.config import parse
    from ablate.runs.store import RunStore
    from ablate.train.trainer import train

    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device (use --device cpu --tiny for the CPU path)")
    if a.tiny:
        a.steps, a.prompts, a.group, a.tokens, a.budget = 1, 2, 2, 4, 64
        torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="ablate-gpu-check-"))
    a.model = str(tmp / "model")
    build(tmp / "model", TINY if a.tiny else QWEN05)
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    assert train(parse(settings(a)), str(tmp / "run"), progress=False) == "completed"
    rows = RunStore(tmp / "run").read("metrics")
    peak = torch.cuda.max_memory_allocated() if a.device == "cuda" else None
    print(f"gpu_check on {a.device} ({a.engine} rollouts): {a.prompts} x {a.group} x {a.tokens} new tokens, "
          f"budget {a.budget}")
    print("\n".join(summary(rows, peak)))
    __import__("shutil").rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
