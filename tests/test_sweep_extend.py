"""`ablate sweep extend`: the fixed-rounds rule (alpha split over the planned looks) by hand, and the
command on a spec whose runs exist (synthetic run folders under its runs root)."""

from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import yaml
from typer.testing import CliRunner

from ablate.analysis.sequential import looks, next_round
from ablate.analysis.synthetic import write_sweep
from ablate.cli.sweep import sweep_app

ROOT = Path(__file__).resolve().parents[1]


def test_fixed_rounds_rule_by_hand():
    assert looks(3, 7, 2) == 3 and looks(3, 8, 2) == 4 and looks(5, 5, 2) == 1
    d = next_round({"a": [1.0, 2.0, 3.0], "b": [2.0, 2.1, 2.2]}, n0=3, width=1.0, max_seeds=7, step=2)
    level = 1 - 0.05 / 3
    t = scipy.stats.t.ppf(1 - 0.05 / 6, 2)
    assert d["level"] == pytest.approx(level)
    assert d["widths"]["a"] == pytest.approx(2 * t / np.sqrt(3)) and d["widths"]["b"] == pytest.approx(0.2 * t / np.sqrt(3))
    assert d["wide"] == ["a"] and (d["seeds"], d["next_seeds"], d["stop"]) == (3, 5, False)
    done = next_round({"a": [1.0] * 3 + [3.0] * 4}, n0=3, width=1.0, max_seeds=7, step=2)
    assert done["stop"] and done["why"] == "max seeds reached"
    tight = next_round({"a": [2.0, 2.01, 2.02]}, n0=3, width=1.0, max_seeds=7, step=2)
    assert tight["stop"] and tight["why"] == "every interval is narrower than the target"


def _spec(tmp_path, seed_sd):
    out = tmp_path / "runs" / "ext"
    write_sweep(out, {"recipe.eps_high": [0.2, 0.28]}, seeds=range(3), seed_sd=seed_sd, noise=seed_sd, samples=False)
    spec = {"name": "ext", "base": {"config": str(ROOT / "configs" / "toy.yaml")},
            "grid": {"recipe.eps_high": [0.2, 0.28]}, "seeds": [0, 1, 2], "out": str(out)}
    path = tmp_path / "ext.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_extend_adds_seeds_while_an_arm_is_too_wide(tmp_path):
    path = _spec(tmp_path, seed_sd=0.05)
    res = CliRunner().invoke(sweep_app, ["extend", str(path), "--until-ci-width", "2", "--max-seeds", "7"])
    assert res.exit_code == 0, res.output
    new = yaml.safe_load((tmp_path / "ext.extend.yaml").read_text())
    assert new["seeds"] == [0, 1, 2, 3, 4] and new["out"] == str((tmp_path / "runs" / "ext").resolve())
    assert "98.33% CI width" in res.output and "ablate sweep run" in res.output
    from ablate.experiments.sweep import expand, load_spec

    assert len(expand(load_spec(tmp_path / "ext.extend.yaml"))) == 10


def test_extend_stops_when_every_interval_is_narrow(tmp_path):
    path = _spec(tmp_path, seed_sd=0.0001)
    res = CliRunner().invoke(sweep_app, ["extend", str(path), "--until-ci-width", "2", "--max-seeds", "7"])
    assert res.exit_code == 0 and "stop: every interval is narrower" in res.output, res.output
    assert not (tmp_path / "ext.extend.yaml").exists()
    assert CliRunner().invoke(sweep_app, ["extend", str(path), "--until-ci-width", "2", "--max-seeds", "7",
                                          "--step", "0"]).exit_code == 2
