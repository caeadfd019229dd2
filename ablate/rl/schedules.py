"""Step schedules for `recipe.temperature` and `recipe.max_new_tokens`: one pure function per kind.

    value(schedule, step) -> float        # step 1 is the first training step; step 0 (the evaluation
                                           # before training) takes step 1's value

Staged context length follows DeepScaleR (Luo et al. 2025, "DeepScaleR: Surpassing O1-Preview with a
1.5B Model by Scaling RL": 8K -> 16K -> 24K tokens); raising the temperature as the policy sharpens follows
POLARIS (An et al. 2025). A plain number is a constant and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from ablate.config import RecipeConfig, Schedule, schedule_values


def constant(s: Schedule, step: int) -> float:
    return s.value


def linear(s: Schedule, step: int) -> float:
    """start at step 1, end at step `steps`, held after."""
    frac = min(max((step - 1) / max(s.steps - 1, 1), 0.0), 1.0)
    return s.start + (s.end - s.start) * frac


def stages(s: Schedule, step: int) -> float:
    """The value of the last stage that has started (the first stage before step 1)."""
    value = s.stages[0].value
    for st in s.stages:
        if st.step <= step:
            value = st.value
    return value


SCHEDULES: dict[str, Callable[[Schedule, int], float]] = {"constant": constant, "linear": linear, "stages": stages}


def value_at(s: float | Schedule, step: int) -> float:
    return SCHEDULES[s.kind](s, step) if isinstance(s, Schedule) else s


def temperature_at(r: RecipeConfig, step: int) -> float:
    """`recipe.temperature` at `step` (a plain number is itself)."""
    return float(value_at(r.temperature, step))


def max_new_tokens_at(r: RecipeConfig, step: int) -> int:
    """`recipe.max_new_tokens` at `step`, rounded to the nearest integer (a plain number is itself)."""
    return int(round(value_at(r.max_new_tokens, step)))


def longest_max_new_tokens(r: RecipeConfig) -> int:
    """The largest `recipe.max_new_tokens` of any step: the room an inference engine must leave after a prompt."""
    return int(round(max(schedule_values(r.max_new_tokens))))
