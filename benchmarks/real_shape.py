"""Peak memory and step time at a real vocabulary: a random-init Qwen2-architecture model (hidden 64,
2 layers, vocabulary 151,936), 16 prompts x G=8, several completion lengths, one token budget.

    python benchmarks/real_shape.py [--tokens 32 128 256] [--budget 4096] [--steps 2] [--threads 1]
    python benchmarks/real_shape.py --tiny        # the smoke size the test suite runs

Each setting trains `--steps` GRPO steps (KL on: old-free on-policy update, reference pass) through the
real `train()` in a fresh subprocess, so its peak RSS (ru_maxrss) is its own. EOS is never sampled in
practice from a random 151,936-way head, so every row runs the full length. Printed: peak RSS, median
s/step, and the slope of peak memory in the completion length at the fixed budget (MB per new token,
and as the ratio peak(longest) / peak(shortest)). TRL is not in the shared environment, so only ours
is measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_model(out: Path, vocab: int, hidden: int, layers: int) -> None:
    """A random Qwen2 model and a word-level tokenizer padded to `vocab` entries (characters first)."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from ablate.train.models import CHARS, SPECIALS

    names = SPECIALS + sorted(set(CHARS))
    names += [f"<t{i}>" for i in range(vocab - len(names))]
    table = {t: i for i, t in enumerate(names)}
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", table["<bos>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>", padding_side="left")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        pad_token_id=table["<pad>"], eos_token_id=table["<eos>"], bos_token_id=table["<bos>"]))
    model.save_pretrained(out)
    fast.save_pretrained(out)


def worker(a) -> None:
    import torch

    from ablate.config import parse
    from ablate.runs.store import RunStore
    from ablate.train.trainer import train

    torch.set_num_threads(a.threads)
    data = {"model": {"path": a.model}, "preset": "grpo", "device": "cpu", "seed": 0,
            "task": {"num_train": 64, "num_heldout": 1, "digits": [1, 2]},
            "prompts_per_step": a.prompts, "steps": a.steps, "checkpoint_every": 0,
            "eval": {"every": 0, "n_samples": 1, "ks": [1], "num_samples_logged": 1},
            "recipe": {"group_size": a.group, "max_new_tokens": a.worker_tokens}}
    if a.budget:
        data["compute"] = {"micro_batch_tokens": a.budget}
    run = Path(a.out) / f"run-{a.worker_tokens}"
    train(parse(data), str(run), progress=False)
    rows = RunStore(run).read("metrics")
    print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "step_s": statistics.median(r["perf/step_seconds"] for r in rows),
                      "tokens": rows[-1]["counters/tokens"] / len(rows)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[32, 128, 256])
    ap.add_argument("--budget", type=int, default=4096, help="compute.micro_batch_tokens (0: one pass)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help="smoke size: vocab 2048, 2 prompts x 2, 4/8 tokens, 1 step")
    ap.add_argument("--worker-tokens", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker_tokens:
        return worker(a)
    if a.tiny:
        a.tokens, a.budget, a.steps, a.prompts, a.group, a.vocab = [4, 8], 64, 1, 2, 2, 2048
    tmp = Path(tempfile.mkdtemp(prefix="ablate-real-shape-"))
    build_model(tmp / "model", a.vocab, a.hidden, 2)
    results = {}
    for t in a.tokens:
        cmd = [sys.executable, __file__, "--worker-tokens", str(t), "--model", str(tmp / "model"), "--out", str(tmp),
               "--budget", str(a.budget), "--steps", str(a.steps), "--prompts", str(a.prompts),
               "--group", str(a.group), "--threads", str(a.threads)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"worker for {t} new tokens failed:\n{res.stderr[-3000:]}")
        results[t] = json.loads(res.stdout.strip().splitlines()[-1])
        r = results[t]
        print(f"new tokens {t:4d}: peak RSS {r['peak_mb']:8.0f} MB, {r['step_s']:7.2f} s/step, "
              f"{r['tokens']:.0f} tokens/step (budget {a.budget}, vocab {a.vocab:,}, "
              f"{a.prompts}x{a.group}, {a.threads} thread(s))", flush=True)
    lo, hi = min(results), max(results)
    if hi > lo:
        slope = (results[hi]["peak_mb"] - results[lo]["peak_mb"]) / (hi - lo)
        print(f"peak memory slope {lo}->{hi} new tokens: {slope:.2f} MB per new token; "
              f"peak({hi}) / peak({lo}) = {results[hi]['peak_mb'] / results[lo]['peak_mb']:.2f}; "
              f"s/step({hi}) / s/step({lo}) = {results[hi]['step_s'] / results[lo]['step_s']:.2f}")
    print("TRL GRPOTrainer: not measured (trl is not installed in this environment).")
    __import__("shutil").rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
