"""The Task contract: a task owns its problems, its prompt format and its verifiers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Split = Literal["train", "heldout"]


@dataclass(frozen=True)
class Problem:
    id: str        # stable and unique within the task (used for disjointness checks and logging)
    prompt: str    # the question as plain text, before any chat template
    answer: str    # the reference answer
    meta: tuple = ()  # task-specific extras (hashable), e.g. a reasoning-gym entry key


class Task(Protocol):
    name: str

    def problems(self, split: Split) -> list[Problem]:
        """Train and held-out problems; disjoint by construction."""

    def prompt_text(self, problem: Problem, tokenizer) -> str:
        """The text fed to the model (plain, or through the tokenizer's chat template)."""

    def score(self, problem: Problem, completion: str) -> float:
        """Strict verifier in [0, 1]; held-out evaluation always uses this one."""

    def train_score(self, problem: Problem, completion: str) -> float:
        """Training verifier in [0, 1]: `score`, unless the task was built gameable."""

    def format_score(self, completion: str) -> float:
        """1.0 when the completion has the expected structure, else 0.0."""
