"""Nothing in a run folder or a runs root is executed: checkpoints are tensors + JSON read with torch's
tensor-only loader, and sweep status never unpickles submitit's result files."""

import json
import pickle

import pytest
import torch

import ablate.train.trainer as trainer
from ablate.config import load, run_id
from ablate.experiments.status import sweep_status
from ablate.runs.store import CheckpointError, RunStore, pack, unpack


class Evil:
    """A pickle that writes a marker file when it is unpickled (what a crafted file would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


def toy(*overrides):
    return load("configs/toy.yaml", ["tracking.wandb.mode=disabled", *overrides])


def test_pack_roundtrip_keeps_tensors_tuples_and_int_keys():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    opt.param_groups[0]["params"][0].grad = torch.ones(3)
    opt.step()
    state = {"optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "step": 3, "since_eval": [0.5, 0.25]}
    tensors = {}
    data = json.loads(json.dumps(pack(state, tensors)))  # plain JSON
    back = unpack(data, tensors)
    assert back["step"] == 3 and back["since_eval"] == [0.5, 0.25]
    assert torch.equal(back["rng"], state["rng"])
    assert list(back["optimizer"]["state"]) == [0] and back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_planted_checkpoint_is_never_executed(tmp_path, how):
    cfg = toy("steps=3")
    run_dir, marker = tmp_path / "run", tmp_path / "pwned"
    store = RunStore(run_dir)
    store.write_config(cfg)  # the folder looks like this run's own
    with open(run_dir / "checkpoint.pt", "wb") as f:
        pickle.dump(Evil(marker), f) if how == "pickle" else torch.save({"model": Evil(marker)}, f)
    with pytest.raises(CheckpointError, match="checkpoint.pt"):
        trainer.train(cfg, str(run_dir), progress=False)
    assert not marker.exists()
    assert not (run_dir / "status.json").exists()  # refused before anything was written


def test_sweep_status_never_unpickles_result_files(tmp_path):
    out, marker = tmp_path / "sweep", tmp_path / "pwned"
    folder = out / ".submitit" / "sub"
    folder.mkdir(parents=True)
    rid = "abc123abc123"
    (out / "manifest.json").write_text(json.dumps({"name": "s", "runs": {rid: {
        "arm": None, "seed": 0, "toggles": {}, "steps": 3, "current": True,
        "jobs": [{"executor": "local", "job_id": "999999999", "submitted": 0, "folder": ".submitit/sub"}]}}}))
    (folder / "999999999_0_result.pkl").write_bytes(pickle.dumps(Evil(marker)))
    (row,) = sweep_status(out)
    assert not marker.exists()
    assert row["scheduler"] == "FAILED" and row["state"] == "failed"  # ended, and the store never finished


def test_checkpoint_is_tensors_plus_json_and_resumes(tmp_path):
    cfg = toy("steps=6", "checkpoint_every=3", "eval.every=0")
    assert trainer.train(cfg, str(tmp_path), progress=False) == "completed"
    blob = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert set(blob) == {"format", "meta", "tensors"}
    meta = json.loads(blob["meta"])
    assert meta["run_id"] == run_id(cfg) and meta["state"]["step"] == 6  # the final step's is kept
    assert all(isinstance(t, torch.Tensor) for t in blob["tensors"].values())
