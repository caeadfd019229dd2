"""A tiny chat model of the Qwen2 architecture, built locally (no download), for testing the real-model path:
a byte-level BPE tokenizer trained with `tokenizers`, `<|im_end|>` as EOS, a ChatML chat template, and
a few supervised steps on GSM8K-style rows so that it sometimes answers `\\boxed{...}<|im_end|>`.

    build_chat_model(out_dir, rows)   # rows: [{"prompt", "answer"}]; writes a from_pretrained folder
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (  # ChatML, as Qwen2.5-Instruct writes it (without the default system turn)
    "{% for m in messages %}" + IM_START + "{{ m['role'] }}\n{{ m['content'] }}" + IM_END + "\n{% endfor %}"
    "{% if add_generation_prompt %}" + IM_START + "assistant\n{% endif %}")


def build_tokenizer(corpus: list[str], vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 / Qwen style) trained on `corpus`; ChatML specials; left padding."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=IM_END,
                                   additional_special_tokens=[IM_START], padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_chat_model(out_dir: str | Path, rows: list[dict], sft_steps: int = 60, seed: int = 0, heads: int = 4) -> Path:
    """Write a Qwen2 model (hidden 64, 2 layers, `heads` attention heads: 2 gives head size 32, which vLLM's
    CPU attention runs) + tokenizer to `out_dir`, warm-started on `rows`."""
    out = Path(out_dir)
    replies = [f"The answer is \\boxed{{{r['answer']}}}" for r in rows]
    prompts = [r["prompt"] for r in rows]
    tok = build_tokenizer(prompts + replies + ["user assistant system"] * 4)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None))
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
             for p in prompts]
    ids, labels = [], []
    for text, reply in zip(texts, replies):
        p = tok(text)["input_ids"]
        a = tok(reply)["input_ids"] + [tok.eos_token_id]
        ids.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(map(len, ids))
    x = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in ids])
    y = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    mask = (torch.arange(width)[None] < torch.tensor([len(r) for r in ids])[:, None]).long()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(sft_steps):  # enough to put `\boxed{` and EOS within reach of sampling, not to solve
        loss = model(input_ids=x, attention_mask=mask, labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
