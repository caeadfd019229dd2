"""Fault tests for run folders: unknown run files, foreign or damaged checkpoints, corrupt logs."""

import shutil

import pytest

import ablate.train.trainer as trainer
from ablate.config import load
from ablate.runs.store import CheckpointError, RunFolderError, RunStore


def toy(*overrides):
    return load("configs/toy.yaml", ["tracking.wandb.mode=disabled", "eval.every=0", *overrides])


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_folder_with_run_files_but_no_config_is_refused_naming_them(tmp_path):
    a = toy("steps=4", "checkpoint_every=2")
    assert trainer.train(a, str(tmp_path / "a"), progress=False) == "completed"
    (tmp_path / "a" / "config.yaml").unlink()
    before = snapshot(tmp_path / "a")
    with pytest.raises(RunFolderError, match=r"no config\.yaml") as err:
        trainer.train(toy("steps=4", "seed=1"), str(tmp_path / "a"), progress=False)
    assert "checkpoint.pt" in str(err.value) and "metrics.jsonl" in str(err.value)
    assert snapshot(tmp_path / "a") == before  # nothing wiped, nothing resumed


def test_checkpoint_of_another_run_is_not_resumed(tmp_path):
    a, b = toy("steps=4", "checkpoint_every=2"), toy("steps=4", "checkpoint_every=2", "seed=1")
    assert trainer.train(a, str(tmp_path / "a"), progress=False) == "completed"
    RunStore(tmp_path / "b").write_config(b)
    shutil.copy(tmp_path / "a" / "checkpoint.pt", tmp_path / "b" / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="not of run"):
        trainer.train(b, str(tmp_path / "b"), progress=False)
    assert not (tmp_path / "b" / "status.json").exists()


def test_truncated_checkpoint_is_named(tmp_path):
    cfg = toy("steps=4", "checkpoint_every=2")
    RunStore(tmp_path).write_config(cfg)
    (tmp_path / "checkpoint.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt: not a readable checkpoint"):
        trainer.train(cfg, str(tmp_path), progress=False)


def corrupt_line(path, lineno):
    lines = path.read_text().splitlines(keepends=True)
    lines[lineno - 1] = lines[lineno - 1][:20] + "\n"
    path.write_text("".join(lines))


def test_corrupt_log_line_is_reported_and_resume_refuses_to_rewrite(tmp_path, monkeypatch):
    from conftest import crash_training_at

    cfg = toy("steps=8", "checkpoint_every=4")
    crash_training_at(monkeypatch, cfg, tmp_path, step=6)
    corrupt_line(tmp_path / "metrics.jsonl", 3)
    before = snapshot(tmp_path)
    with pytest.raises(RunFolderError, match=r"metrics\.jsonl:3: corrupt line"):
        RunStore(tmp_path).read("metrics")
    with pytest.raises(RunFolderError, match=r"metrics\.jsonl:3: corrupt line"):
        trainer.train(cfg, str(tmp_path), progress=False)
    assert snapshot(tmp_path) == before  # nothing rewritten, no row dropped


def test_load_runs_and_report_name_the_corrupt_line(tmp_path):
    from typer.testing import CliRunner

    from ablate.analysis.load import read_run
    from ablate.cli.main import app

    run_dir = tmp_path / "run"
    assert trainer.train(toy("steps=6", "eval.every=2"), str(run_dir), progress=False) == "completed"
    corrupt_line(run_dir / "evals.jsonl", 2)
    with pytest.raises(RunFolderError, match=r"evals\.jsonl:2"):
        read_run(run_dir, cache=False)
    res = CliRunner().invoke(app, ["report", str(run_dir), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2 and "evals.jsonl:2: corrupt line" in res.output
    assert not (tmp_path / "r.html").exists()
