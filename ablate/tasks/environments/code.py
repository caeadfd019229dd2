"""Code with execution feedback: the policy may run code in the sandbox before it submits.

A turn holding `<run>...</run>` (the stop string "</run>" ends it) runs that script in the bubblewrap
sandbox (ablate/tasks/sandbox.py: the tests' namespaces, filter and rlimits) and the environment replies
with its stdout, stderr and exit status; a non-zero status counts as a tool error (reward
-`tool_error_penalty`). Any other turn is the submission: its code (the last fenced block, as the code task
reads it) runs against the problem's hidden tests, which the policy never sees, and the reward is the code
task's (`task.code_reward`: share of tests passed, or all-or-nothing). Problems are the code task's.
"""

from __future__ import annotations

import re
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from ablate.tasks.code import extract_code
from ablate.tasks.sandbox import Limits, run_code, run_tests

STOP = "</run>"
_RUN = re.compile(r"<run>(.*?)</run>\s*$", re.DOTALL)
MAX_SHOWN = 400  # characters of each stream shown to the policy


def feedback(stdout: str, stderr: str, status: int) -> str:
    return f"\nstdout:\n{stdout[:MAX_SHOWN]}\nstderr:\n{stderr[:MAX_SHOWN]}\nexit status: {status}\n"


class CodeExecEnv(BaseTextEnv):
    """skyrl-gym text environment; `extras`: extra_info (prompt, entry_point, tests), max_turns,
    tool_error_penalty, code_reward ('partial' or 'all')."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        extras = extras or {}
        info = extras["extra_info"]
        self.prompt, self.entry_point, self.tests = info["prompt"], info["entry_point"], list(info["tests"])
        self.max_turns = int(extras.get("max_turns", 3))
        self.penalty = float(extras.get("tool_error_penalty", 0.0))
        self.all_or_nothing = extras.get("code_reward", "partial") == "all"
        self.limits = Limits()

    def init(self, prompt):
        return prompt, {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        run = _RUN.search(action)
        if run is None:  # the submission
            passed = run_tests(extract_code(action, self.prompt, self.entry_point), self.entry_point, self.tests,
                               self.limits)
            reward = float(all(passed)) if self.all_or_nothing else sum(passed) / len(passed)
            return BaseTextEnvStepOutput(observations=[], reward=reward, done=True,
                                         metadata={"tool_call": False, "tool_error": False})
        result = run_code(run.group(1), self.limits)
        failed = result.exit_status != 0
        return BaseTextEnvStepOutput(
            observations=[{"role": "tool", "content": feedback(result.stdout, result.stderr, result.exit_status)}],
            reward=-self.penalty if failed else 0.0, done=False, metadata={"tool_call": True, "tool_error": failed})
