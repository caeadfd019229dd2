"""Hand-computed values for log-probs, entropy, KL estimators, aggregations and the clipped loss."""

import math

import pytest
import torch
from torch.testing import assert_close

from ablate.rl.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    LossParams,
    entropy_from_logits,
    importance_ratio,
    ppo_clip,
    token_logprobs,
)

D = torch.float64
EXACT = {"atol": 1e-12, "rtol": 0}


def one_token_loss(p_old, p_new, a, **params):
    """Loss and d loss / d logp for a single token (N=1, T=1)."""
    logp = torch.tensor([[math.log(p_new)]], dtype=D, requires_grad=True)
    old = torch.tensor([[math.log(p_old)]], dtype=D)
    loss, stats = ppo_clip(logp, old, torch.tensor([a], dtype=D), torch.ones(1, 1, dtype=torch.bool),
                           agg="seq_mean_token_mean", max_len=1, params=LossParams(**params))
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad.item(), stats


# --- log-probs and entropy ---------------------------------------------------------------------

def test_token_logprobs_hand_example():
    logits = torch.tensor([[[0.0, math.log(3.0)], [2.0, 2.0]]], dtype=D)  # p = [.25,.75], [.5,.5]
    lp = token_logprobs(logits, torch.tensor([[1, 0]]))
    assert_close(lp, torch.tensor([[math.log(0.75), math.log(0.5)]], dtype=D), **EXACT)


def test_token_logprobs_bf16_logits_upcast():
    logits = torch.randn(2, 3, 7).bfloat16()
    lp = token_logprobs(logits, torch.zeros(2, 3, dtype=torch.long))
    assert lp.dtype == torch.float32
    assert_close(lp, torch.log_softmax(logits.float(), -1)[..., 0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("v", [2, 7, 50257])
def test_entropy_uniform_is_log_v(v):
    h = entropy_from_logits(torch.full((2, 3, v), 1.7, dtype=D))
    assert_close(h, torch.full((2, 3), math.log(v), dtype=D), atol=1e-10, rtol=0)


def test_entropy_hand_example_and_minus_inf():
    # p = [.25, .75]: H = -(.25 ln .25 + .75 ln .75) = 0.5623351446
    h = entropy_from_logits(torch.tensor([[[0.0, math.log(3.0)]]], dtype=D))
    assert_close(h, torch.tensor([[0.5623351446188083]], dtype=D), **EXACT)
    # a -inf logit has p = 0 and adds nothing; forward and backward stay finite
    logits = torch.tensor([[[0.0, 0.0, -math.inf]]], dtype=D, requires_grad=True)
    h = entropy_from_logits(logits)
    assert_close(h, torch.tensor([[math.log(2)]], dtype=D), **EXACT)
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_large_logits_stable():
    h = entropy_from_logits(torch.tensor([[[1e4, 0.0, -1e4]]]))
    assert torch.isfinite(h).all() and h.item() == pytest.approx(0.0, abs=1e-6)


# --- KL estimators -----------------------------------------------------------------------------

LOGP = torch.tensor([[-1.0, -1.0, -2.0]], dtype=D)
REF = torch.tensor([[-0.5, -2.0, -2.0]], dtype=D)  # d = ref - logp = [0.5, -1, 0]


@pytest.mark.parametrize("name,expected", [
    ("k1", [-0.5, 1.0, 0.0]),
    ("k2", [0.125, 0.5, 0.0]),
    ("k3", [math.exp(0.5) - 1.5, math.exp(-1.0), 0.0]),  # 0.1487212707, 0.3678794412, 0
])
def test_kl_estimators_hand_example(name, expected):
    exp = torch.tensor([expected], dtype=D)
    assert_close(KL_ESTIMATORS[name](LOGP, REF), exp, **EXACT)


# --- aggregations: values 2x3 with mask [[1,1,0],[1,0,0]] --------------------------------------

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=D)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize("name,expected", [
    ("seq_mean_token_mean", 2.75),  # mean(1.5, 4)
    ("token_mean", 7 / 3),  # (1 + 2 + 4) / 3
    ("seq_mean_token_sum_norm", 7 / 6),  # mean(3/3, 4/3)
])
def test_aggregation_hand_example(name, expected):
    assert_close(AGGREGATIONS[name](VALUES, MASK, 3), torch.tensor(expected, dtype=D), **EXACT)


@pytest.mark.parametrize("name,expected", [
    ("seq_mean_token_mean", 1.5),  # the empty completion is excluded from the sequence mean
    ("token_mean", 1.5),
    ("seq_mean_token_sum_norm", 0.5),  # (3/3 + 0) / 2: Dr. GRPO keeps the constant denominator
])
def test_aggregation_with_empty_completion(name, expected):
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    assert_close(AGGREGATIONS[name](VALUES, mask, 3), torch.tensor(expected, dtype=D), **EXACT)


# --- importance ratio --------------------------------------------------------------------------

def test_sequence_ratio_gspo_hand_example():
    # log ratios [ln 2, 0, (masked garbage)] -> exp(ln2 / 2) = sqrt(2) on every token
    logp = torch.tensor([[math.log(2.0), 0.0, 7.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[0.0, 0.0, -3.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    rho = importance_ratio(logp, old, mask, "sequence")
    assert_close(rho, torch.full((1, 3), math.sqrt(2), dtype=D), **EXACT)
    # d/dlogp_j sum_{t counted} rho_t = 2 * sqrt(2) * (1/2) on counted tokens, 0 on the masked one
    (rho * mask).sum().backward()
    assert_close(logp.grad, torch.tensor([[math.sqrt(2), math.sqrt(2), 0.0]], dtype=D), **EXACT)


def test_token_ratio_hand_example():
    rho = importance_ratio(torch.tensor([[math.log(0.3)]]), torch.tensor([[math.log(0.2)]]),
                           torch.ones(1, 1, dtype=torch.bool), "token")
    assert_close(rho, torch.tensor([[1.5]]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="token, sequence"):
        importance_ratio(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), "chunk")


# --- clipped surrogate -------------------------------------------------------------------------

def test_design_example_clip_high_zero_gradient():
    # old p 0.2, new p 0.3 -> ratio 1.5; A>0 with eps_high 0.2 counts only up to 1.2 (p = 0.24)
    loss, grad, stats = one_token_loss(0.2, 0.3, 1.0)
    assert loss == pytest.approx(-1.2, abs=1e-12)
    assert grad == 0.0
    assert stats["clip_frac_high"].item() == 1.0 and stats["clip_frac_low"].item() == 0.0
    assert stats["ratio_mean"].item() == pytest.approx(1.5) and stats["ratio_max"].item() == pytest.approx(1.5)


def test_clip_higher_dapo():
    # eps_high 0.28: ratio 1.25 is inside the range, unclipped: loss -1.25, grad -rho*A = -1.25
    loss, grad, stats = one_token_loss(0.2, 0.25, 1.0, eps_high=0.28)
    assert loss == pytest.approx(-1.25, abs=1e-12) and grad == pytest.approx(-1.25, abs=1e-12)
    assert stats["clip_frac_high"].item() == 0.0


def test_negative_advantage_high_ratio_is_not_clipped():
    # A<0, ratio 1.5: min(-1.5, -1.2) = -1.5 -> loss 1.5, d loss/d logp = -A*rho = 1.5
    loss, grad, stats = one_token_loss(0.2, 0.3, -1.0)
    assert loss == pytest.approx(1.5, abs=1e-12) and grad == pytest.approx(1.5, abs=1e-12)
    assert stats["clip_frac_high"].item() == 0.0 and stats["clip_frac_low"].item() == 0.0


def test_clip_low_negative_advantage():
    # A<0, ratio 0.5 < 0.8: min(-0.5, -0.8) = -0.8 -> loss 0.8, grad 0
    loss, grad, stats = one_token_loss(0.4, 0.2, -1.0)
    assert loss == pytest.approx(0.8, abs=1e-12) and grad == 0.0
    assert stats["clip_frac_low"].item() == 1.0


def test_dual_clip_hand_example():
    # old p 0.1, new p 0.4 -> ratio 4, A=-1, c=3: min(-4, -1.2) = -4; max(-4, -3) = -3 -> loss 3, grad 0
    loss, grad, stats = one_token_loss(0.1, 0.4, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0, abs=1e-12) and grad == 0.0
    assert stats["dual_clip_frac"].item() == 1.0
    # without dual clip: loss 4, grad 4
    loss, grad, stats = one_token_loss(0.1, 0.4, -1.0)
    assert loss == pytest.approx(4.0, abs=1e-12) and grad == pytest.approx(4.0, abs=1e-12)
    assert stats["dual_clip_frac"].item() == 0.0
    # ratio 2 < c: dual clip inactive, loss 2, grad 2
    loss, grad, _ = one_token_loss(0.1, 0.2, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(2.0, abs=1e-12) and grad == pytest.approx(2.0, abs=1e-12)
    # A>0 is untouched by dual clip: ratio 4 clipped to 1.2 -> loss -1.2
    loss, grad, _ = one_token_loss(0.1, 0.4, 1.0, dual_clip=3.0)
    assert loss == pytest.approx(-1.2, abs=1e-12) and grad == 0.0


def test_policy_loss_aggregates_with_agg_and_stats_over_tokens():
    # ratio 1 everywhere: per-token loss = -A; A = [1, -3]; mask [[1,1,0],[1,0,0]], max_len 4
    logp = torch.zeros(2, 3, dtype=D)
    adv = torch.tensor([1.0, -3.0], dtype=D)
    expect = {"seq_mean_token_mean": (-1 + 3) / 2,  # 1
              "token_mean": (-1 - 1 + 3) / 3,  # 1/3
              "seq_mean_token_sum_norm": (-2 / 4 + 3 / 4) / 2}  # 1/8
    for agg, value in expect.items():
        loss, stats = ppo_clip(logp, logp, adv, MASK, agg=agg, max_len=4, params=LossParams())
        assert_close(loss, torch.tensor(value, dtype=D), **EXACT)
        assert stats["ratio_mean"].item() == 1.0 and stats["clip_frac"].item() == 0.0
        assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())


def test_policy_loss_rejects_bad_options():
    z, m, a = torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1)
    with pytest.raises(ValueError, match="token_mean"):
        ppo_clip(z, z, a, m, agg="sum", max_len=2, params=LossParams())
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip(z, z, a, m, agg="token_mean", max_len=2, params=LossParams(dual_clip=0.5))


def test_registry_names_match_config_literals():
    import typing

    from ablate.config import KLEstimator, LossAgg, RatioLevel
    from ablate.rl.losses import RATIO_LEVELS
    assert set(KL_ESTIMATORS) == set(typing.get_args(KLEstimator))
    assert set(AGGREGATIONS) == set(typing.get_args(LossAgg))
    assert set(RATIO_LEVELS) == set(typing.get_args(RatioLevel))
