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
