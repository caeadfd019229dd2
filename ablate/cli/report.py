"""`ablate report RUNS... -o reports/X.html`: statistics across seeds, factorial effects, curves and
diagnostics as one self-contained HTML file plus a Markdown summary (docs/report.md).

Mount in ablate/cli/main.py with either of:
    from ablate.cli.report import report;     app.command("report")(report)
    from ablate.cli.report import report_app; app.add_typer(report_app, name="report")  # same thing
"""

from __future__ import annotations

from pathlib import Path

import typer

report_app = typer.Typer(add_completion=False, help="Ablation report (HTML + Markdown) from run folders.")


def report(
    runs: list[Path] = typer.Argument(..., help="sweep roots and/or run folders"),
    out: Path | None = typer.Option(None, "-o", "--out", help="HTML file (default reports/<first folder name>.html); "
                                    "the Markdown summary goes next to it (.md)"),
    metric: str | None = typer.Option(None, "--metric", help="metric compared across arms (default eval/pass@1)"),
    x: str = typer.Option("steps", "--x", help="x axis of the curves: steps | samples | tokens | wall"),
    ci: str = typer.Option("t", "--ci", help="interval of means, differences and effects: t (Student/Welch, right "
                           "at few seeds) | percentile (rliable's bootstrap) | bca"),
    reps: int = typer.Option(2000, "--reps", help="bootstrap replicates"),
    seed: int = typer.Option(0, "--seed", help="bootstrap seed (the report is reproducible)"),
    title: str | None = typer.Option(None, "--title"),
    as_json: bool = typer.Option(False, "--json", help="also print the headline, warnings and tables as JSON"),
):
    """Build the report; prints the headline and warnings."""
    from ablate.analysis.report import build_report, report_json

    if reps < 1:
        typer.secho(f"error: --reps {reps}: expected an integer >= 1 (bootstrap replicates)", fg="red", err=True)
        raise typer.Exit(2)
    if ci not in ("t", "percentile", "bca") or x not in ("steps", "samples", "tokens", "wall"):
        typer.secho(f"error: --ci {ci!r} / --x {x!r}: allowed values: --ci t, percentile, bca; "
                    f"--x steps, samples, tokens, wall", fg="red", err=True)
        raise typer.Exit(2)
    missing = [str(p) for p in runs if not p.exists()]
    if missing:
        typer.secho(f"error: no such folder: {', '.join(missing)}", fg="red", err=True)
        raise typer.Exit(2)
    out = out or Path("reports") / f"{runs[0].resolve().name}.html"
    try:
        rep = build_report(runs, out, metric=metric, x=x, reps=reps, seed=seed, title=title, ci_method=ci)
    except ValueError as err:
        typer.secho(f"error: {err}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {out} and {out.with_suffix('.md')}")
    for line in rep.headline:
        typer.echo(f"  {line}")
    for w in rep.warnings:
        typer.secho(f"warning: {w}", fg="yellow", err=True)
    if as_json:
        typer.echo(report_json(rep))


report_app.command()(report)
