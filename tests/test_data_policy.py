"""Online data policies: hand-checked selections, a conformance test over the registry, the paired
design, the checkpoint round trip and the trainer's use (toy testbed)."""

import io
import math

import numpy as np
import pytest
import torch
from conftest import crash_training_at

import ablate.train.trainer as trainer
from ablate.config import ConfigError, load, parse
from ablate.rl import data_policy as dp
from ablate.runs.store import RunStore
from ablate.train.data import PromptSampler

PARAMS = dp.Params(seed=3, total=1000)


def pool(rates, retired=None, position=0, draws=0):
    return dp.Pool(position, draws, list(rates), list(retired or [False] * len(rates)))


# --- hand-checked ------------------------------------------------------------------------------------

def historical_stream(n: int, seed: int, position: int, k: int) -> list[int]:
    """The trainer's prompt order before data policies (a reference): position p is element p % n of
    epoch p // n's permutation, numpy's default_rng([seed, epoch]).permutation(n)."""
    out = []
    for pos in range(position, position + k):
        epoch, i = divmod(pos, n)
        out.append(int(np.random.default_rng([seed, epoch]).permutation(n)[i]))
    return out


def test_uniform_is_the_historical_prompt_stream_bit_for_bit():
    state, got = dp.Pool.new(5), []
    for _ in range(4):
        idx, state = dp.advance(state, "uniform", 3, PARAMS)
        got += idx
    assert got == historical_stream(5, 3, 0, 12) and state.position == 12 and state.draws == 4
    assert sorted(got[:5]) == list(range(5))  # each epoch is a permutation


def test_prioritized_weights_by_hand():
    # rates [1, 0.5, 0, never] with smoothing 0.1, prior 0.5: w = [0.1, 0.6, 1.1, 0.6], sum 2.4
    p = dp.priorities(pool([1.0, 0.5, 0.0, math.nan]), PARAMS)
    np.testing.assert_allclose(p, [0.1 / 2.4, 0.6 / 2.4, 1.1 / 2.4, 0.6 / 2.4], atol=1e-12)
    counts = np.zeros(4)
    for d in range(4000):
        counts[dp.select_prioritized(pool([1.0, 0.5, 0.0, math.nan], draws=d), 1, PARAMS)[0]] += 1
    np.testing.assert_allclose(counts / 4000, p, atol=0.025)
    idx, position = dp.select_prioritized(pool([0.0] * 6, position=7), 6, PARAMS)
    assert sorted(idx) == list(range(6)) and position == 13  # k distinct prompts when k <= n


def test_curriculum_pacing_and_ranking_by_hand():
    params = dp.Params(seed=0, total=1000, curriculum_start=0.25)
    assert dp.curriculum_size(100, 4, 0, params) == 25
    assert dp.curriculum_size(100, 4, 500, params) == 63     # ceil(0.625 * 100)
    assert dp.curriculum_size(100, 4, 1000, params) == 100
    assert dp.curriculum_size(100, 4, 5000, params) == 100   # capped at the pool
    assert dp.curriculum_size(10, 4, 0, params) == 4         # never fewer than k
    # 8 prompts, eligible 2 at the start: the two easiest (rates 0.9 and 0.7), never the others
    rates = [0.2, 0.9, math.nan, 0.7, 0.1, 0.0, 0.3, 0.4]
    seen = set()
    for d in range(50):
        idx, _ = dp.select_curriculum(pool(rates, draws=d), 2, params)
        seen |= set(idx)
    assert seen == {1, 3}


def test_no_positive_resampling_retires_for_good():
    params = dp.Params(seed=3, total=100, retire_threshold=0.9)
    state = dp.observe(dp.Pool.new(4), "no_positive_resampling", [0, 1, 2], [0.9, 0.875, 1.0], params)
    assert state.retired == [True, False, True, False]
    assert state.rate[:3] == [0.9, 0.875, 1.0] and math.isnan(state.rate[3])
    for _ in range(5):
        idx, state = dp.advance(state, "no_positive_resampling", 3, params)
        assert set(idx) <= {1, 3}
    # other policies record the rate but never retire
    assert dp.observe(dp.Pool.new(4), "uniform", [0], [1.0], params).retired == [False] * 4
    # everything retired: the pool falls back to all prompts rather than stalling
    done = dp.Pool(0, 0, [1.0] * 4, [True] * 4)
    assert sorted(dp.advance(done, "no_positive_resampling", 4, params)[0]) == [0, 1, 2, 3]


# --- conformance over every registry entry -----------------------------------------------------------

@pytest.mark.parametrize("policy", sorted(dp.DATA_POLICIES))
@pytest.mark.parametrize("k", [1, 4, 9])
def test_every_policy_is_pure_and_well_formed(policy, k):
    rng = np.random.default_rng(0)
    rates = [math.nan if u < 0.3 else float(u) for u in rng.random(6)]
    state = pool(rates, [False, True, False, False, False, False], position=5, draws=2)
    snapshot = (list(state.rate), list(state.retired))
    idx_a, pos_a = dp.DATA_POLICIES[policy](state, k, PARAMS)
    idx_b, pos_b = dp.DATA_POLICIES[policy](state, k, PARAMS)
    assert (idx_a, pos_a) == (idx_b, pos_b)                          # same state, same draw
    assert (list(state.rate), list(state.retired)) == snapshot       # the state is not mutated
    assert len(idx_a) == k and all(type(i) is int and 0 <= i < 6 for i in idx_a)
    assert pos_a >= state.position + k
    if k <= 5:
        assert len(set(idx_a)) == k or policy not in ("prioritized", "curriculum")  # distinct draws
    nxt = dp.advance(state, policy, k, PARAMS)[1]
    assert nxt.draws == 3 and nxt.position == pos_a


# --- the paired design -------------------------------------------------------------------------------

def sampler(policy, *recipe):
    cfg = parse({"seed": 5, "steps": 10, "prompts_per_step": 4,
                 "recipe": {"data_policy": policy, **dict(r.split("=") for r in recipe)}})
    return PromptSampler(20, cfg)


@pytest.mark.parametrize("policy", sorted(dp.DATA_POLICIES))
def test_toggles_do_not_change_the_prompt_stream(policy):
    """Runs that differ in recipe toggles but share seed and data policy draw the same prompts (given the
    same pass rates; for uniform and zero_variance_filter, whatever the pass rates)."""
    a, b = sampler(policy), sampler(policy, "kl_coef=0.04", "scale=none", "eps_high=0.28")
    for step in range(10):
        ia, ib = a.take(4), b.take(4)
        assert ia == ib
        rates = [((i * 7 + step) % 9) / 8 for i in ia]
        a.observe(ia, rates)
        b.observe(ib, rates)


def test_uniform_and_zero_variance_filter_ignore_pass_rates():
    a, b = sampler("uniform"), sampler("zero_variance_filter")
    for _ in range(10):
        ia, ib = a.take(4), b.take(4)
        assert ia == ib
        a.observe(ia, [1.0] * 4)
        b.observe(ib, [0.0] * 4)


def toy(*overrides):
    return load("configs/toy.yaml", list(overrides))


def run(cfg, path):
    assert trainer.train(cfg, str(path), progress=False) == "completed"
    return RunStore(path)


def test_trainer_runs_differing_in_toggles_see_the_same_prompts(tmp_path):
    a = run(toy("steps=6", "eval.every=1"), tmp_path / "a")
    b = run(toy("steps=6", "eval.every=1", "recipe.scale=none", "recipe.baseline=leave_one_out"), tmp_path / "b")
    prompts = lambda s: [(r["step"], r["prompt"]) for r in s.read("samples") if r["split"] == "train"]  # noqa: E731
    assert prompts(a) == prompts(b) and len(prompts(a)) == 6 * 4
    assert [r["train/reward_mean"] for r in a.read("metrics")] != [r["train/reward_mean"] for r in b.read("metrics")]


# --- the trainer -------------------------------------------------------------------------------------

def test_zero_variance_filter_drops_dead_groups_without_resampling(tmp_path):
    store = run(toy("steps=30", "recipe.data_policy=zero_variance_filter", "eval.every=0"), tmp_path)
    rows = store.read("metrics")
    assert all(r["train/gen_rounds"] == 1 for r in rows)
    for r in rows:
        expected = round(16 * (1 - r["train/dead_group_frac"]))
        assert r["train/live_groups"] == (expected or 16)  # all dead: a no-op update on all 16
    assert any(r["train/live_groups"] < 16 for r in rows)


def test_no_positive_resampling_shrinks_the_pool_and_logs_it(tmp_path):
    store = run(toy("steps=40", "recipe.data_policy=no_positive_resampling", "recipe.retire_threshold=0.75",
                    "eval.every=0"), tmp_path)
    rows = store.read("metrics")
    sizes = [r["data/pool_size"] for r in rows]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < 64
    assert rows[-1]["data/retired_frac"] == pytest.approx(1 - sizes[-1] / 64)
    assert all(0 <= r["data/sampled_pass_rate_mean"] <= 1 for r in rows)


@pytest.mark.parametrize("policy", ["prioritized", "curriculum", "no_positive_resampling"])
def test_resume_restores_the_policy_state(tmp_path, monkeypatch, policy):
    cfg = toy("steps=10", "checkpoint_every=4", "eval.every=5", f"recipe.data_policy={policy}")
    whole = run(cfg, tmp_path / "whole")
    crash_training_at(monkeypatch, cfg, tmp_path / "resumed", step=6)
    resumed = run(cfg, tmp_path / "resumed")
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]  # noqa: E731
    assert strip(resumed.read("metrics")) == strip(whole.read("metrics"))


def test_state_is_plain_data_for_weights_only_checkpoints():
    s = sampler("prioritized")
    s.observe(s.take(4), [0.25, 0.5, 1.0, 0.0])
    buf = io.BytesIO()
    torch.save({"stream": s.state_dict()}, buf)
    buf.seek(0)
    back = sampler("prioritized")
    back.load_state_dict(torch.load(buf, weights_only=True)["stream"])
    assert back.take(4) == s.take(4)
    legacy = sampler("uniform")
    legacy.load_state_dict(12)  # a checkpoint from before data policies held the stream position
    assert legacy.take(4) == historical_stream(20, 5, 12, 4)


def test_config_rules():
    with pytest.raises(ConfigError, match="data_policy"):
        parse({"recipe": {"data_policy": "random"}})
    with pytest.raises(ConfigError, match="choose one"):
        parse({"recipe": {"data_policy": "zero_variance_filter", "dynamic_sampling": True}})
    with pytest.raises(ConfigError, match="retire_threshold"):
        parse({"recipe": {"retire_threshold": 0.0}})
