"""What varied across runs: factors (toggles), their levels and reference level, and the arm of each run.

Sources, in order: the sweep manifest (`<sweep>/manifest.json`: the arm name of each run and the spec's
value order) and, always, the runs' configs: every flattened config key whose value differs across
runs (seed and bookkeeping keys excepted) is a toggle. Keys that always move together (e.g. the keys a
preset arm sets, or a `zip:` group) form one factor, so confounded toggles are never analysed as if
they were separate. Without a manifest everything is inferred from the configs.

The reference level of a factor (the "off" side of an effect) is: the first arm / grid value in the
sweep spec; else the RunConfig default (the baseline recipe); else False / none / off; else the smallest
value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

IGNORED = ("run_id", "run_dir", "state", "error", "last_step", "planned_steps", "seed", "device")
IGNORED_PREFIXES = ("tracking.", "compute.")  # neither changes a result
ARM_KEY = "__arm__"


@dataclass
class Factor:
    name: str              # display name: "arm", "eps_high", "scale+loss_agg"
    keys: tuple            # the config keys (ARM_KEY for a manifest arm)
    levels: list           # level labels, reference first
    column: str            # column of Study.runs holding each run's level

    @property
    def reference(self) -> str:
        return self.levels[0]


def read_manifests(paths, run_dirs) -> tuple[dict, dict]:
    """(run_id -> manifest entry, spec order: key -> list of values / "arms" -> arm names). Each manifest is
    read and checked by `ablate.experiments.manifest.read_manifest` (SpecError, a ValueError, naming it)."""
    from ablate.experiments.manifest import read_manifest

    entries, order = {}, {}
    roots = {Path(p).resolve() for p in paths} | {Path(d).parent for d in run_dirs}
    for root in sorted(roots):
        if not (root / "manifest.json").is_file():
            continue
        m = read_manifest(root)
        entries.update(m["runs"])
        spec = m.get("spec") or {}
        order.setdefault("arms", list((spec.get("arms") or {}).keys()))
        for k, vals in (spec.get("grid") or {}).items():
            order.setdefault(k, [_fmt(v) for v in vals])
    return entries, order


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return repr(v)
    return str(v)


def flatten(d: dict, prefix: str = "") -> dict:
    """A nested config dict -> dotted keys (`recipe.kl_coef`): the columns of a run's config in a study."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v  # lists (e.g. eval.ks) as JSON text
    return out


def _defaults() -> dict:
    try:
        from ablate.config import RunConfig, to_dict
        return {k: _fmt(v) for k, v in flatten(to_dict(RunConfig())).items()}
    except Exception:  # noqa: BLE001 - a config that cannot be built just means no default order
        return {}


def _sort_key(order: list | None, default: str | None = None):
    def key(label: str):
        if order and label in order:
            return (0, order.index(label), 0.0, label)
        if label == default:
            return (0, -1, 0.0, label)
        low = label.lower()
        if low in ("false", "none", "off"):
            return (1, 0, 0.0, label)
        try:
            return (2, 0, float(label), label)
        except ValueError:
            return (3, 0, 0.0, label)
    return key


def _short(keys: list[str]) -> dict[str, str]:
    last = [k.split(".")[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def assign_arms(runs: pd.DataFrame, paths=(), manifests: tuple[dict, dict] | None = None) -> tuple[pd.DataFrame, list[Factor]]:
    """Add `arm` (a label) and one level column per factor to `runs`; return (runs, factors).
    `manifests`: read_manifests' result when the caller already has it."""
    runs = runs.copy()
    if runs.empty:
        runs["arm"] = []
        return runs, []
    entries, order = manifests if manifests is not None else read_manifests(paths, runs["run_dir"])
    arms = [(entries.get(r) or {}).get("arm") for r in runs["run_id"]]
    keys = [k for k in runs.columns if k not in IGNORED and not k.startswith(IGNORED_PREFIXES)]
    if any(a is not None for a in arms):
        runs[ARM_KEY] = [a if a is not None else "(none)" for a in arms]
        keys = [ARM_KEY] + keys
    labels = {k: runs[k].map(lambda v: "None" if v is None or v != v else _fmt(v)) for k in keys}
    varying = [k for k in keys if labels[k].nunique() > 1]
    groups: dict[tuple, list[str]] = {}
    for k in varying:
        groups.setdefault(tuple(pd.factorize(labels[k])[0]), []).append(k)
    short = _short([k for k in varying if k != ARM_KEY])
    factors, defaults = [], _defaults()
    for ks in groups.values():
        name = "arm" if ARM_KEY in ks else "+".join(short[k] for k in ks)
        main = ARM_KEY if ARM_KEY in ks else ks[0]
        lab = labels[main] if (main == ARM_KEY or len(ks) == 1) else \
            pd.Series(["/".join(t) for t in zip(*(labels[k] for k in ks))], index=runs.index)
        lvl_order = order.get("arms") if main == ARM_KEY else order.get(main)
        first = dict(zip(lab, labels[main]))  # composite level -> its main key's label (sets the order)
        sort = _sort_key(lvl_order, defaults.get(main))
        levels = sorted(dict.fromkeys(lab), key=lambda v: sort(first[v]))
        column = f"level:{name}"
        runs[column] = lab.values
        factors.append(Factor(name, tuple(ks), levels, column))
    named = [f for f in factors if f.name == "arm"]
    if named and len(factors) > 1 and all(runs.groupby(named[0].column)[f.column].nunique().max() == 1
                                          for f in factors if f.name != "arm"):
        # named arms that fix every other key (RAFT's arm moves policy_loss and baseline): the keys are
        # confounded with the arm, one factor, so every arm is compared with the reference, none dropped
        a = named[0]
        factors = [Factor(a.name, tuple(k for f in factors for k in f.keys), a.levels, a.column)]
    if factors:
        def label(row):
            return ", ".join(row[f.column] if f.name == "arm" else f"{f.name}={row[f.column]}" for f in factors)
        runs["arm"] = runs.apply(label, axis=1)
        rank = {f.column: {lv: i for i, lv in enumerate(f.levels)} for f in factors}
        runs["_order"] = runs.apply(lambda r: tuple(rank[f.column][r[f.column]] for f in factors), axis=1)
    else:
        runs["arm"] = "all"
        runs["_order"] = [()] * len(runs)
    seed = runs["seed"] if "seed" in runs else pd.Series(0, index=runs.index)
    runs = runs.assign(_seed=seed).sort_values(["_order", "_seed"], kind="stable")
    return runs.drop(columns=["_order", "_seed"]).reset_index(drop=True), factors


def arm_order(runs: pd.DataFrame) -> list[str]:
    """Arms in design order (reference arm first)."""
    return list(dict.fromkeys(runs["arm"]))
