"""Rough edges a new user meets (issue 17, item 12)."""

import shutil
from pathlib import Path

from typer.testing import CliRunner

from ablate.cli.main import app

ROOT = Path(__file__).resolve().parent.parent


def test_cached_base_model_says_it_was_reused(tmp_path):
    shutil.copytree(ROOT / "models" / "tiny-arith", tmp_path / "m")
    res = CliRunner().invoke(app, ["base-model", "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    assert "reused the cached build" in " ".join(res.output.split())
