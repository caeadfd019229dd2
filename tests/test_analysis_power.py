"""Multiplicity adjustment and power of the t tests behind contrasts: the worked examples computed by
hand (Holm 1979, Benjamini & Hochberg 1995; noncentral t power), and statsmodels as the reference."""

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestIndPower, TTestPower

from ablate.analysis import multiplicity as M
from ablate.analysis.power import TDesign

P = np.array([0.001, 0.012, 0.021, 0.038, 0.300])


def test_holm_and_bh_worked_example():
    assert M.holm(P) == pytest.approx([0.0050, 0.0480, 0.0630, 0.0760, 0.3000], abs=1e-4)
    assert M.bh(P) == pytest.approx([0.0050, 0.0300, 0.0350, 0.0475, 0.3000], abs=1e-4)
    assert (M.holm(P) <= 0.05).tolist() == [1, 1, 0, 0, 0] and (M.bh(P) <= 0.05).tolist() == [1, 1, 1, 1, 0]
    assert M.holm([0.04, 0.045]) == pytest.approx([0.08, 0.08])        # monotonised
    assert M.bh([0.01, 0.011]) == pytest.approx([0.011, 0.011])
    shuffled = P[[3, 0, 4, 2, 1]]                                      # results in the input order
    assert M.holm(shuffled) == pytest.approx(M.holm(P)[[3, 0, 4, 2, 1]])
    assert M.none(P) == pytest.approx(P)


@pytest.mark.parametrize("method,ref", [("holm", "holm"), ("bh", "fdr_bh")])
def test_adjustments_match_statsmodels(method, ref):
    rng = np.random.default_rng(0)
    for m in (1, 2, 7, 30):
        p = rng.uniform(0, 0.2, m) ** 2
        assert M.adjust(p, method) == pytest.approx(multipletests(p, method=ref)[1], abs=1e-12)


def test_nan_p_values_stay_out_of_the_family():
    out = M.holm([0.01, np.nan, 0.02])
    assert np.isnan(out[1]) and out[[0, 2]] == pytest.approx([0.02, 0.02])
    with pytest.raises(ValueError, match="none, holm, bh"):
        M.adjust(P, "bonferroni")


def test_adjusted_levels():
    assert M.adjusted_level(P, "none") == pytest.approx(0.95)
    assert M.adjusted_level(P, "holm") == pytest.approx(1 - 0.05 / 5)
    assert M.adjusted_level(P, "bh") == pytest.approx(1 - 4 * 0.05 / 5)   # BH rejects 4 of 5
    assert M.adjusted_level([0.5, np.nan], "holm") == pytest.approx(0.95)  # a family of one


def test_paired_power_worked_example():
    d = TDesign((1.0,), (1.5,), (5,))
    assert d.se() == pytest.approx(1.5 / np.sqrt(5)) and d.df() == 4
    assert d.mde() == pytest.approx(2.5230, abs=1e-4)
    for n, want in [(3, 3.2640), (5, 1.6820), (10, 0.9960), (20, 0.6604)]:
        assert TDesign((1.0,), (1.0,), (n,)).mde() == pytest.approx(want, abs=1e-4)
        assert TDesign((1.0,), (1.0,), (n,)).mde() == pytest.approx(TTestPower().solve_power(nobs=n, alpha=0.05,
                                                                                               power=0.8), abs=1e-4)
    assert d.seeds_for(1.0) == (20, pytest.approx(19.6670, abs=1e-4))
    assert TDesign((1.0,), (1.5,), (19,)).power(1.0) == pytest.approx(0.7847, abs=1e-4)
    assert TDesign((1.0,), (1.5,), (20,)).power(1.0) == pytest.approx(0.8073, abs=1e-4)


def test_welch_power_worked_example():
    eq = TDesign((1.0, -1.0), (2.0, 2.0), (5, 5))
    assert (eq.se(), eq.df(), eq.mde()) == pytest.approx((1.2649, 8.0, 4.0489), abs=1e-4)
    assert eq.mde() / 2 == pytest.approx(TTestIndPower().solve_power(nobs1=5, alpha=0.05, power=0.8), abs=1e-4)
    un = TDesign((1.0, -1.0), (1.5, 2.5), (5, 5))
    assert (un.se(), un.df(), un.mde()) == pytest.approx((1.3038, 6.5496, 4.3145), abs=1e-4)
    assert un.seeds_for(2.0)[0] == 18
    for n in (3, 8):
        assert TDesign((1.0, -1.0), (1.0, 1.0), (n, n)).seeds_for(1.5)[0] == int(np.ceil(
            TTestIndPower().solve_power(effect_size=1.5, alpha=0.05, power=0.8)))


def test_p_value_is_the_t_test():
    import scipy.stats

    x = np.array([0.3, 0.5, 0.2, 0.6])
    d = TDesign((1.0,), (x.std(ddof=1),), (4,))
    assert d.p_value(x.mean()) == pytest.approx(scipy.stats.ttest_1samp(x, 0).pvalue)
    a, b = np.array([1.0, 2.0, 3.0]), np.array([0.0, 2.0])
    w = TDesign((1.0, -1.0), (a.std(ddof=1), b.std(ddof=1)), (3, 2))
    assert w.p_value(a.mean() - b.mean()) == pytest.approx(scipy.stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert np.isnan(TDesign((1.0,), (0.1,), (1,)).mde())               # one seed: nothing to say
