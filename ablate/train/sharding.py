"""`compute.parallel: fsdp`: the policy's model sharded across the ranks with FSDP2 (`fully_shard`; Zhao
et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel", arXiv:2304.11277).

What is sharded: every decoder layer is one FSDP group, the rest of the model (embeddings, final norm,
lm-head; a tied head is the embedding) the root's group. The optimizer is built over the 1/W shards
(DTensors), so the master weights, their gradients after reduction and AdamW's moments are held 1/W per
rank.

What is gathered when: the trainer does not call the model through the root's `forward` (`features`
calls the decoder, `head` reads the lm-head weight, sampling is a KV-cache loop of many small forwards),
and the ranks run different numbers of micro-batches and sampling steps, so per-layer all-gathers inside
those passes could not be matched across ranks. The working copy of the weights is therefore gathered
whole (every group all-gathered once) at points every rank reaches together: after sharding, after every
optimizer step (a step post-hook), after a checkpoint is read or written. Every forward and backward then
runs without a collective. Gradients accumulate unsharded over a minibatch's micro-batches (FSDP's
gradient sync off); `reduce_gradients`, called by every rank before clipping, reduce-scatters them (SUM)
with one zero-loss forward/backward of one token through the root, identical on every rank. Each rank
then holds its shard of the summed gradient: `clip_grad_norm_` over the DTensor shards uses the global
norm, and the optimizer steps the shards.

Checkpoints hold the gathered (full) state (`torch.distributed.checkpoint.state_dict`), in the format of
a one-process run (optimizer state keyed by parameter index): they resume at any world size, in `ddp`
or in one process, and hold only plain tensors. docs/scale.md has the memory cost.
"""

from __future__ import annotations

import torch
from torch import nn

from ablate.config import RunConfig
from ablate.train import distributed
from ablate.train.models import load_weights, trained_weights


def _fsdp_modules(module: nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _probe(model: nn.Module) -> torch.Tensor:
    """Logits of one token through the root's forward (the same on every rank)."""
    device = next(iter(model.parameters())).device
    return model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device)).logits


def _reshard(model: nn.Module) -> None:
    """Free the working copy: the module's parameters are the shards again (no collective)."""
    for m in _fsdp_modules(model):
        m.reshard()


def _gather(model: nn.Module) -> None:
    """All-gather the working copy of every group from the (possibly updated) shards; every rank calls it."""
    _reshard(model)
    for m in _fsdp_modules(model):
        m.unshard()


def prepare(policy, cfg: RunConfig, make_optimizer):
    """`make_optimizer(policy.module, cfg)`; under `compute.parallel='fsdp'` at world size > 1 the model is
    sharded first (each decoder layer, then the root), so the optimizer holds the shards, and the working
    copy is gathered again after each of its steps."""
    if cfg.compute.parallel != "fsdp" or distributed.world() == 1:
        return make_optimizer(policy.module, cfg)
    from torch.distributed.fsdp import fully_shard

    model = policy.module
    for layer in model.get_decoder().layers:
        fully_shard(layer)
    fully_shard(model)
    for m in _fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)  # the ranks' gradients add up (the one-process gradient)
        m.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM)
    with torch.no_grad():
        _probe(model)  # the root runs first: FSDP makes it the root
    # the working copy stays gathered through every pass: FSDP's own unshards (forward, backward prefetch)
    # are then no-ops, so no pass has a collective whose count could differ between ranks
    model.set_reshard_after_forward(False)
    model.set_reshard_after_backward(False)
    model.set_requires_gradient_sync(False)  # micro-batches accumulate; `reduce_gradients` reduces
    _reshard(model)  # the module's parameters are the shards while the optimizer is built
    optimizer, scheduler = make_optimizer(model, cfg)
    optimizer.register_step_post_hook(lambda *_: _gather(model))
    _gather(model)
    return optimizer, scheduler


def reduce_gradients(module: nn.Module, params: list[nn.Parameter]) -> list[nn.Parameter]:
    """Sum the ranks' gradients (every rank calls it after its backward passes); returns the parameters
    that now hold them, for clipping. ddp: an all-reduce of `params` (`distributed.sum_gradients`). fsdp: a
    reduce-scatter of the accumulated unsharded gradients into the shards (the parameters returned)."""
    if not is_sharded(module):
        distributed.sum_gradients(params)
        return params
    module.set_requires_gradient_sync(True)
    (_probe(module).sum() * 0).backward()  # adds exact zeros; every group reduce-scatters once
    module.set_requires_gradient_sync(False)
    _reshard(module)  # the optimizer step's post-hook gathers the updated weights again
    return [p for p in module.parameters() if p.requires_grad]  # the DTensor shards, holding the gradients


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _names(module: nn.Module, optimizer) -> list[str]:
    """The optimizer's parameters by name, in its order (the module resharded: it holds the same shards)."""
    name = {id(p): n for n, p in module.named_parameters()}
    return [name[id(p)] for g in optimizer.param_groups for p in g["params"]]


def checkpoint_state(module: nn.Module, optimizer) -> dict:
    """The checkpoint's "model" and "optimizer" entries: under fsdp gathered (every rank takes part) onto
    rank 0's CPU in the one-process format (plain tensors; optimizer state keyed by parameter index); the
    other ranks get empty entries (they write nothing)."""
    if not is_sharded(module):
        return {"model": trained_weights(module), "optimizer": optimizer.state_dict()}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    _reshard(module)
    index = {n: i for i, n in enumerate(_names(module, optimizer))}
    model = get_model_state_dict(module, options=_options())
    optim = get_optimizer_state_dict(module, optimizer, options=_options())
    _gather(module)
    if not distributed.is_main():  # gathered on rank 0 only (cpu_offload), which alone writes
        return {"model": {}, "optimizer": {}}
    return {"model": model,
            "optimizer": {"state": {index[n]: s for n, s in optim["state"].items()},
                          "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                                           for g in optim["param_groups"]]}}


def load_checkpoint_state(module: nn.Module, optimizer, ckpt: dict) -> None:
    """Restore `checkpoint_state`'s entries (written at any world size, ddp or fsdp). Under fsdp each rank
    keeps its shards of the full tensors; no collective but the final gather."""
    if not is_sharded(module):
        load_weights(module, ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict
    from torch.distributed.tensor import distribute_tensor

    _reshard(module)  # loaded into the shards
    set_model_state_dict(module, ckpt["model"], options=_options())
    params = [p for g in optimizer.param_groups for p in g["params"]]

    def shard(value, p):  # a parameter-shaped state tensor (AdamW's moments) -> this rank's shard of it
        if torch.is_tensor(value) and value.shape == p.shape:
            return distribute_tensor(value.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
        return value

    saved = ckpt["optimizer"]
    optimizer.load_state_dict({"state": {i: {k: shard(v, params[i]) for k, v in s.items()}
                                         for i, s in saved["state"].items()},
                               "param_groups": saved["param_groups"]})
    _gather(module)
