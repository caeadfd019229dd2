"""The real-model path on CPU: a Qwen2-architecture chat model with a byte-level BPE tokenizer trained
here, `<|im_end|>` as EOS, a chat template, `task: jsonl` rows with multi-token `\\boxed{}` answers
scored by math-verify; left padding, stop on EOS, masks; `ablate train` runs it."""

import json

import pytest
import torch
import yaml
from conftest import sample_counting_rows
from typer.testing import CliRunner

from ablate.cli.main import app
from ablate.runs.store import RunStore
from ablate.train import execution
from ablate.train.chat_model import IM_END, build_chat_model
from ablate.train.models import load_model, load_tokenizer
from ablate.train.rollout import LMPolicy

ROWS = [
    {"prompt": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
               "How many clips did Natalia sell altogether in April and May?", "answer": "72"},
    {"prompt": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
               "How much did she earn?", "answer": "10"},
    {"prompt": "Betty needs $100 for a wallet. She has half of the money. Her parents give her $15 and her "
               "grandparents twice as much. How much more money does Betty need?", "answer": "5"},
    {"prompt": "James writes a 3-page letter to 2 different friends twice a week. How many pages does he "
               "write a year?", "answer": "624"},
    {"prompt": "Albert buys 2 large pizzas with 16 slices and 2 small pizzas with 8 slices. How many slices "
               "does he eat if he eats them all?", "answer": "48"},
    {"prompt": "Ken's box weighs 2 pounds of jelly beans, then he triples it. What does it weigh?", "answer": "6"},
    {"prompt": "Alexis spent $40 on a shirt and $46 on shoes from a $200 budget. What is left?", "answer": "114"},
    {"prompt": "Tina makes $18.00 an hour. How much does she make in 10 hours?", "answer": "180"},
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    (root / "gsm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    build_chat_model(root / "model", ROWS, sft_steps=60)
    return root


def test_tokenizer_is_byte_level_bpe_with_chatml(chat_dir):
    tok = load_tokenizer(str(chat_dir / "model"))
    assert tok.eos_token == IM_END and len(tok(IM_END, add_special_tokens=False)["input_ids"]) == 1
    assert len(tok("\\boxed{624}", add_special_tokens=False)["input_ids"]) > 1  # multi-token answers
    text = "Tina: $18.00, naïve ünïcode"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte level: any text round-trips
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_sampling_left_pads_stops_on_eos_and_masks(chat_dir):
    path = str(chat_dir / "model")
    policy = LMPolicy(load_model(path), load_tokenizer(path), torch.device("cpu"))
    tok = policy.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                       tokenize=False) for r in ROWS[:4]]
    torch.manual_seed(0)
    ro = policy.sample(prompts, n=4, temperature=1.0, max_new_tokens=24)
    lens = [len(tok(p)["input_ids"]) for p in prompts]
    assert ro.prompt_ids.shape[1] == max(lens)
    for i, n in enumerate(lens):  # left padding: real tokens flush right
        row = 4 * i
        assert ro.prompt_mask[row].tolist() == [0] * (max(lens) - n) + [1] * n
        assert (ro.prompt_ids[row, :max(lens) - n] == tok.pad_token_id).all()
    is_eos = ro.completion_ids == tok.eos_token_id
    ended = is_eos.any(1)
    assert ended.any()  # the warm start reaches EOS...
    assert torch.equal(ro.truncated, ~ended)
    for r in range(len(ro)):
        length = int(ro.lengths[r])
        if ended[r]:  # ...and stops there: mask through the first EOS, padding after
            assert int(is_eos[r].nonzero()[0]) == length - 1
            assert (ro.completion_ids[r, length:] == tok.pad_token_id).all()
        assert ro.completion_mask[r, :length].eq(1).all() and ro.completion_mask[r, length:].eq(0).all()
        assert IM_END not in ro.texts[r]
    # a row's log-probs do not depend on the left padding it got from a longer prompt in the batch
    batch_logp = execution.token_scores(policy, ro, 1.0)[0]
    for row in (0, 12):
        alone = execution.token_scores(policy, execution.trim(ro.select(torch.tensor([row]))), 1.0)[0]
        torch.testing.assert_close(alone[0], batch_logp[row, :alone.shape[1]], rtol=1e-4, atol=1e-4)


def test_compacted_sampler_matches_the_uncompacted_one_on_the_chat_model(chat_dir):
    path = str(chat_dir / "model")
    model, tok = load_model(path), load_tokenizer(path)
    prompts = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                       tokenize=False) for r in ROWS]
    args = (prompts, 4, 1.0, 24)
    key = (1, 0, 0, 0)  # row noise under which 3 of the 32 rows run the full length
    full, full_rows = sample_counting_rows(LMPolicy(model, tok, torch.device("cpu"), compact=False), *args, key=key)
    ro, rows = sample_counting_rows(LMPolicy(model, tok, torch.device("cpu")), *args, key=key)
    assert full.truncated.any() and not full.truncated.all()  # some rows end early, some run the full length
    assert rows[1:] == [int((full.lengths > t + 1).sum()) for t in range(len(rows) - 1)] and rows[-1] < 32
    for name in ("completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(ro, name), getattr(full, name)), name
    # the same tokens; their log-probs to float rounding (a smaller batch may round its matmuls otherwise)
    torch.testing.assert_close(ro.behav_logp, full.behav_logp, rtol=0, atol=1e-5)
    assert ro.texts == full.texts and full_rows == [8] + [32] * (len(full_rows) - 1)


def test_ablate_train_runs_the_chat_model_on_jsonl(chat_dir, tmp_path):
    cfg = {"model": {"path": str(chat_dir / "model")}, "preset": "grpo", "device": "cpu",
           "task": {"name": "jsonl", "path": str(chat_dir / "gsm.jsonl"), "chat_template": True,
                    "answer_format": "boxed", "num_heldout": 2},
           "prompts_per_step": 2, "steps": 3, "checkpoint_every": 0,
           "eval": {"every": 0, "n_samples": 2, "ks": [1, 2]},
           "recipe": {"group_size": 4, "max_new_tokens": 24}, "compute": {"micro_batch_tokens": 256}}
    path = tmp_path / "chat.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(app, ["train", str(path), "--out", str(tmp_path / "run"), "--quiet",
                                   "--set", "compute.micro_batch_tokens=200"])
    assert res.exit_code == 0, res.output
    store = RunStore(tmp_path / "run")
    rows = store.read("metrics")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["train/completion_len_mean"] <= 24 for r in rows)
    assert min(r["train/truncation_rate"] for r in rows) < 1  # some completions ended on EOS
    samples = store.read("samples")
    assert any("<|im_start|>assistant\n" in s["prompt"] for s in samples)  # the chat template was applied
