"""One GRPO trainer step on the tiny model, CPU fp32: ours vs TRL's GRPOTrainer vs the bare-compute floor.

    python benchmarks/trainer_step.py [--steps 10] [--warmup 2] [--threads 1] [--no-trl] [--profile]

All contenders: 16 prompts x G=8, exactly 16 new tokens per row (2048 generated = 2048 trained tokens a step,
checked every step), fp32, KL off, one AdamW step (grad clip 1) per rollout. Ours treats EOS as an ordinary
token (`policy.eos_id = -1`); TRL gets `min_new_tokens=16` (generate() masks EOS until token 16).
Same load for all: TRL drives the loop and its `on_step_end` callback runs one step of ours and one floor step;
a TRL step is timed from that callback's return to its next `on_step_end`. Medians after `--warmup` steps.
Threads default to 1 (`--threads 0`: torch's default): on a ~1M model two OpenMP threads on a shared 2-core
box mostly measure scheduler contention (4-7x slower when another job holds a core).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", category=FutureWarning)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
import transformers
from rich.console import Console
from rich.table import Table

from ablate.config import parse
from ablate.tasks import make_task
from ablate.train.data import PromptSampler
from ablate.train.models import build_base_model, build_policy, load_model, load_tokenizer
from ablate.train.optim import make_optimizer
from ablate.train.plan import plan_step
from ablate.train.trainer import collect
from ablate.train.update import sequence_logprobs, update

B, G, T = 16, 8, 16
REPO = Path(__file__).resolve().parents[1]


def model_dir(tmp: str) -> str:
    if (REPO / "models/tiny-arith/config.json").is_file():
        return str(REPO / "models/tiny-arith")
    build_base_model(Path(tmp) / "tiny", steps=40, progress=False)  # quality is irrelevant to timing
    return str(Path(tmp) / "tiny")


class Ours:
    """The trainer's own step (collect -> [old log-probs] -> advantages -> update -> scheduler), minus logging."""

    def __init__(self, path: str):
        self.cfg = parse({"model": {"path": path}, "task": {"name": "arithmetic"}, "prompts_per_step": B,
                          "device": "cpu", "recipe": {"group_size": G, "max_new_tokens": T, "kl_coef": 0.0},
                          "optim": {"lr": 2e-4}})
        self.task = make_task(self.cfg.task)
        self.train = self.task.problems("train")
        self.policy = build_policy(self.cfg, self.task, torch.device("cpu"))
        self.policy.eos_id = -1  # EOS becomes an ordinary token: all 128 rows run the full 16 tokens
        self.opt, self.sched = make_optimizer(self.policy.module, self.cfg)
        self.stream = PromptSampler(len(self.train), self.cfg)
        self.plan = plan_step(self.cfg, 1)  # no schedules: every step's plan but Clip-Cov's draw (unused here)

    def step(self) -> dict[str, float]:
        plan = self.plan
        t0 = time.perf_counter()
        batch = collect(self.policy, self.task, self.train, self.stream, plan, self.policy.tokenizer)
        t1 = time.perf_counter()
        old = sequence_logprobs(self.policy, batch.rollout, plan.sampling.temperature) if plan.old_pass else None
        t2 = time.perf_counter()
        mask = batch.rollout.completion_mask
        adv = plan.advantages(batch.rewards).flatten()
        update(self.policy, self.opt, plan, batch.rollout, adv, mask, old_logp=old if plan.anchor_on_old else None)
        self.sched.step()
        t3 = time.perf_counter()
        n_tok = int(mask.sum())
        assert n_tok == B * G * T and batch.rollout.completion_ids.shape == (B * G, T), n_tok
        self.last = batch.rollout
        # same split as the trainer's perf/* metrics: collect() overhead counts as generate
        return {"generate": t1 - t0 - batch.reward_seconds, "reward": batch.reward_seconds,
                "log-probs": t2 - t1, "update": t3 - t2, "total": t3 - t0, "tokens": n_tok}


class Floor:
    """Bare model compute on a copy of the model: prefill + 15 KV-cached decode forwards over precomputed
    tokens (no sampling, no stop checks, no decode to text), then one forward/backward/AdamW step over the
    128 sequences of prompt + 16 tokens (cross-entropy on the 16 completion positions)."""

    def __init__(self, module, rollout):
        self.model = copy.deepcopy(module)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=2e-4)
        self.ids, self.pmask, self.comp = rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids
        self.full_mask = torch.cat([self.pmask, torch.ones_like(self.comp)], 1)
        self.full_pos = (self.full_mask.cumsum(-1) - 1).clamp(min=0)

    @torch.no_grad()
    def generate(self):
        P = self.ids.shape[1]
        out = self.model(input_ids=self.ids, attention_mask=self.pmask, position_ids=self.full_pos[:, :P],
                         use_cache=True, logits_to_keep=1)
        for t in range(T - 1):
            out = self.model(input_ids=self.comp[:, t:t + 1], attention_mask=self.full_mask[:, :P + t + 1],
                             position_ids=self.full_pos[:, P + t:P + t + 1], past_key_values=out.past_key_values,
                             use_cache=True)
        return out.logits

    def train_step(self):
        ids = torch.cat([self.ids, self.comp], 1)
        logits = self.model(input_ids=ids, attention_mask=self.full_mask, position_ids=self.full_pos,
                            logits_to_keep=T + 1).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.comp.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        self.generate()
        t1 = time.perf_counter()
        self.train_step()
        t2 = time.perf_counter()
        return {"generate": t1 - t0, "update": t2 - t1, "total": t2 - t0}


def run_trl(path: str, tmp: str, task, train, n_steps: int, between):
    """TRL GRPOTrainer at the same settings; `between()` runs (untimed for TRL) after each of its steps."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokens: list[int] = []

    def reward(prompts, completions, completion_ids, pid, **_):
        tokens.append(sum(len(c) for c in completion_ids))
        return [task.train_score(train[i], c) for i, c in zip(pid, completions)]

    class Clock(TrainerCallback):
        resume, times = None, []

        def on_step_end(self, args, state, control, **kw):
            if self.resume is not None:
                self.times.append(time.perf_counter() - self.resume)
            between()
            self.resume = time.perf_counter()

    args = GRPOConfig(
        output_dir=str(Path(tmp) / "trl"), per_device_train_batch_size=B * G, gradient_accumulation_steps=1,
        num_generations=G, max_completion_length=T, generation_kwargs={"min_new_tokens": T}, beta=0.0,
        loss_type="grpo", scale_rewards="group", temperature=1.0, top_p=1.0, top_k=0, num_iterations=1,
        learning_rate=2e-4, lr_scheduler_type="constant", optim="adamw_torch", weight_decay=0.0, max_grad_norm=1.0,
        use_vllm=False, gradient_checkpointing=False, bf16=False, fp16=False, use_cpu=True, report_to="none",
        logging_strategy="no", save_strategy="no", disable_tqdm=True, max_steps=n_steps, seed=0)
    data = Dataset.from_list([{"prompt": task.prompt_text(p, None), "pid": i} for i, p in enumerate(train)])
    clock = Clock()
    trainer = GRPOTrainer(model=load_model(path), reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=load_tokenizer(path), callbacks=[clock])
    with contextlib.redirect_stdout(io.StringIO()):  # the end-of-training metrics dict
        trainer.train()
    assert set(tokens) == {B * G * T}, f"TRL generated {set(tokens)} tokens per step, expected {B * G * T}"
    return clock.times


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--no-trl", action="store_true", help="ours and the floor only")
    ap.add_argument("--profile", action="store_true", help="cProfile our measured steps, print the top entries")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="ablate-bench-")
    __import__("atexit").register(__import__("shutil").rmtree, tmp, True)  # the built model, TRL's output dir
    path = model_dir(tmp)
    ours = Ours(path)
    ours.step()  # also gives the floor its token batch
    floor = Floor(ours.policy.module, ours.last)
    rows_ours, rows_floor, prof = [], [], __import__("cProfile").Profile()

    def between():  # one step of ours then one floor step, interleaved with TRL's steps
        on = a.profile and len(rows_ours) >= a.warmup
        prof.enable() if on else None
        rows_ours.append(ours.step())
        prof.disable() if on else None
        rows_floor.append(floor.step())

    total, trl_times = a.warmup + a.steps, None
    if a.no_trl:
        for _ in range(total):
            between()
    else:
        trl_times = run_trl(path, tmp, ours.task, ours.train, total, between)[a.warmup - 1:]
    rows_ours, rows_floor = rows_ours[a.warmup:], rows_floor[a.warmup:]

    ours_s, floor_s = med(rows_ours, "total"), med(rows_floor, "total")
    con = Console(width=120)
    t = Table(title=f"GRPO step, tiny Llama ({sum(p.numel() for p in ours.policy.module.parameters()):,} params), "
                    f"{B} prompts x G={G}, {T} new tokens, fp32, KL off - median of {a.steps} steps")
    for col in ("contender", "generate", "reward", "log-probs", "update", "step (s)", "tok/step"):
        t.add_column(col, justify="left" if col == "contender" else "right")
    f = lambda x: f"{x:.4f}"
    t.add_row("ours (ablate.train.trainer)", *(f(med(rows_ours, k)) for k in ("generate", "reward", "log-probs", "update")),
              f(ours_s), str(rows_ours[0]["tokens"]))
    t.add_row("floor (bare compute)", f(med(rows_floor, "generate")), "-", "-", f(med(rows_floor, "update")),
              f(floor_s), str(B * G * T))
    if trl_times:
        t.add_row("TRL GRPOTrainer", "", "", "", "", f(statistics.median(trl_times)), str(B * G * T))
    con.print(t)
    ratios = Table("ratio", "value", "target", "ok", title="ratios (median step times)")
    ok = lambda v, tgt: "[green]yes[/]" if v <= tgt else "[red]no[/]"
    if trl_times:
        v = ours_s / statistics.median(trl_times)
        ratios.add_row("ours / TRL", f"{v:.3f}", "<= 0.80", ok(v, 0.8))
    v = ours_s / floor_s
    ratios.add_row("ours / floor", f"{v:.3f}", "<= 1.15", ok(v, 1.15))
    for k in ("generate", "update"):
        ratios.add_row(f"  {k}: ours / floor", f"{med(rows_ours, k) / med(rows_floor, k):.3f}", "", "")
    con.print(ratios)
    con.print("log-probs = 0: one on-policy update per rollout (ratio 1), so the trainer skips the old-log-prob "
              "pass (TRL skips it too at num_iterations=1).")
    trl = sys.modules.get("trl")
    env = {"torch": torch.__version__, "threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
           "cpus": os.cpu_count(), "transformers": transformers.__version__, "trl": getattr(trl, "__version__", "-"),
           "load(1m)": f"{os.getloadavg()[0]:.2f}"}
    con.print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    spread = {"ours": [r["total"] for r in rows_ours], "floor": [r["total"] for r in rows_floor], "TRL": trl_times}
    con.print("spread (min..max s): " + ", ".join(f"{k} {min(v):.3f}..{max(v):.3f}" for k, v in spread.items() if v))
    if a.profile:
        __import__("pstats").Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
