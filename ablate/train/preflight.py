"""Preflight: read and check every file a run will read, before anything is written.

A run reads its task's data (task.path, task.heldout_path, each mixture entry's; a reasoning-gym dataset;
the procedural sets), the pass-rate cache of task.pass_rate_band, its model folder (the JSON files
transformers reads, the weights' headers, the tokenizer, the chat template when task.chat_template asks for
one) and builds its verifier (math-verify, the code sandbox, a dataset's scorer; a multi-turn task's
environment: built, given a prompt and the reference answer); with `rollout.engine: vllm`, the engine's own
preflight (vLLM imports, the longest prompt plus `recipe.max_new_tokens` fits the model). `check(cfg)` does
all of it through the very code the trainer uses (`make_task`, `band_filter`, transformers' Auto* loaders,
the episode loop's guarded environment calls), so there is one reading path: a malformed line is reported as `file:line: what is wrong` (PreflightError,
exit 2 in the CLI) before a run folder or a sweep's runs root exists. `ablate train`, `sweep plan`, `sweep
run`, `tune` and `difficulty` call it, and so does the trainer before it writes (for runs started from
Python). A result is cached per what is read and the versions (size, mtime) of those files: a sweep of 100
runs over one data file reads it once, and runs in the same process after it (the debug executor, tests)
reuse the answer.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ablate.config import ConfigError, RunConfig, TaskConfig, to_dict
from ablate.rl.schedules import longest_max_new_tokens
from ablate.tasks.base import DataError

# the JSON files of a model folder that transformers reads (config, generation config, tokenizer, weight index)
MODEL_JSON = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "added_tokens.json", "chat_template.json", "model.safetensors.index.json",
              "pytorch_model.bin.index.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


class PreflightError(ConfigError):
    """A file a run would read is missing, malformed or unusable; each line names the config field and
    `file:line: what is wrong`."""


def check(cfg: RunConfig, source: str | None = None) -> None:
    """Raise PreflightError naming every problem of the files `cfg` reads (nothing is written)."""
    check_runs([cfg], source)


def check_runs(cfgs, source: str | None = None) -> None:
    """`check` for many runs (a sweep's): each distinct set of files is read once."""
    distinct = {_reads(c): c for c in cfgs}
    problems = list(dict.fromkeys(p for cfg in distinct.values() for p in problems_of(cfg)))
    if problems:
        head = f"{source}: " if source else ""
        raise PreflightError(f"{head}the run cannot use what it reads (nothing was written):\n  - "
                             + "\n  - ".join(problems))


_CACHE: dict[tuple, tuple[str, ...]] = {}


def problems_of(cfg: RunConfig) -> tuple[str, ...]:
    """Every problem of the files `cfg` reads, cached on (what is read, the files' versions)."""
    key = (*_reads(cfg), _versions(cfg))
    if key not in _CACHE:
        if len(_CACHE) > 256:
            _CACHE.clear()
        _CACHE[key] = tuple(_problems(cfg))
    return _CACHE[key]


def _reads(cfg: RunConfig) -> tuple:
    """What the preflight of `cfg` depends on: the task, the model, the pass-rate cache (its path holds the
    band's sample count and temperature), and the engine's room after a prompt (None: the native sampler)."""
    engine = ("vllm", longest_max_new_tokens(cfg.recipe)) if cfg.rollout.engine == "vllm" else None
    return (json.dumps(to_dict(cfg.task), sort_keys=True), cfg.model.path if _has_model(cfg) else None,
            str(_band_cache(cfg)), engine)


def _has_model(cfg: RunConfig) -> bool:
    return cfg.task.name != "toy_addition"  # the toy testbed trains a tabular policy


def _entries(task: TaskConfig) -> list[tuple[str, TaskConfig]]:
    """(field prefix, task section) of the task, or of each mixture entry as the mixture builds it."""
    if task.name != "mixture":
        return [("task", task)]
    names = {f.name for f in dataclasses.fields(TaskConfig)} - {"mixture"}
    return [(f"task.mixture[{i}]", TaskConfig(**{k: getattr(e, k) for k in names}))
            for i, e in enumerate(task.mixture)]


def _band_cache(cfg: RunConfig) -> Path | None:
    if not cfg.task.pass_rate_band:
        return None
    from ablate.train.difficulty import band_defaults, cache_path

    return cache_path(cfg, *band_defaults(cfg))


def _versions(cfg: RunConfig) -> tuple:
    """(path, size, mtime) of every file `cfg` reads: a changed file is read again."""
    paths = [Path(getattr(t, k)) for _, t in _entries(cfg.task) for k in ("path", "heldout_path") if getattr(t, k)]
    folder = _model_folder(cfg.model.path) if _has_model(cfg) else None
    if folder is not None:
        paths += sorted(folder.iterdir())
    band = _band_cache(cfg)
    paths += [band] if band is not None else []
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((str(p), st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((str(p), None, None))
    return tuple(out)


# --- the task: data rows, prompts, verifier -----------------------------------------------------------

def _problems(cfg: RunConfig) -> list[str]:
    if not _has_model(cfg):
        return []  # the toy testbed: a table in memory, no file, no model (config.validate checks its rules)
    out, tokenizer = _model_problems(cfg.model.path)
    task, problem = _build(cfg.task)
    if problem:
        return [*out, problem]
    subs = list(task.tasks.values()) if cfg.task.name == "mixture" else [task]
    for (prefix, t), sub in zip(_entries(cfg.task), subs):
        out += _use_problems(prefix, t, sub, tokenizer, cfg)
    if cfg.task.pass_rate_band and not out:
        from ablate.train.difficulty import band_filter

        try:
            band_filter(cfg, task.problems("train"))
        except ValueError as err:
            out.append(f"task.pass_rate_band: {err}")
    if cfg.rollout.engine == "vllm" and not out:
        from ablate.train import vllm_engine

        out += vllm_engine.preflight_problems(cfg, task, tokenizer, _model_folder(cfg.model.path))
    return out


def _build(t: TaskConfig):
    """(the task as the trainer builds it, None), or (None, what is wrong, naming the field)."""
    from ablate.tasks import make_task

    try:
        return make_task(t), None
    except DataError as err:
        fields = [f"{prefix}.{k}" for prefix, e in _entries(t) for k in ("path", "heldout_path")
                  if getattr(e, k) and Path(getattr(e, k)) == Path(err.path)]
        return None, f"{fields[0] if fields else 'task'}: {err}"
    except Exception as err:  # noqa: BLE001 - a task's own check (sandbox, dataset, split): reported, not raised
        return None, f"task ({t.name}): {_reason(err)}"


def _use_problems(prefix: str, t: TaskConfig, task, tokenizer, cfg: RunConfig) -> list[str]:
    """The first problem of each split through the prompt format (chat template) and the strict verifier."""
    from ablate.tasks import score_batch

    empty = [split for split in ("train", "heldout") if not task.problems(split)]
    if empty:
        return [f"{prefix} ({t.name}): the {empty[0]} split is empty"]
    if t.chat_template and getattr(tokenizer, "chat_template", "") is None:
        return [f"{prefix}.chat_template: true, but the tokenizer of {cfg.model.path} has no chat template "
                f"(tokenizer_config.json `chat_template` or chat_template.jinja); use a chat model or set "
                f"{prefix}.chat_template: false"]
    out, first = [], task.problems("heldout")[0]
    if tokenizer is not None:
        try:
            task.prompt_text(first, tokenizer)
        except Exception as err:  # noqa: BLE001 - the chat template is the model's (Jinja): any error is its own
            out.append(f"{prefix}: the prompt of problem {first.id!r} cannot be formatted: {_reason(err)}")
    if t.name == "env":  # the environment is the verifier
        return out + _environment_problems(prefix, t, task, first, tokenizer)
    try:
        (value,) = score_batch(task, [first], [_reference_completion(first.answer)], train=False)
        if not 0.0 <= float(value) <= 1.0:
            out.append(f"{prefix} ({t.name}): the verifier scored {value!r}, outside [0, 1]")
    except Exception as err:  # noqa: BLE001 - the verifier's set-up (math-verify, sandbox, a dataset's scorer)
        out.append(f"{prefix} ({t.name}): the verifier fails on problem {first.id!r}: {_reason(err)}")
    return out


def _environment_problems(prefix: str, t: TaskConfig, task, first, tokenizer) -> list[str]:
    """A multi-turn task's environment, as an episode uses it (ablate/train/episodes.py, the same guarded
    calls: `episode.env_timeout_s`, the reply's types): built for the first held-out problem, given its
    prompt (the prompt it returns through the chat template), stepped once with the reference answer as the
    policy's turn, closed. Any reward is allowed (an environment's rewards are its own); a failure here
    would end every episode with reward 0."""
    from ablate.tasks.environments import EnvError, guarded_close, guarded_init, guarded_step

    timeout, where = t.episode.env_timeout_s, f"{prefix}.environment {t.environment!r}"
    try:
        env = task.make_env(first)
    except EnvError as err:
        return [f"{where}: cannot be built for problem {first.id!r}: {err}"]
    try:
        prompt = [{"role": "user", "content": first.prompt}]
        messages = guarded_init(env, prompt, timeout)
        if tokenizer is not None and messages != prompt:
            task.prompt_text(first, tokenizer, messages)
        guarded_step(env, first.answer, timeout)
    except EnvError as err:
        return [f"{where} fails on problem {first.id!r} (its prompt, then its reference answer): {err}"]
    except Exception as err:  # noqa: BLE001 - the chat template on the environment's messages (Jinja)
        return [f"{prefix}: the prompt that {where} made of problem {first.id!r} cannot be formatted: {_reason(err)}"]
    finally:
        guarded_close(env, timeout)
    return []


def _reference_completion(answer: str) -> str:
    """The reference answer in every answer format the tasks read (tags, \\boxed{}, a code block)."""
    return f"<answer>{answer}</answer>\n\\boxed{{{answer}}}\n```python\n{answer}\n```"


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:400]}" if text else type(err).__name__


# --- the model folder -----------------------------------------------------------------------------------

def _model_folder(path: str) -> Path | None:
    """The folder transformers reads: `path` itself, or a hub id's snapshot in the local cache."""
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(path, "config.json")
    except Exception:  # noqa: BLE001 - not a hub id: config.validate has already said what path is
        return None
    return Path(found).parent if isinstance(found, str) else None


def _model_problems(path: str) -> tuple[list[str], object]:
    """(problems, the tokenizer) of the model folder `path`: every JSON file parses, the weights exist and
    their headers are whole, transformers reads the config and the tokenizer."""
    folder = _model_folder(path)
    if folder is None:
        return [], None  # a hub id to download (online), or a missing folder config.validate reports
    out = []
    for f in [folder / n for n in MODEL_JSON if (folder / n).exists()]:
        try:
            json.loads(f.read_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            out.append(f"model.path: {f}: not UTF-8 text")
        except json.JSONDecodeError as err:
            out.append(f"model.path: {f}:{err.lineno}: not valid JSON: {err.msg} (column {err.colno})")
        except OSError as err:
            out.append(f"model.path: {f}: cannot be read ({err.strerror})")
    out += _weight_problems(folder)
    if out:
        return out, None
    from transformers import AutoConfig, AutoTokenizer

    try:
        AutoConfig.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - transformers' own check of config.json (e.g. an unknown model_type)
        return [f"model.path: {folder / 'config.json'}: transformers cannot read it: {_reason(err)}"], None
    try:
        return [], AutoTokenizer.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - tokenizer files that transformers refuses
        return [f"model.path: {folder}: the tokenizer cannot be loaded: {_reason(err)}"], None


def _weight_problems(folder: Path) -> list[str]:
    """The weights transformers would load: present, each safetensors file with a whole header."""
    names = [n for n in WEIGHT_FILES if (folder / n).is_file()]
    if not names:
        return [f"model.path: {folder}: no weights ({', '.join(WEIGHT_FILES)})"]
    files = [folder / names[0]]
    if names[0].endswith(".index.json"):
        try:
            shards = sorted(set(json.loads((folder / names[0]).read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError, OSError):
            return [f"model.path: {folder / names[0]}: not a weight index (no `weight_map` of shard files)"]
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            return [f"model.path: {folder / names[0]}: shard(s) missing: {', '.join(missing[:4])}"]
        files = [folder / s for s in shards]
    out = []
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                with safe_open(str(f), "pt"):
                    pass
            except Exception as err:  # noqa: BLE001 - safetensors' header check (truncated, not safetensors)
                out.append(f"model.path: {f}: not a whole safetensors file ({_reason(err)})")
    return out
