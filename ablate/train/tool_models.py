"""The tiny base model of the calculator environment: `ablate base-model --tools calculator`.

A smaller (~0.35M-parameter) character-level Llama of the arithmetic base model's kind (ablate/train/models.py),
warm-started on arithmetic TRAIN problems written as episodes of the calculator environment
(ablate/tasks/environments/calculator.py): a share `tool_share` of the traces call the calculator and copy
its answer, the others answer directly. Both paths are noisy (`label_noise` on direct answers, `tool_noise`
on a call's operands and the copied answer), and the environment's replies are not trained on (label -100,
as the RL loss masks environment tokens). RL then has two things to improve: when to call the calculator
(direct answers to 2-digit products are mostly wrong) and how to use it (exact operands, exact copies).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ablate.tasks.arithmetic import is_heldout, random_problem
from ablate.tasks.environments.calculator import _EXPR, trace
from ablate.train.models import _new_model, build_tokenizer, settings_hash, warm_start

RECIPE_VERSION = 1


@dataclass(frozen=True)
class CalculatorSettings:
    seed: int = 0
    steps: int = 800
    batch_size: int = 48
    lr: float = 3e-3
    label_noise: float = 0.25  # direct answers: share of digits replaced at random
    tool_noise: float = 0.08   # calls: share of digits replaced in the operands and in the copied answer
    tool_share: float = 0.3    # share of traces that call the calculator
    hidden: int = 96         # smaller than the arithmetic model's 128 x 4: episodes are longer to sample
    layers: int = 3
    heads: int = 4
    intermediate: int = 288
    digits: tuple[int, ...] = (1, 2)
    operators: tuple[str, ...] = ("+", "-", "*")

    def hash(self) -> str:
        return settings_hash(self, recipe_version=RECIPE_VERSION, kind="calculator")


def _batch(rng: random.Random, s: CalculatorSettings, tok):
    """Right-padded (ids, mask, labels) of `batch_size` traces; labels only on policy text and EOS."""
    rows = []
    for _ in range(s.batch_size):
        p = random_problem(rng, s.digits, s.operators)
        while is_heldout(p.prompt):
            p = random_problem(rng, s.digits, s.operators)
        a, op, b = _EXPR.fullmatch(p.prompt[:-1]).groups()
        call = rng.random() < s.tool_share
        ids = tok(p.prompt)["input_ids"]
        labels = [-100] * len(ids)
        for text, policy in trace(p.prompt, p.answer, int(a), op, int(b), rng, call,
                                  s.tool_noise if call else s.label_noise):
            seg = tok(text, add_special_tokens=False)["input_ids"]
            ids, labels = ids + seg, labels + (seg if policy else [-100] * len(seg))
        rows.append((ids + [tok.eos_token_id], labels + [tok.eos_token_id]))
    width = max(len(r) for r, _ in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lab) in enumerate(rows):
        ids[i, :len(r)], labels[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), torch.tensor(lab), 1
    return ids, mask, labels


def build_calculator_model(out_dir: str | Path, settings: CalculatorSettings | None = None,
                           progress: bool = True) -> dict:
    """Build (or reuse, when built with the same settings) the calculator base model in `out_dir`."""
    s = settings or CalculatorSettings()
    out = Path(out_dir)
    meta = out / "build.json"
    if meta.is_file() and (out / "config.json").is_file():
        record = json.loads(meta.read_text())
        if record.get("settings_hash") == s.hash():
            return record
    t0 = time.time()
    torch.manual_seed(s.seed)
    rng = random.Random(s.seed)
    tok = build_tokenizer()
    model = _new_model(s, tok)
    loss_ema = warm_start(model, s.steps, s.lr, lambda: _batch(rng, s, tok), progress, "warm start (calculator traces)")
    record = {"kind": "calculator", "settings": asdict(s), "settings_hash": s.hash(), "recipe_version": RECIPE_VERSION,
              "params": sum(p.numel() for p in model.parameters()), "final_loss_ema": loss_ema,
              "train_seconds": round(time.time() - t0, 1)}
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    meta.write_text(json.dumps(record, indent=2) + "\n")  # last: marks the build done
    return record


def tool_model_cli(out: str, seed: int = 0) -> None:
    """`ablate base-model --tools calculator --out models/tiny-calc`: build (or reuse) and say what it did."""
    from rich.console import Console

    record = build_calculator_model(out, CalculatorSettings(seed=seed))
    Console().print(f"calculator base model in {out}: {record['params']:,} params, built in "
                    f"{record['train_seconds']} s, final loss {record['final_loss_ema']:.3f}")
