"""What every command shares: the command and group classes (help conventions), the argument and option
types that several commands take, and `fail` (a user's mistake: one red line, exit status 2)."""

from __future__ import annotations

import os
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


def runs_root_problem(out: Path, where: str) -> str | None:
    """Why `out` cannot be a sweep's or a search's runs root, or None: it must name a folder of its own, not
    the working folder or one above it (its manifest and run folders would land among the user's files).
    Whether it can be written at all is `output_problem`'s question, as for every path a command writes."""
    from ablate.schema import PathName

    if not PathName().ok(str(out)):
        return f"{where}: {str(out)!r} is not allowed; allowed: {PathName()}"
    here, path = Path.cwd().resolve(), out.resolve()
    if path == here or path in here.parents:
        return f"{where}: {out} is the working folder or a folder above it; give a folder of its own (e.g. runs/NAME)"
    return None  # a file in its place, or a folder that cannot be written: check_output


def preflight_runs(configs, source: Path) -> None:
    """Every file the runs read (data rows, model, tokenizer, chat template, verifier), read and checked
    before anything is submitted or written; each distinct file once. Exit 2 naming `file:line`."""
    from ablate.train.preflight import PreflightError, check_runs

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        check_runs(configs, str(source))
    except PreflightError as err:
        fail(str(err))


def output_problem(path: Path, folder: bool = True) -> str | None:
    """Why the CLI cannot write `path` (a folder to write into, or a file to write), or None: an empty value,
    a file where a folder is meant or the reverse, an ancestor that is a file, a folder that is not writable."""
    if str(path).strip() in ("", "."):
        return "give a folder (an empty value would write into the current folder)" if folder else "give a file name"
    if folder and path.exists() and not path.is_dir():
        return "is a file, not a folder"
    if not folder and path.is_dir():
        return "is a folder, not a file"
    existing = next((p for p in path.parents if p.exists()), Path("."))
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    target = path if folder and path.is_dir() else existing
    if not os.access(target, os.W_OK | os.X_OK):
        return f"{target} is not writable"
    return None


def check_output(path: Path, flag: str, folder: bool = True) -> None:
    """Every path a command writes is checked here, before anything is written: exit 2 naming `flag` (the
    option, or the spec file and its key) and the path."""
    problem = output_problem(Path(path), folder)
    if problem:
        fail(f"{flag} {path}: {problem}")


def check_runs_root(out: Path, flag: str) -> None:
    """A sweep's or a search's runs root (`flag`: `--out`, or `SPEC: out:`): a folder of its own
    (`runs_root_problem`) that the CLI can write (`check_output`); exit 2 otherwise."""
    problem = runs_root_problem(out, flag.rstrip(":"))
    if problem:
        fail(problem)
    check_output(out, flag)


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
Wide = Annotated[bool, typer.Option("--wide", help="every column at full width (default: fit the terminal, "
                                                   "80 columns in a pipe)")]


# --- plain-text tables ------------------------------------------------------------------------------------

def table_width(wide: bool) -> int | None:
    """The width a table must fit: none with --wide, the terminal's on a terminal, 80 in a pipe or a file."""
    import shutil
    import sys

    if wide:
        return None
    return shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() else 80


def short_keys(keys: list[str]) -> dict[str, str]:
    """Column headers for dotted keys: the last part (`recipe.kl_coef` -> `kl_coef`) where that is unique."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: s if last.count(s) == 1 else k for k, s in zip(keys, last)}


def text_table(header: list[str], rows: list[list[str]], width: int | None, drop: tuple[str, ...] = (),
               squeeze: str | None = None, abbrev: dict[str, str] | None = None) -> str:
    """A plain-text table (fast for 100,000 rows, readable in a pipe) within `width` characters (None: any):
    headers are shortened by `abbrev` (`recipe.kl_coef` -> `kl_coef`), then the columns in `drop` (named
    as shortened) are left out in that order until it fits, then column `squeeze` is cut (never below its
    header); no other cell is ever cut, so run ids stay whole. A last line names what was left out."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([0, *(len(r[i]) for r in cells)]) for i in range(len(header))]
    total = lambda: sum(sizes[h] for h in cols) + 2 * (len(cols) - 1)  # noqa: E731
    cols = list(header)
    sizes = {h: max(len(h), w) for h, w in zip(cols, widths)}
    if width is not None and total() > width and abbrev:
        header = [abbrev.get(h, h) for h in header]
        cols = list(header)
        sizes = {h: max(len(h), w) for h, w in zip(cols, widths)}
    left_out = []
    for h in drop:
        if width is None or total() <= width:
            break
        if h in cols and h != squeeze:
            cols.remove(h)
            left_out.append(h)
    if width is not None and squeeze in cols and total() > width:
        sizes[squeeze] = max(len(squeeze), sizes[squeeze] - (total() - width))
    index = [header.index(h) for h in cols]

    def line(values: list[str]) -> str:
        out = []
        for h, i in zip(cols, index):
            v = values[i]
            out.append(v if len(v) <= sizes[h] else v[:sizes[h] - 1] + "~")
        return "  ".join(v.ljust(sizes[h]) for h, v in zip(cols, out)).rstrip()

    lines = [line(header), "  ".join("-" * sizes[h] for h in cols), *(line(r) for r in cells)]
    if left_out:
        lines.append(f"(left out to fit {width} columns: {', '.join(left_out)}; --wide shows them)")
    return "\n".join(lines)
