"""Sweep specs: YAML -> a list of fully resolved, validated runs (pure; submits nothing).

    spec = load_spec("sweeps/quickstart.yaml")   # structure, keys and value types checked
    runs = expand(spec)                          # every run parsed + validated; duplicates collapsed

Precedence when a run's config is built (lowest first): the run's preset < the base config file <
`base.overrides` < the arm's keys < grid / zip / include values < seed. A run has one preset, the most
specific one named (the arm's, else `base.preset`, else the base config file's); presets are defaults under
every key written anywhere, merged by `config.with_preset` as in `ablate train`.
docs/sweeps.md describes the format.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from ablate import config as C
from ablate.runs.tracking import run_name
from ablate.schema import Choice, Count, Length, PathText, Range, Text, hints, parse_section, plain, value_problems

# a sweep's name names its runs root (runs/<name>), W&B group and SLURM job: one path component
SweepName = Annotated[str, Text(min_len=1, max_len=128, pattern=r"(?!\.\.?$)[^/]+", what="no '/', not '.' or '..'")]
Minutes = Annotated[float, Range(0, lo_open=True)]


@dataclass(frozen=True)
class BaseSection:
    config: PathText | None = None         # a run config file, relative to the spec
    preset: Annotated[str, Choice(tuple(C.PRESETS))] | None = None
    overrides: dict[str, Any] | None = None   # dotted config key -> value (checked against the config's fields)


@dataclass(frozen=True)
class ExecutorSection:
    name: Literal["local", "slurm", "debug"] = "local"
    max_parallel: Count | None = None      # local: processes; slurm: array parallelism
    timeout_min: Minutes | None = None
    signal_delay_s: Count | None = None    # SLURM: the warning signal this long before the time limit
    tasks_per_node: Count | None = None    # local executor: ranks per run


@dataclass(frozen=True)
class SweepSchema:
    """The keys of a sweep spec and their types and domains; grid / zip / arms / exclude / include hold
    config keys and values, checked against the config's own fields by parse_spec."""

    name: SweepName
    description: Annotated[str, Text(lines=True)] | None = None
    base: BaseSection | None = None
    grid: dict[str, Any] | None = None
    zip: Any = None                        # a mapping, or a list of mappings
    arms: dict[str, Any] | None = None
    seeds: Annotated[tuple[C.Seed, ...], Length(min=1)] | None = None
    exclude: tuple[Any, ...] | None = None
    include: tuple[Any, ...] | None = None
    executor: ExecutorSection | None = None
    slurm_profile: PathText | None = None  # relative to the spec
    out: PathText | None = None            # the runs root (default runs/<name>)


TOP_KEYS = tuple(f.name for f in dataclasses.fields(SweepSchema))


class SpecError(ValueError):
    """A bad sweep spec; the message names the spec file and the key."""


class SweepWarning(UserWarning):
    """Something suspicious but not fatal (e.g. an exclude rule that matches nothing)."""


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    config: C.RunConfig
    arm: str | None
    seed: int
    toggles: dict[str, Any]  # the swept keys whose value differs across the sweep -> this run's value


@dataclass
class Sweep:
    name: str
    source: str                               # the spec file (for messages)
    raw: dict                                 # the spec as written (copied into the manifest)
    base: dict                                # base config data as written (its preset merged per run)
    base_preset: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)       # name -> {"preset"?, dotted: value}
    axes: list[tuple[tuple[str, ...], list[tuple]]] = field(default_factory=list)  # (keys, value tuples)
    seeds: list[int] | None = None
    exclude: list[dict[str, Any]] = field(default_factory=list)
    include: list[dict[str, Any]] = field(default_factory=list)
    executor: dict[str, Any] = field(default_factory=dict)
    slurm_profile: Path | None = None
    out: Path = Path("runs")


# --- config-key helpers ------------------------------------------------------------------------------

def field_type(dotted: str) -> Any:
    """The annotation of a dotted RunConfig field, its domain included; KeyError if there is no such (leaf) field."""
    tp: Any = C.RunConfig
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(tp):
            raise KeyError(dotted)
        ann = hints(tp)
        if part not in ann:
            raise KeyError(dotted)
        tp = plain(ann[part]) if dataclasses.is_dataclass(plain(ann[part])) else ann[part]
    if dataclasses.is_dataclass(tp):
        raise KeyError(dotted)  # a section, not a field
    return tp


def _is_list_field(dotted: str) -> bool:
    try:
        return typing.get_origin(plain(field_type(dotted))) is tuple
    except KeyError:
        return False


# --- loading -----------------------------------------------------------------------------------------

def read_spec_file(path: Path, kind: str) -> Any:
    """The YAML of a spec file (`kind`: 'sweep spec', 'search spec'), or SpecError naming the file."""
    if not path.is_file():
        raise SpecError(f"{path}: no such {kind}")
    return C.read_yaml(path, SpecError)


def load_spec(path: str | Path) -> Sweep:
    """Read and check a spec file. Raises SpecError naming the file and the key."""
    path = Path(path)
    return parse_spec(read_spec_file(path, "sweep spec"), str(path), path.parent)


def parse_spec(raw: Any, source: str = "<spec>", root: Path = Path(".")) -> Sweep:
    """Check a spec given as plain data; `root` resolves `base.config` and `slurm_profile`."""
    def err(key: str, msg: str) -> SpecError:
        return SpecError(f"{source}: {key}: {msg}")

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            raise err(key, msg)

    def check_value(key: str, dotted: str, value: Any) -> Any:
        try:
            tp = field_type(dotted)
        except KeyError:
            raise err(key, f"{dotted!r} is not a config field (see ablate/config.py)") from None
        try:
            value = C.coerce(value, tp, dotted, None)
        except C.ConfigError as e:
            raise err(key, f"wrong type: {e}") from None
        bad = value_problems(value, tp, dotted)  # the field's domain
        need(not bad, key, "; ".join(bad))
        return value

    def check_preset(key: str, value: Any) -> None:
        need(isinstance(value, str) and value in C.PRESETS, key, f"unknown preset {value!r}; allowed: {', '.join(C.PRESETS)}")

    schema = parse_section(SweepSchema, raw, source, SpecError)  # keys, types and domains
    name = schema.name

    # base: config file and/or preset, plus overrides
    base_spec = schema.base or BaseSection()
    base: dict = {}
    if base_spec.config is not None:
        cfg_path = root / base_spec.config
        need(cfg_path.is_file(), "base.config", f"no such config file: {cfg_path}")
        base = C.read_yaml(cfg_path, SpecError)
        need(base is not None, "base.config", f"{cfg_path}: empty config")
        need(isinstance(base, dict), "base.config", f"{cfg_path}: expected a mapping")
        if base.get("preset") is not None:
            check_preset(f"base.config ({cfg_path}): preset", base["preset"])
    base_preset = base_spec.preset
    overrides = base_spec.overrides or {}
    for k, v in overrides.items():
        overrides[k] = check_value(f"base.overrides.{k}", k, v)

    # arms
    arms = raw.get("arms") or {}
    need(isinstance(arms, dict), "arms", "expected a mapping of arm name -> settings")
    for arm, body in arms.items():
        need(isinstance(body, dict), f"arms.{arm}", "expected a mapping (preset and/or dotted keys)")
        for k, v in body.items():
            if k == "preset":
                check_preset(f"arms.{arm}.preset", v)
            else:
                check_value(f"arms.{arm}.{k}", k, v)

    # axes: grid keys (one axis each) and zip groups (keys move together)
    axes: list[tuple[tuple[str, ...], list[tuple]]] = []
    seen: dict[str, str] = {}

    def axis_values(key: str, dotted: str, values: Any) -> list:
        need(dotted not in ("seed", "preset"), key, "use `seeds:` for seeds and `arms:` for presets")
        need(isinstance(values, list), key, f"expected a list of values, got {values!r}")
        need(len(values) > 0, key, "empty axis")
        need(dotted not in seen, key, f"{dotted!r} is already swept by {seen.get(dotted)}")
        seen[dotted] = key
        return [check_value(f"{key}[{i}]", dotted, v) for i, v in enumerate(values)]

    grid = raw.get("grid") if raw.get("grid") is not None else {}
    need(isinstance(grid, dict), "grid", "expected a mapping of dotted key -> list of values")
    need(grid != {} or "grid" not in raw, "grid", "empty mapping: name at least one key to sweep, or drop `grid:`")
    for k, values in grid.items():
        axes.append(((k,), [(v,) for v in axis_values(f"grid.{k}", k, values)]))
    zips = raw.get("zip") or []
    zips = [zips] if isinstance(zips, dict) else zips
    need(isinstance(zips, list), "zip", "expected a list of groups (mappings of dotted key -> list)")
    for g, group in enumerate(zips):
        need(isinstance(group, dict) and group, f"zip[{g}]", "expected a non-empty mapping of key -> list")
        cols = {k: axis_values(f"zip[{g}].{k}", k, v) for k, v in group.items()}
        lengths = {k: len(v) for k, v in cols.items()}
        need(len(set(lengths.values())) == 1, f"zip[{g}]",
             "zipped lists must have equal length; got " + ", ".join(f"{k}: {n}" for k, n in lengths.items()))
        axes.append((tuple(cols), list(zip(*cols.values()))))

    seeds = list(schema.seeds) if schema.seeds is not None else None

    # rules
    def rules(kind: str) -> list[dict]:
        items = raw.get(kind) or []
        need(isinstance(items, list), kind, "expected a list of mappings")
        items = [dict(r) if isinstance(r, dict) else r for r in items]
        for i, rule in enumerate(items):
            need(isinstance(rule, dict) and rule, f"{kind}[{i}]", "expected a non-empty mapping")
            for k, v in rule.items():
                key = f"{kind}[{i}].{k}"
                if k == "arm":
                    for a in (v if isinstance(v, list) else [v]):
                        need(a in arms, key, f"unknown arm {a!r}; arms: {', '.join(arms) or '(none)'}")
                elif k == "seed":
                    need(kind == "exclude", key, "include runs take the sweep's seeds; no seed key here")
                    for s in (v if isinstance(v, list) else [v]):
                        need(isinstance(s, int) and not isinstance(s, bool), key, f"expected an integer, got {s!r}")
                elif kind == "exclude" and isinstance(v, list) and not _is_list_field(k):
                    for j, item in enumerate(v):  # a list means "any of" (not for list-valued fields)
                        check_value(f"{key}[{j}]", k, item)
                elif kind == "include":
                    rule[k] = check_value(key, k, v)
                else:
                    check_value(key, k, v)
        return items

    exclude, include = rules("exclude"), rules("include")

    # executor settings (the keys given; null = unset) and profile
    executor = {k: v for k, v in dataclasses.asdict(schema.executor or ExecutorSection()).items()
                if v is not None and k in (raw.get("executor") or {})}
    profile = None
    if schema.slurm_profile:
        profile = root / schema.slurm_profile
        need(profile.is_file(), "slurm_profile", f"no such profile file: {profile}")

    return Sweep(name=name, source=source, raw=json.loads(json.dumps(raw)), base=base, base_preset=base_preset,
                 overrides=overrides, arms=arms, axes=axes, seeds=seeds, exclude=exclude, include=include,
                 executor=executor, slurm_profile=profile, out=Path(schema.out or f"runs/{name}"))


# --- expansion ---------------------------------------------------------------------------------------

def _attr(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return list(cfg) if isinstance(cfg, tuple) else cfg


def _replace(cfg: Any, values: dict[str, Any]) -> Any:
    """dataclasses.replace on dotted keys (values already type-checked)."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for k, v in values.items():
        head, _, rest = k.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = v
        else:
            top[head] = v
    top.update({h: _replace(getattr(cfg, h), sub) for h, sub in nested.items()})
    return dataclasses.replace(cfg, **top)


def _matches(rule: dict, values: dict, arm: str | None, cfg: C.RunConfig) -> bool:
    for k, want in rule.items():
        if k == "arm":
            have = arm
        else:
            have = values[k] if k in values else _attr(cfg, k)
            have = list(have) if isinstance(have, tuple) else have  # axis values of list fields are tuples
        options = want if isinstance(want, list) and not isinstance(have, list) else [want]
        if have not in options:
            return False
    return True


def _set(data: dict, dotted: str, value: Any) -> None:
    """Copy-on-write set_dotted: copies the mappings on the path, so `data` may share the rest."""
    *parents, last = dotted.split(".")
    for p in parents:
        data[p] = dict(data.get(p) or {})
        data = data[p]
    data[last] = list(value) if isinstance(value, tuple) else value


def _points(spec: Sweep):
    """(arm, {dotted: value}, included) for every grid point, then every include entry."""
    arm_names = list(spec.arms) or [None]
    for arm in arm_names:
        for combo in itertools.product(*(values for _, values in spec.axes)):
            yield arm, {k: v for (keys, _), vals in zip(spec.axes, combo) for k, v in zip(keys, vals)}, False
    for rule in spec.include:
        arms = rule.get("arm", arm_names)
        for arm in (arms if isinstance(arms, list) else [arms]):
            yield arm, {k: v for k, v in rule.items() if k != "arm"}, True


def _arm_configs(spec: Sweep) -> dict[str | None, C.RunConfig]:
    """The type-checked (not yet validated) config each arm starts from: its keys, under them its preset."""
    out = {}
    for arm, body in (spec.arms or {None: {}}).items():
        d = json.loads(json.dumps(spec.base))
        _set(d, "tracking.wandb.group", spec.name)  # W&B groups a sweep's runs (not part of the run id)
        for k, v in [*spec.overrides.items(), *((k, v) for k, v in body.items() if k != "preset")]:
            _set(d, k, v)
        d["preset"] = body.get("preset") or spec.base_preset or d.get("preset")  # the most specific one
        try:
            out[arm] = C.build_section(C.RunConfig, C.with_preset(d), "", None)
        except C.ConfigError as e:
            raise SpecError(f"{spec.source}: {f'arms.{arm}' if arm else 'base'}: {e}") from None
    return out


def expand(spec: Sweep) -> list[RunSpec]:
    """Every run of the sweep, resolved and validated (`config.validate`); runs with the same run id
    collapse to the first. Raises SpecError listing every invalid run; warns (SweepWarning) on an
    exclude rule that matches nothing. Equivalent to `config.parse` per run, without re-parsing."""
    arm_cfgs = _arm_configs(spec)
    arm_dicts = {a: C.to_dict(c) for a, c in arm_cfgs.items()}
    seeds = spec.seeds if spec.seeds is not None else [None]
    used = [False] * len(spec.exclude)
    runs: dict[str, RunSpec] = {}
    swept: dict[str, None] = {}
    bad: dict[str, str] = {}
    for arm, point, included in _points(spec):
        swept.update(dict.fromkeys(point))
        point_cfg, point_ok = None, False  # a point's validity does not depend on its seed (beyond seed >= 0)
        for seed in seeds:
            values = point if seed is None else {**point, "seed": seed}
            if not included and spec.exclude:
                hit = [i for i, r in enumerate(spec.exclude) if _matches(r, values, arm, arm_cfgs[arm])]
                for i in hit:
                    used[i] = True
                if hit:
                    continue
            # hash the plain dict (values are already type-coerced): building a config per duplicate is slow
            d = dict(arm_dicts[arm])
            for k, v in values.items():
                _set(d, k, v)
            rid = C.hash_config(d)
            if rid in runs or rid in bad:
                continue
            point_cfg = point_cfg or _replace(arm_cfgs[arm], point)
            cfg = point_cfg if seed is None else dataclasses.replace(point_cfg, seed=seed)
            if not (point_ok and cfg.seed >= 0):  # validated once per point: linear and ~10x cheaper in seeds
                try:
                    C.validate(cfg)
                    point_ok = True
                except C.ConfigError as e:
                    where = ", ".join([f"arm={arm}"] * (arm is not None) + [f"{k}={v!r}" for k, v in values.items()])
                    bad[rid] = f"run ({where}): {str(e).replace(chr(10), chr(10) + '    ')}"
                    continue
            runs[rid] = RunSpec(rid, cfg, arm, cfg.seed, {})
    if bad:
        raise SpecError(f"{spec.source}: {len(bad)} invalid run(s); nothing submitted:\n  - "
                        + "\n  - ".join(bad.values()))
    for i, used_i in enumerate(used):
        if not used_i:
            warnings.warn(f"{spec.source}: exclude[{i}]: rule {spec.exclude[i]} matches no run", SweepWarning,
                          stacklevel=2)
    return _with_toggles(list(runs.values()), list(swept) + [k for a in spec.arms.values() for k in a if k != "preset"])


def _with_toggles(runs: list[RunSpec], keys: list[str]) -> list[RunSpec]:
    keys = list(dict.fromkeys(keys))
    table = {k: [_attr(r.config, k) for r in runs] for k in keys}
    varying = [k for k in keys if len({json.dumps(v) for v in table[k]}) > 1]
    out = []
    for i, r in enumerate(runs):
        toggles = {k: table[k][i] for k in varying}
        # the W&B run name says what differs (tracking is not part of the run id)
        wandb = dataclasses.replace(r.config.tracking.wandb, name=run_name(r.config, toggles, r.arm))
        cfg = dataclasses.replace(r.config, tracking=dataclasses.replace(r.config.tracking, wandb=wandb))
        out.append(dataclasses.replace(r, config=cfg, toggles=toggles))
    return out
