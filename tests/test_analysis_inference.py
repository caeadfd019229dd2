"""The report's inference columns end to end on synthetic sweeps with planted effects: t-test
p-values, Holm / BH adjusted p-values and intervals, MDE and seeds needed."""

import numpy as np
import pytest
import scipy.stats
from statsmodels.stats.multitest import multipletests
from typer.testing import CliRunner

from ablate.analysis import build_report
from ablate.analysis.power import TDesign
from ablate.analysis.synthetic import write_sweep

GRID = {"recipe.eps_high": [0.2, 0.28], "recipe.scale": ["group", "none"]}


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    root = tmp_path_factory.mktemp("inference") / "sweep"
    write_sweep(root, GRID, seeds=range(6), noise=0.01, rng_seed=4, samples=False,
                effects={"recipe.eps_high": 0.03, "recipe.scale": 0.0})
    return root


def test_effects_p_values_adjustment_and_mde(noisy):
    rep = build_report([noisy], None, figures=False, reps=200, adjust="holm", mde=0.01)
    e = rep.effects.set_index("term")
    scores = rep.scores[rep.scores.included].pivot(index="seed", columns="arm", values="value")
    hi, lo = scores.filter(like="eps_high=0.28").mean(axis=1), scores.filter(like="eps_high=0.2,").mean(axis=1)
    per_seed = (hi - lo).to_numpy()                                    # the main effect, seed by seed
    assert e.loc["eps_high=0.28", "p"] == pytest.approx(scipy.stats.ttest_1samp(per_seed, 0).pvalue)
    assert e.loc["eps_high=0.28", "mde"] == pytest.approx(TDesign((1.0,), (per_seed.std(ddof=1),), (6,)).mde())
    assert e["p_adj"].to_numpy() == pytest.approx(multipletests(e["p"].to_numpy(), method="holm")[1])
    assert e["adj_level"].to_numpy() == pytest.approx([1 - 0.05 / 3] * 3)
    assert ((e["adj_lo"] <= e["lo"]) & (e["adj_hi"] >= e["hi"])).all()          # adjusted intervals are wider
    assert e.loc["eps_high=0.28", "adj_significant"] and not e.loc["scale=none", "adj_significant"]
    assert (e["seeds_needed"] >= 2).all()
    bh = build_report([noisy], None, figures=False, reps=200, adjust="bh").effects
    assert bh["p_adj"].to_numpy() == pytest.approx(multipletests(bh["p"].to_numpy(), method="fdr_bh")[1])
    none = build_report([noisy], None, figures=False, reps=200, adjust="none").effects
    assert none["p_adj"].to_numpy() == pytest.approx(none["p"].to_numpy())
    assert none[["lo", "hi"]].to_numpy() == pytest.approx(none[["adj_lo", "adj_hi"]].to_numpy())


def test_arm_differences_are_one_family(noisy):
    rep = build_report([noisy], None, figures=False, reps=200, adjust="holm")
    a = rep.arms[~rep.arms.reference]
    assert a["p_adj"].to_numpy() == pytest.approx(multipletests(a["p"].to_numpy(), method="holm")[1])
    assert np.isnan(rep.arms[rep.arms.reference]["p"]).all()


def test_cli_adjust_and_mde(noisy, tmp_path):
    from ablate.cli.report import report_app

    out = tmp_path / "r.html"
    res = CliRunner().invoke(report_app, [str(noisy), "-o", str(out), "--adjust", "bh", "--mde", "0.02",
                                          "--reps", "100"])
    assert res.exit_code == 0, res.output
    md = out.with_suffix(".md").read_text()
    assert "p Benjamini-Hochberg" in md and "seeds per arm for 2" in md and "MDE (pass@1 points)" in md
    for bad in (["--adjust", "sidak"], ["--mde", "-1"]):
        res = CliRunner().invoke(report_app, [str(noisy), "-o", str(out), *bad])
        assert res.exit_code == 2 and "error" in res.output
