"""The policy's optimizer and learning-rate schedule (`optim`): AdamW, SGD, or NormalizedSGD."""

from __future__ import annotations

import torch

from ablate.config import RunConfig


class NormalizedSGD(torch.optim.Optimizer):
    """A step of length lr along the globally normalised gradient: compares estimators on direction only.
    No step when the global norm is <= min_norm (> 0)."""

    def __init__(self, params, lr: float, min_norm: float = 0.0):
        super().__init__(params, dict(lr=lr))
        self.min_norm = min_norm

    @torch.no_grad()
    def step(self):
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        if self.min_norm and float(norm) <= self.min_norm:
            return
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"] / float(norm.clamp(min=1e-12)))


def make_optimizer(module: torch.nn.Module, cfg: RunConfig):
    """(optimizer, lr scheduler: linear warmup over `optim.warmup_steps`, then constant) of the module's
    trainable parameters."""
    o = cfg.optim
    params = [p for p in module.parameters() if p.requires_grad]
    opt = {
        "adamw": lambda: torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay),
        "sgd": lambda: torch.optim.SGD(params, lr=o.lr, weight_decay=o.weight_decay),
        "normalized_sgd": lambda: NormalizedSGD(params, lr=o.lr, min_norm=o.min_grad_norm),
    }[o.optimizer]()
    warmup = max(o.warmup_steps, 1)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
