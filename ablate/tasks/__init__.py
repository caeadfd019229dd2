"""Task registry and small text helpers shared by the task modules.

Task modules are imported lazily so that e.g. the arithmetic task never pays for importing
reasoning-gym or math-verify (both slow to import, and optional for most runs).
"""

from __future__ import annotations

import importlib
import re

from ablate.config import TaskConfig
from ablate.tasks.base import Problem, Split, Task

__all__ = ["Problem", "Split", "Task", "chat_prompt", "check_disjoint", "extract_boxed",
           "extract_tagged", "make_task", "score_batch", "task_labels"]

# name -> (module, builder function); each builder takes the TaskConfig and returns a Task
_REGISTRY: dict[str, tuple[str, str]] = {
    "arithmetic": ("ablate.tasks.arithmetic", "build"),
    "reasoning_gym": ("ablate.tasks.reasoning_gym", "build"),
    "jsonl": ("ablate.tasks.jsonl", "build"),
    "toy_addition": ("ablate.tasks.toy", "build_task"),
    "code": ("ablate.tasks.code", "build"),
    "mixture": ("ablate.tasks.mixture", "build"),
    "env": ("ablate.tasks.environments", "build"),
}


def make_task(cfg: TaskConfig) -> Task:
    if cfg.name not in _REGISTRY:
        raise ValueError(f"unknown task {cfg.name!r}; known tasks: {', '.join(_REGISTRY)}")
    from ablate.tasks.controls import with_reward_mode

    module, fn = _REGISTRY[cfg.name]
    return with_reward_mode(getattr(importlib.import_module(module), fn)(cfg), cfg.reward_mode)


def score_batch(task: Task, problems: list[Problem], completions: list[str], train: bool) -> list[float]:
    """`train_score` (train=True) or `score` of each (problem, completion) pair; a task with a batched form
    (`train_score_many` / `score_many`, e.g. the code task's parallel sandboxes) is called once."""
    name = "train_score" if train else "score"
    many = getattr(task, f"{name}_many", None)
    if many is not None:
        return list(many(problems, completions))
    return [getattr(task, name)(p, c) for p, c in zip(problems, completions)]


def task_labels(task: Task, problems: list[Problem]) -> list[str] | None:
    """Each problem's task label in a mixture (for per-task metrics), or None for a single task."""
    label = getattr(task, "label", None)
    return [label(p) for p in problems] if label is not None else None


def check_disjoint(task: Task) -> None:
    """Raise if a held-out prompt also appears in the train split (a leak would inflate eval)."""
    train = {p.prompt for p in task.problems("train")}
    leaked = [p for p in task.problems("heldout") if p.prompt in train]
    if leaked:
        raise ValueError(f"task {task.name!r}: {len(leaked)} held-out prompt(s) also in train, "
                         f"e.g. {leaked[0].id}: {leaked[0].prompt[:80]!r}")


# --- answer extraction -------------------------------------------------------------------------

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_tagged(completion: str) -> str | None:
    """Content of the last <answer>...</answer> (stripped), or None."""
    matches = _ANSWER_TAG.findall(completion)
    return matches[-1].strip() if matches else None


def extract_boxed(completion: str) -> str | None:
    """Content of the last \\boxed{...}, matching nested braces (\\boxed{\\frac{1}{2}}), or None."""
    start = completion.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(completion)):
        depth += {"{": 1, "}": -1}.get(completion[j], 0)
        if depth == 0:
            return completion[i:j].strip()
    return None  # unbalanced: the model was cut off mid-answer


def chat_prompt(text: str, tokenizer) -> str:
    """One user turn through the tokenizer's chat template, ready for the assistant's reply."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("task.chat_template is true but the tokenizer has no chat_template")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True, tokenize=False)
