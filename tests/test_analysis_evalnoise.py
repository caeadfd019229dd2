"""Eval noise (ablate.analysis.evalnoise) on the worked example S = 3 seeds x M = 5 problems x n = 4
samples: ANOVA variance components, the closed-form and Monte-Carlo two-way bootstrap, paired arms."""

import numpy as np
import pytest

from ablate.analysis import evalnoise as E

C = np.array([[4, 2, 0, 3, 1], [3, 2, 1, 4, 0], [4, 4, 2, 4, 3]])
P = C / 4


def test_variance_components_worked_example():
    v = E.variance_components(C, 4)
    want = {"MS_S": 0.2042, "MS_M": 0.2979, "MS_E": 0.0323, "v": 0.0375, "sigma2_a": 0.0344, "sigma2_b": 0.0885,
            "sigma2_ab": 0.0, "var_seed_score": 0.0419, "var_mean": 0.0317}
    for k, x in want.items():
        assert v[k] == pytest.approx(x, abs=1e-4), k
    assert v["MS_S"] / 5 == pytest.approx(0.0408, abs=1e-4)              # Var(seed score) without truncation
    assert (v["between_seed_share"], v["sampling_share"]) == pytest.approx((0.82, 0.18), abs=0.005)


def test_bootstrap_variance_closed_form_and_monte_carlo():
    b = E.bootstrap_variance(P)
    assert (b["seeds"], b["problems"], b["two_way"], b["residual"]) == pytest.approx(
        (0.009074, 0.015889, 0.026111, 0.001148), abs=1e-6)
    iv, boot = E.two_way_bootstrap(P, reps=20_000, seed=0)
    assert iv.estimate == pytest.approx(0.6167, abs=1e-4)
    assert boot.var() == pytest.approx(b["two_way"], rel=0.02)
    assert (iv.lo, iv.hi) == pytest.approx((0.2833, 0.9000), abs=1e-4)
    si, pj = E.two_way_draws(3, 5, reps=3, seed=1)                       # the vectorised means are p[si][:, pj]
    assert E._boot_means(P, si, pj) == pytest.approx([P[i][:, j].mean() for i, j in zip(si, pj)])


def test_paired_arms_share_seed_and_problem_noise():
    other = np.clip(P - 0.1, 0, 1)
    other[P < 0.1] = P[P < 0.1] - 0.1                                   # exactly 0.1 lower everywhere
    d = E.paired_problem_difference(P, other, reps=2000)
    assert (d.estimate, d.lo, d.hi, d.paired) == pytest.approx((0.1, 0.1, 0.1, True))
    with pytest.raises(ValueError):
        E.paired_problem_difference(P, P[:, :4])


def test_within_eval_noise():
    v = E.variance_components(C, 4)                  # sampling sd of a seed-score difference: sqrt(2 v / M)
    limit = 1.96 * np.sqrt(2 * 0.0375 / 5)           # 0.2400
    assert E.within_eval_noise(limit - 1e-3, v) and not E.within_eval_noise(limit + 1e-3, v)
