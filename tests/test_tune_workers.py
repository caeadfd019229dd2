"""Two `ablate tune` processes on one SQLite study (issue 17, item 9): they hold different worker slots, so
their samplers are seeded differently and they propose different trials."""

import subprocess
import sys
from pathlib import Path

import optuna
import yaml
from typer.testing import CliRunner

from ablate.cli.main import app

ABLATE = [sys.executable, "-c", "from ablate.cli.main import main; main()"]


def test_two_concurrent_tune_processes_propose_different_trials(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "two", "out": str(tmp_path / "runs"), "trials": 6, "seeds": [0],
        "base": {"config": str(Path("configs/toy.yaml").resolve()),
                 "overrides": {"steps": 30, "eval.every": 10, "tracking.wandb.mode": "disabled"}},
        "search": {"optim.lr": {"type": "float", "low": 0.001, "high": 3.0, "log": True}},
        "objective": {"metric": "eval/pass@1_exact", "direction": "maximize"},
        "sampler": {"name": "random", "seed": 0}, "pruner": {"name": "none"}, "executor": {"name": "local", "workers": 1}}))
    procs = [subprocess.Popen([*ABLATE, "tune", "run", str(spec), "--executor", "inline"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    study = optuna.load_study(study_name="two", storage=f"sqlite:///{tmp_path / 'runs' / 'study.db'}")
    lrs = [t.params["optim.lr"] for t in study.trials]
    assert len(lrs) >= 6 and len(set(lrs)) == len(lrs), lrs
    assert all("worker 0" in out for out in outs)  # both asked for worker 0; the slots made them differ
    status = CliRunner().invoke(app, ["tune", "status", str(spec)])
    table = status.output.split("trials:")[0].splitlines()[1:]  # below the title line (it names the storage)
    assert status.exit_code == 0 and max(map(len, table)) <= 80, status.output  # the trials table fits a pipe
