"""Statistics across seeds (ablate.analysis.stats) on literal matrices with hand-computed answers."""

import numpy as np
import pytest

from ablate.analysis import stats


def test_iqm_of_known_matrices():
    x = np.array([[1, 2], [3, 4], [5, 6], [7, 8]])      # 8 scores: cut 2 each end -> mean(3, 4, 5, 6)
    assert stats.iqm(x) == pytest.approx(4.5)
    assert stats.iqm(np.arange(1, 11)[:, None]) == pytest.approx(5.5)  # cut int(2.5) = 2: mean(3..8)
    assert stats.iqm([[0], [0], [0], [100]]) == pytest.approx(0.0)     # the outlier is trimmed
    batched = np.stack([x, x + 1])                       # leading axes are kept
    assert stats.iqm(batched) == pytest.approx([4.5, 5.5])


def test_iqm_matches_scipy_trim_mean():
    scipy_stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(1).normal(size=(7, 3))
    assert stats.iqm(x) == pytest.approx(scipy_stats.trim_mean(x, 0.25, axis=None))


def test_bootstrap_ci_exact_and_reproducible():
    # mean of a resample of [0, 1] is 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4: the 95% interval is [0, 1]
    iv = stats.bootstrap_ci([0.0, 1.0], "mean", reps=4000, seed=3)
    assert (iv.estimate, iv.lo, iv.hi, iv.n) == (0.5, 0.0, 1.0, 2)
    const = stats.bootstrap_ci([[0.3, 0.3]] * 4, "iqm")
    assert (const.lo, const.hi) == pytest.approx((0.3, 0.3))
    x = np.random.default_rng(0).normal(size=(6, 2))
    a, b = stats.bootstrap_ci(x, "iqm", seed=7), stats.bootstrap_ci(x, "iqm", seed=7)
    assert a == b and a.lo < a.estimate < a.hi
    assert stats.bootstrap_ci(x, "iqm", seed=8) != a
    one = stats.bootstrap_ci([0.4])
    assert one.estimate == 0.4 and np.isnan(one.lo)      # one seed: no interval, never a fake one


def test_stratified_resampling_stays_within_each_task():
    x = np.array([[0, 10], [1, 11], [2, 12]])
    r = stats.stratified_resample(x, reps=500, seed=0)
    assert r.shape == (500, 3, 2)
    assert set(np.unique(r[:, :, 0])) <= {0, 1, 2} and set(np.unique(r[:, :, 1])) <= {10, 11, 12}


def test_probability_of_improvement_hand_computed():
    # pairs (x, y): 1 beats only 0 -> 1; 2 ties both 2s and beats 0 -> 2; 3 beats all -> 3; 6 / 9
    assert stats.probability_of_improvement([1, 2, 3], [2, 2, 0]) == pytest.approx(6 / 9)
    # two tasks: X always wins on the first, always loses on the second -> average 1/2
    assert stats.probability_of_improvement([[1, 0], [2, 0]], [[0, 1], [0, 1]]) == pytest.approx(0.5)
    iv = stats.poi_ci([5, 6, 7], [1, 2, 3])
    assert (iv.estimate, iv.lo, iv.hi) == (1.0, 1.0, 1.0)


def test_paired_difference_removes_shared_seed_noise():
    x, y = [1.0, 2.0, 3.0], [0.0, 1.0, 2.0]               # same seed, same offset: every difference is 1
    for method in stats.METHODS:
        p = stats.paired_difference(x, y, method)
        assert (p.estimate, p.lo, p.hi, p.paired) == (1.0, 1.0, 1.0, True) and p.excludes
        u = stats.unpaired_difference(x, y, method, seed=0)
        assert u.estimate == pytest.approx(1.0) and u.lo < 1.0 < u.hi and not u.paired and not u.excludes
    with pytest.raises(ValueError):
        stats.paired_difference([1, 2], [1, 2, 3])


def test_mean_band_ignores_missing_points():
    y = np.array([[0.0, 1.0, np.nan], [2.0, 3.0, 4.0]])
    m, lo, hi = stats.mean_band(y, reps=200)
    assert m == pytest.approx([1.0, 2.0, 4.0])
    assert lo[0] == pytest.approx(0.0) and hi[0] == pytest.approx(2.0) and lo[2] == hi[2] == 4.0


def test_t_interval_hand_computed():
    # [1, 2, 3]: mean 2, sd 1, se 1/sqrt(3); t_{0.975, 2} = 4.302653 -> half width 2.484138
    iv = stats.mean_ci([1.0, 2.0, 3.0], "t")
    assert (iv.estimate, iv.n) == (2.0, 3)
    assert (iv.lo, iv.hi) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)
    # per-seed differences of a paired comparison are the one sample
    p = stats.paired_difference([1.5, 3.0, 4.5], [0.5, 1.0, 1.5], "t")   # differences 1, 2, 3
    assert (p.lo, p.hi) == pytest.approx((iv.lo, iv.hi)) and p.paired
    assert np.isnan(stats.mean_ci([0.4], "t").lo)        # one seed: no interval


def test_welch_contrast_matches_scipy_ttest():
    scipy_stats = pytest.importorskip("scipy.stats")
    x, y = [1.0, 2.0, 3.0], [0.0, 2.0]
    # by hand: v = 1/3 + 2/2, df = v^2 / ((1/3)^2/2 + 1^2/1) = 1.684211
    u = stats.unpaired_difference(x, y, "t")
    ref = scipy_stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    assert u.estimate == 1.0 and (u.lo, u.hi) == pytest.approx((ref.low, ref.high))
    half = scipy_stats.t.ppf(0.975, 1.684211) * np.sqrt(1 / 3 + 1)
    assert (u.lo, u.hi) == pytest.approx((1 - half, 1 + half), abs=1e-5)
    with pytest.raises(ValueError, match="t, percentile, bca"):
        stats.mean_ci(x, "wald")


def test_t_interval_covers_at_five_seeds_where_the_percentile_bootstrap_does_not():
    """Why t is the default: 1,000 simulated 5-seed studies of a normal score with known mean."""
    rng = np.random.default_rng(0)
    studies = rng.normal(0.5, 0.05, size=(1000, 5))
    cover = {m: np.mean([(lambda iv: iv.lo <= 0.5 <= iv.hi)(stats.mean_ci(s, m, reps=1000, seed=i))
                         for i, s in enumerate(studies)]) for m in ("t", "percentile")}
    assert 0.93 <= cover["t"] <= 0.97, cover
    assert cover["percentile"] < 0.90, cover             # ~0.85: resamples the 5 seeds as if they were all


def test_optimality_gap_and_performance_profile_hand_computed():
    x = np.array([[0.2, 1.0], [0.6, 1.2], [0.4, 0.8]])      # 3 runs x 2 tasks
    # min(x, 1) = [[.2, 1], [.6, 1], [.4, .8]]: mean 4/6 -> gap 1/3
    assert stats.optimality_gap(x) == pytest.approx(1 / 3)
    assert stats.optimality_gap(x, gamma=0.5) == pytest.approx(0.5 - (0.2 + 0.5 + 0.5 + 0.5 + 0.4 + 0.5) / 6)
    assert stats.bootstrap_ci(x, "optimality_gap", reps=200).estimate == pytest.approx(1 / 3)
    # tau 0.5: task 1 runs above: 1 of 3, task 2: 3 of 3 -> (1/3 + 1) / 2; tau 0.9: 0/3 and 2/3 -> 1/3
    prof, lo, hi = stats.performance_profile(x, [0.5, 0.9, 2.0], reps=500)
    assert prof == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert (lo <= prof + 1e-12).all() and (hi >= prof - 1e-12).all() and hi[2] == 0
