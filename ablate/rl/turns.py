"""Credit in multi-turn episodes (docs/environments.md): one advantage per turn, broadcast to the turn's tokens.

Episode i of a group has turns t = 1..T_i; the environment's reward after turn t is r_{i,t} (a tool-error
penalty, say; the outcome is the last turn's), and R_i holds the episode-level terms (format, overlong, KL in
the reward). The episode return is G_{i,1} = R_i + sum_t r_{i,t}, the trainer's usual reward; the return
from turn t on is G_{i,t} = G_{i,1} - sum_{t' < t} r_{i,t'}. Baseline b_i and divisor s_i come from the
group's episode returns G_{.,1} with the registered estimators (ablate/rl/advantages.py), so

    A_{i,t} = (G_{i,t} - b_i) / s_i     (s_i = 1 where the episode returns have no spread: see `_turn`).

`CREDITS` holds the two assignments, one signature: `episode` gives every turn A_{i,1} (outcome credit, the
default); `turn` gives each turn its own A_{i,t}. Shapes: P prompts, G episodes each, K turn slots.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ablate.rl.advantages import BASELINES, DIVISORS

CreditFn = Callable[..., Tensor]  # (returns [P,G,K], *, baseline, scale, ddof, eps) -> A [P,G,K]


def turn_returns(episode_return: Tensor, turn_rewards: Tensor) -> Tensor:
    """G_{i,t} = G_{i,1} - sum_{t' < t} r_{i,t'}: episode_return [...], turn_rewards [..., K] -> [..., K]."""
    before = turn_rewards.cumsum(-1) - turn_rewards  # [..., K] rewards of the turns before t
    return episode_return[..., None].to(turn_rewards.dtype) - before


def _episode(returns: Tensor, *, baseline: str, scale: str, ddof: int, eps: float) -> Tensor:
    # outcome credit: every turn gets its episode's advantage (the single-turn estimator on G_{.,1})
    return _turn(returns[..., :1], baseline=baseline, scale=scale, ddof=ddof, eps=eps).expand_as(returns)


def _turn(returns: Tensor, *, baseline: str, scale: str, ddof: int, eps: float) -> Tensor:
    # turn-level credit: the return from turn t on, against the episode returns' baseline and scale. Where the
    # episode returns have no spread (the std part of the divisor is 0: a dead group under `group`), the
    # divisor is 1: the single-turn estimator gives 0 there, but turn deviations (a -0.1 penalty) are not 0,
    # and dividing them by eps alone would blow them up a million-fold
    first = returns[..., 0]  # [P,G] episode returns G_{i,1}
    b = BASELINES[baseline](first, None)
    s = DIVISORS[scale](first - b, first, ddof, eps)
    s = torch.where(s <= eps, torch.ones_like(s), s) if scale != "none" else s
    return (returns - b[..., None]) / s[..., None]


CREDITS: dict[str, CreditFn] = {
    "episode": _episode,
    "turn": _turn,
}


def token_advantages(turn_adv: Tensor, turn: Tensor) -> Tensor:
    """Each token's turn advantage: turn_adv [N,K], turn [N,T] (the token's turn index) -> [N,T]."""
    return turn_adv.gather(1, turn.clamp(0, turn_adv.shape[1] - 1).long().to(turn_adv.device))


def credit_advantages(credit: str, episode_returns: Tensor, turn_rewards: Tensor, turn: Tensor, *, baseline: str,
                      scale: str, ddof: int = 1, eps: float = 1e-6) -> Tensor:
    """Token-level advantages [N,T] of N = P*G episodes: episode_returns [P,G], turn_rewards [N,K], turn [N,T]."""
    if credit not in CREDITS:
        raise ValueError(f"unknown credit {credit!r}; allowed: {', '.join(CREDITS)}")
    if baseline == "greedy":
        raise ValueError("turn credit has no greedy baseline (it needs one greedy episode per prompt)")
    P, G = episode_returns.shape
    returns = turn_returns(episode_returns.flatten().to(turn_rewards.device), turn_rewards).view(P, G, -1)
    adv = CREDITS[credit](returns, baseline=baseline, scale=scale, ddof=ddof, eps=eps)  # [P,G,K]
    return token_advantages(adv.flatten(0, 1), turn)
