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
    p = stats.paired_difference(x, y)
    assert (p.estimate, p.lo, p.hi, p.paired) == (1.0, 1.0, 1.0, True) and p.excludes
    u = stats.unpaired_difference(x, y, seed=0)
    assert u.estimate == pytest.approx(1.0) and u.lo < 1.0 < u.hi and not u.paired
    with pytest.raises(ValueError):
        stats.paired_difference([1, 2], [1, 2, 3])


def test_mean_band_ignores_missing_points():
    y = np.array([[0.0, 1.0, np.nan], [2.0, 3.0, 4.0]])
    m, lo, hi = stats.mean_band(y, reps=200)
    assert m == pytest.approx([1.0, 2.0, 4.0])
    assert lo[0] == pytest.approx(0.0) and hi[0] == pytest.approx(2.0) and lo[2] == hi[2] == 4.0
