"""The ScaleRL compute-performance sigmoid (ablate.analysis.scaling): the worked example (64 points,
scipy curve_fit with R0 fixed), derived compute, extrapolation, and recovery of planted A, B, C_mid
within their bootstrap-over-seeds CIs in simulated 5-seed studies."""

import numpy as np
import pytest

from ablate.analysis import scaling as S

A, B, CM, R0 = 0.62, 1.4, 3000.0, 0.25
C = np.arange(250, 16001, 250.0)
Y = S.sigmoid(C, A, B, CM, R0) + np.random.default_rng(0).normal(0, 0.01, 64)


def test_worked_example():
    assert Y[:5] == pytest.approx([0.2623, 0.2765, 0.3029, 0.3165, 0.3286], abs=1e-4)
    m = C >= 1500
    f = S.fit(C[m], Y[m], R0)
    assert abs(f.A - A) < 0.03 and abs(f.B - B) < 0.2 and abs(f.c_mid - CM) / CM < 0.1
    assert (f.A, f.B, f.c_mid) == pytest.approx((0.6274, 1.3756, 3143.0), rel=1e-3)
    assert f.se == pytest.approx((0.0085, 0.0816, 119.3), rel=0.02)
    assert f(16000) == pytest.approx(0.5911, abs=1e-3)
    short = (C >= 1500) & (C <= 8000)
    g = S.fit(C[short], Y[short], R0)
    assert (g.A, g.B, g.c_mid, g(16000)) == pytest.approx((0.6479, 1.2561, 3435.7, 0.5976), rel=1e-3)
    assert S.compute_for(0.9, B, CM) == pytest.approx(14412.0, abs=0.1)
    assert S.sigmoid(CM, A, B, CM, R0) == pytest.approx((A + R0) / 2)        # half the gain at C_mid


def test_extrapolation_fits_the_early_part_only():
    curves = [(C, Y)]
    ex = S.extrapolation(curves, R0, frac=0.5)
    early = S.fit(C[C <= 8000], Y[C <= 8000], R0)
    late = C > 8000
    assert ex["cut"] == 8000 and ex["fit"] == early
    assert ex["rmse"] == pytest.approx(np.sqrt(np.mean((early(C[late]) - Y[late]) ** 2)))
    # measured: mean over the points within 2% of the largest compute (15750 and 16000)
    assert (ex["predicted"], ex["measured"]) == pytest.approx((early(16000), Y[-2:].mean()))
    assert ex["rmse"] < 0.02


def test_degenerate_inputs_give_no_fit():
    assert not S.fit([1.0, 2.0], [0.3, 0.4], R0).ok                          # too few points
    r = S.bootstrap_fit([(C, Y)], R0, reps=5)
    assert r.fit.ok and np.isnan(r.lo["A"])                                  # one seed: no interval
    with pytest.raises(ValueError, match="t or percentile"):
        S.bootstrap_fit([(C, Y), (C, Y)], R0, method="bca")


def simulated_study(rng, seeds=5, points=12):
    """Each seed: its own ceiling (sd 0.01) and midpoint (log-sd 0.05), evaluation noise sd 0.01."""
    c = np.linspace(500, 16000, points)
    return [(c, S.sigmoid(c, A + rng.normal(0, 0.01), B, CM * np.exp(rng.normal(0, 0.05)), R0)
             + rng.normal(0, 0.01, points)) for _ in range(seeds)]


def test_planted_parameters_within_their_cis_in_90_percent_of_100_studies():
    rng = np.random.default_rng(1)
    hits = []
    for i in range(100):
        r = S.bootstrap_fit(simulated_study(rng), R0, reps=25, seed=i)
        hits.append([r.lo[k] <= v <= r.hi[k] for k, v in (("A", A), ("B", B), ("c_mid", CM))])
    rate = np.mean(hits, axis=0)
    assert (rate >= 0.9).all(), rate


def test_report_fits_planted_ceilings(tmp_path):
    """A synthetic sweep whose held-out curves are planted sigmoids in generated tokens (B 1.5, C_mid
    1e5 tokens; ceilings 0.5 and 0.55): `--fit tokens` recovers them, with a table and a figure."""
    from ablate.analysis import build_report
    from ablate.analysis.synthetic import write_sweep

    write_sweep(tmp_path, {"recipe.eps_high": [0.2, 0.28]}, seeds=range(5), effects={"recipe.eps_high": 0.05},
                seed_sd=0.005, scaling=(1.5, 1e5), eval_noise=0.005, eval_every=5, samples=False)
    out = tmp_path / "r.html"
    rep = build_report([tmp_path], out, fit="tokens", reps=100)
    t = rep.scaling.set_index("arm")
    assert t["r0"].tolist() == pytest.approx([0.1, 0.1]) and t["n"].tolist() == [5, 5]
    for arm, a in (("eps_high=0.2", 0.5), ("eps_high=0.28", 0.55)):
        r = t.loc[arm]
        assert r.A_lo <= a <= r.A_hi and r.B_lo <= 1.5 <= r.B_hi and r.c_mid_lo <= 1e5 <= r.c_mid_hi, r
        assert abs(r.extrap_predicted - r.extrap_measured) < 0.02
    assert "scaling" in rep.figures and out.read_text().count("data:image/png;base64,") == 4
    assert "## Compute scaling" in out.with_suffix(".md").read_text()
    with pytest.raises(ValueError, match="fit must be one of"):
        build_report([tmp_path], None, fit="flops", figures=False)
