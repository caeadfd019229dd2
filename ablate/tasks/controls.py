"""Control arms for the training reward (`task.reward_mode`): what a gain looks like without the reward.

- `random`: Bernoulli(0.5), drawn independently of the completion from the run's torch RNG (seeded by
  the run seed, checkpointed with it), as the random-reward arm of Shao et al. 2025, "Spurious
  Rewards: Rethinking Training Signals in RLVR", arXiv 2506.10947.
- `inverted`: 1 - the training verifier's score (training should make held-out accuracy fall).
Only the training score changes; held-out evaluation always uses the task's strict `score`.
"""

from __future__ import annotations

import torch

from ablate.tasks.base import Problem


class RewardModeTask:
    """Wraps a task and replaces its `train_score`; every other attribute is the wrapped task's."""

    def __init__(self, task, mode: str):
        if mode not in ("random", "inverted"):
            raise ValueError(f"unknown reward_mode {mode!r}; allowed: verifier, random, inverted")
        self._task, self.reward_mode = task, mode

    def __getattr__(self, name):
        return getattr(self._task, name)

    def train_score(self, problem: Problem, completion: str) -> float:
        if self.reward_mode == "random":
            return float(torch.rand(()) < 0.5)
        return 1.0 - self._task.train_score(problem, completion)


def with_reward_mode(task, mode: str):
    return task if mode == "verifier" else RewardModeTask(task, mode)
