"""The statistics on real toy-testbed runs (configs/toy.yaml, seconds each): an A/A comparison is not
reported as different, and a known effect (a reward offset hurts plain REINFORCE) is found with the
right sign. Runs are written by ablate.train.trainer.train straight into folders: no manifest, so the arms
are inferred from the config keys that differ."""

import pytest

from ablate.analysis import build_report, load_study
from ablate.analysis import effects as E
from ablate.config import load
from ablate.train.trainer import train

REINFORCE = ["recipe.baseline=none", "recipe.scale=none", "steps=60", "eval.every=20"]
METRIC = "eval/pass@1_exact"


AA_BLOCKS = 6          # disjoint A/A comparisons of 5 vs 5 seeds


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    """plain / offset: REINFORCE without and with the reward offset, seeds 0-4 (the known effect).
    aa_paired: plain's config plus a no-op toggle (how many samples are logged), the same seeds 0-4.
    aa/A, aa/B: the plain config and the no-op toggle on disjoint seeds, in blocks of ten: block j gives
    A seeds 100+10j..104+10j and B seeds 105+10j..109+10j (fixed before any run was looked at)."""
    root = tmp_path_factory.mktemp("toy_ablation")
    noop = ["eval.num_samples_logged=2"]
    groups = {"plain": ([], range(5)), "offset": (["task.reward_offset=true"], range(5)),
              "aa_paired": (noop, range(5)),
              "aa/A": ([], [100 + 10 * j + i for j in range(AA_BLOCKS) for i in range(5)]),
              "aa/B": (noop, [105 + 10 * j + i for j in range(AA_BLOCKS) for i in range(5)])}
    for name, (extra, seeds) in groups.items():
        for s in seeds:
            cfg = load("configs/toy.yaml", REINFORCE + extra + [f"seed={s}"])
            assert train(cfg, str(root / name / f"seed{s}"), progress=False) == "completed"
    return root


def effect(study, factor, scores=None):
    scores = E.final_scores(study, METRIC) if scores is None else scores
    eff = E.factorial_effects(scores, study.factors, reps=2000, seed=0).set_index("factor")
    return eff.loc[factor], scores


def test_known_effect_reward_offset_hurts_reinforce(toy_runs):
    study = load_study(toy_runs / "plain", toy_runs / "offset")
    assert [(f.name, f.levels) for f in study.factors] == [("reward_offset", ["False", "True"])]
    e, _ = effect(study, "reward_offset")
    assert e["paired"] and e["n"] == 5                    # same seeds in both arms: paired by seed
    assert e["hi"] < 0 and e["estimate"] < -0.05, e       # the offset lowers held-out pass@1, CI excludes 0


def test_paired_aa_is_exactly_zero(toy_runs):
    """Same seeds, a toggle that changes nothing: every per-seed score is equal, so the paired difference
    is 0 with a zero-width CI. This is what makes the unpaired A/A below an A/A: only seeds differ."""
    study = load_study(toy_runs / "plain", toy_runs / "aa_paired")
    e, scores = effect(study, "num_samples_logged")
    by_arm = scores.pivot(index="seed", columns="arm", values="value")
    assert by_arm.shape == (5, 2) and (by_arm.iloc[:, 0] == by_arm.iloc[:, 1]).all()
    assert e["paired"] and (e["estimate"], e["lo"], e["hi"]) == (0.0, 0.0, 0.0) and not e["significant"]


def test_unpaired_aa_false_positive_rate(toy_runs):
    """Identical configs on disjoint seeds, AA_BLOCKS independent 5-vs-5 comparisons. A calibrated 95%
    interval flags each one with probability 0.05 (one in 20 A/A comparisons *should* exclude 0), so
    at most 2 of 6 may: P(3 or more | 0.05) = 0.2%. The percentile bootstrap (coverage ~0.84 at 5
    seeds, benchmarks/ci_coverage.py) would flag ~1 in 6."""
    study = load_study(toy_runs / "aa")
    assert [f.name for f in study.factors] == ["num_samples_logged"]
    all_scores = E.final_scores(study, METRIC)
    flagged, rows = 0, []
    for j in range(AA_BLOCKS):
        block = all_scores[all_scores["seed"].between(100 + 10 * j, 109 + 10 * j)]
        e, _ = effect(study, "num_samples_logged", block)
        assert not e["paired"] and e["n"] == 5            # disjoint seeds: unpaired (Welch t)
        flagged += bool(e["significant"])
        rows.append((round(e["estimate"], 4), round(e["lo"], 4), round(e["hi"], 4)))
    assert flagged <= 2, rows
    arms = E.compare_arms(all_scores, reps=2000)           # and all 30 vs 30: P(improvement) near 1/2
    poi = arms[~arms.reference].iloc[0]
    assert poi.poi_lo <= 0.5 <= poi.poi_hi and arms.n.tolist() == [30, 30]


def test_report_from_toy_runs(toy_runs, tmp_path):
    out = tmp_path / "toy.html"
    rep = build_report([toy_runs / "plain", toy_runs / "offset", toy_runs / "aa_paired"], out, metric=METRIC, reps=300)
    assert out.exists() and out.with_suffix(".md").exists()
    assert {f.name for f in rep.study.factors} == {"reward_offset", "num_samples_logged"}
    assert len(rep.arms) == 3 and rep.arms.n.tolist() == [5, 5, 5]
    line = next(h for h in rep.headline if h.startswith("reward_offset"))
    assert "-" in line.split(":")[1] and "(n.s.)" not in line
