"""Strict typed data from YAML: the loader, the type check and the value domains every schema shares
(the run config, sweep and search specs, SLURM profiles).

    lr: Positive = 2e-4                          # a field's domain is part of its annotation (aliases below)
    seeds: Annotated[tuple[Seed, ...], Length(min=1)] | None = None
    obj = build_section(Cls, data, "", source)   # unknown keys and types: ConfigError naming source and key
    problems(obj)                                # ["optim.lr: -1.0 is not allowed; allowed: a number > 0", ...]

`coerce` reads a field's plain type, `problems` its domain (`typing.Annotated` metadata). A domain holds
whatever the other fields hold, so it is checked everywhere the field is; only cross-field rules are code
(config.validate, the spec parsers). A field without a domain is a schema bug (tests/test_domains.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml


class ConfigError(ValueError):
    """A bad config value. The message names the source file (when known), the field and what is allowed."""


# --- domains -------------------------------------------------------------------------------------------

INT_MAX = 2**63 - 1  # every integer goes through torch / numpy int64 somewhere
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")   # Unicode categories Cc, Zl, Zp: they break a line
CONTROL_IN_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")  # newlines and tabs allowed


@dataclass(frozen=True)
class Range:
    """A finite number in [lo, hi] (an end is excluded when open); NaN and infinities are never in it."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    def ok(self, v: Any) -> bool:
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and (v > self.lo if self.lo_open else v >= self.lo) and (v < self.hi if self.hi_open else v <= self.hi))

    def __str__(self) -> str:
        lo, hi = f"{'>' if self.lo_open else '>='} {self.lo:g}", f"{'<' if self.hi_open else '<='} {self.hi:g}"
        if math.isinf(self.lo) and math.isinf(self.hi):
            return "a finite number"
        if math.isinf(self.hi) or math.isinf(self.lo):
            return f"a number {hi if math.isinf(self.lo) else lo}"
        return f"a number in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


@dataclass(frozen=True)
class Integer:
    """An integer in min..max (both included)."""

    min: int = -INT_MAX - 1
    max: int = INT_MAX

    def ok(self, v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and self.min <= v <= self.max

    def __str__(self) -> str:
        return f"an integer >= {self.min}" if self.max == INT_MAX else f"an integer in {self.min}..{self.max}"


@dataclass(frozen=True)
class Text:
    """A string of min_len..max_len characters, one line (no control characters) unless `lines`, matching
    `pattern` (re.fullmatch) when given; `what` says in words what the pattern allows."""

    min_len: int = 0
    max_len: int = 4096
    pattern: str | None = None
    what: str = ""
    lines: bool = False

    def ok(self, v: Any) -> bool:
        return (isinstance(v, str) and self.min_len <= len(v) <= self.max_len and (self.min_len == 0 or v.strip() != "")
                and not (CONTROL_IN_TEXT if self.lines else CONTROL).search(v)
                and (self.pattern is None or re.fullmatch(self.pattern, v) is not None))

    def __str__(self) -> str:
        size = f"{self.min_len}..{self.max_len} characters" if self.min_len else f"at most {self.max_len} characters"
        kind = "text" if self.lines else "one line of text"
        return f"{kind} of {size}{', ' + self.what if self.what else ''} (no control characters)"


@dataclass(frozen=True)
class Choice:
    """One of a set of values known only at run time (e.g. the preset names)."""

    options: tuple

    def ok(self, v: Any) -> bool:
        return v in self.options

    def __str__(self) -> str:
        return "one of " + ", ".join(map(str, self.options))


@dataclass(frozen=True)
class Length:
    """A list of min..max items (a domain of the list; its items have their own)."""

    min: int = 0
    max: int = INT_MAX

    def ok(self, v: Any) -> bool:
        return isinstance(v, tuple) and self.min <= len(v) <= self.max

    def __str__(self) -> str:
        most = "" if self.max == INT_MAX else f" and at most {self.max}"
        return f"a list of at least {self.min} item(s){most}"


@dataclass(frozen=True)
class PathName:
    """A path that names a file or folder: one line, not empty and not '.', '..', '/' or a path that
    resolves to one of those by its text ('a/..', './'): that would be the working folder or above it."""

    def ok(self, v: Any) -> bool:
        return Text(min_len=1).ok(v) and os.path.basename(os.path.normpath(v)) not in ("", ".", "..")

    def __str__(self) -> str:
        return "a path naming a file or folder: one line (no control characters), not empty, '.', '..' or '/'"


DOMAINS = (Range, Integer, Text, Choice, Length, PathName)

# the domains most fields share
Finite = Annotated[float, Range()]
Positive = Annotated[float, Range(0, lo_open=True)]
NonNegative = Annotated[float, Range(0)]
Fraction = Annotated[float, Range(0, 1)]
Count = Annotated[int, Integer(min=1)]        # how many of something, at least one
Natural = Annotated[int, Integer(min=0)]      # a count or a step where 0 means "none" / "off"
Seed = Annotated[int, Integer(0, INT_MAX)]
Line = Annotated[str, Text()]                 # one line, may be empty
NonEmptyLine = Annotated[str, Text(min_len=1)]
PathText = Annotated[str, PathName()]


# --- reading domains ----------------------------------------------------------------------------------

@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """A dataclass's field annotations with their domains (typing.Annotated kept)."""
    return typing.get_type_hints(cls, include_extras=True)


def domains(tp: Any) -> list:
    """The domain objects on an annotation (outermost Annotated only)."""
    return [m for m in typing.get_args(tp)[1:] if isinstance(m, DOMAINS)] if typing.get_origin(tp) is Annotated else []


def plain(tp: Any) -> Any:
    return typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp


def matches(value: Any, tp: Any) -> bool:
    """Whether a coerced value is of the (plain) type `tp`: picks the arm of a union a value took."""
    tp, origin = plain(tp), typing.get_origin(plain(tp))
    if tp is Any:
        return True
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in typing.get_args(tp))
    if origin is tuple:
        return isinstance(value, tuple)
    if origin is dict:
        return isinstance(value, dict)
    if tp is type(None):
        return value is None
    if tp in (int, float):
        return isinstance(value, tp) and not isinstance(value, bool)
    return isinstance(value, tp)


def value_problems(value: Any, tp: Any, path: str) -> list[str]:
    """`path: value is not allowed; allowed: ...` for the value and, inside it, every item and field."""
    return _checker(tp)(value, path)


def problems(obj: Any, prefix: str = "") -> list[str]:
    """Every field of the dataclass `obj` (and of the dataclasses in it) outside its domain."""
    return [p for name, check in _fields(type(obj)) for p in check(getattr(obj, name), prefix + name)]


def _none(value: Any, path: str) -> list[str]:
    return []


@functools.cache
def _fields(cls: type) -> tuple:
    """(name, checker) of the fields of `cls` that have a domain somewhere in them."""
    ann = hints(cls)
    return tuple((f.name, _checker(ann[f.name])) for f in dataclasses.fields(cls) if _checker(ann[f.name]) is not _none)


@functools.cache
def _checker(tp: Any):
    """A function (value, path) -> problems for the annotation `tp`, built once per annotation (validate runs
    for every point of a sweep); `_none` where nothing in `tp` has a domain."""
    doms, inner = tuple(domains(tp)), plain(tp)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    sub = None
    if origin in (typing.Union, types.UnionType):
        arms = [(a, _checker(a)) for a in args]
        if any(check is not _none for _, check in arms):
            sub = lambda v, path: next((check(v, path) for a, check in arms if matches(v, a)), [])  # noqa: E731
    elif origin is tuple and _checker(args[0]) is not _none:
        item = _checker(args[0])
        sub = lambda v, path: [p for i, x in enumerate(v) for p in item(x, f"{path}[{i}]")] \
            if isinstance(v, tuple) else []  # noqa: E731
    elif dataclasses.is_dataclass(inner):
        sub = lambda v, path: problems(v, path + ".") if dataclasses.is_dataclass(v) else []  # noqa: E731
    if not doms and sub is None:
        return _none

    def check(value: Any, path: str) -> list[str]:
        for d in doms:
            if not d.ok(value):
                return [f"{path}: {list(value) if isinstance(value, tuple) else value!r} is not allowed; allowed: {d}"]
        return sub(value, path) if sub else []
    return check


# --- YAML ------------------------------------------------------------------------------------------------

MAX_NODES = 100_000  # expanded size: a config has a few hundred; a "billion laughs" file has billions


class StrictLoader(yaml.SafeLoader):
    """safe_load that refuses duplicate keys (YAML would keep the last silently) and documents whose aliases
    expand to more than MAX_NODES values (an alias bomb would exhaust memory when the config is copied)."""

    def get_single_node(self):
        node = super().get_single_node()
        sizes: dict[int, int] = {}

        def size(n) -> int:
            if id(n) not in sizes:
                sizes[id(n)] = 1  # cycles count once
                kids = [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else \
                    n.value if isinstance(n, yaml.SequenceNode) else []
                sizes[id(n)] = 1 + sum(size(c) for c in kids)
                if sizes[id(n)] > MAX_NODES:
                    raise yaml.YAMLError(f"aliases (*name) expand to more than {MAX_NODES:,} values: refusing "
                                         f"to expand")
            return sizes[id(n)]

        if node is not None:
            size(node)
        return node

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.YAMLError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1}); "
                                     f"YAML would silently keep only the last value")
            if isinstance(key, (str, int, float, bool)):
                seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path, error=None):
    """A YAML file through StrictLoader; any failure (missing, not UTF-8, bad YAML, duplicate keys, alias bomb)
    raises `error` (default ConfigError) naming the file."""
    error = error or ConfigError
    try:
        return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=StrictLoader)
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None
    except OSError as e:
        raise error(f"{path}: cannot be read: {e.strerror}") from None


# --- strict parsing ----------------------------------------------------------------------------------

def _where(source: str | None, path: str) -> str:
    return f"{source}: {path}" if source else path


def coerce(value: Any, tp: Any, path: str, source: str | None) -> Any:
    """Check `value` against the annotation `tp`, converting lists to tuples; raise ConfigError."""
    tp = plain(tp)
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{_where(source, path)}: expected a mapping, got {value!r}")
        return build_section(tp, value, path, source)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed or type(value) is bool and not any(type(a) is bool for a in allowed):  # true is not 1
            raise ConfigError(f"{_where(source, path)}: {value!r} is not allowed; allowed values: "
                              + ", ".join(map(repr, allowed)))
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, path, source)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[-1] if isinstance(value, dict) else errors[0])  # a mapping: the dataclass's error
    if origin is dict:  # a free-form mapping of plain values (parse already made it JSON data)
        if not isinstance(value, dict):
            raise ConfigError(f"{_where(source, path)}: expected a mapping, got {value!r}")
        return dict(value)
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{_where(source, path)}: expected a list, got {value!r}")
        return tuple(coerce(v, item_tp, f"{path}[{i}]", source) for i, v in enumerate(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML reads 1e-4 as a string
            return float(value)
        except ValueError:
            pass
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{_where(source, path)}: expected {tp.__name__}, got {value!r}")
    return value


def build_section(cls: type, data: dict, prefix: str, source: str | None):
    """`cls` from a mapping: unknown keys (listing the valid ones) and wrong types are ConfigErrors."""
    ann = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in names:
            raise ConfigError(f"{_where(source, path)}: unknown key; valid keys here: {', '.join(names)}")
        kwargs[key] = coerce(value, ann[key], path, source)
    try:
        return cls(**kwargs)
    except TypeError:  # a required field left out
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        raise ConfigError(f"{_where(source, prefix + '.' * bool(prefix) + missing[0])}: required") from None


def parse_section(cls: type, data: Any, source: str, error: type[Exception] = ConfigError, prefix: str = ""):
    """A whole schema `cls` from plain data: keys, types and every field's domain, or `error` naming `source`
    and each bad field (one line each)."""
    if not isinstance(data, dict):
        raise error(f"{_where(source, prefix or '(top level)')}: expected a mapping, got {data!r}")
    try:
        obj = build_section(cls, data, prefix, source)
    except ConfigError as e:
        raise error(str(e)) from None
    bad = problems(obj, prefix + "." * bool(prefix))
    if bad:
        raise error("\n".join(f"{source}: {p}" for p in bad))
    return obj
