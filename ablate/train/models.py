"""Load HF causal LMs, and build the tiny local base model the quickstart trains with RL.

The base model is a ~1M-parameter Llama over a character-level tokenizer, warm-started by a short
supervised phase on arithmetic TRAIN problems (never held-out ones). The warm start uses mild
per-digit label noise: the model learns the right answer as the mode, but keeps real probability
mass on wrong digits. Sampled at temperature 1 it is then often wrong where greedy is right, which
is exactly the gap RL (sharpening) closes, and the sharpening carries over to held-out problems.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import string
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
# transformers is imported where it is used: a toy run (and every worker process starting one) never
# loads it, which saves seconds of start-up per process

from ablate.config import ConfigError, RunConfig, TaskConfig
from ablate.tasks.arithmetic import build as build_task
from ablate.tasks.arithmetic import is_heldout, random_problem
from ablate.train import execution
from ablate.train.rollout import LMPolicy

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
CHARS = string.printable  # digits, letters, punctuation, space, \t \n ...: every char is one token
RECIPE_VERSION = 1  # bump when the build code changes in a way the settings below do not capture


# --- tokenizer -----------------------------------------------------------------------------------

def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: one token per character, BOS prepended, left padding."""
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(CHARS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")  # every char alone
    tok.decoder = decoders.Fuse()  # join characters back without separators
    # BOS gives the first prompt character a fixed left context, whatever the left padding
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
        unk_token="<unk>", padding_side="left")  # generation pads on the left


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_model(path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """The real loading path: a local folder or a hub id. Without transformers' weight-loading bar (a
    few milliseconds for a local model; the trainer has its own progress view)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# --- LoRA and checkpoint weights --------------------------------------------------------------------

def add_lora(model, lora):
    """Wrap `model` with peft LoRA adapters (`lora`: config.LoraConfig); only the adapters train."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                            target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))


def is_lora(module) -> bool:
    return hasattr(module, "peft_config")


def trained_weights(module) -> dict:
    """What a checkpoint must hold: the adapters under LoRA (the base is the model on disk), else all."""
    if is_lora(module):
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(module)
    return module.state_dict()


def load_weights(module, state: dict) -> None:
    if is_lora(module):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(module, state)
    else:
        module.load_state_dict(state)


def engine_weights(module) -> list[tuple[str, torch.Tensor]]:
    """Every weight of the policy under its checkpoint name, as an inference engine loads them (detached, no
    copy): LoRA adapters merged, W + scale * B A computed aside (the trained module is left as it is). Under
    fsdp the module holds its gathered working copy between steps (train/sharding.py), so the full tensors."""
    if not is_lora(module):  # a tied lm-head under both names: engines load the head and the embedding apart
        return [(name, p.detach()) for name, p in module.named_parameters(remove_duplicate=False)]
    from peft.tuners.lora import LoraLayer

    base = module.get_base_model()
    with torch.no_grad():
        merged = {f"{name}.weight": m.get_base_layer().weight + sum(m.get_delta_weight(a) for a in m.active_adapters)
                  for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    return [(key, merged.get(key, p).detach()) for name, p in base.named_parameters(remove_duplicate=False)
            if ".lora_" not in name for key in [name.replace(".base_layer.", ".")]]


def merged_model(module):
    """A plain HF model with the LoRA adapters merged into the base weights (for export); a copy, the
    trained module is left as it is. Without adapters: the module itself."""
    import copy

    return copy.deepcopy(module).merge_and_unload() if is_lora(module) else module


# --- base model build ----------------------------------------------------------------------------

@dataclass(frozen=True)
class BuildSettings:
    """Everything the base model depends on; its hash decides whether a cached build is reused."""

    seed: int = 0
    steps: int = 3000
    batch_size: int = 128
    lr: float = 3e-3
    label_noise: float = 0.2  # share of answer characters replaced by a random digit
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 384
    digits: tuple[int, ...] = (1, 2)
    operators: tuple[str, ...] = ("+", "-", "*")

    def hash(self) -> str:
        return settings_hash(self, recipe_version=RECIPE_VERSION)


def settings_hash(settings, **tags) -> str:
    """The cache key of a model build: its settings (a dataclass) and `tags` (recipe version, kind)."""
    blob = json.dumps({**asdict(settings), **tags}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _new_model(s: BuildSettings, tok) -> LlamaForCausalLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=s.hidden, intermediate_size=s.intermediate,
        num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.heads,
        max_position_embeddings=64, tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def _train_problem(rng: random.Random, s: BuildSettings):
    """A fresh draw from the task's mix, redrawn until it lies on the TRAIN side of the fixed split."""
    while True:
        p = random_problem(rng, s.digits, s.operators)
        if not is_heldout(p.prompt):
            return p


def _sft_batch(problems, tok, rng: random.Random, noise: float):
    """Right-padded (ids, mask, labels); loss only on answer characters and EOS."""
    rows = []
    for p in problems:
        answer = "".join(rng.choice(string.digits) if rng.random() < noise else c for c in p.answer)
        prompt_ids = tok(p.prompt)["input_ids"]
        answer_ids = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row_ids, row_labels) in enumerate(rows):
        ids[i, :len(row_ids)] = torch.tensor(row_ids)
        labels[i, :len(row_labels)] = torch.tensor(row_labels)
        mask[i, :len(row_ids)] = 1
    return ids, mask, labels


@torch.no_grad()
def measure_skill(model, tok, task, problems, n: int = 8, temperature: float = 1.0,
                  max_new_tokens: int = 6) -> dict:
    """Held-out skill: sampled pass@1 (n samples per problem), greedy accuracy, 0/n and n/n shares."""
    score = task.score  # the strict verifier
    model.eval()
    enc = tok([p.prompt for p in problems], return_tensors="pt", padding=True)
    common = dict(max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    greedy = model.generate(**enc, do_sample=False, **common)
    sampled = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                             num_return_sequences=n, **common)
    width = enc["input_ids"].shape[1]
    greedy_txt = tok.batch_decode(greedy[:, width:], skip_special_tokens=True)
    sampled_txt = tok.batch_decode(sampled[:, width:], skip_special_tokens=True)
    counts = [sum(score(p, sampled_txt[i * n + j]) for j in range(n)) for i, p in enumerate(problems)]
    return {
        "pass1": sum(counts) / (n * len(problems)),
        "greedy_acc": sum(score(p, t) for p, t in zip(problems, greedy_txt)) / len(problems),
        "share_none": sum(c == 0 for c in counts) / len(problems),
        "share_all": sum(c == n for c in counts) / len(problems),
        "n": n,
        "num_problems": len(problems),
    }


def warm_start(model, steps: int, lr: float, next_batch, progress: bool, label: str = "warm start") -> float:
    """Supervised warm start of `model` in place: `steps` AdamW steps on `next_batch()` -> (ids, mask, labels)
    [B, L], gradients clipped at 1; returns the loss's moving average (0.95) at the end."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    # linear warmup then cosine decay to 10%: a short run needs a fast start and a quiet end
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps))))
    model.train()
    loss_ema = None
    with _progress(progress) as bar:
        job = bar.add_task(label, total=steps, loss=float("nan"))
        for _ in range(steps):
            ids, mask, labels = next_batch()
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
            bar.update(job, advance=1, loss=loss_ema)
    return loss_ema


def _cached(out: Path, settings: BuildSettings) -> bool:
    meta = out / "build.json"
    if not (meta.is_file() and (out / "config.json").is_file()):
        return False
    try:
        return json.loads(meta.read_text()).get("settings_hash") == settings.hash()
    except json.JSONDecodeError:
        return False


def build_base_model(out_dir: str | Path, seed: int = 0, steps: int | None = None,
                     settings: BuildSettings | None = None, progress: bool = True) -> dict:
    """Build (or reuse, if cached with the same settings) the tiny base model in `out_dir`.

    Returns the build record that is also written to `out_dir/build.json`.
    """
    settings = settings or BuildSettings(seed=seed)
    if steps is not None:
        settings = BuildSettings(**{**asdict(settings), "steps": steps})
    out = Path(out_dir)
    if _cached(out, settings):
        return json.loads((out / "build.json").read_text())

    t0 = time.time()
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    tok = build_tokenizer()
    model = _new_model(settings, tok)
    task_cfg = TaskConfig(digits=settings.digits, operators=settings.operators)
    loss_ema = warm_start(model, settings.steps, settings.lr, lambda: _sft_batch(
        [_train_problem(rng, settings) for _ in range(settings.batch_size)], tok, rng, settings.label_noise), progress)
    train_seconds = time.time() - t0

    task = build_task(task_cfg)
    torch.manual_seed(settings.seed)  # the measurement's sampling is reproducible too
    skill = measure_skill(model, tok, task, task.problems("heldout"))
    record = {
        "settings": asdict(settings),
        "settings_hash": settings.hash(),
        "recipe_version": RECIPE_VERSION,
        "params": sum(p.numel() for p in model.parameters()),
        "final_loss_ema": loss_ema,
        "train_seconds": round(train_seconds, 1),
        "heldout": skill,
        "heldout_task": {"seed": task_cfg.seed, "num_heldout": task_cfg.num_heldout},
    }
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "build.json").write_text(json.dumps(record, indent=2) + "\n")  # last: marks the build done
    return record


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn(), disable=not enabled)


def base_model_cli(out: str, seed: int = 0) -> None:
    """`ablate base-model --out models/tiny-arith`: build (or reuse) and print what was measured."""
    from rich.console import Console
    console = Console()
    reused = _cached(Path(out), BuildSettings(seed=seed))
    record = build_base_model(out, seed=seed)
    h = record["heldout"]
    how = f"reused the cached build (built earlier in {record['train_seconds']} s)" if reused else \
        f"built in {record['train_seconds']} s"
    console.print(f"base model in {out}: {record['params']:,} params, {how}; "
                  f"held-out pass@1 {h['pass1']:.3f} (T=1, n={h['n']}), greedy {h['greedy_acc']:.3f}, "
                  f"0/{h['n']} {h['share_none']:.2f}, {h['n']}/{h['n']} {h['share_all']:.2f}")


# --- the trained policy ----------------------------------------------------------------------------

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' but this machine has no usable CUDA device; allowed values: 'auto' "
                          "(CUDA when there is one), 'cpu'")
    return torch.device(name)


def build_policy(cfg: RunConfig, task, device: torch.device):
    """What is trained: the configured model (LoRA, gradient checkpointing) as an `LMPolicy`, or the toy's table."""
    if cfg.task.name == "toy_addition":
        from ablate.tasks.toy import build_policy as build_toy_policy

        return build_toy_policy(task)
    bf16_weights = cfg.model.master_weights == "bfloat16"
    use_bf16 = device.type == "cuda" and cfg.model.dtype in ("auto", "bfloat16") and not bf16_weights
    # fp32 master weights with bf16 autocast on CUDA, or bf16 weights (and optimizer state) throughout
    model = load_model(cfg.model.path, device, torch.bfloat16 if bf16_weights else torch.float32)
    if cfg.model.lora is not None:
        model = add_lora(model, cfg.model.lora)
    if cfg.compute.gradient_checkpointing:
        execution.enable_gradient_checkpointing(model)
    return LMPolicy(model, load_tokenizer(cfg.model.path), device, torch.bfloat16 if use_bf16 else None,
                    cfg.compute.fp32_logits)
