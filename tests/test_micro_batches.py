"""Micro-batches with gradient accumulation (`compute.micro_batch_tokens`) and chunked log-probs change no
result: the accumulated gradient equals the one-pass gradient, logged values equal the one-pass values,
and a whole run gives the same samples and metrics (float rounding aside)."""

import itertools
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ablate.config import parse
from ablate.rl import losses
from ablate.rl.losses import AGG_NORMALISERS, AGGREGATIONS, RATIO_LEVELS
from ablate.runs.store import RunStore
from ablate.train import execution
from ablate.train.models import build_tokenizer
from ablate.train.plan import plan_step
from ablate.train.rollout import LMPolicy
from ablate.train.trainer import train
from ablate.train.update import sequence_logprobs, update


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matmuls: on a loaded 2-core box two OpenMP threads are ~100x slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_policy(dtype=torch.float64, seed=0) -> LMPolicy:
    """A random 2-layer Llama over the character tokenizer: EOS is likely enough for varied lengths."""
    tok = build_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)).to(dtype)
    with torch.no_grad():  # make EOS frequent so that completions end at different lengths
        model.lm_head.weight[tok.eos_token_id] += 0.5 * model.lm_head.weight[tok.eos_token_id].sign()
    return LMPolicy(model, tok, torch.device("cpu"))


@pytest.fixture(scope="module")
def rollout_case():
    policy = tiny_policy()
    torch.manual_seed(1)
    rollout = policy.sample(["7+8=", "12*3=", "5-2=", "100+1="], n=3, temperature=1.0, max_new_tokens=8)
    lengths = rollout.lengths
    assert lengths.min() < lengths.max()  # varied lengths: trimming and packing are exercised
    g = torch.Generator().manual_seed(2)
    N, T = rollout.completion_ids.shape
    base = sequence_logprobs(policy, rollout, 1.0)
    # ratios far from 1 at token and at sequence level: clipping happens
    old = base + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64) + 0.3 * torch.randn(N, 1, generator=g, dtype=torch.float64)
    ref = base + 0.2 * torch.randn(N, T, generator=g, dtype=torch.float64)
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    loss_mask = rollout.completion_mask.clone()
    loss_mask[1] = 0  # an excluded (e.g. truncated) completion: an empty row
    return policy, rollout, old, ref, adv, loss_mask


def run_update(policy, rollout, old, ref, adv, mask, budget, **recipe):
    cfg = parse({"recipe": {"group_size": 3, "max_new_tokens": 8, **recipe}, "optim": {"grad_clip": 0},
                 "compute": {"micro_batch_tokens": budget}})
    params = list(policy.module.parameters())
    opt = torch.optim.SGD(params, lr=0.0)  # lr 0: the weights stay, the accumulated gradient stays in .grad
    torch.manual_seed(0)  # the minibatch permutation
    plan = plan_step(cfg, 1)
    logs, _ = update(policy, opt, plan, rollout, adv, mask, old_logp=old, ref_logp=ref,
                     kl_coef=plan.kl.coef if plan.kl else 0.0)
    return logs, torch.cat([p.grad.flatten() for p in params])


GRID = list(itertools.product(AGGREGATIONS, RATIO_LEVELS, ("off", "loss", "reward"), (0.0, 0.05)))


@pytest.mark.parametrize("agg,ratio,kl,entropy", GRID)
def test_accumulated_gradient_equals_one_pass(rollout_case, agg, ratio, kl, entropy):
    policy, rollout, old, ref, adv, mask = rollout_case
    recipe = dict(loss_agg=agg, ratio_level=ratio, entropy_coef=entropy, eps_low=0.2, eps_high=0.28,
                  kl_coef=0.0 if kl == "off" else 0.1, kl_placement="loss" if kl == "off" else kl)
    ref_logp = None if kl == "off" else ref
    one_logs, one_grad = run_update(policy, rollout, old, ref_logp, adv, mask, 0, **recipe)
    # 24 tokens per micro-batch: 2-3 rows each, so 4+ micro-batches of different sizes
    micro_logs, micro_grad = run_update(policy, rollout, old, ref_logp, adv, mask, 24, **recipe)
    parts = list(execution.micro_batches(rollout, torch.arange(len(rollout)), 24))
    assert len(parts) >= 4 and len({len(i) for i, _ in parts}) >= 2
    assert one_grad.abs().max() > 0
    rel = (micro_grad - one_grad).norm() / one_grad.norm()
    assert rel < 1e-6, rel
    assert set(micro_logs) == set(one_logs)
    for k, v in one_logs.items():  # clip fractions are float32 means inside policy_loss: 1e-6, not 1e-12
        assert micro_logs[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k
    assert one_logs["clip_frac"] > 0  # the ratios really were clipped somewhere
    if kl != "off":
        assert one_logs["kl"] != 0


def test_dividing_each_micro_batch_by_its_own_count_would_differ(rollout_case):
    """The guard: with its own normaliser per micro-batch (the common bug) token_mean reweights rows."""
    policy, rollout, old, ref, adv, mask = rollout_case
    values = torch.randn(mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    whole = AGGREGATIONS["token_mean"](values, mask, 8)
    parts = [(values[:4], mask[:4]), (values[4:], mask[4:])]
    right = sum(AGGREGATIONS["token_mean"](v, m, 8) * losses.micro_weight("token_mean", m, mask, 8, v.dtype)
                for v, m in parts)
    wrong = sum(AGGREGATIONS["token_mean"](v, m, 8) for v, m in parts) / len(parts)
    assert right.item() == pytest.approx(whole.item(), rel=1e-12)
    assert abs(wrong.item() - whole.item()) > 1e-3


@pytest.mark.parametrize("agg", list(AGGREGATIONS))
def test_normalisers_split_every_aggregation_exactly(agg):
    g = torch.Generator().manual_seed(0)
    values = torch.randn(7, 5, dtype=torch.float64, generator=g)
    mask = torch.rand(7, 5, generator=g) > 0.4
    mask[2] = False  # an empty row
    whole = AGGREGATIONS[agg](values, mask, 5)
    for cut in ([0, 3, 7], [0, 1, 2, 6, 7], [0, 7]):
        total = sum(AGGREGATIONS[agg](values[a:b], mask[a:b], 5)
                    * losses.micro_weight(agg, mask[a:b], mask, 5, values.dtype) for a, b in zip(cut, cut[1:]))
        assert total.item() == pytest.approx(whole.item(), rel=1e-12)
    assert set(AGG_NORMALISERS) == set(AGGREGATIONS)


def test_pack_keeps_order_and_budget():
    # padded size rows x (longest prompt + longest completion) <= budget; a row over budget goes alone
    assert execution.pack([2, 2, 2, 2], [3, 3, 3, 3], 10) == [[0, 1], [2, 3]]
    assert execution.pack([2, 2, 9, 2], [3, 1, 3, 1], 12) == [[0, 1], [2], [3]]
    assert execution.pack([1, 1, 1], [1, 1, 1], 0) == [[0], [1], [2]]
    assert execution.pack([], [], 5) == []


def test_no_grad_pass_in_micro_batches_equals_one_pass(rollout_case):
    policy, rollout, *_ = rollout_case
    whole = sequence_logprobs(policy, rollout, 0.7)
    for budget in (1, 24, 40):
        torch.testing.assert_close(sequence_logprobs(policy, rollout, 0.7, budget), whole,
                                   rtol=1e-12, atol=1e-12)


def test_chunked_logprobs_equal_full_vocabulary_ones():
    """Selective log-softmax and entropy in chunks of 3 rows: the same numbers and the same gradients as
    the [M, V] computation."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(50, 8, dtype=torch.float64, generator=g, requires_grad=True)
    h = torch.randn(10, 8, dtype=torch.float64, generator=g, requires_grad=True)
    tok = torch.randint(0, 50, (10,), generator=g)
    head = lambda x: x @ W.T  # noqa: E731
    full_logits = head(h) / 0.8
    full = losses.token_logprobs(full_logits, tok) + 0.3 * losses.entropy_from_logits(full_logits)
    gh, gw = torch.autograd.grad(full.sum(), (h, W))
    logp, ent = losses.chunked_token_logprobs(h, head, tok, 0.8, "grad", chunk=3)
    ch, cw = torch.autograd.grad((logp + 0.3 * ent).sum(), (h, W))
    torch.testing.assert_close(logp + 0.3 * ent, full.detach(), rtol=1e-14, atol=1e-14)  # matmul blocking: 1 ulp
    torch.testing.assert_close(ch, gh, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cw, gw, rtol=1e-12, atol=1e-12)
    _, ent_value = losses.chunked_token_logprobs(h, head, tok, 0.8, "value", chunk=3)
    assert not ent_value.requires_grad


def test_token_scores_match_the_full_logits_path(rollout_case):
    """The trainer's scoring (hidden states, lm-head per chunk, generated positions only) gives the
    same values as log-softmax over the policy's full [N, T, V] logits."""
    policy, ro, *_ = rollout_case
    m = ro.completion_mask.bool()
    with torch.no_grad():
        logits = policy.logits(ro)
        logp, ent = execution.token_scores(policy, ro, 1.0, "value")
    assert torch.equal(logp[m], losses.token_logprobs(logits, ro.completion_ids)[m])
    # the fused head sums H = logsumexp - sum p z, log_softmax's path sums -p log p: equal to rounding (float64)
    torch.testing.assert_close(ent[m], losses.entropy_from_logits(logits)[m], rtol=1e-12, atol=0)
    assert torch.equal(logp[~m], torch.zeros_like(logp[~m]))


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir


# In float32 the two budgets round the update differently (~1e-7), and after an update a token whose row
# uniform lies that close to an inverse-CDF boundary can flip (seed 2 flips one held-out token at step 2 on
# this barely trained model); the float64 grid above shows the gradients equal. Seed 1 has no such token.
SEED = 1


@pytest.mark.parametrize("preset", ["grpo", "dapo"])
def test_run_with_micro_batches_equals_run_without(model_dir, tmp_path, preset):
    """`compute.*` is left out of the run id and changes no logged number beyond float rounding."""
    runs = {}
    for budget in (0, 20):
        data = {"model": {"path": model_dir}, "preset": preset, "seed": SEED,
                "task": {"num_train": 64, "num_heldout": 8, "digits": [1], "operators": ["+"], "gameable": True},
                "prompts_per_step": 4, "steps": 2, "checkpoint_every": 0, "device": "cpu",
                "eval": {"every": 0, "n_samples": 2, "ks": [1, 2]},
                "recipe": {"group_size": 4, "max_new_tokens": 6, "update_epochs": 2, "kl_coef": 0.05},
                "compute": {"micro_batch_tokens": budget}}
        cfg = parse(data)
        assert train(cfg, str(tmp_path / str(budget)), progress=False) == "completed"
        store = RunStore(tmp_path / str(budget))
        runs[budget] = (store.read("metrics"), store.read("evals"), store.read("samples"), store.read_config())
    (m0, e0, s0, c0), (m1, e1, s1, c1) = runs[0], runs[20]
    assert c0["run_id"] == c1["run_id"]
    assert s0 == s1 and e0 == e1
    for a, b in zip(m0, m1):
        for k, v in a.items():
            if not k.startswith("perf/"):
                assert b[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
                assert math.isfinite(b[k])


def test_compute_section_is_strict_and_not_in_the_run_id():
    from ablate.config import ConfigError, run_id

    base = parse({})
    tuned = parse({"compute": {"micro_batch_tokens": 4096, "gradient_checkpointing": True, "deterministic": True,
                               "fp32_logits": False, "threads": 2}})
    assert run_id(base) == run_id(tuned) and tuned.compute.micro_batch_tokens == 4096
    with pytest.raises(ConfigError, match="compute.micro_batch_tokens: -1 is not allowed; allowed: an integer >= 0"):
        parse({"compute": {"micro_batch_tokens": -1}})
    with pytest.raises(ConfigError, match="compute.budget: unknown key"):
        parse({"compute": {"budget": 1}})
