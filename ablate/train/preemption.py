"""Checkpoint at a step boundary when SLURM warns of a time limit or preemption.

SLURM (through submitit, `--signal=USR2@90`) sends SIGUSR2 some time before it kills a job, and
submitit's handler then calls our `Checkpointable.checkpoint()`. A signal can land in the middle of an
optimizer step, where the model is half-updated, so while the trainer runs a step we hold the signal
back and replay it to submitit's handler at the step boundary; `save_now()` (called from
`checkpoint()`) then writes a consistent checkpoint, and the requeued job resumes exactly there.
Process-global by nature (signals are), so this is a tiny module with module state.

Several ranks (torch.distributed): SLURM signals every task, but not at the same instant, and a rank
could see it a step before another. So each step boundary ends with a collective agreement, an
all_reduce MAX of this rank's "signal seen" flag (`agree`): when any rank saw it, every rank acts at that
same boundary. Rank 0's handler (submitit's) checkpoints and requeues the job (the checkpoint is rank
0's: data-parallel replicas are equal); every other rank leaves quietly, so none waits forever in the
next step's collectives for a rank 0 that is gone. Under compute.parallel='fsdp' the checkpoint is
gathered from the ranks' shards, so there every rank runs the save first (`guard(..., collective=True)`)
and rank 0 writes. Without torch.distributed `agree` is the identity.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager

SIGNAL = signal.SIGUSR2
_save: Callable[[], None] | None = None
_prev: Callable | None = None  # the handler before ours (submitit's), called at the boundary
_pending: list[tuple] = []
_in_step = False
_saved = False
_collective = False  # `save` needs every rank (a sharded model's state is gathered): all ranks call it


def save_now() -> bool:
    """Write the running trainer's checkpoint; False when no trainer runs in this process."""
    global _saved
    if _save is None:
        return False
    if not (_collective and _saved):  # a collective save already ran on every rank at this boundary
        _save()
    _saved = True
    return True


def checkpointed_for_requeue() -> bool:
    """True once `save_now` ran: the exit that follows is a requeue, not a failure."""
    return _saved


@contextmanager
def guard(save: Callable[[], None], collective: bool = False):
    """Around the training loop: `save` writes a checkpoint of the state at the last step boundary.
    `collective`: `save` takes every rank (compute.parallel='fsdp' gathers the sharded state), so at a
    boundary every rank runs it before the handler (whose `save_now` then does not run it again)."""
    global _save, _saved, _prev, _collective
    _saved, _collective = False, collective
    prev = _prev = signal.getsignal(SIGNAL)
    active = callable(prev) and threading.current_thread() is threading.main_thread()

    def hold(signum, frame):
        if _in_step or _world() > 1:  # several ranks: always at a boundary they agree on
            _pending.append((signum, frame))
        else:
            prev(signum, frame)

    _save = save
    if active:
        signal.signal(SIGNAL, hold)
    try:
        yield
    finally:
        _save = _prev = None
        _collective = False
        if active:
            signal.signal(SIGNAL, prev)


@contextmanager
def step():
    """One training step: a warning signal that arrives meanwhile is delivered when the step ends."""
    global _in_step
    _in_step = True
    try:
        yield
    finally:
        _in_step = False
    if agree(bool(_pending)):
        _deliver()


def _world() -> int:
    """The number of ranks of this run: torch.distributed's world size, 1 when not initialised."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def agree(seen: bool) -> bool:
    """Whether any rank has seen the warning signal: all_reduce MAX of a 0/1 flag over the ranks (one
    tiny collective per step). Every rank calls it at every step boundary. Identity for one process."""
    if _world() == 1:
        return seen
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([int(seen)], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _deliver() -> None:
    """Replay the held signal to the handler that was there before (submitit's); a rank that did not
    receive it itself gets it now too. A rank other than 0 whose handler returns (submitit's does: only
    rank 0 checkpoints and requeues) then exits as a requeue, not a failure; it ends with the job."""
    global _saved
    held = _pending[:] or [(SIGNAL, None)]
    _pending.clear()
    if _collective and _world() > 1:
        save_now()  # every rank takes part; rank 0 writes
    handler = _prev or signal.getsignal(SIGNAL)
    for signum, frame in held:
        if callable(handler):
            handler(signum, frame)
    if _world() > 1:
        import torch.distributed as dist

        if dist.get_rank() != 0:
            _saved = True
            raise SystemExit(0)


# --- stop requests: SIGTERM, SIGHUP, Ctrl-C, a dead launcher ---------------------------------------------

class Stopped(BaseException):
    """The process was asked to stop (SIGTERM, SIGHUP); like KeyboardInterrupt, not an error of the run: the
    trainer ends it `cancelled`, naming the reason, and re-raises. `signum`: the signal (exit 128 + signum)."""

    def __init__(self, reason: str, signum: int = signal.SIGTERM):
        super().__init__(reason)
        self.signum = int(signum)


STOP_SIGNALS = {signal.SIGTERM: "SIGTERM (kill, timeout, or the container or job being stopped)",
                signal.SIGHUP: "SIGHUP (the terminal or SSH session that started it was closed)"}
_stop_reason: str | None = None


def stop_reason(err: BaseException) -> str:
    """Why a Stopped or KeyboardInterrupt ended the run (the status.json `error` of a cancelled run)."""
    if isinstance(err, Stopped):
        return str(err)
    return _stop_reason or "interrupted (SIGINT, e.g. Ctrl-C)"


def request_stop(reason: str) -> None:
    """From any thread (e.g. a watchdog): interrupt the main thread, which ends the run `cancelled: reason`."""
    import _thread

    global _stop_reason
    _stop_reason = reason
    _thread.interrupt_main()


@contextmanager
def stop_on_signals():
    """While the trainer runs, SIGTERM and SIGHUP raise Stopped in the main thread (by default either ends
    the process on the spot and status.json stays `running`). A handler someone else installed is left
    alone: submitit's workers ignore SIGTERM on purpose (SLURM's SIGKILL follows), and `nohup` ignores
    SIGHUP so that the run outlives its terminal."""
    def stop(signum, frame):
        raise Stopped(f"stopped by {STOP_SIGNALS[signum]}", signum)

    main = threading.current_thread() is threading.main_thread()
    prev = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    ours = [sig for sig, handler in prev.items() if handler == signal.SIG_DFL and main]
    for sig in ours:
        signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig in ours:
            signal.signal(sig, prev[sig])
