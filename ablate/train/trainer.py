"""The shared trainer: one loop, read top to bottom.

    set_up, resume from the checkpoint or start, build the rollout engine (the held-out evaluation before
    training when starting); per step:
        plan = plan_step(cfg, step)         the recipe resolved for this step (ablate/train/plan.py)
        1. sample       rollouts (or multi-turn episodes) and their task reward (dynamic sampling; `staleness`
                        batches ahead)
        2. score        pi_old and reference log-probs; the KL term in the reward
        3. advantages   advantages; the tokens the loss counts (IS correction) and their weights
        4. optimize     the update epochs; the KL controller, the lr schedule, the rollout engine's weights
        5. log          metrics; held-out evaluation and checkpoint on schedule

The loop follows the plan and reads no recipe toggle itself; the math lives in ablate.rl.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ablate.config import RunConfig, run_id, to_dict
from ablate.rl import stats
from ablate.rl.divergence import Diverged, check_parameters
from ablate.rl.rewards import overlong_penalty
from ablate.rl.sampling import SAMPLER, TRAIN, Rollout, RowNoise
from ablate.runs.store import FINISHED, RunState, RunStore
from ablate.tasks import make_task, score_batch, task_labels
from ablate.tasks.base import Problem
from ablate.tasks.mixture import per_task_train
from ablate.train import distributed, episodes, execution, offpolicy, preemption, preflight, recipes, sharding
from ablate.train.critic import Critic, build_critic, critic_state
from ablate.train.data import PromptSampler
from ablate.train.difficulty import band_filter
from ablate.train.evaluation import evaluate_repeats, log_eval
from ablate.train.models import build_policy, resolve_device
from ablate.train.optim import make_optimizer
from ablate.train.plan import Sampling, StepPlan, plan_step
from ablate.train.rollout import RolloutEngine
from ablate.train.update import sequence_logprobs, sequence_scores, update

# --- set-up and resume ------------------------------------------------------------------------------

def build_engine(cfg: RunConfig, policy) -> RolloutEngine:
    """What samples the rollouts, training and held-out (`rollout.engine`): the policy itself (HF KV-cache
    loop, toy table), or vLLM in this process with its own copy of the weights (train/vllm_engine.py)."""
    if cfg.rollout.engine == "vllm":
        from ablate.train.vllm_engine import VLLMEngine

        return VLLMEngine(policy, cfg)
    return policy


@dataclass
class Run:
    """What a run holds from step to step: built by `set_up`, restored by `resume`, saved by `save_checkpoint`."""

    cfg: RunConfig
    task: object
    train_set: list[Problem]
    heldout: list[Problem]
    policy: object                    # what is trained (LMPolicy, or the toy's table)
    ref: object | None                # the frozen KL reference (None: no KL term)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    stream: object                    # the prompt sampler (recipe.data_policy), or the chapter toy's own stream
    critic: Critic | None             # PPO's value model (None: no critic)
    kl: recipes.KLState               # the KL coefficient in use and the reference resets
    engine: RolloutEngine | None = None  # what samples the rollouts (`build_engine`, after any resume)
    pending: offpolicy.Pending = field(default_factory=offpolicy.Pending)  # sampled, not yet trained on
    step: int = 0                     # optimizer steps done
    counters: dict = field(default_factory=lambda: {"samples": 0, "tokens": 0})
    since_eval: list[float] = field(default_factory=list)  # training correctness since the last evaluation
    wall: float = 0.0                 # seconds trained before this process (a resumed run)
    start: float = 0.0                # perf_counter() at which this run's wall clock reads 0

    @property
    def tokenizer(self):
        return getattr(self.policy, "tokenizer", None)


def set_up(cfg: RunConfig, device: torch.device) -> Run:
    """Everything a fresh run starts from; what it builds (the reference, the critic) the plan says."""
    execution.apply(cfg.compute)
    torch.manual_seed(cfg.seed)
    setup = plan_step(cfg, 0)
    task = make_task(cfg.task)
    train_set, heldout = band_filter(cfg, task.problems("train")), task.problems("heldout")  # task.pass_rate_band
    policy = build_policy(cfg, task, device)
    ref = execution.reference_policy(policy) if setup.kl else None
    optimizer, scheduler = sharding.prepare(policy, cfg, make_optimizer)  # compute.parallel='fsdp': sharded first
    # a policy with its own random stream (the chapter toy) draws its prompts and sampling noise from it
    stream = policy.prompt_stream(cfg.seed, setup.sampling.group_size) if hasattr(policy, "prompt_stream") \
        else PromptSampler(len(train_set), cfg)
    return Run(cfg, task, train_set, heldout, policy, ref, optimizer, scheduler, stream,
               critic=build_critic(cfg, setup, policy), kl=recipes.KLState(setup.kl.coef if setup.kl else 0.0))


def resume(run: Run, store: RunStore) -> bool:
    """Restore the run from its checkpoint, everything, and forget what was logged after it (True); or start
    it afresh with an empty log (False). A log that lost rows of the checkpoint's steps (a torn tail) starts
    afresh too, so that each step is logged once."""
    ckpt = store.load_checkpoint(run_id(run.cfg)) if distributed.on_main(store.logs_cover_checkpoint) else None
    if ckpt is None:
        store.truncate_after(-1)
        return False
    sharding.load_checkpoint_state(run.policy.module, run.optimizer, ckpt)  # model and optimizer
    run.scheduler.load_state_dict(ckpt["scheduler"])
    torch.set_rng_state(ckpt["rng"])
    if "kl_state" in ckpt:
        run.kl = recipes.KLState(**ckpt["kl_state"])
    if "ref" in ckpt:  # a reset reference is no longer the base model
        run.ref.module.load_state_dict(ckpt["ref"])
    if run.critic is not None:
        run.critic.load_state_dict(ckpt["critic"])
    run.step, run.counters, run.wall, run.since_eval = (ckpt[k] for k in ("step", "counters", "wall", "since_eval"))
    run.stream.load_state_dict(ckpt["stream"])
    run.pending = offpolicy.pending_from_state(ckpt.get("pending", []), Batch)
    store.truncate_after(run.step)
    store.note_resume(run.step)
    return True


def save_checkpoint(run: Run, store: RunStore) -> None:
    """The state at the last step boundary (the reference only once a reset has made it differ from the
    base model)."""
    store.save_checkpoint({
        **sharding.checkpoint_state(run.policy.module, run.optimizer),  # model, optimizer (fsdp: gathered)
        "scheduler": run.scheduler.state_dict(), "rng": torch.get_rng_state(), "stream": run.stream.state_dict(),
        "step": run.step, "counters": run.counters, "wall": time.perf_counter() - run.start,
        "since_eval": run.since_eval, "config": to_dict(run.cfg), "pending": offpolicy.pending_state(run.pending),
        "kl_state": run.kl.state_dict(), **({"ref": run.ref.module.state_dict()} if run.kl.resets else {}),
        **critic_state(run.critic)},
        run_id(run.cfg))


# --- 1. sample: rollouts and their task reward ----------------------------------------------------

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


def task_rewards(task, problems: list[Problem], rollout: Rollout, sampling: Sampling, group: int):
    """[B, group] tensors: total task reward (verifier + format weight * format + overlong) and its components."""
    texts, f64 = rollout.texts, torch.float64  # float64: a reward offset must cancel exactly in r - baseline
    correct = torch.tensor(score_batch(task, [problems[i // group] for i in range(len(texts))], texts, train=True),
                           dtype=f64)
    fmt = torch.tensor([task.format_score(t) for t in texts], dtype=f64) if sampling.scores_format \
        else torch.zeros(len(texts), dtype=f64)
    if sampling.overlong_penalty is not None:
        over = overlong_penalty(rollout.lengths.cpu(), sampling.max_new_tokens, *sampling.overlong_penalty).to(f64)
    else:
        over = torch.zeros(len(texts), dtype=f64)
    shape = (len(problems), group)
    total = correct + sampling.format_weight * fmt + over
    return total.view(shape), correct.view(shape), fmt.view(shape), over.view(shape)


def greedy_rewards(engine, task, problems: list[Problem], sampling: Sampling, tokenizer) -> torch.Tensor:
    """ReMax's baseline: the task reward of one greedy decode per prompt, [B] (each rank decodes its share)."""
    def decode(part: slice) -> torch.Tensor:
        g = engine.sample([task.prompt_text(p, tokenizer) for p in problems[part]], 1, 1.0, sampling.max_new_tokens,
                          greedy=True)
        return task_rewards(task, problems[part], g, sampling, 1)[0].flatten()
    return torch.cat(distributed.map_shards(len(problems), decode))


def sample_groups(engine, task, problems: list[Problem], sampling: Sampling, tokenizer, key: tuple[int, ...]):
    """G completions for each of `problems` and their rewards (task_rewards' four [B, G] tensors and the
    strict verifier's [B, G]): each rank samples its share of the groups with the row noise of `key`, then
    all ranks hold everything. Returns (rollout, total, correct, fmt, overlong, strict, reward seconds)."""
    G = sampling.group_size
    seconds = [0.0]

    def mine(part: slice):
        if episodes.is_env(task):  # multi-turn episodes; the environment's rewards come with them
            return episodes.sample_part(engine, task, problems[part], sampling, tokenizer, key, part.start * G,
                                        len(problems) * G)
        noise = RowNoise(key, len(problems) * G, part.start * G, part.stop * G)
        ro = engine.sample([task.prompt_text(p, tokenizer) for p in problems[part]], G, sampling.temperature,
                           sampling.max_new_tokens, noise=noise)
        t1 = time.perf_counter()
        total, correct, fmt, over = task_rewards(task, problems[part], ro, sampling, G)
        strict = torch.tensor(score_batch(task, [p for p in problems[part] for _ in range(G)], ro.texts,
                                          train=False)).view(-1, G)
        seconds[0] = time.perf_counter() - t1
        return ro, total, correct, fmt, over, strict

    parts = distributed.map_shards(len(problems), mine)
    ro = Rollout.cat([p[0] for p in parts], engine.pad_id)
    ro = distributed.to_device(ro, engine.device) if distributed.world() > 1 else ro  # tensors keep their device
    return (ro, *(torch.cat([p[i] for p in parts]) for i in range(1, 6)), seconds[0])


def collect(engine, task, train: list[Problem], stream, plan: StepPlan, tokenizer) -> Batch:
    """Sample G completions for B prompts; with dynamic sampling keep only groups with reward spread,
    drawing new prompts until B live groups or `sampling.rounds` rounds (DAPO). Sampling noise is keyed
    by (seed, step, round) and indexed by the global row (every rank draws the same prompts)."""
    s = plan.sampling
    kept: list[Batch] = []
    all_rewards, all_strict = [], []
    rounds, t_gen, t_reward = 0, 0.0, 0.0
    while rounds < s.rounds and sum(len(b.problems) for b in kept) < s.prompts:
        idx = stream.take(s.prompts)  # recipe.data_policy (ablate/rl/data_policy.py)
        problems = [train[i] for i in idx]
        t0 = time.perf_counter()
        ro, total, correct, fmt, over, strict, seconds = sample_groups(engine, task, problems, s, tokenizer,
                                                                       (plan.seed, plan.step, rounds, TRAIN))
        t_gen, t_reward = t_gen + time.perf_counter() - t0 - seconds, t_reward + seconds
        all_rewards.append(total)
        all_strict.append(strict)
        stream.observe(idx, (strict >= 1).float().mean(1).tolist())
        rounds += 1
        live = torch.arange(len(problems))
        if s.live_groups_only or stream.drops_dead_groups:
            spread = torch.nonzero(total.max(1).values > total.min(1).values).flatten()
            # all dead: a no-op update on them instead (dynamic sampling: once its last round has found no live
            # group at all; an empty batch has nothing to update on)
            last_chance = rounds == s.rounds and not any(len(b.problems) for b in kept)
            live = spread if len(spread) or (s.live_groups_only and not last_chance) else live
        rows = (live[:, None] * s.group_size + torch.arange(s.group_size)).flatten()
        kept.append(Batch([problems[i] for i in live.tolist()], ro.select(rows), total[live], correct[live],
                          fmt[live], over[live]))
    # trim to B groups (the last round may overshoot)
    problems = [p for b in kept for p in b.problems][:s.prompts]
    n = len(problems)
    rollout = Rollout.cat([b.rollout for b in kept], engine.pad_id).select(torch.arange(n * s.group_size))
    cat = lambda name: torch.cat([getattr(b, name) for b in kept])[:n]  # noqa: E731
    return Batch(problems, rollout, cat("rewards"), cat("correct"), cat("fmt"), cat("overlong"),
                 stats.group_stats(torch.cat(all_rewards), torch.cat(all_strict) >= 1), rounds, t_gen, t_reward)


def sample(run: Run, plan: StepPlan) -> tuple[Batch, torch.Tensor | None, int]:
    """The batch step `plan.step` trains on, the greedy rewards of its prompts (ReMax, else None) and the
    number of updates made before it was sampled. The sampler runs `plan.staleness` batches ahead of the
    update (ablate/train/offpolicy.py): each batch is sampled with the plan of the step that trains on it."""
    while len(run.pending) <= plan.staleness and plan.step - 1 + len(run.pending) < run.cfg.steps:
        ahead = plan_step(run.cfg, plan.step + len(run.pending))
        fresh = collect(run.engine, run.task, run.train_set, run.stream, ahead, run.tokenizer)
        greedy = greedy_rewards(run.engine, run.task, fresh.problems, ahead.sampling, run.tokenizer) \
            if ahead.sampling.greedy_baseline else None
        run.pending.append((fresh, greedy, plan.step - 1))
    run.engine.sleep()  # until the update's end: a GPU engine frees its KV cache for scoring and the update
    return run.pending.popleft()


# --- 2. score: the passes before the update, and the reward after KL --------------------------------

@dataclass
class Scored:
    """The rollout scored before the update, and its rewards after the KL term."""

    old_logp: torch.Tensor | None     # [N, T] under pi_old (None: no old pass; the update's first forward is pi_old)
    old_entropy: torch.Tensor | None  # [N, T] token entropies under pi_old (top-entropy selection)
    ref_logp: torch.Tensor | None     # [N, T] under the reference (KL on)
    kl_tok: torch.Tensor | None       # [N, T] per-token KL estimate of pi_old from the reference, KL in the reward
    kl_reward: torch.Tensor           # [B, G] the KL penalty taken out of each reward (0: KL in the loss, or off)
    rewards: torch.Tensor             # [B, G] task reward - kl_reward: what the advantages see


def loss_tokens(plan: StepPlan, rollout: Rollout) -> torch.Tensor:
    """[N, T] the completion tokens the loss counts, before any is dropped: of a single turn all of them; of a
    multi-turn episode the policy's, and its environment's replies too when the plan trains on them."""
    return rollout.completion_mask if plan.env_tokens_in_loss else rollout.policy_mask


def score(run: Run, plan: StepPlan, batch: Batch) -> Scored:
    """pi_old's log-probs (recomputed now: the PPO anchor; on-policy the update's first forward is pi_old
    instead, plan.old_pass) and the reference's; with KL in the reward (PPO, REINFORCE++) its per-token
    estimate and the rewards less its sum over the tokens the loss counts."""
    rollout, budget, temperature = batch.rollout, plan.micro_batch_tokens, plan.sampling.temperature
    old_logp, old_entropy = sequence_scores(run.policy, rollout, temperature, budget, entropy=plan.old_entropies) \
        if plan.old_pass else (None, None)
    ref_logp = sequence_logprobs(run.ref, rollout, temperature, budget) if plan.kl else None
    kl_tok, kl_reward, rewards = None, torch.zeros_like(batch.rewards), batch.rewards
    if plan.kl and plan.kl.in_reward:
        kl_tok = plan.kl.estimator(old_logp, ref_logp)
        kl_reward = run.kl.coef * (kl_tok * loss_tokens(plan, rollout)).sum(-1).view_as(rewards).cpu()
        rewards = rewards - kl_reward
    return Scored(old_logp, old_entropy, ref_logp, kl_tok, kl_reward, rewards)


# --- 3. advantages, and the tokens they apply to ------------------------------------------------------

@dataclass
class Advantages:
    """The step's advantages and the tokens of the policy loss."""

    adv: torch.Tensor                 # [N] one per completion, or [N, T] per token (turn credit, token
                                      # whitening, GAE); shaped
    trainable_mask: torch.Tensor      # [N, T] loss_tokens the loss may count (overlong='mask': truncated rows out)
    loss_mask: torch.Tensor           # [N, T] the trainable tokens the IS correction keeps: what every loss counts
    is_weights: torch.Tensor          # [N, T] the IS correction's weights (1 with 'none')
    is_stats: dict
    selected: torch.Tensor | None     # [N, T] the tokens the token selection keeps (None: all)
    token_weight: torch.Tensor | None  # [N, T] each token's weight in the policy loss (selected x IS weights)
    critic_row: dict                  # the critic/* metrics (PPO)


def advantages(run: Run, plan: StepPlan, batch: Batch, scored: Scored, greedy: torch.Tensor | None) -> Advantages:
    """One advantage per completion or episode (broadcast to its tokens), per turn of an episode (turn-level
    credit), or per token (recipe.adv_whiten, the critic's GAE after fitting it), then shaped; the tokens the
    loss counts after the behaviour -> old correction (rejected tokens leave the mask before any
    denominator), and each token's weight."""
    rollout = batch.rollout
    tokens = loss_tokens(plan, rollout)
    if plan.turn_credit:  # each turn's return from there on, against its group's episode returns [N, T]
        adv = plan.turn_credit(scored.rewards, rollout.turn_rewards, rollout.turn.cpu())
    else:
        adv = plan.advantages(scored.rewards, greedy_rewards=greedy).flatten()
    adv = adv.to(tokens.device, tokens.dtype)
    trainable_mask = tokens * (~rollout.truncated).float()[:, None] if plan.drop_truncated else tokens
    is_weights, loss_mask, is_stats = offpolicy.correct(plan.is_correction, scored.old_logp, rollout.behav_logp,
                                                        trainable_mask, rollout.policy_mask)
    if plan.critic:
        adv, critic_row = run.critic.step(plan, rollout, batch.rewards, scored.kl_tok, run.kl.coef, loss_mask)
    else:
        adv, critic_row = plan.token_advantages(adv, batch.rewards, scored.kl_tok, run.kl.coef, loss_mask), {}
    adv = plan.shape_advantages(adv)
    # the selection is made once per step over the whole rollout: fixed for all epochs and minibatches,
    # whatever the split (Wang et al. 2025, arXiv 2506.01939)
    selected = plan.select_tokens(scored.old_entropy, loss_mask) if plan.select_tokens else None
    token_weight = recipes.token_weight(selected, is_weights if plan.is_weighted else None)
    return Advantages(adv, trainable_mask, loss_mask, is_weights, is_stats, selected, token_weight, critic_row)


# --- 4. optimize ---------------------------------------------------------------------------------------

@dataclass
class Updated:
    metrics: dict                     # the update's logged means (train/*)
    first_epoch_logp: torch.Tensor    # [N, T] the update's first-epoch log-probs: pi_old's when no old pass ran
    kl_row: dict                      # the kl/* metrics
    lr: float                         # the learning rate of the step


def optimize(run: Run, plan: StepPlan, batch: Batch, scored: Scored, adv: Advantages) -> Updated:
    """The policy update (pi_old is the ratio's anchor only when the ratio can leave 1); then the KL
    coefficient and the reference's reset, the lr schedule, and the rollout engine gets the new weights."""
    metrics, first_epoch_logp = update(
        run.policy, run.optimizer, plan, batch.rollout, adv.adv, adv.loss_mask,
        old_logp=scored.old_logp if plan.anchor_on_old else None, ref_logp=scored.ref_logp, kl_coef=run.kl.coef,
        token_weight=adv.token_weight, selected=adv.selected)
    check_parameters(run.policy.module)
    kl_row = recipes.end_of_step(plan.kl, run.kl, plan.step, metrics["kl"], len(batch.rollout), run.policy,
                                 run.ref, run.optimizer) if plan.kl else {}
    lr = run.scheduler.get_last_lr()[0]
    run.scheduler.step()
    run.engine.wake()
    run.engine.sync_weights(run.policy.module, plan.step)  # the sampler gets the weights of update `step`
    return Updated(metrics, first_epoch_logp, kl_row, lr)


# --- 5. log ----------------------------------------------------------------------------------------

def step_metrics(batch: Batch, rewards, kl_reward, adv, tokens, up: dict) -> dict[str, float]:
    """The `train/*` metrics of one step (definitions in ablate/runs/metrics.py); `tokens` [N, T]: loss_tokens."""
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
        "train/nonzero_adv_token_frac": float(((adv != 0).float()[:, None] * tokens).sum() / tokens.sum()),
        "train/adv_mean": float(adv.mean()), "train/adv_std": float(adv.std(unbiased=False)),
        **{k if "/" in k else f"train/{k}": v for k, v in up.items()},  # e.g. policy/entropy_adv_cov as is
        "train/adv_abs_max": float(adv.abs().max()),
        "train/terminated_len_mean": float(lengths[~batch.rollout.truncated].float().mean()),  # NaN if none
        "train/completion_len_mean": float(lengths.float().mean()),
        "train/completion_len_max": float(lengths.max()),
        "train/truncation_rate": float(batch.rollout.truncated.float().mean()),
    }


def train_samples(task, batch: Batch, rewards, adv, group_size: int, n_logged: int, tokenizer) -> list[dict]:
    """The first completion of the first `n_logged` groups, with its reward and advantage."""
    rows = range(0, min(len(adv), n_logged * group_size), group_size)
    return [{"split": "train", "prompt": task.prompt_text(batch.problems[i // group_size], tokenizer),
             "completion": batch.rollout.texts[i], "reward": float(rewards.flatten()[i]),
             "advantage": float(adv[i]), "correct": bool(batch.correct.flatten()[i] >= 1)} for i in rows]


def log_step(run: Run, store: RunStore, plan: StepPlan, batch: Batch, scored: Scored, adv: Advantages,
             updated: Updated, lag: int, clock: tuple[float, ...]) -> dict:
    """The step's metrics row (metrics.jsonl) and the run's counters; `clock`: the step's start and the ends
    of sampling, scoring and optimizing (perf_counter)."""
    t0, t1, t2, t3 = clock
    rollout, lengths = batch.rollout, batch.rollout.lengths
    run.counters["samples"] += len(rollout)
    run.counters["tokens"] += int(lengths.sum())
    run.since_eval.append(float(batch.correct.mean()))
    pi_old = updated.first_epoch_logp if scored.old_logp is None else scored.old_logp
    off = offpolicy.step_metrics(pi_old, rollout.behav_logp, adv.trainable_mask, adv.is_weights, adv.loss_mask,
                                 adv.is_stats, lag, rollout.policy_mask)
    row = {**step_metrics(batch, scored.rewards, scored.kl_reward, recipes.per_completion(adv.adv),
                          loss_tokens(plan, rollout), updated.metrics), **off, **episodes.metrics(rollout),
           "train/lr": updated.lr, "train/format_weight": plan.sampling.format_weight, **updated.kl_row,
           **run.stream.metrics(), "train/temperature": plan.sampling.temperature,
           "train/max_new_tokens": plan.sampling.max_new_tokens,
           **per_task_train(task_labels(run.task, batch.problems), batch.correct),
           "counters/samples": run.counters["samples"], "counters/tokens": run.counters["tokens"],
           "perf/wall_seconds": time.perf_counter() - run.start, "perf/step_seconds": t3 - t0,
           "perf/generate_seconds": t1 - t0 - batch.reward_seconds, "perf/reward_seconds": batch.reward_seconds,
           "perf/logprob_seconds": t2 - t1, "perf/update_seconds": t3 - t2,
           "perf/gen_tokens_per_s": float(lengths.sum()) / max(batch.generate_seconds, 1e-9),
           "perf/train_tokens_per_s": float(lengths.sum()) * plan.epochs / max(t3 - t2, 1e-9),
           **adv.critic_row}
    store.append("metrics", {"step": plan.step, **row})
    return row


def evaluate_now(run: Run, store: RunStore, plan: StepPlan, batch: Batch, scored: Scored, adv: Advantages) -> dict:
    """The held-out evaluation after step `plan.step`, logged with a few of the step's training samples;
    returns its row."""
    ev, samples, problems = evaluate_repeats(run.engine, run.task, run.heldout, run.cfg, run.tokenizer,
                                             plan.sampling.max_new_tokens, plan.step)
    samples += train_samples(run.task, batch, scored.rewards, recipes.per_completion(adv.adv),
                             plan.sampling.group_size, run.cfg.eval.num_samples_logged, run.tokenizer)
    log_eval(store, plan.step, ev, samples, float(np.mean(run.since_eval)), problems)
    run.since_eval = []
    return ev


# --- the loop --------------------------------------------------------------------------------------

def train(cfg: RunConfig, out_dir: str, progress: bool = True,
          should_prune: Callable[[int, dict], bool] | None = None) -> RunState:
    """Train `cfg` into the run folder `out_dir` (resuming from its checkpoint if any); returns the final
    state: completed, diverged, pruned or failed (failed also re-raises; so does cancelled, by
    SIGTERM or Ctrl-C). `should_prune(step, eval_row)`
    is asked after every held-out evaluation (Optuna's report/should_prune); True stops the run as pruned."""
    preflight.check(cfg)  # every file the run reads (the vLLM engine's fit too), before the run folder is written
    # WORLD_SIZE > 1: in the process group, left on every way out (a group alive at exit can abort the process)
    with distributed.process_group(resolve_device(cfg.device), cfg.compute.collective_timeout_s):
        return _train_folder(cfg, out_dir, progress, should_prune)


def _train_folder(cfg: RunConfig, out_dir: str, progress: bool, should_prune) -> RunState:
    from ablate.runs.tracking import open_mirrors

    sampler = {"sampler": SAMPLER}
    if cfg.rollout.engine == "vllm":
        from ablate.train import vllm_engine

        sampler = vllm_engine.provenance()
    store = distributed.open_store(out_dir)  # rank 0 writes the run folder; the other ranks only read it
    store.claim(run_id(cfg))  # another run's folder, unknown run files or a foreign checkpoint: RunFolderError
    with distributed.failing_together():
        store.lock()  # one writer: rank 0 holds the folder for the run's life (RunFolderError names the holder)
    status = store.status()
    if status and status["state"] in FINISHED:
        store.unlock()
        return status["state"]
    store.write_config(cfg)
    device = resolve_device(cfg.device)
    store.write_provenance(cfg, str(device), **sampler, world_size=distributed.world())
    store.mirrors = open_mirrors(cfg, store.root) if distributed.is_main() else []  # W&B (docs/tracking.md)
    state: RunState = "failed"
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


def _train(cfg: RunConfig, store: RunStore, device: torch.device, progress: bool, should_prune) -> RunState:
    run = set_up(cfg, device)
    resumed = resume(run, store)
    run.engine = build_engine(cfg, run.policy)  # after any resume: it starts from the restored weights
    with closing(run.engine):  # however the run ends
        if not resumed:  # the held-out evaluation before training (step 0), sampled by the engine too
            ev, samples, problems = evaluate_repeats(run.engine, run.task, run.heldout, cfg, run.tokenizer,
                                                     plan_step(cfg, 0).sampling.max_new_tokens, 0)
            log_eval(store, 0, ev, samples, None, problems)
        return run_steps(run, store, progress, should_prune)


def run_steps(run: Run, store: RunStore, progress: bool, should_prune) -> str:
    """The steps from `run.step` to `cfg.steps`: sample, score, advantages, optimize, log (and evaluate,
    checkpoint); returns the run's final state."""
    cfg = run.cfg
    bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                   TimeRemainingColumn(), disable=not (progress and distributed.is_main()))
    bar_task = bar.add_task("", total=cfg.steps, completed=run.step)
    run.start = time.perf_counter() - run.wall
    with bar, preemption.guard(lambda: save_checkpoint(run, store), collective=sharding.is_sharded(run.policy.module)):
        while run.step < cfg.steps:
            with preemption.step():  # a SLURM warning signal waits for the step to end
                run.step += 1
                plan = plan_step(cfg, run.step)
                t0 = time.perf_counter()
                batch, greedy, version = sample(run, plan)
                t1 = time.perf_counter()
                scored = score(run, plan, batch)
                t2 = time.perf_counter()
                adv = advantages(run, plan, batch, scored, greedy)
                try:
                    updated = optimize(run, plan, batch, scored, adv)
                except Diverged as err:
                    store.set_status("diverged", run.step, str(err))
                    return "diverged"
                t3 = time.perf_counter()
                row = log_step(run, store, plan, batch, scored, adv, updated, run.step - 1 - version, (t0, t1, t2, t3))
                if cfg.eval.every and run.step % cfg.eval.every == 0 or run.step == cfg.steps:
                    ev = evaluate_now(run, store, plan, batch, scored, adv)
                    # several ranks: rank 0 asks (Optuna's trial lives there), every rank stops with it
                    if run.step < cfg.steps and distributed.on_main(lambda: should_prune is not None
                                                                    and should_prune(run.step, ev)):
                        store.set_status("pruned", run.step)
                        return "pruned"
                store.set_status("running", run.step)
                if run.step == cfg.steps or cfg.checkpoint_every and run.step % cfg.checkpoint_every == 0:
                    save_checkpoint(run, store)  # always the last step's: a completed run keeps its final weights
                bar.update(bar_task, completed=run.step,
                           description=f"reward {row['train/reward_mean']:.3f} dead {row['train/dead_group_frac']:.2f}")
    store.set_status("completed", run.step)
    return "completed"
