"""What a run id hashes: every field that can change a computed number, and nothing else. Ids issued by earlier
versions stay valid (a rerun recognises finished work), presets are labels, execution settings are left out."""

import dataclasses

import pytest

from ablate import config as C
from ablate.experiments import sweep as S

# run ids issued by main at dd87ed1 (before rollout.*, task.environment, task.episode, recipe.mask_env_tokens
# and recipe.credit existed), computed there from these same configs
ISSUED = {
    "b24dfc35b9bb": {},
    "0bf5d9867ab8": {"task": {"name": "mixture", "mixture": [{"name": "arithmetic", "weight": 2.0},
                                                              {"name": "arithmetic", "digits": [3], "weight": 1.0}]},
                     "model": {"lora": {"r": 4}},
                     "recipe": {"kl_coef": 0.05, "kl_placement": "reward", "kl_estimator": "k1"}},
    "f402fa62618c": {"task": {"name": "toy_addition"}, "seed": 3,
                     "recipe": {"max_new_tokens": 2, "baseline": "leave_one_out", "scale": "none"},
                     "optim": {"optimizer": "normalized_sgd", "lr": 1.0}},
}


@pytest.mark.parametrize("issued", ISSUED)
def test_ids_issued_before_fields_were_added_are_still_the_ids_of_those_configs(issued):
    cfg = C.build_section(C.RunConfig, ISSUED[issued], "", None)
    assert C.run_id(cfg) == issued, ("a config that does not use a newly added field changed its run id: "
                                     "list the new field in config.ADDED_LATER")


@pytest.mark.parametrize(("section", "value"), [("rollout", {"engine": "vllm"}), ("task.environment", "calculator"),
                                                ("task.episode", {"max_turns": 5}),
                                                ("recipe.mask_env_tokens", False), ("recipe.credit", "turn")])
def test_a_field_added_later_is_hashed_once_it_leaves_its_default(section, value):
    data = C.to_dict(C.RunConfig())
    C.set_dotted(data, section, value)
    assert C.hash_config(data) != C.hash_config(C.to_dict(C.RunConfig()))


@pytest.mark.parametrize("preset", C.PRESETS)
def test_a_preset_and_its_recipe_written_out_key_by_key_are_one_run(preset):
    named = C.parse({"preset": preset, "recipe": {"group_size": 4}})
    written = C.parse({"recipe": {**C.PRESETS[preset], "group_size": 4}})
    assert named.preset == preset and written.preset is None  # the label is kept for reports and W&B
    assert named.recipe == written.recipe
    assert C.run_id(named) == C.run_id(written)


def test_execution_settings_are_not_hashed_and_everything_else_is():
    base = C.RunConfig()
    assert C.run_id(dataclasses.replace(base, compute=C.ComputeConfig(micro_batch_tokens=512, threads=2))) \
        == C.run_id(base)
    assert C.run_id(dataclasses.replace(base, tracking=C.TrackingConfig(timeout_s=3.0))) == C.run_id(base)
    assert C.run_id(dataclasses.replace(base, seed=1)) != C.run_id(base)
    assert C.run_id(dataclasses.replace(base, recipe=C.RecipeConfig(eps_high=0.28))) != C.run_id(base)


def test_keys_written_in_a_config_beat_its_preset():
    cfg = C.parse({"preset": "grpo", "recipe": {"kl_coef": 0.01}})
    assert cfg.recipe.kl_coef == 0.01 and cfg.recipe.kl_estimator == "k3"


def _sweep(tmp_path, body: str):
    (tmp_path / "base.yaml").write_text("preset: grpo\nrecipe:\n  eps_high: 0.3\n  kl_coef: 0.0\n  group_size: 4\n"
                                        "task:\n  name: toy_addition\n")
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase:\n  config: base.yaml\n  overrides:\n    recipe.max_new_tokens: 2\n" + body)
    return {r.arm: r.config for r in S.expand(S.load_spec(spec))}


def test_a_sweep_merges_presets_as_train_does_the_most_specific_preset_under_every_written_key(tmp_path):
    runs = _sweep(tmp_path, "arms:\n  grpo: {}\n  dr: {preset: dr_grpo}\n  dr_eps: {preset: dr_grpo, recipe.eps_high: 0.25}\n")
    # the arm's preset replaces the base file's (presets do not stack) and stays under the file's own keys
    assert runs["dr"].preset == "dr_grpo" and runs["grpo"].preset == "grpo"
    assert runs["dr"].recipe.scale == "none" and runs["dr"].recipe.loss_agg == "seq_mean_token_sum_norm"
    assert runs["dr"].recipe.eps_high == 0.3 and runs["grpo"].recipe.eps_high == 0.3  # dr_grpo's is 0.2
    assert runs["dr_eps"].recipe.eps_high == 0.25
    # the same as `ablate train` on the equivalent config
    same = C.parse({"preset": "dr_grpo", "recipe": {"eps_high": 0.3, "kl_coef": 0.0, "group_size": 4,
                                                    "max_new_tokens": 2},
                    "task": {"name": "toy_addition"}})
    assert C.run_id(runs["dr"]) == C.run_id(same)
