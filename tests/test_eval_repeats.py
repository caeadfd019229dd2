"""eval.repeats on real toy runs: repeat 0 is the evaluation as it always was, the other repeats sample
from their own keyed streams (training is the same whatever eval.repeats), the eval row is their mean,
the per-problem counts land in eval_problems.jsonl, survive a resume, and feed the report's eval noise."""

import numpy as np
import pytest
from conftest import crash_training_at

import ablate.train.trainer as trainer
from ablate.analysis import build_report
from ablate.config import load
from ablate.rl.sampling import keyed_stream
from ablate.runs.store import RunStore


def toy(*overrides):
    return load("configs/toy.yaml", ["steps=6", "eval.every=3", "tracking.wandb.mode=disabled", *overrides])


def run(cfg, path):
    assert trainer.train(cfg, str(path), progress=False) == "completed"
    return RunStore(path)


def no_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def test_keyed_stream_leaves_the_global_stream_alone():
    import torch

    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    with keyed_stream(1, 2, 3):
        a = torch.rand(3)
    assert torch.equal(torch.rand(3), want)
    with keyed_stream(1, 2, 3):
        assert torch.equal(torch.rand(3), a)
    with keyed_stream(1, 2, 4):
        assert not torch.equal(torch.rand(3), a)


def test_repeats_leave_training_alone_and_average_into_the_eval_row(tmp_path):
    one, three = run(toy(), tmp_path / "one"), run(toy("eval.repeats=3"), tmp_path / "three")
    assert no_timing(one.read("metrics")) == no_timing(three.read("metrics"))
    p1, p3 = one.read("eval_problems"), three.read("eval_problems")
    assert [(r["step"], r["repeat"]) for r in p3] == [(s, k) for s in (0, 3, 6) for k in range(3)]
    assert [r for r in p3 if r["repeat"] == 0] == p1                   # repeat 0: the evaluation as before
    assert len(p1[0]["problems"]) == 64 and p1[0]["problems"][0] == "toy-0" and p1[0]["n"] == 8
    assert p3[1]["correct"] != p3[0]["correct"] != p3[2]["correct"]    # each repeat its own sampling seed
    for rows, ev in ((p1, one.read("evals")), (p3, three.read("evals"))):
        for e in ev:
            counts = [c for r in rows if r["step"] == e["step"] for c in r["correct"]]
            assert e["eval/pass@1"] == pytest.approx(np.mean(counts) / 8, abs=1e-12)
    e1, e3 = one.read("evals"), three.read("evals")
    assert [e["eval/pass@1_exact"] for e in e1] == [e["eval/pass@1_exact"] for e in e3]  # exact: no sampling


def test_repeats_survive_a_resume(tmp_path, monkeypatch):
    cfg = toy("steps=4", "checkpoint_every=2", "eval.every=1", "eval.repeats=2")
    whole = run(cfg, tmp_path / "whole")
    crash_training_at(monkeypatch, cfg, tmp_path / "resumed", step=3)
    resumed = run(cfg, tmp_path / "resumed")
    assert resumed.read("eval_problems") == whole.read("eval_problems")
    assert resumed.read("evals") == whole.read("evals")


def test_report_eval_noise_on_real_toy_runs(tmp_path):
    for scale in ("group", "none"):
        for seed in (0, 1):
            run(toy(f"recipe.scale={scale}", f"seed={seed}", "eval.repeats=2", "eval.every=0", "steps=2"),
                tmp_path / f"{scale}{seed}")
    rep = build_report([tmp_path], None, figures=False, reps=200)
    assert list(rep.noise["arm"]) == ["scale=group", "scale=none"]
    assert (rep.noise[["S", "M", "n"]].to_numpy() == [2, 64, 16]).all()
    final = rep.scores.set_index("run_id")["value"]                   # eval/pass@1: the mean of both repeats
    for arm, g in rep.scores.groupby("arm"):
        assert rep.noise.set_index("arm").loc[arm, "mean"] == pytest.approx(final[g["run_id"]].mean(), abs=1e-12)
    d = rep.noise_contrasts.iloc[0]
    assert d.paired and d.M == 64 and d.better + d.worse + d.tied == 64
