"""Multi-turn episodes through the vLLM engine (rollout.engine: vllm, the CPU build; `make test` installs it):
a context given as token ids, a stop string that ends a turn with its text kept and the row not truncated,
behaviour log-probs of the policy's tokens equal to the trainer's after environment replies, the native
sampler's episodes under greedy decoding, and per-row seeds whatever the split (a calculator run with the
engine: tests/test_vllm_training.py, where no other engine is alive in the process).

The calculator model is built here with head size 32 (hidden 64, 2 heads): the committed models/tiny-calc
has head size 24, which vLLM's CPU attention does not run (a config error, tested last)."""

import json

import pytest
import torch

from ablate.config import ConfigError, load, parse
from ablate.rl.sampling import RowNoise
from ablate.tasks import make_task
from ablate.train.episodes import run_episodes
from ablate.train.models import load_model, load_tokenizer
from ablate.train.rollout import LMPolicy, prompt_ids
from ablate.train.tool_models import CalculatorSettings, build_calculator_model
from ablate.train.update import sequence_logprobs
from ablate.train.vllm_engine import VLLMEngine

T = 1.5  # a hot policy: the barely trained model calls the calculator, answers and rambles


def build_calc_model(path) -> str:
    """A barely trained calculator model (it calls the calculator at random) with head size 32."""
    tiny = CalculatorSettings(steps=60, batch_size=16, hidden=64, layers=1, heads=2, intermediate=64, tool_share=0.6)
    build_calculator_model(path, tiny, progress=False)
    assert json.loads((path / "config.json").read_text())["head_dim"] == 32
    return str(path)


@pytest.fixture(scope="module")
def calc_dir(tmp_path_factory) -> str:
    return build_calc_model(tmp_path_factory.mktemp("calc-head32"))


def calc(model_dir: str, **top) -> dict:
    return {"model": {"path": model_dir}, "device": "cpu",
            "task": {"name": "env", "environment": "calculator", "num_train": 32, "num_heldout": 3,
                     "episode": {"max_turns": 3, "turn_tokens": 8, "tool_error_penalty": 0.1}},
            "rollout": {"engine": "vllm"}, "compute": {"threads": 1, "vllm": {"kv_cache_gb": 0.125}},
            "recipe": {"group_size": 4, "max_new_tokens": 20, "kl_coef": 0.0, "temperature": T}, **top}


@pytest.fixture(scope="module")
def setup(calc_dir):
    """(policy, engine, task, problems): one engine for the module's tests (start-up costs seconds)."""
    torch.set_num_threads(1)
    cfg = parse(calc(calc_dir))
    policy = LMPolicy(load_model(calc_dir), load_tokenizer(calc_dir), torch.device("cpu"))
    engine = VLLMEngine(policy, cfg)
    task = make_task(cfg.task)
    yield policy, engine, task, task.problems("train")[:6]
    engine.close()


def episodes_of(sampler, task, problems, key=(0, 1, 0, 0), start=0, total=None, greedy=False):
    n = 1 if greedy else 4
    ro, outcome = run_episodes(sampler, sampler.tokenizer, task, problems, n, T, 20, None if greedy else key, start,
                               total or len(problems) * n, greedy=greedy)
    return ro


def test_token_id_contexts_and_stop_strings(setup):
    policy, engine, task, problems = setup
    tok, N = policy.tokenizer, len(problems) * 4
    texts = [task.prompt_text(p, tok) for p in problems]
    free = engine.sample(texts, 4, T, 12, noise=RowNoise((3, 1), N))
    ids = engine.sample([prompt_ids(tok, t) for t in texts], 4, T, 12, noise=RowNoise((3, 1), N))
    assert torch.equal(free.completion_ids, ids.completion_ids) and torch.equal(free.behav_logp, ids.behav_logp)
    ro = engine.sample([prompt_ids(tok, t) for t in texts], 4, T, 12, noise=RowNoise((3, 1), N), stop=["]"])
    stopped = 0
    for i in range(N):
        n = int(ro.lengths[i])
        row = ro.completion_ids[i, :n].tolist()
        assert row == free.completion_ids[i, :n].tolist()  # the same draws up to where the row ends
        text, before = tok.decode(row, skip_special_tokens=True), tok.decode(row[:-1], skip_special_tokens=True)
        if "]" in text:  # the token that completes the stop string is the row's last, its text kept
            assert "]" not in before and ro.texts[i] == text and not ro.truncated[i]
            stopped += 1
        elif row[-1] == policy.eos_id:
            assert not ro.truncated[i]
        else:  # neither: it ran to max_new_tokens
            assert n == 12 and ro.truncated[i] and bool(free.truncated[i])
        assert (ro.completion_ids[i, n:] == policy.pad_id).all() and not ro.behav_logp[i, n:].any()
    assert stopped >= 2, "no row called the calculator: the stop path was not exercised"


def test_behaviour_logprobs_of_the_policys_tokens_are_the_trainers(setup):
    policy, engine, task, problems = setup
    ro = episodes_of(engine, task, problems)
    env_tokens = ro.completion_mask - ro.policy_mask
    assert env_tokens.sum() > 0 and (ro.episode[:, 0] > 1).any()  # replies came, and later turns continued
    assert not (ro.behav_logp * (1 - ro.policy_mask)).any()  # environment tokens have none
    mine = sequence_logprobs(policy, ro, T)
    assert float(((ro.behav_logp - mine) * ro.policy_mask).abs().max()) < 1e-4  # float32 tolerance


def test_greedy_episodes_are_the_native_samplers(setup):
    policy, engine, task, problems = setup
    mine, native = episodes_of(engine, task, problems, greedy=True), episodes_of(policy, task, problems, greedy=True)
    for name in ("prompt_ids", "completion_ids", "completion_mask", "policy_mask", "turn", "truncated", "turn_rewards",
                 "episode"):
        assert torch.equal(getattr(mine, name), getattr(native, name)), name
    assert mine.texts == native.texts


def test_same_seeds_same_episodes_whatever_the_split(setup):
    policy, engine, task, problems = setup
    whole = episodes_of(engine, task, problems)
    assert episodes_of(engine, task, problems).texts == whole.texts
    h, N = len(problems) // 2, len(problems) * 4  # two ranks' shares: the same global rows, the same seeds
    parts = [episodes_of(engine, task, problems[:h], total=N),
             episodes_of(engine, task, problems[h:], start=h * 4, total=N)]
    assert [t for p in parts for t in p.texts] == whole.texts
    assert episodes_of(engine, task, problems, key=(1, 1, 0, 0)).texts != whole.texts


def test_the_committed_tiny_calc_models_head_size_is_a_config_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(calc("models/tiny-calc")))
    with pytest.raises(ConfigError, match=r"head size 24; vLLM's CPU build runs head sizes \[32, 64"):
        load(path)
