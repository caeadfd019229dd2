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


def test_extend_to_continues_a_completed_run_as_a_new_run_keeping_every_row(tmp_path):
    import json

    from ablate.config import load, run_id
    from ablate.runs.store import RunStore

    args = ["configs/toy.yaml", "--set", "steps=6", "--set", "eval.every=3", "--set", "tracking.wandb.mode=disabled",
            "--quiet"]
    src = tmp_path / "runs" / "short"
    assert CliRunner().invoke(app, ["train", *args, "--out", str(src)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    res = CliRunner().invoke(app, ["train", *args, "--out", str(src), "--extend-to", "10"])
    assert res.exit_code == 0, res.output
    cfg = load("configs/toy.yaml", ["steps=6", "eval.every=3", "tracking.wandb.mode=disabled"])
    new_id = run_id(load("configs/toy.yaml", ["steps=10", "eval.every=3", "tracking.wandb.mode=disabled"]))
    dst = tmp_path / "runs" / new_id
    old, new = RunStore(src), RunStore(dst)
    assert new.status()["state"] == "completed" and new.status()["step"] == 10
    assert [r["step"] for r in new.read("metrics")] == list(range(1, 11))
    assert new.read("metrics")[:6] == old.read("metrics")  # the first 6 steps are the old run's rows, kept
    assert [r["step"] for r in new.read("evals")] == [0, 3, 6, 9, 10]
    prov = json.loads((dst / "provenance.json").read_text())
    assert prov["extended_from"] == {"run_id": run_id(cfg), "steps": 6, "folder": str(src.resolve())}
    assert prov["resumed_from_steps"] == [6]
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before  # the 6-step run is untouched
    again = CliRunner().invoke(app, ["train", *args, "--out", str(src), "--extend-to", "10"])
    assert again.exit_code == 0 and [r["step"] for r in new.read("metrics")] == list(range(1, 11))
    for bad, words in ((["--extend-to", "5"], "already has 6 steps"), (["--extend-to", "9", "--set", "seed=3"],
                                                                       "holds another run")):
        res = CliRunner().invoke(app, ["train", *args, "--out", str(src), *bad])
        assert res.exit_code == 2 and words in res.output, res.output


def test_loading_a_model_prints_no_weight_loading_bar(capfd):
    from ablate.train.models import load_model

    load_model(str(ROOT / "models" / "tiny-arith"))
    out = capfd.readouterr()
    assert "Loading weights" not in out.err + out.out
