"""The learned critic's math (PPO: Schulman et al. 2017, arXiv 1707.06347): the clipped value loss and
explained variance, pure tensor functions. GAE itself is `ablate.rl.advantages.gae`.

Shapes: N completions, T completion positions; V_it is the value of the prefix before token t, at the
positions of logp. `mask` [N,T] marks the counted tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ablate.rl.stats import masked_mean


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *,
               value_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """l_it = 1/2 max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, -eps_v, eps_v), averaged
    over the counted tokens (token mean); value_clip None: l = 1/2 (V - R)^2. values [N,T] (with grad),
    old_values and returns [N,T] detached. Stat clipfrac: share of counted tokens whose clipped term is the
    larger (the one in use; such a token's gradient is 0 when V_clip is at its bound)."""
    m = mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    ret, old = returns.detach().to(values.dtype), old_values.detach().to(values.dtype)
    plain = (values - ret) ** 2
    if value_clip is None:
        per_tok, clipped = plain, torch.zeros_like(m)
    else:
        v_clip = old + (values - old).clamp(-value_clip, value_clip)
        other = (v_clip - ret) ** 2
        per_tok, clipped = torch.maximum(plain, other), (other > plain).detach()
    loss = torch.where(m, 0.5 * per_tok, zero).sum() / m.sum().clamp(min=1)
    return loss, {"clipfrac": masked_mean(clipped.float(), m)}


@torch.no_grad()
def explained_variance(returns: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """EV = 1 - Var(R - V) / Var(R) over counted tokens (population variances): 1 a perfect critic, 0 no
    better than a constant, < 0 worse. NaN when the returns have no variance (undefined)."""
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    var_r = r.var(unbiased=False) if r.numel() else torch.tensor(float("nan"), dtype=torch.float64)
    if not var_r > 0:
        return torch.tensor(float("nan"), dtype=torch.float64)
    return 1 - (r - v).var(unbiased=False) / var_r
