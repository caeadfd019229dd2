"""Divergence: a NaN or infinity where training needs finite numbers (parameters, logits, sampling
probabilities, gradient norm, loss). The checks raise `Diverged`; the trainer ends the run `diverged` at
the step in flight (a finished state: sweeps do not resubmit it), instead of failing further on with
an unrelated error ("probability tensor contains inf/nan").
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor, nn


class Diverged(ArithmeticError):
    """The run produced a non-finite number; the message says which quantity."""


def check_finite(what: str, *tensors: Tensor) -> None:
    """Raise Diverged naming `what` unless every element of every tensor is finite."""
    for t in tensors:
        if not bool(torch.isfinite(t).all()):
            raise Diverged(f"{what} became non-finite (NaN or inf)")


def check_parameters(module: nn.Module) -> None:
    """After an optimizer step: every trainable parameter finite."""
    check_finite("parameters", *(p.detach() for p in module.parameters() if p.requires_grad))


@contextmanager
def overflow_is_divergence(what: str):
    """Around an optimizer step: torch's "cannot be converted ... without overflow" (a learning rate so large
    that the step does not fit in float32) is divergence too."""
    try:
        yield
    except RuntimeError as err:
        if "overflow" not in str(err):
            raise
        raise Diverged(f"{what} overflowed: {err}") from None
