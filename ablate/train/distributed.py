"""One run across several processes (ranks): the process group, how work is split, and the collectives.

A rank is started with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
by `ablate train --nproc N` (ablate/train/ranks.py) or by the scheduler. The trainer joins the process
group (`process_group`) and leaves it however it ends; at world size 1, every helper here is the
identity, so a one-process run executes exactly the code it always did.

How a step is split (docs/scale.md): every rank draws the same seeded prompts, generates only its
contiguous share of the prompt groups (`map_shards`) and gathers the rest, so every rank then holds the
identical global batch and computes advantages, group statistics, data-policy observations and every
`train/*` metric from it, identically. Old and reference log-probs: each rank scores its rows, all
gathered (`gather_rows`). The update: the same minibatch order on every rank; each rank back-propagates
its share of each minibatch's rows with the loss weights of the whole minibatch, and `sum_gradients`
adds the ranks' gradients (an all-reduce, before clipping): the one-process gradient. Sampling noise is
indexed by the global row (`ablate.rl.sampling.RowNoise`), so the samples do not depend on the split.

Rank 0 alone writes the run folder and the W&B mirror; the other ranks get a `FollowerStore` that reads
(the checkpoint to resume from) and writes nothing. Every collective has the timeout
`compute.collective_timeout_s`: a rank that died makes the others fail after it, never hang. A rank
that raises in its share of `map_shards`, or inside `failing_together` (a no-grad pass, a minibatch's
backward passes), does not leave the others waiting: `raise_together` makes every rank raise the same
error at once; a decision only rank 0 can take (pruning) is broadcast, `on_main`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ablate.rl.divergence import Diverged
from ablate.runs.store import FollowerStore, RunStore

# --- the process group ---------------------------------------------------------------------------------


def init_from_env(device: torch.device, timeout_s: float = 1800) -> bool:
    """Join the process group that torchrun's environment describes, when WORLD_SIZE > 1 (gloo for CPU
    tensors, nccl for CUDA ones, bound to GPU LOCAL_RANK); nothing at world size 1 or when already joined.
    Returns whether it joined."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return True


@contextlib.contextmanager
def process_group(device: torch.device, timeout_s: float = 1800) -> Iterator[None]:
    """In the process group of torchrun's environment (`init_from_env`) for the block, left on every way
    out of it (a return, an error, the SystemExit of a requeue, a stop signal's exception) when this block
    joined it; an enclosing block's group is left alone. A group still alive when the interpreter exits
    can abort the process: gloo's threads are destroyed unjoined, std::terminate, SIGABRT ("terminate
    called without an active exception", pytorch/pytorch#190489)."""
    joined = init_from_env(device, timeout_s)
    try:
        yield
    finally:
        if joined and dist.is_initialized():
            dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def split(n: int) -> slice:
    """This rank's contiguous share of n items (the first n % world ranks get one more)."""
    w, r = world(), rank()
    return slice(n * r // w, n * (r + 1) // w)


# --- collectives (each the identity at world size 1) ---------------------------------------------------


def map_tensors(obj: Any, fn: Callable[[Any], Any], kind: type = Tensor) -> Any:
    """`obj` with every `kind` inside (tuples, lists, dicts, dataclasses) replaced by `fn(it)`, visited in
    a fixed order (the same for two objects of the same structure)."""
    if isinstance(obj, kind):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(x, fn, kind) for x in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn, kind) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_tensors(getattr(obj, f.name), fn, kind)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def to_device(obj: Any, device) -> Any:
    """`obj` with every tensor inside (tuples, lists, dicts, dataclasses) moved to `device`."""
    return map_tensors(obj, lambda t: t.to(device))


@dataclasses.dataclass(frozen=True)
class _Slot:
    """A tensor's place in the pickled part of `gather_objects`: what its bytes become again."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str  # "cpu" or "cuda": which backend carries it

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _device(kind: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device("cpu")


def gather_objects(obj: Any) -> list:
    """Every rank's `obj`, in rank order; [obj] at world size 1. The tensors inside (tuples, lists, dicts,
    dataclasses) travel through tensor collectives: per device type, a rank's tensors as one byte buffer,
    right-padded to the longest rank's and all-gathered once (gloo for CPU, nccl for CUDA), then cut at
    the shapes and dtypes that travel with the rest (texts, numbers: pickled, `all_gather_object`). Each
    tensor comes back bit for bit, on its device type (the current GPU for CUDA ones)."""
    if world() == 1:
        return [obj]
    mine: list[Tensor] = []
    skeleton = map_tensors(obj, lambda t: mine.append(t) or _Slot(t.dtype, tuple(t.shape), t.device.type))
    skeletons: list = [None] * world()
    dist.all_gather_object(skeletons, skeleton)
    slots: list[list[_Slot]] = [[] for _ in skeletons]  # per rank, in visiting order
    for r, sk in enumerate(skeletons):
        map_tensors(sk, slots[r].append, _Slot)
    tensors: list[list[Tensor]] = [[None] * len(s) for s in slots]  # type: ignore[list-item]
    for kind in sorted({s.device for rank_slots in slots for s in rank_slots}):
        local = [t.detach().contiguous().view(-1).view(torch.uint8) for t in mine if t.device.type == kind]
        buf = torch.cat(local) if local else torch.zeros(0, dtype=torch.uint8, device=_device(kind))
        sizes = [sum(s.nbytes for s in rank_slots if s.device == kind) for rank_slots in slots]
        for r, part in enumerate(_all_gather_padded(buf.to(_device(kind)), sizes)):
            at = 0
            for i, s in enumerate(slots[r]):
                if s.device == kind:  # clone: a view as another dtype needs an aligned start
                    tensors[r][i] = part[at:at + s.nbytes].clone().view(s.dtype).view(s.shape)
                    at += s.nbytes
    return [map_tensors(sk, lambda _, it=iter(ts): next(it), _Slot) for sk, ts in zip(skeletons, tensors)]


def _all_gather_padded(x: Tensor, sizes: list[int]) -> list[Tensor]:
    """Every rank's `x` [sizes[rank], ...] (the same trailing shape, dtype and device type on every rank),
    in rank order: one all_gather of the tensors right-padded along dim 0 to the longest."""
    if max(sizes) == 0:
        return [x.new_zeros((0, *x.shape[1:])) for _ in sizes]
    padded = x.new_zeros((max(sizes), *x.shape[1:]))
    padded[:len(x)] = x
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return [p[:n] for p, n in zip(parts, sizes)]


def map_shards(n: int, fn: Callable[[slice], Any]) -> list:
    """`fn(part)` on this rank's share `part` of range(n), the results of all ranks gathered in rank
    order; a rank with an empty share contributes nothing. At world size 1: [fn(slice(0, n))].
    An exception in `fn` on any rank is raised on every rank (`raise_together`), before the gather."""
    part = split(n)
    if world() == 1:
        return [fn(part)] if part.stop > part.start else []
    mine = None
    with failing_together():  # or the others wait in the gather
        mine = fn(part) if part.stop > part.start else None
    return [x for x in gather_objects(mine) if x is not None]


def raise_together(err: Exception | None) -> None:
    """Agree on a failure of the ranks' local work: each rank passes its exception (None when it
    succeeded); one all-reduce (MAX) of a 0/1 flag; when some rank failed, the failures are gathered and
    every rank raises the same exception, for the lowest failing rank: `Diverged` with its message when
    it diverged (the run ends `diverged` at once, everywhere), else a RuntimeError naming the rank, its
    error and its traceback (the run ends `failed`, that traceback in status.json). Nothing is sent
    when no rank failed but the flag. One process: `err` itself is raised."""
    if world() == 1:
        if err is not None:
            raise err
        return
    flag = torch.tensor([int(err is not None)], dtype=torch.int32)  # CPU: gloo also under nccl
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if not flag.item():
        return
    mine = None if err is None else (isinstance(err, Diverged), type(err).__name__, str(err),
                                     "".join(traceback.format_exception(err)))
    r, (diverged, kind, message, trace) = next((r, f) for r, f in enumerate(gather_objects(mine)) if f)
    if diverged:
        raise Diverged(f"{message} (on rank {r} of {world()})") from err
    raise RuntimeError(f"rank {r} of {world()} failed: {kind}: {message}\n{trace}") from err


@contextlib.contextmanager
def failing_together() -> Iterator[None]:
    """Around a rank's local work before a collective (a no-grad pass, the backward passes of a minibatch):
    an exception inside is raised on every rank, as `raise_together` does, instead of leaving the other
    ranks waiting in the collective that follows until its timeout. One process: the exception itself."""
    failure = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - every rank must learn of it
        failure = err
    raise_together(failure)


def on_main(fn: Callable[[], Any]) -> Any:
    """`fn()` computed by rank 0 alone and broadcast (pickled) to every rank: a decision only rank 0 can
    take, e.g. Optuna's `should_prune`, whose trial lives there. An exception in it is raised on every
    rank (`raise_together`). At world size 1: fn()."""
    if world() == 1:
        return fn()
    out = [None]
    with failing_together():  # the other ranks wait for the answer
        if is_main():
            out[0] = fn()
    dist.broadcast_object_list(out, src=0)
    return out[0]


def gather_rows(x: Tensor) -> Tensor:
    """The ranks' [n_r, ...] tensors (same trailing shape and dtype) stacked in rank order, [sum n_r, ...]."""
    if world() == 1:
        return x
    n = torch.tensor([len(x)], device=x.device)
    sizes = [int(k) for k in torch.cat(_all_gather_padded(n, [1] * world()))]
    return torch.cat(_all_gather_padded(x, sizes))


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Add the ranks' gradients (all-reduce SUM, in place). A parameter that no rank gave a gradient keeps
    `grad` None, as in one process (AdamW skips it); one that some rank did gets zeros on the others."""
    if world() == 1:
        return
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
    dist.all_reduce(has, op=dist.ReduceOp.MAX)
    grads = []
    for p, h in zip(params, has.tolist()):
        if h:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    for work in [dist.all_reduce(g, async_op=True) for g in grads]:
        work.wait()


def reduce_stats(row: dict[str, Tensor]) -> dict[str, Tensor]:
    """One minibatch's logged values from the ranks' shares (`execution.combine_stats`): `*_max` values
    take the max, every other value (token- or loss-weighted against the whole minibatch) adds up."""
    if world() == 1:
        return row
    out: dict[str, Tensor] = {}
    for part in gather_objects({k: float(v) for k, v in row.items()}):
        for k, v in part.items():
            v = torch.tensor(v, dtype=torch.float64)
            out[k] = (torch.maximum(out[k], v) if k.endswith("_max") else out[k] + v) if k in out else v
    return out


# --- the run folder: rank 0 writes it ---------------------------------------------------------------


def open_store(root: str) -> RunStore:
    """The run folder as this rank sees it: rank 0 writes it, every other rank only reads it."""
    return RunStore(root) if is_main() else FollowerStore(root)
