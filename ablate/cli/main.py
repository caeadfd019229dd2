"""The `ablate` command line: `train` and `base-model` here; `sweep`, `tune` and `report` in their modules."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from ablate.cli.options import Command, ConfigArg, Quiet, fail, new_app

app = new_app("Ablation studies of RLVR recipes.")


def _version(value: bool) -> None:
    if value:
        import ablate

        typer.echo(f"ablate {ablate.__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False):
    """Ablation studies of RLVR recipes."""


@app.command(cls=Command)
def train(
    config: ConfigArg,
    set_: Annotated[list[str], typer.Option("--set", metavar="KEY=VALUE",
                                            help="override a dotted key, e.g. recipe.eps_high=0.28")] = [],  # noqa: B006
    out: Annotated[Path | None, typer.Option("--out", metavar="DIR", help="run folder (default runs/<run_id>)")] = None,
    quiet: Quiet = False,
):
    """Train one run; resumes if DIR holds a checkpoint of the same config."""
    from ablate.config import ConfigError, load, run_id

    try:
        cfg = load(config, set_)
    except ConfigError as err:
        fail(str(err))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ablate.train.trainer import train as run_train

    out = out or Path("runs") / run_id(cfg)
    state = run_train(cfg, str(out), progress=not quiet)
    typer.echo(f"{state}: {out}")
    raise typer.Exit(0 if state == "completed" else 1)


@app.command("base-model", cls=Command)
def base_model(
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="folder to write the model into")] = Path(
        "models/tiny-arith"),
    seed: Annotated[int, typer.Option("--seed")] = 0,
):
    """Build (or reuse, if cached) the tiny local base model warm-started on arithmetic."""
    from ablate.train.models import base_model_cli

    base_model_cli(str(out), seed)


from ablate.cli.report import report  # noqa: E402
from ablate.cli.sweep import sweep_app  # noqa: E402
from ablate.cli.tune import tune_app  # noqa: E402

app.add_typer(sweep_app, name="sweep")
app.add_typer(tune_app, name="tune")
app.command("report", cls=Command)(report)


def main() -> None:  # console script entry point
    sys.exit(app())
