"""Advantage estimators: a baseline b and a scale s, A = (r - b) / s. docs/recipes.md, "Advantages".

Two registries of pure tensor functions; `compute_advantages` composes one of each.
Shapes: P prompts, G completions per prompt; rewards [P,G], one advantage per completion [P,G]
(the trainer broadcasts it over the completion's tokens).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

BaselineFn = Callable[[Tensor, "Tensor | None"], Tensor]  # (rewards[P,G], greedy[P] | None) -> b[P,G]
ScaleFn = Callable[[Tensor, Tensor, int, float], Tensor]  # (centered, rewards, ddof, eps) -> [P,G]


def _std(x: Tensor, ddof: int, dim: int | None = None) -> Tensor:
    """std with a guarded denominator: n - ddof <= 0 (one sample, ddof=1) gives 0, not NaN/inf."""
    n = x.numel() if dim is None else x.shape[dim]
    mu = x.mean() if dim is None else x.mean(dim, keepdim=True)
    sq = (x - mu) ** 2
    var = (sq.sum() if dim is None else sq.sum(dim, keepdim=True)) / max(n - ddof, 1)
    return var.sqrt()


# --- baselines: fn(rewards[P,G], greedy_rewards[P] | None) -> b[P,G] ------------------------------

def _none(rewards: Tensor, greedy_rewards: Tensor | None) -> Tensor:
    # plain REINFORCE (Williams 1992): no variance reduction
    return torch.zeros_like(rewards)


def _batch_mean(rewards: Tensor, greedy_rewards: Tensor | None) -> Tensor:
    # one number for the whole batch (REINFORCE++); not invariant to per-prompt reward offsets
    return rewards.mean().expand_as(rewards)


def _group_mean(rewards: Tensor, greedy_rewards: Tensor | None) -> Tensor:
    # GRPO numerator (Shao et al. 2024): mean of the G rewards of the same prompt
    return rewards.mean(1, keepdim=True).expand_as(rewards)


def _leave_one_out(rewards: Tensor, greedy_rewards: Tensor | None) -> Tensor:
    # RLOO (Ahmadian et al. 2024): mean of the other G-1 rewards, so b_i is independent of y_i
    # (unbiased); r_i - b_i = G/(G-1) * (r_i - group mean).
    g = rewards.shape[1]
    if g < 2:
        raise ValueError("leave_one_out baseline needs G >= 2 completions per prompt")
    return (rewards.sum(1, keepdim=True) - rewards) / (g - 1)


def _greedy(rewards: Tensor, greedy_rewards: Tensor | None) -> Tensor:
    # ReMax (Li et al. 2023): reward of the greedy decode of the same prompt
    if greedy_rewards is None:
        raise ValueError("greedy baseline needs greedy_rewards[P] (reward of each prompt's greedy decode)")
    if greedy_rewards.shape != rewards.shape[:1]:
        raise ValueError(f"greedy_rewards must have shape [P]={tuple(rewards.shape[:1])}, "
                         f"got {tuple(greedy_rewards.shape)}")
    return greedy_rewards.to(rewards.dtype)[:, None].expand_as(rewards)


BASELINES: dict[str, BaselineFn] = {
    "none": _none,
    "batch_mean": _batch_mean,
    "group_mean": _group_mean,
    "leave_one_out": _leave_one_out,
    "greedy": _greedy,
}


# --- scales: fn(centered[P,G], rewards[P,G], ddof, eps) -> divisor s[P,G]; A = centered / s ------------
# (a divisor rather than A itself, so that turn-level credit, ablate/rl/turns.py, divides every turn's return
# by the same s as its episode's)

def _scale_none(centered: Tensor, rewards: Tensor, ddof: int, eps: float) -> Tensor:
    # Dr. GRPO (Liu et al. 2025) / RLOO: std-normalisation biases towards too-easy/too-hard prompts
    return torch.ones_like(centered)


def _scale_group(centered: Tensor, rewards: Tensor, ddof: int, eps: float) -> Tensor:
    # GRPO: std of the G *rewards* of the prompt. A dead group has centered == 0, so 0 / eps = 0.
    return (_std(rewards, ddof, dim=1) + eps).expand_as(centered)


def _scale_batch(centered: Tensor, rewards: Tensor, ddof: int, eps: float) -> Tensor:
    # Choice: std over the whole batch of the *centered* values (r - b), not of the raw rewards.
    # This is Lite PPO (Liu et al. 2025, "Tricks or Traps? Part I": group-level mean, batch-level
    # std of the group-centred advantages) and REINFORCE++ (Hu 2025: global normalisation of the
    # advantages). With a batch_mean baseline both readings coincide (std is shift-invariant); with
    # a group baseline, using the centered values keeps the estimator invariant to per-prompt reward
    # offsets, which the std of raw rewards would not be. We do not re-subtract the batch mean:
    # that would silently replace the chosen baseline.
    return (_std(centered, ddof) + eps).expand_as(centered)


DIVISORS: dict[str, ScaleFn] = {
    "none": _scale_none,
    "group": _scale_group,
    "batch": _scale_batch,
}
SCALES: dict[str, ScaleFn] = {  # fn(centered, rewards, ddof, eps) -> A = centered / divisor
    name: (lambda div: lambda centered, rewards, ddof, eps: centered / div(centered, rewards, ddof, eps))(div)
    for name, div in DIVISORS.items()}


def _lookup(registry: dict, name: str, what: str):
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; allowed: {', '.join(registry)}")
    return registry[name]


def compute_advantages(
    rewards: Tensor,  # [P,G]
    *,
    baseline: str,
    scale: str,
    ddof: int = 1,
    eps: float = 1e-6,
    greedy_rewards: Tensor | None = None,  # [P], only for baseline="greedy"
) -> Tensor:  # [P,G] float
    """A = scale(r - baseline(r)). Unknown names raise ValueError listing the allowed ones."""
    base_fn = _lookup(BASELINES, baseline, "baseline")
    scale_fn = _lookup(SCALES, scale, "scale")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P,G], got shape {tuple(rewards.shape)}")
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 (population) or 1 (sample), got {ddof!r}")
    r = rewards if rewards.is_floating_point() else rewards.float()
    centered = r - base_fn(r, greedy_rewards)
    return scale_fn(centered, r, ddof, eps)


# --- token-level returns and whitening (REINFORCE++, Hu 2025, arXiv 2501.03262) -------------------
# Shapes: N completions, T positions; mask [N,T] marks the counted tokens.

def token_returns(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Reward-to-go G_it = sum_{s >= t} gamma^(s-t) m_is r_is, [N,T] -> [N,T] (0 where masked)."""
    m = mask.bool()
    r = torch.where(m, token_rewards, torch.zeros((), dtype=token_rewards.dtype, device=token_rewards.device))
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + gamma * running
        out[:, t] = running
    return torch.where(m, out, torch.zeros_like(out))


def whiten(values: Tensor, mask: Tensor, ddof: int = 1, eps: float = 1e-6, shift_mean: bool = True) -> Tensor:
    """(x - mu) / (sigma + eps) with mu, sigma token-weighted over the counted tokens of the whole batch
    (REINFORCE++'s global normalisation); 0 where masked. One counted token: sigma = 0, guarded."""
    m = mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    n = m.sum()
    mu = torch.where(m, values, zero).sum() / n.clamp(min=1)
    var = torch.where(m, (values - mu) ** 2, zero).sum() / (n - ddof).clamp(min=1)
    out = ((values - mu) if shift_mean else values) / (var.sqrt() + eps)
    return torch.where(m, out, zero)


def reinforce_pp_advantages(rewards: Tensor, mask: Tensor, kl: Tensor | None, kl_coef: float, *,
                            ddof: int = 1, eps: float = 1e-6) -> Tensor:
    """REINFORCE++ (faithful form): token rewards r_it = -kl_coef * kl_it + 1[t = last_i] R_i, returns
    with gamma = 1, whitened over all counted tokens of the batch. rewards [N], mask [N,T], kl [N,T]
    (k1 of the behaviour policy against the reference; None = no KL) -> A [N,T]."""
    m = mask.bool()
    return whiten(token_returns(outcome_token_rewards(rewards, m, kl, kl_coef), m), m, ddof, eps)


def outcome_token_rewards(rewards: Tensor, mask: Tensor, kl: Tensor | None, kl_coef: float) -> Tensor:
    """Token rewards r_it = -kl_coef * kl_it + 1[t = last_i] R_i: the outcome reward on each row's last
    counted token, the per-token KL penalty (None = none) everywhere. rewards [N], mask [N,T] -> [N,T]."""
    m = mask.bool()
    last = m.cumsum(1).eq(m.sum(1, keepdim=True)) & m  # [N,T] the last counted token of each row
    R = rewards if rewards.is_floating_point() else rewards.float()
    token_r = torch.where(last, R[:, None], torch.zeros((), dtype=R.dtype, device=R.device))  # [N,T]
    if kl is not None:
        token_r = token_r - kl_coef * kl.to(token_r.dtype)
    return token_r


# --- GAE with a learned critic (PPO: Schulman et al. 2017, arXiv 1707.06347) ----------------------

def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0
        ) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2015, arXiv 1506.02438), per row from the end:
    delta_t = r_t + gamma V_{t+1} - V_t (V after the last counted token = 0), A_t = delta_t + gamma lam A_{t+1};
    returns R_t = A_t + V_t. token_rewards, values, mask [N,T] -> (A, R) [N,T], 0 where masked.

    V_it is the value of the prefix before token t is emitted (the positions of logp). A masked token
    inside a row (tool output, an IS-rejected token) takes no TD step: the next value and the running
    advantage are carried across it, as veRL does. lam = 1 gives A = Monte-Carlo return - V."""
    m = mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    r, v = torch.where(m, token_rewards.to(values.dtype), zero), torch.where(m, values, zero)
    adv = torch.zeros_like(v)
    next_v, running = torch.zeros_like(v[:, 0]), torch.zeros_like(v[:, 0])  # [N]
    for t in reversed(range(v.shape[1])):
        step = r[:, t] + gamma * next_v - v[:, t] + gamma * lam * running
        next_v = torch.where(m[:, t], v[:, t], next_v)
        running = torch.where(m[:, t], step, running)
        adv[:, t] = running
    adv = torch.where(m, adv, zero)
    return adv, torch.where(m, adv + v, zero)


def batch_token_scale(advantages: Tensor, mask: Tensor, *, ddof: int = 1, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline's global normalisation: broadcast A [N] over each completion's tokens and
    whiten over all counted tokens (token-weighted mean and std; re-centres, so a dead group gets
    -mu/sigma, unlike the `batch` scale) -> [N,T]."""
    a = advantages if advantages.is_floating_point() else advantages.float()
    return whiten(a[:, None].expand(mask.shape), mask, ddof, eps)
