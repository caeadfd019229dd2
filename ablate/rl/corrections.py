"""Importance-sampling corrections for the behaviour -> old policy shift, and its mismatch metrics.

The tokens of a rollout were sampled by pi_behav (another engine's numerics, and/or a policy k optimiser
steps old); PPO's ratio is anchored at pi_old, the trainer's recompute at the start of the update
(docs/offpolicy.md). The per-token importance weight between the two is

    w_it = pi_old(y_it) / pi_behav(y_it) = exp(old_logp_it - behav_logp_it)          [N, T]

and per completion W_i = prod_t w_it (sequence ratio), G_i = exp(mean_t log w_it) (geometric mean).
Decoupled mode (Hilton, Cobbe, Schulman 2021, "Batch size-invariance for policy optimization",
arXiv 2110.00641): the PPO per-token loss is multiplied by a detached corrected weight w_hat, and
rejected tokens leave the loss mask before any denominator is computed.

Every entry of `IS_CORRECTIONS` is a pure function with one signature:

    fn(old_logp [N,T], behav_logp [N,T], mask [N,T], *, cap, lo, hi)
        -> (weights [N,T] detached, keep [N,T] bool, stats {"is_cap_frac": scalar})

`keep` is `mask` minus the rejected tokens; `weights` is w_hat on kept tokens, 0 on rejected ones, 1
where `mask` is 0. Each entry reads only the parameters it needs. Masked positions may hold any finite
garbage: log w is zeroed there first. An empty row has W_i = G_i = 1 and counts as kept.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ablate.rl.stats import masked_mean

Correction = Callable[..., tuple[Tensor, Tensor, dict[str, Tensor]]]


def _log_w(old_logp: Tensor, behav_logp: Tensor, m: Tensor) -> Tensor:
    """log w [N,T], 0 where masked (so w = 1 there and sums over a row skip it)."""
    return torch.where(m, (old_logp - behav_logp).double(), torch.zeros((), dtype=torch.float64, device=m.device))


def _row_log_w(log_w: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """(log W_i, log G_i) [N,1]: sum and mean over the row's counted tokens (0 for an empty row)."""
    total = log_w.sum(1, keepdim=True)
    return total, total / m.sum(1, keepdim=True).clamp(min=1)


def _finish(weights: Tensor, keep: Tensor, m: Tensor, capped: Tensor, dtype) -> tuple[Tensor, Tensor, dict]:
    one, zero = torch.ones((), dtype=weights.dtype), torch.zeros((), dtype=weights.dtype)
    weights = torch.where(m, torch.where(keep, weights, zero), one)  # where: no inf * 0 = NaN
    stats = {"is_cap_frac": masked_mean((capped & m).double(), m).to(dtype)}
    return weights.to(dtype).detach(), keep & m, stats


def _in_band(x: Tensor, lo: float | None, hi: float | None) -> Tensor:
    ok = torch.ones_like(x, dtype=torch.bool)
    if lo is not None:
        ok &= x >= lo
    if hi is not None:
        ok &= x <= hi
    return ok


def _none(old_logp, behav_logp, mask, *, cap, lo, hi):
    # no correction: the stale / mismatched tokens are trained on as if sampled by pi_old
    m = mask.bool()
    none = torch.zeros_like(m)
    return _finish(torch.ones_like(old_logp, dtype=torch.float64), m, m, none, old_logp.dtype)


def _tis(old_logp, behav_logp, mask, *, cap, lo, hi):
    # token TIS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    # Training", fengyao.notion.site/off-policy-rl): w_hat = min(w, C); no token is dropped
    m = mask.bool()
    w = _log_w(old_logp, behav_logp, m).exp()
    return _finish(w.clamp(max=cap), m, m, w > cap, old_logp.dtype)


def _mis(old_logp, behav_logp, mask, *, cap, lo, hi):
    # token MIS (Liu, Li et al. 2025, "When Speed Kills Stability", richardli.xyz/rl-collapse): tokens with
    # w > C (or below an optional lower bound lo) leave the mask; the others keep their weight w
    m = mask.bool()
    w = _log_w(old_logp, behav_logp, m).exp()
    return _finish(w, m & _in_band(w, lo, cap), m, torch.zeros_like(m), old_logp.dtype)


def _icepop(old_logp, behav_logp, mask, *, cap, lo, hi):
    # IcePop (Ling team 2025, Ring-1T report "Every Step Evolves", arXiv 2510.18855): two-sided token
    # masking, keep w inside [lo, hi] as the weight (the Ring-1T band is [0.5, 5])
    m = mask.bool()
    w = _log_w(old_logp, behav_logp, m).exp()
    return _finish(w, m & _in_band(w, lo, hi), m, torch.zeros_like(m), old_logp.dtype)


def _seq_tis(old_logp, behav_logp, mask, *, cap, lo, hi):
    # sequence TIS (Liu, Li et al. 2025): w_hat_i = min(W_i, C) on every token of row i
    m = mask.bool()
    log_W, _ = _row_log_w(_log_w(old_logp, behav_logp, m), m)
    W = log_W.exp().expand_as(m)  # may be inf for a long row: min(inf, C) = C
    return _finish(W.clamp(max=cap), m, m, W > cap, old_logp.dtype)


def _seq_mis(old_logp, behav_logp, mask, *, cap, lo, hi):
    # sequence MIS (Liu, Li et al. 2025): the whole row leaves the mask when W_i > C (or W_i < lo)
    m = mask.bool()
    log_W, _ = _row_log_w(_log_w(old_logp, behav_logp, m), m)
    W = log_W.exp().expand_as(m)
    return _finish(W, m & _in_band(W, lo, cap), m, torch.zeros_like(m), old_logp.dtype)


def _seq_geo_mask(old_logp, behav_logp, mask, *, cap, lo, hi):
    # geometric-mean rejection (Geo-RS; same blog series, veRL docs): keep row i iff lo <= G_i <= hi, a 0/1
    # mask with no weight; length-invariant, unlike W_i. No default band: implementations disagree widely
    m = mask.bool()
    _, log_G = _row_log_w(_log_w(old_logp, behav_logp, m), m)
    keep = m & _in_band(log_G.exp(), lo, hi).expand_as(m)
    return _finish(torch.ones_like(log_G).expand_as(m), keep, m, torch.zeros_like(m), old_logp.dtype)


IS_CORRECTIONS: dict[str, Correction] = {
    "none": _none,
    "tis": _tis,
    "mis": _mis,
    "icepop": _icepop,
    "seq_tis": _seq_tis,
    "seq_mis": _seq_mis,
    "seq_geo_mask": _seq_geo_mask,
}


# --- mismatch metrics (detached, over the counted tokens of `mask`) ---------------------------------

def _ess_frac(x: Tensor, m: Tensor) -> Tensor:
    """Kish effective sample size over n counted entries, as a share: (sum x)^2 / (n sum x^2)."""
    x = torch.where(m, x, torch.zeros_like(x))
    return x.sum() ** 2 / (m.sum().double() * (x**2).sum())


@torch.no_grad()
def mismatch_metrics(old_logp: Tensor, behav_logp: Tensor, mask: Tensor, weights: Tensor, keep: Tensor,
                     lag: Tensor) -> dict[str, Tensor]:
    """Behaviour-vs-old mismatch of one batch, 0-dim float64 tensors (names without the `offpolicy/` prefix;
    definitions in ablate/runs/metrics.py). `weights`, `keep` come from an IS correction, `lag` [N] is the
    number of optimiser steps between sampling row i and this update. NaN when no token counts."""
    m = mask.bool()
    log_w = _log_w(old_logp, behav_logp, m)                      # [N,T] float64, 0 where masked
    w = log_w.exp()
    rows = m.any(1)                                              # [N] rows with a counted token
    log_W, _ = _row_log_w(log_w, m)
    W = log_W.squeeze(1).exp()                                   # [N]
    prob_diff = torch.where(m, (behav_logp.double().exp() - old_logp.double().exp()).abs(), 0.0).amax(1)
    kept_w = weights.double()
    n_rows, kept = rows.sum().double(), keep.bool() & m
    lag_tok = lag.double()[:, None].expand_as(log_w)
    return {
        "kl_k1": masked_mean(-log_w, m),
        "kl_k3": masked_mean(torch.expm1(log_w) - log_w, m),
        "chi2_token": masked_mean(w**2, m) - 1,
        "chi2_seq": torch.where(rows, W**2, 0.0).sum() / n_rows - 1,
        "ess_frac": _ess_frac(w, m),
        "ess_frac_seq": _ess_frac(W, rows),
        "ess_frac_corrected": _ess_frac(kept_w, kept),
        "weight_mean": masked_mean(w, m),
        "weight_max": torch.where(m, w, -torch.inf).amax(),
        "rejected_token_frac": 1 - kept.sum().double() / m.sum(),
        "rejected_seq_frac": (rows & ~kept.any(1)).sum().double() / n_rows,
        "max_abs_prob_diff": torch.where(rows, prob_diff, 0.0).sum() / n_rows,
        "lag_mean": masked_mean(lag_tok, m),
        "lag_max": torch.where(m, lag_tok, -torch.inf).amax(),
    }
