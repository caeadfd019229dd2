"""Eval noise (ablate.analysis.evalnoise) on the worked example S = 3 seeds x M = 5 problems x n = 4
samples: ANOVA variance components, the closed-form and Monte-Carlo two-way bootstrap, paired arms."""

import json

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


# --- wired to run folders and the report ----------------------------------------------------------------

def two_arm_sweep(root, counts_ref, counts_b, n=4):
    """Two arms (recipe.scale group = reference, none) x 3 seeds with the given final per-problem counts."""
    from ablate.analysis.synthetic import write_eval_problems, write_sweep

    dirs = write_sweep(root, {"recipe.scale": ["group", "none"]}, seeds=range(3), steps=20, eval_every=10,
                       samples=False)
    for d, c in zip(dirs, [*counts_ref, *counts_b]):
        write_eval_problems(d, 10, [0] * len(c), n)          # an earlier evaluation: only the last one counts
        write_eval_problems(d, 20, c, n)
    return dirs


CB = np.array([[4, 3, 1, 3, 1], [3, 2, 1, 4, 1], [4, 4, 2, 4, 3]])   # C plus one correct sample in 3 cells


def test_report_eval_noise_matches_the_hand_computation(tmp_path):
    from ablate.analysis import build_report
    from ablate.analysis.render import markdown

    two_arm_sweep(tmp_path, C, CB)
    rep = build_report([tmp_path], None, figures=False, reps=500)
    ref, b = (rep.noise.set_index("arm").loc[a] for a in ("scale=group", "scale=none"))
    assert (ref.S, ref.M, ref.n) == (3, 5, 4)
    assert ref["mean"] == pytest.approx(0.6167, abs=1e-4)
    assert ref.sd_seed ** 2 == pytest.approx(0.0344, abs=1e-4)                # sigma2_a of the worked example
    assert ref.v == pytest.approx(0.0375, abs=1e-6) and ref.sd_sampling == pytest.approx(np.sqrt(0.0375 / 5))
    assert (ref.share_seed, ref.share_sampling) == pytest.approx((0.82, 0.18), abs=0.005)
    iv, _ = E.two_way_bootstrap(P, reps=500, seed=0)
    assert (ref.lo, ref.hi) == (iv.lo, iv.hi)
    # v of arm b by hand: sum c (4 - c) = 12 + 13 + 7 = 32 over 15 cells, / (16 x 3)
    assert b.v == pytest.approx(32 / 15 / 48, abs=1e-6)
    d = rep.noise_contrasts.iloc[0]
    assert (d.arm, d.reference, d.S, d.M, bool(d.paired)) == ("scale=none", "scale=group", 3, 5, True)
    assert d["diff"] == pytest.approx(3 / 60)                                 # 3 extra correct of 60 samples
    assert (d.better, d.worse, d.tied) == (3, 0, 2)                           # problems 1, 2, 4 improved
    assert d.noise_sd == pytest.approx(np.sqrt(0.0375 / 15 + 32 / 15 / 48 / 15), abs=1e-6)   # 0.0739
    assert d.verdict == "within eval noise (completion sampling)"             # 0.050 < 1.96 x 0.0739
    assert any(w.startswith("scale=none vs scale=group: +5.0 points") and "within eval noise" in w for w in rep.warnings)
    from ablate.analysis.report import report_json

    got = json.loads(report_json(rep))["eval_noise_contrasts"][0]
    assert got["verdict"] == d.verdict and got["better"] == 3
    md = markdown(rep, "t", {"paths": [str(tmp_path)], "generated": "now"})
    assert "## Eval noise" in md and "n/a: < 5 seeds" in md                   # 3 seeds: no two-way CI shown


def test_planted_eval_noise_is_recovered(tmp_path):
    from ablate.analysis import build_report
    from ablate.analysis.synthetic import write_sweep

    # 6 seeds, 400 problems, 8 samples x 2 repeats: sampling variance p(1 - p) / 16 per cell, planted
    write_sweep(tmp_path, {"recipe.scale": ["group", "none", "batch"]}, seeds=range(6), seed_sd=0.03,
                effects={"recipe.scale": 0.0}, problems=400, problem_n=8, repeats=2, problem_sd=0.15, samples=False)
    for d in tmp_path.glob("c00002*"):                                          # a third arm 10 points better
        rows = [json.loads(x) for x in (d / "eval_problems.jsonl").read_text().splitlines()]
        for r in rows:
            r["correct"] = [min(8, c + int(i % 10 < 8)) for i, c in enumerate(r["correct"])]
        (d / "eval_problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = build_report([tmp_path], None, figures=False, reps=500)
    ref = rep.noise.set_index("arm").loc["scale=group"]
    assert (ref.S, ref.M, ref.n) == (6, 400, 16)
    p = np.clip(0.5 + np.random.default_rng(0).normal(0, 0.15, 400), 0, 1)    # not the same draws: the scale
    assert ref.v == pytest.approx(float((p * (1 - p)).mean()) / 16, rel=0.15)
    assert np.isfinite(ref.lo) and ref.lo < ref["mean"] < ref.hi              # 6 seeds: two-way CI shown
    v = rep.noise_contrasts.set_index("arm")
    assert v.loc["scale=none", "verdict"].startswith("within eval noise")          # no planted difference
    assert v.loc["scale=batch", "verdict"] == "beyond eval noise" and v.loc["scale=batch", "better"] > 300


def test_eval_problems_loader_pools_repeats_at_the_last_evaluation(tmp_path):
    from ablate.analysis.load import eval_problems, load_study
    from ablate.analysis.synthetic import write_eval_problems, write_run

    d = tmp_path / "run"
    write_run(d, {"run_id": "x", "seed": 0, "steps": 10}, final=0.5, steps=10, rng=np.random.default_rng(0),
              eval_every=5)
    write_eval_problems(d, 5, [[1, 2]], 4, ["a", "b"])
    write_eval_problems(d, 10, [[1, 2], [3, 0]], 4, ["a", "b"])
    got = eval_problems(load_study(tmp_path))
    assert got[["step", "problem", "n", "correct"]].values.tolist() == [[10, "a", 8, 4], [10, "b", 8, 2]]
