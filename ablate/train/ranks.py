"""`ablate train --nproc N`: one run's ranks started as processes on this machine (`launch`), and the
generic launcher under it (`run_ranks`: any function in N processes with torchrun's environment).

The trainer joins the process group itself (ablate/train/distributed.py); this module sits above it and
imports the trainer, which never imports this module back.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ablate.runs.store import RunState, RunStore
from ablate.train.distributed import process_group
from ablate.train.models import resolve_device
from ablate.train.trainer import train

GRACE_S = 30.0  # once a rank failed: how long the others may take to end by themselves (then SIGTERM, SIGKILL)


class RanksFailed(RuntimeError):
    """A local launch in which some rank did not return its result. `account`: how each such rank ended,
    in rank order ("rank 0 of 2: exit code 1; rank 1 of 2: killed by signal 9 (SIGKILL)"); the message
    adds the traceback of each rank that raised, in rank order."""

    def __init__(self, account: str, tracebacks: dict[int, str]):
        super().__init__("\n".join([account, *(f"rank {r}: {tb}" for r, tb in sorted(tracebacks.items()))]))
        self.account = account


def _ended(exitcode: int) -> str:
    if exitcode < 0:
        return f"killed by signal {-exitcode} ({signal.Signals(-exitcode).name})"
    return f"exit code {exitcode}" if exitcode else "exit code 0 without a result (interrupted)"


def _rank(rank: int, nproc: int, port: int, fn: Callable[..., Any], args: tuple, results) -> None:
    """Rank `rank` of `run_ranks`, in its own process: torchrun's environment, then `fn(*args)`; sends back
    (rank, True, the result) or, when it raises, (rank, False, the traceback)."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      TORCHELASTIC_USE_AGENT_STORE="True")  # the launcher holds the store, as torchrun's agent does
    try:  # pickled here, by value: tensors queued as such would be shared through this process, gone by then
        results.put((rank, True, pickle.dumps(fn(*args))))
    except BaseException:
        results.put((rank, False, pickle.dumps(traceback.format_exc())))
        raise


def run_ranks(nproc: int, fn: Callable[..., Any], *args: Any, grace_s: float = GRACE_S) -> dict[int, Any]:
    """`fn(*args)` in `nproc` processes on this machine (torch.multiprocessing: fork, or spawn once CUDA is
    initialised), each with torchrun's environment and the rendezvous store that this process holds on a
    free port; returns each rank's result by rank. `fn` joins the process group itself (`init_from_env`).

    A rank that fails (raises or dies) ends the launch, but the others first get `grace_s` to end by
    themselves: they fail at their next collective, each writing its own account (rank 0 in status.json),
    undisturbed; only then SIGTERM, and SIGKILL after as long again (torch's `ProcessContext.join`).
    Then `RanksFailed` says how each rank without a result ended, with the tracebacks of those that
    raised: the same account whatever the order in which the ranks ended (torch's elastic agent, by
    contrast, stops the others at once and reports only the first failure it happens to see)."""
    import torch.multiprocessing as mp

    method = "spawn" if torch.cuda.is_initialized() else "fork"
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # port 0: free, and held
    results = mp.get_context(method).SimpleQueue()
    ranks = mp.start_processes(_rank, (nproc, store.port, fn, args, results), nprocs=nproc, join=False,
                               start_method=method)
    out: dict[int, Any] = {}
    raised: dict[int, str] = {}

    def collect() -> None:  # as they come: a rank whose result fills the pipe exits once it is read
        while not results.empty():
            rank, ok, value = results.get()
            (out if ok else raised)[rank] = pickle.loads(value)

    try:
        while not ranks.join(timeout=0.2, grace_period=grace_s):
            collect()
    except (mp.ProcessRaisedException, mp.ProcessExitedException):
        pass  # every rank has ended by now: told below, each rank as it ended
    finally:
        for p in ranks.processes:  # left alive only when the launcher itself was interrupted (Ctrl-C)
            if p.is_alive():
                p.terminate()
                p.join(grace_s)
                p.kill()
        for path in ranks.error_files:  # torch's copy of a traceback, left where a rank raised
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        # the store's server thread is stopped here, now: left for the garbage collector (a traceback
        # holds this frame), a rank forked by a later launch would inherit it and hang in its destructor,
        # joining a thread that the child does not have
        del store
    collect()
    if len(out) < nproc:
        account = "; ".join(f"rank {r} of {nproc}: {_ended(p.exitcode)}"
                            for r, p in enumerate(ranks.processes) if r not in out)
        raise RanksFailed(account, raised)
    return out


def _worker(jobs: list[tuple[Any, str]], should_prune: Callable[[int, dict], bool] | None = None) -> list[RunState]:
    """One rank: train each (config, run folder) in turn, in one process group (joined for the first, left
    after the last, whichever way the rank ends); returns their states."""
    first = jobs[0][0]
    with process_group(resolve_device(first.device), first.compute.collective_timeout_s):
        return [train(cfg, out, progress=False, should_prune=should_prune) for cfg, out in jobs]


def launch(nproc: int, jobs: list[tuple[Any, str]], should_prune: Callable[[int, dict], bool] | None = None
           ) -> list[RunState]:
    """Train `jobs` [(RunConfig, run folder)] with `nproc` ranks on this machine (`run_ranks`); returns
    rank 0's final states. `should_prune` as for `train` (rank 0's answer counts). A rank that fails ends
    the launch with `RanksFailed`; the run in flight then ends `failed` in status.json holding both
    accounts, in this order: rank 0's own (its traceback, or why it was stopped) when it wrote one, then
    the launcher's, how each failed rank ended (docs/run-folders.md)."""
    try:
        return run_ranks(nproc, _worker, jobs, should_prune)[0]
    except RanksFailed as err:
        for _, out in jobs:  # in order: the first one not ended for good is the one that was training
            store = RunStore(out)
            if store.holder() is not None:  # held by another process (our ranks are gone): not ours to mark
                break
            status = store.status()
            if status is not None and status["state"] in ("running", "failed", "cancelled"):
                own = [status["error"].rstrip()] if status["state"] != "running" and status["error"] else []
                store.set_status("failed", status["step"], "\n".join([*own, f"launcher: {err.account}"]))
                break
        raise
