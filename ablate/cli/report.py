"""`ablate report RUNS... -o reports/X.html`: statistics across seeds, factorial effects, curves and
diagnostics as one self-contained HTML file plus a Markdown summary (docs/report.md).

Mount in ablate/cli/main.py with either of:
    from ablate.cli.report import report;     app.command("report")(report)
    from ablate.cli.report import report_app; app.add_typer(report_app, name="report")  # same thing
"""

from __future__ import annotations

from pathlib import Path

import typer

from ablate.cli.options import Command, check_output, fail, new_app

report_app = new_app("Ablation report (HTML + Markdown) from run folders.")


def report(
    runs: list[Path] = typer.Argument(..., metavar="RUNS", help="sweep roots and/or run folders",
                                      show_default=False),
    out: Path | None = typer.Option(None, "-o", "--out", metavar="FILE", help="HTML file (default reports/<first folder name>.html); "
                                    "the Markdown summary goes next to it (.md)"),
    metric: str | None = typer.Option(None, "--metric", metavar="NAME", help="metric compared across arms (default eval/pass@1)"),
    x: str = typer.Option("steps", "--x", metavar="AXIS", help="x axis of the curves: steps | samples | tokens | wall"),
    ci: str = typer.Option("t", "--ci", metavar="METHOD", help="interval of means, differences and effects: t (Student/Welch, right "
                           "at few seeds) | percentile (rliable's bootstrap) | bca"),
    adjust: str = typer.Option("holm", "--adjust", metavar="METHOD", help="multiple-comparison adjustment of each table of contrasts: "
                               "holm (family-wise) | bh (Benjamini-Hochberg, false discovery rate) | none"),
    mde: float | None = typer.Option(None, "--mde", metavar="EFFECT", help="an effect in the metric's units (0.02 = 2 points of a rate): "
                                     "the report adds the seeds per arm needed to detect it (power 0.8)"),
    score: str = typer.Option("final", "--score", metavar="SCORE", help="per-run score: final | last_k (mean of the last --last-k "
                              "evaluations) | auc (area under the curve) | max (biased upward; warned)"),
    last_k: int = typer.Option(3, "--last-k", metavar="K", help="evaluations averaged by --score last_k"),
    fit: str | None = typer.Option(None, "--fit", metavar="AXIS", help="fit the compute-scaling sigmoid (ScaleRL) per arm against "
                                   "this axis: tokens | samples | wall | steps"),
    reps: int = typer.Option(2000, "--reps", metavar="N", help="bootstrap replicates"),
    seed: int = typer.Option(0, "--seed", metavar="N", help="bootstrap seed (the report is reproducible)"),
    title: str | None = typer.Option(None, "--title", metavar="TEXT"),
    as_json: bool = typer.Option(False, "--json", help="also print the headline, warnings and tables as JSON"),
):
    """Build the report; prints the headline and warnings."""
    from ablate.analysis.report import build_report, report_json

    if reps < 1:
        fail(f"--reps {reps}: expected an integer >= 1 (bootstrap replicates)")
    if ci not in ("t", "percentile", "bca") or x not in ("steps", "samples", "tokens", "wall"):
        fail(f"--ci {ci!r} / --x {x!r}: allowed values: --ci t, percentile, bca; "
                    f"--x steps, samples, tokens, wall")
    missing = [str(p) for p in runs if not p.exists()]
    if missing:
        fail(f"no such folder: {', '.join(missing)}")
    out = out or Path("reports") / f"{runs[0].resolve().name}.html"
    for path in (out, out.with_suffix(".md")):  # the HTML report and the Markdown summary beside it
        check_output(path, "-o/--out", folder=False)
    try:
        rep = build_report(runs, out, metric=metric, x=x, reps=reps, seed=seed, title=title, ci_method=ci,
                           adjust=adjust, mde=mde, score=score, last_k=last_k, fit=fit)
    except ValueError as err:
        fail(str(err))
    typer.echo(f"wrote {out} and {out.with_suffix('.md')}")
    for line in rep.base_lines + rep.headline:
        typer.echo(f"  {line}")
    for w in rep.warnings:
        typer.secho(f"warning: {w}", fg="yellow", err=True)
    if as_json:
        typer.echo(report_json(rep))


report_app.command(cls=Command)(report)
