"""Loading, factorial effects, warnings and the HTML/Markdown report on synthetic sweeps with planted
effects (ablate.analysis.synthetic), plus a headless-Chromium render check."""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_renders_in_chromium
from typer.testing import CliRunner

import ablate
from ablate.analysis import build_report, final_table, load_study
from ablate.analysis.render import SECTIONS
from ablate.analysis.synthetic import run_name, write_run, write_sweep

GRID = {"recipe.eps_high": [0.2, 0.28], "recipe.scale": ["group", "none"]}
PLANTED = dict(effects={"recipe.eps_high": 0.03, "recipe.scale": 0.01},
               interactions={("recipe.eps_high", "recipe.scale"): 0.02})


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis") / "clip_x_norm"
    write_sweep(root, GRID, seeds=range(4), fail=((3, 1),), **PLANTED)
    (root / "c00009d00009").mkdir()                       # a run that died before logging anything
    cfg = (root / "c00000d00000" / "config.yaml").read_text().replace("run_id: c00000d00000", "run_id: c00009d00009")
    (root / "c00009d00009" / "config.yaml").write_text(cfg.replace("seed: 0", "seed: 9"))
    (root / "c00009d00009" / "status.json").write_text(json.dumps({"state": "failed", "step": 0, "error": "OOM"}))
    with open(root / "c00000d00000" / "metrics.jsonl", "a") as f:
        f.write('{"step": 101, "train/rew')         # torn last line
    return root


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "clip_x_norm.html"
    return build_report([sweep], out, reps=500), out


def test_load_runs_tidy_and_final_table(sweep):
    df = ablate.load_runs(sweep)
    assert list(df.columns[:6]) == ["run_id", "run_dir", "state", "step", "metric", "value"]
    assert {"seed", "recipe.eps_high", "recipe.scale"} <= set(df.columns)
    assert df[(df.run_id == "c00000d00000") & (df.metric == "train/reward_mean")].step.max() == 100  # torn line skipped
    assert set(df.state) == {"completed", "failed"}
    study = load_study(sweep)
    ft = final_table(study)
    assert len(ft) == 17 and ft.run_id.is_unique                          # every run, even one with no logs
    assert ft.set_index("run_id").loc["c00009d00009", "state"] == "failed"
    assert ft.set_index("run_id").loc["c00003d00001", "last_step"] == 50
    assert final_table(df).shape[0] == 16                                 # the tidy frame: runs that logged


def test_parquet_cache_is_used_and_invalidated(sweep):
    run = sweep / "c00001d00002"
    load_study(run)
    meta = run / ".ablate-cache" / "meta.json"
    assert meta.exists() and (run / ".ablate-cache" / "metrics.parquet").exists()
    before = load_study(run, cache=True).metrics
    assert before.equals(load_study(run, cache=False).metrics)
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    with open(run / "metrics.jsonl", "a") as f:                            # a new step: the cache is stale
        f.write(json.dumps({**row, "step": 101}) + "\n")
    assert load_study(run).metrics.step.max() == 101
    lines = (run / "metrics.jsonl").read_text().splitlines()[:-1]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_factors_from_manifest_and_without(sweep, tmp_path):
    with_m = load_study(sweep)
    assert [(f.name, f.levels) for f in with_m.factors] == [("eps_high", ["0.2", "0.28"]), ("scale", ["group", "none"])]
    bare = tmp_path / "bare"
    shutil.copytree(sweep, bare, ignore=shutil.ignore_patterns("manifest.json", "c00009d00009", ".ablate-cache"))
    without = load_study(bare)
    assert [(f.name, f.levels) for f in without.factors] == [(f.name, f.levels) for f in with_m.factors]
    assert list(without.runs.arm.unique()) == list(with_m.runs.arm[with_m.runs.run_id != "c00009d00009"].unique())


def test_confounded_keys_form_one_factor(tmp_path):
    write_sweep(tmp_path, {"recipe.scale": ["group", "none"]}, seeds=range(2), manifest=False, samples=False)
    for d in tmp_path.glob("c00001*"):                # loss_agg moves with scale: one factor, not two
        (d / "config.yaml").write_text((d / "config.yaml").read_text().replace("recipe:\n", "recipe:\n  loss_agg: tok\n"))
    for d in tmp_path.glob("c00000*"):
        (d / "config.yaml").write_text((d / "config.yaml").read_text().replace("recipe:\n", "recipe:\n  loss_agg: seq\n"))
    f = load_study(tmp_path).factors
    assert len(f) == 1 and f[0].name == "loss_agg+scale" and f[0].levels == ["seq/group", "tok/none"]


def test_factorial_effects_recover_planted_values(report):
    rep, _ = report
    e = rep.effects.set_index("term")
    # eps_high main effect: 0.03 + half the interaction; scale: 0.01 + 0.01; interaction (difference of differences)
    for term, want in [("eps_high=0.28", 0.04), ("scale=none", 0.02), ("eps_high=0.28 x scale=none", 0.02)]:
        assert e.loc[term, "estimate"] == pytest.approx(want)
        assert e.loc[term, "lo"] == pytest.approx(want) and e.loc[term, "hi"] == pytest.approx(want)  # no run noise
        assert e.loc[term, "paired"] and e.loc[term, "n"] == 3          # seed 1 lost a cell (failed run)
    assert rep.headline[0].startswith("eps_high 0.2 -> 0.28: +4.0 pass@1 points [4.0, 4.0]; interaction with scale: +2.0")


def test_effects_with_noise_cover_the_truth(tmp_path):
    write_sweep(tmp_path, GRID, seeds=range(6), noise=0.01, rng_seed=4, samples=False, **PLANTED)
    rep = build_report([tmp_path], None, figures=False, reps=1000)
    e = rep.effects.set_index("term")
    assert e.loc["eps_high=0.28", "lo"] < 0.04 < e.loc["eps_high=0.28", "hi"] and e.loc["eps_high=0.28", "significant"]


def test_failed_runs_are_labelled_and_warned(report):
    rep, _ = report
    runs = rep.runs.set_index("run_id")
    assert not runs.loc["c00003d00001", "included"] and "failed" in runs.loc["c00003d00001", "reason"]
    assert runs.loc["c00009d00009", "state"] == "failed"
    assert any("c00003d00001" in w and "failed" in w for w in rep.warnings)
    assert any("c00009d00009" in w and "OOM" in w for w in rep.warnings)
    assert "c00003d00001 (state failed)" in rep.arms.set_index("arm").loc["eps_high=0.28, scale=none", "excluded"]


def test_few_seeds_and_spread_warnings(tmp_path):
    write_sweep(tmp_path, {"recipe.eps_high": [0.2, 0.28]}, seeds=range(2), seed_sd=0.1,
                effects={"recipe.eps_high": 0.001}, noise=0.05, samples=False)
    rep = build_report([tmp_path], None, figures=False)
    assert any("2 usable seed(s)" in w for w in rep.warnings)
    assert any("spread" in w and "exceeds the effect" in w for w in rep.warnings)


def test_reward_hacking_warning(tmp_path):
    rng = np.random.default_rng(0)
    for s in range(3):
        d = tmp_path / f"run{s}"
        write_run(d, {"run_id": f"h{s}", "seed": s, "steps": 100}, final=0.9, steps=100, rng=rng)
        evals = [{"step": st, "eval/pass@1": p} for st, p in zip(range(0, 101, 25), [0.1, 0.4, 0.5, 0.3, 0.2])]
        (d / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    rep = build_report([tmp_path], None, figures=False)
    assert any("reward hacking" in w for w in rep.warnings)


def test_report_has_every_section(report):
    rep, out = report
    text = out.read_text()
    for key, title in SECTIONS:
        assert f"id='{key}'" in text, key
    assert text.count("data:image/png;base64,") == 3                       # curves, pass@k, forest
    assert "http://" not in text and "https://" not in text and "<script" not in text
    md = out.with_suffix(".md").read_text()
    for title in ("Headline", "Setup", "Warnings", "Ranking", "Factorial effects", "pass@k", "Diagnostics", "Runs"):
        assert f"## {title}" in md
    assert "base (step 0)" in set(rep.passk.arm) and rep.passk.k.max() == 8
    assert len(rep.samples) == 4


@pytest.mark.parametrize("x", ["samples", "tokens", "wall"])
def test_other_x_axes(sweep, x):
    rep = build_report([sweep], None, x=x, reps=100)
    assert "curves" in rep.figures


def test_bad_inputs(sweep):
    with pytest.raises(ValueError, match="x must be"):
        build_report([sweep], None, x="epochs")
    with pytest.raises(ValueError, match="not logged"):
        build_report([sweep], None, metric="eval/nope", figures=False)


def test_cli(sweep, tmp_path):
    from ablate.cli.report import report_app

    out = tmp_path / "r.html"
    res = CliRunner().invoke(report_app, [str(sweep), "-o", str(out), "--metric", "eval/pass@8", "--x", "tokens",
                                          "--reps", "200", "--json"])
    assert res.exit_code == 0, res.output
    assert out.exists() and out.with_suffix(".md").exists() and "eps_high" in res.output
    assert CliRunner().invoke(report_app, [str(tmp_path / "nope")]).exit_code == 2


def test_report_renders_in_headless_chromium(report, tmp_path):
    _, out = report
    assert_renders_in_chromium(out, tmp_path)


def test_study_script_runs_on_a_sweep(sweep, tmp_path):
    """analysis/study.py, the worked Python analysis, on the synthetic sweep: arms, effects, the
    compute-matched table and its figure."""
    import sys

    res = subprocess.run([sys.executable, "analysis/study.py", str(sweep), "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=300)
    assert res.returncode == 0, res.stderr
    assert "17 runs: {'completed': 15, 'failed': 2}" in res.stdout
    assert "eps_high=0.28 x scale=none" in res.stdout and "equal budget of" in res.stdout
    effects = res.stdout.split("factorial effects:")[1]
    row = next(line.split() for line in effects.splitlines() if line.strip().startswith("eps_high=0.28 "))
    assert float(row[1]) == pytest.approx(100 * (0.03 + 0.02 / 2), abs=0.6)  # planted main effect (+ half the
    assert "factorial effects: in points" in res.stdout                        # interaction), in points
    assert (tmp_path / "study.png").stat().st_size > 10_000


def test_narrowing_warning_needs_changes_beyond_the_ci():
    import pandas as pd

    from ablate.analysis.diagnostics import narrowing_warnings

    rows = [("base (step 0)", 1, 0.48, 0.46, 0.50), ("base (step 0)", 8, 0.80, 0.78, 0.82),
            ("sharp", 1, 0.70, 0.66, 0.74), ("sharp", 8, 0.74, 0.71, 0.77),      # both beyond the CI: warn
            ("noisy", 1, 0.49, 0.47, 0.51), ("noisy", 8, 0.79, 0.76, 0.82)]      # within noise: quiet
    warns = narrowing_warnings(pd.DataFrame(rows, columns=["arm", "k", "mean", "lo", "hi"]))
    assert warns == ["'sharp': pass@1 up (0.48 -> 0.7) but pass@8 down (0.8 -> 0.74) versus the base model: "
                     "RL narrowed the solutions"]


def test_named_arms_that_are_not_a_factorial_get_a_headline_labelled_by_arm(tmp_path):
    """Named arms moving several keys at once (policy_loss, and RAFT's baseline too) are no factorial
    design: the keys are confounded with the arm (one factor), every arm is compared with the reference
    (RAFT was dropped: no cell had it at the reference baseline) and runs are labelled by arm alone."""
    arms = {"ppo_clip": ({"policy_loss": "ppo_clip", "baseline": "group_mean"}, 0.60),
            "cispo": ({"policy_loss": "cispo", "baseline": "group_mean"}, 0.70),
            "raft": ({"policy_loss": "raft", "baseline": "none"}, 0.50)}
    rng, entries = np.random.default_rng(0), {}
    for i, (arm, (recipe, final)) in enumerate(arms.items()):
        for s in range(3):
            rid = run_name(i, s)
            cfg = {"run_id": rid, "task": {"name": "synthetic"}, "model": {"path": "none"}, "steps": 50, "seed": s,
                   "recipe": recipe}
            write_run(tmp_path / rid, cfg, final + 0.01 * s, 50, rng, samples=False)
            entries[rid] = {"arm": arm, "seed": s, "toggles": {f"recipe.{k}": v for k, v in recipe.items()},
                            "steps": 50, "jobs": []}
    (tmp_path / "manifest.json").write_text(json.dumps({"name": "named", "spec": {"name": "named", "arms": {a: {} for a in arms}},
                                                        "runs": entries}))
    rep = build_report([tmp_path], figures=False)
    contrasts = [line for line in rep.headline if "ppo_clip" in line]
    assert [line.split(":")[0] for line in contrasts] == ["arm ppo_clip -> cispo", "arm ppo_clip -> raft"]
    assert [f.keys for f in rep.study.factors] == [("__arm__", "recipe.policy_loss", "recipe.baseline")]
    assert "+10.0" in contrasts[0] and "-10.0" in contrasts[1] and "n.s." not in contrasts[0]
    assert sorted(set(rep.study.runs["arm"])) == ["cispo", "ppo_clip", "raft"]
