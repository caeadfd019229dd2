"""A completed run keeps its final weights, and `ablate export` turns them into a Hugging Face folder."""

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

import ablate.train.trainer as trainer
from ablate.cli.main import app
from ablate.config import load
from ablate.runs.store import RunStore

SMALL = ["steps=3", "prompts_per_step=4", "eval.every=0", "eval.n_samples=2", "eval.ks=[1]", "task.num_heldout=4",
         "checkpoint_every=0", "tracking.wandb.mode=disabled"]


def test_final_checkpoint_is_kept_without_scheduled_ones(tmp_path):
    cfg = load("configs/toy.yaml", ["steps=7", "checkpoint_every=0", "eval.every=0", "tracking.wandb.mode=disabled"])
    assert trainer.train(cfg, str(tmp_path), progress=False) == "completed"
    assert RunStore(tmp_path).load_checkpoint()["step"] == 7


def test_export_writes_a_from_pretrained_folder_with_provenance(tmp_path):
    run = tmp_path / "run"
    assert trainer.train(load("configs/quickstart.yaml", SMALL), str(run), progress=False) == "completed"
    res = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    AutoTokenizer.from_pretrained(tmp_path / "hf")
    final = RunStore(run).load_checkpoint()["model"]
    assert all(torch.equal(final[k], v) for k, v in model.state_dict().items())
    base = AutoModelForCausalLM.from_pretrained("models/tiny-arith")
    assert any(not torch.equal(base.state_dict()[k], v) for k, v in model.state_dict().items())  # trained
    info = json.loads((tmp_path / "hf" / "export.json").read_text())
    assert info["step"] == 3 and info["state"] == "completed"
    assert {"config.yaml", "provenance.json", "status.json"} <= {p.name for p in (tmp_path / "hf").iterdir()}
    again = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "hf")])
    assert again.exit_code == 2 and "not an empty folder" in again.output
