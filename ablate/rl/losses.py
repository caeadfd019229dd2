"""Policy-loss components as pure tensor functions. DESIGN.md section 3.

Shapes: N completions, T completion positions (padded), V vocabulary. `mask` [N,T] is 1/True on
completion tokens that count. Masked positions may hold any finite garbage: every function here
selects with torch.where before doing arithmetic, so they change neither the loss nor its gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ablate.rl.stats import masked_mean


def _lookup(registry: dict, name: str, what: str):
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; allowed: {', '.join(registry)}")
    return registry[name]


def _zero_where_masked(x: Tensor, mask: Tensor) -> Tensor:
    # where, not x * mask: inf * 0 = NaN, and the gradient into masked positions is exactly 0
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


# --- log-probabilities and entropy ----------------------------------------------------------------

def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log p(tokens) from logits [N,T,V] and token ids [N,T] -> [N,T] (float32 or wider).

    The caller has already divided the logits by the sampling temperature. gather - logsumexp avoids
    materialising a second [N,T,V] log_softmax tensor.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    picked = logits.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)  # [N,T]
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy (nats) of the full next-token distribution, [N,T,V] -> [N,T].

    H = -sum p log p. log p is clamped to the dtype's min so that -inf logits (p = 0) give 0 * finite
    instead of 0 * -inf = NaN, in the forward and the backward pass.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logp = torch.log_softmax(logits, dim=-1).clamp(min=torch.finfo(logits.dtype).min)
    return -(logp.exp() * logp).sum(-1)


# --- the same from hidden states, one chunk of full-vocabulary logits at a time ------------------

CHUNK_ELEMENTS = 2**25  # full-vocabulary values per chunk: 128 MiB in fp32 (221 positions at V=151,936)


def chunked_token_logprobs(
    hidden: Tensor,  # [M,H] final hidden states at the scored positions
    head: Callable[[Tensor], Tensor],  # [m,H] -> logits [m,V] (the lm-head)
    tokens: Tensor,  # [M] token ids
    temperature: float,
    entropy: Literal["none", "value", "grad"] = "none",
    chunk: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`token_logprobs(head(hidden) / temperature, tokens)` -> [M], and `entropy_from_logits` of the same
    logits -> [M] ("value": no autograd; "grad": differentiable; "none": not computed), holding at most
    `chunk` rows of [., V] logits at a time (default CHUNK_ELEMENTS // V rows).

    Under autograd each chunk is checkpointed: only its hidden states are saved, and the backward pass
    recomputes its logits, so no [M, V] tensor ever exists. Row for row the same arithmetic as the
    unchunked functions: the same numbers, up to the last bit of a matmul blocked differently.
    """
    def score(h: Tensor, tok: Tensor) -> tuple[Tensor, Tensor]:
        logits = head(h) / temperature  # [m,V]
        logp = token_logprobs(logits, tok)  # [m]
        if entropy == "grad":
            return logp, entropy_from_logits(logits)
        with torch.no_grad():
            ent = entropy_from_logits(logits) if entropy == "value" else logp.new_zeros(())
        return logp, ent

    if hidden.shape[0] == 0:  # no position to score
        empty = hidden.new_zeros(0, dtype=torch.promote_types(hidden.dtype, torch.float32))
        return empty, (empty if entropy != "none" else None)
    if chunk is None:
        with torch.no_grad():
            chunk = max(1, CHUNK_ELEMENTS // head(hidden[:1]).shape[-1])  # the head tells V
    logps, ents = [], []
    for h, tok in zip(hidden.split(chunk), tokens.split(chunk)):
        if torch.is_grad_enabled() and h.requires_grad:
            logp, ent = checkpoint(score, h, tok, use_reentrant=False)
        else:
            logp, ent = score(h, tok)
        logps.append(logp)
        ents.append(ent)
    return torch.cat(logps), (torch.cat(ents) if entropy != "none" else None)


# --- KL estimators (Schulman 2020, "Approximating KL divergence"), d = ref_logp - logp -------------

def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp  # -d: unbiased, high variance, can be negative per token


def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (ref_logp - logp) ** 2  # d^2/2: biased, low variance, >= 0


def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    d = ref_logp - logp
    return torch.expm1(d) - d  # exp(d) - d - 1, >= 0; expm1 avoids cancellation for small d


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token KL estimate [N,T]; the trainer aggregates it (loss) or sums it into rewards."""
    return _lookup(KL_ESTIMATORS, estimator, "KL estimator")(logp, ref_logp)


# --- aggregation: fn(values[N,T], mask[N,T], max_len) -> scalar -----------------------------------

def _seq_mean_token_mean(values: Tensor, mask: Tensor, max_len: int) -> Tensor:
    # GRPO: mean over each completion's tokens, then over completions. A completion with no counted
    # token is excluded from the outer mean (it has no mean); if none counts, the result is 0.
    m = mask.bool()
    n_tok = m.sum(1)  # [N]
    per_seq = _zero_where_masked(values, m).sum(1) / n_tok.clamp(min=1)  # [N]
    has_tok = n_tok > 0
    return _zero_where_masked(per_seq, has_tok).sum() / has_tok.sum().clamp(min=1)


def _token_mean(values: Tensor, mask: Tensor, max_len: int) -> Tensor:
    # DAPO: every token of the batch weighs the same, so long completions weigh more
    m = mask.bool()
    return _zero_where_masked(values, m).sum() / m.sum().clamp(min=1)


def _seq_mean_token_sum_norm(values: Tensor, mask: Tensor, max_len: int) -> Tensor:
    # Dr. GRPO (Liu et al. 2025): divide by a constant (max completion length), not by each
    # completion's own length, to remove the length bias; mean over all N completions (constant too).
    m = mask.bool()
    return (_zero_where_masked(values, m).sum(1) / max_len).mean()


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, int], Tensor]] = {
    "seq_mean_token_mean": _seq_mean_token_mean,
    "token_mean": _token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}


# --- aggregation normalisers: fn(mask[N,T], max_len) -> the divisor of the aggregation above --------
# agg(values, mask) = (a sum over rows) / normaliser(mask). Split the rows into micro-batches and
# sum_k agg(part_k) * normaliser(part_k) / normaliser(all) = agg(all): gradient accumulation that
# equals the one-pass gradient (dividing each micro-batch by its own count would reweight rows).

def _n_tokens(mask: Tensor, max_len: int) -> Tensor:
    return mask.bool().sum().clamp(min=1)


def _n_nonempty_rows(mask: Tensor, max_len: int) -> Tensor:
    return (mask.bool().sum(1) > 0).sum().clamp(min=1)


def _n_rows(mask: Tensor, max_len: int) -> Tensor:
    return torch.tensor(mask.shape[0], device=mask.device)


AGG_NORMALISERS: dict[str, Callable[[Tensor, int], Tensor]] = {
    "seq_mean_token_mean": _n_nonempty_rows,
    "token_mean": _n_tokens,
    "seq_mean_token_sum_norm": _n_rows,
}


def micro_weight(agg: str, micro_mask: Tensor, whole_mask: Tensor, max_len: int, dtype: torch.dtype) -> Tensor:
    """Scale of a micro-batch's aggregated loss so that the micro-batches sum to the whole minibatch's."""
    norm = _lookup(AGG_NORMALISERS, agg, "loss aggregation")
    return norm(micro_mask, max_len).to(dtype) / norm(whole_mask, max_len).to(dtype)


# --- importance ratio: fn(log_ratio[N,T] (0 where masked), mask[N,T]) -> ratio[N,T] ---------------

def _token_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    return log_ratio.exp()


def _sequence_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    # GSPO (Zheng et al. 2025): length-normalised sequence likelihood ratio
    # exp(mean_t log ratio), the same for every token of the completion; the gradient of the mean
    # reaches every counted token.
    seq = log_ratio.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)  # [N,1]
    return seq.exp().expand_as(log_ratio)


RATIO_LEVELS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "token": _token_ratio,
    "sequence": _sequence_ratio,
}


def importance_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """rho [N,T] = pi/pi_old at token or sequence level; masked positions hold ratio 1 (token level)."""
    fn = _lookup(RATIO_LEVELS, level, "ratio level")
    m = mask.bool()
    return fn(_zero_where_masked(logp - old_logp, m), m)


# --- clipped surrogate ----------------------------------------------------------------------------

def policy_loss(
    logp: Tensor,  # [N,T] current policy, requires grad
    old_logp: Tensor,  # [N,T] behaviour policy
    advantages: Tensor,  # [N] one per completion
    mask: Tensor,  # [N,T]
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    ratio_level: str = "token",
    agg: str = "seq_mean_token_mean",
    max_len: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, l = -min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A), aggregated by `agg`.

    dual_clip c > 1 (Ye et al. 2020): for A < 0 the objective is max(min(...), c*A), bounding the
    loss when rho is huge on a negative-advantage token. Stats are detached means over counted tokens
    (token-weighted whatever `agg` is): clip_frac_low (rho < 1-eps_low, A<0), clip_frac_high
    (rho > 1+eps_high, A>0), clip_frac (either), dual_clip_frac (rho > c, A<0; 0 when off),
    ratio_mean, ratio_max (0 when no token counts).
    """
    agg_fn = _lookup(AGGREGATIONS, agg, "loss aggregation")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    m = mask.bool()
    rho = importance_ratio(logp, old_logp, m, ratio_level)  # [N,T]
    adv = advantages.to(rho.dtype)[:, None]  # [N,1]
    clipped = rho.clamp(1 - eps_low, 1 + eps_high)
    obj = torch.minimum(rho * adv, clipped * adv)
    if dual_clip is not None:
        obj = torch.where(adv < 0, torch.maximum(obj, dual_clip * adv), obj)
    loss = agg_fn(-obj, m, max_len)

    with torch.no_grad():
        low = (rho < 1 - eps_low) & (adv < 0)
        high = (rho > 1 + eps_high) & (adv > 0)
        dual = (rho > dual_clip) & (adv < 0) if dual_clip is not None else torch.zeros_like(m)
        # -inf where masked, then clamp: 0 (not -inf) when no token counts, and no host sync
        ratio_max = torch.where(m, rho, torch.full_like(rho, -torch.inf)).amax().clamp(min=0)
        stats = {
            "clip_frac_low": masked_mean(low.float(), m),
            "clip_frac_high": masked_mean(high.float(), m),
            "clip_frac": masked_mean((low | high).float(), m),
            "dual_clip_frac": masked_mean(dual.float(), m),
            "ratio_mean": masked_mean(rho, m),
            "ratio_max": ratio_max,
        }
    return loss, {k: v.detach() for k, v in stats.items()}
