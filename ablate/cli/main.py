"""The `ablate` command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Ablation studies of RLVR recipes.")


@app.command()
def train(
    config: Path = typer.Argument(..., help="YAML run config"),
    set_: list[str] = typer.Option([], "--set", help="override a dotted key, e.g. recipe.eps_high=0.28"),
    out: Path | None = typer.Option(None, "--out", help="run folder (default runs/<run_id>)"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
):
    """Train one run; resumes if OUT holds a checkpoint of the same config."""
    from ablate.config import ConfigError, load, run_id

    try:
        cfg = load(config, set_)
    except ConfigError as err:
        typer.secho(f"error: {err}", fg="red", err=True)
        raise typer.Exit(2) from None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ablate.train.trainer import train as run_train

    out = out or Path("runs") / run_id(cfg)
    state = run_train(cfg, str(out), progress=not quiet)
    typer.echo(f"{state}: {out}")
    raise typer.Exit(0 if state == "completed" else 1)


@app.command("base-model")
def base_model(
    out: Path = typer.Option(Path("models/tiny-arith"), "--out", help="folder to write the model into"),
    seed: int = typer.Option(0, "--seed"),
):
    """Build (or reuse, if cached) the tiny local base model warm-started on arithmetic."""
    from ablate.train.models import base_model_cli

    base_model_cli(str(out), seed)


@app.command()
def difficulty(
    config: Path = typer.Argument(..., help="YAML run config"),
    set_: list[str] = typer.Option([], "--set", help="override a dotted key"),
    n: int | None = typer.Option(None, "--n", help="samples per prompt (default eval.n_samples)"),
    temperature: float | None = typer.Option(None, "--temperature", help="default: recipe.temperature (step 1)"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
):
    """Per-prompt pass rates of the base model on the training prompts (cached); the histogram before and
    after `task.pass_rate_band`."""
    from ablate.config import ConfigError, load

    try:
        cfg = load(config, set_)
    except ConfigError as err:
        typer.secho(f"error: {err}", fg="red", err=True)
        raise typer.Exit(2) from None
    if n is not None and n < 1 or temperature is not None and temperature <= 0:
        typer.secho("error: --n must be >= 1 and --temperature > 0", fg="red", err=True)
        raise typer.Exit(2)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ablate.train.difficulty import band_defaults, estimate, histogram

    n0, t0 = band_defaults(cfg)
    rates, path = estimate(cfg, n or n0, temperature or t0, progress=not quiet)
    values = list(rates.values())
    typer.echo(f"{len(values)} prompts, mean pass rate {sum(values) / len(values):.3f}; cache: {path}")
    typer.echo("pass-rate bins [0.0, 0.1) ... [0.9, 1.0]: " + " ".join(map(str, histogram(values))))
    if cfg.task.pass_rate_band:
        lo, hi = cfg.task.pass_rate_band
        kept = [v for v in values if lo <= v <= hi]
        typer.echo(f"task.pass_rate_band [{lo}, {hi}] keeps {len(kept)}: " + " ".join(map(str, histogram(kept))))


from ablate.cli.report import report  # noqa: E402
from ablate.cli.sweep import sweep_app  # noqa: E402
from ablate.cli.tune import tune_app  # noqa: E402

app.add_typer(sweep_app, name="sweep")
app.add_typer(tune_app, name="tune")
app.command("report")(report)


def main() -> None:  # console script entry point
    sys.exit(app())
