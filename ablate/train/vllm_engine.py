"""Rollouts from vLLM (Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with
PagedAttention", arXiv:2309.06180) in the trainer's own process: `rollout.engine: vllm`.

Colocated, as veRL's hybrid engine and TRL's colocate mode: one engine in each training process, on its
device, holding its own copy of the weights. Per step (ablate/train/trainer.py):

    sample (training rollouts, held-out evaluation) -> sleep -> update -> wake -> sync_weights

- Same samples contract as the native sampler (`LMPolicy`): the prompts are tokenized by the policy
  (`LMPolicy.encode`, chat template and BOS as the task wrote them; a multi-turn episode's context is
  given as token ids and taken as it is) and sent as token ids; generation stops at the tokenizer's EOS, at
  a `stop` string (the text kept: the token that completes it is the row's last, as in the native
  sampler) or at `max_new_tokens` (`generation_config="vllm"`: the model folder's sampling defaults, e.g.
  an instruct model's top_p / top_k, are not applied; neither does ablate's sampler); masks, truncation
  flags and texts come from `LMPolicy.finish`, as the native sampler's.
- Behaviour log-probs: `logprobs_mode="processed_logprobs"`, the log-prob of each sampled token under the
  distribution it was drawn from, after temperature (vLLM's default, raw_logprobs, is before it).
- Randomness: one request per row, seeded from (run seed, step, round, purpose, global row)
  (`RowNoise.seeds`), so a rerun draws the same samples on the same machine, whatever the rank split.
  vLLM's kernels are not batch-invariant on CPU: which other rows share a forward can move a logit by
  rounding, and with it, rarely, a token (docs/scale.md).
- Weights: after each optimizer step every tensor of the trained module is pushed by name, in memory
  (`reload_weights` through the worker's RPC; LoRA merged: `models.engine_weights`), then the prefix
  cache, computed with the old weights, is reset.
- In process only (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): vLLM's separate engine process cannot receive
  tensors from the trainer. Its start-up changes process state the trainer relies on (`_process_state_kept`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from ablate.config import ConfigError, RunConfig
from ablate.rl.sampling import Rollout, RowNoise
from ablate.rl.schedules import longest_max_new_tokens
from ablate.rollout_config import VLLM_EXTRAS
from ablate.train.models import engine_weights
from ablate.train.rollout import LMPolicy, prompt_ids

CPU_KV_CACHE_GB = 1.0  # compute.vllm.kv_cache_gb: null on CPU (vLLM's own default reserves 90% of RAM)


def import_vllm():
    """vLLM, set up to run in this process; a ConfigError naming the extra when it is not installed."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: weights in memory
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its per-push warnings would drown the trainer's output
    try:
        import vllm
    except ImportError as err:
        raise ConfigError(f"rollout.engine='vllm' but vLLM cannot be imported ({err}): {VLLM_EXTRAS}") from None
    return vllm


def preflight_problems(cfg: RunConfig, task, tokenizer, folder: Path | None) -> list[str]:
    """The engine's part of the run's one preflight (ablate/train/preflight.py; the model's files, the task
    and its tokenizer already read and built there): vLLM imports, and the task's longest prompt plus the
    longest `recipe.max_new_tokens` fits the model's positions (vLLM refuses a longer request; the native
    sampler would run past what the model was trained on; a multi-turn episode's tokens after its prompt, the
    policy's and the environment's, stay within `recipe.max_new_tokens` too). What is wrong, naming the
    fields; the head size is `config.validate`'s (rollout_config.engine_problems). `folder`: the model folder
    (None: a hub id to download, checked when the engine starts)."""
    try:
        import_vllm()
    except ConfigError as err:
        return [str(err)]
    config = folder / "config.json" if folder is not None else None
    room = json.loads(config.read_text()).get("max_position_embeddings") if config and config.is_file() else None
    if not isinstance(room, int) or tokenizer is None:
        return []
    prompts = [task.prompt_text(p, tokenizer) for split in ("train", "heldout") for p in task.problems(split)]
    longest = max(len(prompt_ids(tokenizer, p)) for p in prompts)
    new = longest_max_new_tokens(cfg.recipe)
    if longest + new <= room:
        return []
    return [f"rollout.engine='vllm': the task's longest prompt ({longest} tokens) plus recipe.max_new_tokens={new} "
            f"exceeds model.path {cfg.model.path}'s max_position_embeddings={room} (vLLM's max_model_len); shorten "
            f"one of them, or rollout.engine='native'"]


SAMPLER = "vllm_row_seeds_gumbel_v1"  # provenance.json: per-row seeded requests, vLLM's Gumbel-max sampler


def provenance() -> dict:
    """What provenance.json records of the engine: its sampler and vLLM's version (part of what a rerun needs
    to draw the same samples)."""
    return {"sampler": SAMPLER, "vllm": import_vllm().__version__}


def engine_dtype(cfg: RunConfig, device: torch.device) -> str:
    """The engine computes in bf16 where the run asks for bf16 (model.dtype, or auto on CUDA, or bf16 master
    weights), else float32. On CPU the trainer itself stays float32 (autocast is CUDA-only): model.dtype
    bfloat16 there gives a bf16 engine against a float32 trainer, the mismatch TIS/MIS exist for."""
    m = cfg.model
    bf16 = m.master_weights == "bfloat16" or m.dtype == "bfloat16" or (m.dtype == "auto" and device.type == "cuda")
    return "bfloat16" if bf16 else "float32"


@contextlib.contextmanager
def _process_state_kept():
    """vLLM's in-process start-up seeds the global Python, NumPy and torch generators, replaces
    `torch.set_num_threads` with a no-op for the whole process (its CPU worker; `compute.threads` would
    silently stop working) and freezes the garbage collector's generations; all three are undone here. Its
    CPU sampler also draws from torch's global generator at every token, even for seeded requests: sampling
    runs inside this too, so the trainer's random stream is as if nothing had been drawn."""
    set_threads, py, npy = torch.set_num_threads, random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        torch.set_num_threads = set_threads
        random.setstate(py)
        np.random.set_state(npy)
        gc.unfreeze()


class VLLMEngine:
    """A RolloutEngine backed by a vLLM `LLM` with its own copy of the policy's weights."""

    def __init__(self, policy: LMPolicy, cfg: RunConfig):
        vllm = import_vllm()
        v, device = cfg.compute.vllm, policy.device
        self.policy, self.pad_id, self.device, self.tokenizer = policy, policy.pad_id, device, policy.tokenizer
        self.sleeps = v.sleep_mode and device.type == "cuda"  # vLLM's CPU worker has no sleep mode
        self.asleep = False
        # several ranks: the trainer's process group exists, and each rank's engine is its own (external
        # launcher: the device of LOCAL_RANK, no tensor parallelism); one process: vLLM makes a group of one
        self.owns_group = not torch.distributed.is_initialized()
        kv_gb = v.kv_cache_gb if v.kv_cache_gb is not None else None if device.type == "cuda" else CPU_KV_CACHE_GB
        with _process_state_kept():
            self.llm = vllm.LLM(
                model=cfg.model.path, dtype=engine_dtype(cfg, device), seed=cfg.seed,
                logprobs_mode="processed_logprobs", generation_config="vllm", enable_prefix_caching=True,
                enforce_eager=v.enforce_eager, max_num_seqs=v.max_num_seqs,
                gpu_memory_utilization=v.gpu_memory_utilization, enable_sleep_mode=self.sleeps,
                kv_cache_memory_bytes=None if kv_gb is None else int(kv_gb * 2**30), disable_log_stats=True,
                use_tqdm_on_load=False,
                **({} if self.owns_group else {"distributed_executor_backend": "external_launcher"}))
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.sync_weights(policy.module, 0)  # the policy's weights now: a resumed run's, LoRA merged

    @torch.no_grad()
    def sample(self, prompts: list[str] | list[list[int]], n: int, temperature: float, max_new_tokens: int,
               greedy: bool = False, noise: RowNoise | None = None, stop: list[str] | None = None) -> Rollout:
        """n completions per prompt, rows grouped by prompt, as `LMPolicy.sample` (texts or token-id lists;
        `stop` strings end a row like EOS, the completing token kept, not truncated). Row r's request is
        seeded by `noise` (its key and global row); without noise from torch's global generator (a greedy
        decode draws nothing)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids, mask = self.policy.encode(prompts)  # [U, P] left-padded: the native sampler's prompt tokens
        N = len(prompts) * n
        seeds = noise.seeds() if noise is not None else [None] * N if greedy else torch.randint(2**62, (N,)).tolist()
        longest = int(mask.sum(-1).max()) + max_new_tokens
        if longest > self.max_model_len:
            raise ConfigError(f"rollout.engine='vllm': a prompt of {longest - max_new_tokens} tokens plus "
                              f"recipe.max_new_tokens={max_new_tokens} exceeds the model's {self.max_model_len} "
                              f"positions (max_position_embeddings)")
        requests = [TokensPrompt(prompt_token_ids=ids[i][mask[i].bool()].tolist())
                    for i in range(len(prompts)) for _ in range(n)]
        # stop strings are matched on the detokenized text (vLLM's incremental detokenizer), so only then
        params = [SamplingParams(temperature=0.0 if greedy else temperature, max_tokens=max_new_tokens, seed=s,
                                 logprobs=None if greedy else 0, detokenize=bool(stop), stop=stop or None,
                                 include_stop_str_in_output=True) for s in seeds]
        with _process_state_kept():
            outs = [o.outputs[0] for o in self.llm.generate(requests, params, use_tqdm=False)]
        T = max(len(o.token_ids) for o in outs)
        completion = torch.full((N, T), self.pad_id, dtype=torch.long)  # [N, T] pad after the end
        behav = torch.zeros(N, T)  # [N, T] 0 after the end; a greedy decode's point mass: 0
        is_end = torch.zeros(N, T, dtype=torch.bool)  # [N, T] the EOS or stop-completing token of an ended row
        for row, o in enumerate(outs):
            k = len(o.token_ids)
            completion[row, :k] = torch.tensor(o.token_ids)
            is_end[row, k - 1] = o.finish_reason == "stop"  # EOS or a stop string; "length": truncated
            if not greedy:
                behav[row, :k] = torch.tensor([lp[t].logprob for lp, t in zip(o.logprobs, o.token_ids)])
        return self.policy.finish(ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0), completion.to(self.device),
                                  behav.to(self.device), is_end.to(self.device))

    def sync_weights(self, module: torch.nn.Module, version: int) -> None:
        """Push every weight of `module` (trained through update `version`) into the engine, by name, in
        memory; then drop the prefix cache, whose keys and values the old weights computed."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": engine_weights(module),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.version = version

    def sleep(self) -> None:
        """CUDA with compute.vllm.sleep_mode: free the KV cache and offload the weights for the update. CPU:
        nothing (vLLM's CPU worker has no sleep mode; its memory stays reserved)."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Shut the engine down. vLLM's teardown destroys torch.distributed's default group: with several
        ranks that group is the trainer's, and only vLLM's own groups go."""
        if getattr(self, "llm", None) is None:
            return
        from vllm.distributed import parallel_state as ps

        client, self.llm = self.llm.llm_engine.engine_core, None
        teardown = ps.destroy_distributed_environment

        def own_groups_only():
            if ps._WORLD:
                ps._WORLD.destroy()
            ps._WORLD = ps._NODE_COUNT = None

        ps.destroy_distributed_environment = teardown if self.owns_group else own_groups_only
        try:
            client.shutdown()
        finally:
            ps.destroy_distributed_environment = teardown
            gc.collect()
