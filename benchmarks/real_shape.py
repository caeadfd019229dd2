"""Peak memory and step time at a real vocabulary, ours vs TRL's GRPOTrainer: a random-init
Qwen2-architecture model (hidden 64, 2 layers, vocabulary 151,936), 16 prompts x G=8, several completion
lengths, one token budget.

    python benchmarks/real_shape.py [--tokens 32 128 256] [--budget 4096] [--steps 2] [--threads 1]
        [--trl-python /path/to/venv/bin/python] [--trl-micro 16 8]
    python benchmarks/real_shape.py --tiny        # the smoke size the test suite runs (ours only)

Each setting trains `--steps` GRPO steps through the real `train()` in a fresh subprocess, so its peak RSS
(ru_maxrss of that process) is its own: grpo preset (KL k3 in the loss at 0.04, on-policy: no old pass, a
reference pass), `compute.micro_batch_tokens` = `--budget`. TRL runs the same model, prompts, G, length,
beta 0.04, loss_type grpo, scale_rewards group, num_iterations 1, AdamW lr 2e-4, clip 1, in a subprocess of
`--trl-python` (an environment where `import trl` works; the shared one has no trl, then only ours runs),
once per `--trl-micro` value: per_device_train_batch_size, with gradient accumulation over the 128 rows
(one optimizer step per generation). EOS is never sampled in practice from a random 151,936-way head, so
every row runs the full length on both sides (tokens/step printed). Printed: peak RSS, median s/step
(timed by each trainer: ours `perf/step_seconds`, TRL from on_step_begin to on_step_end), the ratios to
TRL's best setting (least memory) and fastest one, and the slope of our peak memory in the completion
length at the fixed budget.
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
import time
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


def trl_worker(a) -> None:
    """TRL's GRPOTrainer at our settings (runs in the TRL environment: imports no ablate module)."""
    import contextlib
    import io

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(a.threads)
    rows = json.loads(Path(a.out, "prompts.json").read_text())
    tokens, times = [], []

    def reward(prompts, completions, completion_ids, answer, **_):
        tokens.append(sum(len(c) for c in completion_ids))
        return [float(c.strip().startswith(x)) for c, x in zip(completions, answer)]

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    n = a.prompts * a.group
    args = GRPOConfig(
        output_dir=str(Path(a.out) / f"trl-{a.worker_tokens}"), per_device_train_batch_size=a.worker_micro,
        gradient_accumulation_steps=n // a.worker_micro, num_generations=a.group,
        max_completion_length=a.worker_tokens, beta=0.04, loss_type="grpo", scale_rewards="group", epsilon=0.2,
        temperature=1.0, top_p=1.0, top_k=0, num_iterations=1, learning_rate=2e-4, lr_scheduler_type="constant",
        optim="adamw_torch", weight_decay=0.0, max_grad_norm=1.0, use_vllm=False, gradient_checkpointing=False,
        bf16=False, fp16=False, use_cpu=True, report_to="none", logging_strategy="no", save_strategy="no",
        disable_tqdm=True, max_steps=a.steps, seed=0, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(a.model), reward_funcs=reward, args=args,
                          train_dataset=Dataset.from_list(rows), callbacks=[Clock()],
                          processing_class=AutoTokenizer.from_pretrained(a.model, padding_side="left"))
    with contextlib.redirect_stdout(io.StringIO()):  # the end-of-training metrics dict
        trainer.train()
    print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "step_s": statistics.median(times), "tokens": statistics.mean(tokens)}))


def run_worker(python: str, side: str, t: int, a, tmp: Path, micro: int = 0) -> dict:
    cmd = [python, __file__, "--worker", side, "--worker-tokens", str(t), "--worker-micro", str(micro),
           "--model", str(tmp / "model"), "--out", str(tmp), "--budget", str(a.budget), "--steps", str(a.steps),
           "--prompts", str(a.prompts), "--group", str(a.group), "--threads", str(a.threads)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{side} worker for {t} new tokens failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def write_prompts(out: Path, n: int) -> None:
    """The training prompts of the task our worker trains on, for TRL's dataset."""
    from ablate.config import parse
    from ablate.tasks import make_task

    task = make_task(parse({"task": {"num_train": n, "num_heldout": 1, "digits": [1, 2]}}).task)
    rows = [{"prompt": task.prompt_text(p, None), "answer": p.answer} for p in task.problems("train")]
    (out / "prompts.json").write_text(json.dumps(rows))


def trl_available(python: str) -> bool:
    return subprocess.run([python, "-c", "import trl"], capture_output=True).returncode == 0


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
    ap.add_argument("--trl-python", default=sys.executable, help="a Python where `import trl` works")
    ap.add_argument("--trl-micro", type=int, nargs="+", default=[16, 8],
                    help="TRL per_device_train_batch_size values (gradient accumulation over the rest)")
    ap.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-micro", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker-tokens", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a) if a.worker == "ours" else trl_worker(a)
    if a.tiny:
        a.tokens, a.budget, a.steps, a.prompts, a.group, a.vocab = [4, 8], 64, 1, 2, 2, 2048
    tmp = Path(tempfile.mkdtemp(prefix="ablate-real-shape-"))
    build_model(tmp / "model", a.vocab, a.hidden, 2)
    trl = trl_available(a.trl_python)
    if trl:
        write_prompts(tmp, 64)
    setting = f"budget {a.budget}, vocab {a.vocab:,}, {a.prompts}x{a.group}, {a.threads} thread(s)"
    results, best, fast = {}, {}, {}
    for t in a.tokens:
        results[t] = r = run_worker(sys.executable, "ours", t, a, tmp)
        print(f"new tokens {t:4d}: ours peak RSS {r['peak_mb']:8.0f} MB, {r['step_s']:7.2f} s/step, "
              f"{r['tokens']:.0f} tokens/step ({setting})", flush=True)
        if not trl:
            continue
        runs = {}
        for m in a.trl_micro:
            runs[m] = q = run_worker(a.trl_python, "trl", t, a, tmp, micro=m)
            print(f"new tokens {t:4d}: TRL micro-batch {m:3d} peak RSS {q['peak_mb']:8.0f} MB, {q['step_s']:7.2f} "
                  f"s/step, {q['tokens']:.0f} tokens/step", flush=True)
        best[t] = runs[min(runs, key=lambda m: runs[m]["peak_mb"])]
        fast[t] = runs[min(runs, key=lambda m: runs[m]["step_s"])]
        print(f"new tokens {t:4d}: ours / TRL least-memory setting: peak {r['peak_mb'] / best[t]['peak_mb']:.2f}x "
              f"(target <= 0.5), step time {r['step_s'] / best[t]['step_s']:.2f}x (target <= 0.8); "
              f"ours / TRL fastest setting: step time {r['step_s'] / fast[t]['step_s']:.2f}x", flush=True)
    lo, hi = min(results), max(results)
    if hi > lo:
        slope = (results[hi]["peak_mb"] - results[lo]["peak_mb"]) / (hi - lo)
        print(f"ours: peak memory slope {lo}->{hi} new tokens: {slope:.2f} MB per new token; "
              f"peak({hi}) / peak({lo}) = {results[hi]['peak_mb'] / results[lo]['peak_mb']:.2f}; "
              f"s/step({hi}) / s/step({lo}) = {results[hi]['step_s'] / results[lo]['step_s']:.2f}")
        if best:
            slope = (best[hi]["peak_mb"] - best[lo]["peak_mb"]) / (hi - lo)
            print(f"TRL least-memory setting: peak memory slope {lo}->{hi}: {slope:.2f} MB per new token")
    if not trl:
        print(f"TRL GRPOTrainer: not measured (`import trl` fails in {a.trl_python}; pass --trl-python).")
    __import__("shutil").rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
