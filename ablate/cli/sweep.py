"""`ablate sweep plan | run | status | cancel` (mounted by ablate/cli/main.py as `app.add_typer(sweep_app, name="sweep")`)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import typer
from rich.console import Console

from ablate.cli.options import (
    AsJson,
    Command,
    Profile,
    Quiet,
    RunsDir,
    RunsRoot,
    SweepSpec,
    Wide,
    check_choice,
    check_output,
    check_runs_root,
    fail,
    new_app,
    preflight_runs,
    short_keys,
    table_width,
    text_table,
)

sweep_app = new_app("Grid sweeps over recipe toggles x seeds (docs/sweeps.md).")
console = Console()


def _load(spec: Path, out: Path | None = None):
    """Spec -> (sweep, runs); a bad spec or any invalid run exits 2 with the message, writing nothing."""
    from ablate.experiments.sweep import SpecError, SweepWarning, expand, load_spec

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SweepWarning)
            sweep = load_spec(spec)
            runs = expand(sweep)
    except SpecError as err:
        fail(str(err))
    for w in caught:
        typer.secho(f"warning: {w.message}", fg="yellow", err=True)
    sweep.out = out if out is not None else sweep.out
    check_runs_root(sweep.out, "--out" if out is not None else f"{spec}: out:")
    preflight_runs([r.config for r in runs], spec)
    return sweep, runs


def plan_table(runs, states: dict[str, str] | None = None, width: int | None = 80) -> str:
    """One row per run: #, id, arm, the toggles that vary, seed (and the current state, if known), within
    `width` columns (run ids are never cut; toggles are left out from the right, and said so)."""
    keys = list(dict.fromkeys(k for r in runs for k in r.toggles))
    short = short_keys(keys)
    has_arm = any(r.arm for r in runs)
    header = ["#", "run id"] + ["arm"] * has_arm + keys + ["seed"] + ["state"] * (states is not None)
    rows = [[str(i), r.run_id] + [r.arm or ""] * has_arm + [str(r.toggles.get(k, "")) for k in keys] + [str(r.seed)]
            + ([states.get(r.run_id, "missing")] if states is not None else []) for i, r in enumerate(runs)]
    return f"{len(runs)} runs\n" + text_table(header, rows, width, drop=("#", *reversed([short[k] for k in keys])),
                                             abbrev=short)


@sweep_app.command(cls=Command)
def plan(spec: SweepSpec, out: RunsRoot = None, wide: Wide = False):
    """Print every run of the sweep (id, toggles, seed); submits nothing."""
    from ablate.experiments.manifest import MANIFEST
    from ablate.experiments.status import sweep_status
    from ablate.experiments.sweep import SpecError
    from ablate.runs.store import RunFolderError

    sweep, runs = _load(spec, out)
    try:
        states = {r["run_id"]: r["state"] for r in sweep_status(sweep.out)} if (sweep.out / MANIFEST).exists() else None
    except (SpecError, RunFolderError) as err:
        fail(f"{err}")
    typer.echo(plan_table(runs, states, table_width(wide)))
    typer.echo(f"runs root: {sweep.out}")


@sweep_app.command(cls=Command)
def run(spec: SweepSpec,
        executor: str | None = typer.Option(None, "--executor", metavar="NAME",
                                            help="local | slurm | debug (default: spec, else local)"),
        profile: Profile = None,
        max_parallel: int | None = typer.Option(None, "--max-parallel", metavar="N", min=1,
                                                help="local: processes; slurm: array parallelism"),
        out: RunsRoot = None,
        quiet: Quiet = False,
        wait: bool = typer.Option(False, "--wait", help="block until every run of the sweep has ended (SLURM "
                                  "too); exit 1 naming each run that failed, diverged or was cancelled"),
        poll: float = typer.Option(10.0, "--poll", metavar="S", help="with --wait: seconds between status checks")):
    """Submit the runs that are failed, cancelled or missing; completed runs are skipped."""
    from ablate.experiments.executors import EXECUTORS
    from ablate.experiments.launch import launch
    from ablate.experiments.status import UNSUCCESSFUL, sweep_status
    from ablate.experiments.status import wait as wait_for
    from ablate.experiments.sweep import SpecError

    check_choice("--executor", executor, tuple(EXECUTORS))
    if poll <= 0:
        fail(f"--poll {poll}: must be > 0 seconds")
    sweep, runs = _load(spec, out)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ablate.runs.store import RunFolderError

    try:
        res = launch(sweep, runs, executor, profile, max_parallel, view=None if quiet else SweepView)
    except (SpecError, RunFolderError) as err:
        fail(f"{err}")
    console.print(f"{len(runs)} runs: {len(res['submitted'])} submitted, {len(res['skipped'])} already finished, "
                  f"{len(res['active'])} still active -> {sweep.out}")
    if not wait:
        rows = sweep_status(sweep.out)
        bad = [r for r in rows if r["run_id"] in res["submitted"] and r["state"] in ("failed", "cancelled")]
        _counts(rows)
        raise typer.Exit(1 if bad else 0)
    rows = wait_for(sweep.out, poll, log=_counts)  # every run of the sweep, submitted now or before
    bad = [r for r in rows if r["state"] in UNSUCCESSFUL]
    for r in bad:
        err = (r["error"] or "").strip().splitlines()
        typer.echo(f"{r['state']}: {r['run_id']} ({r['arm'] or 'seed ' + str(r['seed'])}) at step {r['step']}/"
                   f"{r['steps']}{': ' + err[-1][:200] if err else ''}")
    raise typer.Exit(1 if bad else 0)


def status_table(rows: list[dict], width: int | None = 80) -> str:
    """The `sweep status` table within `width` columns: the arm (named, else its toggle values), the toggles
    when arms are named, seed, state, step; job, scheduler and the error's last line as room allows."""
    from ablate.experiments.status import arm_label

    named = any(r["toggles"] and r["arm"] != arm_label(r["toggles"]) for r in rows)
    keys = list(dict.fromkeys(k for r in rows for k in r["toggles"])) if named else []
    short = short_keys(keys)
    header = ["run id", "arm", *keys, "seed", "state", "step", "job", "scheduler", "error"]
    body = []
    for r in rows:
        err = (r["error"] or "").strip().splitlines()
        body.append([r["run_id"], r["arm"] or "", *[str(r["toggles"].get(k, "")) for k in keys], str(r["seed"]),
                     r["state"], f"{r['step']}/{r['steps']}", r["job_id"] or "", r["scheduler"] or "",
                     err[-1] if err else ""])
    drop = ("scheduler", "job", *reversed([short[k] for k in keys]))
    return text_table(header, body, width, drop=drop, squeeze="error", abbrev=short)


def _counts(rows) -> None:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    console.print("  ".join(f"{k}: {v}" for k, v in sorted(counts.items())))


@sweep_app.command(cls=Command)
def status(runs_dir: RunsDir, as_json: AsJson = False, wide: Wide = False):
    """Counts and per-run state (run store + scheduler)."""
    from ablate.experiments.status import stale_runs, sweep_status
    from ablate.experiments.sweep import SpecError
    from ablate.runs.store import RunFolderError

    try:
        rows = sweep_status(runs_dir)
    except (FileNotFoundError, SpecError, RunFolderError) as err:
        fail(f"{err}")
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    typer.echo(status_table(rows, table_width(wide)))
    _counts(rows)
    stale = stale_runs(runs_dir)
    if stale:
        console.print(f"{len(stale)} run folder(s) from an earlier version of the spec (or of ablate) are kept "
                      f"but not part of this sweep: {', '.join(stale[:4])}{' ...' if len(stale) > 4 else ''}")


@sweep_app.command(cls=Command)
def cancel(runs_dir: RunsDir):
    """Stop the sweep's active jobs and mark every unfinished run `cancelled`."""
    from ablate.experiments.launch import cancel as do_cancel
    from ablate.experiments.sweep import SpecError
    from ablate.runs.store import RunFolderError

    try:
        ids = do_cancel(runs_dir)
    except (FileNotFoundError, SpecError, RunFolderError) as err:
        fail(str(err))
    console.print(f"cancelled {len(ids)} run(s)")
# --- live view (local executor) ----------------------------------------------------------------------

def _last_row(path: Path) -> dict:
    """The last complete line of a JSONL file, reading only its tail."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return {}


class SweepView:
    """A rich progress view read from the run folders: one bar for the sweep, one per active run."""

    def __init__(self, out: Path, runs, enabled: bool = True):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from ablate.runs.store import RunStore

        self.store = RunStore
        self.out, self.runs = out, {r.run_id: r for r in runs}
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), disable=not enabled)
        self.total = self.progress.add_task(f"[bold]sweep {out.name}", total=len(runs), info="")
        self.bars: dict[str, int] = {}

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def update(self, active: list[str], done: int) -> None:
        for rid in [r for r in self.bars if r not in active]:
            self.progress.remove_task(self.bars.pop(rid))
        for rid in active:
            r = self.runs[rid]
            if rid not in self.bars:
                label = " ".join(f"{k.split('.')[-1]}={v}" for k, v in r.toggles.items())
                self.bars[rid] = self.progress.add_task(f"{rid} {r.arm or ''} {label} s{r.seed}",
                                                        total=r.config.steps, info="")
            st = self.store(self.out / rid).status() or {}
            reward = _last_row(self.out / rid / "metrics.jsonl").get("train/reward_mean")
            self.progress.update(self.bars[rid], completed=st.get("step", 0),
                                 info=f"reward {reward:.3f}" if reward is not None else "starting")
        self.progress.update(self.total, completed=done, info=f"{len(active)} running")


@sweep_app.command(cls=Command)
def extend(spec: SweepSpec,
           until_ci_width: float = typer.Option(..., "--until-ci-width", metavar="W", help="target width of every arm's CI, "
                                                "in the report's units (points for a rate)"),
           max_seeds: int = typer.Option(..., "--max-seeds", metavar="N", help="stop here whatever the widths"),
           step: int = typer.Option(2, "--step", metavar="N", help="seeds added per round"),
           n0: int | None = typer.Option(None, "--n0", metavar="N", help="seeds of the first round (default: the spec's now); "
                                         "keep it fixed across rounds: it sets the number of planned looks"),
           metric: str | None = typer.Option(None, "--metric", metavar="NAME", help="default: the report's"),
           out: RunsRoot = None):
    """One look of a sequential design: if an arm's CI (at 1 - 0.05/looks) is wider than the target,
    write SPEC with `step` more seeds as <stem>.extend.yaml (same name and runs root) to `ablate sweep run`."""
    import yaml

    from ablate.analysis import effects
    from ablate.analysis.load import load_study
    from ablate.analysis.report import default_metric, metric_scale
    from ablate.analysis.sequential import next_round
    from ablate.experiments.sweep import read_spec_file

    sweep, runs = _load(spec, out)
    path = spec.with_suffix(".extend.yaml") if not spec.name.endswith(".extend.yaml") else spec
    check_output(path, "the extended spec", folder=False)
    if step < 1 or max_seeds < 2:
        fail("--step must be >= 1 and --max-seeds >= 2")
    if not Path(sweep.out).exists():
        fail(f"no runs under {sweep.out}: run the sweep first")
    study = load_study(sweep.out)
    metric = metric or default_metric(study)
    scale, unit = metric_scale(metric)
    sc = effects.final_scores(study, metric)
    values = {a: (g["value"] * scale).tolist() for a, g in sc[sc["included"]].groupby("arm", sort=False)}
    if not values:
        fail(f"no completed runs with {metric} under {sweep.out}")
    seeds = list(sweep.seeds or [0])
    d = next_round(values, n0 or len(seeds), until_ci_width, max_seeds, step)
    for arm, w in d["widths"].items():
        typer.echo(f"  {arm}: {len(values[arm])} seeds, {d['level']:.2%} CI width {w:.3g} {unit}")
    if d["stop"]:
        typer.echo(f"stop: {d['why']} (look at {d['seeds']} seeds)")
        return
    raw = read_spec_file(spec, "sweep spec")
    extra = [max(seeds) + 1 + i for i in range(d["next_seeds"] - d["seeds"])]
    raw = {**raw, "seeds": seeds + extra, "out": str(Path(sweep.out).resolve())}
    base = raw.get("base") or {}
    if isinstance(base, dict) and base.get("config"):   # keep base.config valid next to the new file
        raw["base"] = {**base, "config": str((spec.parent / base["config"]).resolve())}
    path.write_text(f"# {spec.name} extended to {d['next_seeds']} seeds: {d['why']} (ablate sweep extend)\n"
                    + yaml.safe_dump(raw, sort_keys=False))
    typer.echo(f"wrote {path} (+{len(extra)} seeds: {extra})\n  ablate sweep run {path}\n  "
               f"ablate sweep extend {path} --until-ci-width {until_ci_width:g} --max-seeds {max_seeds} --step {step} "
               f"--n0 {n0 or len(seeds)}")
