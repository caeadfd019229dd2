"""Step schedules for temperature and max_new_tokens: hand-checked values, validation, and the trainer
logging the per-step value while a plain number changes nothing."""

import pytest

import ablate.train.trainer as trainer
from ablate.config import ConfigError, Schedule, Stage, load, parse, run_id, to_dict
from ablate.rl.schedules import SCHEDULES, constant, linear, max_new_tokens_at, stages, temperature_at, value_at
from ablate.runs.store import RunStore
from ablate.train.plan import plan_step


def test_constant_linear_stages_by_hand():
    assert constant(Schedule(kind="constant", value=0.8), 7) == 0.8
    lin = Schedule(kind="linear", start=0.7, end=1.2, steps=6)   # +0.1 per step from step 1 to 6
    assert [round(linear(lin, t), 10) for t in (0, 1, 3, 6, 10)] == [0.7, 0.7, 0.9, 1.2, 1.2]
    st = Schedule(kind="stages", stages=(Stage(1, 8.0), Stage(50, 16.0), Stage(120, 24.0)))
    assert [stages(st, t) for t in (0, 1, 49, 50, 119, 120, 500)] == [8, 8, 8, 16, 16, 24, 24]
    assert value_at(0.9, 123) == 0.9


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_every_schedule_kind_stays_within_its_values(kind):
    s = Schedule(kind=kind, value=2.0, start=1.0, end=3.0, steps=10, stages=(Stage(1, 1.0), Stage(5, 3.0)))
    vals = [SCHEDULES[kind](s, t) for t in range(0, 30)]
    assert all(1.0 <= v <= 3.0 for v in vals) and vals[0] == SCHEDULES[kind](s, 1)


def test_values_at_a_step_and_a_plain_number_is_itself():
    plain = parse({"recipe": {"temperature": 0.9, "max_new_tokens": 7}}).recipe
    assert temperature_at(plain, 5) == 0.9 and max_new_tokens_at(plain, 5) == 7
    cfg = parse({"recipe": {"temperature": {"kind": "linear", "start": 0.5, "end": 1.0, "steps": 3},
                            "max_new_tokens": {"kind": "linear", "start": 4, "end": 9, "steps": 3}}})
    t2, n2 = temperature_at(cfg.recipe, 2), max_new_tokens_at(cfg.recipe, 2)
    assert t2 == 0.75 and n2 == 6 and type(n2) is int  # 6.5 -> 6
    plan = plan_step(cfg, 2)  # what the step samples with, and the loss's constant length
    assert (plan.sampling.temperature, plan.sampling.max_new_tokens, plan.loss.max_len) == (0.75, 6, 6)
    assert to_dict(parse({"recipe": {"temperature": 0.9}}))["recipe"]["temperature"] == 0.9  # run id input
    assert run_id(parse({"recipe": {"temperature": 0.9}})) == run_id(parse({"recipe": {"temperature": 0.9}}))


@pytest.mark.parametrize("recipe, match", [
    ({"temperature": {"kind": "linear", "start": 0.0, "end": 1.0, "steps": 5}}, "temperature must be > 0"),
    ({"temperature": {"kind": "linear", "start": 0.5, "end": 1.0}}, "steps >= 1"),
    ({"max_new_tokens": {"kind": "stages", "stages": [{"step": 2, "value": 8}]}}, "first at step 1"),
    ({"max_new_tokens": {"kind": "stages", "stages": [{"step": 1, "value": 8}, {"step": 1, "value": 9}]}},
     "strictly increasing"),
    ({"max_new_tokens": {"kind": "constant", "value": 7.5}}, "integer >= 1"),
    ({"max_new_tokens": {"kind": "stages", "stages": [{"step": 1, "value": 8}, {"step": 9, "value": 3}]},
      "overlong": "soft_penalty", "overlong_buffer": 4}, "overlong_buffer"),
    ({"temperature": {"kind": "cosine"}}, "allowed values"),
    ({"temperature": {"kind": "linear", "slope": 1}}, "unknown key"),
])
def test_bad_schedules_are_config_errors(recipe, match):
    with pytest.raises(ConfigError, match=match):
        parse({"recipe": recipe})


def run(cfg, path):
    assert trainer.train(cfg, str(path), progress=False) == "completed"
    return RunStore(path)


def test_trainer_logs_the_scheduled_temperature(tmp_path):
    sched = "recipe.temperature={kind: stages, stages: [{step: 1, value: 0.7}, {step: 4, value: 1.2}]}"
    store = run(load("configs/toy.yaml", ["steps=6", "eval.every=0", sched]), tmp_path / "s")
    rows = store.read("metrics")
    assert [r["train/temperature"] for r in rows] == [0.7, 0.7, 0.7, 1.2, 1.2, 1.2]
    assert [r["train/max_new_tokens"] for r in rows] == [2] * 6
    # a constant schedule at the plain value trains exactly like the plain value
    a = run(load("configs/toy.yaml", ["steps=6", "eval.every=0", "recipe.temperature=0.7"]), tmp_path / "a")
    b = run(load("configs/toy.yaml", ["steps=6", "eval.every=0", "recipe.temperature={kind: constant, value: 0.7}"]),
            tmp_path / "b")
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]  # noqa: E731
    assert strip(a.read("metrics")) == strip(b.read("metrics"))
    assert strip(rows[:3]) == strip(a.read("metrics"))[:3]  # same as plain 0.7 until the stage changes


def test_trainer_scheduled_max_new_tokens_on_a_real_lm(tmp_path):
    cfg = parse({"model": {"path": "models/tiny-arith"}, "device": "cpu",
                 "task": {"num_train": 16, "num_heldout": 4, "digits": [1], "operators": ["+"]},
                 "prompts_per_step": 2, "steps": 3, "checkpoint_every": 0,
                 "eval": {"every": 0, "n_samples": 2, "ks": [1]},
                 "recipe": {"group_size": 2, "max_new_tokens": {"kind": "linear", "start": 2, "end": 6, "steps": 3}}})
    rows = run(cfg, tmp_path).read("metrics")
    assert [r["train/max_new_tokens"] for r in rows] == [2, 4, 6]
    assert all(r["train/completion_len_max"] <= r["train/max_new_tokens"] for r in rows)
