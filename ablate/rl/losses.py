"""Policy-loss components as pure tensor functions. docs/recipes.md, "Policy loss" to "Entropy bonus";
the policy losses themselves are the registry `POLICY_LOSSES` (one signature, `PolicyLossFn`).

Shapes: N completions, T completion positions (padded), V vocabulary. `mask` [N,T] is 1/True on
completion tokens that count. Masked positions may hold any finite garbage: every function here
selects with torch.where before doing arithmetic, so they change neither the loss nor its gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

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
    materialising a second [N,T,V] log_softmax tensor. The logsumexp is max + log sum exp(z - max), the
    sampler's arithmetic (`sampling.draw`, `fused_head`): on-policy, behaviour and old log-probs of equal
    logits agree bit for bit (torch.logsumexp rounds otherwise). The max is a constant to autograd.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    picked = logits.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)  # [N,T]
    return picked - logsumexp(logits)


def logsumexp(logits: Tensor) -> Tensor:
    """log sum_j exp(z_j) over the last dim, [..., V] -> [...], as max + log sum exp(z - max)."""
    top = logits.detach().amax(-1, keepdim=True)
    return (top + (logits - top).exp().sum(-1, keepdim=True).log()).squeeze(-1)


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


def log_importance_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """log rho [N,T] without forming rho (0 where masked at token level)."""
    _lookup(RATIO_LEVELS, level, "ratio level")
    m = mask.bool()
    delta = _zero_where_masked(logp - old_logp, m)
    if level == "token":
        return delta
    return (delta.sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)).expand_as(delta)


def token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """A as [N,1] (one per completion, broadcasts over tokens) or [N,T] (token-level), in like's dtype."""
    adv = advantages.to(like.dtype)
    if adv.dim() == 1:
        return adv[:, None]
    if adv.shape != like.shape:
        raise ValueError(f"advantages must be [N] or [N,T]={tuple(like.shape)}, got {tuple(adv.shape)}")
    return adv


def _weighted(per_token: Tensor, token_weight: Tensor | None) -> Tensor:
    return per_token if token_weight is None else per_token * token_weight.to(per_token.dtype)


def _ratio_stats(rho: Tensor, m: Tensor) -> dict[str, Tensor]:
    # -inf where masked, then clamp: 0 (not -inf) when no token counts, and no host sync
    ratio_max = torch.where(m, rho, torch.full_like(rho, -torch.inf)).amax().clamp(min=0)
    return {"ratio_mean": masked_mean(rho, m), "ratio_max": ratio_max}


@torch.no_grad()
def clip_stats(x: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> tuple[dict[str, Tensor], Tensor]:
    """PPO's one-sided clip of x (the ratio, or GMPO's log-ratio) to (low, high): the tokens it clips, bool
    [N,T] (x < low where A < 0, x > high where A > 0: the surrogate is flat there), and their shares over
    the counted tokens of `mask`: clip_frac_low, clip_frac_high, clip_frac (either)."""
    below, above = (x < low) & (adv < 0), (x > high) & (adv > 0)
    clipped = below | above
    m = mask.bool()
    return {"clip_frac_low": masked_mean(below.float(), m), "clip_frac_high": masked_mean(above.float(), m),
            "clip_frac": masked_mean(clipped.float(), m)}, clipped


def _covariance(logp: Tensor, advantages: Tensor, m: Tensor) -> Tensor:
    """Cov_it = (logp_it - mu_lp)(A_it - mu_A) over counted tokens (logp detached), 0 where masked.

    mu_lp, mu_A are token-weighted means over the whole batch passed in: a batch-level statistic
    (Cui et al. 2025, arXiv 2505.22617). Its masked mean is the `policy/entropy_adv_cov` metric.
    """
    lp = _zero_where_masked(logp.detach(), m)
    adv = token_advantages(advantages, lp).expand_as(lp)
    cov = (lp - masked_mean(lp, m)) * (adv - masked_mean(adv, m))
    return _zero_where_masked(cov, m)


# --- the policy-loss registry ---------------------------------------------------------------------
# Every entry has one signature (`PolicyLossFn`), registered with `@register_policy_loss(name)`: it takes
# every keyword and ignores what it does not use. Each per-token loss is aggregated with
# AGGREGATIONS[agg] over `mask`, so a micro-batch's loss scaled by (micro denominator / minibatch
# denominator) sums to the minibatch loss; GMPO has its own aggregation (mean over non-empty rows, the
# denominator of `seq_mean_token_mean`). Stats are detached scalars; every entry reports ratio_mean and
# ratio_max. The config's `recipe.policy_loss` names are the registry's keys (tests/test_conformance.py).

@dataclass(frozen=True)
class LossParams:
    """The parameters of every policy loss: the `recipe.*` fields of the same names (and their defaults,
    tests/test_conformance.py), of which each entry reads its own; `generator` draws Clip-Cov's tokens
    (ablate/train/plan.py seeds one per step)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    ratio_level: str = "token"
    cispo_cap: float = 5.0
    gmpo_eps: float = 0.4
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_frac: float = 2e-3
    kl_cov_coef: float = 1.0
    delta: float = 4.0
    generator: torch.Generator | None = None


class PolicyLossFn(Protocol):
    def __call__(
        self,
        logp: Tensor,  # [N,T] current policy, requires grad
        old_logp: Tensor,  # [N,T] the ratio's anchor pi_old
        advantages: Tensor,  # [N] one per completion, or [N,T] per token (REINFORCE++, GAE)
        mask: Tensor,  # [N,T] counted tokens
        *,
        agg: str,  # AGGREGATIONS key
        max_len: int,  # the aggregation's constant length
        params: LossParams,
        token_weight: Tensor | None = None,  # [N,T] multiplies each token's loss, not the denominators
        selected: Tensor | None = None,  # [N,T] a batch-level selection made over the whole minibatch
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


class SelectionFn(Protocol):
    def __call__(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, params: LossParams
                 ) -> Tensor: ...


POLICY_LOSSES: dict[str, PolicyLossFn] = {}
# An entry's batch-level token selection (Clip-Cov / KL-Cov's covariance over the whole batch passed in), bool
# [N,T]: with micro-batches the trainer computes it over the whole minibatch and passes each micro-batch its
# rows as `selected` (ablate/train/recipes.py::covariance_selection); without, the loss selects itself.
COV_SELECTIONS: dict[str, SelectionFn] = {}


def register_policy_loss(name: str, selection: SelectionFn | None = None) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Add the decorated function to POLICY_LOSSES under `name` (and its batch-level `selection`)."""
    def add(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is registered twice")
        POLICY_LOSSES[name] = fn
        if selection is not None:
            COV_SELECTIONS[name] = selection
        return fn
    return add


def _clipped_surrogate(logp, old_logp, advantages, mask, agg, max_len, eps_low: float, eps_high: float,
                       dual_clip: float | None, ratio_level: str, token_weight: Tensor | None):
    """PPO clipped surrogate, l = -min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A), aggregated by `agg`.

    dual_clip c > 1 (Ye et al. 2020): for A < 0 the objective is max(min(...), c*A), bounding the
    loss when rho is huge on a negative-advantage token. Stats are detached means over counted tokens
    (token-weighted whatever `agg` is): `clip_stats`, dual_clip_frac (rho > c, A<0; 0 when off),
    ratio_mean, ratio_max (0 when no token counts)."""
    agg_fn = _lookup(AGGREGATIONS, agg, "loss aggregation")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    m = mask.bool()
    rho = importance_ratio(logp, old_logp, m, ratio_level)  # [N,T]
    adv = token_advantages(advantages, rho)  # [N,1] or [N,T]
    clipped = rho.clamp(1 - eps_low, 1 + eps_high)
    obj = torch.minimum(rho * adv, clipped * adv)
    if dual_clip is not None:
        obj = torch.where(adv < 0, torch.maximum(obj, dual_clip * adv), obj)
    loss = agg_fn(_weighted(-obj, token_weight), m, max_len)
    with torch.no_grad():
        dual = (rho > dual_clip) & (adv < 0) if dual_clip is not None else torch.zeros_like(m)
        stats = {**clip_stats(rho, adv, m, 1 - eps_low, 1 + eps_high)[0],
                 "dual_clip_frac": masked_mean(dual.float(), m), **_ratio_stats(rho, m)}
    return loss, {k: v.detach() for k, v in stats.items()}


@register_policy_loss("ppo_clip")
def ppo_clip(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str, max_len: int,
             params: LossParams, token_weight: Tensor | None = None, selected: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO clipped surrogate (`_clipped_surrogate`) with recipe.dual_clip and recipe.ratio_level
    (GSPO: 'sequence'). `token_weight` scales each token's loss and leaves the denominators alone: the
    top-entropy selection, and the decoupled off-policy correction l_it := sg(w_hat_it) * l_it (the
    tokens were sampled by the behaviour policy, not by pi_old; the clip statistics still describe
    rho = pi/pi_old)."""
    return _clipped_surrogate(logp, old_logp, advantages, mask, agg, max_len, params.eps_low, params.eps_high,
                              params.dual_clip, params.ratio_level, token_weight)


@register_policy_loss("cispo")
def cispo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str, max_len: int,
          params: LossParams, token_weight: Tensor | None = None, selected: Tensor | None = None
          ) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax 2025, "MiniMax-M1", arXiv 2506.13585): l = -sg(min(rho, cap)) * A * logp.

    The clip bounds the importance weight but never drops a token: every counted token keeps the
    gradient -w*A (times the aggregation factor). Absolute cap, no floor (the paper's setting; TRL and
    SkyRL use a cap of 5 citing ScaleRL). The loss value depends on the level of logp and means nothing
    by itself; only its gradient does. Stat: cispo_cap_frac = share of counted tokens with rho > cap.
    """
    m = mask.bool()
    rho = importance_ratio(logp, old_logp, m, params.ratio_level).detach()  # [N,T]
    w = rho.clamp(max=params.cispo_cap)
    adv = token_advantages(advantages, rho)
    per_tok = -w * adv * _zero_where_masked(logp, m)  # where: masked logp may be -inf
    loss = _lookup(AGGREGATIONS, agg, "loss aggregation")(_weighted(per_tok, token_weight), m, max_len)
    stats = {"cispo_cap_frac": masked_mean((rho > params.cispo_cap).float(), m), **_ratio_stats(rho, m)}
    return loss, stats


@register_policy_loss("gmpo")
def gmpo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str, max_len: int,
         params: LossParams, token_weight: Tensor | None = None, selected: Tensor | None = None
         ) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673).

    Clip each token's log-ratio in log space to (-gmpo_eps, gmpo_eps), one-sided by the sign of A (as PPO
    does in ratio space), take the geometric mean over the completion, r_i = exp(sum_t m*clipped / |o_i|),
    l_i = -A_i * r_i, and average over the rows with at least one counted token (`agg` is ignored: GMPO
    is sequence-level by construction; so a per-token weight is not defined). A clipped token gets no
    gradient but its clipped value still scales its row.
    """
    m = mask.bool()
    if advantages.dim() != 1:
        raise ValueError("gmpo needs one advantage per completion, shape [N]")
    if token_weight is not None:
        raise ValueError("gmpo is sequence-level: a per-token weight (token selection, IS weights) is not defined")
    eps = params.gmpo_eps
    delta = _zero_where_masked(logp - old_logp, m)  # [N,T]
    adv = advantages.to(delta.dtype)[:, None]  # [N,1]
    clipped = delta.clamp(-eps, eps)
    tilde = torch.where(adv > 0, torch.minimum(delta, clipped), torch.maximum(delta, clipped))
    n_tok = m.sum(1)  # [N]
    r_bar = (_zero_where_masked(tilde, m).sum(1) / n_tok.clamp(min=1)).exp()  # [N]
    has_tok = n_tok > 0
    loss = _zero_where_masked(-advantages.to(r_bar.dtype) * r_bar, has_tok).sum() / has_tok.sum().clamp(min=1)
    with torch.no_grad():
        stats = {**clip_stats(delta, adv, m, -eps, eps)[0], **_ratio_stats(delta.exp(), m)}
    return loss, stats


@register_policy_loss("sapo")
def sapo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str, max_len: int,
         params: LossParams, token_weight: Tensor | None = None, selected: Tensor | None = None
         ) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv 2511.20347).

    Soft gate instead of a hard clip: l = -(4/tau) * sigmoid(tau * (rho - 1)) * A, tau = tau_pos for
    A > 0, tau_neg otherwise. At rho = 1 the gradient is the on-policy one; it decays smoothly away from 1.
    The paper aggregates per sequence (`seq_mean_token_mean`). The log-ratio is clamped to +-20 before
    exp (as veRL and SkyRL do) so a huge ratio gives a zero gate gradient, not inf * 0.
    Stat: soft_gate_mean = mean over counted tokens of the gradient weight 4*sigma*(1 - sigma).
    """
    m = mask.bool()
    log_ratio = log_importance_ratio(logp, old_logp, m, params.ratio_level).clamp(-20, 20)
    rho = log_ratio.exp()  # [N,T]
    adv = token_advantages(advantages, rho)
    tau = torch.where(adv > 0, torch.full_like(adv, params.tau_pos), torch.full_like(adv, params.tau_neg))
    sig = torch.sigmoid(tau * (rho - 1))
    per_tok = -(4 / tau) * sig * adv
    loss = _lookup(AGGREGATIONS, agg, "loss aggregation")(_weighted(per_tok, token_weight), m, max_len)
    with torch.no_grad():
        stats = {"soft_gate_mean": masked_mean((4 * sig * (1 - sig)).expand_as(rho), m),
                 **_ratio_stats(rho, m)}
    return loss, {k: v.detach() for k, v in stats.items()}


def clip_cov_selection(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, params: LossParams
                       ) -> Tensor:
    """Clip-Cov's zeroed tokens [N,T] (bool): n = max(1, floor(clip_cov_ratio * N_tok)) drawn uniformly
    (with `params.generator`) from the counted tokens with lb < Cov_it < ub that the PPO clip has not
    clipped. A statistic of the whole batch passed in (Cov's means, N_tok, the draw)."""
    m = mask.bool()
    with torch.no_grad():
        rho = importance_ratio(logp.detach(), old_logp, m, "token")
        adv = token_advantages(advantages, rho)
        clipped = clip_stats(rho, adv, m, 1 - params.eps_low, 1 + params.eps_high)[1]
        cov = _covariance(logp, advantages, m)
        cand = (m & ~clipped & (cov > params.clip_cov_lb) & (cov < params.clip_cov_ub)).flatten().nonzero().flatten()
        n_pick = max(1, math.floor(params.clip_cov_ratio * int(m.sum())))
        if len(cand) > n_pick:
            cand = cand[torch.randperm(len(cand), generator=params.generator)[:n_pick].to(cand.device)]
        drop = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
        drop[cand] = True
    return drop.view_as(m)


@register_policy_loss("clip_cov", selection=clip_cov_selection)
def clip_cov(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str, max_len: int,
             params: LossParams, token_weight: Tensor | None = None, selected: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

    PPO clip loss (token-level ratio), except that the tokens of `clip_cov_selection` get zero loss and
    gradient. The selection is a batch-level statistic: `selected` [N,T] passes in one computed over the
    whole minibatch (a micro-batch's rows of it); None computes it from the inputs. Stats: PPO's clip
    statistics, plus cov_select_frac.
    """
    m = mask.bool()
    rho = importance_ratio(logp, old_logp, m, "token")
    adv = token_advantages(advantages, rho)
    obj = torch.minimum(rho * adv, rho.clamp(1 - params.eps_low, 1 + params.eps_high) * adv)
    drop = clip_cov_selection(logp, old_logp, advantages, m, params) if selected is None else selected.bool() & m
    per_tok = torch.where(drop, torch.zeros_like(obj), -obj)
    loss = _lookup(AGGREGATIONS, agg, "loss aggregation")(_weighted(per_tok, token_weight), m, max_len)
    stats = {**clip_stats(rho, adv, m, 1 - params.eps_low, 1 + params.eps_high)[0],
             "cov_select_frac": masked_mean(drop.float(), m), **_ratio_stats(rho.detach(), m)}
    return loss, stats


def kl_cov_selection(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, params: LossParams
                     ) -> Tensor:
    """KL-Cov's penalised tokens [N,T] (bool): the n = max(1, floor(kl_cov_frac * N_tok)) counted tokens
    with the largest Cov_it, over the whole batch passed in."""
    m = mask.bool()
    with torch.no_grad():
        cov = torch.where(m, _covariance(logp, advantages, m), torch.full(m.shape, -torch.inf, device=m.device,
                                                                          dtype=logp.dtype))
        n_tok = int(m.sum())
        n_pick = min(max(1, math.floor(params.kl_cov_frac * n_tok)), n_tok)
        pick = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
        pick[cov.flatten().topk(n_pick).indices] = True
    return pick.view_as(m) & m


@register_policy_loss("kl_cov", selection=kl_cov_selection)
def kl_cov(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str, max_len: int,
           params: LossParams, token_weight: Tensor | None = None, selected: Tensor | None = None
           ) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617): no clip; the tokens of `kl_cov_selection` get a penalty
    coef * |log rho| (as in the authors' code): l = -rho*A + coef*|Delta| there, l = -rho*A elsewhere.
    `kl_cov_frac` is a fraction (authors' 7B setting 0.2 % = 2e-3). The selection is a batch-level
    statistic (see `clip_cov`: `selected` passes one in). Stat: cov_select_frac.
    """
    m = mask.bool()
    delta = _zero_where_masked(logp - old_logp, m)
    rho = delta.exp()
    adv = token_advantages(advantages, rho)
    pick = kl_cov_selection(logp, old_logp, advantages, m, params) if selected is None else selected.bool() & m
    per_tok = -rho * adv + torch.where(pick, params.kl_cov_coef * delta.abs(), torch.zeros_like(rho))
    loss = _lookup(AGGREGATIONS, agg, "loss aggregation")(_weighted(per_tok, token_weight), m, max_len)
    return loss, {"cov_select_frac": masked_mean(pick.float(), m), **_ratio_stats(rho.detach(), m)}


@register_policy_loss("gpg")
def gpg(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str, max_len: int,
        params: LossParams, token_weight: Tensor | None = None, selected: Tensor | None = None
        ) -> tuple[Tensor, dict[str, Tensor]]:
    """GPG / plain REINFORCE surrogate (Chu et al. 2025, arXiv 2504.02546; Williams 1992): l = -A * logp.

    No ratio and no trust region: equal to PPO's gradient at the first minibatch, uncorrected after
    (use one update per rollout). old_logp only feeds the ratio stats. Value meaningless, gradient only.
    """
    m = mask.bool()
    adv = token_advantages(advantages, logp)
    per_tok = -adv * _zero_where_masked(logp, m)
    loss = _lookup(AGGREGATIONS, agg, "loss aggregation")(_weighted(per_tok, token_weight), m, max_len)
    return loss, _ratio_stats(importance_ratio(logp, old_logp, m, "token").detach(), m)


@register_policy_loss("delta")
def delta_clip(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str, max_len: int,
               params: LossParams, token_weight: Tensor | None = None, selected: Tensor | None = None
               ) -> tuple[Tensor, dict[str, Tensor]]:
    """INTELLECT-2's two-sided clip (Prime Intellect 2025, arXiv 2505.07291): -min(min(rho, delta)*A,
    clip(rho)*A). For delta >= 1 + eps_high this is exactly the dual clip with c = delta (Ye et al. 2020),
    so it is that code path."""
    if params.delta < 1 + params.eps_high:
        raise ValueError(f"delta must be >= 1 + eps_high = {1 + params.eps_high}, got {params.delta}")
    return _clipped_surrogate(logp, old_logp, advantages, mask, agg, max_len, params.eps_low, params.eps_high,
                              params.delta, params.ratio_level, token_weight)


@register_policy_loss("raft")
def raft(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str, max_len: int,
         params: LossParams, token_weight: Tensor | None = None, selected: Tensor | None = None
         ) -> tuple[Tensor, dict[str, Tensor]]:
    """Rejection-sampling fine-tuning (RAFT: Dong et al. 2023, arXiv 2304.06767; RAFT++ / positive-only
    training: Xiong et al. 2025, arXiv 2504.11343): the SFT loss -logp on completions with A > 0 only.

    With recipe baseline 'none' and scale 'none' (enforced by the config), A is the reward, so this is
    SFT on the rewarded (correct) samples. The same function gives the optional NLL term on positive
    samples (`recipe.pos_nll_coef`, VAPO: Yue et al. 2025, arXiv 2504.05118)."""
    m = mask.bool()
    keep = (token_advantages(advantages, logp) > 0).to(logp.dtype)
    per_tok = -keep * _zero_where_masked(logp, m)
    loss = _lookup(AGGREGATIONS, agg, "loss aggregation")(_weighted(per_tok, token_weight), m, max_len)
    with torch.no_grad():
        stats = {"sft_token_frac": masked_mean(keep.expand_as(logp), m),
                 **_ratio_stats(importance_ratio(logp, old_logp, m, "token"), m)}
    return loss, stats


# --- token selection -------------------------------------------------------------------------------

def top_entropy_mask(entropies: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """Keep the top `quantile` share of counted tokens by entropy (Wang et al. 2025, "Beyond the 80/20
    Rule", arXiv 2506.01939): e = mask & (H >= the (1 - quantile) quantile of H over counted tokens,
    linear interpolation). Ties at the threshold are kept; no counted token -> nothing kept. The
    quantile is a batch-level statistic: with micro-batches it must be taken over the whole minibatch.
    """
    m = mask.bool()
    h = entropies.detach()
    if not m.any():
        return torch.zeros_like(m)
    tau = torch.quantile(h[m].double(), 1 - quantile).to(h.dtype)
    return m & (h >= tau)


# --- per-update diagnostics (detached) ---------------------------------------------------------------

# Share of tokens above this entropy: the 80th percentile of token entropy Wang et al. 2025 report for
# Qwen3 chain-of-thought (0.672 nats) [as recalled from the paper]; a fixed yardstick across runs.
HIGH_ENTROPY_NATS = 0.672


@torch.no_grad()
def policy_diagnostics(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                       entropies: Tensor) -> dict[str, Tensor]:
    """policy/entropy_adv_cov: mean over counted tokens of (logp - mu_lp)(A - mu_A), logp of the current forward
    (Cui et al. 2025, arXiv 2505.22617: positive means entropy is expected to fall); ppo_kl: k3 estimate
    of KL(pi_old || pi_theta) per token on the sampled tokens (0 on-policy); high_entropy_token_frac:
    share of counted tokens with entropy > HIGH_ENTROPY_NATS."""
    m = mask.bool()
    return {
        "policy/entropy_adv_cov": masked_mean(_covariance(logp, advantages, m), m),
        "ppo_kl": masked_mean(_k3(old_logp, logp.detach()), m),  # d = logp - old_logp: r - 1 - log r
        "high_entropy_token_frac": masked_mean((entropies > HIGH_ENTROPY_NATS).float(), m),
    }
