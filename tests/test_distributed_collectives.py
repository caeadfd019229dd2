"""Ranks agree: a failure on one rank during sampling, scoring or evaluation (`distributed.map_shards`)
ends the run on every rank at once, as `diverged` (a Diverged) or `failed` (any other error, with the
failing rank's traceback); a pruning decision is rank 0's alone and every rank stops with it; gathers
through tensor collectives give every rank's tensors back bit for bit, for uneven shares. Two real gloo
ranks on CPU (`ranks.run_ranks`, what `ablate train --nproc 2` uses), the toy task."""

import time
from collections import Counter

import pytest
import torch

from ablate.config import parse
from ablate.runs.store import FollowerStore, RunStore
from ablate.tasks.toy import ToyPolicy
from ablate.train import distributed, ranks
from ablate.train.preemption import Stopped
from ablate.train.trainer import train


def toy(group_size: int, **over):
    return parse({"task": {"name": "toy_addition"}, "prompts_per_step": 3, "steps": 4, "checkpoint_every": 0,
                  "recipe": {"group_size": group_size, "max_new_tokens": 2, "kl_coef": 0.0},
                  "eval": {"every": 1, "n_samples": 2, "ks": [1]}, "optim": {"optimizer": "adamw", "lr": 0.1},
                  "compute": {"threads": 1, "collective_timeout_s": 300}, **over})


def faulty_rank1(monkeypatch) -> None:
    """From its second training rollout on, rank 1's toy sampler fails (the launcher forks the ranks from
    this process, so they inherit the patch): in runs of group size 3 its table turns NaN, so the real
    check in `draw` raises Diverged; in runs of group size 4 the sampler raises a ValueError."""
    real, calls = ToyPolicy.sample, Counter()

    def sample(self, prompts, n, *args, **kw):
        if distributed.rank() == 1 and n in (3, 4):  # training rollouts (eval: n_samples 2, greedy: 1)
            calls[n] += 1
            if calls[n] >= 2 and n == 4:
                raise ValueError("the sampler crashed")
            if calls[n] >= 2:
                with torch.no_grad():
                    self.first.fill_(float("nan"))  # this rank's policy alone produces non-finite logits
        return real(self, prompts, n, *args, **kw)

    monkeypatch.setattr(ToyPolicy, "sample", sample)


def test_a_diverged_rank_ends_the_run_diverged_on_every_rank_at_once(tmp_path, monkeypatch):
    faulty_rank1(monkeypatch)
    pruned, diverged = str(tmp_path / "pruned"), str(tmp_path / "diverged")
    prune_at_2 = PruneAt(2)
    t0 = time.perf_counter()
    states = ranks.run_ranks(2, ranks._worker, [(toy(2), pruned), (toy(3), diverged)], prune_at_2)
    assert time.perf_counter() - t0 < 120  # not the collective timeout (300 s)
    # every rank ends both runs together: pruned (rank 0's answer), then diverged (rank 1's sampler)
    assert states == {0: ["pruned", "diverged"], 1: ["pruned", "diverged"]}
    status = RunStore(diverged).status()
    assert status["state"] == "diverged" and status["step"] == 2  # the step in flight
    assert status["error"] == "sampling probabilities became non-finite (NaN or inf) (on rank 1 of 2)"
    assert [r["step"] for r in RunStore(diverged).read("metrics")] == [1]
    # pruning: rank 0 alone was asked (rank 1's should_prune raises if called), at steps 1 and 2
    status = RunStore(pruned).status()
    assert status["state"] == "pruned" and status["step"] == 2
    assert [r["step"] for r in RunStore(pruned).read("evals")] == [0, 1, 2]
    # the same run in one process is pruned at the same step with the same metrics
    assert train(toy(2), str(tmp_path / "one"), progress=False, should_prune=PruneAt(2)) == "pruned"
    one, two = RunStore(tmp_path / "one").read("metrics"), RunStore(pruned).read("metrics")
    assert [r["train/reward_mean"] for r in one] == [r["train/reward_mean"] for r in two]


class PruneAt:
    """should_prune that answers True at `step`, on rank 0; on any other rank it must never be asked."""

    def __init__(self, step: int):
        self.step = step

    def __call__(self, step: int, ev: dict) -> bool:
        if distributed.rank() != 0:
            raise AssertionError(f"rank {distributed.rank()} was asked whether to prune")
        assert "eval/pass@1" in ev
        return step == self.step


def test_an_error_on_one_rank_fails_the_run_with_its_traceback_on_every_rank(tmp_path, monkeypatch):
    faulty_rank1(monkeypatch)
    out = str(tmp_path / "failed")
    with pytest.raises(ranks.RanksFailed) as failure:
        ranks.launch(2, [(toy(4), out)])
    status = RunStore(out).status()
    assert status["state"] == "failed" and status["step"] == 1
    # rank 0's own traceback carries rank 1's error and traceback (where in the sampler it was raised)
    assert "rank 1 of 2 failed: ValueError: the sampler crashed" in status["error"]
    assert "in sample" in status["error"] and 'raise ValueError("the sampler crashed")' in status["error"]
    assert "rank 1 of 2 failed" in str(failure.value)  # both ranks raised the same RuntimeError


@pytest.mark.parametrize("where", ["update", "old-policy pass"])
def test_an_error_on_one_rank_in_the_update_or_a_scoring_pass_fails_the_run_with_its_traceback(tmp_path, monkeypatch,
                                                                                                 where):
    # rank 1's forward raises, with grad (the update's backward passes) or without (pi_old's scores, needed
    # for two minibatches):
    # rank 0 learns of it before the gradient reduction or the gather that follows, not by a timeout
    real = ToyPolicy.features

    def features(self, rollout):
        if distributed.rank() == 1 and torch.is_grad_enabled() == (where == "update"):
            raise ValueError(f"rank 1 broke in the {where}")
        return real(self, rollout)

    monkeypatch.setattr(ToyPolicy, "features", features)
    cfg = toy(4, recipe={"group_size": 4, "max_new_tokens": 2, "kl_coef": 0.0, "minibatches": 2})
    out = str(tmp_path / "failed")
    t0 = time.perf_counter()
    with pytest.raises(ranks.RanksFailed):
        ranks.launch(2, [(cfg, out)])
    assert time.perf_counter() - t0 < 120  # not the collective timeout (300 s)
    status = RunStore(out).status()
    assert status["state"] == "failed" and status["step"] == 0 and not RunStore(out).read("metrics")  # in step 1
    assert f"rank 1 of 2 failed: ValueError: rank 1 broke in the {where}" in status["error"]
    assert "in features" in status["error"]  # rank 1's traceback


def _train_then_in_group(cfg, out: str) -> tuple[str, bool]:
    """One rank: `train`, then how it ended (its state, or what it raised) and whether this process is still
    in a process group."""
    try:
        ended = train(cfg, out, progress=False)
    except BaseException as err:  # noqa: BLE001 - every way out is the point
        ended = type(err).__name__
    return ended, torch.distributed.is_initialized()


@pytest.mark.parametrize("raised", [None, RuntimeError("node lost"), Stopped("stopped by SIGTERM"), KeyboardInterrupt(),
                                    SystemExit(0)])
def test_every_way_out_of_train_leaves_the_process_group(tmp_path, monkeypatch, raised):
    """A gloo group still alive when the process exits can abort it (SIGABRT, "terminate called without an
    active exception"): train() leaves the group it joined however it ends: completed, failed, cancelled
    (SIGTERM, Ctrl-C), or the SystemExit of a rank that leaves for a requeue."""
    if raised is not None:  # every rank at the end of step 2, before the step's last collective
        for cls in (RunStore, FollowerStore):
            def set_status(self, state, step, error=None, real=cls.set_status):
                if state == "running" and step == 2:
                    raise raised
                return real(self, state, step, error)

            monkeypatch.setattr(cls, "set_status", set_status)
    ended = "completed" if raised is None else type(raised).__name__
    assert ranks.run_ranks(2, _train_then_in_group, toy(2), str(tmp_path)) == {0: (ended, False),
                                                                                     1: (ended, False)}


def _gather_uneven() -> dict:
    """One rank of 2: gather shares of unequal sizes (rank 0: 3 rows of 4 columns, rank 1: 1 row of 2, as
    rollouts of different completion lengths), of several dtypes, a 0-dim and a non-contiguous tensor,
    texts and a rank with nothing (None); returns what this rank got."""
    with distributed.process_group(torch.device("cpu")):
        r = distributed.rank()
        rows = share(r)
        nothing = None if r == 1 else {"x": torch.ones(2, 3)}
        return {"objects": distributed.gather_objects(rows), "rows": distributed.gather_rows(rows["logp"][:, :2]),
                "empty": distributed.gather_rows(torch.zeros(0 if r == 1 else 2, 3)),  # rows: [3|1, 2]
                "none": distributed.gather_objects(nothing)}


def share(r: int) -> dict:
    n, t = (3, 4) if r == 0 else (1, 2)
    g = torch.Generator().manual_seed(r)
    return {"logp": torch.randn(n, t, generator=g, dtype=torch.float64) / 3, "ids": torch.arange(n * t).view(n, t),
            "mask": torch.rand(n, t, generator=g) > 0.5, "f32": torch.randn(t, n, generator=g).t(),  # not contiguous
            "scalar": torch.tensor(r + 0.5), "texts": [f"rank {r} row {i}" for i in range(n)], "rank": r}


def test_padded_tensor_gather_of_uneven_shares_is_bit_identical():
    got = ranks.run_ranks(2, _gather_uneven)
    shares = [share(0), share(1)]
    for r in (0, 1):  # every rank holds every rank's share, exactly (dtype, shape, bits), texts included
        objects = got[r]["objects"]
        assert [o["texts"] for o in objects] == [s["texts"] for s in shares]
        assert [o["rank"] for o in objects] == [0, 1]
        for o, s in zip(objects, shares):
            for k in ("logp", "ids", "mask", "f32", "scalar"):
                assert o[k].dtype == s[k].dtype and o[k].shape == s[k].shape and torch.equal(o[k], s[k]), k
        assert torch.equal(got[r]["rows"], torch.cat([s["logp"][:, :2] for s in shares]))
        assert got[r]["empty"].shape == (2, 3)
        assert got[r]["none"][1] is None and torch.equal(got[r]["none"][0]["x"], torch.ones(2, 3))
