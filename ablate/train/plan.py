"""The step plan: the recipe resolved, once per step, into what the loop does.

`plan_step(cfg, step)` is where the training step reads `cfg.recipe` (tests/test_plan.py checks that no
other module of the step does): how the batch is sampled and rewarded, which passes run over the rollout
before the update (pi_old, the reference, the critic), the KL term and where it goes, the advantage
functions (turn-level credit in multi-turn episodes), the off-policy correction, the tokens the loss counts
(an episode's environment replies or not), their selection and weighting, and the policy-loss entry with
its parameters. Schedules (temperature, max_new_tokens, the format weight's annealing) take their values
at `step`. What evolves during a run is state, not plan: the adaptive KL coefficient (recipes.KLState),
the data policy's pool (data.PromptSampler), the staleness FIFO (offpolicy.Pending).

docs/recipes.md defines every toggle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from torch import Tensor

from ablate.config import RunConfig
from ablate.rl import losses
from ablate.rl.advantages import compute_advantages
from ablate.rl.corrections import IS_CORRECTIONS
from ablate.rl.rewards import format_weight_at
from ablate.rl.schedules import max_new_tokens_at, temperature_at
from ablate.rl.turns import credit_advantages
from ablate.train import recipes


@dataclass(frozen=True)
class Sampling:
    """How the step's batch is sampled and given its task reward."""

    prompts: int                      # B groups (prompts_per_step)
    group_size: int                   # G completions per prompt
    temperature: float                # at this step
    max_new_tokens: int               # at this step
    live_groups_only: bool            # dynamic sampling: keep the groups with reward spread, drawing new prompts
    rounds: int                       # generation rounds allowed (recipe.max_gen_rounds with dynamic sampling, else 1)
    format_weight: float              # the format score's weight at this step (annealed)
    scores_format: bool               # the format score is computed at all (recipe.format_weight > 0)
    overlong_penalty: tuple[int, float] | None  # DAPO's soft penalty (buffer, factor); None = off
    greedy_baseline: bool             # ReMax: the reward of one greedy decode per prompt is the baseline


@dataclass(frozen=True)
class KL:
    """The KL term against the reference (recipe.kl_*). The coefficient in use is state (recipes.KLState)."""

    coef: float                       # the initial coefficient
    estimator: Callable[[Tensor, Tensor], Tensor]  # losses.KL_ESTIMATORS entry: (logp, ref_logp) -> [N,T]
    in_reward: bool                   # a per-token reward term before the advantages; else a loss term
    target: float | None              # the adaptive coefficient's per-token KL target (None: fixed)
    horizon: int
    reset_every: int                  # reset the reference to the policy every N steps (0: never)


@dataclass(frozen=True)
class Critic:
    """PPO's learned critic (recipe.adv_whiten='gae'): GAE advantages and the value fit."""

    lr: float                         # recipe.critic_lr, else optim.lr
    gamma: float
    lam: float
    value_clip: float | None
    vf_coef: float
    ddof: int                         # the advantages' whitening: recipe.std_ddof, std_eps
    eps: float


@dataclass(frozen=True)
class Loss:
    """The policy loss of the update: a registry entry with its parameters, and the terms added to it."""

    fn: losses.PolicyLossFn           # losses.POLICY_LOSSES[recipe.policy_loss]
    params: losses.LossParams         # Clip-Cov's generator is seeded by (seed, step)
    selection: losses.SelectionFn | None  # its batch-level token selection (Clip-Cov / KL-Cov), if any
    agg: str                          # recipe.loss_agg, also of the KL and entropy terms
    max_len: int                      # the aggregations' constant length: max_new_tokens at this step
    entropy_coef: float               # entropy bonus (0: off; the entropy is logged either way)
    nll_coef: float                   # VAPO's NLL term on positive-advantage samples (0: off)


@dataclass(frozen=True)
class StepPlan:
    """What step `step` does; the loop and the update follow it."""

    step: int
    seed: int
    sampling: Sampling
    staleness: int                    # the sampler runs this many batches ahead of the update
    # passes over the rollout before the update
    old_pass: bool                    # score it under pi_old (the ratio's anchor, the IS correction, entropies)
    old_entropies: bool               # ... with token entropies (top-entropy selection reads them)
    anchor_on_old: bool               # the ratio can leave 1 (epochs, minibatches, KL in the reward): anchor it
                                      # at pi_old; else the update's own first forward is pi_old (ratio 1)
    kl: KL | None                     # the reference pass and the KL term; None: no reference
    critic: Critic | None             # the critic gives token-level GAE advantages; None: no critic
    # advantages
    advantages: Callable[..., Tensor]           # (rewards [B,G], greedy_rewards=[B] | None) -> [B,G]
    turn_credit: Callable[..., Tensor] | None   # episodes, turn-level credit: (episode returns [B,G], turn
                                                # rewards [N,K], turn [N,T]) -> [N,T]; None: one per row
    token_advantages: Callable[..., Tensor] | None  # recipes.TOKEN_ADVANTAGES entry (ddof, eps bound); None: GAE
    shape_advantages: Callable[[Tensor], Tensor]  # positive / negative weights, clip
    drop_truncated: bool              # overlong='mask': truncated completions leave the loss
    # the tokens the loss counts and their weights
    env_tokens_in_loss: bool          # multi-turn episodes: the environment's replies count too (single turn: no
                                      # such tokens)
    is_correction: Callable[..., tuple]  # IS_CORRECTIONS entry with its cap / band: (old, behav, mask) ->
                                         # (weights, kept, stats)
    is_weighted: bool                 # its weights multiply each token's loss (any correction but 'none')
    select_tokens: Callable[[Tensor, Tensor], Tensor] | None  # top-entropy: (entropies, mask) -> kept; None: all
    # the update
    epochs: int
    minibatches: int
    loss: Loss
    micro_batch_tokens: int           # compute.micro_batch_tokens (0: the whole minibatch in one pass)
    grad_clip: float                  # optim.grad_clip (0: off)


def plan_step(cfg: RunConfig, step: int) -> StepPlan:
    """The plan of optimizer step `step` (1 = the first; 0 = before training: the set-up and the first
    evaluation, with step 1's schedule values)."""
    r = cfg.recipe
    max_new_tokens = max_new_tokens_at(r, step)
    kl = KL(coef=r.kl_coef, estimator=losses.KL_ESTIMATORS[r.kl_estimator], in_reward=r.kl_placement == "reward",
            target=r.kl_target, horizon=r.kl_horizon, reset_every=r.ref_reset_every) if r.kl_coef > 0 else None
    anchor_on_old = r.update_epochs > 1 or r.minibatches > 1 or (kl is not None and kl.in_reward)
    selects = r.token_selection == "top_entropy"
    params = losses.LossParams(
        eps_low=r.eps_low, eps_high=r.eps_high, dual_clip=r.dual_clip, ratio_level=r.ratio_level,
        cispo_cap=r.cispo_cap, gmpo_eps=r.gmpo_eps, tau_pos=r.tau_pos, tau_neg=r.tau_neg,
        clip_cov_ratio=r.clip_cov_ratio, clip_cov_lb=r.clip_cov_lb, clip_cov_ub=r.clip_cov_ub,
        kl_cov_frac=r.kl_cov_frac, kl_cov_coef=r.kl_cov_coef, delta=r.delta,
        generator=recipes.step_generator(cfg.seed, step))
    return StepPlan(
        step=step, seed=cfg.seed,
        sampling=Sampling(
            prompts=cfg.prompts_per_step, group_size=r.group_size, temperature=temperature_at(r, step),
            max_new_tokens=max_new_tokens, live_groups_only=r.dynamic_sampling,
            rounds=r.max_gen_rounds if r.dynamic_sampling else 1,
            format_weight=format_weight_at(r.format_weight, r.format_anneal_steps, step),
            scores_format=bool(r.format_weight),
            overlong_penalty=(r.overlong_buffer, r.overlong_factor) if r.overlong == "soft_penalty" else None,
            greedy_baseline=r.baseline == "greedy"),
        staleness=r.staleness,
        old_pass=anchor_on_old or r.is_correction != "none" or selects,
        old_entropies=selects,
        anchor_on_old=anchor_on_old,
        kl=kl,
        critic=Critic(lr=r.critic_lr or cfg.optim.lr, gamma=r.gae_gamma, lam=r.gae_lambda, value_clip=r.value_clip,
                      vf_coef=r.vf_coef, ddof=r.std_ddof, eps=r.std_eps) if r.adv_whiten == "gae" else None,
        advantages=partial(compute_advantages, baseline=r.baseline, scale=r.scale, ddof=r.std_ddof, eps=r.std_eps),
        turn_credit=partial(credit_advantages, r.credit, baseline=r.baseline, scale=r.scale, ddof=r.std_ddof,
                            eps=r.std_eps) if r.credit != "episode" else None,  # episode: the row's advantage
        token_advantages=partial(recipes.TOKEN_ADVANTAGES[r.adv_whiten], ddof=r.std_ddof, eps=r.std_eps)
        if r.adv_whiten != "gae" else None,
        shape_advantages=partial(recipes.shape_advantages, pos_weight=r.pos_adv_weight,
                                 neg_weight=r.neg_adv_weight, clip=r.adv_clip),
        drop_truncated=r.overlong == "mask",
        env_tokens_in_loss=not r.mask_env_tokens,
        is_correction=partial(IS_CORRECTIONS[r.is_correction], cap=r.is_cap, lo=r.is_lo, hi=r.is_hi),
        is_weighted=r.is_correction != "none",
        select_tokens=partial(losses.top_entropy_mask, quantile=r.entropy_quantile) if selects else None,
        epochs=r.update_epochs, minibatches=r.minibatches,
        loss=Loss(fn=losses.POLICY_LOSSES[r.policy_loss], params=params,
                  selection=losses.COV_SELECTIONS.get(r.policy_loss), agg=r.loss_agg, max_len=max_new_tokens,
                  entropy_coef=r.entropy_coef, nll_coef=r.pos_nll_coef),
        micro_batch_tokens=cfg.compute.micro_batch_tokens, grad_clip=cfg.optim.grad_clip)
