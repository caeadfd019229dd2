"""What every command shares: the command and group classes (help conventions), the argument and option
types that several commands take, and `fail` (a user's mistake: one red line, exit status 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from typer.core import TyperCommand, TyperGroup


class _Conventions:
    """Help in the usual Unix spelling: `ablate train [OPTIONS] CONFIG` (typer writes required arguments as
    {CONFIG}) and flags without a type placeholder (typer prints `--quiet <bool>`)."""

    def collect_usage_pieces(self, ctx):
        return [p[1:].replace("}", "", 1) if p.startswith("{") else p for p in super().collect_usage_pieces(ctx)]

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for p in params:
            if getattr(p, "is_flag", False):
                p.metavar = ""
        return params


class Command(_Conventions, TyperCommand):
    pass


class Group(_Conventions, TyperGroup):
    pass


def new_app(help: str, group: type[TyperGroup] = Group) -> typer.Typer:
    return typer.Typer(cls=group, add_completion=False, no_args_is_help=True, help=help)


def fail(message: str) -> NoReturn:
    """A user's mistake (bad spec, missing folder, bad flag value): say what and where, exit 2."""
    typer.secho(f"error: {message}", fg="red", err=True)
    raise typer.Exit(2)


def check_choice(flag: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        fail(f"{flag} {value!r}: expected one of {', '.join(allowed)}")


# --- shared arguments and options ------------------------------------------------------------------------

ConfigArg = Annotated[Path, typer.Argument(metavar="CONFIG", help="YAML run config", show_default=False)]
SweepSpec = Annotated[Path, typer.Argument(metavar="SPEC", help="sweep spec YAML (sweeps/*.yaml)", show_default=False)]
SearchSpec = Annotated[Path, typer.Argument(metavar="SPEC", help="search spec YAML (sweeps/tune_*.yaml)",
                                            show_default=False)]
RunsDir = Annotated[Path, typer.Argument(metavar="RUNS_DIR", help="the sweep's runs root (holds manifest.json)",
                                         show_default=False)]
RunsRoot = Annotated[Path | None, typer.Option("--out", metavar="DIR",
                                               help="runs root (default: the spec's `out`, else runs/<name>)")]
Profile = Annotated[Path | None, typer.Option("--profile", metavar="PROFILE",
                                              help="SLURM profile YAML (slurm/profiles/X.yaml)")]
Quiet = Annotated[bool, typer.Option("--quiet", help="no live progress view")]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable output")]
