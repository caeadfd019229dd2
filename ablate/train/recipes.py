"""The recipe families' steps in the loop, as the step plan binds them (ablate/train/plan.py resolves the
recipe; nothing here reads it): token-level advantages, advantage shaping, token weights, the batch-level
token selection of a loss over micro-batches, and the KL coefficient's dynamics. The math is in
ablate.rl; these functions take plain values and tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ablate.rl.advantages import batch_token_scale, reinforce_pp_advantages
from ablate.rl.losses import LossParams, SelectionFn
from ablate.train import execution

if TYPE_CHECKING:
    from ablate.train.plan import KL


def step_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator that depends only on (run seed, step): Clip-Cov's draw and the critic's minibatch
    order are reproducible and the same however the step is executed."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, step]).generate_state(1)[0]))


# --- token-level advantages (`recipe.adv_whiten`) --------------------------------------------------
# fn(adv [N], task_rewards [B,G] (before KL), kl_tok [N,T] | None, kl_coef, mask [N,T], *, ddof, eps)
#   -> adv [N] (unchanged) or token-level [N,T]; 'gae' is the critic's (ablate/train/critic.py).

def _per_completion(adv, task_rewards, kl_tok, kl_coef, mask, *, ddof, eps) -> Tensor:
    return adv


def _token(adv, task_rewards, kl_tok, kl_coef, mask, *, ddof, eps) -> Tensor:
    # REINFORCE++-baseline: the advantages whitened over the counted tokens of the batch
    return batch_token_scale(adv, mask, ddof=ddof, eps=eps)


def _token_returns(adv, task_rewards, kl_tok, kl_coef, mask, *, ddof, eps) -> Tensor:
    # REINFORCE++: per-token KL rewards (kl_tok, None when KL is off) and the task reward at the end,
    # reward-to-go returns, whitened; `adv` (no baseline, no scale) is not used
    rewards = task_rewards.flatten().to(mask.device)
    return reinforce_pp_advantages(rewards, mask, kl_tok, kl_coef, ddof=ddof, eps=eps)


TOKEN_ADVANTAGES: dict[str, Callable[..., Tensor]] = {
    "none": _per_completion,
    "token": _token,
    "token_returns": _token_returns,
}


def shape_advantages(adv: Tensor, *, pos_weight: float, neg_weight: float, clip: float | None) -> Tensor:
    """Positive / negative advantage weights, then clipping to [-clip, clip]. Identity by default.

    Weights multiply the advantage (so the loss term of every loss that is linear in A); they act
    before Clip-Cov / KL-Cov compute their covariance."""
    if pos_weight != 1.0 or neg_weight != 1.0:
        adv = torch.where(adv > 0, pos_weight * adv, torch.where(adv < 0, neg_weight * adv, adv))
    if clip is not None:
        adv = adv.clamp(-clip, clip)
    return adv


def per_completion(adv: Tensor) -> Tensor:
    """One advantage per completion for logging: adv [N] itself, or the first token's of adv [N,T]."""
    return adv if adv.dim() == 1 else adv[:, 0]


# --- token weights and batch-level selections -------------------------------------------------------

def token_weight(selected: Tensor | None, is_weights: Tensor | None) -> Tensor | None:
    """The weight [N,T] of each token's policy loss: the tokens a selection keeps (top-entropy, bool) times
    the detached IS weights of an off-policy correction; None when neither applies (weight 1)."""
    if is_weights is None:
        return selected
    return is_weights.detach() if selected is None else selected * is_weights.detach()


def covariance_selection(selection: SelectionFn | None, params: LossParams, policy, temperature: float,
                         micro: list, old_logp: Tensor | None, adv: Tensor, loss_mask: Tensor,
                         split: bool = False) -> Tensor | None:
    """A loss's batch-level selection (Clip-Cov / KL-Cov) over a whole minibatch split into several
    micro-batches `micro` [(rows, sub-rollout)]: bool [N,T] (False outside the minibatch's rows), from a
    no-grad forward of the current policy over the same micro-batches, so the selection (its covariance
    means, token budget and draw) is the one a single pass would make. None for one micro-batch or a
    loss without one: the loss selects. `split`: the loss sees only part of the minibatch (several ranks),
    so the selection is made here."""
    if selection is None or len(micro) < 2 and not split:
        return None
    rows = torch.cat([mb for mb, _ in micro])
    with torch.no_grad():
        logp = execution.join_columns([execution.token_scores(policy, sub, temperature)[0] for _, sub in micro],
                                      loss_mask.shape[1])  # [n, T], rows in minibatch order
    old = old_logp[rows] if old_logp is not None else logp
    sel = selection(logp, old, adv[rows], loss_mask[rows], params)
    out = torch.zeros(loss_mask.shape, dtype=torch.bool, device=loss_mask.device)
    out[rows.to(out.device)] = sel
    return out


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


def end_of_step(kl: KL, state: KLState, step: int, kl_value: float, n_samples: int, policy, ref,
                optimizer) -> dict[str, float]:
    """After the step's update: adapt the KL coefficient (when `kl.target` is set), then, every
    `kl.reset_every` steps, reset the reference to the current policy and re-initialise the optimiser
    state (ProRL: Liu et al. 2025, arXiv 2505.24864). The adaptive coefficient is not reset.
    Returns the kl/* metrics of the step (the coefficient used in it)."""
    row = {"kl/coef": state.coef}
    if kl.target is not None:
        state.coef = adaptive_kl_coef(state.coef, kl_value, kl.target, kl.horizon, n_samples)
    if kl.reset_every and step % kl.reset_every == 0:
        ref.module.load_state_dict(policy.module.state_dict())
        optimizer.state.clear()  # moments restart from zero; the lr schedule continues
        state.resets, state.last_reset = state.resets + 1, step
    if kl.reset_every:
        row.update({"kl/ref_resets": state.resets, "kl/steps_since_reset": step - state.last_reset})
    return row
