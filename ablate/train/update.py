"""The policy's passes over a rollout: no-grad scoring (pi_old, the reference) and the update, as the step
plan says (ablate/train/plan.py). Masks are [N, T] over completion positions; `loss_mask` holds the
tokens every loss term counts (its denominators included).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ablate.rl import losses
from ablate.rl.divergence import Diverged, check_finite, overflow_is_divergence
from ablate.rl.sampling import Rollout
from ablate.train import distributed, execution, recipes, sharding
from ablate.train.plan import StepPlan


@torch.no_grad()
def sequence_logprobs(policy, rollout: Rollout, temperature: float, budget: int = 0, chunk: int = 256) -> Tensor:
    """Per-token log-probs [N, T] of the sampled completions under `policy`, no grad, in micro-batches of
    at most `budget` tokens (0: `chunk` rows at a time); 0 after each completion's end. Each rank scores
    its share of the rows; all ranks get all of them."""
    return sequence_scores(policy, rollout, temperature, budget, chunk)[0]


@torch.no_grad()
def sequence_scores(policy, rollout: Rollout, temperature: float, budget: int = 0, chunk: int = 256,
                    entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """`sequence_logprobs` and, with `entropy`, the per-token entropies [N, T] of the same forward (else None)."""
    N, T = rollout.completion_ids.shape
    rows = torch.arange(N)[distributed.split(N)]
    out = rollout.completion_mask.new_zeros(len(rows), T)  # the loss dtype (float64 for the chapter toy)
    ent = out.clone() if entropy else None
    with distributed.failing_together():
        for idx, sub in execution.micro_batches(rollout, rows, budget, max_rows=chunk) if len(rows) else ():
            logp, h = execution.token_scores(policy, sub, temperature, "value" if entropy else "none")  # [n, t]
            at = (idx - rows[0]).to(out.device)
            out = out.to(logp.dtype)
            out[at, :logp.shape[1]] = logp
            if entropy:
                ent = ent.to(h.dtype)
                ent[at, :h.shape[1]] = h
    return distributed.gather_rows(out), distributed.gather_rows(ent) if entropy else None


def update(policy, optimizer, plan: StepPlan, rollout: Rollout, adv: Tensor, loss_mask: Tensor, *,
           old_logp: Tensor | None = None, ref_logp: Tensor | None = None, kl_coef: float = 0.0,
           token_weight: Tensor | None = None, selected: Tensor | None = None) -> tuple[dict[str, float], Tensor]:
    """`plan.epochs` passes over the rollout in `plan.minibatches` optimizer steps (PPO-style), each
    accumulated over micro-batches of at most `plan.micro_batch_tokens` tokens. Every aggregation's
    normaliser belongs to the whole minibatch, so the accumulated gradient is the one-pass gradient.

    adv [N] or [N,T]; old_logp [N,T]: pi_old, the ratio's anchor (None: the ratio cannot leave 1, and each
    micro-batch anchors on its own detached log-probs); ref_logp [N,T]: the reference (the KL term, with
    `kl_coef`: the coefficient in use); token_weight [N,T]: multiplies each token's policy loss (token
    selection x IS weights, recipes.token_weight); selected [N,T]: the tokens the token selection keeps,
    which alone get the entropy bonus (None: all). Batch-level selections (top-entropy, Clip-Cov / KL-Cov)
    never depend on the micro-batch split.
    Several ranks: each back-propagates its share of every minibatch's rows and the gradients are summed
    (ablate/train/distributed.py); the normalisers stay the whole minibatch's, so the sum is the same.
    Returns the logged means and the first epoch's detached token log-probs [N, T] (pi_old's, on-policy)."""
    entropy_mode = "grad" if plan.loss.entropy_coef else "value"
    N = len(rollout)
    params = [p for p in policy.module.parameters() if p.requires_grad]
    logs: dict[str, list[float]] = {}
    first_epoch_logp = loss_mask.new_zeros(loss_mask.shape)  # [N, T] the first epoch's detached log-probs
    for epoch in range(plan.epochs):
        for idx in torch.randperm(N).split(math.ceil(N / plan.minibatches)):
            optimizer.zero_grad(set_to_none=True)
            minibatch_mask = loss_mask[idx]
            parts, scores = [], []  # per micro-batch: logged values; detached token scores
            mine = idx[distributed.split(len(idx))]  # this rank's rows of the minibatch (all of them at world 1)
            micro = list(execution.micro_batches(rollout, mine, plan.micro_batch_tokens)) if len(mine) else []
            # Clip-Cov / KL-Cov select over the whole minibatch, whatever this rank's and micro-batches' share
            whole = micro if distributed.world() == 1 else \
                list(execution.micro_batches(rollout, idx, plan.micro_batch_tokens))
            cov_selected = recipes.covariance_selection(plan.loss.selection, plan.loss.params, policy,
                                                        plan.sampling.temperature, whole, old_logp, adv, loss_mask,
                                                        split=distributed.world() > 1)
            with distributed.failing_together():  # a rank's error (Diverged too) reaches every rank
                for mb, sub in micro:
                    logp, entropy = execution.token_scores(policy, sub, plan.sampling.temperature,
                                                           entropy_mode)  # [n, t]
                    check_finite("log-probabilities (logits)", logp)
                    t = logp.shape[1]
                    micro_mask = loss_mask[mb, :t]
                    anchor = old_logp[mb, :t] if old_logp is not None else logp.detach()  # on-policy: ratio 1
                    loss, values = micro_batch_loss(
                        plan, logp, entropy, anchor, _rows(adv, mb, t), micro_mask, ref_logp=_rows(ref_logp, mb, t),
                        kl_coef=kl_coef, token_weight=_rows(token_weight, mb, t), selected=_rows(selected, mb, t),
                        cov_selected=_rows(cov_selected, mb, t))
                    if not torch.isfinite(loss):
                        raise Diverged(f"loss is {loss.item()} at epoch {epoch}")
                    w = losses.micro_weight(plan.loss.agg, micro_mask, minibatch_mask, plan.loss.max_len, loss.dtype)
                    (loss * w).backward()
                    w_tok = micro_mask.bool().sum() / minibatch_mask.bool().sum().clamp(min=1)
                    parts.append((w, w_tok, values))
                    scores.append((logp.detach(), anchor, entropy.detach()))
            params = sharding.reduce_gradients(policy.module, params)  # ranks' sum; a NaN reaches every rank
            grad_norm = torch.nn.utils.clip_grad_norm_(params, plan.grad_clip or float("inf"))
            check_finite("gradient norm", grad_norm)
            with overflow_is_divergence("optimizer step"):
                optimizer.step()
            # batch-level diagnostics (a covariance over all tokens) from the whole minibatch's token scores
            lp, anchor_lp, ent = (distributed.gather_rows(
                execution.join_columns([sc[i] for sc in scores], minibatch_mask.shape[1]) if scores
                else minibatch_mask.new_zeros(0, minibatch_mask.shape[1])) for i in range(3))
            row = {**distributed.reduce_stats(execution.combine_stats(parts, SUMMED)), "grad_norm": grad_norm,
                   **losses.policy_diagnostics(lp, anchor_lp, adv[idx], minibatch_mask, ent)}
            if epoch == 0:  # entropy and KL describe the rollout policy: first pass only
                row["entropy"], row["kl"] = row["loss_entropy"], row["loss_kl"]
                first_epoch_logp[idx.to(first_epoch_logp.device)] = lp.to(first_epoch_logp.dtype)
            for k, v in row.items():
                logs.setdefault(k, []).append(float(torch.as_tensor(v).detach()))
    out = {k: float(np.mean(v)) for k, v in logs.items()}
    out["ratio_max"] = float(np.max(logs["ratio_max"]))
    return out, first_epoch_logp


SUMMED = ("loss", "loss_policy", "loss_kl", "loss_entropy")  # aggregated terms: micro-batches add up


def _rows(x: Tensor | None, rows: Tensor, t: int) -> Tensor | None:
    """A micro-batch's `rows` of x [N] or [N, T] (its first t columns); None stays None."""
    return None if x is None else x[rows] if x.dim() == 1 else x[rows, :t]


def micro_batch_loss(plan: StepPlan, logp: Tensor, entropy: Tensor, anchor: Tensor, adv: Tensor, mask: Tensor, *,
                     ref_logp: Tensor | None = None, kl_coef: float = 0.0, token_weight: Tensor | None = None,
                     selected: Tensor | None = None, cov_selected: Tensor | None = None
                     ) -> tuple[Tensor, dict[str, Tensor]]:
    """One micro-batch's loss, [n, t] inputs (`update`'s, a micro-batch's rows): the plan's policy loss,
    VAPO's NLL term, the KL term (added when it belongs to the loss; measured either way) and the entropy
    bonus (on the `selected` tokens only, with the same denominators); and the values it logs."""
    spec, agg = plan.loss, losses.AGGREGATIONS[plan.loss.agg]
    loss_policy, stats = spec.fn(logp, anchor, adv, mask, agg=spec.agg, max_len=spec.max_len, params=spec.params,
                                 token_weight=token_weight, selected=cov_selected)
    if spec.nll_coef:  # VAPO's NLL term on positive-advantage samples
        loss_policy = loss_policy + spec.nll_coef * losses.raft(logp, anchor, adv, mask, agg=spec.agg,
                                                                max_len=spec.max_len, params=spec.params)[0]
    loss, kl = loss_policy, torch.zeros(())
    if ref_logp is not None:
        kl = agg(plan.kl.estimator(logp, ref_logp), mask, spec.max_len)
        if not plan.kl.in_reward:
            loss = loss + kl_coef * kl
    mean_entropy = agg(entropy, mask, spec.max_len)
    if spec.entropy_coef:
        bonus = mean_entropy if selected is None else agg(entropy * selected, mask, spec.max_len)
        loss = loss - spec.entropy_coef * bonus
    return loss, {"loss": loss, "loss_policy": loss_policy, "loss_kl": kl, "loss_entropy": mean_entropy, **stats}
