"""Problems from a JSONL file of {"prompt", "answer"} rows, scored with math-verify."""

from __future__ import annotations

import functools
import random
import re
from pathlib import Path

from ablate.config import TaskConfig
from ablate.tasks import chat_prompt, extract_boxed, extract_tagged
from ablate.tasks.base import DataError, Problem, Split, json_rows, read_rows_once


def read_rows(path: str | Path) -> tuple[tuple[int, str, str], ...]:
    """(line number, prompt, answer) for each non-blank line, parsed once per version of the file;
    DataError naming the file and the line (the preflight and the task read it through here alike)."""
    return read_rows_once(path, _parse_rows)


def _parse_rows(path: Path) -> list[tuple[int, str, str]]:
    rows = []
    for n, row in json_rows(path, ("prompt", "answer")):
        if not isinstance(row["prompt"], str) or isinstance(row["answer"], bool) \
                or not isinstance(row["answer"], (str, int, float)):
            raise DataError(path, n, "'prompt' must be a string and 'answer' a string or number")
        rows.append((n, row["prompt"], str(row["answer"])))
    return rows


_WORDS = re.compile(r"[A-Za-z]{2,}( [A-Za-z]+)*")


@functools.lru_cache(maxsize=65536)
def _parse(answer: str):
    from math_verify import parse  # slow import; only paid when scoring

    # Bare LaTeX is not found without delimiters (parse("\\frac12") == []), so wrap in \boxed{}.
    return parse(f"\\boxed{{{answer}}}")


def math_equal(gold: str, pred: str) -> bool:
    """True when pred equals gold as math (1/2 == 0.5 == \\frac{1}{2}) or as plain text."""
    from math_verify import verify

    gold = extract_boxed(gold) or gold.strip()  # a gold answer given as "\boxed{5}"
    if pred.strip() == gold:  # cheap, and covers non-math answers that do not parse
        return True
    if _WORDS.fullmatch(gold):  # math-verify reads words as symbol products: "hello" == "ehllo"
        return pred.strip().lower() == gold.lower()
    parsed_gold, parsed_pred = _parse(gold), _parse(pred.strip())
    return bool(parsed_gold and parsed_pred and verify(parsed_gold, parsed_pred))


class JsonlTask:
    def __init__(self, cfg: TaskConfig):
        self.name = f"jsonl:{Path(cfg.path).name}"
        self.cfg = cfg
        rows = read_rows(cfg.path)
        if cfg.heldout_path:
            train_rows, heldout_rows = rows, read_rows(cfg.heldout_path)
        else:
            if len(rows) < 2:
                raise DataError(cfg.path, None, "need at least 2 rows to split off a held-out set")
            rows = list(rows)
            random.Random(cfg.seed).shuffle(rows)
            n_heldout = max(1, min(cfg.num_heldout, len(rows) // 10))  # ~10%, at most num_heldout
            train_rows, heldout_rows = rows[:-n_heldout], rows[-n_heldout:]

        # Held-out keeps only prompts not in train (nor repeated), so the split is disjoint by prompt.
        seen = {prompt for _, prompt, _ in train_rows}
        kept = []
        for row in heldout_rows:
            if row[1] not in seen:
                seen.add(row[1])
                kept.append(row)
        if not kept:
            raise DataError(cfg.heldout_path or cfg.path, None, "every held-out prompt is also in train")

        # Ids carry the line number in the source file, for tracing a logged problem back.
        self._problems: dict[str, list[Problem]] = {
            "train": [Problem(f"train-L{n}", p, a) for n, p, a in train_rows[:cfg.num_train]],
            "heldout": [Problem(f"heldout-L{n}", p, a) for n, p, a in kept[:cfg.num_heldout]],
        }

    def problems(self, split: Split) -> list[Problem]:
        return list(self._problems[split])

    def prompt_text(self, problem: Problem, tokenizer) -> str:
        return chat_prompt(problem.prompt, tokenizer) if self.cfg.chat_template else problem.prompt

    def extract(self, completion: str) -> str | None:
        if self.cfg.answer_format == "boxed":
            return extract_boxed(completion)
        return extract_tagged(completion)

    def score(self, problem: Problem, completion: str) -> float:
        pred = self.extract(completion)
        return 1.0 if pred and math_equal(problem.answer, pred) else 0.0

    def train_score(self, problem: Problem, completion: str) -> float:
        return self.score(problem, completion)

    def format_score(self, completion: str) -> float:
        return 1.0 if self.extract(completion) else 0.0  # the expected structure, non-empty


def build(cfg: TaskConfig) -> JsonlTask:
    return JsonlTask(cfg)
