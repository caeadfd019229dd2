"""The trainer's prompt sampler: the state of `recipe.data_policy` (ablate/rl/data_policy.py) in a run."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ablate.config import RunConfig
from ablate.rl import data_policy as dp


class PromptSampler:
    """`take(k)` prompt indices for a step, `observe` their groups' pass rates; the state is plain data."""

    def __init__(self, n: int, cfg: RunConfig):
        r = cfg.recipe
        self.policy = r.data_policy
        self.params = dp.Params(seed=cfg.seed, total=cfg.steps * cfg.prompts_per_step,
                                retire_threshold=r.retire_threshold, priority_smoothing=r.priority_smoothing,
                                curriculum_start=r.curriculum_start)
        self.pool = dp.Pool.new(n)
        self.drops_dead_groups = self.policy in dp.DROPS_DEAD_GROUPS
        self._sampled: list[float] = []  # pass rates observed since the last metrics()

    def take(self, k: int) -> list[int]:
        idx, self.pool = dp.advance(self.pool, self.policy, k, self.params)
        return idx

    def observe(self, indices: list[int], pass_rates: list[float]) -> None:
        self.pool = dp.observe(self.pool, self.policy, indices, pass_rates, self.params)
        self._sampled += list(pass_rates)

    def metrics(self) -> dict[str, float]:
        """The `data/*` metrics of the step (definitions in ablate/runs/metrics.py)."""
        n, retired = len(self.pool.rate), sum(self.pool.retired)
        sampled, self._sampled = self._sampled, []
        return {"data/pool_size": n - retired, "data/retired_frac": retired / n,
                "data/sampled_pass_rate_mean": float(np.mean(sampled)) if sampled else math.nan}

    def state_dict(self) -> dict:
        return dataclasses.asdict(self.pool)  # ints, floats and bools in lists: fine for weights_only loading

    def load_state_dict(self, state: dict | int) -> None:
        if isinstance(state, int):  # a checkpoint from before data policies: the uniform stream's position
            state = {**dataclasses.asdict(self.pool), "position": state}
        self.pool = dp.Pool(**state)
