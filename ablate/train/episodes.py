"""Multi-turn episodes with an environment (docs/environments.md).

An episode: the prompt, then turns t = 0..max_turns-1. Turn t samples policy tokens a_t through the rollout
engine (`engine.sample(contexts, 1, ..., stop=...)`: until a stop string, EOS or `task.episode.turn_tokens`),
the environment answers a_t's text (`step`), and, unless the episode ends there, its reply o_t is appended as
environment tokens. It ends on the environment's `done`, after `max_turns` turns, or when the episode's
tokens fill the budget `recipe.max_new_tokens` (the last two are truncations, counted apart); an environment
that raises, hangs or answers with the wrong types ends its episode with reward 0 and a counted env error.

The result is one `Rollout` row per episode whose completion is the whole episode after the prompt:
`policy_mask` tags the policy's tokens (behaviour log-probs exist for those only), `turn` gives every token
its turn (o_t shares a_t's), `turn_rewards` the environment's rewards per turn, `episode` the counts. Noise:
turn t of every row draws from `RowNoise(key + (t,))` at the row's global index, so an episode's tokens do
not depend on the world size, the other rows, or which rows are still running.

The trainer calls `sample_part` where it samples a training batch (trainer.sample_groups), `eval_part` where
it samples held-out problems (evaluation.eval_chunk) and `metrics` where it logs a step. What the update does
with the tags the step plan says (ablate/train/plan.py): whether the environment's tokens enter the loss
(`trainer.loss_tokens`) and whether credit is per episode or per turn (`trainer.advantages`,
ablate/rl/turns.py); the IS correction reads the policy's tokens only (`offpolicy.correct`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ablate.rl.rewards import overlong_penalty
from ablate.rl.sampling import EPISODE_FIELDS, Rollout, RowNoise
from ablate.tasks.base import Problem
from ablate.tasks.environments import EnvError, EnvTask, guarded_close, guarded_init, guarded_step
from ablate.train.plan import Sampling
from ablate.train.rollout import prompt_ids

DONE, MAX_TURNS, BUDGET = "end_done", "end_max_turns", "end_budget"


def is_env(task) -> bool:
    return isinstance(task, EnvTask)


@dataclass
class Episode:
    """One episode as it runs: its tokens with their tags, the environment's rewards and the counts."""

    prompt: list[int]
    env: object = None
    tokens: list[int] = field(default_factory=list)
    policy: list[float] = field(default_factory=list)  # 1 on the policy's tokens, 0 on the environment's
    turn: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # the environment's reward after each turn
    outcome: float = 0.0  # the reward of the turn the environment ended the episode with
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    env_error: bool = False
    end: str | None = None  # DONE, MAX_TURNS, BUDGET, or "env_error"

    def add(self, ids: list[int], policy: bool, turn: int, logp: list[float] | None = None) -> None:
        self.tokens += ids
        self.policy += [float(policy)] * len(ids)
        self.turn += [turn] * len(ids)
        self.logp += logp if logp is not None else [0.0] * len(ids)

    def fail(self) -> None:
        self.env_error, self.end, self.rewards, self.outcome = True, "env_error", [], 0.0


class _Rows:
    """The uniforms of some rows of a RowNoise (the episodes still running)."""

    def __init__(self, noise: RowNoise, rows: Tensor):
        self.noise, self.rows = noise, rows

    def next(self) -> Tensor:
        return self.noise.next()[self.rows]

    def seeds(self) -> list[int]:  # an engine that seeds each row's request (vLLM)
        seeds = self.noise.seeds()
        return [seeds[r] for r in self.rows.tolist()]


def observation_ids(tokenizer, text: str, chat: bool) -> list[int]:
    """The environment's reply as tokens: as is, or with a chat template as the template writes a tool turn
    (what the template adds for a tool message after an assistant turn, up to the next assistant prompt)."""
    if chat:
        base = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]
        head = tokenizer.apply_chat_template(base, tokenize=False)
        full = tokenizer.apply_chat_template(base + [{"role": "tool", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        text = full[len(head):] if full.startswith(head) else text
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def run_episodes(engine, tokenizer, task: EnvTask, problems: list[Problem], n: int, temperature: float,
                 budget: int, key: tuple[int, ...] | None, start: int, total: int, greedy: bool = False
                 ) -> tuple[Rollout, Tensor]:
    """n episodes of each problem (rows grouped by problem), rows start.. of `total` in the global batch.
    Returns the rollout and each episode's outcome [N] (float64)."""
    ep, chat = task.episode, task.cfg.chat_template
    episodes: list[Episode] = []
    for p in problems:
        ids = prompt_ids(tokenizer, task.prompt_text(p, tokenizer))
        for _ in range(n):
            e = Episode(prompt=ids)
            try:
                e.env = task.make_env(p)
                first = [{"role": "user", "content": p.prompt}]
                messages = guarded_init(e.env, first, ep.env_timeout_s)
                if messages != first:  # the environment rewrote the prompt (added its instructions, say)
                    e.prompt = prompt_ids(tokenizer, task.prompt_text(p, tokenizer, messages))
            except EnvError:
                e.fail()
            episodes.append(e)
    for t in range(ep.max_turns):
        live = [i for i, e in enumerate(episodes) if e.end is None]
        if not live:
            break
        limit = max(min(ep.turn_tokens, budget - len(episodes[i].tokens)) for i in live)
        noise = None if greedy else _Rows(RowNoise(key + (t,), total, start, start + len(episodes)), torch.tensor(live))
        ro = engine.sample([episodes[i].prompt + episodes[i].tokens for i in live], 1, temperature, limit,
                           greedy=greedy, noise=noise, stop=list(task.stop))
        lengths = ro.completion_mask.sum(1).long().tolist()
        for j, i in enumerate(live):
            e = episodes[i]
            room = budget - len(e.tokens)
            k = min(lengths[j], ep.turn_tokens, room)
            ids = ro.completion_ids[j, :k].tolist()
            e.add(ids, True, t, ro.behav_logp[j, :k].float().tolist())
            e.turns += 1
            if k == room and (lengths[j] > room or bool(ro.truncated[j])):  # cut by the budget mid-turn
                e.end = BUDGET
                continue
            _respond(e, tokenizer.decode(ids, skip_special_tokens=True), t, budget, tokenizer, ep, chat)
    for e in episodes:
        if e.env is not None:
            guarded_close(e.env, ep.env_timeout_s)
    return _rollout(episodes, engine, tokenizer, ep.max_turns)


def _respond(e: Episode, action: str, t: int, budget: int, tokenizer, ep, chat: bool) -> None:
    """The environment's answer to turn t: reward, counts, the end of the episode or its reply's tokens."""
    try:
        obs, reward, done, meta = guarded_step(e.env, action, ep.env_timeout_s)
    except EnvError:
        e.fail()
        return
    e.rewards.append(reward)
    e.tool_calls += bool(meta.get("tool_call", False))
    e.tool_errors += bool(meta.get("tool_error", False))
    if done:
        e.end, e.outcome = DONE, reward
    elif t == ep.max_turns - 1:
        e.end = MAX_TURNS
    else:
        room = budget - len(e.tokens)
        e.add(observation_ids(tokenizer, obs, chat)[:room], False, t)
        if len(e.tokens) >= budget:
            e.end = BUDGET


def _rollout(episodes: list[Episode], engine, tokenizer, max_turns: int) -> tuple[Rollout, Tensor]:
    N, P, T = len(episodes), max(len(e.prompt) for e in episodes), max(1, max(len(e.tokens) for e in episodes))
    pad = engine.pad_id

    def rows(get, width: int, value, left: bool = False, dtype=torch.float32) -> Tensor:
        out = []
        for e in episodes:
            x = list(get(e))
            out.append(([value] * (width - len(x)) + x) if left else (x + [value] * (width - len(x))))
        return torch.tensor(out, dtype=dtype)

    rewards = torch.zeros(N, max_turns, dtype=torch.float64)
    for i, e in enumerate(episodes):
        rewards[i, :len(e.rewards)] = torch.tensor(e.rewards, dtype=torch.float64)
    counts = torch.tensor([[e.turns, e.tool_calls, e.tool_errors, e.env_error,
                            e.end == DONE, e.end == MAX_TURNS, e.end == BUDGET] for e in episodes],
                          dtype=torch.float64)
    device = getattr(engine, "device", torch.device("cpu"))
    ro = Rollout(
        prompt_ids=rows(lambda e: e.prompt, P, pad, left=True, dtype=torch.long),
        prompt_mask=rows(lambda e: [1] * len(e.prompt), P, 0, left=True, dtype=torch.long),
        completion_ids=rows(lambda e: e.tokens, T, pad, dtype=torch.long),
        completion_mask=rows(lambda e: [1.0] * len(e.tokens), T, 0.0),
        truncated=torch.tensor([e.end in (MAX_TURNS, BUDGET) for e in episodes]),
        texts=[tokenizer.decode(e.tokens, skip_special_tokens=True) for e in episodes],
        behav_logp=rows(lambda e: e.logp, T, 0.0),
        policy_mask=rows(lambda e: e.policy, T, 0.0),
        turn=rows(lambda e: e.turn, T, 0, dtype=torch.long),
        turn_rewards=rewards, episode=counts)
    ro = Rollout(**{k: v.to(device) if isinstance(v, Tensor) and k not in ("turn_rewards", "episode") else v
                    for k, v in vars(ro).items()})
    return ro, torch.tensor([e.outcome for e in episodes], dtype=torch.float64)


# --- the seams: where the trainer samples and evaluates, and what it logs -----------------------------

def sample_part(engine, task: EnvTask, problems: list[Problem], sampling: Sampling, tokenizer, key: tuple[int, ...],
                start: int, total: int):
    """`trainer.sample_groups`' share of one rank for an environment task: G episodes per problem, and
    task_rewards' four [b, G] tensors (total, correct, format, overlong) plus the strict scores [b, G]. The
    total is the episode return (the environment's rewards, turn penalties included) plus the overlong term;
    correct and strict are the outcome (the reward of the turn that ended the episode; 0 when truncated)."""
    G, budget = sampling.group_size, sampling.max_new_tokens
    ro, outcome = run_episodes(engine, tokenizer, task, problems, G, sampling.temperature, budget, key, start, total)
    over = overlong_penalty(ro.lengths.cpu(), budget, *sampling.overlong_penalty).double() \
        if sampling.overlong_penalty is not None else torch.zeros(len(ro), dtype=torch.float64)
    shape = (len(problems), G)
    returns = ro.turn_rewards.sum(1)
    return (ro, (returns + over).view(shape), outcome.view(shape), torch.zeros(shape, dtype=torch.float64),
            over.view(shape), outcome.view(shape))


def eval_part(engine, task: EnvTask, problems: list[Problem], n: int, temperature: float, budget: int, tokenizer,
              key: tuple[int, ...], start: int, total: int):
    """`evaluation.eval_chunk`'s share of one rank: n sampled episodes per problem (rollout, outcomes [b, n]) and
    whether each problem's greedy episode succeeds (outcome >= 1)."""
    ro, outcome = run_episodes(engine, tokenizer, task, problems, n, temperature, budget, key, start, total)
    _, greedy = run_episodes(engine, tokenizer, task, problems, 1, 1.0, budget, None, 0, len(problems), greedy=True)
    return ro, outcome.view(-1, n), (greedy >= 1).tolist()


def metrics(rollout: Rollout) -> dict[str, float]:
    """The `episode/*` metrics of a step (definitions in ablate/runs/metrics.py); none for single-turn rollouts."""
    if not rollout.multi_turn:
        return {}
    counts = {name: rollout.episode[:, i] for i, name in enumerate(EPISODE_FIELDS)}
    policy, tokens = float(rollout.policy_mask.sum()), float(rollout.completion_mask.sum())
    return {"episode/turns": float(counts["turns"].mean()),
            "episode/tool_calls": float(counts["tool_calls"].mean()),
            "episode/tool_errors": float(counts["tool_errors"].mean()),
            "episode/env_errors": float(counts["env_errors"].mean()),
            "episode/env_token_frac": (tokens - policy) / max(tokens, 1.0),
            **{f"episode/{k}": float(counts[k].mean()) for k in (DONE, MAX_TURNS, BUDGET)},
            "episode/policy_tokens_per_turn": policy / max(float(counts["turns"].sum()), 1.0)}
