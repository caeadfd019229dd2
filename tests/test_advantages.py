"""Hand-computed advantage values, including every worked example of docs/recipes.md ("Worked examples")."""

import math

import pytest
import torch
from torch.testing import assert_close

from ablate.rl.advantages import BASELINES, SCALES, compute_advantages

TOL = {"atol": 1e-5, "rtol": 0}  # eps=1e-6 in the denominator shifts values by ~1e-6


def adv(rewards, **kw):
    return compute_advantages(torch.tensor(rewards, dtype=torch.float64), **kw)


def test_design_example_grpo_balanced_group():
    # mean 0.5, population std 0.5 -> +1, -1, +1, -1
    a = adv([[1, 0, 1, 0]], baseline="group_mean", scale="group", ddof=0)
    assert_close(a, torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=torch.float64), **TOL)


def test_design_example_grpo_one_correct_of_four():
    # mean 0.25, population std sqrt(3)/4 = 0.433 -> +sqrt(3) = 1.73, -1/sqrt(3) = -0.58
    a = adv([[1, 0, 0, 0]], baseline="group_mean", scale="group", ddof=0)
    s3 = math.sqrt(3)
    assert_close(a, torch.tensor([[s3, -1 / s3, -1 / s3, -1 / s3]], dtype=torch.float64), **TOL)
    assert_close(a, torch.tensor([[1.73, -0.58, -0.58, -0.58]], dtype=torch.float64), atol=5e-3, rtol=0)


def test_design_example_grpo_group_of_eight():
    # mean 3/8, population std sqrt(15)/8 = 0.484 -> +5/sqrt(15) = 1.29, -3/sqrt(15) = -0.77
    r = [[0, 0, 1, 0, 1, 1, 0, 0]]
    a = adv(r, baseline="group_mean", scale="group", ddof=0)
    pos, neg = 5 / math.sqrt(15), -3 / math.sqrt(15)
    expected = torch.tensor([[pos if x else neg for x in r[0]]], dtype=torch.float64)
    assert_close(a, expected, **TOL)
    assert round(pos, 2) == 1.29 and round(neg, 2) == -0.77


@pytest.mark.parametrize("value", [0.0, 1.0])
@pytest.mark.parametrize("ddof", [0, 1])
def test_design_example_dead_group_is_zero(value, ddof):
    a = adv([[value] * 4], baseline="group_mean", scale="group", ddof=ddof)
    assert_close(a, torch.zeros(1, 4, dtype=torch.float64), atol=0, rtol=0)


def test_design_example_rloo():
    a = adv([[1, 0, 0, 0]], baseline="leave_one_out", scale="none")
    assert_close(a, torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]], dtype=torch.float64), atol=1e-12, rtol=0)


def test_rloo_identity_g_over_g_minus_one():
    r = torch.tensor([[0.3, 1.0, 0.0, 0.7, 0.2]], dtype=torch.float64)
    loo = compute_advantages(r, baseline="leave_one_out", scale="none")
    grp = compute_advantages(r, baseline="group_mean", scale="none")
    assert_close(loo, 5 / 4 * grp, atol=1e-12, rtol=0)


def test_group_scale_sample_std():
    # ddof=1: std of [1,0,1,0] = sqrt(1/3) -> 0.5 / sqrt(1/3) = sqrt(3)/2 = 0.866
    a = adv([[1, 0, 1, 0]], baseline="group_mean", scale="group", ddof=1)
    h = math.sqrt(3) / 2
    assert_close(a, torch.tensor([[h, -h, h, -h]], dtype=torch.float64), **TOL)


def test_batch_mean_baseline():
    # mean of all four rewards is 0.75
    a = adv([[1, 0], [1, 1]], baseline="batch_mean", scale="none")
    assert_close(a, torch.tensor([[0.25, -0.75], [0.25, 0.25]], dtype=torch.float64), atol=1e-12, rtol=0)


def test_none_baseline_is_raw_reward():
    a = adv([[1, 0], [0.5, 2]], baseline="none", scale="none")
    assert_close(a, torch.tensor([[1.0, 0.0], [0.5, 2.0]], dtype=torch.float64), atol=0, rtol=0)


@pytest.mark.parametrize("ddof,std", [(0, math.sqrt(0.125)), (1, math.sqrt(0.5 / 3))])
def test_lite_ppo_group_mean_batch_std(ddof, std):
    # group-centred [[.5,-.5],[0,0]]; batch std of those four values: pop sqrt(.125), sample sqrt(.5/3)
    a = adv([[1, 0], [1, 1]], baseline="group_mean", scale="batch", ddof=ddof)
    v = 0.5 / std  # 1.41421 (ddof 0) / 1.22474 (ddof 1)
    assert_close(a, torch.tensor([[v, -v], [0.0, 0.0]], dtype=torch.float64), **TOL)


def test_batch_std_is_of_centered_values_not_raw_rewards():
    # group offsets 0 and 10: raw-reward std would be ~5, the centred std is 0.5 (pop) -> A = +-1
    a = adv([[1, 0], [11, 10]], baseline="group_mean", scale="batch", ddof=0)
    assert_close(a, torch.tensor([[1.0, -1.0], [1.0, -1.0]], dtype=torch.float64), **TOL)


def test_greedy_baseline_remax():
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    a = compute_advantages(r, baseline="greedy", scale="none", greedy_rewards=torch.tensor([1.0, 0.0]))
    assert_close(a, torch.tensor([[0.0, -1.0], [0.0, 0.0]]), atol=0, rtol=0)


def test_greedy_baseline_requires_greedy_rewards():
    with pytest.raises(ValueError, match="greedy_rewards"):
        compute_advantages(torch.zeros(2, 3), baseline="greedy", scale="none")
    with pytest.raises(ValueError, match="greedy_rewards"):
        BASELINES["greedy"](torch.zeros(2, 3), None)


def test_integer_rewards_give_float_advantages():
    a = compute_advantages(torch.tensor([[1, 0, 0, 0]]), baseline="leave_one_out", scale="none")
    assert a.is_floating_point()
    assert_close(a, torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]]), atol=1e-6, rtol=0)


def test_unknown_names_list_allowed():
    with pytest.raises(ValueError, match="group_mean.*leave_one_out"):
        compute_advantages(torch.zeros(1, 2), baseline="bogus", scale="none")
    with pytest.raises(ValueError, match="none, group, batch"):
        compute_advantages(torch.zeros(1, 2), baseline="none", scale="bogus")


def test_registry_names_match_config_literals():
    import typing

    from ablate.config import Baseline, Scale
    assert set(BASELINES) == set(typing.get_args(Baseline))
    assert set(SCALES) == set(typing.get_args(Scale))


# --- REINFORCE++ token-level returns and whitening (Hu 2025) -----------------------------------

from ablate.rl.advantages import batch_token_scale, reinforce_pp_advantages, token_returns, whiten  # noqa: E402

LENS = [3, 2, 4, 1]
RPP_MASK = torch.tensor([[i < n for i in range(4)] for n in LENS])


def _rows(rows):
    return torch.tensor([r + [0.0] * (4 - len(r)) for r in rows], dtype=torch.float64)


def test_reinforce_pp_worked_example():
    k1 = _rows([[0.10, -0.05, 0.20], [0.30, 0.00], [0.05, 0.05, 0.10, -0.10], [0.40]])
    R = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    last = torch.zeros(4, 4, dtype=torch.float64)
    last[[0, 1, 2, 3], [2, 1, 3, 0]] = R
    G = token_returns(last - 0.1 * k1, RPP_MASK)
    assert_close(G, _rows([[0.9750, 0.9850, 0.9800], [-0.0300, 0.0000], [0.9900, 0.9950, 1.0000, 1.0100],
                           [0.9600]]), atol=1e-4, rtol=0)
    pop = reinforce_pp_advantages(R, RPP_MASK, k1, 0.1, ddof=0)
    assert_close(pop, _rows([[0.4701, 0.4950, 0.4825], [-2.0361, -1.9613], [0.5075, 0.5199, 0.5324, 0.5573],
                             [0.4326]]), atol=1e-4, rtol=0)
    sample = reinforce_pp_advantages(R, RPP_MASK, k1, 0.1, ddof=1)
    assert_close(sample, _rows([[0.4459, 0.4696, 0.4578], [-1.9316, -1.8606],
                                [0.4814, 0.4932, 0.5051, 0.5287], [0.4104]]), atol=1e-4, rtol=0)
    # no KL: outcome REINFORCE with global whitening
    assert_close(reinforce_pp_advantages(R, RPP_MASK, None, 0.1, ddof=0),
                 whiten(R[:, None].expand(4, 4), RPP_MASK, ddof=0), atol=1e-12, rtol=0)


def test_batch_token_scale_worked_example():
    centred = compute_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), baseline="group_mean", scale="none")
    assert_close(centred.flatten(), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    pop = batch_token_scale(centred.flatten().double(), RPP_MASK, ddof=0)
    assert_close(pop[:, 0], torch.tensor([1.2857, -1.5714, -0.1429, -0.1429], dtype=torch.float64),
                 atol=1e-4, rtol=0)
    sample = batch_token_scale(centred.flatten().double(), RPP_MASK, ddof=1)
    assert_close(sample[:, 0], torch.tensor([1.2197, -1.4908, -0.1355, -0.1355], dtype=torch.float64),
                 atol=1e-4, rtol=0)
    assert (pop[~RPP_MASK] == 0).all()


def test_whiten_edge_cases():
    one = torch.tensor([[1, 0]], dtype=torch.bool)
    assert whiten(torch.tensor([[3.0, 7.0]]), one).tolist() == [[0.0, 0.0]]  # one token: no variance, 0
    assert whiten(torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.bool)).abs().sum() == 0
