"""pass@k and group diagnostics on hand-computed inputs."""

import math

import pytest
import torch
from torch.testing import assert_close

from ablate.rl.stats import group_stats, masked_mean, masked_std, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("k,expected", [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)])
def test_design_example_pass_at_k(k, expected):
    # n=4, c=1: 1 - C(3,k)/C(4,k)
    assert pass_at_k(4, 1, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n,k", [(1, 1), (4, 1), (4, 4), (10, 3)])
def test_pass_at_k_edges(n, k):
    assert pass_at_k(n, 0, k) == 0.0  # nothing correct
    assert pass_at_k(n, n, k) == 1.0  # everything correct


def test_pass_at_k_matches_exact_binomials_at_scale():
    for n, c, k in [(1000, 5, 100), (200, 17, 10), (64, 63, 2)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (4, 5, 1), (-1, 0, 1), (4, -1, 1), (4, 1, -1), (4, 1, 0)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    # per problem with n=4, k=2: c=1 -> 0.5, c=0 -> 0, c=4 -> 1 ; mean 0.5
    assert mean_pass_at_k([1, 0, 4], 4, 2) == pytest.approx(0.5, abs=1e-12)
    assert mean_pass_at_k(torch.tensor([1, 0, 4]), 4, 2) == pytest.approx(0.5, abs=1e-12)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 4, 2)


def test_group_stats_hand_batch():
    rewards = torch.tensor([
        [1.0, 1.0, 1.0],  # dead, all correct
        [0.0, 0.0, 0.0],  # dead, all wrong
        [1.0, 0.0, 1.0],  # live
        [0.5, 0.5, 0.5],  # dead but mixed correctness (e.g. partial credit)
        [0.1, 0.0, 0.0],  # all wrong but live (format reward differs)
    ])
    correct = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 0, 1], [1, 0, 1], [0, 0, 0]], dtype=torch.bool)
    s = group_stats(rewards, correct)
    assert s["dead_frac"] == pytest.approx(3 / 5)
    assert s["dead_all_correct_frac"] == pytest.approx(1 / 5)
    assert s["dead_all_wrong_frac"] == pytest.approx(1 / 5)
    assert s["all_correct_frac"] == pytest.approx(1 / 5)
    assert s["all_wrong_frac"] == pytest.approx(2 / 5)
    assert s["solve_rate"] == pytest.approx(7 / 15)
    assert s["reward_mean"] == pytest.approx(6.6 / 15)
    # population stds: [1,0,1] -> sqrt(2)/3, [.1,0,0] -> 0.1*sqrt(2)/3, dead groups 0
    assert s["group_std_mean"] == pytest.approx(1.1 * math.sqrt(2) / 3 / 5)
    mu = 6.6 / 15
    var = sum((x - mu) ** 2 for x in rewards.flatten().tolist()) / 15
    assert s["reward_std"] == pytest.approx(math.sqrt(var))


def test_group_stats_dead_is_exact_on_raw_rewards():
    # a tiny but real difference keeps the group alive
    s = group_stats(torch.tensor([[1.0, 1.0 + 1e-6]]), torch.tensor([[True, True]]))
    assert s["dead_frac"] == 0.0 and s["all_correct_frac"] == 1.0


def test_group_stats_shape_mismatch():
    with pytest.raises(ValueError):
        group_stats(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.bool))


def test_masked_mean_and_std():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 1e30, 1e30]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert_close(masked_mean(x, m), torch.tensor(2.0), atol=1e-6, rtol=0)
    assert_close(masked_mean(x, m, dim=1), torch.tensor([1.5, 3.0]), atol=1e-6, rtol=0)
    assert_close(masked_std(x, m, ddof=0), torch.tensor(math.sqrt(2 / 3)), atol=1e-6, rtol=0)
    assert_close(masked_std(x, m, ddof=1), torch.tensor(1.0), atol=1e-6, rtol=0)
    empty = torch.zeros_like(m)
    assert masked_mean(x, empty).item() == 0.0 and masked_std(x, empty).item() == 0.0


def test_group_stats_g1_dead_is_not_applicable():
    s = group_stats(torch.tensor([[1.0], [0.0]]), torch.tensor([[True], [False]]))
    assert math.isnan(s["dead_frac"]) and math.isnan(s["dead_all_correct_frac"])
    assert math.isnan(s["dead_all_wrong_frac"])
    assert s["all_correct_frac"] == 0.5 and s["solve_rate"] == 0.5


def test_majority_vote_hand_examples():
    from ablate.rl.stats import majority_correct, mean_maj_at_k

    assert majority_correct(["5", "7", "5"], [True, False, True]) is True
    assert majority_correct(["7", "5", "7", "5"], [False, True, False, True]) is False  # tie: first seen
    assert majority_correct([None, None, "5"], [False, False, True]) is True  # no answer never votes
    assert majority_correct([None], [False]) is False
    # two problems, k = 1 and k = 3: problem 0 [5, 7, 7] (5 correct), problem 1 [3, 3, 4] (3 correct)
    answers, ok = [["5", "7", "7"], ["3", "3", "4"]], [[True, False, False], [True, True, False]]
    assert mean_maj_at_k(answers, ok, 1) == 1.0 and mean_maj_at_k(answers, ok, 3) == 0.5
