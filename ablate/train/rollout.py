"""Rollouts: sample completions from a policy and score them again under a (possibly newer) policy.

A policy is anything with `sample(...) -> Rollout`, `features(rollout) -> [N, T, H]` (final hidden states
at the completion positions), `head(h) -> [..., V]` (logits), and `module` (the torch module that is
trained). `LMPolicy` wraps any Hugging Face causal LM; `ablate.tasks.toy.ToyPolicy` is
the tabular testbed. Completions of one prompt are contiguous: row i belongs to prompt i // G.

The sampling half is a `RolloutEngine`: it samples with behaviour log-probs and receives the trainer's
weights after every update. The policies themselves are engines (the HF KV-cache loop below, the toy
table): they sample with the trained module, so receiving weights costs nothing. `VLLMEngine`
(train/vllm_engine.py) holds its own copy of the weights, pushed after every update (docs/offpolicy.md).
"""

from __future__ import annotations

import inspect
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from ablate.rl.fused_head import logits_into
from ablate.rl.sampling import DRAW_ELEMENTS, Rollout, RowNoise, SamplesWithItself, draw


@runtime_checkable
class RolloutEngine(Protocol):
    """The seam between the trainer and whatever generates its rollouts."""

    pad_id: int

    def sample(self, prompts: list[str] | list[list[int]], n: int, temperature: float, max_new_tokens: int,
               greedy: bool = False, noise: RowNoise | None = None, stop: list[str] | None = None) -> Rollout:
        """n completions per prompt, rows grouped by prompt, with `Rollout.behav_logp`: the log-prob of each
        sampled token under the distribution it was sampled from (after temperature; 0 where masked).
        `noise`: these rows' randomness, keyed by global row (rl/sampling.py): their uniforms, one per position
        (inverse-CDF sampling), or one seed per row for an engine with its own sampler (`RowNoise.seeds`).
        A prompt is a text or a list of token ids (taken as they are: a multi-turn episode continues from its
        exact tokens, ablate/train/episodes.py). `stop`: strings that end a completion like EOS does, the
        token that completes one included (vLLM's `stop` with the stop text kept); not truncated."""

    def sync_weights(self, module: torch.nn.Module, version: int) -> None:
        """Receive the trained weights after update `version` (the number of optimiser steps so far)."""

    def sleep(self) -> None:
        """Before the update: release what sampling holds (a GPU engine's KV cache) until `wake`."""

    def wake(self) -> None:
        """After the update, before `sync_weights`."""

    def close(self) -> None:
        """At the end of the run."""


class LMPolicy(SamplesWithItself):
    """A Hugging Face causal LM with its tokenizer, sampled with a bare KV-cache loop.

    We sample with our own loop rather than `generate()`: on a tiny model the per-token logits
    processors and stopping checks of `generate()` cost more than the model's forward itself.
    """

    def __init__(self, model, tokenizer, device: torch.device, autocast_dtype=None, fp32_logits: bool = True,
                 compact: bool = True):
        self.module = model
        self.tokenizer = tokenizer
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.fp32_logits = fp32_logits
        self.compact = compact  # drop finished rows from the sampling forward (same tokens either way)
        # HF gradient checkpointing drops the KV cache under grad: `features` then runs one plain forward
        self.checkpointing = any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
        self.pad_id = tokenizer.pad_token_id
        self.eos_id = tokenizer.eos_token_id
        self.lora = hasattr(model, "peft_config")  # peft LoRA: the reference is this model, adapters off
        self.base = model.get_base_model() if self.lora else model  # the HF model (adapters inside)
        # transformers 5.x renamed the KV-cache argument `past_key_values` -> `cache`
        self.cache_arg = "cache" if "cache" in inspect.signature(self.base.forward).parameters else "past_key_values"

    def _autocast(self):
        enabled = self.autocast_dtype is not None
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=enabled)

    def encode(self, prompts: list[str] | list[list[int]]) -> tuple[Tensor, Tensor]:
        """Left-padded ids and attention mask [B, P] of texts (`prompt_ids`) or of token-id lists as given."""
        rows = [prompt_ids(self.tokenizer, p) if isinstance(p, str) else list(p) for p in prompts]
        width = max(map(len, rows))
        ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
        return ids.to(self.device), mask.to(self.device)

    @torch.no_grad()
    def sample(self, prompts: list[str] | list[list[int]], n: int, temperature: float, max_new_tokens: int,
               greedy: bool = False, noise: RowNoise | None = None, stop: list[str] | None = None) -> Rollout:
        """n completions per prompt (rows grouped by prompt), with the behaviour log-prob of every sampled
        token (`Rollout.behav_logp`). Each prompt is prefilled once and its KV cache repeated n times: the
        n rows of a group share it exactly (causal attention). With `noise` each token is drawn by inverse
        CDF from its row's uniform of that position (the same token at any batch split).

        Compaction: once a row has sampled EOS it leaves the forward (its KV-cache rows are selected away),
        so a batch with early EOS pays for its live rows only. `alive` holds the original row ids of the
        rows still forwarded, and only they draw: with `noise` a row's token depends on its own uniforms
        alone, so the tokens are those of the uncompacted loop. Without noise (torch.multinomial on the
        global stream) every row draws at every position, so nothing is compacted. The logits live in one
        [N, V] buffer written in place at every position (`_head_into`), rows in `alive` order."""
        from transformers import DynamicCache  # here: toy runs never load transformers

        uids, umask = self.encode(prompts)
        ids, mask = uids.repeat_interleave(n, 0), umask.repeat_interleave(n, 0)
        N = ids.shape[0]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        done = torch.zeros(N, dtype=torch.bool, device=self.device)
        # multinomial on the global stream (no noise): every row draws at every position, in order
        compact = self.compact and (noise is not None or greedy)
        decoder, cache = self.base.get_decoder(), DynamicCache(config=self.base.config)
        vocab = self.base.get_output_embeddings().weight.shape[0]
        logits = torch.empty(N, vocab, dtype=torch.promote_types(self.base.dtype, torch.float32), device=self.device)
        work = torch.empty(min(N, max(1, DRAW_ELEMENTS // vocab)), vocab, device=self.device)  # draw's scratch
        tokens, logps, ends = [], [], []
        stopped = stopper(self.tokenizer, stop)
        with self._autocast():
            out = decoder(input_ids=uids, attention_mask=umask, position_ids=positions[::n], use_cache=True,
                          **{self.cache_arg: cache})
            cache.batch_repeat_interleave(n)
            first = self._head_into(torch.empty_like(logits[:len(prompts)]), out.last_hidden_state[:, -1])  # [U, V]
            torch.index_select(first, 0, torch.arange(len(prompts), device=self.device).repeat_interleave(n),
                               out=logits)  # every row, in original order
            alive = torch.arange(N, device=self.device)  # [A] original ids of the rows forwarded
            next_pos = positions[:, -1:] + 1  # [A, 1]
            attn = mask  # [A, P + t]
            for t in range(max_new_tokens):
                u = None if noise is None else noise.next().to(self.device)[alive]
                tok_a, logp_a = draw(logits[:len(alive)], temperature, greedy, u, work)  # rows of `alive`
                tok = torch.full((N,), self.pad_id, device=self.device).index_copy_(0, alive, tok_a)
                tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
                tokens.append(tok)
                logp = torch.zeros(N, device=self.device).index_copy_(0, alive, logp_a)
                logps.append(torch.where(done, torch.zeros_like(logp), logp))  # 0 after EOS (masked)
                end = ~done & ((tok == self.eos_id) | stopped(tokens, done))  # [N] this token ends its row
                ends.append(end)
                done |= end
                if done.all() or t == max_new_tokens - 1:
                    break
                if compact and done[alive].any():
                    keep = (~done[alive]).nonzero().squeeze(-1)  # positions within the forwarded rows
                    cache.batch_select_indices(keep)
                    alive, attn, next_pos = alive[keep], attn[keep], next_pos[keep]
                attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
                hidden = decoder(input_ids=tok[alive, None], attention_mask=attn, position_ids=next_pos,
                                 use_cache=True, **{self.cache_arg: cache}).last_hidden_state[:, -1]  # [A, H]
                self._head_into(logits, hidden)
                next_pos = next_pos + 1
        return self.finish(ids, mask, torch.stack(tokens, dim=1), torch.stack(logps, dim=1), torch.stack(ends, dim=1))

    def finish(self, ids: Tensor, mask: Tensor, completion: Tensor, behav_logp: Tensor, is_end: Tensor) -> Rollout:
        """The Rollout of sampled rows: prompts [N, P] (left-padded), their completions [N, T] (pad after the
        end), the behaviour log-probs [N, T] (0 after the end) and `is_end` [N, T]: the EOS or stop-completing
        token that ended each ended row. Every engine's samples end here, so masks, truncation flags and
        texts are made one way."""
        # 1 up to and including the row's end: no end strictly before this position
        completion_mask = (is_end.long().cumsum(-1) - is_end.long() == 0).float()
        texts = self.tokenizer.batch_decode(completion.masked_fill(completion == self.eos_id, self.pad_id),
                                            skip_special_tokens=True)
        return Rollout(ids, mask, completion, completion_mask, ~is_end.any(-1), texts, behav_logp=behav_logp)

    def _head_into(self, out: Tensor, hidden: Tensor) -> Tensor:
        """The lm-head's logits of `hidden` [A, H] written into out[:A] (a buffer reused at every position,
        so sampling allocates no [rows, V] tensor per token); returns that view."""
        linear = self.linear_head()
        if linear is None:
            return out[:len(hidden)].copy_(self.head(hidden))
        weight, bias, dtype = linear
        return logits_into(out, hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype), 1.0)

    def logits(self, rollout: Rollout) -> Tensor:
        """Next-token logits at each completion position, [N, T, V] (with grad); tests and small vocabularies
        only: the trainer applies `head` chunk by chunk to `features` instead."""
        return self.head(self.features(rollout))

    def head(self, hidden: Tensor) -> Tensor:
        """The lm-head on final hidden states [..., H] -> logits [..., V], float32 or wider. Under bf16 autocast with
        `fp32_logits` the matmul itself runs in fp32 (ScaleRL, Khatri et al. 2025, arXiv:2510.13786)."""
        lm_head = self.base.get_output_embeddings()
        if self.autocast_dtype is not None and self.fp32_logits:
            with torch.autocast(self.device.type, enabled=False):
                bias = None if lm_head.bias is None else lm_head.bias.float()
                return torch.nn.functional.linear(hidden.float(), lm_head.weight.float(), bias)
        with self._autocast():
            logits = lm_head(hidden)
        return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits  # fp64 stays fp64

    def linear_head(self) -> tuple[Tensor, Tensor | None, torch.dtype] | None:
        """(weight [V, H], bias [V] or None, matmul dtype) when the lm-head is a plain linear layer (the fused
        log-prob path, rl/fused_head.py; a LoRA-adapted head is not), else None. The dtype follows `head`:
        fp32 (fp64 for a float64 model), or the autocast dtype without `fp32_logits`."""
        lm_head = self.base.get_output_embeddings()
        if type(lm_head) is not torch.nn.Linear:
            return None
        if lm_head.weight.dtype == torch.float64:
            dtype = torch.float64
        elif self.autocast_dtype is not None and not self.fp32_logits:
            dtype = self.autocast_dtype
        else:
            dtype = torch.float32
        return lm_head.weight, lm_head.bias, dtype

    def features(self, rollout: Rollout) -> Tensor:
        """Final hidden states at each completion position, [N, T, H] (with grad): position t holds the
        state that predicts completion token t.

        Each distinct prompt runs once (with grad); every row's completion attends to its prompt's KV,
        gathered per row, so the G rows' gradients sum into the shared prompt activations. Same values as
        one forward over prompt+completion: under causal attention a prompt never sees its completions.
        With gradient checkpointing (which cannot keep a KV cache) it is that one plain forward.
        """
        decoder = self.base.get_decoder()
        P = rollout.prompt_ids.shape[1]
        mask = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.completion_ids)], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        if self.checkpointing and torch.is_grad_enabled():
            with self._autocast():
                ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
                out = decoder(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1])
            return out.last_hidden_state[:, P - 1:]
        uniq, inv = torch.unique(rollout.prompt_ids, dim=0, return_inverse=True)
        first = torch.empty(len(uniq), dtype=torch.long, device=inv.device).scatter_(
            0, inv, torch.arange(len(inv), device=inv.device))  # one row holding each distinct prompt
        from transformers import DynamicCache  # here: toy runs never load transformers

        cache = DynamicCache(config=self.base.config)
        with self._autocast():
            head = decoder(input_ids=uniq, attention_mask=rollout.prompt_mask[first],
                           position_ids=positions[first, :P], use_cache=True, **{self.cache_arg: cache})
            last = head.last_hidden_state[:, -1:][inv]  # [N, 1, H]
            if rollout.completion_ids.shape[1] == 1:
                return last
            cache.batch_select_indices(inv)  # [U, ...] -> [N, ...], a differentiable gather
            tail = decoder(input_ids=rollout.completion_ids[:, :-1], attention_mask=mask[:, :-1],
                           position_ids=positions[:, P:-1], use_cache=True, **{self.cache_arg: cache})
        return torch.cat([last, tail.last_hidden_state], dim=1)


def prompt_ids(tokenizer, text: str) -> list[int]:
    """A prompt's token ids: a chat template already wrote BOS into the text; a plain prompt gets the
    tokenizer's specials (BOS)."""
    bos = tokenizer.bos_token
    return tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]


def stopper(tokenizer, stop: list[str] | None):
    """fn(tokens so far: a list of [N] tensors, done [N]) -> [N] bool: the rows whose decoded text gained a
    stop string with the last token (each at least one character, so the last len(longest stop) tokens of a
    row hold any stop string it just completed). No stop strings: always False."""
    if not stop:
        return lambda tokens, done: torch.zeros_like(done)
    k = max(map(len, stop))

    def stopped(tokens: list[Tensor], done: Tensor) -> Tensor:
        tail = torch.stack(tokens[-k:], dim=1)  # [N, <=k]
        rows = (~done).nonzero().flatten().tolist()
        texts = tokenizer.batch_decode(tail[rows].tolist(), skip_special_tokens=True) if rows else []
        hit = torch.zeros_like(done)
        for r, text in zip(rows, texts):
            hit[r] = any(s in text for s in stop)
        return hit
    return stopped


class AdaptersOff:
    """The LoRA policy's base model as a frozen policy (the KL reference): the same module, adapters
    disabled while it scores; no second copy of the weights."""

    def __init__(self, policy: LMPolicy):
        self.policy = policy

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def features(self, rollout: Rollout) -> Tensor:
        with self.policy.module.disable_adapter():
            return self.policy.features(rollout)

    def head(self, hidden: Tensor) -> Tensor:
        with self.policy.module.disable_adapter():
            return self.policy.head(hidden)
