"""Reward shaping terms added to the verifier's score (pure tensor functions)."""

from __future__ import annotations

from torch import Tensor


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), [N] -> [N], values in [-factor, 0].

    0 up to max_len - buffer tokens, then falling linearly to -factor at max_len (a completion that
    hits the budget gets the full -factor).
    """
    start = max_len - buffer
    return -factor * ((lengths.float() - start) / buffer).clamp(min=0.0, max=1.0)


def format_weight_at(weight: float, anneal_steps: int, step: int) -> float:
    """The format reward's weight at optimizer step `step`: constant when anneal_steps is 0, else falling
    linearly from `weight` (step 0) to 0 at step `anneal_steps` and staying there. A format bonus helps a
    model find the answer format early; annealed, it cannot be farmed once the format is learned."""
    if anneal_steps <= 0:
        return weight
    return weight * max(0.0, 1.0 - step / anneal_steps)
