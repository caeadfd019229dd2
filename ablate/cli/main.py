"""The `ablate` command line: `train` and `base-model` here; `sweep`, `tune` and `report` in their modules."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from ablate.cli.options import Command, ConfigArg, Quiet, check_output, fail, new_app, preflight_runs

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
    extend_to: Annotated[int | None, typer.Option(
        "--extend-to", metavar="N", help="continue the completed run in DIR to N steps, as a new run beside it "
                                         "(logs kept, extended_from in provenance; docs/run-folders.md)")] = None,
    nproc: Annotated[int, typer.Option("--nproc", metavar="N", help="ranks on this machine (torch.distributed; "
                                       "the result does not depend on N)")] = 1,
):
    """Train one run; resumes if DIR holds a checkpoint of the same config."""
    from ablate.config import ConfigError, load, run_id

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        cfg = load(config, set_)
    except ConfigError as err:
        fail(str(err))
    preflight_runs([cfg], config)
    from ablate.runs.store import SPACE_ERRORS, RunFolderError, RunStore
    from ablate.train.trainer import train as run_train

    out = out or Path("runs") / run_id(cfg)
    check_output(out, "--out")
    if (out / "manifest.json").exists():
        fail(f"--out {out}: is a sweep's runs root (holds manifest.json); a run goes into a folder of its own")
    if nproc < 1:
        fail(f"--nproc {nproc}: give the number of ranks, >= 1")
    if extend_to is not None:
        from ablate.train.extend import extend

        try:
            old, (cfg, out) = run_id(cfg), extend(cfg, out, extend_to)
        except (RunFolderError, ConfigError) as err:
            fail(f"{err}")
        typer.echo(f"extending run {old} ({out.parent / old}) to {extend_to} steps as run {run_id(cfg)}: {out}")
    from ablate.train.preemption import Stopped, stop_reason

    try:
        RunStore(out).check_free()  # another process trains this folder: refused at once (as every rank would be)
        if nproc > 1:  # N local ranks, each running run_train (docs/scale.md)
            from ablate.train.ranks import RanksFailed, launch
            try:
                state = launch(nproc, [(cfg, str(out))])[0]
            except RanksFailed as err:
                typer.echo(f"failed: {out}\n{err}", err=True)
                raise typer.Exit(1) from None
        else:
            state = run_train(cfg, str(out), progress=not quiet)
    except (RunFolderError, ConfigError) as err:  # refused before anything was written
        fail(f"{f'{config}: ' if isinstance(err, ConfigError) else ''}{err}")
    except (Stopped, KeyboardInterrupt) as err:  # the run folder says `cancelled` and why
        typer.echo(f"cancelled: {out} ({stop_reason(err)}); the same command resumes it", err=True)
        raise typer.Exit(128 + (err.signum if isinstance(err, Stopped) else 2)) from None  # 143, 129, 130
    except OSError as err:
        if err.errno not in SPACE_ERRORS:
            raise
        typer.secho(f"error: {err.strerror} writing {err.filename or out}; the run is marked failed in "
                    f"{out}/status.json (free space, then the same command resumes it)", fg="red", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{state}: {out}")
    raise typer.Exit(0 if state == "completed" else 1)


@app.command("export", cls=Command)
def export_cmd(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", show_default=False, help="a run folder (holds config.yaml and checkpoint.pt)"),
    out: Path = typer.Option(..., "--out", metavar="DIR", help="empty or new folder for the Hugging Face model"),
):
    """Write a run's final weights as a Hugging Face model folder (from_pretrained loads it)."""
    from ablate.config import ConfigError
    from ablate.runs.store import RunFolderError

    check_output(out, "--out")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ablate.train.export import export

    try:
        info = export(run_dir, out)
    except (ConfigError, RunFolderError) as err:
        fail(f"{err}")
    typer.echo(f"exported run {info['run_id']} at step {info['step']}/{info['steps']} ({info['state']}) -> {out}")


@app.command("base-model", cls=Command)
def base_model(
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="folder to write the model into")] = Path(
        "models/tiny-arith"),
    seed: Annotated[int, typer.Option("--seed")] = 0,
    tools: Annotated[str, typer.Option("--tools", metavar="ENV", help="warm-start on episodes of this environment "
                                       "instead: 'calculator' (docs/environments.md)")] = "",
):
    """Build (or reuse, if cached) the tiny local base model warm-started on arithmetic."""
    if tools:
        if tools != "calculator":
            fail(f"--tools: {tools!r} is not allowed; allowed values: 'calculator'")
        from ablate.train.tool_models import tool_model_cli

        return tool_model_cli(str(out), seed)
    from ablate.train.models import base_model_cli

    check_output(out, "--out")
    base_model_cli(str(out), seed)


@app.command(cls=Command)
def difficulty(
    config: ConfigArg,
    set_: Annotated[list[str], typer.Option("--set", metavar="KEY=VALUE", help="override a dotted key")] = [],  # noqa: B006
    n: Annotated[int | None, typer.Option("--n", metavar="N", help="samples per prompt (default eval.n_samples)")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", metavar="T",
                                                      help="default: recipe.temperature (step 1)")] = None,
    quiet: Quiet = False,
):
    """Per-prompt pass rates of the base model on the training prompts (cached); the histogram before and
    after `task.pass_rate_band`."""
    from ablate.config import ConfigError, load

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        cfg = load(config, set_)
    except ConfigError as err:
        fail(f"{err}")
    preflight_runs([dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, pass_rate_band=()))], config)
    if n is not None and n < 1 or temperature is not None and temperature <= 0:
        fail("--n must be >= 1 and --temperature > 0")
    from ablate.train.difficulty import band_defaults, cache_root, estimate, histogram

    check_output(cache_root(), "ABLATE_CACHE")  # where the pass rates are cached

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
app.command("report", cls=Command)(report)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning is one line, `warning: ...` (Python's default adds the file, line and source line)."""
    typer.secho(f"warning: {message}", fg="yellow", err=True)


def main() -> None:  # console script entry point
    import warnings

    warnings.showwarning = _warning_line
    sys.exit(app())
