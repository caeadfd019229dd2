"""The toy testbed: single-digit addition with a tabular policy.

Prompt p is "a+b=", its answer the sum written as two tokens (tens, ones), e.g. 7+5 -> "12",
3+4 -> "07". The policy holds one logit table for the first token per prompt, [P, 10], and one for
the second token per prompt and first token, [P, 10, 10]. Each prompt gets a "prior skill" bonus
u ~ U[-0.5, 3.5] on its correct tokens, so some prompts start nearly solved and many nearly hopeless.
It goes through the trainer's real rollout, advantage, loss and metric code, trains in seconds, and its
pass@1 is exact: the product of the two correct-token probabilities, averaged over prompts.

Two instances (`task.toy_instance`): `default`, drawn with torch; and `chapter`, the instance of the RLVR
chapter's published toy study, drawn with numpy, sampled from one numpy stream in the chapter's order and
computed in float64 (reproductions/rlvr_chapter_toy reruns its table through the normal trainer).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from ablate.config import TaskConfig
from ablate.rl.sampling import Rollout, RowNoise, SamplesWithItself, draw
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

    def initial_logits(self) -> tuple[Tensor, Tensor]:
        """The policy's starting tables, first [P, 10] and second [P, 10, 10], skill bonus included."""
        g = torch.Generator().manual_seed(self.init_seed + 1)
        first = torch.randn(NUM_PROMPTS, 10, generator=g)
        second = torch.randn(NUM_PROMPTS, 10, 10, generator=g)
        for i, p in enumerate(self._problems):
            tens, ones = answer_tokens(p)
            first[i, tens] += self.skill[i]
            second[i, tens, ones] += self.skill[i]
        return first, second

    def problems(self, split: Split) -> list[Problem]:
        return list(self._problems)

    def prompt_text(self, problem: Problem, tokenizer=None) -> str:
        return problem.prompt

    def extract(self, completion: str) -> str:
        return completion  # the two answer digits

    def score(self, problem: Problem, completion: str) -> float:
        return float(completion == problem.answer)

    def train_score(self, problem: Problem, completion: str) -> float:
        return self.score(problem, completion) + self.offset[problem.id]

    def format_score(self, completion: str) -> float:
        return float(len(completion) == 2 and completion.isdigit())


class ToyPolicy(SamplesWithItself, nn.Module):
    """Tabular policy; implements the same `sample` / `logits` contract as `LMPolicy`, and is its own
    rollout engine."""

    pad_id = 0

    def __init__(self, task: ToyTask):
        super().__init__()
        first, second = task.initial_logits()
        self.index = {p.prompt: i for i, p in enumerate(task.problems("train"))}
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
               greedy: bool = False, noise: RowNoise | None = None) -> Rollout:
        rows = torch.tensor([self.index[p] for p in prompts for _ in range(n)])
        u = (lambda: None) if noise is None else noise.next  # one uniform per row and position
        tens, logp_tens = draw(self.first[rows], temperature, greedy, u())
        ones, logp_ones = draw(self.second[rows, tens], temperature, greedy, u())
        return self._rollout(rows, tens, ones, torch.stack([logp_tens, logp_ones], dim=1))

    def _rollout(self, rows: Tensor, tens: Tensor, ones: Tensor, behav_logp: Tensor) -> Rollout:
        completion = torch.stack([tens, ones], dim=1)  # [N, 2]
        N = len(rows)
        return Rollout(prompt_ids=rows[:, None], prompt_mask=torch.ones(N, 1, dtype=torch.long),
                       completion_ids=completion, completion_mask=torch.ones(N, 2, dtype=self.first.dtype),  # loss dtype
                       truncated=torch.zeros(N, dtype=torch.bool),
                       texts=[f"{t}{o}" for t, o in completion.tolist()],
                       behav_logp=behav_logp)

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
    def pass1_per_prompt(self, problems: list[Problem]) -> list[float]:
        """p(tens*) * p(ones* | tens*) of each prompt, at temperature 1."""
        out = []
        for p in problems:
            i, (tens, ones) = self.index[p.prompt], answer_tokens(p)
            out.append(float(self.first[i].softmax(-1)[tens] * self.second[i, tens].softmax(-1)[ones]))
        return out

    def exact_pass1(self, problems: list[Problem]) -> float:
        """Mean over prompts of p(tens*) * p(ones* | tens*), at temperature 1."""
        return sum(self.pass1_per_prompt(problems)) / len(problems)


# --- the RLVR chapter's instance ---------------------------------------------------------------------

def chapter_instance(seed: int = 0) -> dict[str, np.ndarray]:
    """The chapter's toy, drawn as published: rng0 = default_rng(seed) draws a, b, L1, L2, skill, offset
    in this order, then L1[i, tens_i] += skill_i and L2[i, tens_i, ones_i] += skill_i (float64)."""
    rng0 = np.random.default_rng(seed)
    a = rng0.integers(0, 10, NUM_PROMPTS)
    b = rng0.integers(0, 10, NUM_PROMPTS)
    first = rng0.normal(size=(NUM_PROMPTS, 10))       # L1 [P, 10]
    second = rng0.normal(size=(NUM_PROMPTS, 10, 10))  # L2 [P, 10, 10]
    skill = rng0.uniform(-0.5, 3.5, NUM_PROMPTS)
    tens, ones, i = (a + b) // 10, (a + b) % 10, np.arange(NUM_PROMPTS)
    first[i, tens] += skill
    second[i, tens, ones] += skill
    offset = rng0.normal(0, 1, NUM_PROMPTS)
    return dict(a=a, b=b, first=first, second=second, skill=skill, offset=offset)


class ChapterToyTask(ToyTask):
    """The chapter's instance. Its 64 prompts repeat some sums, so each prompt text carries its index
    ("[i] a+b=") to keep one table row per prompt (the policy looks rows up by prompt text)."""


    def __init__(self, cfg: TaskConfig):
        inst = chapter_instance(cfg.seed)
        self._problems = [Problem(id=f"toy-{i}", prompt=f"[{i}] {a}+{b}=", answer=f"{a + b:02d}")
                          for i, (a, b) in enumerate(zip(inst["a"].tolist(), inst["b"].tolist()))]
        self.offset = {p.id: (o if cfg.reward_offset else 0.0)
                       for p, o in zip(self._problems, inst["offset"].tolist())}
        self.skill = torch.from_numpy(inst["skill"])
        self._logits = torch.from_numpy(inst["first"]), torch.from_numpy(inst["second"])
        self.init_seed = cfg.seed

    def initial_logits(self) -> tuple[Tensor, Tensor]:
        return self._logits[0].clone(), self._logits[1].clone()


def inverse_cdf(logits: Tensor, u: Tensor) -> Tensor:
    """The chapter's sampler: the first index whose cumulative probability exceeds u.
    logits [N, V], u [N, 1] uniforms in [0, 1) -> [N] (argmax returns the first maximum)."""
    return (torch.softmax(logits, dim=-1).cumsum(-1) > u).long().argmax(-1)


class ChapterStream:
    """The chapter's random stream, rng = default_rng(run seed); per call of `take(B)`, in this order:
    x = rng.integers(0, P, B) (prompts with replacement), then rng.random((B*G, 1)) for the first and
    rng.random((B*G, 1)) for the second token of the next `policy.sample`. The trainer's PromptSampler
    interface: `take`, `observe`, `metrics`, `state_dict` (here the generator's state, saved in checkpoints)."""

    def __init__(self, policy: ChapterToyPolicy, seed: int, group_size: int):
        self.policy, self.group_size = policy, group_size
        self.rng = np.random.default_rng(seed)

    def take(self, k: int) -> list[int]:
        x = self.rng.integers(0, NUM_PROMPTS, k)
        n = k * self.group_size
        self.policy.uniforms = (torch.from_numpy(self.rng.random((n, 1))), torch.from_numpy(self.rng.random((n, 1))))
        return x.tolist()

    drops_dead_groups = False  # the trainer's PromptSampler interface; the chapter samples uniformly

    def observe(self, indices: list[int], pass_rates: list[float]) -> None:
        pass  # the chapter's stream does not adapt to pass rates

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return self.rng.bit_generator.state  # saved in checkpoints: a resumed run continues the same stream

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state


class ChapterToyPolicy(ToyPolicy):
    """Training rollouts sample by inverse CDF from the uniforms its ChapterStream drew for them (a rank
    takes its rows' share); held-out evaluation and greedy decodes sample as the default toy does (the
    trainer's keyed row noise), so evaluating at any schedule leaves the training trajectory unchanged.
    Tables are float64."""

    def __init__(self, task: ChapterToyTask):
        super().__init__(task)
        self.uniforms: tuple[Tensor, Tensor] | None = None  # ([N, 1], [N, 1]) for the next training sample

    def prompt_stream(self, seed: int, group_size: int) -> ChapterStream:
        return ChapterStream(self, seed, group_size)

    @torch.no_grad()
    def sample(self, prompts: list[str], n: int, temperature: float, max_new_tokens: int,
               greedy: bool = False, noise: RowNoise | None = None) -> Rollout:
        if greedy or self.uniforms is None:
            return super().sample(prompts, n, temperature, max_new_tokens, greedy, noise)
        (u1, u2), self.uniforms = self.uniforms, None
        if noise is not None:  # this rank's rows of the global batch the stream drew for
            u1, u2 = u1[noise.start:noise.stop], u2[noise.start:noise.stop]
        rows = torch.tensor([self.index[p] for p in prompts for _ in range(n)])
        if len(rows) != len(u1):
            raise ValueError(f"the stream drew uniforms for {len(u1)} rows, sample asks for {len(rows)}")
        first = self.first[rows] / temperature
        tens = inverse_cdf(first, u1)
        second = self.second[rows, tens] / temperature
        ones = inverse_cdf(second, u2)
        behav = torch.stack([first.log_softmax(-1).gather(-1, tens[:, None]).squeeze(-1),
                             second.log_softmax(-1).gather(-1, ones[:, None]).squeeze(-1)], dim=1).float()
        return self._rollout(rows, tens, ones, behav)


def build_task(cfg: TaskConfig) -> ToyTask:
    return ChapterToyTask(cfg) if cfg.toy_instance == "chapter" else ToyTask(cfg)


def build_policy(task: ToyTask) -> ToyPolicy:
    return ChapterToyPolicy(task) if isinstance(task, ChapterToyTask) else ToyPolicy(task)
