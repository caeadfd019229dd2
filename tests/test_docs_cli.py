"""The metrics doc is rendered from the table; the CLI rejects bad configs before writing anything."""

import subprocess
import sys
from pathlib import Path

from ablate.runs.metrics import render_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_metrics_doc_in_step_with_table():
    assert (ROOT / "docs" / "metrics.md").read_text().strip() == render_markdown().strip(), \
        "run: python -m ablate.runs.metrics > docs/metrics.md"


def ablate(*args, cwd):
    return subprocess.run([sys.executable, "-c", "from ablate.cli.main import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd)


def test_bad_config_exits_nonzero_names_file_field_and_writes_nothing(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("recipe:\n  loss_agg: sum\n")
    out = tmp_path / "run"
    res = ablate("train", str(cfg), "--out", str(out), cwd=tmp_path)
    assert res.returncode == 2
    assert f"{cfg}: recipe.loss_agg: 'sum' is not allowed; allowed values: 'seq_mean_token_mean'" in res.stderr
    assert not out.exists()

    res = ablate("train", str(ROOT / "configs" / "toy.yaml"), "--set", "recipe.eps_high=0.1", "--out", str(out),
                 cwd=tmp_path)
    assert res.returncode == 2 and "recipe.eps_high must be >= recipe.eps_low" in res.stderr
    assert not out.exists()


def test_train_cli_toy(tmp_path):
    out = tmp_path / "run"
    res = ablate("train", str(ROOT / "configs" / "toy.yaml"), "--set", "steps=3", "--quiet", "--out", str(out),
                 cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"completed: {out}"
    assert {p.name for p in out.iterdir()} >= {"config.yaml", "provenance.json", "status.json", "metrics.jsonl",
                                                "evals.jsonl", "samples.jsonl"}


def test_cli_and_run_store_readers_start_without_torch():
    """`ablate --help`, `ablate sweep status` and loading runs must not wait ~3 s for torch to import."""
    import subprocess
    import sys

    code = ("import sys, ablate, ablate.cli.main, ablate.experiments.launch, ablate.analysis.load; "
            "heavy = [m for m in ('torch', 'matplotlib', 'transformers') if m in sys.modules]; "
            "assert not heavy, heavy")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_toy_run_never_imports_transformers(tmp_path):
    """A toy run (and so each worker process of a toy sweep) starts seconds faster without transformers."""
    import subprocess
    import sys

    toy = str(Path("configs/toy.yaml").resolve())
    code = ("import sys; from ablate.config import load; from ablate.train.trainer import train; "
            f"assert train(load({toy!r}, ['steps=2', 'eval.every=0', 'tracking.wandb.mode=disabled']), "
            f"{str(tmp_path / 'run')!r}, progress=False) == 'completed'; "
            "assert 'transformers' not in sys.modules, [m for m in sys.modules if 'transformers' in m][:3]")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_cli_help_conventions():
    """Usage lines name arguments as CONFIG / SPEC (not {config}), flags carry no `<bool>` placeholder,
    `--version` answers, and `ablate tune --help` shows the `ablate tune SPEC` shortcut."""
    from typer.testing import CliRunner

    from ablate.cli.main import app

    runner = CliRunner()
    commands = [["train"], ["base-model"], ["report"], ["sweep", "plan"], ["sweep", "run"], ["sweep", "status"],
                ["sweep", "cancel"], ["tune"], ["tune", "run"], ["tune", "status"], ["tune", "confirm"], ["sweep", "extend"], ["difficulty"], ["export"], []]
    for cmd in commands:
        res = runner.invoke(app, [*cmd, "--help"], prog_name="ablate", env={"COLUMNS": "100"})
        assert res.exit_code == 0, (cmd, res.output)
        assert "<bool>" not in res.output and "{" not in res.output, (cmd, res.output)
    assert "Usage: ablate train [OPTIONS] CONFIG" in runner.invoke(app, ["train", "--help"], prog_name="ablate").output
    assert "Usage: ablate sweep run [OPTIONS] SPEC" in runner.invoke(app, ["sweep", "run", "--help"], prog_name="ablate").output
    assert "ablate tune SPEC" in runner.invoke(app, ["tune", "--help"]).output
    import ablate

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"ablate {ablate.__version__}"
