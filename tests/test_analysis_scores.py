"""Per-run scores that are not selection-biased (final, last-K mean, area under the curve; max only
with a warning) and what the quickstart report used to get wrong: pseudo-replicated step-0
evaluations, mixed interval methods, fractions next to points, KL shown for runs without a reference
model, no change from the base model, no samples in the Markdown, counts printed as floats."""

import inspect
import json

import numpy as np
import pytest
import scipy.stats

from ablate.analysis import build_report, effects, stats
from ablate.analysis.synthetic import write_sweep

STEPS = np.array([0.0, 25, 50, 75, 100])
VALUES = np.array([0.1, 0.3, 0.2, 0.5, 0.4])


def test_scores_hand_computed():
    assert effects.final(STEPS, VALUES, 3) == pytest.approx(0.4)
    assert effects.last_k(STEPS, VALUES, 3) == pytest.approx((0.2 + 0.5 + 0.4) / 3)
    # trapezoid: 25 * (0.2 + 0.25 + 0.35 + 0.45) / 100
    assert effects.auc(STEPS, VALUES, 3) == pytest.approx(0.3125)
    assert effects.best(STEPS, VALUES, 3) == pytest.approx(0.5)
    assert effects.auc(STEPS[:1], VALUES[:1], 3) == pytest.approx(0.1)       # one evaluation: its value


def test_every_score_has_one_signature_and_keeps_a_constant():
    for name, f in effects.SCORES.items():
        assert list(inspect.signature(f).parameters) == ["steps", "values", "k"], name
        assert f(STEPS, np.full(5, 0.3), 2) == pytest.approx(0.3), name
        assert f(STEPS, VALUES, 2) <= effects.best(STEPS, VALUES, 2) + 1e-12, name   # max is the upper bound


def _seeded_base(root, base_by_seed):
    """Rewrite each run's step-0 evaluation to a per-seed value (the same in every arm)."""
    for d in root.glob("c*"):
        seed = int(d.name.split("d")[-1])               # synthetic.run_name: c<combo>d<seed>
        rows = [json.loads(x) for x in (d / "evals.jsonl").read_text().splitlines()]
        rows[0]["eval/pass@1"] = base_by_seed[seed]
        (d / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    root = tmp_path_factory.mktemp("quick") / "sweep"
    write_sweep(root, {"recipe.kl_coef": [0.04, 0.0], "recipe.scale": ["group", "none"]}, seeds=range(2),
                noise=0.01, effects={"recipe.scale": 0.02})
    _seeded_base(root, {0: 0.40, 1: 0.60})
    out = root.parent / "report.html"
    return build_report([root], out, reps=200), out


def test_step0_evaluations_are_one_observation_per_seed(quick):
    rep, _ = quick
    base = rep.passk[(rep.passk.arm == "base (step 0)") & (rep.passk.k == 1)].iloc[0]
    assert base["n"] == 2                                  # 4 arms x 2 seeds, but only 2 distinct evaluations
    half = scipy.stats.t.ppf(0.975, 1) * np.std([0.4, 0.6], ddof=1) / np.sqrt(2)
    assert (base["mean"], base["lo"], base["hi"]) == pytest.approx((0.5, 0.5 - half, 0.5 + half))


def test_headline_leads_with_change_from_the_base_model(quick):
    rep, out = quick
    g = rep.gain.set_index("arm")
    sc = rep.scores.set_index("run_id")
    arm = rep.arms.arm.iloc[0]
    runs = sc[sc.arm == arm]
    per_run = runs["value"].to_numpy() - np.array([{0: 0.4, 1: 0.6}[s] for s in runs["seed"]])
    assert g.loc[arm, "change"] == pytest.approx(per_run.mean()) and g.loc[arm, "n"] == 2
    assert (g.loc[arm, "lo"], g.loc[arm, "hi"]) == pytest.approx(
        (stats.mean_ci(per_run).lo, stats.mean_ci(per_run).hi))
    assert len(rep.base_lines) == 4 and "over the base model (50.0 ->" in rep.base_lines[0]
    md = out.with_suffix(".md").read_text()
    head = md.split("## Headline")[1].split("## Setup")[0]
    assert head.index("over the base model") < head.index("kl_coef 0.04 -> 0.0")


def test_one_unit_and_one_interval_method(quick):
    rep, out = quick
    md = out.with_suffix(".md").read_text()
    assert "| base (step 0) | 1 | 50.0 [" in md                          # pass@k in points
    assert "IQM [95% bootstrap CI]" in md and "[n/a: < 5 seeds]" in md   # bootstrap marked, hidden at 2 seeds
    assert "1.00 [1.00, 1.00]" not in md
    spread = next(w for w in rep.warnings if "seed-to-seed spread" in w)
    assert "points" in spread
    boot = build_report([rep.study.runs.run_dir.iloc[0].rsplit("/", 1)[0]], None, figures=False, reps=100,
                        ci_method="percentile")
    assert any("--ci percentile is a bootstrap" in w for w in boot.warnings)


def test_kl_not_measured_without_a_reference(quick):
    rep, out = quick
    d = rep.diagnostics.set_index("arm")
    off = [a for a in d.index if "kl_coef=0.0," in a]
    assert off and not d.loc[off, "kl_on"].any() and d.loc[off, "kl_max"].isna().all()
    assert d.loc[[a for a in d.index if a not in off], "kl_on"].all()
    diag = out.with_suffix(".md").read_text().split("## Diagnostics")[1]
    assert diag.count("not measured") == 2 * len(off)                  # KL max and KL end


def test_markdown_has_samples_and_integer_counts(quick):
    _, out = quick
    md = out.with_suffix(".md").read_text()
    assert "## Samples" in md and "`\\boxed{2}`" in md
    assert "| samples per run (median) | 12,800 |" in md


def test_scores_side_by_side_and_max_is_warned(quick):
    rep, out = quick
    t = rep.score_table
    assert set(t.score) == set(effects.SCORES) and len(t) == 4 * len(effects.SCORES)
    fin, mx = t[t.score == "final"].set_index("arm"), t[t.score == "max"].set_index("arm")
    assert (mx["mean"] >= fin["mean"] - 1e-12).all()
    assert "max over training (biased upward)" in out.with_suffix(".md").read_text()
    root = rep.study.runs.run_dir.iloc[0].rsplit("/", 1)[0]
    biased = build_report([root], None, figures=False, reps=100, score="max")
    assert any("biased upward" in w for w in biased.warnings)
    lk = build_report([root], None, figures=False, reps=100, score="last_k", last_k=2)
    assert lk.scores.value.to_numpy() == pytest.approx(
        effects.final_scores(rep.study, "eval/pass@1", score="last_k", k=2).value.to_numpy())
    with pytest.raises(ValueError, match="final, last_k, auc, max"):
        build_report([root], None, figures=False, score="best")


def test_t_band_hand_computed():
    m, lo, hi = stats.t_band(np.array([[0.0, 1.0, np.nan], [2.0, 3.0, 4.0]]))
    half = scipy.stats.t.ppf(0.975, 1) * 1.0                # sd sqrt(2), se 1
    assert m == pytest.approx([1, 2, 4]) and lo[:2] == pytest.approx([1 - half, 2 - half])
    assert hi[:2] == pytest.approx([1 + half, 2 + half]) and np.isnan(lo[2])
