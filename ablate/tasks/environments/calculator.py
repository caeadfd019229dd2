"""Calculator arithmetic: the arithmetic task's problems, with a calculator the policy may call.

An episode on "47*86=" (character-level, base model, no chat template):

    47*86=[47*86]=4042\n4042<eos>
          ^^^^^^^                   policy turn 1: a call, ended by the stop string "]"
                 ^^^^^^             environment reply (environment tokens)
                       ^^^^^^^^^    policy turn 2: the answer, ended by EOS -> done, reward 1 if correct

A turn without a call is the final answer (done). A call the calculator cannot evaluate (one binary
operation of +, -, * on integers) replies "=error" and counts as a tool error; the environment's reward for
that turn is -`tool_error_penalty` (0 by default: outcome credit only). `trace` writes the warm-start
traces of `ablate base-model --tools calculator` in exactly this format.
"""

from __future__ import annotations

import random
import re
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

STOP = "]"  # ends a call turn
_CALL = re.compile(r"\[([^\[\]]*)\]\s*$")
_EXPR = re.compile(r"\s*(\d{1,9})\s*([+\-*])\s*(\d{1,9})\s*")


def evaluate(expr: str) -> int | None:
    """The value of one binary operation on non-negative integers, or None when it is not one."""
    m = _EXPR.fullmatch(expr)
    if m is None:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def reply(value: int | None) -> str:
    return f"={'error' if value is None else value}\n"


def first_word(text: str) -> str:
    words = text.strip().split()
    return words[0] if words else ""


class CalculatorEnv(BaseTextEnv):
    """skyrl-gym text environment; `extras`: reward_spec.ground_truth, max_turns, tool_error_penalty."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        extras = extras or {}
        self.answer = str(extras["reward_spec"]["ground_truth"])
        self.max_turns = int(extras.get("max_turns", 3))
        self.penalty = float(extras.get("tool_error_penalty", 0.0))

    def init(self, prompt):
        return prompt, {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        call = _CALL.search(action)
        if call is None:  # the final answer
            return BaseTextEnvStepOutput(observations=[], reward=float(first_word(action) == self.answer),
                                         done=True, metadata={"tool_call": False, "tool_error": False})
        value = evaluate(call.group(1))
        return BaseTextEnvStepOutput(observations=[{"role": "tool", "content": reply(value)}],
                                     reward=-self.penalty if value is None else 0.0, done=False,
                                     metadata={"tool_call": True, "tool_error": value is None})


def trace(prompt: str, answer: str, a: int, op: str, b: int, rng: random.Random, call: bool,
          noise: float) -> list[tuple[str, bool]]:
    """One warm-start trace after the prompt as (text, is_policy) segments: a direct answer, or a call, the
    calculator's reply and the answer copied from it. `noise`: the share of digits replaced at random in the
    answer (direct), or in the call's operands and the copy (call), so the warm-started model errs in both."""
    def garble(text: str) -> str:
        return "".join(rng.choice("0123456789") if c.isdigit() and rng.random() < noise else c for c in text)
    if not call:
        return [(garble(answer), True)]
    expr = garble(f"{a}{op}{b}")
    value = evaluate(expr)
    shown = str(value) if value is not None else answer
    return [(f"[{expr}]", True), (reply(value), False), (garble(shown), True)]
