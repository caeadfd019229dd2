"""One run on 2 ranks (gloo, CPU) gives the one-process result: the same samples and evals, metrics and
final parameters equal to 1e-5 relative, over a grid of recipes on the toy and the tiny LM; a rank killed
with SIGKILL fails the run, and the rerun resumes it (at another world size) to the uninterrupted result.

All 2-rank runs share one launch (`ranks.launch`, what `ablate train --nproc 2` calls): starting
ranks costs seconds, the toy runs themselves a fraction of one."""

import math
import os
import signal
from itertools import product
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ablate.cli.main import app
from ablate.config import parse
from ablate.rl.sampling import RowNoise, draw
from ablate.runs.store import FollowerStore, RunStore
from ablate.train import ranks
from ablate.train.models import BuildSettings, build_base_model
from ablate.train.trainer import train

BASELINES = ["none", "batch_mean", "group_mean", "leave_one_out", "greedy"]
SCALES = ["none", "group", "batch"]
AGGS = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
# every baseline x scale, the aggregations in turn (each pair of baseline and aggregation, of scale and
# aggregation, occurs); odd sizes give the ranks unequal shares of groups, rows and minibatches
TOY_GRID = [(b, s, AGGS[(i + j) % 3]) for (i, b), (j, s) in product(enumerate(BASELINES), enumerate(SCALES))]
# the tiny LM adds KL in the loss and in the reward, several epochs and minibatches, micro-batches
LM_RECIPES = [dict(preset="grpo", loss_agg="token_mean"),
              dict(baseline="batch_mean", scale="none", kl_coef=0.05, kl_placement="reward",
                   kl_estimator="k1", loss_agg="seq_mean_token_sum_norm", update_epochs=2, minibatches=2)]
# PPO's critic (recipe.adv_whiten gae): its values and fit split across ranks like the policy's update; on
# the toy (tabular values) and the tiny LM (the preset's 4 minibatches, GAE, value clip; a format reward, so
# the barely trained LM earns reward for the critic to fit; no KL: KL in the reward is near 0 at step 2, so
# its LM rounding moves advantages by 1e-5 relative, with the redundant critic of before as with this one)
PPO_CASES = ["toy", "lm"]
# (with scale "batch" on top of KL in the reward, an advantage moves by ~1e-5 relative between 2 ranks and
# 1, exactly as much as between micro-batch budgets of 32 and 64 tokens in one process: LM log-probs
# round differently in batches of other shapes, and the batch std divides that rounding)


def toy(baseline, scale, agg, **over):
    return parse({"task": {"name": "toy_addition"}, "prompts_per_step": 5, "steps": 3, "checkpoint_every": 0,
                  "recipe": {"group_size": 3, "max_new_tokens": 2, "kl_coef": 0.0, "baseline": baseline,
                             "scale": scale, "loss_agg": agg, "minibatches": 2},
                  "eval": {"every": 0, "n_samples": 3, "ks": [1, 3]},
                  "optim": {"optimizer": "adamw", "lr": 0.1}, "compute": {"threads": 1}, **over})


def lm(model_dir, recipe):
    preset = recipe.get("preset")
    return parse({**({"preset": preset} if preset else {}), "model": {"path": model_dir},
                  "task": {"num_train": 32, "num_heldout": 3, "digits": [1], "operators": ["+"], "gameable": True},
                  "prompts_per_step": 3, "steps": 3, "checkpoint_every": 0,
                  "eval": {"every": 2, "n_samples": 2, "ks": [1, 2]},
                  "recipe": {"group_size": 4, "max_new_tokens": 5, **{k: v for k, v in recipe.items() if k != "preset"}},
                  "compute": {"threads": 1, "micro_batch_tokens": 64}})


def killed_job():  # long enough to be killed mid-run, checkpointed every 4 steps
    return toy("group_mean", "group", "token_mean", steps=10, checkpoint_every=4,
               eval={"every": 0, "n_samples": 2, "ks": [1]})


def sigkill_rank1_at_step(monkeypatch, run_dir: str, step: int) -> None:
    """Rank 1 of the run in `run_dir` kills itself with SIGKILL once step `step` is done (the launcher forks
    its ranks from this process, so they inherit the patch; rank 1 reports progress to a FollowerStore)."""
    real = FollowerStore.set_status

    def set_status(self, state, at, error=None):
        if str(self.root) == run_dir and state == "running" and at == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, state, at, error)

    monkeypatch.setattr(FollowerStore, "set_status", set_status)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model")
    tiny = BuildSettings(steps=5, hidden=32, layers=2, heads=2, intermediate=64, digits=(1,), operators=("+",))
    build_base_model(path, settings=tiny, progress=False)  # barely trained: the recipes only need to run
    return str(path)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, model_dir):
    """Every config trained on 2 ranks in one launch; in the last one rank 1 dies of SIGKILL at step 6."""
    root = tmp_path_factory.mktemp("ddp")
    cfgs = [toy(*g) for g in TOY_GRID] + [lm(model_dir, r) for r in LM_RECIPES] + \
        [toy("none", "none", "token_mean", preset="ppo"), lm(model_dir, dict(preset="ppo", format_weight=0.5, kl_coef=0.0))]
    jobs = [(cfg, str(root / f"run{i}")) for i, cfg in enumerate(cfgs)] + [(killed_job(), str(root / "killed"))]
    with pytest.MonkeyPatch.context() as monkeypatch:
        sigkill_rank1_at_step(monkeypatch, jobs[-1][1], 6)
        with pytest.raises(ranks.RanksFailed) as failure:  # the killed rank fails the launch
            ranks.launch(2, jobs)
    return jobs, failure.value


def close(a, b, key: str = "") -> bool:
    # offpolicy/* measure behaviour vs recomputed log-probs: on the LM, rounding differences (~1e-7) between
    # the sampling and the scoring forward, which depend on the batch's shape; compared absolutely
    abs_tol = 1e-5 if key.startswith("offpolicy/") else 1e-7
    if isinstance(a, float) or isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5, abs_tol=abs_tol)
    return a == b


def assert_same_run(one: Path, two: Path, world: int = 2):
    s1, s2 = RunStore(one), RunStore(two)
    assert s2.status()["state"] == "completed"
    assert s2.provenance()["world_size"] == world and s2.provenance()["sampler"] == "global_row_inverse_cdf_v1"
    for log in ("samples", "evals", "metrics"):
        rows1, rows2 = s1.read(log), s2.read(log)
        assert len(rows1) == len(rows2) > 0
        for r1, r2 in zip(rows1, rows2):
            assert r1.keys() == r2.keys()
            for k in r1:
                exact = log == "samples" and isinstance(r1[k], str) or log == "evals" and k != "eval/pass@1_exact"
                if not k.startswith("perf/"):  # timings
                    assert (r1[k] == r2[k]) if exact else close(r1[k], r2[k], k), (log, r1["step"], k, r1[k], r2[k])
    w1, w2 = s1.load_checkpoint()["model"], s2.load_checkpoint()["model"]
    assert w1.keys() == w2.keys()
    for k in w1:
        assert w1[k].dtype == torch.float32
        assert_params_close(w2[k], w1[k])


def assert_params_close(a, b):  # 1e-5 relative to the tensor's norm (an entry near 0 has no relative scale)
    assert float(torch.linalg.vector_norm(a - b)) <= 1e-5 * float(torch.linalg.vector_norm(b)) + 1e-12


@pytest.mark.parametrize("i", range(len(TOY_GRID) + len(LM_RECIPES)))
def test_two_ranks_give_the_one_process_run(two_ranks, tmp_path, i):
    jobs, _ = two_ranks
    cfg, two = jobs[i]
    assert train(cfg, str(tmp_path), progress=False) == "completed"
    assert_same_run(tmp_path, Path(two))


@pytest.mark.parametrize("case", PPO_CASES)
def test_ppo_critic_split_across_two_ranks_gives_the_one_process_critic(two_ranks, tmp_path, case):
    jobs, _ = two_ranks
    cfg, two = jobs[len(TOY_GRID) + len(LM_RECIPES) + PPO_CASES.index(case)]
    assert cfg.recipe.adv_whiten == "gae"
    assert train(cfg, str(tmp_path), progress=False) == "completed"
    assert_same_run(tmp_path, Path(two))  # samples, evals, metrics (critic/*, train/adv_*), policy weights
    assert all("critic/value_mean" in row and "critic/value_loss" in row for row in RunStore(two).read("metrics"))
    # the value model's final weights (toy: tables v0, v1; LM: trunk and head), which started at V = 0
    c1, c2 = (flat(RunStore(d).load_checkpoint()["critic"]["weights"]) for d in (tmp_path, two))
    assert c1.keys() == c2.keys() and float(c1["v0" if case == "toy" else "head.bias"].abs().max()) > 0
    for k in c1:
        assert_params_close(c2[k], c1[k])


def flat(state: dict, prefix: str = "") -> dict:
    return {k2: v2 for k, v in state.items()
            for k2, v2 in (flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}).items()}


def test_a_killed_rank_fails_the_run_and_the_rerun_resumes_it(two_ranks, tmp_path):
    jobs, failure = two_ranks
    cfg, killed = jobs[-1]
    store = RunStore(killed)
    status = store.status()
    # status.json holds both accounts, in this order, whichever rank ended first: rank 0's traceback (the
    # collective at the end of step 6 lost its peer; the launcher let it end by itself), then the
    # launcher's, how each rank ended
    account = "rank 0 of 2: exit code 1; rank 1 of 2: killed by signal 9 (SIGKILL)"
    assert status["state"] == "failed" and status["step"] == 6
    own, launcher = status["error"].rsplit("\n", 1)
    assert launcher == f"launcher: {account}"
    assert own.startswith("Traceback (most recent call last):\n") and "in agree" in own
    last = own.splitlines()[-1]  # gloo: "Connection reset by peer" or "Connection closed by peer"
    assert last.startswith("RuntimeError: [") and "gloo" in last and "by peer" in last
    # the launch's error: the same account, then the traceback of each rank that raised (rank 0 alone)
    assert failure.account == account and str(failure).startswith(f"{account}\nrank 0: Traceback")
    assert "\nrank 1: " not in str(failure)
    assert train(cfg, killed, progress=False) == "completed"  # resumes from step 4, here at world size 1
    assert store.provenance()["resumed_from_steps"] == [4]
    assert train(cfg, str(tmp_path), progress=False) == "completed"  # never interrupted
    w1, w2 = RunStore(tmp_path).load_checkpoint()["model"], store.load_checkpoint()["model"]
    for k in w1:
        assert_params_close(w2[k], w1[k])
    m1 = RunStore(tmp_path).read("metrics")
    m2 = store.read("metrics")
    assert [r["step"] for r in m2] == list(range(1, cfg.steps + 1))
    assert all(close(m1[j][k], m2[j][k]) for j in range(cfg.steps) for k in m1[j] if not k.startswith("perf/"))


def test_row_noise_does_not_depend_on_the_split():
    """Inverse-CDF draws from the global row's uniform: any split of the rows picks the same tokens."""
    logits = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    whole = draw(logits, 0.7, False, RowNoise((3, 1, 0, 0), 7).next())[0]
    parts = torch.cat([draw(logits[a:b], 0.7, False, RowNoise((3, 1, 0, 0), 7, a, b).next())[0]
                       for a, b in [(0, 3), (3, 4), (4, 7)]])
    assert torch.equal(whole, parts)
    # the chosen token is the first whose cumulative probability exceeds u (hand-computed)
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log()
    for u, tok in [(0.05, 0), (0.1, 1), (0.29, 1), (0.31, 2), (0.61, 3), (0.9999, 3)]:
        assert int(draw(probs, 1.0, False, torch.tensor([u]))[0]) == tok


def test_nproc_is_checked_and_fsdp_refused_for_the_tabular_toy(tmp_path):
    res = CliRunner().invoke(app, ["train", "configs/toy.yaml", "--out", str(tmp_path / "r"), "--nproc", "0"])
    assert res.exit_code == 2 and "--nproc" in res.output
    # fsdp shards decoder layers: the toy task has none (exit 2 naming the field and the allowed values)
    res = CliRunner().invoke(app, ["train", "configs/toy.yaml", "--out", str(tmp_path / "r"),
                                   "--set", "compute.parallel=fsdp"])
    assert res.exit_code == 2 and "compute.parallel" in res.output and "ddp" in res.output
