"""Divergence: NaN/inf parameters, logits, probabilities, gradient norms or optimizer steps end the run
`diverged` at the step in flight (never `failed` with a traceback); infinite or negative seeds/rates are
refused by validation."""

import pytest
import torch

import ablate.train.trainer as trainer
from ablate.config import ConfigError, load
from ablate.rl.divergence import Diverged
from ablate.rl.sampling import draw
from ablate.runs.store import RunStore


def toy(*overrides):
    return load("configs/toy.yaml", ["tracking.wandb.mode=disabled", *overrides])


def test_nonfinite_probabilities_raise_diverged():
    with pytest.raises(Diverged, match="sampling probabilities"):
        draw(torch.tensor([[float("inf"), 0.0]]), 1.0, greedy=False)


def test_nan_parameters_mark_the_step_diverged(tmp_path, monkeypatch):
    real, calls = trainer.update, {"n": 0}

    def poison_third_update(policy, *args, **kwargs):
        out = real(policy, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 3:
            with torch.no_grad():
                policy.module.first[0, 0] = float("nan")
        return out

    monkeypatch.setattr(trainer, "update", poison_third_update)
    assert trainer.train(toy("steps=10"), str(tmp_path), progress=False) == "diverged"
    st = RunStore(tmp_path).status()
    assert st["state"] == "diverged" and st["step"] == 3 and "parameters" in st["error"]
    assert [r["step"] for r in RunStore(tmp_path).read("metrics")] == [1, 2]


def test_learning_rate_overflow_is_diverged_not_failed(tmp_path):
    assert trainer.train(toy("steps=5", "optim.optimizer=adamw", "optim.lr=3e38"), str(tmp_path),
                         progress=False) == "diverged"
    st = RunStore(tmp_path).status()
    assert st["step"] == 1 and "overflow" in st["error"]


def test_huge_learning_rate_on_a_real_lm_is_diverged(tmp_path):
    cfg = load("configs/quickstart.yaml", ["optim.lr=1e30", "steps=4", "prompts_per_step=4", "eval.every=0",
                                           "eval.n_samples=2", "eval.ks=[1]", "task.num_heldout=4",
                                           "tracking.wandb.mode=disabled"])
    assert trainer.train(cfg, str(tmp_path), progress=False) == "diverged"
    st = RunStore(tmp_path).status()
    assert 1 <= st["step"] <= 2 and "non-finite" in st["error"], st


@pytest.mark.parametrize("override, field", [
    ("optim.lr=.inf", "optim.lr"), ("optim.lr=.nan", "optim.lr"), ("recipe.eps_high=.inf", "recipe.eps_high"),
    ("seed=-1", "seed"), ("task.seed=-3", "task.seed"),
])
def test_infinite_numbers_and_negative_seeds_fail_validation(override, field):
    with pytest.raises(ConfigError, match=rf"configs/toy.yaml: invalid config:(.|\n)*{field}"):
        toy(override)
