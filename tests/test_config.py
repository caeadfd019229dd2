"""Strict parsing, presets, cross-field validation and run ids."""

import dataclasses

import pytest

from ablate.config import PRESETS, ConfigError, RunConfig, load, parse, run_id, to_dict


def test_defaults_roundtrip():
    cfg = parse({})
    assert cfg == RunConfig()
    assert parse(to_dict(cfg)) == cfg


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        parse({}).recipe.eps_high = 0.3


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"recipe\.eps_hi: unknown key; valid keys here: .*eps_high"):
        parse({"recipe": {"eps_hi": 0.3}})


def test_literal_lists_allowed_values():
    with pytest.raises(ConfigError, match=r"recipe\.baseline: 'mean' is not allowed; allowed values: 'none', 'batch_mean'"):
        parse({"recipe": {"baseline": "mean"}})


def test_wrong_type():
    with pytest.raises(ConfigError, match=r"recipe\.group_size: expected int, got 'eight'"):
        parse({"recipe": {"group_size": "eight"}})
    with pytest.raises(ConfigError, match=r"steps: expected int, got True"):
        parse({"steps": True})


def test_float_accepts_int_and_yaml_exponent_strings():
    assert parse({"optim": {"lr": 1}}).optim.lr == 1.0
    assert parse({"optim": {"lr": "1e-4"}}).optim.lr == 1e-4


@pytest.mark.parametrize("data, field", [
    ({"recipe": {"eps_low": 0.2, "eps_high": 0.1}}, "recipe.eps_high"),
    ({"recipe": {"group_size": 1, "baseline": "group_mean", "scale": "none"}}, "recipe.baseline"),
    ({"recipe": {"group_size": 1, "baseline": "leave_one_out", "scale": "none"}}, "recipe.baseline"),
    ({"recipe": {"group_size": 1, "baseline": "none", "scale": "none", "dynamic_sampling": True}},
     "recipe.dynamic_sampling"),
    ({"recipe": {"dual_clip": 0.5}}, "recipe.dual_clip"),
    ({"eval": {"n_samples": 4, "ks": [1, 8]}}, "eval.ks"),
    ({"task": {"name": "reasoning_gym"}}, "task.dataset"),
    ({"task": {"name": "toy_addition"}}, "recipe.max_new_tokens"),
    ({"recipe": {"overlong": "soft_penalty", "overlong_buffer": 8, "max_new_tokens": 8}}, "recipe.overlong_buffer"),
])
def test_validate_names_the_field(data, field):
    with pytest.raises(ConfigError) as err:
        parse(data)
    assert field in str(err.value)


def test_presets_fill_recipe_and_user_keys_win():
    cfg = parse({"preset": "dapo", "recipe": {"eps_high": 0.3}})
    assert cfg.recipe.eps_high == 0.3 and cfg.recipe.dynamic_sampling and cfg.recipe.loss_agg == "token_mean"
    for name in PRESETS:
        parse({"preset": name})  # every preset is valid on its own
    with pytest.raises(ConfigError, match="unknown preset 'ppo2'; allowed values: grpo, dr_grpo"):
        parse({"preset": "ppo2"})


def test_run_id_is_content_hash():
    a, b = parse({"seed": 1}), parse({"seed": 1})
    assert run_id(a) == run_id(b)
    assert run_id(a) != run_id(parse({"seed": 2}))
    assert run_id(a) == run_id(parse({"seed": 1, "tracking": {"wandb": {"mode": "disabled"}}}))
    # a preset and the same explicit values resolve to the same run
    assert run_id(parse({"preset": "dr_grpo"})) == run_id(parse({"preset": "dr_grpo", **{"recipe": PRESETS["dr_grpo"]}}))


def test_load_file_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("preset: grpo\nrecipe:\n  eps_high: 0.25\n")
    cfg = load(p, ["recipe.eps_high=0.28", "seed=3", "eval.ks=[1, 2]"])
    assert (cfg.recipe.eps_high, cfg.seed, cfg.eval.ks) == (0.28, 3, (1, 2))
    with pytest.raises(ConfigError, match=f"{p}: recipe.nope: unknown key"):
        load(p, ["recipe.nope=1"])
    with pytest.raises(ConfigError, match="no such config file"):
        load(tmp_path / "missing.yaml")
