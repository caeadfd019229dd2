"""The toy testbed: single-digit addition with a tabular policy.

Prompt p is "a+b=", its answer the sum written as two tokens (tens, ones), e.g. 7+5 -> "12",
3+4 -> "07". The policy holds one logit table for the first token per prompt, [P, 10], and one for
the second token per prompt and first token, [P, 10, 10]. Each prompt gets a "prior skill" bonus
u ~ U[-0.5, 3.5] on its correct tokens, so some prompts start nearly solved and many nearly hopeless.
It goes through the trainer's real rollout, advantage, loss and metric code, trains in seconds, and its
pass@1 is exact: the product of the two correct-token probabilities, averaged over prompts.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ablate.config import TaskConfig
from ablate.rl.sampling import Rollout, draw
from ablate.tasks.base import Problem, Split

NUM_PROMPTS = 64
DIGITS = "0123456789"


def answer_tokens(problem: Problem) -> tuple[int, int]:
    return int(problem.answer[0]), int(problem.answer[1])


class ToyTask:
    """64 fixed prompts; the tabular policy has nothing to generalise to, so held-out = train."""

    name = "toy_addition"
    heldout_is_train = True

    def __init__(self, cfg: TaskConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        ab = torch.randint(0, 10, (NUM_PROMPTS, 2), generator=g).tolist()
        self._problems = [Problem(id=f"toy-{i}", prompt=f"{a}+{b}=", answer=f"{a + b:02d}") for i, (a, b) in enumerate(ab)]
        # fixed per-prompt constant: a learned reward model's prompt bias (drawn even when off, so the
        # other random draws do not shift when the toggle flips)
        offsets = torch.randn(NUM_PROMPTS, generator=g).tolist()
        self.offset = {p.id: (o if cfg.reward_offset else 0.0) for p, o in zip(self._problems, offsets)}
        self.skill = (torch.rand(NUM_PROMPTS, generator=g) * 4.0 - 0.5)  # U[-0.5, 3.5]
        self.init_seed = cfg.seed

    def problems(self, split: Split) -> list[Problem]:
        return list(self._problems)

    def prompt_text(self, problem: Problem, tokenizer=None) -> str:
        return problem.prompt

    def score(self, problem: Problem, completion: str) -> float:
        return float(completion == problem.answer)

    def train_score(self, problem: Problem, completion: str) -> float:
        return self.score(problem, completion) + self.offset[problem.id]

    def format_score(self, completion: str) -> float:
        return float(len(completion) == 2 and completion.isdigit())


class ToyPolicy(nn.Module):
    """Tabular policy; implements the same `sample` / `logits` contract as `LMPolicy`."""

    pad_id = 0

    def __init__(self, task: ToyTask):
        super().__init__()
        P = NUM_PROMPTS
        g = torch.Generator().manual_seed(task.init_seed + 1)
        first = torch.randn(P, 10, generator=g)
        second = torch.randn(P, 10, 10, generator=g)
        self.index = {p.prompt: i for i, p in enumerate(task.problems("train"))}
        for i, p in enumerate(task.problems("train")):
            tens, ones = answer_tokens(p)
            first[i, tens] += task.skill[i]
            second[i, tens, ones] += task.skill[i]
        self.first = nn.Parameter(first)    # [P, 10]
        self.second = nn.Parameter(second)  # [P, 10, 10]
        self.device = torch.device("cpu")

    @property
    def module(self) -> nn.Module:  # the trained module, as for LMPolicy
        return self

    def _rows(self, prompt_ids: Tensor) -> Tensor:
        return prompt_ids[:, 0]

    @torch.no_grad()
    def sample(self, prompts: list[str], n: int, temperature: float, max_new_tokens: int,
               greedy: bool = False) -> Rollout:
        rows = torch.tensor([self.index[p] for p in prompts for _ in range(n)])
        tens = draw(self.first[rows], temperature, greedy)
        ones = draw(self.second[rows, tens], temperature, greedy)
        completion = torch.stack([tens, ones], dim=1)  # [N, 2]
        N = len(rows)
        return Rollout(prompt_ids=rows[:, None], prompt_mask=torch.ones(N, 1, dtype=torch.long),
                       completion_ids=completion, completion_mask=torch.ones(N, 2),
                       truncated=torch.zeros(N, dtype=torch.bool),
                       texts=[f"{t}{o}" for t, o in completion.tolist()])

    def logits(self, rollout: Rollout) -> Tensor:
        rows = self._rows(rollout.prompt_ids)
        tens = rollout.completion_ids[:, 0]
        return torch.stack([self.first[rows], self.second[rows, tens]], dim=1)  # [N, 2, 10]

    def features(self, rollout: Rollout) -> Tensor:  # a table needs no lm-head: its "hidden states" are logits
        return self.logits(rollout)

    @staticmethod
    def head(hidden: Tensor) -> Tensor:
        return hidden

    @torch.no_grad()
    def exact_pass1(self, problems: list[Problem]) -> float:
        """Mean over prompts of p(tens*) * p(ones* | tens*), at temperature 1."""
        total = 0.0
        for p in problems:
            i, (tens, ones) = self.index[p.prompt], answer_tokens(p)
            total += float(self.first[i].softmax(-1)[tens] * self.second[i, tens].softmax(-1)[ones])
        return total / len(problems)


def build_task(cfg: TaskConfig) -> ToyTask:
    return ToyTask(cfg)
