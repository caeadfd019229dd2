"""Per-prompt difficulty: pass rates of the run's base model on its training prompts, cached.

`estimate(cfg, n, temperature)` samples n completions per training prompt from `cfg.model` at the given
temperature, scores them with the strict verifier and returns {problem id: pass rate}. Results are cached
in `ABLATE_CACHE` (default `.cache/ablate`) under `difficulty/<key>.json`, the key a hash of (model path,
task config without `pass_rate_band`, n, temperature). `task.pass_rate_band: [lo, hi]` then keeps the
training prompts whose cached pass rate lies in [lo, hi] (offline filtering; 0.1-0.8 in e.g. Polaris, An
et al. 2025, and the "Tricks or Traps" study, Liu et al. 2025), with n = eval.n_samples and the plain
`recipe.temperature` (its value at step 1 for a schedule).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ablate.config import RunConfig, Schedule, build_section, to_dict
from ablate.rl.schedules import max_new_tokens_at, temperature_at, value_at
from ablate.tasks import make_task, score_batch
from ablate.tasks.base import Problem


def cache_path(cfg: RunConfig, n: int, temperature: float) -> Path:
    return _cache_file(cfg.model.path, to_dict(cfg.task), n, temperature)


def _cache_file(model: str, task: dict, n: int, temperature: float) -> Path:
    task = {k: v for k, v in task.items() if k != "pass_rate_band"}
    blob = json.dumps({"model": model, "task": task, "n": n, "temperature": float(temperature)}, sort_keys=True)
    return cache_root() / "difficulty" / f"{hashlib.sha256(blob.encode()).hexdigest()[:16]}.json"


def cache_root() -> Path:
    return Path(os.environ.get("ABLATE_CACHE", ".cache/ablate"))


def band_cache_of(config: dict) -> Path:
    """The cache file `task.pass_rate_band` of a run read, from its config.yaml (a dict: no torch, no
    validation, so a report can locate it on a machine without the model)."""
    temp = config["recipe"]["temperature"]
    if isinstance(temp, dict):
        temp = value_at(build_section(Schedule, temp, "recipe.temperature", None), 1)
    return _cache_file(config["model"]["path"], config["task"], config["eval"]["n_samples"], float(temp))


def band_summary(rates: dict[str, float], lo: float, hi: float) -> dict:
    """The band's effect on the training prompts (pure): totals and the pass-rate histogram (10 bins)
    of every prompt and of the prompts kept."""
    values = list(rates.values())
    kept = [r for r in values if lo <= r <= hi]
    return {"band": [lo, hi], "total": len(values), "kept": len(kept), "before": histogram(values),
            "after": histogram(kept)}


def band_defaults(cfg: RunConfig) -> tuple[int, float]:
    """(n, temperature) that `task.pass_rate_band` reads the cache with."""
    return cfg.eval.n_samples, temperature_at(cfg.recipe, 1)


def estimate(cfg: RunConfig, n: int, temperature: float, progress: bool = True, chunk: int = 64,
             policy=None, task=None) -> tuple[dict[str, float], Path]:
    """{train problem id: pass rate of n samples}, from the cache when present; and the cache file."""
    path = cache_path(cfg, n, temperature)
    if path.exists():
        return json.loads(path.read_text())["rates"], path
    import torch  # here only: locating and reading the cache (the report) needs no torch

    with torch.no_grad():
        rates = _sample_rates(cfg, n, temperature, progress, chunk, policy, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"model": cfg.model.path, "task": to_dict(cfg.task), "n": n,
                               "temperature": temperature, "rates": rates}))
    tmp.replace(path)
    return rates, path


def _sample_rates(cfg: RunConfig, n: int, temperature: float, progress: bool, chunk: int, policy, task):
    import torch

    from ablate.train.models import build_policy, resolve_device

    torch.manual_seed(cfg.seed)
    task = task or make_task(dataclasses.replace(cfg.task, pass_rate_band=()))
    train = task.problems("train")
    policy = policy or build_policy(cfg, task, resolve_device(cfg.device))
    tokenizer = getattr(policy, "tokenizer", None)
    max_new = max_new_tokens_at(cfg.recipe, 1)
    rates: dict[str, float] = {}
    bar = Progress(TextColumn("[bold]difficulty"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   disable=not progress)
    with bar:
        job = bar.add_task("", total=len(train))
        for start in range(0, len(train), chunk):
            probs = train[start:start + chunk]
            ro = policy.sample([task.prompt_text(p, tokenizer) for p in probs], n, temperature, max_new)
            scores = torch.tensor(score_batch(task, [p for p in probs for _ in range(n)], ro.texts, train=False))
            for p, row in zip(probs, (scores.view(len(probs), n) >= 1).float().mean(1).tolist()):
                rates[p.id] = row
            bar.update(job, advance=len(probs))
    return rates


def histogram(rates: list[float], bins: int = 10) -> list[int]:
    """Counts of pass rates in [0, 0.1), [0.1, 0.2), ..., [0.9, 1.0] (1.0 in the last bin)."""
    return np.histogram(np.asarray(rates, dtype=float), bins=bins, range=(0.0, 1.0))[0].tolist()


def in_band(problems: list[Problem], rates: dict[str, float], lo: float, hi: float) -> list[Problem]:
    """The problems whose pass rate lies in [lo, hi] (pure)."""
    return [p for p in problems if lo <= rates[p.id] <= hi]


def band_filter(cfg: RunConfig, problems: list[Problem]) -> list[Problem]:
    """`task.pass_rate_band` applied to the training problems; unchanged when no band is set."""
    if not cfg.task.pass_rate_band:
        return problems
    n, temperature = band_defaults(cfg)
    path = cache_path(cfg, n, temperature)
    if not path.exists():
        raise ValueError(f"task.pass_rate_band needs the pass rates of {cfg.model.path} (n={n}, temperature="
                         f"{temperature}): run `ablate difficulty CONFIG` first (expected {path})")
    lo, hi = cfg.task.pass_rate_band
    try:
        rates = json.loads(path.read_text())["rates"]
        unknown = next((p.id for p in problems if not isinstance(rates.get(p.id), (int, float))), None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path}: not a pass-rate cache of `ablate difficulty` ({type(err).__name__}: {err}); "
                         f"delete it and run `ablate difficulty CONFIG` again") from None
    if unknown is not None:
        raise ValueError(f"{path}: no pass rate of training problem {unknown!r} (a cache of other problems); "
                         f"delete it and run `ablate difficulty CONFIG` again")
    kept = in_band(problems, rates, lo, hi)
    if not kept:
        raise ValueError(f"task.pass_rate_band [{lo}, {hi}] keeps no training problem ({path})")
    return kept
