"""The statistics on real toy-testbed runs (configs/toy.yaml, seconds each): an A/A comparison is not
reported as different, and a known effect (a reward offset hurts plain REINFORCE) is found with the
right sign. Runs are written by ablate.trainer.train straight into folders: no manifest, so the arms
are inferred from the config keys that differ."""

import pytest

from ablate.analysis import build_report, load_study
from ablate.analysis import effects as E
from ablate.config import load
from ablate.trainer import train

REINFORCE = ["recipe.baseline=none", "recipe.scale=none", "steps=60", "eval.every=20"]
METRIC = "eval/pass@1_exact"


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy_ablation")
    groups = {"plain": ([], range(5)), "offset": (["task.reward_offset=true"], range(5)),
              "aa": (["eval.num_samples_logged=2"], range(10, 15))}  # a no-op toggle, other seeds
    for name, (extra, seeds) in groups.items():
        for s in seeds:
            cfg = load("configs/toy.yaml", REINFORCE + extra + [f"seed={s}"])
            assert train(cfg, str(root / name / f"seed{s}"), progress=False) == "completed"
    return root


def effect(study, factor):
    scores = E.final_scores(study, METRIC)
    eff = E.factorial_effects(scores, study.factors, reps=2000, seed=0).set_index("factor")
    return eff.loc[factor], scores


def test_known_effect_reward_offset_hurts_reinforce(toy_runs):
    study = load_study(toy_runs / "plain", toy_runs / "offset")
    assert [(f.name, f.levels) for f in study.factors] == [("reward_offset", ["False", "True"])]
    e, _ = effect(study, "reward_offset")
    assert e["paired"] and e["n"] == 5                    # same seeds in both arms: paired by seed
    assert e["hi"] < 0 and e["estimate"] < -0.05, e       # the offset lowers held-out pass@1, CI excludes 0


def test_aa_comparison_is_not_significant(toy_runs):
    study = load_study(toy_runs / "plain", toy_runs / "aa")
    assert [f.name for f in study.factors] == ["num_samples_logged"]
    e, scores = effect(study, "num_samples_logged")
    assert not e["paired"]                               # disjoint seeds: unpaired bootstrap
    # One draw of a 5%-level test: with seeds 5-9 instead of 10-14 this A/A pair *is* "significant"
    # (+2.3 points, Welch t p ~ 0.02 as well): seed luck, which is why reports show CIs, not verdicts.
    assert e["lo"] <= 0 <= e["hi"] and not e["significant"], e
    arms = E.compare_arms(scores, reps=2000)
    poi = arms[~arms.reference].iloc[0]
    assert poi.poi_lo <= 0.5 <= poi.poi_hi


def test_report_from_toy_runs(toy_runs, tmp_path):
    out = tmp_path / "toy.html"
    rep = build_report([toy_runs], out, metric=METRIC, reps=300)
    assert out.exists() and out.with_suffix(".md").exists()
    assert {f.name for f in rep.study.factors} == {"reward_offset", "num_samples_logged"}
    assert len(rep.arms) == 3 and rep.arms.n.tolist() == [5, 5, 5]
    line = next(h for h in rep.headline if h.startswith("reward_offset"))
    assert "-" in line.split(":")[1] and "(n.s.)" not in line
