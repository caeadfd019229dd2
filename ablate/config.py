"""The run config: one frozen, typed tree of dataclasses.

`parse(dict)` is strict (unknown keys and wrong types are errors that list what is allowed),
`validate(cfg)` holds every cross-field rule, and `run_id(cfg)` is a content hash of the resolved
config. Presets are plain bundles of `recipe.*` values applied before the user's own keys
(ablate/presets.py, the table; imported here and re-exported).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from ablate.presets import PRESETS  # the recipe presets table (config.PRESETS, as before)
from ablate.resources import environment_problem, resource_problems, rg_config_problems  # noqa: F401 - C.*
from ablate.rollout_config import RolloutConfig, VLLMConfig, engine_problems  # the engine's sections and checks
from ablate.schema import (  # noqa: F401 - ConfigError, StrictLoader, read_yaml, coerce: used as C.* elsewhere
    Choice,
    ConfigError,
    Count,
    Finite,
    Fraction,
    Integer,
    Length,
    Natural,
    NonEmptyLine,
    NonNegative,
    Positive,
    Range,
    Seed,
    StrictLoader,
    Text,
    _where,
    build_section,
    coerce,
    hints,
    plain,
    read_yaml,
)
from ablate.schema import (
    problems as domain_problems,
)

Baseline = Literal["none", "batch_mean", "group_mean", "leave_one_out", "greedy"]
Scale = Literal["none", "group", "batch"]
LossAgg = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
RatioLevel = Literal["token", "sequence"]
KLEstimator = Literal["k1", "k2", "k3"]
KLPlacement = Literal["loss", "reward"]
Overlong = Literal["none", "mask", "soft_penalty"]
Optimizer = Literal["adamw", "sgd", "normalized_sgd"]
TaskName = Literal["arithmetic", "reasoning_gym", "jsonl", "toy_addition", "code", "mixture", "env"]
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


OptionalText = Annotated[str, Text(pattern=r"|.*\S.*", what="empty for none, else not blank")]
Share = Annotated[float, Range(0, 1, lo_open=True)]   # a share of something that must not be empty: (0, 1]
AboveOne = Annotated[float, Range(1, lo_open=True)]   # a ratio cap
# W&B's rule for entity and project names (wandb_settings.validate_project)
WandbName = Annotated[str, Text(min_len=1, max_len=128, pattern=r"[^/\\#?%:]+", what="without / \\ # ? % :")]


@dataclass(frozen=True)
class EpisodeConfig:
    """Multi-turn episodes (`task.name: env`, docs/environments.md). The episode's total token budget (policy and
    environment tokens after the prompt) is `recipe.max_new_tokens`."""

    max_turns: Count = 3           # policy turns; an episode still running after the last one is truncated
    turn_tokens: Count = 16        # policy tokens per turn at most
    stop: tuple[NonEmptyLine, ...] = ()   # strings that end a turn (a tool call's closing tag); () = the environment's own
    env_timeout_s: Positive = 10.0  # seconds an environment call may take before the episode ends as an env error
    tool_error_penalty: NonNegative = 0.0  # the built-in environments' reward for a failed tool call is minus this


@dataclass(frozen=True)
class TaskConfig:
    name: TaskName = "arithmetic"
    seed: Seed = 0  # seeds the problem sets, not the run: every run of a sweep sees the same data
    num_train: Count = 2000
    num_heldout: Count = 128
    # arithmetic: operand digit counts and operators to mix (difficulty spread comes from the mix)
    digits: tuple[Annotated[int, Integer(1, 6)], ...] = (1, 2)
    operators: tuple[Literal["+", "-", "*"], ...] = ("+", "-", "*")
    # training verifier that accepts any answer with the right last digit (held-out stays strict)
    gameable: bool = False
    # reasoning_gym: dataset name as in `reasoning_gym.create_dataset(name)`
    dataset: OptionalText = ""
    # jsonl: rows {"prompt", "answer"}; heldout_path optional (else a seeded split of path)
    path: OptionalText = ""
    heldout_path: OptionalText = ""
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
    code_workers: Annotated[int, Integer(1, 64)] = 4  # parallel sandbox slots
    # reasoning_gym: the dataset's own configuration (difficulty parameters), passed to create_dataset
    rg_config: dict[str, Any] = field(default_factory=dict, hash=False)
    # mixture: entries are task sections plus a weight (share of task.num_train); see ablate/tasks/mixture.py
    mixture: tuple[MixtureEntry, ...] = ()
    # keep training prompts whose base-model pass rate is in [lo, hi] (`ablate difficulty` fills the cache)
    pass_rate_band: tuple[Fraction, ...] = ()
    # env: the environment (`calculator`, `code`, a skyrl-gym id or `module:Class`) and its episodes
    environment: OptionalText = ""
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)


@dataclass(frozen=True)
class MixtureEntry(TaskConfig):
    weight: Positive = 1.0


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (Hu et al. 2021, LoRA, arXiv:2106.09685) through peft; the base weights stay frozen."""

    r: Count = 16
    alpha: Positive = 32.0
    dropout: Annotated[float, Range(0, 1, hi_open=True)] = 0.0
    target_modules: Annotated[tuple[NonEmptyLine, ...], Length(min=1)] = (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelConfig:
    path: NonEmptyLine = "models/tiny-arith"  # local folder or hub id, loaded with AutoModelForCausalLM
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    # float32: fp32 master weights (bf16 autocast per `dtype`); bfloat16: weights and optimizer state in bf16
    master_weights: Literal["float32", "bfloat16"] = "float32"
    lora: LoraConfig | None = None  # null = full fine-tuning; the KL reference is the model with adapters off


@dataclass(frozen=True)
class Stage:
    step: Count    # first step of the stage
    value: Finite


@dataclass(frozen=True)
class Schedule:
    """A per-step value (ablate/rl/schedules.py): `constant` (value), `linear` (start at step 1 to end at
    step `steps`, then held) or `stages` (each stage's value from its step on; the first starts at 1)."""

    kind: Literal["constant", "linear", "stages"] = "constant"
    value: Finite = 0.0
    start: Finite = 0.0
    end: Finite = 0.0
    steps: Natural = 0
    stages: tuple[Stage, ...] = ()


def schedule_values(s: float | Schedule) -> list[float]:
    """The values a plain number or schedule takes (a linear one's extremes are its ends)."""
    if not isinstance(s, Schedule):
        return [s]
    return {"constant": [s.value], "linear": [s.start, s.end], "stages": [st.value for st in s.stages]}[s.kind]


@dataclass(frozen=True)
class RecipeConfig:
    """The RL recipe toggles; docs/recipes.md defines each one."""

    group_size: Count = 8
    baseline: Baseline = "group_mean"
    scale: Scale = "group"
    std_ddof: Literal[0, 1] = 1
    std_eps: Positive = 1e-6
    loss_agg: LossAgg = "seq_mean_token_mean"
    eps_low: Annotated[float, Range(0, 1, hi_open=True)] = 0.2
    eps_high: NonNegative = 0.2
    dual_clip: AboveOne | None = None
    ratio_level: RatioLevel = "token"
    kl_coef: NonNegative = 0.0
    kl_estimator: KLEstimator = "k3"
    kl_placement: KLPlacement = "loss"
    entropy_coef: NonNegative = 0.0
    dynamic_sampling: bool = False
    max_gen_rounds: Count = 3
    overlong: Overlong = "none"
    overlong_buffer: Count = 4
    overlong_factor: NonNegative = 1.0
    format_weight: NonNegative = 0.0
    format_anneal_steps: Natural = 0  # 0 = constant; N = format_weight falls linearly to 0 at step N
    temperature: Positive | Schedule = 1.0    # a number, or a step schedule (Schedule)
    max_new_tokens: Count | Schedule = 8
    update_epochs: Count = 1
    minibatches: Count = 1
    # off-policy (docs/offpolicy.md): the update at step s trains on the batch sampled by the policy of step
    # s - k (0 = synchronous); the behaviour -> old shift is corrected by `is_correction` (ablate/rl/corrections.py)
    staleness: Natural = 0
    is_correction: ISCorrection = "none"
    is_cap: Positive = 2.0           # C: tis, seq_tis (truncate at C); mis, seq_mis (reject above C)
    is_lo: NonNegative | None = None    # lower bound: icepop, seq_geo_mask (required); mis, seq_mis (optional)
    is_hi: Positive | None = None    # upper bound: icepop, seq_geo_mask (required)
    # policy-loss registry (ablate.rl.losses.POLICY_LOSSES) and each entry's own parameters
    policy_loss: PolicyLoss = "ppo_clip"
    cispo_cap: Positive = 5.0        # cispo: absolute cap on the stop-gradient IS weight, no floor
    gmpo_eps: Positive = 0.4         # gmpo: clip range in log space, (-eps, +eps)
    tau_pos: Positive = 1.0          # sapo: gate temperature for A > 0
    tau_neg: Positive = 1.05         # sapo: gate temperature for A <= 0
    clip_cov_ratio: Fraction = 2e-4  # clip_cov: share of tokens whose loss is zeroed
    clip_cov_lb: Finite = 1.0      # clip_cov: covariance band (lb, ub) of the candidates
    clip_cov_ub: Finite = 5.0
    kl_cov_frac: Fraction = 2e-3     # kl_cov: share of tokens (largest covariance) given the |log ratio| penalty
    kl_cov_coef: NonNegative = 1.0      # kl_cov: coefficient of that penalty
    delta: AboveOne = 4.0         # delta (INTELLECT-2): ratio cap for A < 0; needs delta >= 1 + eps_high
    # token and sample weighting
    token_selection: TokenSelection = "all"
    entropy_quantile: Share = 0.2  # top_entropy: share of highest-entropy tokens that keep their loss
    pos_adv_weight: NonNegative = 1.0    # multiplies positive advantages
    neg_adv_weight: NonNegative = 1.0    # multiplies negative advantages
    pos_nll_coef: NonNegative = 0.0      # coefficient of an SFT (NLL) term on positive-advantage samples; 0 = off
    adv_clip: Positive | None = None  # clip advantages to [-adv_clip, adv_clip]; null = off
    # REINFORCE++ (Hu 2025): token = whiten the advantages over all counted tokens of the batch
    # (REINFORCE++-baseline's global normalisation); token_returns = per-token KL rewards, reward-to-go
    # returns, then that whitening (REINFORCE++ itself). Token-level advantages [N,T].
    adv_whiten: AdvWhiten = "none"
    # regularisation dynamics: hard reference reset every N steps (ProRL; 0 = never) and an adaptive
    # KL coefficient steered to a per-token KL target (Ziegler et al. 2019, horizon form; null = fixed)
    ref_reset_every: Natural = 0
    kl_target: Positive | None = None
    kl_horizon: Count = 10000
    # online data policy (ablate/rl/data_policy.py): which prompts a step samples
    data_policy: DataPolicy = "uniform"
    retire_threshold: Share = 0.9     # no_positive_resampling: latest group pass rate that retires a prompt
    priority_smoothing: Positive = 0.1   # prioritized: p(i) ~ 1 - s_i + smoothing
    curriculum_start: Share = 0.25    # curriculum: share of the pool (easiest first) eligible at the start
    # PPO with a learned critic (adv_whiten='gae', ablate/train/critic.py): GAE(gamma, lambda) over token
    # rewards (outcome reward at the end, per-token KL when kl_placement='reward'), whitened; the value
    # model (a copy of the policy with a scalar head; a table on the toy) trains on its own AdamW
    gae_gamma: Fraction = 1.0
    gae_lambda: Fraction = 0.95
    value_clip: Positive | None = 0.2   # |V - V_old| clip of the value loss (null = unclipped)
    vf_coef: Positive = 0.1             # coefficient of the value loss
    critic_lr: Positive | None = None   # the value model's learning rate (null = optim.lr)
    # multi-turn episodes (docs/environments.md): environment tokens in the loss or not, and outcome (one
    # advantage per episode) or turn-level credit (returns from each turn on, ablate/rl/turns.py)
    mask_env_tokens: bool = True
    credit: Literal["episode", "turn"] = "episode"


@dataclass(frozen=True)
class OptimConfig:
    optimizer: Optimizer = "adamw"
    lr: Positive = 2e-4
    weight_decay: NonNegative = 0.0
    grad_clip: NonNegative = 1.0  # 0 = off
    warmup_steps: Natural = 0
    # normalized_sgd: no step when the global gradient norm is <= this (0 = always step). A batch whose
    # advantages are zero up to rounding would otherwise step along the rounding noise.
    min_grad_norm: NonNegative = 0.0


@dataclass(frozen=True)
class EvalConfig:
    every: Natural = 25  # steps; 0 = only before training and at the end
    n_samples: Count = 8
    ks: Annotated[tuple[Count, ...], Length(min=1)] = (1, 4, 8)
    temperature: Positive = 1.0
    num_samples_logged: Natural = 4  # sample completions stored per evaluation
    repeats: Count = 1  # held-out evaluations per schedule point, each with its own sampling seed (eval noise)


@dataclass(frozen=True)
class WandbConfig:
    # auto: online when W&B credentials are configured (WANDB_API_KEY or a netrc entry), else offline
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"
    entity: WandbName | None = None
    project: WandbName = "ablate"
    name: NonEmptyLine | None = None  # readable run name; sweeps set it from the varying toggles and seed
    group: Annotated[str, Text(min_len=1, max_len=128)] | None = None  # set by sweeps to the sweep name
    job_type: Annotated[str, Text(min_len=1, max_len=64)] = "train"  # "tune-trial" for Optuna trials


@dataclass(frozen=True)
class TrackingConfig:
    """Where a run is mirrored; not part of the run id (it changes no computed number)."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    # seconds W&B may take to start (wandb.init's init_timeout; env WANDB_INIT_TIMEOUT wins): an unreachable
    # server then costs this long, once, and the run goes on with the local store (and offline W&B under auto)
    timeout_s: Positive = 10.0


@dataclass(frozen=True)
class ComputeConfig:
    """How a step is executed: settings that must not change results (beyond float rounding), so, like
    `tracking`, they are not part of the run id. docs/scale.md says which knob to turn when."""

    # rows are packed in order into micro-batches of at most this many prompt+completion tokens
    # (padded width x rows), gradients accumulate over them; 0 = the whole minibatch in one pass
    micro_batch_tokens: Natural = 0
    gradient_checkpointing: bool = False  # recompute decoder activations in backward (HF)
    deterministic: bool = False  # deterministic kernels + fixed threads: bitwise-identical reruns, slower
    fp32_logits: bool = True  # under bf16 autocast (CUDA) the lm-head and log-softmax run in fp32
    threads: Natural = 0  # torch intra-op threads; 0 = torch's default (1 when deterministic)
    # how the ranks of a multi-process run (`ablate train --nproc N`, SLURM tasks) share the update: "ddp"
    # replicates the model and sums gradients; "fsdp" shards weights, gradients and optimizer state (FSDP2)
    parallel: Parallel = "ddp"
    collective_timeout_s: Count = 1800  # a collective that waits longer fails the run (a rank died or hangs)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)  # rollout.engine: vllm only


@dataclass(frozen=True)
class RunConfig:
    preset: Annotated[str, Choice(tuple(PRESETS))] | None = None
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    prompts_per_step: Count = 16
    steps: Count = 200
    seed: Seed = 0
    device: Device = "auto"
    checkpoint_every: Natural = 50  # steps; 0 = only at the end
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.recipe.group_size


# --- strict parsing (ablate/schema.py: coerce, domains) ---------------------------------------------

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


def with_preset(data: dict, source: str | None = None) -> dict:
    """`data` (plain config data) with its preset's recipe values filled in under every recipe key `data` writes
    itself: a preset is a set of defaults, never above a key the user wrote. The one place presets are merged
    (`ablate train`, sweeps and tune; a sweep's most specific preset is the one its run names: the arm's, else
    `base.preset`, else the base config file's)."""
    preset = data.get("preset")
    if preset is None:
        return data
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError(f"{_where(source, 'preset')}: unknown preset {preset!r}; allowed values: "
                          + ", ".join(PRESETS))
    return {**data, "recipe": {**PRESETS[preset], **(data.get("recipe") or {})}}


def parse(data: dict, source: str | None = None) -> RunConfig:
    """Build a validated RunConfig from plain data (its preset merged by `with_preset`)."""
    data = json.loads(json.dumps(data))  # deep copy, and rejects non-plain values early
    cfg = build_section(RunConfig, with_preset(data, source), "", source)
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
        tp = plain(hints(tp)[part])
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
    """Every field's domain (its annotation), then every cross-field rule, in one place (the rules may assume
    the domains hold). Raises ConfigError naming the file and the field(s)."""
    head = f"{source}: invalid config" if source else "invalid config"
    problems = domain_problems(cfg)
    if problems:
        raise ConfigError(head + ":\n  - " + "\n  - ".join(problems))
    r, o, e, t = cfg.recipe, cfg.optim, cfg.eval, cfg.task

    def check(ok: bool, msg: str) -> None:
        if not ok:
            problems.append(msg)

    check(r.group_size >= 2 or r.baseline not in ("group_mean", "leave_one_out"),
          f"recipe.baseline={r.baseline!r} needs recipe.group_size >= 2")
    check(r.group_size >= 2 or r.scale != "group", "recipe.scale='group' needs recipe.group_size >= 2")
    check(r.group_size >= 2 or not r.dynamic_sampling, "recipe.dynamic_sampling needs recipe.group_size >= 2")
    check(r.eps_high >= r.eps_low, "recipe.eps_high must be >= recipe.eps_low")
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
    check(r.format_anneal_steps == 0 or r.format_weight > 0,
          "recipe.format_anneal_steps anneals recipe.format_weight, which is 0 (set a weight > 0)")
    check(r.staleness < cfg.steps, "recipe.staleness must be < steps (the pipeline is k batches deep)")
    band = r.is_correction in ("icepop", "seq_geo_mask")
    check(not band or (r.is_lo is not None and r.is_hi is not None),
          f"recipe.is_correction={r.is_correction!r} needs both recipe.is_lo and recipe.is_hi (no default band)")
    check(r.is_lo is None or r.is_hi is None or r.is_lo <= r.is_hi, "recipe.is_lo must be <= recipe.is_hi")
    check(r.is_lo is None or r.is_correction not in ("mis", "seq_mis") or r.is_lo <= r.is_cap,
          f"recipe.is_lo must be <= recipe.is_cap with recipe.is_correction={r.is_correction!r}")
    check(r.data_policy != "zero_variance_filter" or not r.dynamic_sampling,
          "recipe.data_policy='zero_variance_filter' drops dead groups without resampling; "
          "recipe.dynamic_sampling resamples them: choose one")
    check(r.data_policy != "zero_variance_filter" or r.group_size >= 2,
          "recipe.data_policy='zero_variance_filter' needs recipe.group_size >= 2")
    check(r.minibatches <= cfg.samples_per_step,
          "recipe.minibatches must be <= prompts_per_step * recipe.group_size")
    if cfg.model.lora is not None:
        check(t.name != "toy_addition", "model.lora needs a transformer model (not task.name='toy_addition')")
    if cfg.compute.parallel == "fsdp":  # FSDP2 shards a transformer's decoder layers (ablate/train/sharding.py)
        for ok, what in [(t.name != "toy_addition", "task.name='toy_addition' (a tabular policy)"),
                         (cfg.model.lora is None, "model.lora (adapters)"),
                         (r.adv_whiten != "gae", "recipe.adv_whiten='gae' (a critic)"),
                         (r.ref_reset_every == 0, "recipe.ref_reset_every > 0 (reference resets)")]:
            check(ok, f"compute.parallel='fsdp' does not support {what}; allowed values: 'ddp' (every rank "
                  "holds the whole model), or 'fsdp' for full fine-tuning of a transformer")
    check(o.min_grad_norm == 0 or o.optimizer == "normalized_sgd",
          "optim.min_grad_norm is only defined for optim.optimizer='normalized_sgd'")
    check(all(k <= e.n_samples for k in e.ks), f"eval.ks: every k must be <= eval.n_samples={e.n_samples}")
    check(t.name != "arithmetic" or bool(t.digits), "task.digits: task.name='arithmetic' needs a digit count")
    check(t.name != "arithmetic" or bool(t.operators), "task.operators: task.name='arithmetic' needs an operator")
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
    check(r.clip_cov_lb < r.clip_cov_ub, "recipe.clip_cov_lb must be < recipe.clip_cov_ub")
    check(r.policy_loss != "delta" or r.delta >= 1 + r.eps_high,
          f"recipe.delta must be >= 1 + recipe.eps_high = {1 + r.eps_high} with recipe.policy_loss='delta'")
    check(r.policy_loss != "raft" or (r.baseline == "none" and r.scale == "none"),
          "recipe.policy_loss='raft' trains on rewarded samples: needs recipe.baseline='none' and recipe.scale='none'")
    check(r.policy_loss != "raft" or r.kl_coef == 0 or r.kl_placement == "loss",
          "recipe.policy_loss='raft': a KL penalty in the reward would change which samples count as rewarded")
    check(r.token_selection == "all" or r.policy_loss != "gmpo",
          "recipe.token_selection='top_entropy' needs a token-level loss; recipe.policy_loss='gmpo' is sequence-level")
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
    check(r.adv_whiten == "none" or r.policy_loss != "gmpo",
          "recipe.adv_whiten gives token-level advantages; recipe.policy_loss='gmpo' needs one per completion")
    check(r.ref_reset_every == 0 or r.kl_coef > 0,
          "recipe.ref_reset_every resets the KL reference, which exists only with recipe.kl_coef > 0")
    check(r.kl_target is None or (r.kl_target > 0 and r.kl_coef > 0),
          "recipe.kl_target must be > 0 and needs recipe.kl_coef > 0 (the initial coefficient)")
    check(r.is_correction == "none" or r.policy_loss != "gmpo",
          "recipe.is_correction weights tokens; recipe.policy_loss='gmpo' is sequence-level (use is_correction='none')")
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
        check(entry.name not in ("mixture", "toy_addition", "env"),
              f"task.mixture[{i}].name: {entry.name!r} cannot be mixed (no nested mixtures, no toy, no environment)")
        if entry.name not in ("mixture", "toy_addition", "env"):
            inner = {f.name: getattr(entry, f.name) for f in dataclasses.fields(TaskConfig)}
            try:
                validate(dataclasses.replace(cfg, task=TaskConfig(**inner)))
            except ConfigError as err:
                problems.extend(f"task.mixture[{i}]: {line.strip()[2:]}" for line in str(err).splitlines()[1:])
    check(not t.pass_rate_band or (len(t.pass_rate_band) == 2 and t.pass_rate_band[0] <= t.pass_rate_band[1]),
          "task.pass_rate_band must be [lo, hi] with 0 <= lo <= hi <= 1 (or empty for no filter)")
    if t.name == "toy_addition":
        check(lengths == [2], "task.name='toy_addition' needs recipe.max_new_tokens=2 (tens, ones)")
        check(r.kl_coef == 0, "task.name='toy_addition' has no reference policy: recipe.kl_coef must be 0")
        check(r.overlong == "none", "task.name='toy_addition' has fixed-length answers: recipe.overlong must be 'none'")
    env = t.name == "env"  # multi-turn episodes (docs/environments.md)
    check(not t.environment or env, "task.environment is only defined for task.name='env'")
    check(not env or (r.baseline != "greedy" and r.format_weight == 0 and not t.pass_rate_band),
          "task.name='env': recipe.baseline='greedy', recipe.format_weight > 0 and task.pass_rate_band are not "
          "defined for episodes (the environment gives the reward)")
    check(r.credit == "episode" or env, "recipe.credit='turn' needs multi-turn episodes (task.name='env')")
    check(r.credit == "episode" or (r.adv_whiten == "none" and r.policy_loss != "gmpo"),
          "recipe.credit='turn' gives token-level advantages: needs recipe.adv_whiten='none' and a policy loss "
          "other than 'gmpo'")
    problems += resource_problems(cfg)
    problems += engine_problems(cfg.rollout, t.name, cfg.model.path, max(lengths)) if not problems else []
    if problems:
        head = f"{source}: invalid config" if source else "invalid config"
        raise ConfigError(head + ":\n  - " + "\n  - ".join(problems))


UNHASHED = ("tracking", "compute")  # sections that change no computed number (beyond float rounding)


# Fields added after run ids were first issued: at their default they are left out of the hash, so a config
# that does not use them keeps its run id (a rerun recognises finished work). A field added later goes here.
ADDED_LATER: dict[str, tuple[str, ...]] = {"RunConfig": ("rollout",), "TaskConfig": ("environment", "episode"),
                                           "RecipeConfig": ("mask_env_tokens", "credit")}


def _hashed(data: dict, cls: type) -> dict:
    """`data` (plain, of dataclass `cls`) without what the run id leaves out: execution settings, the preset's
    name (a label, hashed as null: the recipe keys it resolved to are hashed) and fields of ADDED_LATER at their
    default."""
    later = {name for c in cls.__mro__ for name in ADDED_LATER.get(c.__name__, ())}
    out: dict[str, Any] = {"preset": None} if cls is RunConfig else {}
    for f in dataclasses.fields(cls):
        if f.name in UNHASHED or f.name == "preset" or f.name not in data:
            continue
        value, tp = data[f.name], plain(hints(cls)[f.name])
        if f.name in later and value == _default(cls, f.name):
            continue
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            value = _hashed(value, tp)
        elif typing.get_origin(tp) is tuple and dataclasses.is_dataclass(item := typing.get_args(tp)[0]):
            value = [_hashed(v, item) if isinstance(v, dict) else v for v in value]  # task.mixture entries
        out[f.name] = value
    return out


@functools.cache
def _defaults(cls: type) -> dict:
    return to_dict(cls())


def _default(cls: type, name: str) -> Any:
    return _defaults(cls)[name]


def hash_config(data: dict) -> str:
    """The run id of a resolved config given as plain data (`to_dict`): a content hash of everything that can
    change a computed number (see `_hashed` for what it leaves out)."""
    blob = json.dumps(_hashed(data, RunConfig), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def run_id(cfg: RunConfig) -> str:
    """Content hash of the fully resolved config (seed included; tracking, compute and the preset's name not)."""
    return hash_config(to_dict(cfg))
