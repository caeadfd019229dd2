"""The shared trainer: one loop, read top to bottom.

    for each step:  rollout (+ dynamic sampling) -> reward -> advantages -> update epochs -> log
                    (+ held-out evaluation and checkpoint on schedule)

Each recipe toggle is read in exactly one place; the math lives in `advantages`, `losses`, `stats`.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ablate.config import RecipeConfig, RunConfig, run_id, to_dict
from ablate.rl import losses, stats
from ablate.rl.advantages import compute_advantages
from ablate.rl.rewards import format_weight_at, overlong_penalty
from ablate.rl.sampling import Rollout
from ablate.runs.store import RunStore
from ablate.tasks import make_task
from ablate.tasks.base import Problem
from ablate.train import execution, preemption
from ablate.train.models import load_weights, trained_weights
from ablate.train.rollout import LMPolicy


class Diverged(RuntimeError):
    """The loss became NaN or infinite."""


# --- set-up -----------------------------------------------------------------------------------------

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def build_policy(cfg: RunConfig, task, device: torch.device):
    if cfg.task.name == "toy_addition":
        from ablate.tasks.toy import ToyPolicy

        return ToyPolicy(task)
    from ablate.train.models import load_model, load_tokenizer

    bf16_weights = cfg.model.master_weights == "bfloat16"
    use_bf16 = device.type == "cuda" and cfg.model.dtype in ("auto", "bfloat16") and not bf16_weights
    # fp32 master weights with bf16 autocast on CUDA, or bf16 weights (and optimizer state) throughout
    model = load_model(cfg.model.path, device, torch.bfloat16 if bf16_weights else torch.float32)
    if cfg.model.lora is not None:
        from ablate.train.models import add_lora

        model = add_lora(model, cfg.model.lora)
    if cfg.compute.gradient_checkpointing:
        execution.enable_gradient_checkpointing(model)
    return LMPolicy(model, load_tokenizer(cfg.model.path), device, torch.bfloat16 if use_bf16 else None,
                    cfg.compute.fp32_logits)


class NormalizedSGD(torch.optim.Optimizer):
    """A step of length lr along the globally normalised gradient: compares estimators on direction only."""

    def __init__(self, params, lr: float):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"] / float(norm.clamp(min=1e-12)))


def make_optimizer(module: torch.nn.Module, cfg: RunConfig):
    o = cfg.optim
    params = [p for p in module.parameters() if p.requires_grad]
    opt = {
        "adamw": lambda: torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay),
        "sgd": lambda: torch.optim.SGD(params, lr=o.lr, weight_decay=o.weight_decay),
        "normalized_sgd": lambda: NormalizedSGD(params, lr=o.lr),
    }[o.optimizer]()
    warmup = max(o.warmup_steps, 1)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))


class PromptStream:
    """Training problems in a seeded order that depends only on the run seed, so runs that differ only
    in toggles see the same prompts in the same order (paired comparisons)."""

    def __init__(self, n: int, seed: int, position: int = 0):
        self.n, self.seed, self.position = n, seed, position

    def take(self, k: int) -> list[int]:
        out = []
        for pos in range(self.position, self.position + k):
            epoch, i = divmod(pos, self.n)
            out.append(int(np.random.default_rng([self.seed, epoch]).permutation(self.n)[i]))
        self.position += k
        return out


# --- rollout and reward ----------------------------------------------------------------------------

@dataclass
class Batch:
    """B prompt groups of G completions, flattened to N = B*G rows grouped by prompt."""

    problems: list[Problem]        # [B]
    rollout: Rollout               # N rows
    rewards: torch.Tensor          # [B, G] task reward (verifier + format + overlong), before KL
    correct: torch.Tensor          # [B, G] training-verifier score
    fmt: torch.Tensor              # [B, G] format score
    overlong: torch.Tensor         # [B, G] overlong penalty (<= 0)
    group_stats: dict = field(default_factory=dict)
    rounds: int = 1
    generate_seconds: float = 0.0
    reward_seconds: float = 0.0


def task_rewards(task, problems: list[Problem], rollout: Rollout, r: RecipeConfig, group: int, fmt_weight: float):
    """[B, group] tensors: total task reward (verifier + fmt_weight * format + overlong) and its components."""
    texts = rollout.texts
    correct = torch.tensor([task.train_score(problems[i // group], t) for i, t in enumerate(texts)])
    fmt = torch.tensor([task.format_score(t) for t in texts]) if r.format_weight else torch.zeros(len(texts))
    if r.overlong == "soft_penalty":
        over = overlong_penalty(rollout.lengths.cpu(), r.max_new_tokens, r.overlong_buffer, r.overlong_factor)
    else:
        over = torch.zeros(len(texts))
    shape = (len(problems), group)
    total = correct + fmt_weight * fmt + over
    return total.view(shape), correct.view(shape), fmt.view(shape), over.view(shape)


def greedy_rewards(policy, task, problems: list[Problem], r: RecipeConfig, tokenizer, fmt_weight: float) -> torch.Tensor:
    """ReMax's baseline: the task reward of one greedy decode per prompt, [B]."""
    g = policy.sample([task.prompt_text(p, tokenizer) for p in problems], 1, 1.0, r.max_new_tokens, greedy=True)
    return task_rewards(task, problems, g, r, 1, fmt_weight)[0].flatten()


def collect(policy, task, train: list[Problem], stream: PromptStream, cfg: RunConfig, tokenizer,
            fmt_weight: float) -> Batch:
    """Sample G completions for B prompts; with dynamic sampling keep only groups with reward spread,
    drawing new prompts until B live groups or `max_gen_rounds` rounds (DAPO)."""
    r, B = cfg.recipe, cfg.prompts_per_step
    rounds_allowed = r.max_gen_rounds if r.dynamic_sampling else 1
    kept: list[Batch] = []
    all_rewards, all_strict = [], []
    rounds, t_gen, t_reward = 0, 0.0, 0.0
    while rounds < rounds_allowed and sum(len(b.problems) for b in kept) < B:
        problems = [train[i] for i in stream.take(B)]
        t0 = time.perf_counter()
        ro = policy.sample([task.prompt_text(p, tokenizer) for p in problems], r.group_size,
                           r.temperature, r.max_new_tokens)
        t1 = time.perf_counter()
        total, correct, fmt, over = task_rewards(task, problems, ro, r, r.group_size, fmt_weight)
        strict = torch.tensor([[task.score(p, t) for t in ro.texts[i * r.group_size:(i + 1) * r.group_size]]
                               for i, p in enumerate(problems)])
        t_gen, t_reward = t_gen + t1 - t0, t_reward + time.perf_counter() - t1
        all_rewards.append(total)
        all_strict.append(strict)
        rounds += 1
        live = torch.arange(len(problems))
        if r.dynamic_sampling:
            live = torch.nonzero(total.max(1).values > total.min(1).values).flatten()
        rows = (live[:, None] * r.group_size + torch.arange(r.group_size)).flatten()
        kept.append(Batch([problems[i] for i in live.tolist()], ro.select(rows), total[live], correct[live],
                          fmt[live], over[live]))
    # trim to B groups (the last round may overshoot)
    problems = [p for b in kept for p in b.problems][:B]
    n = len(problems)
    rollout = Rollout.cat([b.rollout for b in kept], policy.pad_id).select(torch.arange(n * r.group_size))
    cat = lambda name: torch.cat([getattr(b, name) for b in kept])[:n]  # noqa: E731
    return Batch(problems, rollout, cat("rewards"), cat("correct"), cat("fmt"), cat("overlong"),
                 stats.group_stats(torch.cat(all_rewards), torch.cat(all_strict) >= 1), rounds, t_gen, t_reward)


@torch.no_grad()
def sequence_logprobs(policy, rollout: Rollout, temperature: float, budget: int = 0, chunk: int = 256) -> torch.Tensor:
    """Per-token log-probs [N, T] of the sampled completions under `policy`, no grad, in micro-batches of
    at most `budget` tokens (0: `chunk` rows at a time); 0 after each completion's end."""
    N, T = rollout.completion_ids.shape
    out = None
    for idx, sub in execution.micro_batches(rollout, torch.arange(N), budget, max_rows=chunk):
        logp, _ = execution.token_scores(policy, sub, temperature)  # [n, t], t <= T
        out = logp.new_zeros(N, T) if out is None else out
        out[idx.to(out.device), :logp.shape[1]] = logp
    return out


# --- update ----------------------------------------------------------------------------------------

def update(policy, ref_logp, old_logp, batch: Batch, adv: torch.Tensor, loss_mask: torch.Tensor,
           optimizer, cfg: RunConfig) -> dict[str, float]:
    """`update_epochs` passes over the rollout in `minibatches` optimizer steps (PPO-style), each
    accumulated over micro-batches of at most `compute.micro_batch_tokens` tokens. Every aggregation's
    normaliser belongs to the whole minibatch, so the accumulated gradient is the one-pass gradient."""
    r = cfg.recipe
    agg = losses.AGGREGATIONS[r.loss_agg]
    entropy_mode = "grad" if r.entropy_coef else "value"
    N = len(batch.rollout)
    params = [p for p in policy.module.parameters() if p.requires_grad]
    logs: dict[str, list[float]] = {}
    for epoch in range(r.update_epochs):
        for idx in torch.randperm(N).split(math.ceil(N / r.minibatches)):
            optimizer.zero_grad(set_to_none=True)
            whole_mask = loss_mask[idx]
            parts = []
            for mb, sub in execution.micro_batches(batch.rollout, idx, cfg.compute.micro_batch_tokens):
                logp, ent_tok = execution.token_scores(policy, sub, r.temperature, entropy_mode)  # [n, t]
                t = logp.shape[1]
                mask = loss_mask[mb, :t]
                old = old_logp[mb, :t] if old_logp is not None else logp.detach()  # on-policy: ratio 1
                loss_policy, clip = losses.policy_loss(
                    logp, old, adv[mb], mask, eps_low=r.eps_low, eps_high=r.eps_high, dual_clip=r.dual_clip,
                    ratio_level=r.ratio_level, agg=r.loss_agg, max_len=r.max_new_tokens)
                loss = loss_policy
                kl = torch.zeros(())
                if ref_logp is not None:
                    kl = agg(losses.KL_ESTIMATORS[r.kl_estimator](logp, ref_logp[mb, :t]), mask, r.max_new_tokens)
                    if r.kl_placement == "loss":
                        loss = loss + r.kl_coef * kl
                entropy = agg(ent_tok, mask, r.max_new_tokens)
                if r.entropy_coef:
                    loss = loss - r.entropy_coef * entropy
                if not torch.isfinite(loss):
                    raise Diverged(f"loss is {loss.item()} at epoch {epoch}")
                w = losses.micro_weight(r.loss_agg, mask, whole_mask, r.max_new_tokens, loss.dtype)
                (loss * w).backward()
                w_tok = mask.bool().sum() / whole_mask.bool().sum().clamp(min=1)
                parts.append((w, w_tok, {"loss": loss, "loss_policy": loss_policy, "loss_kl": kl,
                                         "loss_entropy": entropy, **clip}))
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip or float("inf"))
            optimizer.step()
            row = {**execution.combine_stats(parts, SUMMED), "grad_norm": grad_norm}
            if epoch == 0:  # entropy and KL describe the rollout policy: first pass only
                row["entropy"], row["kl"] = row["loss_entropy"], row["loss_kl"]
            for k, v in row.items():
                logs.setdefault(k, []).append(float(torch.as_tensor(v).detach()))
    out = {k: float(np.mean(v)) for k, v in logs.items()}
    out["ratio_max"] = float(np.max(logs["ratio_max"]))
    return out


SUMMED = ("loss", "loss_policy", "loss_kl", "loss_entropy")  # aggregated terms: micro-batches add up


# --- evaluation ------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate(policy, task, heldout: list[Problem], cfg: RunConfig, tokenizer, chunk: int = 64):
    """Held-out pass@k (strict verifier, n samples at eval temperature), greedy accuracy, samples."""
    e, n = cfg.eval, cfg.eval.n_samples
    counts, rewards, lengths, greedy, samples = [], [], [], [], []
    for start in range(0, len(heldout), chunk):
        probs = heldout[start:start + chunk]
        prompts = [task.prompt_text(p, tokenizer) for p in probs]
        ro = policy.sample(prompts, n, e.temperature, cfg.recipe.max_new_tokens)
        scores = torch.tensor([task.score(probs[i // n], t) for i, t in enumerate(ro.texts)]).view(len(probs), n)
        counts += (scores >= 1).sum(1).tolist()
        rewards.append(scores.flatten())
        lengths.append(ro.lengths.cpu())
        g = policy.sample(prompts, 1, 1.0, cfg.recipe.max_new_tokens, greedy=True)
        greedy += [task.score(p, t) >= 1 for p, t in zip(probs, g.texts)]
        if start == 0:
            samples = [{"split": "heldout", "prompt": prompts[i], "completion": ro.texts[i * n],
                        "reward": float(scores[i, 0]), "correct": bool(scores[i, 0] >= 1)}
                       for i in range(min(e.num_samples_logged, len(probs)))]
    row = {f"eval/pass@{k}": stats.mean_pass_at_k(counts, n, k) for k in e.ks}
    row.update({
        "eval/greedy_acc": float(np.mean(greedy)),
        "eval/reward_mean": float(torch.cat(rewards).mean()),
        "eval/completion_len_mean": float(torch.cat(lengths).float().mean()),
        "eval/frac_never_solved": float(np.mean([c == 0 for c in counts])),
        "eval/frac_always_solved": float(np.mean([c == n for c in counts])),
    })
    if hasattr(policy, "exact_pass1"):
        row["eval/pass@1_exact"] = policy.exact_pass1(heldout)
    return row, samples


# --- logging helpers -------------------------------------------------------------------------------

def step_metrics(batch: Batch, rewards, kl_reward, adv, mask, up: dict) -> dict[str, float]:
    """The `train/*` metrics of one step (definitions in ablate/runs/metrics.py)."""
    lengths = batch.rollout.lengths
    return {
        "train/reward_mean": float(rewards.mean()), "train/reward_std": float(rewards.std(unbiased=False)),
        "train/reward_correct_mean": float(batch.correct.mean()),
        "train/reward_format_mean": float(batch.fmt.mean()),
        "train/reward_overlong_mean": float(batch.overlong.mean()),
        "train/reward_kl_mean": float(kl_reward.mean()),
        "train/dead_group_frac": batch.group_stats["dead_frac"],
        "train/dead_all_correct_frac": batch.group_stats["dead_all_correct_frac"],
        "train/dead_all_wrong_frac": batch.group_stats["dead_all_wrong_frac"],
        "train/gen_rounds": batch.rounds, "train/live_groups": len(batch.problems),
        "train/nonzero_adv_token_frac": float(((adv != 0).float()[:, None] * mask).sum() / mask.sum()),
        "train/adv_mean": float(adv.mean()), "train/adv_std": float(adv.std(unbiased=False)),
        **{f"train/{k}": v for k, v in up.items()},
        "train/completion_len_mean": float(lengths.float().mean()),
        "train/completion_len_max": float(lengths.max()),
        "train/truncation_rate": float(batch.rollout.truncated.float().mean()),
    }


def train_samples(task, batch: Batch, rewards, adv, cfg: RunConfig, tokenizer) -> list[dict]:
    """The first completion of the first few groups, with its reward and advantage."""
    G = cfg.recipe.group_size
    rows = range(0, min(len(adv), cfg.eval.num_samples_logged * G), G)
    return [{"split": "train", "prompt": task.prompt_text(batch.problems[i // G], tokenizer),
             "completion": batch.rollout.texts[i], "reward": float(rewards.flatten()[i]),
             "advantage": float(adv[i]), "correct": bool(batch.correct.flatten()[i] >= 1)} for i in rows]


# --- the loop --------------------------------------------------------------------------------------

def train(cfg: RunConfig, out_dir: str, progress: bool = True,
          should_prune: Callable[[int, dict], bool] | None = None) -> str:
    """Train `cfg` into the run folder `out_dir` (resuming from its checkpoint if any); returns the final
    state: completed, diverged, pruned or failed (failed also re-raises). `should_prune(step, eval_row)`
    is asked after every held-out evaluation (Optuna's report/should_prune); True stops the run as pruned."""
    from ablate.runs.tracking import open_mirrors

    store = RunStore(out_dir)
    existing = store.read_config()
    if existing is not None and existing.get("run_id") != run_id(cfg):
        raise ValueError(f"{out_dir} holds another run ({existing.get('run_id')}); refusing to overwrite it")
    status = store.status()
    if status and status["state"] in ("completed", "diverged", "pruned"):
        return status["state"]
    store.write_config(cfg)
    device = resolve_device(cfg.device)
    store.write_provenance(cfg, str(device))
    store.mirrors = open_mirrors(cfg, store.root)  # W&B (docs/tracking.md); [] when disabled
    state = "failed"
    try:
        store.set_status("running", (status or {}).get("step", 0))
        state = _train(cfg, store, device, progress, should_prune)
        return state
    except BaseException as err:
        if isinstance(err, SystemExit) and preemption.checkpointed_for_requeue():
            state = "running"  # the scheduler requeues the job; it resumes from the checkpoint just saved
            raise
        step = (store.status() or {}).get("step", 0)
        store.set_status("failed", step, "".join(traceback.format_exception(err)))
        raise
    finally:
        store.close(state)  # every exit path: completed, diverged, failed (incl. preemption exits)


def _train(cfg: RunConfig, store: RunStore, device: torch.device, progress: bool, should_prune) -> str:
    r = cfg.recipe
    execution.apply(cfg.compute)
    torch.manual_seed(cfg.seed)
    task = make_task(cfg.task)
    train_set, heldout = task.problems("train"), task.problems("heldout")
    policy = build_policy(cfg, task, device)
    tokenizer = getattr(policy, "tokenizer", None)
    # the reference exists only when KL is on
    ref = execution.reference_policy(policy) if r.kl_coef > 0 else None
    optimizer, scheduler = make_optimizer(policy.module, cfg)
    stream = PromptStream(len(train_set), cfg.seed)
    step, counters, wall, since_eval = 0, {"samples": 0, "tokens": 0}, 0.0, []

    ckpt = store.load_checkpoint()
    if ckpt is not None:  # resume: restore everything, forget what was logged after the checkpoint
        load_weights(policy.module, ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        torch.set_rng_state(ckpt["rng"])
        stream.position, step, counters, wall, since_eval = (ckpt[k] for k in
                                                             ("stream", "step", "counters", "wall", "since_eval"))
        store.truncate_after(step)
    else:
        store.truncate_after(-1)
        log_eval(store, 0, *evaluate(policy, task, heldout, cfg, tokenizer), None)

    needs_old_logp = r.update_epochs > 1 or r.minibatches > 1 or (r.kl_coef > 0 and r.kl_placement == "reward")
    bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                   TimeRemainingColumn(), disable=not progress)
    bar_task = bar.add_task("", total=cfg.steps, completed=step)
    start = time.perf_counter() - wall

    def save_checkpoint() -> None:  # the state at the last step boundary
        store.save_checkpoint({
            "model": trained_weights(policy.module), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "stream": stream.position,
            "step": step, "counters": counters, "wall": time.perf_counter() - start,
            "since_eval": since_eval, "config": to_dict(cfg)})

    with bar, preemption.guard(save_checkpoint):
        while step < cfg.steps:
            with preemption.step():  # a SLURM warning signal waits for the step to end
                step += 1
                t0 = time.perf_counter()
                # 1. rollout + reward (dynamic sampling inside)
                fmt_weight = format_weight_at(r.format_weight, r.format_anneal_steps, step)
                batch = collect(policy, task, train_set, stream, cfg, tokenizer, fmt_weight)
                greedy = greedy_rewards(policy, task, batch.problems, r, tokenizer, fmt_weight) \
                    if r.baseline == "greedy" else None
                t1 = time.perf_counter()
                # 2. behaviour and reference log-probs (only when used)
                budget = cfg.compute.micro_batch_tokens
                old_logp = sequence_logprobs(policy, batch.rollout, r.temperature, budget) if needs_old_logp else None
                ref_logp = sequence_logprobs(ref, batch.rollout, r.temperature, budget) if ref is not None else None
                mask = batch.rollout.completion_mask
                rewards = batch.rewards
                kl_reward = torch.zeros_like(rewards)
                if ref is not None and r.kl_placement == "reward":  # PPO/REINFORCE++: KL as a reward term
                    kl_tok = losses.KL_ESTIMATORS[r.kl_estimator](old_logp, ref_logp)
                    kl_reward = r.kl_coef * (kl_tok * mask).sum(-1).view_as(rewards).cpu()
                    rewards = rewards - kl_reward
                t2 = time.perf_counter()
                # 3. advantages, one per completion, broadcast to its tokens
                adv = compute_advantages(rewards, baseline=r.baseline, scale=r.scale, ddof=r.std_ddof, eps=r.std_eps,
                                         greedy_rewards=greedy).flatten().to(mask.device)
                loss_mask = mask * (~batch.rollout.truncated).float()[:, None] if r.overlong == "mask" else mask
                # 4. update
                try:
                    up = update(policy, ref_logp, old_logp, batch, adv, loss_mask, optimizer, cfg)
                except Diverged as err:
                    store.set_status("diverged", step, str(err))
                    return "diverged"
                lr = scheduler.get_last_lr()[0]
                scheduler.step()
                t3 = time.perf_counter()
                # 5. log
                lengths = batch.rollout.lengths
                counters["samples"] += len(batch.rollout)
                counters["tokens"] += int(lengths.sum())
                since_eval.append(float(batch.correct.mean()))
                row = {**step_metrics(batch, rewards, kl_reward, adv, mask, up), "train/lr": lr,
                       "train/format_weight": fmt_weight,
                       "counters/samples": counters["samples"], "counters/tokens": counters["tokens"],
                       "perf/wall_seconds": time.perf_counter() - start, "perf/step_seconds": t3 - t0,
                       "perf/generate_seconds": t1 - t0 - batch.reward_seconds,
                       "perf/reward_seconds": batch.reward_seconds,
                       "perf/logprob_seconds": t2 - t1, "perf/update_seconds": t3 - t2,
                       "perf/gen_tokens_per_s": float(lengths.sum()) / max(batch.generate_seconds, 1e-9),
                       "perf/train_tokens_per_s": float(lengths.sum()) * r.update_epochs / max(t3 - t2, 1e-9)}
                store.append("metrics", {"step": step, **row})
                if cfg.eval.every and step % cfg.eval.every == 0 or step == cfg.steps:
                    ev, samples = evaluate(policy, task, heldout, cfg, tokenizer)
                    samples += train_samples(task, batch, rewards, adv, cfg, tokenizer)
                    log_eval(store, step, ev, samples, float(np.mean(since_eval)))
                    since_eval = []
                    if should_prune is not None and step < cfg.steps and should_prune(step, ev):
                        store.set_status("pruned", step)
                        return "pruned"
                store.set_status("running", step)
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
                    save_checkpoint()
                bar.update(bar_task, completed=step,
                           description=f"reward {row['train/reward_mean']:.3f} dead {row['train/dead_group_frac']:.2f}")
    store.set_status("completed", step)
    return "completed"


def log_eval(store: RunStore, step: int, row: dict, samples: list[dict], train_reward: float | None) -> None:
    if train_reward is not None:
        row = {**row, "eval/train_minus_heldout_reward": train_reward - row["eval/reward_mean"]}
    store.append("evals", {"step": step, **row})
    for s in samples:
        store.append("samples", {"step": step, **s})
