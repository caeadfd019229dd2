"""The run config: one frozen, typed tree of dataclasses.

`parse(dict)` is strict (unknown keys and wrong types are errors that list what is allowed),
`validate(cfg)` holds every cross-field rule, and `run_id(cfg)` is a content hash of the resolved
config. Presets are plain bundles of `recipe.*` values applied before the user's own keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
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
TaskName = Literal["arithmetic", "reasoning_gym", "jsonl", "toy_addition"]
Device = Literal["auto", "cpu", "cuda"]


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
class RecipeConfig:
    """The RL recipe toggles; DESIGN.md section 3 defines each one."""

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
    temperature: float = 1.0
    max_new_tokens: int = 8
    update_epochs: int = 1
    minibatches: int = 1


@dataclass(frozen=True)
class OptimConfig:
    optimizer: Optimizer = "adamw"
    lr: float = 2e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # 0 = off
    warmup_steps: int = 0


@dataclass(frozen=True)
class EvalConfig:
    every: int = 25  # steps; 0 = only before training and at the end
    n_samples: int = 8
    ks: tuple[int, ...] = (1, 4, 8)
    temperature: float = 1.0
    num_samples_logged: int = 4  # sample completions stored per evaluation


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


@dataclass(frozen=True)
class RunConfig:
    preset: str | None = None
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
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
    # Hu 2025, REINFORCE++: batch-mean baseline, batch (global) std, KL in the reward.
    "reinforce_pp": dict(baseline="batch_mean", scale="batch", loss_agg="token_mean",
                         kl_coef=0.01, kl_estimator="k1", kl_placement="reward"),
    # Liu et al. 2025, Tricks or Traps? Part I (Lite PPO): group mean, batch std, token-level loss.
    "lite_ppo": dict(baseline="group_mean", scale="batch", loss_agg="token_mean", kl_coef=0.0),
}


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
        raise ConfigError(errors[0])
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
        if preset not in PRESETS:
            raise ConfigError(f"{_where(source, 'preset')}: unknown preset {preset!r}; allowed values: "
                              + ", ".join(PRESETS))
        data["recipe"] = {**PRESETS[preset], **(data.get("recipe") or {})}
    cfg = build_section(RunConfig, data, "", source)
    validate(cfg, source)
    return cfg


def parse_value(text: str) -> Any:
    """A `--set key=value` value, read as YAML so numbers, booleans, lists and null work."""
    return yaml.safe_load(text)


def load(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML config and apply `key=value` overrides (dotted keys)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected key=value")
        set_dotted(data, key.strip(), parse_value(value))
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
    check(r.temperature > 0, "recipe.temperature must be > 0")
    check(r.max_new_tokens >= 1, "recipe.max_new_tokens must be >= 1")
    check(r.overlong != "soft_penalty" or 0 < r.overlong_buffer < r.max_new_tokens,
          "recipe.overlong_buffer must be in (0, recipe.max_new_tokens) with recipe.overlong='soft_penalty'")
    check(r.overlong_factor >= 0, "recipe.overlong_factor must be >= 0")
    check(r.format_weight >= 0, "recipe.format_weight must be >= 0")
    check(r.format_anneal_steps >= 0, "recipe.format_anneal_steps must be >= 0 (0 = no annealing)")
    check(r.format_anneal_steps == 0 or r.format_weight > 0,
          "recipe.format_anneal_steps anneals recipe.format_weight, which is 0 (set a weight > 0)")
    check(r.update_epochs >= 1, "recipe.update_epochs must be >= 1")
    check(r.minibatches >= 1, "recipe.minibatches must be >= 1")
    check(cfg.prompts_per_step >= 1, "prompts_per_step must be >= 1")
    check(r.minibatches <= cfg.samples_per_step,
          "recipe.minibatches must be <= prompts_per_step * recipe.group_size")
    check(cfg.steps >= 1, "steps must be >= 1")
    check(cfg.checkpoint_every >= 0, "checkpoint_every must be >= 0")
    if cfg.model.lora is not None:
        lo = cfg.model.lora
        check(lo.r >= 1 and lo.alpha > 0 and 0 <= lo.dropout < 1 and len(lo.target_modules) >= 1,
              "model.lora needs r >= 1, alpha > 0, dropout in [0, 1) and at least one target module")
        check(t.name != "toy_addition", "model.lora needs a transformer model (not task.name='toy_addition')")
    check(cfg.compute.micro_batch_tokens >= 0, "compute.micro_batch_tokens must be >= 0 (0 = whole minibatch)")
    check(cfg.compute.threads >= 0, "compute.threads must be >= 0")
    check(o.lr > 0, "optim.lr must be > 0")
    check(o.grad_clip >= 0, "optim.grad_clip must be >= 0 (0 = off)")
    check(o.warmup_steps >= 0, "optim.warmup_steps must be >= 0")
    check(e.every >= 0, "eval.every must be >= 0")
    check(e.n_samples >= 1, "eval.n_samples must be >= 1")
    check(len(e.ks) >= 1 and all(1 <= k <= e.n_samples for k in e.ks),
          f"eval.ks must be non-empty with every k in [1, eval.n_samples={e.n_samples}]")
    check(e.temperature > 0, "eval.temperature must be > 0")
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
    if t.name == "toy_addition":
        check(r.max_new_tokens == 2, "task.name='toy_addition' needs recipe.max_new_tokens=2 (tens, ones)")
        check(r.kl_coef == 0, "task.name='toy_addition' has no reference policy: recipe.kl_coef must be 0")
        check(r.overlong == "none", "task.name='toy_addition' has fixed-length answers: recipe.overlong must be 'none'")
    if problems:
        head = f"{source}: invalid config" if source else "invalid config"
        raise ConfigError(head + ":\n  - " + "\n  - ".join(problems))


UNHASHED = ("tracking", "compute")  # sections that change no computed number (beyond float rounding)


def hash_config(data: dict) -> str:
    """The run id of a resolved config given as plain data (`to_dict`); tracking and compute (execution
    settings that change no result) are not hashed."""
    blob = json.dumps({k: v for k, v in data.items() if k not in UNHASHED}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def run_id(cfg: RunConfig) -> str:
    """Content hash of the fully resolved config (seed included, tracking and compute excluded)."""
    return hash_config(to_dict(cfg))
