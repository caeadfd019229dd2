"""What a config names outside itself, checked by `config.validate` before anything is written: the model
folder (or a hub id in the local cache when offline), the task's data files, a reasoning-gym dataset and its
`task.rg_config`, a multi-turn environment. Files are only looked at here; the preflight
(train/preflight.py) reads them."""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ablate.config import RunConfig


def resource_problems(cfg: RunConfig) -> list[str]:
    """The model folder, data files and dataset name a run needs, checked before anything is written."""
    t, out = cfg.task, []
    if t.name != "toy_addition":
        out += _model_problem(cfg.model.path)
    for key in ("path", "heldout_path"):
        if t.name == "jsonl" and getattr(t, key):
            out += _file_problem(f"task.{key}", getattr(t, key))
    if t.name == "reasoning_gym" and t.dataset:
        out += _dataset_problem(t.dataset)
    if t.name == "env":
        out += [p for p in [environment_problem(t.environment)] if p]
        if t.environment not in ("calculator", "code") and not t.path:
            out.append("task.path is required for task.environment other than 'calculator' and 'code' (the problems:"
                       " a JSONL file of {\"prompt\", \"answer\"} rows)")
        elif t.path:
            out += _file_problem("task.path", t.path)
    return out


def _model_problem(path: str) -> list[str]:
    p = Path(path).expanduser()
    if p.is_dir():
        return [] if (p / "config.json").is_file() else [f"model.path: {path} has no config.json (not a Hugging "
                                                          f"Face model folder)"]
    if p.exists():
        return [f"model.path: {path} is a file; expected a model folder or a hub id"]
    hub_id = path.count("/") <= 1 and not path.startswith((".", "/", "~")) and path.strip() == path and path
    if not hub_id:
        return [f"model.path: no such folder: {path}"]
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        if not _in_hub_cache(path):
            return [f"model.path: no such folder {path!r}, and no hub model of that id in the local cache "
                    f"(HF_HUB_OFFLINE=1: download it first, or build the local one with `ablate base-model`)"]
    return []


@functools.lru_cache(maxsize=256)
def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def environment_problem(name: str) -> str | None:
    """Why `task.environment` names no environment (None when it does): a built-in, an id registered with
    skyrl-gym, or a 'module:Class' whose module can be found (it is not imported: nothing of the user's runs)."""
    allowed = "allowed values: 'calculator', 'code', an id registered with skyrl_gym.register, or 'module:Class'"
    if not name:
        return f"task.environment is required when task.name='env'; {allowed}"
    if name in ("calculator", "code"):
        return None
    if ":" in name:
        module, _, attr = name.partition(":")
        if not attr.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
            return f"task.environment: {name!r} is not a 'module:Class' path; {allowed}"
        import importlib.util

        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        return None if found else f"task.environment: no module {module!r} to import {attr!r} from; {allowed}"
    import skyrl_gym

    if name not in skyrl_gym.registry:
        return (f"task.environment: unknown environment {name!r}; {allowed} (registered: "
                f"{', '.join(sorted(skyrl_gym.registry))})")
    return None


def _file_problem(key: str, path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        return [f"{key}: no such file: {path}"]
    return [] if p.stat().st_size > 0 else [f"{key}: {path} is empty (no rows)"]


@functools.lru_cache(maxsize=64)
def _dataset_problem(name: str) -> list[str]:
    from reasoning_gym.factory import DATASETS

    if name in DATASETS:
        return []
    near = [d for d in DATASETS if name.lower() in d or d in name.lower()][:8] or sorted(DATASETS)[:8]
    return [f"task.dataset: {name!r} is not a reasoning_gym dataset; e.g. {', '.join(near)} "
            f"({len(DATASETS)} in all: reasoning_gym.factory.DATASETS)"]


def rg_config_problems(dataset: str, rg_config: dict) -> list[str]:
    """Check `task.rg_config` against the reasoning-gym dataset's config class (imported only when used)."""
    from reasoning_gym.factory import DATASETS  # slow import: paid only when task.rg_config is set

    if dataset not in DATASETS:
        return [f"task.dataset: unknown reasoning-gym dataset {dataset!r}"]
    config_cls = DATASETS[dataset][1]
    allowed = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    unknown = sorted(set(rg_config) - set(allowed))
    if unknown:
        return [f"task.rg_config: unknown key(s) {', '.join(unknown)} for dataset {dataset!r}; "
                f"valid keys: {', '.join(allowed)}"]
    try:
        config = config_cls(**rg_config, seed=0, size=1)
        if hasattr(config, "validate"):
            config.validate()
    except Exception as e:  # reasoning-gym validates with asserts and ValueErrors
        return [f"task.rg_config: rejected by {config_cls.__name__}: {e or type(e).__name__}"]
    return []
