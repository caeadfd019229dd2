"""Sweep specs: parsing, expansion (exact run lists), validation and every bad-spec message."""

import dataclasses
import json
import time
import warnings
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ablate import config as C
from ablate.cli.sweep import sweep_app
from ablate.experiments.sweep import SpecError, SweepWarning, expand, load_spec, parse_spec

TOY = str(Path("configs/toy.yaml").resolve())


def spec(**kw):
    base = kw.pop("base", {"config": TOY, "overrides": {"steps": 10}})
    return parse_spec({"name": "t", "base": base, **kw}, "spec.yaml", Path("."))


def points(runs, *keys):
    return [tuple([r.arm] * ("arm" in keys) + [C.to_dict(r.config)["seed"] if k == "seed" else _get(r.config, k)
                                              for k in keys if k != "arm"]) for r in runs]


def _get(cfg, dotted):
    for p in dotted.split("."):
        cfg = getattr(cfg, p)
    return cfg


def test_grid_x_zip_x_arms_x_seeds_exact_order():
    runs = expand(spec(
        arms={"grpo": {"preset": "grpo", "recipe.kl_coef": 0.0}, "dr": {"preset": "dr_grpo"}},
        grid={"recipe.eps_high": [0.2, 0.28]},
        zip=[{"recipe.group_size": [4, 8], "prompts_per_step": [32, 16]}],
        seeds=[0, 1]))
    keys = ("arm", "recipe.eps_high", "recipe.group_size", "prompts_per_step", "seed")
    assert points(runs, *keys) == [
        (arm, eps, g, b, s) for arm in ("grpo", "dr") for eps in (0.2, 0.28) for g, b in ((4, 32), (8, 16))
        for s in (0, 1)]
    assert all(r.run_id == C.run_id(r.config) for r in runs)
    assert len({r.run_id for r in runs}) == 16
    # the arm's preset wins over the base file's preset; keys written in the spec win over presets
    dr = runs[-1].config.recipe
    assert (dr.scale, dr.loss_agg, runs[0].config.recipe.kl_coef) == ("none", "seq_mean_token_sum_norm", 0.0)
    # toggles: the swept keys whose value varies (kl_coef is 0 in both arms; the arm column covers presets)
    assert runs[0].toggles == {"recipe.eps_high": 0.2, "recipe.group_size": 4, "prompts_per_step": 32}
    assert runs[0].config.tracking.wandb.group == "t"


def test_ids_stable_and_match_config_parse():
    a, b = expand(spec(grid={"recipe.eps_high": [0.2, 0.28]}, seeds=[3])), \
        expand(spec(grid={"recipe.eps_high": [0.2, 0.28]}, seeds=[3]))
    assert [r.run_id for r in a] == [r.run_id for r in b]
    direct = C.load(TOY, ["steps=10", "recipe.eps_high=0.28", "seed=3", "tracking.wandb.group=t"])
    assert a[1].run_id == C.run_id(direct)
    # the same config, plus a readable W&B name (tracking is not part of the run id)
    assert a[1].config.tracking.wandb.name == "grpo-eps_high=0.28-s3"
    assert a[1].config == dataclasses.replace(direct, tracking=a[1].config.tracking)


def test_exclude_include_and_duplicates_collapse():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runs = expand(spec(
            grid={"recipe.scale": ["none", "group"], "recipe.eps_high": [0.2, 0.28]},
            exclude=[{"recipe.scale": "none", "recipe.eps_high": [0.28]}],
            include=[{"recipe.scale": "batch", "recipe.eps_high": 0.3},
                     {"recipe.scale": "group", "recipe.eps_high": 0.2}],  # a duplicate of a grid point
            seeds=[0]))
    assert points(runs, "recipe.scale", "recipe.eps_high") == [
        ("none", 0.2), ("group", 0.2), ("group", 0.28), ("batch", 0.3)]


def test_duplicates_from_values_that_resolve_equal():
    runs = expand(spec(grid={"recipe.eps_high": [0.2, 0.2, 0.28]}, seeds=[0, 0]))
    assert points(runs, "recipe.eps_high", "seed") == [(0.2, 0), (0.28, 0)]


def test_exclude_on_arm_and_seed_and_matching_nothing_warns():
    s = spec(arms={"a": {"recipe.eps_high": 0.2}, "b": {"recipe.eps_high": 0.28}}, seeds=[0, 1],
             exclude=[{"arm": "b", "seed": 1}, {"recipe.eps_high": 0.5}])
    with pytest.warns(SweepWarning, match=r"spec.yaml: exclude\[1\]: .*matches no run"):
        runs = expand(s)
    assert points(runs, "arm", "seed") == [("a", 0), ("a", 1), ("b", 0)]


def test_invalid_runs_refuse_the_whole_sweep_listing_each():
    s = spec(grid={"recipe.group_size": [1, 4], "recipe.baseline": ["group_mean", "leave_one_out", "none"]},
             base={"config": TOY, "overrides": {"recipe.scale": "none"}})
    with pytest.raises(SpecError) as e:
        expand(s)
    msg = str(e.value)
    assert msg.startswith("spec.yaml: 2 invalid run(s)")
    assert "recipe.group_size=1, recipe.baseline='group_mean'" in msg
    assert "recipe.group_size=1, recipe.baseline='leave_one_out'" in msg
    # excluding the invalid combinations makes the same sweep valid
    s.exclude = [{"recipe.group_size": 1, "recipe.baseline": ["group_mean", "leave_one_out"]}]
    assert len(expand(s)) == 4


@pytest.mark.parametrize("raw, message", [
    ({"bogus": 1}, "spec.yaml: bogus: unknown key"),
    ({"grid": {"recipe.eps_high": 0.2}}, "spec.yaml: grid.recipe.eps_high: expected a list of values"),
    ({"grid": {"recipe.eps_high": []}}, "spec.yaml: grid.recipe.eps_high: empty axis"),
    ({"grid": {"recipe.eps_hgh": [0.2]}}, "spec.yaml: grid.recipe.eps_hgh[0]: 'recipe.eps_hgh' is not a config field"),
    ({"grid": {"recipe": [{}]}}, "spec.yaml: grid.recipe[0]: 'recipe' is not a config field"),
    ({"grid": {"recipe.eps_high": [0.2, "wide"]}}, "spec.yaml: grid.recipe.eps_high[1]: wrong type"),
    ({"grid": {"recipe.scale": ["group", "sometimes"]}}, "spec.yaml: grid.recipe.scale[1]: wrong type"),
    ({"zip": [{"recipe.group_size": [4, 8, 16], "prompts_per_step": [32, 16]}]},
     "spec.yaml: zip[0]: zipped lists must have equal length; got recipe.group_size: 3, prompts_per_step: 2"),
    ({"grid": {"seed": [0, 1]}}, "spec.yaml: grid.seed: use `seeds:`"),
    ({"grid": {"steps": [5]}, "zip": [{"steps": [6]}]}, "spec.yaml: zip[0].steps: 'steps' is already swept"),
    ({"seeds": [0, "one"]}, "spec.yaml: seeds[1]: expected int, got 'one'"),
    ({"seeds": []}, "spec.yaml: seeds: [] is not allowed; allowed: a list of at least 1"),
    ({"arms": {"x": {"preset": "ppo2"}}}, "spec.yaml: arms.x.preset: unknown preset 'ppo2'"),
    ({"arms": {"x": {"recipe.nope": 1}}}, "spec.yaml: arms.x.recipe.nope: 'recipe.nope' is not a config field"),
    ({"exclude": [{"arm": "nope"}]}, "spec.yaml: exclude[0].arm: unknown arm 'nope'"),
    ({"exclude": [{"recipe.eps_hi": 0.2}]}, "spec.yaml: exclude[0].recipe.eps_hi: 'recipe.eps_hi' is not a config"),
    ({"include": [{"steps": "ten"}]}, "spec.yaml: include[0].steps: wrong type"),
    ({"executor": {"name": "k8s"}}, "spec.yaml: executor.name: 'k8s' is not allowed; allowed values: 'local', 'slurm', 'debug'"),
    ({"executor": {"max_parallel": "2"}}, "spec.yaml: executor.max_parallel: expected int, got '2'"),
    ({"executor": {"gpus": 1}}, "spec.yaml: executor.gpus: unknown key"),
    ({"slurm_profile": "nowhere.yaml"}, "spec.yaml: slurm_profile: no such profile file"),
    ({"base": {"config": "nowhere.yaml"}}, "spec.yaml: base.config: no such config file"),
    ({"base": {"config": TOY, "overrides": {"optim.lr": "fast"}}}, "spec.yaml: base.overrides.optim.lr: wrong type"),
    ({"name": ""}, "spec.yaml: name: '' is not allowed; allowed: one line of text of 1..128 characters"),
])
def test_bad_specs_name_the_file_and_the_key(raw, message):
    data = {"name": "t", "base": {"config": TOY}, **raw}
    with pytest.raises(SpecError) as e:
        expand(parse_spec(data, "spec.yaml", Path(".")))
    assert str(e.value).startswith(message), str(e.value)


def test_load_spec_resolves_base_relative_to_the_spec(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "base.yaml").write_text(Path(TOY).read_text())
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "rel", "base": {"config": "cfg/base.yaml"}, "seeds": [0, 1]}))
    s = load_spec(p)
    assert s.out == Path("runs/rel") and len(expand(s)) == 2
    p.write_text("name: [unclosed")
    with pytest.raises(SpecError, match=f"{p}: not valid YAML"):
        load_spec(p)


def test_expanding_10k_runs_is_fast():
    s = spec(grid={"recipe.eps_high": [0.2 + i * 1e-3 for i in range(100)], "optim.lr": [0.1 * (i + 1) for i in range(10)]},
             seeds=list(range(10)))
    t = time.perf_counter()
    runs = expand(s)
    assert len(runs) == 10_000
    assert time.perf_counter() - t < 10  # target < 2 s on an idle core (benchmarks/); generous on shared CI


def test_shipped_specs_expand():
    for path in sorted(p for p in Path("sweeps").glob("*.yaml") if not p.name.startswith("tune_")):
        runs = expand(load_spec(path))
        assert runs, path


def test_cli_plan_and_bad_spec_exit_code(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"name": "g", "base": {"config": TOY}, "grid": {"recipe.eps_high": [0.2, 0.28]},
                                    "out": str(tmp_path / "runs")}))
    res = CliRunner().invoke(sweep_app, ["plan", str(good)])
    assert res.exit_code == 0 and "2 runs" in res.output and "recipe.eps_high" in res.output
    assert not (tmp_path / "runs").exists()  # plan writes nothing
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"name": "b", "base": {"config": TOY}, "grid": {"recipe.eps_hgh": [0.2]},
                               "out": str(tmp_path / "runs")}))
    for cmd in ("plan", "run"):
        res = CliRunner().invoke(sweep_app, [cmd, str(bad)])
        assert res.exit_code == 2 and "bad.yaml: grid.recipe.eps_hgh" in res.output, res.output
    assert not (tmp_path / "runs").exists()
