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

from ablate.config import ConfigError, RecipeConfig, RunConfig, run_id, to_dict
from ablate.rl import losses, stats
from ablate.rl.advantages import compute_advantages
from ablate.rl.divergence import Diverged, check_finite, check_parameters, overflow_is_divergence
from ablate.rl.rewards import format_weight_at, overlong_penalty
from ablate.rl.sampling import EVAL, SAMPLER, TRAIN, Rollout, RowNoise
from ablate.rl.schedules import at_step
from ablate.runs.store import RunStore
from ablate.tasks import make_task, score_batch, task_labels
from ablate.tasks.base import Problem
from ablate.tasks.mixture import per_task_eval, per_task_train
from ablate.train import distributed, execution, offpolicy, preemption, preflight, recipes, sharding
from ablate.train.critic import build_critic, critic_state
from ablate.train.data import PromptSampler
from ablate.train.difficulty import band_filter
from ablate.train.rollout import LMPolicy, RolloutEngine

# --- set-up -----------------------------------------------------------------------------------------

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' but this machine has no usable CUDA device; allowed values: 'auto' "
                          "(CUDA when there is one), 'cpu'")
    return torch.device(name)


def build_policy(cfg: RunConfig, task, device: torch.device):
    if cfg.task.name == "toy_addition":
        from ablate.tasks.toy import build_policy as build_toy_policy

        return build_toy_policy(task)
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


def build_engine(cfg: RunConfig, policy) -> RolloutEngine:
    """What samples the training rollouts: today the policy itself (HF KV-cache loop, toy table). An
    inference engine with its own weights (vLLM, docs/offpolicy.md) would be chosen here."""
    return policy


class NormalizedSGD(torch.optim.Optimizer):
    """A step of length lr along the globally normalised gradient: compares estimators on direction only.
    No step when the global norm is <= min_norm (> 0)."""

    def __init__(self, params, lr: float, min_norm: float = 0.0):
        super().__init__(params, dict(lr=lr))
        self.min_norm = min_norm

    @torch.no_grad()
    def step(self):
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        if self.min_norm and float(norm) <= self.min_norm:
            return
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
        "normalized_sgd": lambda: NormalizedSGD(params, lr=o.lr, min_norm=o.min_grad_norm),
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

    drops_dead_groups = False  # the uniform stream: nothing to filter, nothing to observe

    def observe(self, indices: list[int], pass_rates: list[float]) -> None:
        pass


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
    texts, f64 = rollout.texts, torch.float64  # float64: a reward offset must cancel exactly in r - baseline
    correct = torch.tensor(score_batch(task, [problems[i // group] for i in range(len(texts))], texts, train=True),
                           dtype=f64)
    fmt = torch.tensor([task.format_score(t) for t in texts], dtype=f64) if r.format_weight \
        else torch.zeros(len(texts), dtype=f64)
    if r.overlong == "soft_penalty":
        over = overlong_penalty(rollout.lengths.cpu(), r.max_new_tokens, r.overlong_buffer, r.overlong_factor).to(f64)
    else:
        over = torch.zeros(len(texts), dtype=f64)
    shape = (len(problems), group)
    total = correct + fmt_weight * fmt + over
    return total.view(shape), correct.view(shape), fmt.view(shape), over.view(shape)


def greedy_rewards(policy, task, problems: list[Problem], r: RecipeConfig, tokenizer, fmt_weight: float) -> torch.Tensor:
    """ReMax's baseline: the task reward of one greedy decode per prompt, [B] (each rank decodes its share)."""
    def decode(part: slice) -> torch.Tensor:
        g = policy.sample([task.prompt_text(p, tokenizer) for p in problems[part]], 1, 1.0, r.max_new_tokens,
                          greedy=True)
        return task_rewards(task, problems[part], g, r, 1, fmt_weight)[0].flatten()
    return torch.cat(distributed.map_shards(len(problems), decode))


def sample_groups(policy, task, problems: list[Problem], cfg: RunConfig, tokenizer, fmt_weight: float,
                  key: tuple[int, ...]):
    """G completions for each of `problems` and their rewards (task_rewards' four [B, G] tensors and the
    strict verifier's [B, G]): each rank samples its share of the groups with the row noise of `key`, then
    all ranks hold everything. Returns (rollout, total, correct, fmt, overlong, strict, reward seconds)."""
    r, G = cfg.recipe, cfg.recipe.group_size
    seconds = [0.0]

    def mine(part: slice):
        noise = RowNoise(key, len(problems) * G, part.start * G, part.stop * G)
        ro = policy.sample([task.prompt_text(p, tokenizer) for p in problems[part]], G, r.temperature,
                           r.max_new_tokens, noise=noise)
        t1 = time.perf_counter()
        total, correct, fmt, over = task_rewards(task, problems[part], ro, r, G, fmt_weight)
        strict = torch.tensor(score_batch(task, [p for p in problems[part] for _ in range(G)], ro.texts,
                                          train=False)).view(-1, G)
        seconds[0] = time.perf_counter() - t1
        return ro, total, correct, fmt, over, strict

    parts = distributed.map_shards(len(problems), mine)
    ro = Rollout.cat([p[0] for p in parts], policy.pad_id)
    ro = distributed.to_device(ro, policy.device) if distributed.world() > 1 else ro  # tensors keep their device
    return (ro, *(torch.cat([p[i] for p in parts]) for i in range(1, 6)), seconds[0])


def collect(policy, task, train: list[Problem], stream: PromptStream, cfg: RunConfig, tokenizer,
            fmt_weight: float, step: int = 0) -> Batch:
    """Sample G completions for B prompts; with dynamic sampling keep only groups with reward spread,
    drawing new prompts until B live groups or `max_gen_rounds` rounds (DAPO). Sampling noise is keyed
    by (seed, step, round) and indexed by the global row (every rank draws the same prompts)."""
    r, B = cfg.recipe, cfg.prompts_per_step
    rounds_allowed = r.max_gen_rounds if r.dynamic_sampling else 1
    kept: list[Batch] = []
    all_rewards, all_strict = [], []
    rounds, t_gen, t_reward = 0, 0.0, 0.0
    while rounds < rounds_allowed and sum(len(b.problems) for b in kept) < B:
        idx = stream.take(B)  # recipe.data_policy (ablate/rl/data_policy.py)
        problems = [train[i] for i in idx]
        t0 = time.perf_counter()
        ro, total, correct, fmt, over, strict, seconds = sample_groups(policy, task, problems, cfg, tokenizer,
                                                                       fmt_weight, (cfg.seed, step, rounds, TRAIN))
        t_gen, t_reward = t_gen + time.perf_counter() - t0 - seconds, t_reward + seconds
        all_rewards.append(total)
        all_strict.append(strict)
        stream.observe(idx, (strict >= 1).float().mean(1).tolist())
        rounds += 1
        live = torch.arange(len(problems))
        if r.dynamic_sampling or stream.drops_dead_groups:
            spread = torch.nonzero(total.max(1).values > total.min(1).values).flatten()
            live = spread if r.dynamic_sampling or len(spread) else live  # all dead: a no-op update instead
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
    at most `budget` tokens (0: `chunk` rows at a time); 0 after each completion's end. Each rank scores
    its share of the rows; all ranks get all of them."""
    return sequence_scores(policy, rollout, temperature, budget, chunk)[0]


@torch.no_grad()
def sequence_scores(policy, rollout: Rollout, temperature: float, budget: int = 0, chunk: int = 256,
                    entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sequence_logprobs` and, with `entropy`, the per-token entropies [N, T] of the same forward (else None)."""
    N, T = rollout.completion_ids.shape
    rows = torch.arange(N)[distributed.split(N)]
    out = rollout.completion_mask.new_zeros(len(rows), T)  # the loss dtype (float64 for the chapter toy)
    ent = out.clone() if entropy else None
    with distributed.failing_together():
        for idx, sub in execution.micro_batches(rollout, rows, budget, max_rows=chunk) if len(rows) else ():
            logp, h = execution.token_scores(policy, sub, temperature, "value" if entropy else "none")  # [n, t]
            at = (idx - rows[0]).to(out.device)
            out = out.to(logp.dtype)
            out[at, :logp.shape[1]] = logp
            if entropy:
                ent = ent.to(h.dtype)
                ent[at, :h.shape[1]] = h
    return distributed.gather_rows(out), distributed.gather_rows(ent) if entropy else None


# --- update ----------------------------------------------------------------------------------------

def update(policy, ref_logp, old_logp, batch: Batch, adv: torch.Tensor, loss_mask: torch.Tensor,
           optimizer, cfg: RunConfig, step: int = 0, kl_coef: float | None = None,
           is_weights: torch.Tensor | None = None, selected: torch.Tensor | None = None
           ) -> tuple[dict[str, float], torch.Tensor]:
    """`update_epochs` passes over the rollout in `minibatches` optimizer steps (PPO-style), each
    accumulated over micro-batches of at most `compute.micro_batch_tokens` tokens. Every aggregation's
    normaliser belongs to the whole minibatch, so the accumulated gradient is the one-pass gradient.
    `is_weights` [N,T] multiply the per-token policy loss (behaviour -> old correction, rl/corrections.py);
    `selected` [N,T] are the tokens `token_selection` keeps (fixed for the step; None = all). Batch-level
    selections (top-entropy, Clip-Cov / KL-Cov) never depend on the micro-batch split.
    Several ranks: each back-propagates its share of every minibatch's rows and the gradients are summed
    (ablate/train/distributed.py); the normalisers stay the whole minibatch's, so the sum is the same.
    Returns the logged means and the first epoch's detached token log-probs [N, T] (on-policy: pi_old's)."""
    r = cfg.recipe
    kl_coef = r.kl_coef if kl_coef is None else kl_coef  # adaptive when recipe.kl_target is set
    agg = losses.AGGREGATIONS[r.loss_agg]
    loss_fn, loss_params = losses.POLICY_LOSSES[r.policy_loss], recipes.policy_loss_params(r, cfg.seed, step)
    entropy_mode = "grad" if r.entropy_coef else "value"
    N = len(batch.rollout)
    params = [p for p in policy.module.parameters() if p.requires_grad]
    logs: dict[str, list[float]] = {}
    first_logp = loss_mask.new_zeros(loss_mask.shape)  # [N, T] epoch 0's detached log-probs (pi_old on-policy)
    for epoch in range(r.update_epochs):
        for idx in torch.randperm(N).split(math.ceil(N / r.minibatches)):
            optimizer.zero_grad(set_to_none=True)
            whole_mask = loss_mask[idx]
            parts, scores = [], []  # per micro-batch: logged values; detached token scores
            mine = idx[distributed.split(len(idx))]  # this rank's rows of the minibatch (all of them at world 1)
            micro = list(execution.micro_batches(batch.rollout, mine, cfg.compute.micro_batch_tokens)) \
                if len(mine) else []
            # Clip-Cov / KL-Cov select over the whole minibatch, whatever this rank's and micro-batches' share
            whole = micro if distributed.world() == 1 else \
                list(execution.micro_batches(batch.rollout, idx, cfg.compute.micro_batch_tokens))
            cov_sel = recipes.covariance_selection(r, loss_params, policy, whole, old_logp, adv, loss_mask,
                                                   split=distributed.world() > 1)
            with distributed.failing_together():  # a rank's error (Diverged too) reaches every rank
                for mb, sub in micro:
                    logp, ent_tok = execution.token_scores(policy, sub, r.temperature, entropy_mode)  # [n, t]
                    check_finite("log-probabilities (logits)", logp)
                    t = logp.shape[1]
                    mask = loss_mask[mb, :t]
                    old = old_logp[mb, :t] if old_logp is not None else logp.detach()  # on-policy: ratio 1
                    a = adv[mb] if adv.dim() == 1 else adv[mb, :t]  # [n] or per token [n, t] (REINFORCE++)
                    keep = selected[mb, :t] if selected is not None else None
                    weight = recipes.token_weight(r, ent_tok, mask, is_weights[mb, :t] if is_weights is not None else None,
                                                  keep)
                    loss_policy, clip = loss_fn(logp, old, a, mask, agg=r.loss_agg, max_len=r.max_new_tokens,
                                                **loss_params, **weight,
                                                **({"selected": cov_sel[mb, :t]} if cov_sel is not None else {}))
                    if r.pos_nll_coef:  # VAPO's NLL term on positive-advantage samples
                        loss_policy = loss_policy + r.pos_nll_coef * losses.raft(
                            logp, old, a, mask, agg=r.loss_agg, max_len=r.max_new_tokens)[0]
                    loss = loss_policy
                    kl = torch.zeros(())
                    if ref_logp is not None:
                        kl = agg(losses.KL_ESTIMATORS[r.kl_estimator](logp, ref_logp[mb, :t]), mask, r.max_new_tokens)
                        if r.kl_placement == "loss":
                            loss = loss + kl_coef * kl
                    entropy = agg(ent_tok, mask, r.max_new_tokens)
                    if r.entropy_coef:  # with token selection the bonus is on the kept tokens (same denominators)
                        bonus = entropy if keep is None else agg(ent_tok * keep, mask, r.max_new_tokens)
                        loss = loss - r.entropy_coef * bonus
                    if not torch.isfinite(loss):
                        raise Diverged(f"loss is {loss.item()} at epoch {epoch}")
                    w = losses.micro_weight(r.loss_agg, mask, whole_mask, r.max_new_tokens, loss.dtype)
                    (loss * w).backward()
                    w_tok = mask.bool().sum() / whole_mask.bool().sum().clamp(min=1)
                    parts.append((w, w_tok, {"loss": loss, "loss_policy": loss_policy, "loss_kl": kl,
                                             "loss_entropy": entropy, **clip}))
                    scores.append((logp.detach(), old, ent_tok.detach()))
            params = sharding.reduce_gradients(policy.module, params)  # ranks' sum; a NaN reaches every rank
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip or float("inf"))
            check_finite("gradient norm", grad_norm)
            with overflow_is_divergence("optimizer step"):
                optimizer.step()
            # batch-level diagnostics (a covariance over all tokens) from the whole minibatch's token scores
            lp, old_lp, ent = (distributed.gather_rows(
                execution.join_columns([sc[i] for sc in scores], whole_mask.shape[1]) if scores
                else whole_mask.new_zeros(0, whole_mask.shape[1])) for i in range(3))
            row = {**distributed.reduce_stats(execution.combine_stats(parts, SUMMED)), "grad_norm": grad_norm,
                   **losses.policy_diagnostics(lp, old_lp, adv[idx], whole_mask, ent)}
            if epoch == 0:  # entropy and KL describe the rollout policy: first pass only
                row["entropy"], row["kl"] = row["loss_entropy"], row["loss_kl"]
                first_logp[idx.to(first_logp.device)] = lp.to(first_logp.dtype)
            for k, v in row.items():
                logs.setdefault(k, []).append(float(torch.as_tensor(v).detach()))
    out = {k: float(np.mean(v)) for k, v in logs.items()}
    out["ratio_max"] = float(np.max(logs["ratio_max"]))
    return out, first_logp


SUMMED = ("loss", "loss_policy", "loss_kl", "loss_entropy")  # aggregated terms: micro-batches add up


# --- evaluation ------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate(policy, task, heldout: list[Problem], cfg: RunConfig, tokenizer, chunk: int = 64, step: int = 0,
             repeat: int = 0):
    """Held-out pass@k (strict verifier, n samples at eval temperature), greedy accuracy, samples, and the
    correct count of each problem ([M]). Sampling noise is keyed by (seed, step, chunk, repeat > 0), so
    repeat 0 is what a single evaluation samples and training never depends on eval.repeats; each rank
    samples its share of a chunk's problems."""
    e, n = cfg.eval, cfg.eval.n_samples
    counts, rewards, lengths, greedy, samples, answers, oks = [], [], [], [], [], [], []
    # maj@k votes over the task's extracted answers; a task without `extract` votes on the verifier
    # outcome: every correct sample counts as one answer, each wrong one as its own stripped text
    extract = getattr(task, "extract", None)
    for start in range(0, len(heldout), chunk):
        probs = heldout[start:start + chunk]
        prompts = [task.prompt_text(p, tokenizer) for p in probs]
        key = (cfg.seed, step, start, EVAL) + ((repeat,) if repeat else ())
        ro, scores, g_ok = eval_chunk(policy, task, probs, prompts, cfg, key)
        counts += (scores >= 1).sum(1).tolist()
        oks += (scores >= 1).tolist()
        answers += [[extract(t) if extract else ("<correct>" if ok else t.strip())
                     for t, ok in zip(ro.texts[i * n:(i + 1) * n], (scores[i] >= 1).tolist())]
                    for i in range(len(probs))]
        rewards.append(scores.flatten())
        lengths.append(ro.lengths.cpu())
        greedy += g_ok
        if start == 0:
            samples = [{"split": "heldout", "prompt": prompts[i], "completion": ro.texts[i * n],
                        "reward": float(scores[i, 0]), "correct": bool(scores[i, 0] >= 1)}
                       for i in range(min(e.num_samples_logged, len(probs)))]
    row = {f"eval/pass@{k}": stats.mean_pass_at_k(counts, n, k) for k in e.ks}
    row.update({f"eval/maj@{k}": stats.mean_maj_at_k(answers, oks, k) for k in e.ks})
    row.update(per_task_eval(task_labels(task, heldout), counts, n, e.ks))  # task mixtures only
    row.update({
        "eval/greedy_acc": float(np.mean(greedy)),
        "eval/reward_mean": float(torch.cat(rewards).mean()),
        "eval/completion_len_mean": float(torch.cat(lengths).float().mean()),
        "eval/frac_never_solved": float(np.mean([c == 0 for c in counts])),
        "eval/frac_always_solved": float(np.mean([c == n for c in counts])),
    })
    if hasattr(policy, "exact_pass1"):
        row["eval/pass@1_exact"] = policy.exact_pass1(heldout)
    return row, samples, counts


def evaluate_repeats(policy, task, heldout: list[Problem], cfg: RunConfig, tokenizer, step: int):
    """`eval.repeats` evaluations: their mean row (one repeat: its row as is), the samples of repeat 0, and
    one `eval_problems` row per repeat (docs/run-folders.md): every problem's correct count out of n."""
    done = [evaluate(policy, task, heldout, cfg, tokenizer, step=step, repeat=r) for r in range(cfg.eval.repeats)]
    rows, ids = [row for row, _, _ in done], [p.id for p in heldout]
    problems = [{"repeat": r, "n": cfg.eval.n_samples, "problems": ids, "correct": counts}
                for r, (_, _, counts) in enumerate(done)]
    mean = rows[0] if len(rows) == 1 else {k: float(np.mean([x[k] for x in rows])) for k in rows[0]}
    return mean, done[0][1], problems


def eval_chunk(policy, task, probs: list[Problem], prompts: list[str], cfg: RunConfig, key: tuple[int, ...]):
    """n samples of each problem with the row noise of `key`, their strict scores [B, n] and the greedy
    decodes' correctness [B]; each rank samples its share, all ranks get everything."""
    n, max_new = cfg.eval.n_samples, cfg.recipe.max_new_tokens

    def mine(part: slice):
        noise = RowNoise(key, len(probs) * n, part.start * n, part.stop * n)
        ro = policy.sample(prompts[part], n, cfg.eval.temperature, max_new, noise=noise)
        scores = torch.tensor(score_batch(task, [p for p in probs[part] for _ in range(n)], ro.texts, train=False))
        g = policy.sample(prompts[part], 1, 1.0, max_new, greedy=True)
        return ro, scores.view(-1, n), [task.score(p, t) >= 1 for p, t in zip(probs[part], g.texts)]

    parts = distributed.map_shards(len(probs), mine)
    ro = Rollout.cat([p[0] for p in parts], policy.pad_id)
    return ro, torch.cat([p[1] for p in parts]), [ok for p in parts for ok in p[2]]


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
        **{k if "/" in k else f"train/{k}": v for k, v in up.items()},  # e.g. policy/entropy_adv_cov as is
        "train/adv_abs_max": float(adv.abs().max()),
        "train/terminated_len_mean": float(lengths[~batch.rollout.truncated].float().mean()),  # NaN if none
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
    state: completed, diverged, pruned or failed (failed also re-raises; so does cancelled, by
    SIGTERM or Ctrl-C). `should_prune(step, eval_row)`
    is asked after every held-out evaluation (Optuna's report/should_prune); True stops the run as pruned."""
    from ablate.runs.tracking import open_mirrors

    preflight.check(cfg)  # every file the run reads, before the run folder is written (cached per file version)
    distributed.init_from_env(resolve_device(cfg.device), cfg.compute.collective_timeout_s)  # WORLD_SIZE > 1
    store = distributed.open_store(out_dir)  # rank 0 writes the run folder; the other ranks only read it
    store.claim(run_id(cfg))  # another run's folder, unknown run files or a foreign checkpoint: RunFolderError
    with distributed.failing_together():
        store.lock()  # one writer: rank 0 holds the folder for the run's life (RunFolderError names the holder)
    status = store.status()
    if status and status["state"] in ("completed", "diverged", "pruned"):
        store.unlock()
        return status["state"]
    store.write_config(cfg)
    device = resolve_device(cfg.device)
    store.write_provenance(cfg, str(device), sampler=SAMPLER, world_size=distributed.world())
    store.mirrors = open_mirrors(cfg, store.root) if distributed.is_main() else []  # W&B (docs/tracking.md)
    state = "failed"
    try:
        store.set_status("running", (status or {}).get("step", 0))
        with preemption.stop_on_signals():  # SIGTERM, SIGHUP end the run `cancelled`, not `running` forever
            state = _train(cfg, store, device, progress, should_prune)
        return state
    except Diverged as err:  # found outside the update (sampling, evaluation): the step in flight diverged
        state = "diverged"
        store.set_status("diverged", (store.status() or {}).get("step", 0) + 1, str(err))
        return state
    except (preemption.Stopped, KeyboardInterrupt) as err:  # SIGTERM, Ctrl-C, a dead sweep launcher
        state = "cancelled"
        store.set_status("cancelled", (store.status() or {}).get("step", 0), preemption.stop_reason(err))
        raise
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
    train_set, heldout = band_filter(cfg, task.problems("train")), task.problems("heldout")  # task.pass_rate_band
    policy = build_policy(cfg, task, device)
    tokenizer = getattr(policy, "tokenizer", None)
    # the reference exists only when KL is on
    ref = execution.reference_policy(policy) if r.kl_coef > 0 else None
    optimizer, scheduler = sharding.prepare(policy, cfg, make_optimizer)  # compute.parallel='fsdp': sharded first
    # a policy with its own random stream (the chapter toy) draws its prompts and sampling noise from it
    stream = policy.prompt_stream(cfg) if hasattr(policy, "prompt_stream") else PromptSampler(len(train_set), cfg)
    kl_state = recipes.KLState(r.kl_coef)
    step, counters, wall, since_eval = 0, {"samples": 0, "tokens": 0}, 0.0, []
    pending = offpolicy.Pending()  # sampled batches not yet trained on: the staleness FIFO (k deep)

    # a log that lost rows of the checkpoint's steps (torn tail): start again, so each step is logged once
    ckpt = store.load_checkpoint(run_id(cfg)) if distributed.on_main(store.logs_cover_checkpoint) else None
    critic = build_critic(cfg, policy, ckpt)  # PPO's value model (recipe.adv_whiten='gae'), else None
    if ckpt is not None:  # resume: restore everything, forget what was logged after the checkpoint
        sharding.load_checkpoint_state(policy.module, optimizer, ckpt)  # model and optimizer
        scheduler.load_state_dict(ckpt["scheduler"])
        torch.set_rng_state(ckpt["rng"])
        if "kl_state" in ckpt:
            kl_state = recipes.KLState(**ckpt["kl_state"])
        if "ref" in ckpt:  # a reset reference is no longer the base model
            ref.module.load_state_dict(ckpt["ref"])
        step, counters, wall, since_eval = (ckpt[k] for k in ("step", "counters", "wall", "since_eval"))
        stream.load_state_dict(ckpt["stream"])
        pending = offpolicy.pending_from_state(ckpt.get("pending", []), Batch)
        store.truncate_after(step)
        store.note_resume(step)
    else:
        store.truncate_after(-1)
        ev, samples, problems = evaluate_repeats(policy, task, heldout, at_step(cfg, 0), tokenizer, 0)
        log_eval(store, 0, ev, samples, None, problems)

    engine = build_engine(cfg, policy)  # after any resume: it starts from the restored weights
    needs_old_logp = recipes.ratio_can_leave_one(r)
    bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                   TimeRemainingColumn(), disable=not (progress and distributed.is_main()))
    bar_task = bar.add_task("", total=cfg.steps, completed=step)
    start = time.perf_counter() - wall

    def save_checkpoint() -> None:  # the state at the last step boundary
        store.save_checkpoint({
            **sharding.checkpoint_state(policy.module, optimizer),  # model, optimizer (fsdp: gathered)
            "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "stream": stream.state_dict(),
            "step": step, "counters": counters, "wall": time.perf_counter() - start,
            "since_eval": since_eval, "config": to_dict(cfg), "pending": offpolicy.pending_state(pending),
            "kl_state": kl_state.state_dict(), **({"ref": ref.module.state_dict()} if r.ref_reset_every else {}),
            **critic_state(critic)},
            run_id(cfg))

    with bar, preemption.guard(save_checkpoint, collective=sharding.is_sharded(policy.module)):
        while step < cfg.steps:
            with preemption.step():  # a SLURM warning signal waits for the step to end
                step += 1
                t0 = time.perf_counter()
                cfg_t = at_step(cfg, step)  # recipe.temperature / max_new_tokens schedules resolved (rl/schedules.py)
                r = cfg_t.recipe
                # 1. rollout + reward (dynamic sampling inside), `staleness` batches ahead of the update; a batch
                # is sampled with the schedule values of the step that will train on it
                fmt_weight = format_weight_at(r.format_weight, r.format_anneal_steps, step)
                while len(pending) <= r.staleness and step - 1 + len(pending) < cfg.steps:
                    ahead = step + len(pending)
                    cfg_ahead = at_step(cfg, ahead)
                    fmt_ahead = format_weight_at(r.format_weight, r.format_anneal_steps, ahead)
                    fresh = collect(engine, task, train_set, stream, cfg_ahead, tokenizer, fmt_ahead, ahead)
                    greedy = greedy_rewards(engine, task, fresh.problems, cfg_ahead.recipe, tokenizer, fmt_ahead) \
                        if r.baseline == "greedy" else None
                    pending.append((fresh, greedy, step - 1))
                batch, greedy, version = pending.popleft()  # sampled by the policy after `version` updates
                t1 = time.perf_counter()
                # 2. old (pi_old, recomputed now: the PPO anchor; on-policy the update's first forward is
                # pi_old instead: recipes.needs_old_pass) and reference log-probs
                budget = cfg.compute.micro_batch_tokens
                old_logp, old_ent = sequence_scores(policy, batch.rollout, r.temperature, budget,
                                                    entropy=recipes.needs_entropies(r)) \
                    if recipes.needs_old_pass(r) else (None, None)  # old_ent: top-entropy
                ref_logp = sequence_logprobs(ref, batch.rollout, r.temperature, budget) if ref is not None else None
                mask = batch.rollout.completion_mask
                rewards = batch.rewards
                kl_reward, kl_tok = torch.zeros_like(rewards), None
                if ref is not None and r.kl_placement == "reward":  # PPO/REINFORCE++: KL as a reward term
                    kl_tok = losses.KL_ESTIMATORS[r.kl_estimator](old_logp, ref_logp)
                    kl_reward = kl_state.coef * (kl_tok * mask).sum(-1).view_as(rewards).cpu()
                    rewards = rewards - kl_reward
                t2 = time.perf_counter()
                # 3. advantages, one per completion broadcast to its tokens (or per token: recipe.adv_whiten)
                adv = compute_advantages(rewards, baseline=r.baseline, scale=r.scale, ddof=r.std_ddof, eps=r.std_eps,
                                         greedy_rewards=greedy).flatten().to(mask.device, mask.dtype)
                loss_mask = mask * (~batch.rollout.truncated).float()[:, None] if r.overlong == "mask" else mask
                # behaviour -> old: IS weights, and rejected tokens leave the mask before any denominator
                is_weights, kept, is_stats = offpolicy.correct(r, old_logp, batch.rollout.behav_logp, loss_mask)
                mismatch_mask, loss_mask = loss_mask, kept
                # token-level advantages: whitened (recipe.adv_whiten), or GAE from the critic after fitting it
                adv, critic_row = critic.step(batch.rollout, batch.rewards, kl_tok, kl_state.coef, loss_mask, cfg_t,
                                              step) if critic else \
                    (recipes.whiten_advantages(adv, r, batch.rewards, kl_tok, loss_mask, kl_state.coef), {})
                adv = recipes.shape_advantages(adv, r)
                # 4. update (pi_old is the ratio's anchor only when the ratio can leave 1)
                try:
                    up, first_logp = update(policy, ref_logp, old_logp if needs_old_logp else None, batch, adv,
                                            loss_mask, optimizer, cfg_t, step, kl_state.coef, is_weights,
                                            recipes.select_tokens(r, old_ent, loss_mask))
                    check_parameters(policy.module)
                except Diverged as err:
                    store.set_status("diverged", step, str(err))
                    return "diverged"
                off = offpolicy.step_metrics(first_logp if old_logp is None else old_logp, batch.rollout.behav_logp,
                                             mismatch_mask, is_weights, kept.bool(), is_stats, lag=step - 1 - version)
                kl_row = recipes.end_of_step(r, kl_state, step, up["kl"], len(batch.rollout), policy, ref, optimizer) \
                    if ref is not None else {}
                lr = scheduler.get_last_lr()[0]
                scheduler.step()
                engine.sync_weights(policy.module, step)  # the sampler gets the weights of update `step`
                t3 = time.perf_counter()
                # 5. log
                lengths = batch.rollout.lengths
                counters["samples"] += len(batch.rollout)
                counters["tokens"] += int(lengths.sum())
                since_eval.append(float(batch.correct.mean()))
                adv_row = recipes.per_completion(adv)  # [N] for the logs
                row = {**step_metrics(batch, rewards, kl_reward, adv_row, mask, up), **off, "train/lr": lr,
                       "train/format_weight": fmt_weight, **kl_row, **stream.metrics(),
                       "train/temperature": r.temperature, "train/max_new_tokens": r.max_new_tokens,
                       **per_task_train(task_labels(task, batch.problems), batch.correct),
                       "counters/samples": counters["samples"], "counters/tokens": counters["tokens"],
                       "perf/wall_seconds": time.perf_counter() - start, "perf/step_seconds": t3 - t0,
                       "perf/generate_seconds": t1 - t0 - batch.reward_seconds,
                       "perf/reward_seconds": batch.reward_seconds,
                       "perf/logprob_seconds": t2 - t1, "perf/update_seconds": t3 - t2,
                       "perf/gen_tokens_per_s": float(lengths.sum()) / max(batch.generate_seconds, 1e-9),
                       "perf/train_tokens_per_s": float(lengths.sum()) * r.update_epochs / max(t3 - t2, 1e-9),
                       **critic_row}
                store.append("metrics", {"step": step, **row})
                if cfg.eval.every and step % cfg.eval.every == 0 or step == cfg.steps:
                    ev, samples, problems = evaluate_repeats(policy, task, heldout, cfg_t, tokenizer, step)
                    samples += train_samples(task, batch, rewards, adv_row, cfg, tokenizer)
                    log_eval(store, step, ev, samples, float(np.mean(since_eval)), problems)
                    since_eval = []
                    # several ranks: rank 0 asks (Optuna's trial lives there), every rank stops with it
                    if step < cfg.steps and distributed.on_main(lambda: should_prune is not None
                                                                and should_prune(step, ev)):
                        store.set_status("pruned", step)
                        return "pruned"
                store.set_status("running", step)
                if step == cfg.steps or cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    save_checkpoint()  # always the last step's: a completed run keeps its final weights
                bar.update(bar_task, completed=step,
                           description=f"reward {row['train/reward_mean']:.3f} dead {row['train/dead_group_frac']:.2f}")
    store.set_status("completed", step)
    return "completed"


def log_eval(store: RunStore, step: int, row: dict, samples: list[dict], train_reward: float | None,
             problems: list[dict] = ()) -> None:
    if train_reward is not None:
        row = {**row, "eval/train_minus_heldout_reward": train_reward - row["eval/reward_mean"]}
    store.append("evals", {"step": step, **row})
    for s in samples:
        store.append("samples", {"step": step, **s})
    for q in problems:
        store.append("eval_problems", {"step": step, **q})
