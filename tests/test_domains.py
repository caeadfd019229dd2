"""Every numeric and string field of every schema (run config, sweep spec, search spec, SLURM profile) has a
domain on its annotation (ablate/schema.py), and the tests here are generated from those domains: for every
field, values just outside its domain and values of the wrong YAML type are refused by the schema's own
parser, naming the file and the field; a sample per schema goes through the real CLI (exit 2, nothing
written). A new field without a domain fails test_every_field_has_a_domain."""

import dataclasses
import hashlib
import math
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from typer.testing import CliRunner

from ablate import config as C
from ablate.cli.main import app
from ablate.experiments import search as H
from ablate.experiments import sweep as S
from ablate.experiments.slurm_profile import SlurmProfile, load_profile
from ablate.schema import (
    INT_MAX,
    Choice,
    ConfigError,
    Integer,
    Length,
    PathName,
    Range,
    Text,
    domains,
    hints,
    matches,
    plain,
)

ROOT = Path(__file__).resolve().parent.parent
TOY = yaml.safe_load((ROOT / "configs" / "toy.yaml").read_text())
SPEC = {"name": "s", "base": {"config": "toy.yaml", "overrides": {"steps": 2}}, "seeds": [0]}
SEARCH = {"name": "t", "base": {"config": "toy.yaml", "overrides": {"steps": 2}}, "seeds": [0], "trials": 2,
          "search": {"optim.lr": {"type": "float", "low": 0.1, "high": 1.0}}, "objective": {"metric": "eval/pass@1"}}
# schema -> (the file its errors name, a valid document); ParamSection is one entry of a search's `search:`
SCHEMAS = {"config": (C.RunConfig, "c.yaml", {}), "sweep spec": (S.SweepSchema, "s.yaml", SPEC),
           "search spec": (H.SearchSchema, "t.yaml", SEARCH), "search entry": (H.ParamSection, "t.yaml", SEARCH),
           "SLURM profile": (SlurmProfile, "p.yaml", {})}
# fields whose values are checked elsewhere than by a domain, and where
FREE_FORM = {
    "config": {f: "reasoning-gym's own config class (resources.rg_config_problems)"
               for f in ("task.rg_config", "task.mixture[].rg_config")},
    "sweep spec": {f: "each key and value against the config's fields and domains (sweep.parse_spec)"
                   for f in ("base.overrides", "grid", "zip", "arms", "exclude[]", "include[]")},
    "search spec": {**{f: "the sweep spec's schema (SweepSchema)" for f in ("name", "base", "seeds", "slurm_profile",
                                                                           "out")},
                    "search": "each entry: ParamSection, then the searched config field's type and domain"},
    "search entry": {"choices[]": "the searched config field's type and domain (search._param)",
                     "when": "earlier search keys and conditions (search._param)"},
    "SLURM profile": {"additional": "sbatch option names and one-line scalar values (slurm_profile.load_profile)"},
}


def arms(tp) -> list:
    tp = plain(tp)
    if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def leaves(cls, prefix=(), seen=()):
    """(path, annotation) of every field below `cls`, through sections, unions, optional sections and lists
    (a list's items as index 0); a section inside itself (a mixture entry's own `mixture`) once."""
    for f in dataclasses.fields(cls):
        yield from _below(hints(cls)[f.name], (*prefix, f.name), (*seen, cls))


def _below(tp, path, seen):
    yield path, tp
    for arm in map(plain, arms(tp)):
        if dataclasses.is_dataclass(arm) and arm not in seen:
            yield from leaves(arm, path, seen)
        elif typing.get_origin(arm) is tuple:
            yield from _below(typing.get_args(arm)[0], (*path, 0), seen)


def dotted(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def checked_leaves(kind):
    """(path, annotation) of every leaf that must carry a domain: numbers and strings (also inside lists)."""
    cls = SCHEMAS[kind][0]
    for path, tp in leaves(cls):
        for arm in arms(tp):
            if plain(arm) in (int, float, str) or typing.get_origin(plain(arm)) is tuple:
                yield path, tp, arm


def test_every_field_has_a_domain():
    missing, free = [], []
    for kind in SCHEMAS:
        for path, tp in leaves(SCHEMAS[kind][0]):
            name = dotted(path).replace("[0]", "[]")
            if any(plain(a) is Any or typing.get_origin(plain(a)) is dict for a in arms(tp)):
                free.append((kind, name))
                if name not in FREE_FORM[kind]:
                    missing.append(f"{kind}: {name} is free-form; give it a type and a domain (or list it in FREE_FORM)")
                continue
            for arm in arms(tp):
                p = plain(arm)
                bare = typing.get_origin(p) in (Literal, tuple) or p is bool or dataclasses.is_dataclass(p)
                if not bare and not domains(arm) and not (len(arms(tp)) == 1 and domains(tp)):
                    missing.append(f"{kind}: {name} ({arm}) has no domain")
    assert not missing, "\n".join(missing)  # a tuple's items are leaves of their own (path [0])
    assert sorted(free) == sorted((k, n) for k, names in FREE_FORM.items() for n in names)  # no stale entries
    assert sum(1 for k in SCHEMAS for _ in leaves(SCHEMAS[k][0])) > 200


# --- values just outside each domain, generated ------------------------------------------------------------

def outside(d, arm) -> list:
    """Values just outside domain `d` (of a field whose type is `arm`), each checked to be outside."""
    if isinstance(d, Range):
        lo = [d.lo if d.lo_open else math.nextafter(d.lo, -math.inf)] if math.isfinite(d.lo) else []
        hi = [d.hi if d.hi_open else math.nextafter(d.hi, math.inf)] if math.isfinite(d.hi) else []
        vals = lo + hi + [math.inf, -math.inf, math.nan]
        return [int(v) for v in vals if math.isfinite(v) and v == int(v)] if arm is int else vals
    if isinstance(d, Integer):
        return [v for v in (d.min - 1, d.max + 1) if -INT_MAX - 2 < v]
    if isinstance(d, Text):
        pool = ["", " ", "a\nb", "a\x00b", "x" * (d.max_len + 1), ".", "..", "a/b", "a:b"]
        return [v for v in pool if not d.ok(v)]
    if isinstance(d, PathName):
        return ["", ".", "..", "/", "a/..", "a\nb"]
    if isinstance(d, Choice):
        return ["not-an-option"]
    if isinstance(d, Length):
        return [[]] if d.min > 0 else []
    raise AssertionError(f"no generator for {d!r}")


def out_of_domain_cases():
    for kind in SCHEMAS:
        for path, tp, arm in checked_leaves(kind):
            item = typing.get_args(plain(arm))[0] if typing.get_origin(plain(arm)) is tuple else None
            targets = [(path, d, arm) for a in [tp] for d in domains(a) if len(arms(tp)) == 1] + \
                      [(path, d, plain(arm)) for d in domains(arm)] + \
                      ([((*path, 0), d, plain(item)) for d in domains(item)] if item is not None else [])
            for where, d, t in targets:
                for v in outside(d, t):
                    yield pytest.param(kind, where, v, id=f"{kind}:{dotted(where)}={v!r}"[:90])


ITEMS = {"stages": {"step": 1, "value": 1.0}}  # a valid item of a list whose items have required fields


def put(doc: dict, path, value) -> dict:
    """A copy of `doc` with `value` at `path` (sections, list items and union arms made on the way)."""
    doc = yaml.safe_load(yaml.safe_dump(doc))
    node = doc
    for key, nxt in zip(path, path[1:]):
        child = node[key] if isinstance(node, list) or key in node else None
        want = list if isinstance(nxt, int) else dict
        if not isinstance(child, want):
            child = [dict(ITEMS.get(key, {}))] if want is list else {}
            node[key] = child
        node = child
    node[path[-1]] = value
    return doc


def refuse(kind: str, doc: dict, tmp_path: Path) -> str:
    """The error of the schema's own parser (the function the CLI calls) on `doc`; fails if it is accepted."""
    cls, name, _ = SCHEMAS[kind]
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump({**TOY, "steps": 2}))
    if kind == "config":
        with pytest.raises(ConfigError) as err:
            C.parse(doc, source=name)
    elif kind == "sweep spec":
        with pytest.raises(S.SpecError) as err:
            S.expand(S.parse_spec(doc, name, tmp_path))
    elif kind == "SLURM profile":
        (tmp_path / name).write_text(yaml.safe_dump(doc))
        with pytest.raises(S.SpecError) as err:
            load_profile(tmp_path / name)
    else:
        (tmp_path / name).write_text(yaml.safe_dump(doc))
        with pytest.raises(S.SpecError) as err:
            H.load_search(tmp_path / name, out=tmp_path / "out")
    return str(err.value)


def locate(kind, path):
    """A search entry's fields live under search.optim.lr in the document."""
    return ("search", "optim.lr", *path) if kind == "search entry" else path


def refused(kind, path, value, tmp_path) -> tuple[str, str]:
    """(the parser's message, the field it must name) for `value` at `path` of a valid document of `kind`."""
    path = locate(kind, path)
    return refuse(kind, put(SCHEMAS[kind][2], path, value), tmp_path), dotted(path)


@pytest.mark.parametrize("kind, path, value", list(out_of_domain_cases()))
def test_a_value_just_outside_its_domain_is_refused_naming_file_and_field(tmp_path, kind, path, value):
    msg, field = refused(kind, path, value, tmp_path)
    assert SCHEMAS[kind][1] in msg and field in msg, msg
    assert "allowed" in msg or "required" in msg, msg
    assert not (tmp_path / "out").exists()


def test_the_edges_inside_each_range_are_allowed():
    seen = 0
    for kind in SCHEMAS:
        for _, tp, arm in checked_leaves(kind):
            for d in domains(tp) + domains(arm):
                if isinstance(d, Range):
                    assert (math.isfinite(d.lo) and d.lo_open) or d.ok(d.lo if math.isfinite(d.lo) else -1e300)
                    assert (math.isfinite(d.hi) and d.hi_open) or d.ok(d.hi if math.isfinite(d.hi) else 1e300)
                    seen += 1
                if isinstance(d, Integer):
                    assert d.ok(d.min) and d.ok(d.max) and not d.ok(True) and not d.ok(1.0)
                    seen += 1
    assert seen > 100


# --- wrong YAML types, generated --------------------------------------------------------------------------

def accepts(arm, v) -> bool:
    """Whether a field of type `arm` may be written as the YAML value `v` (before coercion)."""
    if arm is Any:
        return True
    if typing.get_origin(arm) is Literal:
        return v in typing.get_args(arm) and type(v) in map(type, typing.get_args(arm))
    if isinstance(v, list):
        return typing.get_origin(arm) is tuple
    if isinstance(v, dict):
        return dataclasses.is_dataclass(arm) or typing.get_origin(arm) is dict
    return matches(v, arm) or (arm is float and type(v) is int)


def wrong_type_cases():
    for kind in SCHEMAS:
        for path, tp in leaves(SCHEMAS[kind][0]):
            for v in (["x"], {"a": 1}, "abc", 5, True):
                if not any(accepts(plain(a), v) for a in arms(tp)):
                    yield pytest.param(kind, path, v, id=f"{kind}:{dotted(path)}={v!r}"[:90])


@pytest.mark.parametrize("kind, path, value", list(wrong_type_cases()))
def test_a_value_of_the_wrong_yaml_type_is_refused_naming_file_and_field(tmp_path, kind, path, value):
    msg, field = refused(kind, path, value, tmp_path)
    assert SCHEMAS[kind][1] in msg and field.split("[")[0] in msg, msg


# --- the same through the CLI: exit 2, the file and the field named, nothing written -----------------------

def snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


CLI = {"config": ["train", "c.yaml", "--out", "o"], "sweep spec": ["sweep", "plan", "s.yaml"],
       "search spec": ["tune", "run", "t.yaml", "--executor", "inline"],
       "search entry": ["tune", "run", "t.yaml", "--executor", "inline"],
       "SLURM profile": ["sweep", "run", "s.yaml", "--executor", "debug", "--profile", "p.yaml"]}


def cli_sample():
    """One out-of-domain case per section of each schema (the first field of each), and the issue's example."""
    seen = set()
    for case in out_of_domain_cases():
        kind, path, value = case.values
        section = (kind, tuple(p for p in path[:-1] if isinstance(p, str)))
        if section not in seen:
            seen.add(section)
            yield case
    yield pytest.param("config", ("optim", "weight_decay"), -0.01, id="config:optim.weight_decay=-0.01")


@pytest.mark.parametrize("kind, path, value", list(cli_sample()))
def test_cli_exits_2_naming_file_and_field_and_writes_nothing(tmp_path, monkeypatch, kind, path, value):
    cls, name, doc = SCHEMAS[kind]
    path = locate(kind, path)
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump({**TOY, "steps": 2}))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SPEC))
    (tmp_path / name).write_text(yaml.safe_dump(put(doc, path, value)))
    before = snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, CLI[kind])
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert name in res.output and dotted(path) in res.output, res.output
    assert snapshot(tmp_path) == before
