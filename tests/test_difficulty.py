"""`ablate difficulty`: cached per-prompt pass rates of the base model, and `task.pass_rate_band`."""

import html
import json

import pytest
from typer.testing import CliRunner

import ablate.train.trainer as trainer
from ablate.cli.main import app
from ablate.config import ConfigError, load, parse
from ablate.runs.store import RunStore
from ablate.tasks.base import Problem
from ablate.train.difficulty import band_filter, cache_path, estimate, histogram, in_band


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))


def test_histogram_and_band_by_hand():
    assert histogram([0.0, 0.05, 0.1, 0.55, 1.0, 1.0]) == [2, 1, 0, 0, 0, 1, 0, 0, 0, 2]
    probs = [Problem(str(i), "", "") for i in range(4)]
    rates = {"0": 0.0, "1": 0.1, "2": 0.8, "3": 0.9}
    assert [p.id for p in in_band(probs, rates, 0.1, 0.8)] == ["1", "2"]


def test_estimate_is_cached_by_model_task_n_temperature():
    cfg = load("configs/toy.yaml")
    rates, path = estimate(cfg, 4, 1.0, progress=False)
    assert len(rates) == 64 and all(r in (0.0, 0.25, 0.5, 0.75, 1.0) for r in rates.values())
    assert 0.02 < sum(rates.values()) / 64 < 0.3  # the toy's starting skill is ~0.11
    mtime = path.stat().st_mtime_ns
    assert estimate(cfg, 4, 1.0, progress=False) == (rates, path) and path.stat().st_mtime_ns == mtime
    assert len({cache_path(cfg, 4, 1.0), cache_path(cfg, 8, 1.0), cache_path(cfg, 4, 0.7),
                cache_path(load("configs/toy.yaml", ["task.seed=1"]), 4, 1.0)}) == 4
    # the band itself is not part of the key: filtering reads the rates it was computed from
    assert cache_path(load("configs/toy.yaml", ["task.pass_rate_band=[0.1, 0.8]"]), 4, 1.0) == path


def test_band_filters_the_training_pool(tmp_path):
    banded = load("configs/toy.yaml", ["task.pass_rate_band=[0.1, 0.8]", "steps=3", "eval.every=0",
                                      "eval.n_samples=4", "eval.ks=[1, 4]"])
    with pytest.raises(ValueError, match="run `ablate difficulty CONFIG` first"):
        band_filter(banded, [])
    rates, _ = estimate(banded, 4, 1.0, progress=False)
    kept = sum(0.1 <= r <= 0.8 for r in rates.values())
    assert 0 < kept < 64
    assert trainer.train(banded, str(tmp_path / "run"), progress=False) == "completed"
    assert {r["data/pool_size"] for r in RunStore(tmp_path / "run").read("metrics")} == {kept}
    with pytest.raises(ConfigError, match="pass_rate_band"):
        parse({"task": {"pass_rate_band": [0.8, 0.1]}})


def test_cli(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["difficulty", "configs/toy.yaml", "--n", "2", "--quiet",
                              "--set", "task.pass_rate_band=[0.5, 1.0]"])
    assert res.exit_code == 0, res.output
    assert "64 prompts" in res.output and "keeps" in res.output
    cached = json.loads(next((tmp_path / "cache" / "difficulty").glob("*.json")).read_text())
    assert cached["n"] == 2 and len(cached["rates"]) == 64
    assert runner.invoke(app, ["difficulty", "configs/toy.yaml", "--set", "recipe.group_size=0"]).exit_code == 2


def test_report_shows_the_band_histograms(tmp_path, monkeypatch):
    """Two real toy runs, one with task.pass_rate_band: the report's setup says how many prompts the
    band kept and draws the pass-rate histograms before and after; a moved cache is said to be missing."""
    from ablate.analysis import build_report
    from ablate.analysis.render import band_lines
    from ablate.analysis.report import band_summaries
    from ablate.train.difficulty import band_summary

    base = ["steps=2", "eval.every=0", "eval.n_samples=4", "eval.ks=[1, 4]", "tracking.wandb.mode=disabled"]
    banded = load("configs/toy.yaml", [*base, "task.pass_rate_band=[0.1, 0.8]"])
    rates, _ = estimate(banded, 4, 1.0, progress=False)
    for name, cfg in (("band", banded), ("all", load("configs/toy.yaml", base))):
        assert trainer.train(cfg, str(tmp_path / "runs" / name), progress=False) == "completed"
    kept = sum(0.1 <= r <= 0.8 for r in rates.values())
    s = band_summary(rates, 0.1, 0.8)
    assert (s["total"], s["kept"], sum(s["before"]), sum(s["after"])) == (64, kept, 64, kept)
    assert s["before"] == histogram(list(rates.values())) and s["after"][0] == 0  # rate 0 is below the band
    assert band_summary({"a": 0.0, "b": 0.25, "c": 0.5, "d": 1.0}, 0.1, 0.8) == {
        "band": [0.1, 0.8], "total": 4, "kept": 2, "before": [1, 0, 1, 0, 0, 1, 0, 0, 0, 1],
        "after": [0, 0, 1, 0, 0, 1, 0, 0, 0, 0]}
    out = tmp_path / "rep.html"
    rep = build_report([tmp_path / "runs"], out, figures=False, reps=100)
    (e,) = rep.bands
    assert e["summary"] == s and len(e["arms"]) == 1
    line = f"{kept} of 64 training prompts kept ({kept / 64:.0%}) by the base model's pass rate over 4 samples"
    assert line in band_lines(rep.bands)[0] and line in html.unescape(out.read_text()) and line in out.with_suffix(".md").read_text()
    from ablate.analysis import plots

    fig = plots.band_figure(rep.bands)
    assert [b.get_height() for b in fig.axes[0].patches] == [*s["before"], *s["after"]]
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "elsewhere"))
    assert "is not on this machine" in band_lines(band_summaries(rep.study))[0]
