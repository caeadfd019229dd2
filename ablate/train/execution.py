"""How a step is executed (the `compute` config section): micro-batches under a token budget, chunked
log-probs, deterministic mode. Nothing here may change a result beyond float rounding.

A policy exposes `features(rollout) -> [N, T, H]` (final hidden states at the completion positions) and
`head(h) -> [.., V]` (the lm-head); log-probs and entropies are computed from them chunk by chunk
(`fused_head.linear_token_logprobs` when the policy's `linear_head()` gives a plain linear head, else
`losses.chunked_token_logprobs`), so no [rows, T, V] tensor is ever materialised.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Literal

import torch
from torch import Tensor

from ablate.config import ComputeConfig
from ablate.rl import losses
from ablate.rl.fused_head import linear_token_logprobs
from ablate.rl.sampling import Rollout

# --- micro-batches -----------------------------------------------------------------------------------


def pack(prompt_lens: list[int], completion_lens: list[int], budget: int) -> list[list[int]]:
    """Positions 0..n-1 packed, in order, into runs whose padded size rows x (longest prompt + longest
    completion) is at most `budget` tokens. A row that alone exceeds the budget gets a run of its own."""
    runs: list[list[int]] = []
    run: list[int] = []
    P = T = 0
    for i, (p, t) in enumerate(zip(prompt_lens, completion_lens)):
        P2, T2 = max(P, p), max(T, t)
        if run and (len(run) + 1) * (P2 + T2) > budget:
            runs.append(run)
            run, P2, T2 = [], p, t
        run.append(i)
        P, T = P2, T2
    return runs + ([run] if run else [])


def trim(rollout: Rollout) -> Rollout:
    """Drop the prompt columns that are padding in every row (left) and the completion columns after the
    longest completion (right). Under causal attention with masked padding no kept value changes."""
    p = max(int(rollout.prompt_mask.sum(1).max()), 1)
    t = max(int(rollout.completion_mask.sum(1).max()), 1)
    return rollout.columns(p, t)


def micro_batches(rollout: Rollout, idx: Tensor, budget: int, max_rows: int | None = None
                  ) -> Iterator[tuple[Tensor, Rollout]]:
    """(row indices, their trimmed sub-rollout) per micro-batch of rows `idx` (kept in order). budget 0:
    one untrimmed pass over `idx` (or passes of `max_rows` rows)."""
    if budget == 0:
        for part in idx.split(max_rows or max(len(idx), 1)):
            yield part, rollout.select(part)
        return
    prompt_lens = rollout.prompt_mask[idx].sum(1).tolist()
    completion_lens = rollout.completion_mask[idx].sum(1).clamp(min=1).long().tolist()
    for run in pack(prompt_lens, completion_lens, budget):
        part = idx[run]
        yield part, trim(rollout.select(part))


def join_columns(parts: list[Tensor], width: int) -> Tensor:
    """Micro-batches' [n_i, t_i] tensors (trimmed to their own longest completion) back into one
    [sum n_i, width] tensor in minibatch order, zero-padded on the right."""
    return torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in parts])


# --- scoring -----------------------------------------------------------------------------------------

def token_scores(policy, rollout: Rollout, temperature: float,
                 entropy: Literal["none", "value", "grad"] = "none") -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs [n, T] of the sampled completions (and entropies [n, T]) under `policy`, with
    grad when enabled. Only generated positions (completion mask) are scored; the others hold 0."""
    hidden = policy.features(rollout)  # [n, T, H]
    scored = rollout.completion_mask.bool()  # [n, T]
    linear = policy.linear_head() if hasattr(policy, "linear_head") else None  # (W, b, matmul dtype) or None
    if linear is not None:  # a plain linear lm-head: the fused path (two chunk buffers, backward by hand)
        logp, ent = linear_token_logprobs(hidden[scored], *linear[:2], rollout.completion_ids[scored], temperature,
                                          entropy, dtype=linear[2])
    else:
        logp, ent = losses.chunked_token_logprobs(hidden[scored], policy.head, rollout.completion_ids[scored],
                                                  temperature, entropy)

    def spread(x: Tensor) -> Tensor:  # [M] -> [n, T], zeros elsewhere
        return torch.zeros(scored.shape, dtype=x.dtype, device=x.device).masked_scatter(scored, x)

    return spread(logp), (spread(ent) if ent is not None else None)


def combine_stats(parts: list[tuple[Tensor, Tensor, dict[str, Tensor]]], summed: tuple[str, ...]
                  ) -> dict[str, Tensor]:
    """One minibatch's logged values from its micro-batches' (loss weight, token weight, values):
    the aggregated terms in `summed` add up with the loss weights (as the gradient does), `*_max` values
    take the max, every other value (a mean over counted tokens, as policy-loss stats are) is re-weighted
    by the micro-batch's share of counted tokens."""
    out: dict[str, Tensor] = {}
    for w_loss, w_tok, values in parts:
        for k, v in values.items():
            v = torch.as_tensor(v).detach().double()
            if k.endswith("_max"):
                out[k] = torch.maximum(out[k], v) if k in out else v
            else:
                out[k] = out.get(k, 0.0) + v * (w_loss if k in summed else w_tok).double()
    return out


# --- memory: activation recompute, the reference policy ------------------------------------------------

def enable_gradient_checkpointing(model) -> None:
    """HF gradient checkpointing of every decoder layer (recompute its activations in backward). HF only
    checkpoints layers in training mode; the trainer keeps the model in eval mode (no dropout), so only
    the layers' own flag is set, not their children's."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False):
            m.training = True


def reference_policy(policy):
    """The frozen reference for the KL term, as cheaply as possible: with LoRA adapters the same model
    with its adapters disabled (no copy); under bf16 autocast a bf16 copy (half of an fp32 copy; autocast
    runs its matmuls in bf16 anyway); otherwise an fp32 copy (exact, as on CPU)."""
    import copy

    if getattr(policy, "lora", False):
        from ablate.train.rollout import AdaptersOff

        return AdaptersOff(policy)
    ref = copy.deepcopy(policy)
    if getattr(policy, "autocast_dtype", None) is not None:
        ref.module.to(policy.autocast_dtype)
    ref.module.requires_grad_(False)
    return ref


# --- deterministic mode --------------------------------------------------------------------------------

def apply(compute: ComputeConfig) -> None:
    """Process-wide settings of `compute` (called once, before the model is built)."""
    if compute.deterministic:
        # cuBLAS needs a fixed workspace for deterministic matmuls; read when CUDA initialises
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(compute.deterministic)
    threads = compute.threads or (1 if compute.deterministic else 0)
    if threads:
        torch.set_num_threads(threads)
