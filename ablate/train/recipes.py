"""Recipe glue for the trainer: the recipe keys of the policy-loss registry, token selection and
advantage shaping, each read here and nowhere else. Pure functions; the math is in ablate.rl.losses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor

from ablate.config import RATIO_LEVEL_LOSSES, RecipeConfig
from ablate.rl import losses
from ablate.rl.advantages import batch_token_scale, reinforce_pp_advantages
from ablate.train import execution


def step_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator that depends only on (run seed, step): Clip-Cov's draw is reproducible and the
    same however the step is executed."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, step]).generate_state(1)[0]))


def policy_loss_params(r: RecipeConfig, seed: int = 0, step: int = 0) -> dict:
    """The keyword parameters of `losses.POLICY_LOSSES[r.policy_loss]` (besides agg and max_len)."""
    ppo = dict(eps_low=r.eps_low, eps_high=r.eps_high)
    params = {
        "ppo_clip": dict(**ppo, dual_clip=r.dual_clip),
        "cispo": dict(cispo_cap=r.cispo_cap),
        "gmpo": dict(eps_low=r.gmpo_eps, eps_high=r.gmpo_eps),
        "sapo": dict(tau_pos=r.tau_pos, tau_neg=r.tau_neg),
        "clip_cov": dict(**ppo, clip_cov_ratio=r.clip_cov_ratio, clip_cov_lb=r.clip_cov_lb,
                         clip_cov_ub=r.clip_cov_ub, generator=step_generator(seed, step)),
        "kl_cov": dict(kl_cov_frac=r.kl_cov_frac, kl_cov_coef=r.kl_cov_coef),
        "gpg": {},
        "delta": dict(**ppo, delta=r.delta),
        "raft": {},
    }[r.policy_loss]
    if r.policy_loss in RATIO_LEVEL_LOSSES:
        params["ratio_level"] = r.ratio_level
    return params


def ratio_can_leave_one(r: RecipeConfig) -> bool:
    """Whether pi_old must be the ratio's anchor: several epochs or minibatches move the policy away from the
    rollout's, and KL in the reward reads pi_old before the update. Otherwise the ratio is exactly 1 and
    the update anchors on its own detached log-probs."""
    return r.update_epochs > 1 or r.minibatches > 1 or (r.kl_coef > 0 and r.kl_placement == "reward")


def needs_old_pass(r: RecipeConfig) -> bool:
    """Whether the step scores the rollout under pi_old before the update: when the ratio can leave 1, an IS
    correction weighs behaviour against old, or top-entropy selection reads the old pass's entropies.
    Otherwise the update's own first forward is pi_old (as TRL does on-policy): one forward fewer, and the
    behaviour/old mismatch metrics read the update's log-probs."""
    return ratio_can_leave_one(r) or r.is_correction != "none" or needs_entropies(r)


def needs_entropies(r: RecipeConfig) -> bool:
    """Whether the step's first forward (the old-policy pass) must also return token entropies."""
    return r.token_selection == "top_entropy"


def select_tokens(r: RecipeConfig, entropies: Tensor | None, mask: Tensor) -> Tensor | None:
    """The kept tokens [N,T] of `token_selection='top_entropy'` (None for 'all'): the top `entropy_quantile`
    share by entropy over the whole batch passed in. The trainer passes the entropies of the step's first
    forward (the old-policy pass over the whole rollout), so the selection is fixed for all epochs and
    minibatches of the step and does not depend on how the step is split (Wang et al. 2025, arXiv
    2506.01939)."""
    return None if r.token_selection == "all" else losses.top_entropy_mask(entropies, mask, r.entropy_quantile)


def token_weight(r: RecipeConfig, entropies: Tensor | None, mask: Tensor, is_weights: Tensor | None = None,
                 selected: Tensor | None = None) -> dict:
    """{"token_weight": [n,T]} multiplying each token's loss: the kept tokens of `token_selection='top_entropy'`
    (`selected` [n,T], or `select_tokens` over the entropies [n,T] passed in) times the detached IS weights
    of an off-policy correction (ablate/rl/corrections.py); {} when neither."""
    w = select_tokens(r, entropies, mask) if selected is None else selected
    if is_weights is not None and r.is_correction != "none":  # `none` gives weights of exactly 1
        w = is_weights.detach() if w is None else w * is_weights.detach()
    return {} if w is None else {"token_weight": w}


def covariance_selection(r: RecipeConfig, params: dict, policy, micro: list, old_logp: Tensor | None,
                         adv: Tensor, loss_mask: Tensor, split: bool = False) -> Tensor | None:
    """Clip-Cov / KL-Cov's selected tokens over a whole minibatch split into several micro-batches `micro`
    [(rows, sub-rollout)]: bool [N,T] (False outside the minibatch's rows), from a no-grad forward of the
    current policy over the same micro-batches, so the selection (its covariance means, token budget and
    draw) is the one a single pass would make. None for one micro-batch or another loss: the loss selects.
    `split`: the loss sees only part of the minibatch (several ranks), so the selection is made here."""
    if r.policy_loss not in losses.COV_SELECTIONS or len(micro) < 2 and not split:
        return None
    rows = torch.cat([mb for mb, _ in micro])
    with torch.no_grad():
        logp = execution.join_columns([execution.token_scores(policy, sub, r.temperature)[0] for _, sub in micro],
                                      loss_mask.shape[1])  # [n, T], rows in minibatch order
    old = old_logp[rows] if old_logp is not None else logp
    sel = losses.COV_SELECTIONS[r.policy_loss](logp, old, adv[rows], loss_mask[rows], **params)
    out = torch.zeros(loss_mask.shape, dtype=torch.bool, device=loss_mask.device)
    out[rows.to(out.device)] = sel
    return out


def shape_advantages(adv: Tensor, r: RecipeConfig) -> Tensor:
    """Positive / negative advantage weights, then clipping to [-adv_clip, adv_clip]. Identity by default.

    Weights multiply the advantage (so the loss term of every loss that is linear in A); they act
    before Clip-Cov / KL-Cov compute their covariance."""
    if r.pos_adv_weight != 1.0 or r.neg_adv_weight != 1.0:
        adv = torch.where(adv > 0, r.pos_adv_weight * adv, torch.where(adv < 0, r.neg_adv_weight * adv, adv))
    if r.adv_clip is not None:
        adv = adv.clamp(-r.adv_clip, r.adv_clip)
    return adv


def whiten_advantages(adv: Tensor, r: RecipeConfig, task_rewards: Tensor, kl_tok: Tensor | None,
                      mask: Tensor, kl_coef: float | None = None) -> Tensor:
    """`recipe.adv_whiten`: adv [N] unchanged ('none'), or token-level [N,T] advantages whitened over the
    counted tokens of `mask` ('token': REINFORCE++-baseline; 'token_returns': REINFORCE++ with the
    per-token KL kl_tok [N,T] (None when KL is off) in the rewards and task_rewards [B,G] at the end)."""
    if r.adv_whiten == "none":
        return adv
    if r.adv_whiten == "token":
        return batch_token_scale(adv, mask, ddof=r.std_ddof, eps=r.std_eps)
    rewards = task_rewards.flatten().to(mask.device)
    beta = r.kl_coef if kl_coef is None else kl_coef
    return reinforce_pp_advantages(rewards, mask, kl_tok, beta, ddof=r.std_ddof, eps=r.std_eps)


def per_completion(adv: Tensor) -> Tensor:
    """One advantage per completion for logging: adv [N] itself, or the first token's of adv [N,T]."""
    return adv if adv.dim() == 1 else adv[:, 0]


# --- regularisation dynamics: adaptive KL coefficient and reference resets ---------------------------

def adaptive_kl_coef(beta: float, kl: float, target: float, horizon: int, n_samples: int) -> float:
    """Ziegler et al. 2019 (arXiv 1909.08593), horizon form as veRL / OpenRLHF / SkyRL implement it:
    e = clip(kl / target - 1, -0.2, 0.2), beta <- beta * (1 + e * n_samples / horizon). `kl` is the
    step's per-token mean KL (`train/kl`), so the target is per token."""
    e = min(max(kl / target - 1.0, -0.2), 0.2)
    return beta * (1.0 + e * n_samples / horizon)


@dataclass
class KLState:
    """The KL coefficient in use and the reference-reset bookkeeping (checkpointed with the run)."""

    coef: float
    resets: int = 0
    last_reset: int = 0

    def state_dict(self) -> dict:
        return asdict(self)


def end_of_step(r: RecipeConfig, state: KLState, step: int, kl: float, n_samples: int, policy, ref,
                optimizer) -> dict[str, float]:
    """After the step's update: adapt the KL coefficient (when `kl_target` is set), then, every
    `ref_reset_every` steps, reset the reference to the current policy and re-initialise the optimiser
    state (ProRL: Liu et al. 2025, arXiv 2505.24864). The adaptive coefficient is not reset. Returns the
    kl/* metrics of the step (the coefficient used in it)."""
    row = {"kl/coef": state.coef}
    if r.kl_target is not None:
        state.coef = adaptive_kl_coef(state.coef, kl, r.kl_target, r.kl_horizon, n_samples)
    if r.ref_reset_every and step % r.ref_reset_every == 0:
        ref.module.load_state_dict(policy.module.state_dict())
        optimizer.state.clear()  # moments restart from zero; the lr schedule continues
        state.resets, state.last_reset = state.resets + 1, step
    if r.ref_reset_every:
        row.update({"kl/ref_resets": state.resets, "kl/steps_since_reset": step - state.last_reset})
    return row
