"""Any reasoning-gym dataset, by name, seeded and offline, scored by the dataset's own verifier."""

from __future__ import annotations

from typing import Any

from ablate.config import TaskConfig
from ablate.tasks import chat_prompt, extract_boxed, extract_tagged
from ablate.tasks.base import Problem, Split

INSTRUCTION = "Give your final answer in <answer></answer> tags."

# reasoning-gym builds item i from Random(seed + i), so seed+1 would just shift the train set by
# one item (near-total overlap). The held-out seed sits far past any train index range instead.
HELDOUT_SEED_OFFSET = 100_000_000

# Extra held-out candidates to draw, so that filtering out train duplicates usually still
# leaves num_heldout problems.
_OVERSAMPLE = 2


class ReasoningGymTask:
    def __init__(self, cfg: TaskConfig):
        import reasoning_gym  # slow import; only paid when this task is used

        self.name = f"reasoning_gym:{cfg.dataset}"
        self.cfg = cfg
        # id -> (dataset, entry): the entry is a dict (not hashable), so it stays out of Problem
        self._entries: dict[str, tuple[Any, dict]] = {}
        self._problems: dict[str, list[Problem]] = {}

        train_ds = reasoning_gym.create_dataset(cfg.dataset, size=cfg.num_train, seed=cfg.seed, **cfg.rg_config)
        self._problems["train"] = [self._add("train", i, train_ds, e) for i, e in enumerate(train_ds)]

        heldout_ds = reasoning_gym.create_dataset(cfg.dataset, size=cfg.num_heldout * _OVERSAMPLE,
                                                  seed=cfg.seed + HELDOUT_SEED_OFFSET, **cfg.rg_config)
        seen = {e["question"] for _, e in self._entries.values()}  # train questions
        heldout = []
        for i, entry in enumerate(heldout_ds):
            if len(heldout) == cfg.num_heldout:
                break
            if entry["question"] not in seen:  # drops train duplicates and repeats within held-out
                seen.add(entry["question"])
                heldout.append(self._add("heldout", i, heldout_ds, entry))
        if len(heldout) < cfg.num_heldout:
            raise ValueError(
                f"reasoning_gym {cfg.dataset!r}: only {len(heldout)} of {cfg.num_heldout} held-out "
                f"problems remain after removing questions seen in train ({cfg.num_train} problems); "
                "the dataset has too few distinct questions: lower task.num_train or task.num_heldout")
        self._problems["heldout"] = heldout

    def _add(self, split: Split, i: int, dataset, entry: dict) -> Problem:
        pid = f"{split}-{i}"
        self._entries[pid] = (dataset, entry)
        return Problem(id=pid, prompt=f"{entry['question']}\n{INSTRUCTION}", answer=str(entry["answer"]),
                       meta=(self.cfg.dataset, split, i))

    def entry(self, problem: Problem) -> dict:
        """The raw reasoning-gym entry (question, answer, metadata) behind a problem."""
        return self._entries[problem.id][1]

    def problems(self, split: Split) -> list[Problem]:
        return list(self._problems[split])

    def prompt_text(self, problem: Problem, tokenizer) -> str:
        return chat_prompt(problem.prompt, tokenizer) if self.cfg.chat_template else problem.prompt

    @staticmethod
    def extract(completion: str) -> str:
        """Answer tags first, then \\boxed{}, else the whole completion."""
        for found in (extract_tagged(completion), extract_boxed(completion)):
            if found is not None:
                return found
        return completion.strip()

    def score(self, problem: Problem, completion: str) -> float:
        dataset, entry = self._entries[problem.id]
        try:
            reward = float(dataset.score_answer(self.extract(completion), entry))
        except Exception:  # some scorers parse the answer and can choke on arbitrary model text
            return 0.0
        return min(max(reward, 0.0), 1.0)

    def train_score(self, problem: Problem, completion: str) -> float:
        return self.score(problem, completion)

    def format_score(self, completion: str) -> float:
        found = extract_tagged(completion)
        return 1.0 if found else 0.0  # tags present and non-empty


def build(cfg: TaskConfig) -> ReasoningGymTask:
    return ReasoningGymTask(cfg)
