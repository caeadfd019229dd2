"""`ablate tune SPEC | status SPEC` (mounted by ablate/cli/main.py as `app.add_typer(tune_app, name="tune")`).

Also the launcher: `launch(spec, ...)` creates the study and starts the workers of ablate/experiments/search.py as
local processes or one SLURM job array (submitit, with the sweeps' SLURM profiles), and `summary(spec)` is
what `ablate tune status` prints. docs/tune.md describes both.
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console

from ablate.cli.options import (
    AsJson,
    Command,
    Group,
    Profile,
    RunsRoot,
    SearchSpec,
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


class _RunByDefault(Group):
    """`ablate tune SPEC ...` means `ablate tune run SPEC ...`."""

    def parse_args(self, ctx, args):
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["run", *args]
        return super().parse_args(ctx, args)


tune_app = new_app("Optuna searches over config keys (docs/tune.md).\n\n"
                   "ablate tune SPEC [OPTIONS] is short for ablate tune run SPEC [OPTIONS].", group=_RunByDefault)
console = Console()


# --- launching ---------------------------------------------------------------------------------------

class TuneWorker:
    """The submitted callable: one worker pulling trials from the shared storage (local process or array task)."""

    def __init__(self, spec, worker: int, threads: int | None = None):
        self.spec, self.worker, self.threads = spec, worker, threads

    def __call__(self) -> int:
        import torch

        from ablate.experiments.search import run_worker

        if self.threads:
            torch.set_num_threads(self.threads)
        return run_worker(self.spec, self.worker)

    def checkpoint(self, *args, **kwargs):
        """SLURM preemption (submitit): save the running trial's run at a step boundary and requeue this
        worker; the trial itself stays `running` until its heartbeat goes stale, then is retried (resuming)."""
        import submitit

        from ablate.train import preemption

        preemption.save_now()
        return submitit.helpers.DelayedSubmission(TuneWorker(self.spec, self.worker, self.threads))


def launch(spec, executor: str | None = None, workers: int | None = None, profile: str | Path | None = None,
           wait: bool = True) -> list:
    """Create the study, then start the workers: `local` processes (waits for them unless wait=False), one
    `slurm` job array (returns at once) or `inline` (one worker in this process). Returns the submitit jobs."""
    import submitit

    from ablate.experiments.search import open_study, run_worker
    from ablate.experiments.slurm_profile import check_sbatch_text, load_profile
    from ablate.experiments.worker import cpu_count, importable

    executor = executor or spec.executor["name"]
    workers = workers or spec.executor["workers"]
    open_study(spec, create=True)  # once, here: workers only load it (no creation race)
    if executor == "inline":
        run_worker(spec)
        return []
    folder = spec.out / ".submitit" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    importable()
    if executor == "slurm":
        check_sbatch_text(spec.source, "out (the runs root)", folder)
        ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
        ex.update_parameters(name=spec.name, timeout_min=spec.executor.get("timeout_min", 60),
                             slurm_array_parallelism=workers)
        profile = profile or spec.sweep.slurm_profile
        ex.update_parameters(**(load_profile(profile) if profile else {}))
        return ex.submit_array([TuneWorker(spec, i) for i in range(workers)])
    ex = submitit.LocalExecutor(folder=folder)
    ex.update_parameters(timeout_min=spec.executor.get("timeout_min", 7 * 24 * 60))
    jobs = [ex.submit(TuneWorker(spec, i, max(1, cpu_count() // workers))) for i in range(workers)]
    try:
        while wait and not all(j.done() for j in jobs):
            time.sleep(0.5)
    except KeyboardInterrupt:  # the workers tell their running trials FAIL on SIGINT
        for j in jobs:
            j.cancel(check=False)
        raise
    return jobs


# --- status ------------------------------------------------------------------------------------------

def best_snippet(spec, trial) -> str:
    """A sweep spec (the search's base + one arm with the trial's values) that reproduces the trial's runs."""
    import yaml

    text = yaml.safe_dump({"name": f"{spec.name}_best", "base": spec.raw.get("base") or {},
                           "arms": {f"trial{trial.number}": dict(trial.params)}, "seeds": spec.seeds}, sort_keys=False)
    return (f"# best trial {trial.number} of {spec.name}: {spec.metric} = {trial.value:.6g} ({spec.direction}, mean "
            f"over seeds); base.config is relative to {Path(spec.source).parent}/\n{text}")


def importances(study, min_trials: int = 4) -> tuple[dict[str, float], str | None]:
    """Parameter importances over completed trials (Optuna's default evaluator: PED-ANOVA in Optuna 5, which
    handles conditional parameters), or ({}, why not)."""
    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(done) < min_trials:
        return {}, f"needs >= {min_trials} completed trials (have {len(done)})"
    try:
        return optuna.importance.get_param_importances(study), None
    except (ValueError, RuntimeError, ZeroDivisionError) as err:
        return {}, f"not computable: {err}"


EDGE = 0.05   # a best value within 5% of the range (log range for log params) of a bound "sits at the bound"


def bound_warnings(params, best: dict, edge: float = EDGE) -> list[str]:
    """The best trial's float / int values that sit at (or within `edge` of the range of) a search bound:
    the optimum may lie outside the range searched, so widen it before trusting the winner."""
    out = []
    for p in params:
        v = best.get(p.key)
        if p.kind == "categorical" or v is None:
            continue
        f = math.log if p.log else float
        pos = (f(v) - f(p.low)) / (f(p.high) - f(p.low))
        for side, at in (("lower", pos <= edge), ("upper", pos >= 1 - edge)):
            if at:
                out.append(f"best {p.key} = {v:g} sits at the {side} bound of the search range [{p.low:g}, {p.high:g}]"
                           f"{' (log scale)' if p.log else ''}: the optimum may lie outside it; widen the range")
    return out


def summary(spec) -> dict:
    """Best trial (+ snippet), trials by state, importances, and one row per trial."""
    import optuna

    from ablate.experiments.search import Retry, open_study

    study = open_study(spec)
    trials = study.get_trials(deepcopy=False)
    best = study.best_trial if any(t.state == optuna.trial.TrialState.COMPLETE for t in trials) else None
    imp, why = importances(study)
    return {"study": spec.name, "storage": spec.storage, "metric": spec.metric, "direction": spec.direction,
            "counts": dict(Counter(t.state.name.lower() for t in trials)), "importances": imp, "importance_note": why,
            "best": best and {"number": best.number, "value": best.value, "params": best.params,
                              "run_ids": best.user_attrs.get("run_ids", [])},
            "snippet": best and best_snippet(spec, best),
            "warnings": bound_warnings(spec.params, best.params) if best else [],
            "trials": [{"number": t.number, "state": t.state.name.lower(), "value": t.value, "params": t.params,
                        "run_ids": t.user_attrs.get("run_ids", []), "error": t.user_attrs.get("error"),
                        "retry_of": Retry.retried_trial_number(t)} for t in trials]}


def confirm_spec(spec, trials: list[dict], top: int, seeds: int) -> dict:
    """A sweep spec that reruns the `top` best completed trials (summary()'s trial rows) and the baseline
    (the search's base config, no searched values) on `seeds` fresh seeds, none of them a seed the
    trials were selected on (Patterson et al. 2024, "Empirical design in reinforcement learning",
    arXiv 2304.01315: the winner of a search is biased upward on the seeds it won on)."""
    done = [t for t in trials if t["state"] == "complete" and t["value"] is not None]
    best = sorted(done, key=lambda t: t["value"], reverse=spec.direction == "maximize")[:top]
    start = max(spec.seeds) + 1
    return {"name": f"{spec.name}_confirm", "base": spec.raw.get("base") or {},
            "arms": {"baseline": {}, **{f"trial{t['number']}": dict(t["params"]) for t in best}},
            "seeds": list(range(start, start + seeds)), "out": str(spec.out.parent / f"{spec.name}_confirm")}


# --- commands ----------------------------------------------------------------------------------------

def _load(spec: Path, out: Path | None, storage: str | None):
    """A bad spec exits 2 with the message (file and key) before any study or trial exists."""
    from ablate.experiments.search import SpecError, load_search

    if out is not None:
        check_runs_root(out, "--out")
    try:
        s = load_search(spec, out, storage)
    except SpecError as err:
        fail(str(err))
    check_runs_root(s.out, f"{spec}: out:")
    return s


def _preflight_configs(s) -> list:
    """The configs whose files the trials read: the base config, and the base with each categorical choice
    (a searched `model.path` or `task.path` is read before any trial starts); floats and ints read no file."""
    from ablate.experiments.search import SpecError, trial_runs

    configs = [r.config for r in trial_runs(s, {})]
    for p in s.params:
        for choice in p.choices:
            try:
                configs += [r.config for r in trial_runs(s, {p.key: choice})]
            except SpecError:  # a choice valid only with other keys (`when`): its trial is validated then
                pass
    return configs


Storage = typer.Option(None, "--storage", metavar="URL", help="sqlite:///PATH | journal:PATH | postgresql://... "
                       "(default: the spec's)")


@tune_app.command(cls=Command)
def run(spec: SearchSpec,
        executor: str | None = typer.Option(None, "--executor", metavar="NAME",
                                            help="local | slurm | inline (default: the spec's)"),
        workers: int | None = typer.Option(None, "--workers", metavar="N", min=1,
                                           help="worker processes / array tasks"),
        storage: str | None = Storage,
        profile: Profile = None,
        out: RunsRoot = None):
    """Create (or resume) the study and run its workers until the trial budget is used."""
    check_choice("--executor", executor, ("local", "slurm", "inline"))
    s = _load(spec, out, storage)
    preflight_runs(_preflight_configs(s), spec)
    jobs = launch(s, executor, workers, profile)
    if (executor or s.executor["name"]) == "slurm":
        console.print(f"submitted {len(jobs)} workers: SLURM array {jobs[0].job_id.split('_')[0]} -> {s.out}")
        return
    # the worker's exit code, not its result pickle: nothing from the (shared) runs root is unpickled
    failed = [j.job_id for j in jobs if not j.paths.result_pickle.exists() or j._process.poll() != 0]
    del jobs
    gc.collect()  # submitit's LocalJob.__del__ fails noisily when it runs at interpreter exit
    _print_status(s)
    if failed:
        typer.secho(f"worker(s) {', '.join(failed)} ended without a result; logs in {s.out / '.submitit'}",
                    fg="red", err=True)
        raise typer.Exit(1)


@tune_app.command(cls=Command)
def status(spec: SearchSpec, storage: str | None = Storage, out: RunsRoot = None, as_json: AsJson = False,
           wide: Wide = False):
    """Best trial (and a sweep snippet reproducing it), trials by state, parameter importances."""
    s = _load(spec, out, storage)
    prefix = next((p for p in ("sqlite:///", "journal:") if s.storage.startswith(p)), None)
    if prefix and not Path(s.storage[len(prefix):]).exists():  # opening it would create an empty study database
        fail(f"no study {s.name!r}: {s.storage[len(prefix):]} does not exist (run `ablate tune "
                    f"{spec}` first)")
    try:
        if as_json:
            typer.echo(json.dumps(summary(s), indent=1, default=str))
        else:
            _print_status(s, wide)
    except KeyError as err:  # optuna.load_study: no such study
        fail(f"no study {s.name!r} in {s.storage} ({err})")


def _print_status(s, wide: bool = False) -> None:
    info = summary(s)
    keys = [p.key for p in s.params]
    rows = []
    for t in info["trials"]:
        note = f"retry of {t['retry_of']}" if t["retry_of"] is not None else "".join((t["error"] or "").splitlines()[-1:])
        rows.append([str(t["number"]), t["state"], "" if t["value"] is None else f"{t['value']:.4g}",
                     *[str(t["params"].get(k, "-")) for k in keys], " ".join(t["run_ids"]), note])
    typer.echo(f"study {s.name} ({s.storage})")
    typer.echo(text_table(["#", "state", s.metric, *keys, "run ids", "note"], rows, table_width(wide),
                          drop=("run ids",), squeeze="note", abbrev=short_keys([s.metric, *keys])))
    console.print("trials: " + "  ".join(f"{k}: {v}" for k, v in sorted(info["counts"].items())))
    if info["importances"]:
        console.print("importance: " + "  ".join(f"{k} {v:.2f}" for k, v in info["importances"].items()))
    else:
        console.print(f"importance: {info['importance_note']}")
    if info["best"]:
        best = info["best"]
        console.print(f"best trial {best['number']}: {s.metric} = {best['value']:.4g}; as a sweep spec:")
        typer.echo(info["snippet"])
    for w in info["warnings"]:
        typer.secho(f"warning: {w}", fg="yellow", err=True)
    if s.storage.startswith("sqlite:///"):
        console.print(f"dashboard: optuna-dashboard {s.storage}", markup=False)


@tune_app.command(cls=Command)
def confirm(spec: SearchSpec,
            top: int = typer.Option(3, "--top", metavar="K", help="how many of the best trials to rerun"),
            seeds: int = typer.Option(5, "--seeds", metavar="S", help="fresh seeds per arm"),
            storage: str | None = Storage,
            out: RunsRoot = None,
            run_now: bool = typer.Option(False, "--run", help="also run the sweep (local) and write its report")):
    """Rerun the best trials and the baseline on fresh seeds as a sweep: writes SPEC_confirm.yaml next to
    the search spec; `ablate sweep run` it, then `ablate report` compares each trial to the baseline."""
    import yaml

    if top < 1 or seeds < 2:
        fail("--top must be >= 1 and --seeds >= 2 (an interval needs two seeds)")
    s = _load(spec, out, storage)
    path = spec.parent / f"{s.name}_confirm.yaml"
    check_output(path, "the confirmation spec", folder=False)
    try:
        trials = summary(s)["trials"]
    except KeyError as err:
        fail(f"no study {s.name!r} in {s.storage} ({err})")
    body = confirm_spec(s, trials, top, seeds)
    if len(body["arms"]) == 1:
        fail(f"study {s.name!r} has no completed trial to confirm")
    path.write_text(f"# {len(body['arms']) - 1} best trials of {s.name} and the baseline on fresh seeds "
                    f"(ablate tune confirm)\n" + yaml.safe_dump(body, sort_keys=False))
    typer.echo(f"wrote {path}\n  ablate sweep run {path}\n  ablate report {body['out']} --metric {s.metric}")
    if run_now:
        from ablate.analysis.report import build_report
        from ablate.cli.sweep import run as sweep_run

        try:
            sweep_run(path, executor="local", profile=None, max_parallel=None, out=None, quiet=True, wait=False,
                      poll=10.0)
        except typer.Exit as e:
            if e.exit_code:
                raise
        report = Path("reports") / f"{s.name}_confirm.html"
        rep = build_report([body["out"]], report, metric=s.metric)
        typer.echo(f"wrote {report}")
        for line in rep.base_lines + rep.headline:
            typer.echo(f"  {line}")
