"""Procedural integer arithmetic: prompts like "47+8=", the model completes "55" then EOS.

Difficulty comes from the mix: each operand independently gets one of `cfg.digits` digit counts and
each problem one of `cfg.operators`, so one-digit additions (easy) sit next to 2x2-digit products
(hard), like the spread of pass rates in real RLVR data.

The train/held-out split is a fixed partition of the problem space by a hash of the prompt text,
independent of `cfg.seed`. The seed only picks which problems are drawn. This way a base model
warm-started on train problems (of any seed) has never seen a held-out problem of any seed.
"""

from __future__ import annotations

import hashlib
import random
import re

from ablate.config import TaskConfig
from ablate.tasks.base import Problem, Split

HELDOUT_BUCKETS = 5  # 1 in 5 points of the problem space is held out
_INT = re.compile(r"-?\d+")


def is_heldout(prompt: str) -> bool:
    """Which side of the fixed split a prompt lies on (a stable hash, not Python's salted hash())."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return digest[0] % HELDOUT_BUCKETS == 0


def _operand(rng: random.Random, digits: int) -> int:
    # 1-digit operands include 0; d-digit operands have no leading zero
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10 ** digits - 1)


def make_problem(a: int, op: str, b: int) -> Problem:
    if op == "-" and a < b:
        a, b = b, a  # keep answers non-negative: fewer formats for a tiny model to learn
    prompt = f"{a}{op}{b}="
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return Problem(id=prompt, prompt=prompt, answer=str(answer), meta=(op, len(str(a)), len(str(b))))


def random_problem(rng: random.Random, digits, operators) -> Problem:
    """One draw from the task's mix (digit count per operand, operator); may land on either split."""
    op = rng.choice(operators)
    return make_problem(_operand(rng, rng.choice(digits)), op, _operand(rng, rng.choice(digits)))


def sample_problems(cfg: TaskConfig, split: Split, n: int, seed: int) -> list[Problem]:
    """Up to `n` distinct problems of one split. Returns fewer only when the space runs out."""
    rng = random.Random(f"{seed}:{split}")  # string seeds are stable across runs and platforms
    want_heldout = split == "heldout"
    seen: dict[str, Problem] = {}
    attempts = 0
    while len(seen) < n and attempts < 50 * n + 1000:
        attempts += 1
        p = random_problem(rng, cfg.digits, cfg.operators)
        if is_heldout(p.prompt) == want_heldout and p.id not in seen:
            seen[p.id] = p
    return list(seen.values())


def _first_word(completion: str) -> str:
    """The answer part of a completion: stripped, up to the first whitespace or EOS text."""
    text = completion.split("<eos>")[0].strip()
    return text.split()[0] if text else ""


class ArithmeticTask:
    name = "arithmetic"

    def __init__(self, cfg: TaskConfig):
        self.cfg = cfg
        self._sets = {
            "train": sample_problems(cfg, "train", cfg.num_train, cfg.seed),
            "heldout": sample_problems(cfg, "heldout", cfg.num_heldout, cfg.seed),
        }
        # disjoint by construction (hash split); checked anyway, since everything downstream relies on it
        overlap = {p.id for p in self._sets["train"]} & {p.id for p in self._sets["heldout"]}
        if overlap:
            raise ValueError(f"train and held-out problems overlap: {sorted(overlap)[:5]}")
        if not self._sets["train"] or not self._sets["heldout"]:
            raise ValueError(f"task.digits={cfg.digits} gives an empty train or held-out set")

    def problems(self, split: Split) -> list[Problem]:
        return list(self._sets[split])

    def prompt_text(self, problem: Problem, tokenizer=None) -> str:
        return problem.prompt  # a base model, no chat template: the prompt as is

    def extract(self, completion: str) -> str | None:
        """The answer the verifier reads (used by held-out maj@k); None when there is none."""
        return _first_word(completion) or None

    def score(self, problem: Problem, completion: str) -> float:
        return float(_first_word(completion) == problem.answer)

    def train_score(self, problem: Problem, completion: str) -> float:
        if not self.cfg.gameable:
            return self.score(problem, completion)
        # gameable: any integer with the right last digit passes (a hackable verifier)
        word = _first_word(completion)
        return float(bool(_INT.fullmatch(word)) and word[-1] == problem.answer[-1])

    def format_score(self, completion: str) -> float:
        return float(bool(_INT.fullmatch(_first_word(completion))))


def build(cfg: TaskConfig) -> ArithmeticTask:
    return ArithmeticTask(cfg)
