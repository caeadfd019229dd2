"""The `ablate` command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Ablation studies of RLVR recipes.")


def out_problem(out: Path, flag: str) -> str | None:
    """Why `out` cannot be a folder to write into (empty, a file, not writable, a sweep root), or None."""
    if str(out).strip() in ("", "."):
        return f"{flag} {str(out)!r}: give a folder (an empty value would write into the current folder)"
    if out.exists() and not out.is_dir():
        return f"{flag} {out}: is a file, not a folder"
    if (out / "manifest.json").exists() and flag == "--out":
        return f"{flag} {out}: is a sweep's runs root (holds manifest.json); a run goes into a folder of its own"
    parent = next((p for p in [out, *out.parents] if p.exists()), Path("."))
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{flag} {out}: {parent} is not writable"
    return None


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
    from ablate.runs.store import RunFolderError
    from ablate.train.trainer import train as run_train

    out = out or Path("runs") / run_id(cfg)
    problem = out_problem(out, "--out")
    if problem:
        typer.secho(f"error: {problem}", fg="red", err=True)
        raise typer.Exit(2)
    try:
        state = run_train(cfg, str(out), progress=not quiet)
    except (RunFolderError, ConfigError) as err:  # refused before anything was written
        typer.secho(f"error: {f'{config}: ' if isinstance(err, ConfigError) else ''}{err}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{state}: {out}")
    raise typer.Exit(0 if state == "completed" else 1)


@app.command("export")
def export_cmd(
    run_dir: Path = typer.Argument(..., help="a run folder (holds config.yaml and checkpoint.pt)"),
    out: Path = typer.Option(..., "--out", help="empty or new folder for the Hugging Face model"),
):
    """Write a run's final weights as a Hugging Face model folder (from_pretrained loads it)."""
    from ablate.config import ConfigError
    from ablate.runs.store import RunFolderError

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ablate.train.export import export

    try:
        info = export(run_dir, out)
    except (ConfigError, RunFolderError) as err:
        typer.secho(f"error: {err}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"exported run {info['run_id']} at step {info['step']}/{info['steps']} ({info['state']}) -> {out}")


@app.command("base-model")
def base_model(
    out: Path = typer.Option(Path("models/tiny-arith"), "--out", help="folder to write the model into"),
    seed: int = typer.Option(0, "--seed"),
):
    """Build (or reuse, if cached) the tiny local base model warm-started on arithmetic."""
    from ablate.train.models import base_model_cli

    base_model_cli(str(out), seed)


from ablate.cli.report import report  # noqa: E402
from ablate.cli.sweep import sweep_app  # noqa: E402
from ablate.cli.tune import tune_app  # noqa: E402

app.add_typer(sweep_app, name="sweep")
app.add_typer(tune_app, name="tune")
app.command("report")(report)


def main() -> None:  # console script entry point
    sys.exit(app())
