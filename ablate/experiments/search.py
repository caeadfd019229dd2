"""Hyper-parameter search with Optuna over the shared trainer (docs/tune.md).

    spec = load_search("sweeps/tune_toy.yaml")   # checked before any trial starts (SpecError otherwise)
    run_worker(spec)                             # one worker: ask -> train each seed (reporting evals) -> tell

`ablate tune` (cli_tune.py) creates the study and starts N workers (local processes or a SLURM array)
on one shared storage. A trial's config is built exactly like a sweep arm (sweep.py), so the best trial
pasted into a sweep reproduces its run ids; it trains one normal run folder per seed, `<out>/<run_id>/`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.util
import json
import os
import random
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback as Retry
from optuna.trial import TrialState

from ablate import config as C
from ablate.experiments import sweep as S
from ablate.experiments.sweep import SpecError
from ablate.schema import (
    Choice,
    Count,
    Integer,
    Length,
    Natural,
    NonEmptyLine,
    Positive,
    Range,
    Text,
    parse_section,
    value_problems,
)

SAMPLERS = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
            "grid": optuna.samplers.RandomSampler,  # never samples: the grid is enqueued (open_study)
            "cmaes": optuna.samplers.CmaEsSampler}
PRUNERS = {"median": optuna.pruners.MedianPruner, "hyperband": optuna.pruners.HyperbandPruner,
           "none": optuna.pruners.NopPruner}
# the options each sampler / pruner takes (their types and domains: SamplerSection, PrunerSection)
OPTIONS = {"tpe": ("seed", "n_startup_trials", "multivariate", "group", "constant_liar"), "random": ("seed",),
           "grid": ("seed",), "cmaes": ("seed", "n_startup_trials", "sigma0", "restart_strategy"),
           "median": ("n_startup_trials", "n_warmup_steps", "interval_steps"),
           "hyperband": ("min_resource", "max_resource", "reduction_factor"), "none": ()}
SamplerSeed = Annotated[int, Integer(0, 2**31 - 1)]  # numpy's RandomState, plus the worker number


@dataclass(frozen=True)
class SamplerSection:
    name: Literal["tpe", "random", "grid", "cmaes"] = "tpe"
    seed: SamplerSeed | None = None
    n_startup_trials: Natural | None = None
    multivariate: bool | None = None
    group: bool | None = None
    constant_liar: bool | None = None
    sigma0: Positive | None = None
    restart_strategy: Literal["ipop", "bipop"] | None = None


@dataclass(frozen=True)
class PrunerSection:
    name: Literal["median", "hyperband", "none"] = "median"
    n_startup_trials: Natural | None = None
    n_warmup_steps: Natural | None = None
    interval_steps: Count | None = None
    min_resource: Count | None = None
    max_resource: Count | None = None
    reduction_factor: Annotated[int, Integer(min=2)] | None = None


@dataclass(frozen=True)
class Objective:
    metric: NonEmptyLine | None = None       # required: a held-out metric of the base config
    direction: Literal["maximize", "minimize"] = "maximize"
    last_k: Count = 1


@dataclass(frozen=True)
class Heartbeat:
    interval_s: Count = 60
    grace_period_s: Count = 180
    max_retry: Natural = 3


@dataclass(frozen=True)
class TuneExecutor:
    name: Literal["local", "slurm"] = "local"
    workers: Count = 1
    timeout_min: S.Minutes | None = None


Number = Annotated[int, Range()] | Annotated[float, Range()]  # finite


@dataclass(frozen=True)
class ParamSection:
    """One `search:` entry written as a mapping (a plain list is `categorical` choices)."""

    type: Literal["float", "int", "categorical"]
    low: Number | None = None
    high: Number | None = None
    log: bool = False
    step: Annotated[int, Range(0, lo_open=True)] | Annotated[float, Range(0, lo_open=True)] | None = None
    choices: Annotated[tuple[Any, ...], Length(min=1)] | None = None
    when: dict[str, Any] | None = None


@dataclass(frozen=True)
class SearchSchema:
    """The keys of a search spec; name, base, seeds, slurm_profile and out are a sweep spec's (SweepSchema)."""

    name: Any = None
    description: Annotated[str, Text(lines=True)] | None = None
    base: Any = None
    search: dict[str, Any] | None = None
    objective: Objective | None = None
    trials: Count | None = None              # default: the grid's size with sampler grid
    seeds: Any = None
    sampler: SamplerSection | None = None
    pruner: PrunerSection | None = None
    storage: NonEmptyLine | None = None      # checked at the boundary: check_storage
    heartbeat: Heartbeat | None = None
    executor: TuneExecutor | None = None
    slurm_profile: Any = None
    out: Any = None


SWEEP_PART = ("name", "base", "seeds", "slurm_profile", "out")
STORAGES = ("sqlite:///", "journal:", "postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://",
            "mysql://", "mysql+pymysql://")
HEARTBEAT = dataclasses.asdict(Heartbeat())
OPS = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
       "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "in": lambda a, b: a in b}
EVAL_METRICS = ("greedy_acc", "reward_mean", "completion_len_mean", "frac_never_solved", "frac_always_solved",
                "train_minus_heldout_reward")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used with Study.optimize")  # we beat it


@dataclass(frozen=True)
class Param:
    key: str                                   # dotted config key, or "preset"
    kind: str                                  # float | int | categorical
    low: Any = None                            # float / int: low, high, log, step
    high: Any = None
    log: bool = False
    step: Any = None
    choices: tuple = ()                        # categorical
    when: dict = field(default_factory=dict)   # earlier key -> {op: value}: the param exists only if all hold

    def grid(self) -> list:
        step = self.step or 1
        return list(self.choices) or [self.low + i * step for i in range(int((self.high - self.low) / step + 1e-9) + 1)]


@dataclass
class SearchSpec:
    source: str
    raw: dict
    sweep: S.Sweep            # the base part (name, base, seeds, slurm_profile, out), parsed by sweep.parse_spec
    params: list[Param]
    metric: str
    direction: str
    last_k: int
    n_trials: int
    seeds: list[int]
    sampler: dict
    pruner: dict
    storage: str
    heartbeat: dict
    executor: dict
    steps: int                # the base config's steps: the pruning step axis is seed index * steps + step

    name = property(lambda self: self.sweep.name)
    out = property(lambda self: self.sweep.out)


# --- the spec ----------------------------------------------------------------------------------------

def load_search(path: str | Path, out: str | Path | None = None, storage: str | None = None) -> SearchSpec:
    """Read and check a search spec (`out`, `storage` override the spec's); SpecError names the file and key."""
    path, source = Path(path), str(path)
    raw = S.read_spec_file(path, "search spec")

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            raise SpecError(f"{source}: {key}: {msg}")

    schema = parse_section(SearchSchema, raw, source, SpecError)  # keys, types and domains
    # the sweep spec's part: name, base (config / preset / overrides), seeds, slurm_profile, out
    sw = S.parse_spec({k: raw[k] for k in SWEEP_PART if k in raw}, source, path.parent)
    sw.overrides = {"tracking.wandb.job_type": "tune-trial", **sw.overrides}
    sw.out = Path(out or sw.out).resolve()  # absolute: workers may start in another directory
    base_runs = S.expand(sw)  # the base config itself must be valid
    cfg = base_runs[0].config

    need(bool(schema.search), "search", "required: a mapping of config key -> distribution")
    params: list[Param] = []
    for k, v in schema.search.items():
        params.append(_param(f"search.{k}", k, v, [p.key for p in params], need, source))

    obj = schema.objective or Objective()
    known = [f"eval/pass@{k}" for k in cfg.eval.ks] + [f"eval/{m}" for m in EVAL_METRICS] \
        + ["eval/pass@1_exact"] * (cfg.task.name == "toy_addition")
    need(obj.metric in known, "objective.metric",
         f"{obj.metric!r} is not a held-out metric of this config; one of: {', '.join(known)}")
    for key, body in (("sampler", schema.sampler or SamplerSection()), ("pruner", schema.pruner or PrunerSection())):
        given = {k: v for k, v in dataclasses.asdict(body).items() if v is not None and k != "name"}
        for k in given:
            need(k in OPTIONS[body.name], f"{key}.{k}",
                 f"not an option of {body.name} ({', '.join(OPTIONS[body.name]) or 'none'})")
        raw[key] = {"name": body.name, **given}
    grid = raw["sampler"]["name"] == "grid"
    for p in params if grid else ():
        need(p.kind == "categorical" or p.step is not None or p.kind == "int" and not p.log, f"search.{p.key}",
             "the grid sampler needs a `step` for floats (and no log ints)")
    need(raw["sampler"]["name"] != "cmaes" or importlib.util.find_spec("cmaes") is not None, "sampler.name",
         "cmaes needs the `cmaes` package (pip install cmaes)")
    heartbeat = dataclasses.asdict(schema.heartbeat or Heartbeat())
    executor = dataclasses.asdict(schema.executor or TuneExecutor())
    executor = {k: v for k, v in executor.items() if v is not None}
    grid_size = len(grid_points(params)) if grid else None
    n_trials = schema.trials if schema.trials is not None else grid_size
    need(n_trials is not None, "trials", "required: an integer >= 1")
    need(not grid or n_trials <= grid_size, "trials", f"{n_trials} is more than the grid's {grid_size} configurations")
    storage = check_storage(storage, "--storage") if storage is not None else \
        check_storage(schema.storage, f"{source}: storage") if schema.storage is not None else \
        check_storage(f"sqlite:///{sw.out / 'study.db'}", f"{source}: out")
    spec = SearchSpec(source, raw, sw, params, obj.metric, obj.direction, obj.last_k, n_trials,
                      [r.seed for r in base_runs], raw["sampler"], raw["pruner"], storage, heartbeat, executor,
                      cfg.steps)
    for key, make in (("sampler", make_sampler), ("pruner", make_pruner)):
        try:  # option values (types, ranges) are checked by Optuna itself
            make(spec)
        except (TypeError, ValueError) as e:
            need(False, key, str(e))
    return spec


def _param(key: str, dotted: str, body: Any, earlier: list[str], need, source: str) -> Param:
    """One `search:` entry; `earlier` are the keys listed before it (the only ones a condition may name)."""
    body = {"type": "categorical", "choices": body} if isinstance(body, list) else body
    need(isinstance(body, dict), key, "expected a list of choices or a mapping with type: float | int | categorical")
    p = parse_section(ParamSection, body, source, SpecError, prefix=key)  # keys, types and domains
    allowed = ("type", "choices", "when") if p.type == "categorical" else ("type", "low", "high", "log", "step", "when")
    for k in body:
        need(k in allowed, f"{key}.{k}", f"not a key of a {p.type} parameter; valid keys: {', '.join(allowed)}")
    need(dotted != "seed", key, "not searchable (use `seeds:`)")
    try:
        tp = Annotated[str, Choice(tuple(C.PRESETS))] if dotted == "preset" else S.field_type(dotted)
    except KeyError:
        tp = need(False, key, f"{dotted!r} is not a config field (see ablate/config.py)")
    when = dict(p.when or {})
    for k, c in list(when.items()):
        need(k in earlier, f"{key}.when.{k}", "must be a search key listed before this one")
        when[k] = c = c if isinstance(c, dict) else {"in": c} if isinstance(c, list) else {"eq": c}
        need(set(c) <= set(OPS), f"{key}.when.{k}", f"unknown condition; one of {', '.join(OPS)}")

    def check(sub: str, v: Any) -> Any:
        """`v` as a value of the searched field: its type and its domain."""
        try:
            v = C.coerce(v, tp, dotted, None)
        except C.ConfigError as e:
            need(False, f"{key}.{sub}", str(e))
        bad = value_problems(v, tp, dotted)
        need(not bad, f"{key}.{sub}", "; ".join(bad))
        return v

    if p.type == "categorical":
        need(p.choices is not None, f"{key}.choices", "required: a non-empty list")
        vals = tuple(check(f"choices[{i}]", v) for i, v in enumerate(p.choices))
        need(all(v is None or isinstance(v, (bool, int, float, str)) for v in vals) and len(set(vals)) == len(vals),
             f"{key}.choices", "choices must be distinct scalars (null, bool, number or string)")
        return Param(dotted, "categorical", choices=vals, when=when)
    low, high, log, step = p.low, p.high, p.log, p.step
    for sub, v in (("low", low), ("high", high), ("step", step or 1)):
        need(v is not None and (p.type == "float" or isinstance(v, int)), f"{key}.{sub}",
             f"expected {'an integer' if p.type == 'int' else 'a number'}, got {v!r}")
    check("low", low), check("high", high)
    need(low < high, key, f"needs low < high (got low={low}, high={high})")
    need(not log or low > 0, f"{key}.low", f"a log range needs low > 0 (got {low})")
    need(step is None or not log, f"{key}.step", "not with log: true")
    return Param(dotted, p.type, low, high, log, step, when=when)


# --- storage, sampler, pruner, study -----------------------------------------------------------------

def _rdb_url(url: str) -> str:
    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None:
        url = "postgresql+psycopg2" + url.removeprefix("postgresql")  # SQLAlchemy >= 2.1 defaults to psycopg 3
    return url


def check_storage(url: str, where: str) -> str:
    """`url` with file paths made absolute, once it is known to be a storage this search can open; else
    SpecError naming `where` (the spec's `storage` or --storage): not a storage URL, a folder, a file that
    is not an SQLite database or not an Optuna journal, a parent that is a file, or a database server that
    does not answer. Writes nothing (the storage is created when the study is)."""
    def bad(msg: str):
        raise SpecError(f"{where}: {shown!r}: {msg}")

    shown = url
    if not Text(min_len=1).ok(url) or not url.startswith(STORAGES):
        bad(f"not a storage URL; allowed: sqlite:///PATH, journal:PATH or a database URL "
            f"({', '.join(STORAGES[2:])}...)")
    prefix = next((p for p in ("sqlite:///", "journal:") if url.startswith(p)), "")
    if prefix != "journal:":
        try:  # Optuna reads an RDB URL as a str.format template
            url.format(SCHEMA_VERSION="")
        except (KeyError, IndexError, ValueError):
            bad("holds '{' or '}', which Optuna reads as a template ({SCHEMA_VERSION} is the only field)")
    if not prefix:
        import sqlalchemy

        shown = sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
        try:
            with sqlalchemy.create_engine(_rdb_url(url), connect_args={"connect_timeout": 10}).connect():
                pass
        except Exception as e:  # noqa: BLE001 - a missing driver, a refused connection, bad credentials
            bad(f"cannot connect: {str(getattr(e, 'orig', None) or e).strip().splitlines()[0]}")
        return url
    if not url[len(prefix):].strip():
        bad("no file after the prefix")
    path = Path(url[len(prefix):]).resolve()
    parent = next(p for p in path.parents if p.exists())
    if path.is_dir():
        bad(f"{path} is a folder; give a file (it is created if missing)")
    if not parent.is_dir():
        bad(f"{parent} is a file, not a folder")
    if path.exists() and prefix == "sqlite:///":
        import sqlite3

        try:
            with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as e:
            bad(f"{path} is not an SQLite database ({e})")
    if path.exists() and prefix == "journal:":
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
        try:
            if first and not isinstance(json.loads(first), dict):
                raise ValueError
        except ValueError:
            bad(f"{path} is not an Optuna journal (its lines are JSON objects)")
    return prefix + str(path)


def make_storage(url: str, heartbeat: dict = HEARTBEAT) -> optuna.storages.BaseStorage:
    """journal:PATH -> JournalStorage on a file (no heartbeats); anything else is an RDB URL (sqlite, postgresql,
    mysql) with heartbeats: trials of dead workers are failed after the grace period and retried."""
    path = Path(url.split(":", 1)[1].removeprefix("///"))
    if url.startswith(("journal:", "sqlite:///")):
        path.parent.mkdir(parents=True, exist_ok=True)
    if url.startswith("journal:"):
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    return optuna.storages.RDBStorage(  # sqlite: wait for the write lock instead of "database is locked"
        _rdb_url(url), engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None,
        heartbeat_interval=heartbeat["interval_s"], grace_period=heartbeat["grace_period_s"],
        heartbeat_stale_trial_callback=Retry(max_retry=heartbeat["max_retry"]))


def grid_points(params: list[Param]) -> list[dict[str, Any]]:
    """Every distinct configuration of a grid, in spec order: a conditional parameter multiplies only
    the configurations where its conditions hold (an inactive one is absent, not a duplicate)."""
    points: list[dict[str, Any]] = [{}]
    for p in params:
        points = [new for v in points for new in ([{**v, p.key: x} for x in p.grid()] if _active(p, v) else [v])]
    return points


def _active(p: Param, values: dict[str, Any]) -> bool:
    return all(k in values and all(OPS[op](values[k], v) for op, v in c.items()) for k, c in p.when.items())


def make_sampler(spec: SearchSpec, worker: int = 0) -> optuna.samplers.BaseSampler:
    """Worker i samples with seed + i: identically seeded workers would propose identical trials. A grid
    search samples nothing: its points are enqueued once, at creation (open_study), and dequeued."""
    kw = {k: v + worker if k == "seed" and v is not None else v for k, v in spec.sampler.items() if k != "name"}
    return SAMPLERS[spec.sampler["name"]](**kw)


def make_pruner(spec: SearchSpec) -> optuna.pruners.BasePruner:
    kw = {"max_resource": spec.steps * len(spec.seeds)} if spec.pruner["name"] == "hyperband" else {}
    return PRUNERS[spec.pruner["name"]](**{**kw, **{k: v for k, v in spec.pruner.items() if k != "name"}})


def open_study(spec: SearchSpec, worker: int = 0, create: bool = False) -> optuna.Study:
    kw = lambda: dict(study_name=spec.name, storage=make_storage(spec.storage, spec.heartbeat),  # noqa: E731
                      sampler=make_sampler(spec, worker), pruner=make_pruner(spec))
    if not create:
        return optuna.load_study(**kw())
    spec.out.mkdir(parents=True, exist_ok=True)
    with open(spec.out / ".study.lock", "w") as lock:  # two `ablate tune` starting at once: one creates the
        fcntl.flock(lock, fcntl.LOCK_EX)                 # storage's tables and the study, the other finds them
        return _create_study(spec, kw())


def _create_study(spec: SearchSpec, kw: dict) -> optuna.Study:
    study = optuna.create_study(direction=spec.direction, load_if_exists=True, **kw)
    if study.direction.name.lower() != spec.direction:
        raise SpecError(f"{spec.source}: objective.direction: study {spec.name!r} in {spec.storage} exists with "
                        f"direction {study.direction.name.lower()}")
    study.set_user_attr("spec", spec.raw)
    if spec.sampler["name"] == "grid" and not study.get_trials(deepcopy=False):
        # Enqueued once, here, before any worker starts: a worker takes a waiting trial atomically, so no
        # two workers run one point (Optuna's GridSampler lets simultaneous workers pick the same one).
        points = grid_points(spec.params)
        random.Random(spec.sampler.get("seed")).shuffle(points)
        for values in points[: spec.n_trials]:
            study.enqueue_trial(values)
    return study


# --- one trial ---------------------------------------------------------------------------------------

def suggest(trial: optuna.Trial, params: list[Param]) -> dict[str, Any]:
    """The trial's values in spec order; a conditional param is asked only when its conditions hold."""
    values: dict[str, Any] = {}
    for p in params:
        if _active(p, values):
            values[p.key] = (trial.suggest_categorical(p.key, p.choices) if p.kind == "categorical" else
                             trial.suggest_int(p.key, p.low, p.high, log=p.log, step=p.step or 1) if p.kind == "int"
                             else trial.suggest_float(p.key, p.low, p.high, log=p.log, step=p.step))
    return values


def trial_runs(spec: SearchSpec, values: dict[str, Any], number: int | None = None) -> list[S.RunSpec]:
    """One validated run per seed: the base sweep with a single arm holding the trial's values."""
    arm = {**values, **({"tracking.wandb.name": f"{spec.name}-trial{number}"} if number is not None else {})}
    return S.expand(replace(spec.sweep, arms={"trial": arm}))  # tracking is not in the run id


def objective(evals: list[dict], metric: str, last_k: int) -> float:
    """The metric at the last evaluation, or its mean over the last K (the untrained step-0 row excluded)."""
    rows = [r[metric] for r in evals if r["step"] > 0][-last_k:]  # a finished run always evaluates its last step
    return sum(rows) / len(rows)


def heartbeat_interval(study: optuna.Study) -> int | None:
    """Seconds between heartbeats; None for storages without them (journal)."""
    return getattr(study._storage, "get_heartbeat_interval", lambda: None)()


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial):
    """Record the trial's heartbeat every interval while it runs (study.optimize does this; ask/tell
    leaves it to us), through the storage's public record_heartbeat."""
    interval, stop = heartbeat_interval(study), threading.Event()
    if interval is None:
        yield
        return

    def beat():
        while True:
            study._storage.record_heartbeat(trial._trial_id)
            if stop.wait(interval):
                return
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def slurm_job_id() -> str | None:
    """The SLURM job (array task: JOB_TASK) this worker runs in, None outside SLURM."""
    env = os.environ
    if "SLURM_ARRAY_JOB_ID" in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '0')}"
    return env.get("SLURM_JOB_ID")


def run_trial(spec: SearchSpec, study: optuna.Study, trial: optuna.Trial) -> str:
    """Train the trial's runs (one per seed, each evaluation reported for pruning) and tell the study."""
    from ablate.runs.store import RunStore
    from ablate.train import preemption
    from ablate.train.trainer import train

    def reporter(offset: int):  # the trainer's should_prune(step, eval_row): report, then ask the pruner
        return lambda step, ev: trial.report(float(ev[spec.metric]), offset + step) or trial.should_prune()

    with heartbeat(study, trial):
        try:
            runs = trial_runs(spec, suggest(trial, spec.params), trial.number)
            for k, v in {"run_ids": [r.run_id for r in runs], "out": str(spec.out),
                         "worker": f"{os.uname().nodename}:{os.getpid()}", "slurm_job": slurm_job_id()}.items():
                trial.set_user_attr(k, v)
            values, states = [], []
            for i, r in enumerate(runs):  # trials with one config share a run folder: the 2nd waits, then reads it
                with open(spec.out / f".{r.run_id}.lock", "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    states.append(train(r.config, str(spec.out / r.run_id), False, reporter(i * r.config.steps)))
                if states[-1] != "completed":
                    break
                values.append(objective(RunStore(spec.out / r.run_id).read("evals"), spec.metric, spec.last_k))
            trial.set_user_attr("states", states), trial.set_user_attr("values", values)
            if states[-1] not in ("completed", "pruned"):  # diverged
                raise RuntimeError(f"run {runs[len(states) - 1].run_id} ended {states[-1]}")
            pruned = states[-1] == "pruned"  # else completed: the mean over seeds
            study.tell(trial, None if pruned else sum(values) / len(values), TrialState.PRUNED if pruned else None)
        except Exception as err:  # noqa: BLE001 - a bad trial must not stop the worker
            trial.set_user_attr("error", f"{type(err).__name__}: {err}"[:2000])
            study.tell(trial, state=TrialState.FAIL)
        except BaseException:
            if not preemption.checkpointed_for_requeue():  # preempted: left running; its heartbeat goes stale
                study.tell(trial, state=TrialState.FAIL)
            raise
    return study._storage.get_trial(trial._trial_id).state.name.lower()


def claim_worker_slot(out: Path, worker: int):
    """The lowest worker number >= `worker` that no live process on this runs root holds (a file lock each),
    and its open lock file: two `ablate tune` processes on one study get different sampler seeds."""
    i = worker
    while True:
        f = open(out / f".worker-{i}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return i, f
        except BlockingIOError:
            f.close()
            i += 1


def run_worker(spec: SearchSpec, worker: int = 0, poll_s: float = 1.0, log=print) -> int:
    """Pull trials until `trials` configurations were sampled (retries do not count) and none waits; with
    heartbeats, also wait for running trials to end or go stale (and be retried). Returns trials run."""
    spec.out.mkdir(parents=True, exist_ok=True)
    slot, _lock = claim_worker_slot(spec.out, worker)  # held until this worker returns
    study = open_study(spec, slot)
    beats, ran = heartbeat_interval(study) is not None, 0
    while True:
        optuna.storages.fail_stale_trials(study)  # no-op without heartbeats
        trials = study.get_trials(deepcopy=False)
        if sum(Retry.retried_trial_number(t) is None for t in trials) >= spec.n_trials \
                and not any(t.state == TrialState.WAITING for t in trials):
            if beats and any(t.state == TrialState.RUNNING for t in trials):
                time.sleep(poll_s)
                continue
            return ran
        trial = study.ask()
        log(f"worker {worker}: trial {trial.number} {run_trial(spec, study, trial)}")
        ran += 1
