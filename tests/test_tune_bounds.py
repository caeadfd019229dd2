"""`ablate tune status` warns when the best value sits at a bound of its search range; `ablate tune
confirm` writes a sweep rerunning the best trials and the baseline on fresh seeds."""

from ablate.cli.tune import bound_warnings
from ablate.experiments.search import Param

PARAMS = [Param("optim.lr", "float", 1e-6, 1e-3, log=True), Param("recipe.eps_high", "float", 0.2, 0.4),
          Param("recipe.group_size", "int", 4, 16), Param("recipe.scale", "categorical", choices=("group", "none"))]


def test_values_at_a_bound_are_warned_inside_are_not():
    # lr 9e-4: log position (log 9e-4 - log 1e-6) / (log 1e-3 - log 1e-6) = 0.985 -> upper bound
    w = bound_warnings(PARAMS, {"optim.lr": 9e-4, "recipe.eps_high": 0.3, "recipe.group_size": 4,
                                "recipe.scale": "none"})
    assert len(w) == 2
    assert w[0].startswith("best optim.lr = 0.0009 sits at the upper bound") and "(log scale)" in w[0]
    assert w[1].startswith("best recipe.group_size = 4 sits at the lower bound of the search range [4, 16]")
    # 3e-5 is in the middle of the log range (position 0.49) though near the bottom on a linear scale
    assert bound_warnings(PARAMS, {"optim.lr": 3e-5, "recipe.eps_high": 0.25}) == []
    assert len(bound_warnings(PARAMS, {"recipe.eps_high": 0.209})) == 1      # within 5% of the range
    assert bound_warnings(PARAMS, {}) == []


def test_confirm_spec_reruns_the_best_trials_on_fresh_seeds(tmp_path):
    """The spec `ablate tune confirm` writes is a valid sweep: baseline + the K best completed trials
    (by the search's direction) on seeds the trials were not selected on."""
    import shutil
    from pathlib import Path

    import yaml

    from ablate.cli.tune import confirm_spec
    from ablate.experiments.search import load_search
    from ablate.experiments.sweep import expand, load_spec

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "configs").mkdir()
    (tmp_path / "sweeps").mkdir()
    shutil.copy(root / "configs" / "toy.yaml", tmp_path / "configs" / "toy.yaml")
    shutil.copy(root / "sweeps" / "tune_toy.yaml", tmp_path / "sweeps" / "tune_toy.yaml")
    spec = load_search(tmp_path / "sweeps" / "tune_toy.yaml", out=tmp_path / "runs" / "tune_toy")
    trials = [{"number": i, "state": st, "value": v, "params": {"optim.lr": lr, "recipe.baseline": "none"}}
              for i, (st, v, lr) in enumerate([("complete", 0.4, 0.1), ("complete", 0.7, 0.2), ("fail", None, 0.3),
                                               ("complete", 0.6, 0.4), ("pruned", 0.9, 0.5)])]
    body = confirm_spec(spec, trials, top=2, seeds=3)
    assert list(body["arms"]) == ["baseline", "trial1", "trial3"] and body["seeds"] == [1, 2, 3]
    path = tmp_path / "sweeps" / "confirm.yaml"
    path.write_text(yaml.safe_dump(body))
    runs = expand(load_spec(path))
    assert len(runs) == 9 and {r.seed for r in runs} == {1, 2, 3}
    lrs = {r.arm: r.config.optim.lr for r in runs}
    from ablate.config import load

    assert lrs == {"trial1": 0.2, "trial3": 0.4, "baseline": load(str(root / "configs" / "toy.yaml")).optim.lr}


def test_confirm_command_on_a_real_study(tmp_path):
    """`ablate tune confirm` against an Optuna SQLite study holding two completed trials."""
    import shutil
    from pathlib import Path

    import optuna
    import yaml
    from typer.testing import CliRunner

    from ablate.cli.tune import tune_app
    from ablate.experiments.search import load_search, open_study

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "configs").mkdir()
    (tmp_path / "sweeps").mkdir()
    shutil.copy(root / "configs" / "toy.yaml", tmp_path / "configs" / "toy.yaml")
    shutil.copy(root / "sweeps" / "tune_toy.yaml", tmp_path / "sweeps" / "tune_toy.yaml")
    path, out = tmp_path / "sweeps" / "tune_toy.yaml", tmp_path / "runs" / "tune_toy"
    study = open_study(load_search(path, out=out), create=True)
    lr = optuna.distributions.FloatDistribution(0.001, 3.0, log=True)
    for value, x in ((0.3, 0.01), (0.5, 0.05)):
        study.add_trial(optuna.trial.create_trial(params={"optim.lr": x}, distributions={"optim.lr": lr}, value=value))
    res = CliRunner().invoke(tune_app, ["confirm", str(path), "--top", "1", "--seeds", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    body = yaml.safe_load((tmp_path / "sweeps" / "tune_toy_confirm.yaml").read_text())
    assert body["arms"] == {"baseline": {}, "trial1": {"optim.lr": 0.05}} and body["seeds"] == [1, 2]
    assert "ablate sweep run" in res.output
    assert CliRunner().invoke(tune_app, ["confirm", str(path), "--seeds", "1", "--out", str(out)]).exit_code == 2


def test_confirm_run_reruns_a_real_study_locally(tmp_path, monkeypatch):
    """A real tiny search (SQLite, toy, one trial run inline), then `ablate tune confirm --run`: the
    confirm spec is written, its runs (baseline + the best trial on 2 fresh seeds) are launched with the
    local executor and finish, and the report compares them."""
    import shutil
    from pathlib import Path

    import yaml
    from typer.testing import CliRunner

    from ablate.cli.tune import tune_app
    from ablate.runs.store import RunStore

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "configs").mkdir()
    (tmp_path / "sweeps").mkdir()
    shutil.copy(root / "configs" / "toy.yaml", tmp_path / "configs" / "toy.yaml")
    spec = tmp_path / "sweeps" / "tiny.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "tiny", "base": {"config": "../configs/toy.yaml",
                                 "overrides": {"steps": 2, "eval.every": 0, "tracking.wandb.mode": "disabled"}},
        "search": {"optim.lr": {"type": "float", "low": 0.01, "high": 3.0, "log": True}},
        "objective": {"metric": "eval/pass@1_exact", "direction": "maximize"}, "trials": 1, "seeds": [0],
        "sampler": {"name": "random", "seed": 0}, "executor": {"name": "local", "workers": 1}}))
    monkeypatch.chdir(tmp_path)                                            # the report goes to reports/
    out = tmp_path / "runs" / "tiny"
    res = CliRunner().invoke(tune_app, ["run", str(spec), "--executor", "inline", "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(tune_app, ["confirm", str(spec), "--top", "1", "--seeds", "2", "--out", str(out), "--run"])
    assert res.exit_code == 0, res.output
    body = yaml.safe_load((tmp_path / "sweeps" / "tiny_confirm.yaml").read_text())
    assert list(body["arms"]) == ["baseline", "trial0"] and body["seeds"] == [1, 2]
    runs = sorted(p.parent for p in (tmp_path / "runs" / "tiny_confirm").rglob("status.json"))
    assert len(runs) == 4 and all(RunStore(p).status()["state"] == "completed" for p in runs)
    seeds = sorted(yaml.safe_load((p / "config.yaml").read_text())["seed"] for p in runs)
    assert seeds == [1, 1, 2, 2]                                           # fresh seeds: not the search's 0
    assert (tmp_path / "reports" / "tiny_confirm.html").exists() and "arm baseline -> trial0" in res.output
