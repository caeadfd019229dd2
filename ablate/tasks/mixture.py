"""A weighted mixture of tasks (`task.name: mixture`, `task.mixture: [{...task..., weight: w}, ...]`).

Entry i contributes round(w_i / sum(w) * task.num_train) training problems (its own num_train is replaced
by that share), so the uniform prompt stream samples the tasks in proportion to their weights, and its own
num_heldout held-out problems, evaluated per task (`eval/<label>/pass@k`). Each problem keeps its task's
prompt format and verifiers; its id is `<label>/<id>` and its meta `(label, original problem)`.
"""

from __future__ import annotations

import dataclasses
import re

from ablate.config import TaskConfig
from ablate.tasks import make_task
from ablate.tasks.base import Problem, Split


def label_of(task) -> str:
    """A metric-safe name of a task: `reasoning_gym:chain_sum` -> `reasoning_gym_chain_sum`."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", task.name).strip("_")


def shares(weights: list[float], total: int) -> list[int]:
    """Training problems per entry: round(w_i / sum(w) * total), at least 1 each."""
    s = sum(weights)
    return [max(1, round(w / s * total)) for w in weights]


class MixtureTask:
    name = "mixture"

    def __init__(self, cfg: TaskConfig):
        self.cfg = cfg
        fields = {f.name for f in dataclasses.fields(TaskConfig)}
        self.tasks: dict[str, object] = {}
        for entry, n in zip(cfg.mixture, shares([e.weight for e in cfg.mixture], cfg.num_train)):
            sub_cfg = TaskConfig(**{k: getattr(entry, k) for k in fields if k != "mixture"} | {"num_train": n})
            task = make_task(sub_cfg)
            label = label_of(task)
            if label in self.tasks:
                raise ValueError(f"task.mixture: two entries are both task {label!r}; mix different tasks")
            self.tasks[label] = task
        self._problems = {split: [Problem(f"{label}/{p.id}", p.prompt, p.answer, (label, p))
                                  for label, task in self.tasks.items() for p in task.problems(split)]
                          for split in ("train", "heldout")}

    def label(self, problem: Problem) -> str:
        return problem.meta[0]

    def _sub(self, problem: Problem):
        label, inner = problem.meta
        return self.tasks[label], inner

    def problems(self, split: Split) -> list[Problem]:
        return list(self._problems[split])

    def prompt_text(self, problem: Problem, tokenizer) -> str:
        task, inner = self._sub(problem)
        return task.prompt_text(inner, tokenizer)

    def score(self, problem: Problem, completion: str) -> float:
        task, inner = self._sub(problem)
        return task.score(inner, completion)

    def train_score(self, problem: Problem, completion: str) -> float:
        task, inner = self._sub(problem)
        return task.train_score(inner, completion)

    def format_score(self, completion: str) -> float:
        """1.0 when the completion has the structure of any of the tasks (a format reward is not allowed
        with a mixture, see validate(); this is for logging only)."""
        return max(task.format_score(completion) for task in self.tasks.values())

    def score_many(self, problems: list[Problem], completions: list[str]) -> list[float]:
        return self._many("score", problems, completions)

    def train_score_many(self, problems: list[Problem], completions: list[str]) -> list[float]:
        return self._many("train_score", problems, completions)

    def _many(self, name: str, problems: list[Problem], completions: list[str]) -> list[float]:
        """Each task's batch in one call (the code task's parallel sandboxes), results in order."""
        from ablate.tasks import score_batch

        out: list[float] = [0.0] * len(problems)
        for label, task in self.tasks.items():
            rows = [i for i, p in enumerate(problems) if p.meta[0] == label]
            if rows:
                got = score_batch(task, [problems[i].meta[1] for i in rows], [completions[i] for i in rows],
                                  train=name == "train_score")
                for i, v in zip(rows, got):
                    out[i] = v
        return out


def build(cfg: TaskConfig) -> MixtureTask:
    return MixtureTask(cfg)


# --- per-task metrics (definitions in ablate/runs/metrics.py) ----------------------------------------

def per_task_eval(labels: list[str] | None, counts: list[int], n: int, ks) -> dict[str, float]:
    """`eval/<label>/pass@k` over each task's held-out problems; {} for a single task."""
    from ablate.rl.stats import mean_pass_at_k

    if not labels:
        return {}
    out = {}
    for label in dict.fromkeys(labels):
        mine = [c for c, lab in zip(counts, labels) if lab == label]
        out.update({f"eval/{label}/pass@{k}": mean_pass_at_k(mine, n, k) for k in ks})
    return out


def per_task_train(labels: list[str] | None, correct) -> dict[str, float]:
    """`train/<label>/reward_correct_mean` and `.../dead_group_frac` over the step's groups of each task,
    `correct` [B, G]; {} for a single task. A task with no group this step is left out."""
    if not labels:
        return {}
    out = {}
    for label in dict.fromkeys(labels):
        rows = correct[[i for i, lab in enumerate(labels) if lab == label]]      # [b, G]
        out[f"train/{label}/reward_correct_mean"] = float(rows.mean())
        out[f"train/{label}/dead_group_frac"] = float((rows.max(1).values == rows.min(1).values).float().mean())
    return out
