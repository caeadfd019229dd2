"""`task.rg_config`: a reasoning-gym dataset's own configuration, validated against its config class."""

import re

import pytest

from ablate.config import ConfigError, parse, run_id, to_dict
from ablate.tasks import make_task


def rg(**rg_config):
    return parse({"task": {"name": "reasoning_gym", "dataset": "chain_sum", "num_train": 30, "num_heldout": 8,
                           "rg_config": rg_config}})


def terms(question):
    return len(re.findall(r"\d+", question.split(":")[-1]))


def test_rg_config_reaches_the_dataset():
    easy = make_task(rg(min_terms=2, max_terms=2, min_digits=1, max_digits=1).task)
    hard = make_task(rg(min_terms=5, max_terms=5, min_digits=3, max_digits=3).task)
    for split in ("train", "heldout"):
        assert {terms(p.prompt) for p in easy.problems(split)} == {2}
        assert {terms(p.prompt) for p in hard.problems(split)} == {5}
        assert all(len(n) <= 1 for p in easy.problems(split) for n in re.findall(r"\d+", p.prompt.split(":")[-1]))
    p = easy.problems("train")[0]
    assert easy.score(p, f"<answer>{p.answer}</answer>") == 1.0


def test_rg_config_round_trips_and_changes_the_run_id():
    cfg = rg(min_terms=2, max_terms=3)
    assert parse(to_dict(cfg)) == cfg and isinstance(hash(cfg.task), int)  # still hashable
    assert run_id(cfg) != run_id(rg()) and run_id(cfg) == run_id(rg(min_terms=2, max_terms=3))


@pytest.mark.parametrize("task, match", [
    ({"rg_config": {"min_termz": 2}}, "unknown key.*min_termz.*valid keys: min_terms"),
    ({"rg_config": {"min_terms": 5, "max_terms": 2}}, "rejected by ChainSumConfig"),
    ({"rg_config": {"seed": 1}}, "must not set seed or size"),
    ({"rg_config": [1, 2]}, "expected a mapping"),
    ({"name": "arithmetic", "rg_config": {"min_terms": 2}}, "only defined for task.name='reasoning_gym'"),
])
def test_bad_rg_config_is_a_config_error(task, match):
    with pytest.raises(ConfigError, match=match):
        parse({"task": {"name": "reasoning_gym", "dataset": "chain_sum", **task}})
