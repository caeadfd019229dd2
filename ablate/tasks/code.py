"""Code with unit tests: the completion's function runs against the problem's tests in a sandbox.

Problems come from a JSONL file of {"prompt", "tests", "entry_point"} rows (`task.path`; `tests` a list
of test statements, or one string such as HumanEval's `def check(candidate): ...`), or, when no path is
given, from the shipped procedural set below (small functions with a random constant, generated from
`task.seed`, no download). The reward is the share of tests passed (`task.code_reward: partial`) or 1 only
when all pass (`all`). The code is never run in this process: see `ablate.tasks.sandbox`.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from ablate.config import TaskConfig
from ablate.tasks import chat_prompt
from ablate.tasks.arithmetic import is_heldout
from ablate.tasks.base import DataError, Problem, Split, json_rows, read_rows_once
from ablate.tasks.sandbox import Limits, require, run_many

_FENCE = re.compile(r"```(\w*)[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


def extract_code(completion: str, prompt: str = "", entry_point: str = "") -> str:
    """The code of a completion: the last ```python (or bare ```) block, else the whole text. When it does
    not define `entry_point` but the prompt does (HumanEval's signature + docstring), prompt + code."""
    blocks = _FENCE.findall(completion)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    code = (python or [body for _, body in blocks] or [completion])[-1]
    defines = lambda text: re.search(rf"^\s*def {re.escape(entry_point)}\s*\(", text, re.M)  # noqa: E731
    if entry_point and not defines(code) and defines(prompt):
        code = prompt + code
    return code


def as_tests(tests) -> tuple[str, ...]:
    """Test statements: a list as is; one string as one test, calling `check(candidate)` if it defines it."""
    if isinstance(tests, str):
        return (tests + "\ncheck(candidate)",) if re.search(r"^def check\(", tests, re.M) else (tests,)
    return tuple(tests)


def read_rows(path: str | Path) -> tuple[tuple[int, str, tuple[str, ...], str], ...]:
    """(line number, prompt, tests, entry point) per non-blank line, parsed once per version of the file;
    DataError naming the file and the line."""
    return read_rows_once(path, _parse_rows)


def _parse_rows(path: Path) -> list[tuple[int, str, tuple[str, ...], str]]:
    rows = []
    for n, row in json_rows(path, ("prompt", "tests", "entry_point")):
        tests = row["tests"]
        if not (isinstance(tests, str) or isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests)):
            raise DataError(path, n, "'tests' must be a string or a non-empty list of strings")
        if not isinstance(row["prompt"], str) or not isinstance(row["entry_point"], str) \
                or not row["entry_point"].isidentifier():
            raise DataError(path, n, "'prompt' must be a string and 'entry_point' a Python identifier")
        rows.append((n, row["prompt"], as_tests(tests), row["entry_point"]))
    return rows


# --- the shipped procedural set ----------------------------------------------------------------------
# family: (entry point, prompt template, reference solution template, reference function, input maker)

def _ints(rng):
    return (rng.randint(-50, 50),)


def _int_list(rng):
    return ([rng.randint(-20, 20) for _ in range(rng.randint(0, 6))],)


def _word(rng):
    return ("".join(rng.choice("abcab ") for _ in range(rng.randint(0, 10))),)


FAMILIES = {
    "add_k": ("add_k", "Write a Python function `add_k(x)` that returns the integer x plus {k}.",
              "def add_k(x):\n    return x + {k}\n", lambda k, x: x + k, _ints),
    "scale": ("scale", "Write a Python function `scale(xs)` that returns a new list with every element of the "
              "list xs multiplied by {k}.", "def scale(xs):\n    return [x * {k} for x in xs]\n",
              lambda k, xs: [x * k for x in xs], _int_list),
    "is_multiple": ("is_multiple", "Write a Python function `is_multiple(n)` that returns True if the integer "
                    "n is divisible by {k}, else False.", "def is_multiple(n):\n    return n % {k} == 0\n",
                    lambda k, n: n % k == 0, _ints),
    "count_above": ("count_above", "Write a Python function `count_above(xs)` that returns how many elements "
                    "of the list xs are greater than {k}.",
                    "def count_above(xs):\n    return sum(1 for x in xs if x > {k})\n",
                    lambda k, xs: sum(1 for x in xs if x > k), _int_list),
    "repeat": ("repeat", "Write a Python function `repeat(s)` that returns the string s repeated {k} times.",
               "def repeat(s):\n    return s * {k}\n", lambda k, s: s * k, _word),
    "clip": ("clip", "Write a Python function `clip(x)` that returns the integer x limited to the range "
             "[-{k}, {k}].", "def clip(x):\n    return max(-{k}, min({k}, x))\n",
             lambda k, x: max(-k, min(k, x)), _ints),
}
TESTS_PER_PROBLEM = 4


def make_problem(family: str, k: int, rng: random.Random) -> Problem:
    """One procedural problem; `answer` holds the reference solution (the scripted policy)."""
    entry, prompt, solution, fn, inputs = FAMILIES[family]
    tests = []
    for _ in range(TESTS_PER_PROBLEM):
        args = inputs(rng)
        tests.append(f"assert candidate({', '.join(map(repr, args))}) == {fn(k, *args)!r}")
    return Problem(id=f"{family}-{k}", prompt=prompt.format(k=k), answer=solution.format(k=k),
                   meta=(entry, tuple(tests)))


def procedural_problems(split: Split, n: int, seed: int) -> list[Problem]:
    """Up to `n` distinct problems of one split (a fixed hash split of the prompt, as in arithmetic)."""
    rng = random.Random(f"code:{seed}:{split}")
    seen: dict[str, Problem] = {}
    for _ in range(50 * n + 1000):
        if len(seen) >= n:
            break
        family, k = rng.choice(sorted(FAMILIES)), rng.randint(2, 99)
        p = make_problem(family, k, rng)
        if is_heldout(p.prompt) == (split == "heldout") and p.id not in seen:
            seen[p.id] = p
    return list(seen.values())


class CodeTask:
    def __init__(self, cfg: TaskConfig):
        require()
        self.cfg = cfg
        self.limits = Limits()
        self._cache: dict[tuple[str, str], tuple[bool, ...]] = {}
        if cfg.path:
            self.name = f"code:{Path(cfg.path).name}"
            rows = read_rows(cfg.path)
            heldout_rows = read_rows(cfg.heldout_path) if cfg.heldout_path else None
            if heldout_rows is None:
                if len(rows) < 2:
                    raise DataError(cfg.path, None, "need at least 2 rows to split off a held-out set")
                rows = list(rows)
                random.Random(cfg.seed).shuffle(rows)
                n_heldout = max(1, min(cfg.num_heldout, len(rows) // 10))
                rows, heldout_rows = rows[:-n_heldout], rows[-n_heldout:]
            train_prompts = {r[1] for r in rows}
            heldout_rows = [r for r in heldout_rows if r[1] not in train_prompts]
            make = lambda split, r: Problem(f"{split}-L{r[0]}", r[1], "", (r[3], r[2]))  # noqa: E731
            self._problems = {"train": [make("train", r) for r in rows[:cfg.num_train]],
                              "heldout": [make("heldout", r) for r in heldout_rows[:cfg.num_heldout]]}
        else:
            self.name = "code"
            self._problems = {s: procedural_problems(s, n, cfg.seed)
                              for s, n in (("train", cfg.num_train), ("heldout", cfg.num_heldout))}
        for split, problems in self._problems.items():
            if not problems:
                raise ValueError(f"task.name='code': the {split} split is empty")

    def problems(self, split: Split) -> list[Problem]:
        return list(self._problems[split])

    def prompt_text(self, problem: Problem, tokenizer) -> str:
        return chat_prompt(problem.prompt, tokenizer) if self.cfg.chat_template else problem.prompt

    def _reward(self, passed: tuple[bool, ...]) -> float:
        if self.cfg.code_reward == "all":
            return float(all(passed))
        return sum(passed) / len(passed)

    def outcomes(self, problems: list[Problem], completions: list[str]) -> list[tuple[bool, ...]]:
        """Per-test outcomes, the sandboxes running in `task.code_workers` parallel slots. Cached by
        (problem, completion): the trainer scores each completion with both verifiers."""
        keys = [(p.id, c) for p, c in zip(problems, completions)]
        todo = {k: (p, c) for k, p, c in zip(keys, problems, completions) if k not in self._cache}
        jobs = [(extract_code(c, p.prompt, p.meta[0]), p.meta[0], list(p.meta[1])) for p, c in todo.values()]
        results = dict(zip(todo, map(tuple, run_many(jobs, self.limits, self.cfg.code_workers))))
        out = [results[k] if k in results else self._cache[k] for k in keys]
        if len(self._cache) > 8192:
            self._cache.clear()
        self._cache.update(results)
        return out

    def score(self, problem: Problem, completion: str) -> float:
        return self._reward(self.outcomes([problem], [completion])[0])

    def score_many(self, problems: list[Problem], completions: list[str]) -> list[float]:
        return [self._reward(o) for o in self.outcomes(problems, completions)]

    def train_score_many(self, problems: list[Problem], completions: list[str]) -> list[float]:
        return self.score_many(problems, completions)

    def train_score(self, problem: Problem, completion: str) -> float:
        return self.score(problem, completion)

    def format_score(self, completion: str) -> float:
        return 1.0 if _FENCE.search(completion) else 0.0  # a fenced code block


def build(cfg: TaskConfig) -> CodeTask:
    return CodeTask(cfg)
