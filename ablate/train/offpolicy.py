"""The off-policy axis in the loop: the staleness FIFO and the behaviour -> old correction (docs/offpolicy.md).

Staleness k (`recipe.staleness`) emulates an asynchronous pipeline (PipelineRL, Piche et al. 2025,
arXiv 2509.19128) deterministically on one device: the sampler runs k batches ahead of the optimiser, so the
update at step s trains on the batch sampled by the policy of step s - k. Before the first update the FIFO
is filled with k batches from the initial policy (the trainer waits for them; their lag is < k), and the
last k steps sample nothing: every run makes `steps` updates on `steps` batches, and batch s holds the
same prompts whatever k is (paired comparisons). k = 0 samples and trains on the same batch, as before.

The FIFO goes into the checkpoint as plain tensors, lists and dicts (`pending_state`), so a resumed run
continues exactly and the checkpoint loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections import deque

import torch
from torch import Tensor

from ablate.rl.corrections import mismatch_metrics

Pending = deque  # of (batch, greedy rewards [B] or None, version: optimiser steps taken when it was sampled)


# --- checkpointing the FIFO as plain data -------------------------------------------------------

def to_plain(obj):
    """Dataclasses -> dicts (recursively, no copies); tensors, lists, dicts and scalars as they are."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_plain(x) for x in obj]
    return obj


def from_plain(tp, data):
    """The inverse of `to_plain` for a dataclass type `tp`, guided by its field annotations."""
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{k: from_plain(hints[k], v) for k, v in data.items()})
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return [from_plain(item, x) for x in data]
    return data


def pending_state(pending: Pending) -> list[dict]:
    return [{"batch": to_plain(b), "greedy": g, "version": v} for b, g, v in pending]


def pending_from_state(state: list[dict], batch_type: type) -> Pending:
    return deque((from_plain(batch_type, e["batch"]), e["greedy"], e["version"]) for e in state)


# --- the correction and its metrics ------------------------------------------------------------

def correct(correction, old_logp: Tensor | None, behav_logp: Tensor, trainable_mask: Tensor, policy_mask: Tensor):
    """Apply the step's IS correction (`plan.is_correction`, an IS_CORRECTIONS entry with its parameters):
    (IS weights [N,T], loss mask [N,T]: `trainable_mask` minus the rejected tokens, stats). With `none`
    the mask comes back unchanged and the weights are 1. `old_logp` None: the step ran no old pass
    (plan.old_pass), so the correction is `none`, which reads no log-prob. `policy_mask` [N,T]: the tokens
    the policy sampled (all completion tokens of a single turn; not the environment's replies of an episode).
    Only those have behaviour log-probs, so the correction reads those; an environment token in the loss
    keeps weight 1 and stays unless its whole row was rejected."""
    old_logp = behav_logp if old_logp is None else old_logp
    policy = trainable_mask * policy_mask.to(trainable_mask.dtype)
    weights, keep, stats = correction(old_logp, behav_logp.to(old_logp.device), policy)
    row_kept = keep.any(1, keepdim=True) | ~policy.bool().any(1, keepdim=True)  # [N,1]
    env = (trainable_mask - policy) * row_kept  # environment tokens in the loss, of the rows not rejected whole
    return weights, policy * keep + env, stats


def step_metrics(old_logp: Tensor, behav_logp: Tensor, trainable_mask: Tensor, weights: Tensor, loss_mask: Tensor,
                 stats: dict, lag: int, policy_mask: Tensor) -> dict[str, float]:
    """The `offpolicy/*` metrics of one step (definitions in ablate/runs/metrics.py), over the policy's tokens
    the loss may count before rejection (`trainable_mask` x `policy_mask`; `loss_mask`: those the correction
    kept); a value undefined for lack of counted tokens is not logged."""
    lag_rows = torch.full((len(old_logp),), float(lag), device=old_logp.device)
    out = mismatch_metrics(old_logp, behav_logp.to(old_logp.device), trainable_mask * policy_mask.to(
        trainable_mask.dtype), weights, loss_mask.bool(), lag_rows)
    out["is_cap_frac"] = stats["is_cap_frac"]
    return {f"offpolicy/{k}": float(v) for k, v in out.items() if math.isfinite(float(v))}
