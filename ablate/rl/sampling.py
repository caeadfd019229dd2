"""The sampled batch every policy returns (`Rollout`) and one-token sampling from logits (`draw`).

Shared by the LM sampler (ablate/train/rollout.py) and the tabular toy policy (ablate/tasks/toy.py), so it
sits below both. Completions of one prompt are contiguous: row i belongs to prompt i // G.

Three policies meet in an RL step (docs/offpolicy.md):
- behaviour, pi_behav: the weights and numerics that sampled the tokens. Its log-probs, `behav_logp`, are
  recorded here at sampling time, from the very distribution each token was drawn from.
- old, pi_old: the trainer's own recompute of the same tokens at the start of the update (PPO's anchor).
- current, pi_theta: the policy being optimised.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ablate.rl.divergence import check_finite
from ablate.rl.losses import logsumexp


@dataclass
class Rollout:
    prompt_ids: Tensor       # [N, P] left-padded
    prompt_mask: Tensor      # [N, P] 1 on real prompt tokens
    completion_ids: Tensor   # [N, T] right-padded after EOS
    completion_mask: Tensor  # [N, T] float, 1 on generated tokens up to and including EOS
    truncated: Tensor        # [N] bool, no EOS within the token budget
    texts: list[str]         # decoded completions (EOS and padding removed)
    behav_logp: Tensor       # [N, T] float32 log pi_behav(token) as sampled (after temperature); 0 where masked
    # Multi-turn episodes (ablate/train/episodes.py, docs/environments.md); single-turn rollouts leave them None.
    # The completion is then the whole episode after the prompt: policy turns and the environment's replies.
    policy_mask: Tensor | None = None   # [N, T] float, 1 on tokens the policy sampled (None: = completion_mask)
    turn: Tensor | None = None          # [N, T] long, turn index of each token (a turn's reply shares its index)
    turn_rewards: Tensor | None = None  # [N, K] float64, the environment's reward after each turn t < K = max turns
    episode: Tensor | None = None       # [N, len(EPISODE_FIELDS)] float64, per-episode counts (EPISODE_FIELDS)

    def __post_init__(self):
        if self.policy_mask is None:  # single turn: every completion token was sampled by the policy
            self.policy_mask = self.completion_mask

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def lengths(self) -> Tensor:  # [N]
        return self.completion_mask.sum(-1)

    @property
    def multi_turn(self) -> bool:
        return self.episode is not None

    def select(self, idx: Tensor) -> Rollout:
        """Rows `idx` (a 1-d index tensor)."""
        rows = idx.tolist()
        return Rollout(**{f.name: v if v is None else [v[i] for i in rows] if isinstance(v, list) else v[idx]
                          for f in fields(self) for v in [getattr(self, f.name)]})

    def columns(self, p: int, t: int) -> Rollout:
        """The last `p` prompt columns and the first `t` completion columns of every row."""
        cut = lambda x: None if x is None else x[:, :t]  # noqa: E731
        return Rollout(self.prompt_ids[:, -p:], self.prompt_mask[:, -p:], self.completion_ids[:, :t],
                       self.completion_mask[:, :t], self.truncated, self.texts, self.behav_logp[:, :t],
                       cut(self.policy_mask), cut(self.turn), self.turn_rewards, self.episode)

    @staticmethod
    def cat(parts: list[Rollout], pad_id: int) -> Rollout:
        """Concatenate rows, re-padding prompts on the left and completions on the right."""
        P = max(r.prompt_ids.shape[1] for r in parts)
        T = max(r.completion_ids.shape[1] for r in parts)

        def pad(x: Tensor, width: int, left: bool, value) -> Tensor:
            gap = width - x.shape[1]
            return F.pad(x, (gap, 0) if left else (0, gap), value=value)

        def extra(name: str, width: int | None) -> Tensor | None:  # an episode field: all parts have it or none
            if getattr(parts[0], name) is None:
                return None
            return torch.cat([getattr(r, name) if width is None else pad(getattr(r, name), width, False, 0)
                              for r in parts])

        return Rollout(
            prompt_ids=torch.cat([pad(r.prompt_ids, P, True, pad_id) for r in parts]),
            prompt_mask=torch.cat([pad(r.prompt_mask, P, True, 0) for r in parts]),
            completion_ids=torch.cat([pad(r.completion_ids, T, False, pad_id) for r in parts]),
            completion_mask=torch.cat([pad(r.completion_mask, T, False, 0.0) for r in parts]),
            truncated=torch.cat([r.truncated for r in parts]),
            texts=[t for r in parts for t in r.texts],
            behav_logp=torch.cat([pad(r.behav_logp, T, False, 0.0) for r in parts]),
            policy_mask=torch.cat([pad(r.policy_mask, T, False, 0.0) for r in parts]),
            turn=extra("turn", T), turn_rewards=extra("turn_rewards", None), episode=extra("episode", None),
        )


# the columns of Rollout.episode: counts per episode, and how it ended (one-hot over the three causes)
EPISODE_FIELDS = ("turns", "tool_calls", "tool_errors", "env_errors", "end_done", "end_max_turns", "end_budget")


SAMPLER = "global_row_inverse_cdf_v1"  # recorded in provenance.json: how the trainer draws its tokens
TRAIN, EVAL = 0, 1  # the `purpose` part of a RowNoise key


class RowNoise:
    """Sampling noise indexed by the global row, not by the process: position t of every sequence takes the
    t-th draw of a generator keyed by `key` (e.g. run seed, step, round, purpose), one uniform per row of
    the global batch of `total` rows, of which this process samples rows [start, stop). However the rows
    are split across ranks (or micro-batches), each row sees the same uniforms, so inverse-CDF sampling
    (`draw` with `u`) picks the same tokens."""

    def __init__(self, key: tuple[int, ...], total: int, start: int = 0, stop: int | None = None):
        self.key = tuple(int(k) for k in key)
        seed = int(np.random.SeedSequence(self.key).generate_state(1, np.uint64)[0])
        self.gen = torch.Generator().manual_seed(seed)
        self.total, self.start, self.stop = total, start, total if stop is None else stop

    def seeds(self) -> list[int]:
        """One seed per row of this process, keyed by (key, global row): how an inference engine that draws
        with per-request generators (vLLM) gets per-row randomness independent of the split."""
        return [int(np.random.SeedSequence((*self.key, row)).generate_state(1, np.uint64)[0] >> 1)
                for row in range(self.start, self.stop)]

    def next(self) -> Tensor:
        """The uniforms in [0, 1) of the next position for this process's rows, [stop - start] float32."""
        return torch.rand(self.total, generator=self.gen)[self.start:self.stop]


class SamplesWithItself:
    """The RolloutEngine methods of a policy that samples with the module it trains (the LM's KV-cache loop,
    the toy table): no copy of the weights to update, no memory of its own to release during the update."""

    def sync_weights(self, module, version: int) -> None:
        assert module is self.module

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass


DRAW_ELEMENTS = 2**25  # logits values drawn at once (128 MiB in fp32): blocks of 2^25 // V rows


def draw(logits: Tensor, temperature: float, greedy: bool, u: Tensor | None = None,
         work: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One token per row from next-token logits [N, V] -> (tokens [N], behaviour log-probs [N]).

    With uniforms `u` [N] (a `RowNoise` draw) by inverse CDF: the first token whose cumulative
    (unnormalised) probability exceeds u times the row's total, so rounding never runs past the last token;
    without, `torch.multinomial` on the global torch RNG. The log-prob is that of the drawn token under the
    distribution it was drawn from: softmax(logits / T), float32; greedy decoding draws from a point mass, so
    its log-prob is 0. Rows are drawn in blocks of DRAW_ELEMENTS // V (so no fp32 temporary spans all rows
    at a real vocabulary); on CPU the blocks consume the random stream exactly as one multinomial call over
    all rows does (tested). `work`: a float32 buffer of at least [block rows, V]; with it, float32 `logits`
    are used as working memory too (overwritten), so the inverse-CDF draw allocates nothing of size V.
    """
    if greedy:
        tok = logits.argmax(-1)
        return tok, torch.zeros(tok.shape, device=tok.device)
    toks, logps = [], []
    rows = max(1, DRAW_ELEMENTS // logits.shape[-1])
    for i, block in enumerate(logits.split(rows)):
        if u is None:
            scaled = block.float() / temperature  # [n, V]
            lse = logsumexp(scaled)  # [n]
            check_finite("sampling probabilities", lse)  # finite iff every probability of its row is
            tok = torch.multinomial(torch.softmax(scaled, dim=-1), 1).squeeze(-1)
        else:
            in_place = work is not None and block.dtype == torch.float32
            scaled = (block.div_(temperature) if temperature != 1.0 else block) if in_place \
                else block.float() / temperature  # [n, V]
            top = scaled.amax(-1, keepdim=True)  # [n, 1]
            p = torch.sub(scaled, top, out=work[:len(block)] if in_place else None).exp_()  # [n, V] unnormalised
            lse = (top + p.sum(-1, keepdim=True).log()).squeeze(-1)  # [n] losses.logsumexp's arithmetic
            check_finite("sampling probabilities", lse)
            cdf = p.cumsum_(-1)
            target = u[i * rows:(i + 1) * rows].to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]
            tok = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
        toks.append(tok)
        logps.append(scaled.gather(-1, tok[:, None]).squeeze(-1) - lse)
    return torch.cat(toks), torch.cat(logps)


@contextmanager
def keyed_stream(*key: int):
    """Draws inside come from torch's global generator seeded from `key` (e.g. (seed, step, repeat, row));
    outside, the global stream (CPU and every CUDA device) is exactly as if nothing had been drawn."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(np.random.SeedSequence(list(key)).generate_state(1, np.uint64)[0] >> 1))
        yield
