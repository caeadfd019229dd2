"""Search specs (ablate/experiments/search.py): checked before any trial starts; trial configs are sweep arms."""

import importlib.util
from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from ablate.cli.tune import best_snippet, tune_app
from ablate.experiments import search
from ablate.experiments.sweep import SpecError, expand, load_spec

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
TOY = str(ROOT / "configs" / "toy.yaml")


def spec_dict(**changes) -> dict:
    d = {"name": "t", "base": {"config": TOY, "overrides": {"steps": 10, "eval.every": 5,
                                                             "tracking.wandb.mode": "disabled"}},
         "search": {"optim.lr": {"type": "float", "low": 0.01, "high": 2.0, "log": True},
                    "recipe.scale": ["group", "none"]},
         "objective": {"metric": "eval/pass@1_exact"}, "trials": 3}
    d.update(changes)
    return d


def write(tmp_path, d, name="spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


BAD = [  # (change to the spec, the key named in the message, words of the message)
    (dict(serach={}), "serach", "unknown key"),
    (dict(search={"optim.weight_decay": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}),
     "search.optim.weight_decay.low", "log range needs low > 0"),
    (dict(search={"optim.lr": {"type": "float", "low": 0.0, "high": 1.0}}), "search.optim.lr.low",
     "optim.lr: 0.0 is not allowed; allowed: a number > 0"),  # bounds lie in the field's domain
    (dict(search={"optim.lr": {"type": "float", "low": 0.1, "high": float("inf")}}), "search.optim.lr.high",
     "inf is not allowed; allowed: a finite number"),
    (dict(search={"optim.lr": {"type": "float", "low": [0.1], "high": 1.0}}), "search.optim.lr.low", "expected int"),
    (dict(search={"recipe.scale": {"type": "categorical", "choices": []}}), "search.recipe.scale.choices",
     "a list of at least 1 item"),
    (dict(search={"recipe.scale": []}), "search.recipe.scale.choices", "a list of at least 1 item"),
    (dict(search={"optim.learning_rate": [0.1, 1.0]}), "search.optim.learning_rate", "not a config field"),
    (dict(search={"optim.lr": {"type": "float", "low": 0.1, "high": 1.0, "logg": True}}), "search.optim.lr.logg",
     "unknown key"),
    (dict(search={"recipe.scale": ["group", "sometimes"]}), "search.recipe.scale.choices[1]", "not allowed"),
    (dict(search={"preset": ["grpo", "ppo2"]}), "search.preset.choices[1]", "allowed: one of grpo, dr_grpo"),
    (dict(search={"optim.lr": {"type": "float", "low": 1.0, "high": 0.5}}), "search.optim.lr", "low < high"),
    (dict(search={"recipe.kl_estimator": {"type": "categorical", "choices": ["k1"],
                                          "when": {"recipe.kl_coef": {"gt": 0}}},
                  "recipe.kl_coef": [0.0, 0.1]}), "search.recipe.kl_estimator.when.recipe.kl_coef", "listed before"),
    (dict(objective={"metric": "eval/pass@4"}), "objective.metric", "not a held-out metric"),
    (dict(objective={"metric": "eval/pass@1", "direction": "up"}), "objective.direction", "allowed values: 'maximize', 'minimize'"),
    (dict(sampler={"name": "bayes"}), "sampler.name", "allowed values: 'tpe', 'random'"),
    (dict(sampler={"name": "random", "n_startup_trials": 3}), "sampler.n_startup_trials", "not an option of random"),
    (dict(pruner={"name": "median", "n_startup_trials": -1}), "pruner.n_startup_trials", "allowed: an integer >= 0"),
    (dict(heartbeat={"interval_s": 0}), "heartbeat.interval_s", "allowed: an integer >= 1"),
    (dict(executor={"timeout_min": -5}), "executor.timeout_min", "allowed: a number > 0"),
    (dict(objective=["eval/pass@1"]), "objective", "expected a mapping"),
    (dict(sampler={"name": "grid"}), "search.optim.lr", "needs a `step`"),
    (dict(trials=0), "trials", "integer >= 1"),
    (dict(storage="study.db"), "storage", "journal:PATH"),
    (dict(storage=["sqlite:///x.db"]), "storage", "expected str"),
    (dict(base={"config": TOY, "overrides": {"optim.lrr": 1.0}}), "base.overrides.optim.lrr", "not a config field"),
]


@pytest.mark.parametrize("change, key, words", BAD, ids=[b[1] for b in BAD])
def test_bad_spec_names_file_and_key(tmp_path, change, key, words):
    p = write(tmp_path, spec_dict(**change))
    with pytest.raises(SpecError) as e:
        search.load_search(p, out=tmp_path / "out")
    assert str(e.value).startswith(f"{p}: {key}: "), str(e.value)
    assert words in str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(importlib.util.find_spec("cmaes") is not None, reason="cmaes is installed")
def test_cmaes_without_package_is_a_spec_error(tmp_path):
    p = write(tmp_path, spec_dict(sampler={"name": "cmaes"}))
    with pytest.raises(SpecError, match="pip install cmaes"):
        search.load_search(p)


def test_cli_bad_spec_exits_2_before_any_study(tmp_path):
    p = write(tmp_path, spec_dict(search={"recipe.scale": []}))
    res = CliRunner().invoke(tune_app, [str(p), "--workers", "2", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert f"{p}: search.recipe.scale.choices: [] is not allowed; allowed: a list of at least 1" in res.output
    assert not (tmp_path / "out").exists()  # no study, no run folder


def test_conditional_params_and_defaults(tmp_path):
    # recipe.kl_estimator only when recipe.kl_coef > 0 (base: the quickstart LM config, which allows KL)
    d = spec_dict(base={"config": str(ROOT / "configs" / "quickstart.yaml")},
                  search={"recipe.kl_coef": [0.0, 0.01, 0.05],
                          "recipe.kl_estimator": {"type": "categorical", "choices": ["k1", "k2", "k3"],
                                                  "when": {"recipe.kl_coef": {"gt": 0}}},
                          "recipe.dynamic_sampling": [False, True],
                          "preset": ["grpo", "dr_grpo"]},
                  objective={"metric": "eval/pass@1", "last_k": 2})
    spec = search.load_search(write(tmp_path, d))
    assert spec.sampler == {"name": "tpe"} and spec.pruner == {"name": "median"} and spec.direction == "maximize"
    assert spec.storage == f"sqlite:///{(Path.cwd() / 'runs' / 't' / 'study.db')}"
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(40):
        values = search.suggest(study.ask(), spec.params)
        assert ("recipe.kl_estimator" in values) == (values["recipe.kl_coef"] > 0)
        seen.add(values.get("recipe.kl_estimator"))
        runs = search.trial_runs(spec, values)
        assert runs[0].config.recipe.kl_coef == values["recipe.kl_coef"]  # the search beats the preset
        assert runs[0].config.tracking.wandb.job_type == "tune-trial"
    assert seen == {None, "k1", "k2", "k3"}


def test_best_snippet_is_a_sweep_reproducing_the_trial_run_ids(tmp_path):
    spec = search.load_search(write(tmp_path, spec_dict(seeds=[0, 1])))
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    runs = search.trial_runs(spec, search.suggest(trial, spec.params), trial.number)
    study.tell(trial, 0.5)
    text = best_snippet(spec, study.best_trial)
    sweep = load_spec(write(tmp_path, yaml.safe_load(text), "best.yaml"))
    assert [r.run_id for r in expand(sweep)] == [r.run_id for r in runs]


def test_objective_final_or_mean_of_last_k():
    rows = [{"step": 0, "m": 9.0}, {"step": 5, "m": 1.0}, {"step": 10, "m": 2.0}, {"step": 15, "m": 4.0}]
    assert search.objective(rows, "m", 1) == 4.0
    assert search.objective(rows, "m", 2) == 3.0
    assert search.objective(rows, "m", 10) == pytest.approx(7 / 3)  # never the untrained step-0 row


def test_grid_sampler_default_budget_is_the_grid(tmp_path):
    d = spec_dict(search={"optim.lr": {"type": "float", "low": 0.5, "high": 1.5, "step": 0.5},
                          "recipe.group_size": {"type": "int", "low": 4, "high": 8, "step": 4}},
                  sampler={"name": "grid"})
    del d["trials"]
    spec = search.load_search(write(tmp_path, d))
    assert spec.n_trials == 6
    assert spec.params[0].grid() == [0.5, 1.0, 1.5]


def test_grid_points_skip_inactive_conditionals_and_are_enqueued_once(tmp_path):
    d = spec_dict(search={"recipe.kl_coef": [0.0, 0.04],
                          "recipe.kl_estimator": {"type": "categorical", "choices": ["k1", "k3"],
                                                  "when": {"recipe.kl_coef": {"gt": 0}}}},
                  sampler={"name": "grid", "seed": 0})
    del d["trials"]
    spec = search.load_search(write(tmp_path, d), out=tmp_path / "runs")
    # kl_coef 0 once (no estimator), 0.04 with each estimator: 3 configurations, not 2 x 2
    assert search.grid_points(spec.params) == [{"recipe.kl_coef": 0.0},
                                               {"recipe.kl_coef": 0.04, "recipe.kl_estimator": "k1"},
                                               {"recipe.kl_coef": 0.04, "recipe.kl_estimator": "k3"}]
    assert spec.n_trials == 3
    study = search.open_study(spec, create=True)
    search.open_study(spec, create=True)                    # a second launch enqueues nothing more
    waiting = study.get_trials()
    assert [t.state.name for t in waiting] == ["WAITING"] * 3
    assert sorted(map(str, (t.system_attrs["fixed_params"] for t in waiting))) == \
        sorted(map(str, search.grid_points(spec.params)))
    d["trials"] = 4
    with pytest.raises(search.SpecError, match="trials: 4 is more than the grid's 3 configurations"):
        search.load_search(write(tmp_path, d))


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").glob("tune_*.yaml")), ids=lambda p: p.name)
def test_shipped_search_specs_load(path):
    spec = search.load_search(path)
    assert spec.params and spec.n_trials >= 1
