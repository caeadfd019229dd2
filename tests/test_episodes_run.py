"""The trainer on multi-turn episodes (the calculator environment, a tiny calculator model): runs log the
episode metrics; the same run on 2 ranks (gloo) and with micro-batches gives the one-process result; a rank
killed with SIGKILL in the middle of an episode fails the run, and the rerun resumes it to the uninterrupted
result. All 2-rank runs share one launch."""

import math
import os
import signal
from pathlib import Path

import pytest

from ablate.config import parse
from ablate.runs.metrics import is_defined
from ablate.runs.store import RunStore
from ablate.train import distributed, episodes, ranks
from ablate.train.tool_models import CalculatorSettings, build_calculator_model
from ablate.train.trainer import train
from tests.test_distributed import assert_params_close, assert_same_run, close


@pytest.fixture(scope="module")
def calc_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-calc")
    tiny = CalculatorSettings(steps=60, batch_size=16, hidden=32, layers=1, heads=2, intermediate=64, tool_share=0.6)
    build_calculator_model(path, tiny, progress=False)  # barely trained: it calls the calculator at random
    return str(path)


def calc(model_dir, steps=3, **recipe):
    return parse({"model": {"path": model_dir},
                  "task": {"name": "env", "environment": "calculator", "num_train": 32, "num_heldout": 3,
                           "episode": {"max_turns": 3, "turn_tokens": 8, "tool_error_penalty": 0.1}},
                  "prompts_per_step": 3, "steps": steps, "checkpoint_every": 2,
                  "eval": {"every": 2, "n_samples": 2, "ks": [1, 2]},
                  "recipe": {"group_size": 4, "max_new_tokens": 20, "kl_coef": 0.0, "temperature": 1.5, **recipe},
                  "compute": {"threads": 1, "micro_batch_tokens": 64}})


RECIPES = [dict(), dict(mask_env_tokens=False, loss_agg="token_mean", update_epochs=2, minibatches=2),
           dict(credit="turn", scale="none", loss_agg="seq_mean_token_sum_norm", is_correction="tis")]


def kill_rank1_mid_episode(monkeypatch, run_dir: str, after_step: int) -> None:
    """Rank 1 of the run in `run_dir` kills itself with SIGKILL inside an environment step of the step after
    `after_step` (the launcher forks its ranks from this process, so they inherit the patch)."""
    real = episodes._respond

    def respond(e, *args):
        status = RunStore(run_dir).status() if Path(run_dir, "status.json").exists() else None
        if distributed.rank() == 1 and status and status["step"] >= after_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(e, *args)

    monkeypatch.setattr(episodes, "_respond", respond)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, calc_model):
    root = tmp_path_factory.mktemp("ddp-env")
    jobs = [(calc(calc_model, **r), str(root / f"run{i}")) for i, r in enumerate(RECIPES)]
    jobs.append((calc(calc_model, steps=5), str(root / "killed")))
    with pytest.MonkeyPatch.context() as monkeypatch:
        kill_rank1_mid_episode(monkeypatch, jobs[-1][1], 3)
        with pytest.raises(ranks.RanksFailed):
            ranks.launch(2, jobs)
    return jobs


@pytest.mark.parametrize("i", range(len(RECIPES)))
def test_episodes_on_two_ranks_give_the_one_process_run(two_ranks, tmp_path, i):
    cfg, two = two_ranks[i]
    assert train(cfg, str(tmp_path), progress=False) == "completed"
    assert_same_run(tmp_path, Path(two))
    rows = RunStore(tmp_path).read("metrics")
    for row in rows:
        assert all(is_defined(k) and math.isfinite(v) for k, v in row.items() if k != "step"), row
        assert row["episode/end_done"] + row["episode/end_max_turns"] + row["episode/end_budget"] + \
            row["episode/env_errors"] == pytest.approx(1.0)
    assert sum(r["episode/tool_calls"] for r in rows) > 0 and sum(r["episode/env_token_frac"] for r in rows) > 0


def test_micro_batches_give_the_one_pass_run(two_ranks, tmp_path, calc_model):
    cfg, _ = two_ranks[1]  # environment tokens in the loss, token_mean: the denominator counts them
    one = tmp_path / "one"
    assert train(cfg, str(one), progress=False) == "completed"
    from dataclasses import replace

    split = replace(cfg, compute=replace(cfg.compute, micro_batch_tokens=24))
    assert train(split, str(tmp_path / "split"), progress=False) == "completed"
    assert_same_run(one, tmp_path / "split", world=1)


def test_killed_mid_episode_resumes_to_the_uninterrupted_run(two_ranks, tmp_path):
    cfg, killed = two_ranks[-1]
    store = RunStore(killed)
    assert store.status()["state"] == "failed" and store.status()["step"] == 3
    assert train(cfg, killed, progress=False) == "completed"  # from the step-2 checkpoint, at world size 1
    assert store.provenance()["resumed_from_steps"] == [2]
    assert train(cfg, str(tmp_path), progress=False) == "completed"
    w1, w2 = RunStore(tmp_path).load_checkpoint()["model"], store.load_checkpoint()["model"]
    for k in w1:
        assert_params_close(w2[k], w1[k])
    m1, m2 = RunStore(tmp_path).read("metrics"), store.read("metrics")
    assert [r["step"] for r in m2] == list(range(1, cfg.steps + 1))
    differ = [(j + 1, k, m1[j][k], m2[j][k]) for j in range(cfg.steps) for k in m1[j]
              if not k.startswith("perf/") and not close(m1[j][k], m2[j].get(k, math.nan), k)]
    assert not differ
    s1, s2 = RunStore(tmp_path).read("samples"), store.read("samples")
    assert [s["completion"] for s in s1] == [s["completion"] for s in s2]
