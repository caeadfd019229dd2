"""Multi-turn environments behind one contract: skyrl-gym's text environment (docs/environments.md).

An environment is a `skyrl_gym` `BaseTextEnv`: built once per episode as `Env(env_config, extras)`, then
`init(prompt_messages) -> (prompt_messages, metadata)` and, after each policy turn,
`step(action_text) -> BaseTextEnvStepOutput(observations, reward, done, metadata)`. `task.environment`
names it: a built-in (`calculator`, `code`), an id registered with `skyrl_gym.register`, or an importable
`module:Class`. The episode loop (ablate/train/episodes.py) owns tokens, masks and sampling; the
environment owns the tools, the rewards and when the episode ends. Metadata keys read when present:
`tool_call` and `tool_error` (booleans, counted per episode).

`EnvTask` is the Task of such a run (`task.name: env`; its episodes are set in `task.episode`): the problems (the calculator's are the arithmetic task's, the code
environment's the code task's, any other environment's the rows of `task.path`), the prompt text, and a
fresh environment per episode. `guarded_step` / `guarded_init` bound every call by `episode.env_timeout_s`
and turn any failure (a raise, a hang, a reply of the wrong types) into `EnvError`.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

from ablate.config import TaskConfig
from ablate.resources import environment_problem
from ablate.tasks.base import Problem, Split

BUILTIN = {"calculator": "ablate.tasks.environments.calculator:CalculatorEnv",
           "code": "ablate.tasks.environments.code:CodeExecEnv"}
BUILTIN_STOP = {"calculator": ("]",), "code": ("</run>",)}  # the stop strings of each built-in's tool call


class EnvError(Exception):
    """An environment call raised, timed out or answered with the wrong types: the episode ends, reward 0."""


def load(name: str):
    """The environment class (or creator) that `name` names; ValueError naming it when there is none."""
    problem = environment_problem(name)
    if problem:
        raise ValueError(problem)
    if ":" not in BUILTIN.get(name, name):
        import skyrl_gym

        entry = skyrl_gym.registry[name].entry_point
        if callable(entry):
            return entry
        name = entry
    module, _, attr = BUILTIN.get(name, name).partition(":")
    creator = getattr(importlib.import_module(module), attr, None)
    if not callable(creator):
        raise ValueError(f"task.environment: {module!r} has no class {attr!r}")
    return creator


# --- guarded calls ----------------------------------------------------------------------------------

def _call(fn, args: tuple, timeout: float):
    from func_timeout import FunctionTimedOut, func_timeout  # skyrl-gym's own timeout (a stoppable thread)

    try:
        return func_timeout(timeout, fn, args)
    except FunctionTimedOut:
        raise EnvError(f"no answer within {timeout:g} s (episode.env_timeout_s)") from None
    except Exception as err:  # the environment's own error, whatever its class
        raise EnvError(f"{type(err).__name__}: {err}") from None


def _messages(obs, what: str) -> list[dict]:
    if not (isinstance(obs, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in obs)):
        raise EnvError(f"{what} returned observations that are not a list of {{'role', 'content': str}} messages")
    return obs


def guarded_init(env, prompt: list[dict], timeout: float) -> list[dict]:
    """The episode's prompt messages as `env.init(prompt)` returns them (it may add instructions)."""
    out = _call(env.init, (prompt,), timeout)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise EnvError(f"init() returned {type(out).__name__}; expected (prompt messages, metadata)")
    return _messages(out[0], "init()")


def guarded_close(env, timeout: float) -> None:
    try:
        _call(env.close, (), timeout)
    except EnvError:
        pass  # closing is best effort: the episode is over


def guarded_step(env, action: str, timeout: float) -> tuple[str, float, bool, dict]:
    """(observation text, reward, done, metadata) of `env.step(action)`; EnvError on a failure or bad types."""
    out = _call(env.step, (action,), timeout)
    get = out.get if isinstance(out, dict) else (lambda k, d=None: getattr(out, k, d))
    obs, reward, done, meta = get("observations", []), get("reward"), get("done"), get("metadata") or {}
    if not isinstance(done, bool):
        raise EnvError(f"step() returned done={done!r}; expected a bool")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise EnvError(f"step() returned reward={reward!r}; expected a finite number")
    _messages(obs, "step()")
    if not isinstance(meta, dict):
        raise EnvError(f"step() returned metadata={meta!r}; expected a dict")
    return "".join(m["content"] for m in obs), float(reward), done, meta


# --- the task ---------------------------------------------------------------------------------------

class EnvTask:
    """The Task of a multi-turn run: problems, prompts, and one environment per episode."""

    def __init__(self, cfg: TaskConfig):
        self.cfg, self.episode = cfg, cfg.episode
        self.name = f"env:{cfg.environment}"
        self.creator = load(cfg.environment)
        self.stop = tuple(self.episode.stop) or BUILTIN_STOP.get(cfg.environment, ())
        if cfg.environment == "calculator":
            from ablate.tasks.arithmetic import ArithmeticTask

            inner = ArithmeticTask(cfg)
        elif cfg.environment == "code":
            from ablate.tasks.code import CodeTask

            inner = CodeTask(cfg)
        else:
            from ablate.tasks.jsonl import build as build_jsonl

            inner = build_jsonl(cfg)
        self._problems = {s: inner.problems(s) for s in ("train", "heldout")}

    def problems(self, split: Split) -> list[Problem]:
        return list(self._problems[split])

    def prompt_text(self, problem: Problem, tokenizer, messages: list[dict] | None = None) -> str:
        """The problem as one user message, or the messages the environment's `init` made of it: through the
        chat template (`task.chat_template`), else their contents joined."""
        messages = messages or [{"role": "user", "content": problem.prompt}]
        if self.cfg.chat_template:
            if getattr(tokenizer, "chat_template", None) is None:
                raise ValueError("task.chat_template is true but the tokenizer has no chat_template")
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return "".join(m["content"] for m in messages)

    def extras(self, problem: Problem) -> dict[str, Any]:
        """skyrl-gym's `extras` of an episode: the reference answer, the problem, the episode settings."""
        info: dict[str, Any] = {"id": problem.id, "prompt": problem.prompt}
        if self.cfg.environment == "code":
            info.update(entry_point=problem.meta[0], tests=list(problem.meta[1]))
        return {"reward_spec": {"ground_truth": problem.answer}, "extra_info": info,
                "max_turns": self.episode.max_turns, "tool_error_penalty": self.episode.tool_error_penalty,
                "code_reward": self.cfg.code_reward}

    def make_env(self, problem: Problem):
        """A fresh environment for one episode of `problem` (EnvError when constructing it fails)."""
        return _call(self.creator, ({}, self.extras(problem)), self.episode.env_timeout_s)

    # the Task protocol's verifiers: an episode's reward comes from its environment (episodes.py), so a bare
    # completion text has no score of its own
    def score(self, problem: Problem, completion: str) -> float:
        raise TypeError("an environment task scores episodes, not texts (ablate/train/episodes.py)")

    train_score = score

    def format_score(self, completion: str) -> float:
        raise TypeError("an environment task has no format score of a text; recipe.format_weight must be 0")


def build(cfg: TaskConfig) -> EnvTask:
    return EnvTask(cfg)
