"""The trainer end to end on the toy testbed (tabular policy, seconds per run)."""

import json

import pytest
from conftest import crash_training_at

import ablate.train.trainer as trainer
from ablate.config import load
from ablate.rl import losses
from ablate.runs.metrics import is_defined
from ablate.runs.store import RunStore
from ablate.train.data import PromptSampler


def toy(*overrides):
    return load("configs/toy.yaml", list(overrides))


def run(cfg, path):
    assert trainer.train(cfg, str(path), progress=False) == "completed"
    return RunStore(path)


def exact_pass1(store):
    return [r["eval/pass@1_exact"] for r in store.read("evals")]


def strip_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


@pytest.mark.parametrize("baseline, scale", [
    ("none", "none"), ("batch_mean", "none"), ("group_mean", "none"), ("group_mean", "group"),
    ("leave_one_out", "none"), ("greedy", "none"), ("group_mean", "batch"),
])
def test_every_estimator_learns(tmp_path, baseline, scale):
    store = run(toy(f"recipe.baseline={baseline}", f"recipe.scale={scale}", "eval.every=0"), tmp_path)
    start, end = exact_pass1(store)
    assert start == pytest.approx(0.108, abs=0.01)  # the fixed toy task's starting skill
    assert end > start + 0.4, (start, end)


def test_group_baselines_ignore_reward_offset(tmp_path):
    for baseline in ("group_mean", "leave_one_out"):
        a = run(toy(f"recipe.baseline={baseline}", "recipe.scale=none", "steps=60"), tmp_path / f"{baseline}-a")
        b = run(toy(f"recipe.baseline={baseline}", "recipe.scale=none", "steps=60", "task.reward_offset=true"),
                tmp_path / f"{baseline}-b")
        assert exact_pass1(a) == pytest.approx(exact_pass1(b), abs=1e-5)
        # the offset is visible in the reward itself, so the two runs really differed
        ra = [r["train/reward_mean"] for r in a.read("metrics")]
        rb = [r["train/reward_mean"] for r in b.read("metrics")]
        assert max(abs(x - y) for x, y in zip(ra, rb)) > 0.05


def test_offset_changes_plain_reinforce(tmp_path):
    a = run(toy("recipe.baseline=none", "recipe.scale=none", "steps=60"), tmp_path / "a")
    b = run(toy("recipe.baseline=none", "recipe.scale=none", "steps=60", "task.reward_offset=true"), tmp_path / "b")
    assert exact_pass1(a) != pytest.approx(exact_pass1(b), abs=1e-3)


def test_same_seed_same_metrics_other_seed_differs(tmp_path):
    a = run(toy("steps=30"), tmp_path / "a")
    b = run(toy("steps=30"), tmp_path / "b")
    c = run(toy("steps=30", "seed=1"), tmp_path / "c")
    assert strip_timing(a.read("metrics")) == strip_timing(b.read("metrics"))
    assert a.read("evals") == b.read("evals")
    assert strip_timing(a.read("metrics")) != strip_timing(c.read("metrics"))


def test_paired_runs_see_the_same_prompts():
    a, b = toy("seed=3"), toy("seed=3", "recipe.policy_loss=cispo", "recipe.scale=batch")  # other toggles
    stream_a, stream_b = PromptSampler(64, a), PromptSampler(64, b)
    assert stream_a.take(100) == stream_b.take(100)
    assert sorted(PromptSampler(64, a).take(64)) == list(range(64))  # each epoch is a permutation


def test_every_logged_metric_is_defined(tmp_path):
    store = run(toy("steps=5", "eval.every=5"), tmp_path)
    names = {k for log in ("metrics", "evals") for r in store.read(log) for k in r if k != "step"}
    assert all(is_defined(n) for n in names), sorted(n for n in names if not is_defined(n))
    assert {"train/dead_group_frac", "train/entropy", "eval/pass@1", "eval/pass@8", "eval/pass@1_exact"} <= names


def test_resume_after_crash_loses_and_repeats_no_step(tmp_path, monkeypatch):
    cfg = toy("steps=12", "checkpoint_every=4", "eval.every=3")
    whole = run(cfg, tmp_path / "whole")

    crash_training_at(monkeypatch, cfg, tmp_path / "resumed", step=7)
    broken = RunStore(tmp_path / "resumed")
    assert broken.status()["state"] == "failed" and "node lost" in broken.status()["error"]
    assert [r["step"] for r in broken.read("metrics")] == list(range(1, 8))

    resumed = run(cfg, tmp_path / "resumed")
    assert [r["step"] for r in resumed.read("metrics")] == list(range(1, 13))
    assert strip_timing(resumed.read("metrics")) == strip_timing(whole.read("metrics"))
    assert resumed.read("evals") == whole.read("evals")


def test_nan_loss_marks_run_diverged(tmp_path, monkeypatch):
    real = losses.POLICY_LOSSES["ppo_clip"]
    calls = {"n": 0}

    def nan_on_third_step(*args, **kwargs):
        calls["n"] += 1
        loss, stats = real(*args, **kwargs)
        return (loss * float("nan") if calls["n"] == 3 else loss), stats

    monkeypatch.setitem(losses.POLICY_LOSSES, "ppo_clip", nan_on_third_step)
    assert trainer.train(toy("steps=10"), str(tmp_path), progress=False) == "diverged"
    status = RunStore(tmp_path).status()
    assert status["state"] == "diverged" and status["step"] == 3
    assert [r["step"] for r in RunStore(tmp_path).read("metrics")] == [1, 2]


def test_refuses_to_overwrite_another_run(tmp_path):
    run(toy("steps=2"), tmp_path)
    with pytest.raises(ValueError, match="holds another run"):
        trainer.train(toy("steps=3"), str(tmp_path), progress=False)
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "completed"


def test_preemption_signal_checkpoints_at_step_boundary(tmp_path, monkeypatch):
    """SLURM's USR2 lands mid-step; the submitit-style handler runs only after the step, its checkpoint
    is exactly at that boundary, and the resumed run matches an uninterrupted one step for step."""
    import os
    import signal

    from ablate.train import preemption

    cfg = toy("steps=10", "checkpoint_every=0", "eval.every=5")
    whole = run(cfg, tmp_path / "whole")

    seen = {}

    def submitit_like_handler(signum, frame):  # what submitit does: checkpoint(), requeue, exit
        seen["saved"] = preemption.save_now()
        seen["step_at_signal"] = RunStore(tmp_path / "pre").status()["step"]
        raise SystemExit(-1)

    real_update, calls = trainer.update, {"n": 0}

    def update_with_signal(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            os.kill(os.getpid(), signal.SIGUSR2)  # arrives in the middle of step 4
        return real_update(*args, **kwargs)

    previous = signal.signal(signal.SIGUSR2, submitit_like_handler)
    monkeypatch.setattr(trainer, "update", update_with_signal)
    try:
        with pytest.raises(SystemExit):
            trainer.train(cfg, str(tmp_path / "pre"), progress=False)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    monkeypatch.setattr(trainer, "update", real_update)
    assert seen == {"saved": True, "step_at_signal": 4}  # handler ran after step 4 had been logged
    store = RunStore(tmp_path / "pre")
    assert store.load_checkpoint()["step"] == 4
    assert store.status()["state"] == "running"  # requeued, not failed

    resumed = run(cfg, tmp_path / "pre")
    assert [r["step"] for r in resumed.read("metrics")] == list(range(1, 11))
    assert strip_timing(resumed.read("metrics")) == strip_timing(whole.read("metrics"))
    assert resumed.read("evals") == whole.read("evals")


def test_should_prune_stops_the_run_as_pruned(tmp_path):
    asked = []

    def prune_after_second_eval(step, row):
        asked.append((step, round(row["eval/pass@1_exact"], 6)))
        return len(asked) == 2

    cfg = toy("steps=20", "eval.every=5")
    assert trainer.train(cfg, str(tmp_path), progress=False, should_prune=prune_after_second_eval) == "pruned"
    store = RunStore(tmp_path)
    assert [s for s, _ in asked] == [5, 10]
    assert store.status()["state"] == "pruned" and store.status()["step"] == 10
    assert [r["step"] for r in store.read("metrics")] == list(range(1, 11))
    # a pruned run is finished: training it again does nothing
    assert trainer.train(cfg, str(tmp_path), progress=False) == "pruned"


def test_dynamic_sampling_that_finds_no_live_group_trains_on_the_last_round(tmp_path):
    """Near-greedy sampling: every group's G completions agree, so every group is dead in every round. After
    `max_gen_rounds` rounds with nothing kept the step trains on the last round's B groups (zero advantages, a
    no-op for the policy term), as the data policies do, instead of failing on an empty batch."""
    cfg = toy("recipe.dynamic_sampling=true", "recipe.max_gen_rounds=2", "recipe.temperature=0.001", "steps=3",
              "eval.every=3")
    store = run(cfg, tmp_path)
    rows = store.read("metrics")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["train/gen_rounds"] == 2 and r["train/dead_group_frac"] == 1.0
        assert r["train/live_groups"] == cfg.prompts_per_step and r["train/adv_abs_max"] == 0.0
        assert r["train/loss_policy"] == 0.0
