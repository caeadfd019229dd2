"""Hand-computed values for every policy-loss registry entry on the shared test batch.

Batch: N = 2, T = 4, row 0 has 3 tokens, row 1 has 4; old p / new p give ratios
[[1.5, 1.0, 0.7, -], [1.3, 0.6, 1.1, 5.0]], A = [+1.0, -0.5], N_tok = 7. The PPO reference on it
(eps 0.2): L_TM = 0.1714, L_SM = 0.0292.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from ablate.rl.losses import POLICY_LOSSES, LossParams, ppo_clip, top_entropy_mask

D = torch.float64
TOL = {"atol": 1e-4, "rtol": 0}
OLD_P = [[0.20, 0.50, 0.40, 1.0], [0.10, 0.50, 0.25, 0.10]]
NEW_P = [[0.30, 0.50, 0.28, 1.0], [0.13, 0.30, 0.275, 0.50]]
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
ADV = torch.tensor([1.0, -0.5], dtype=D)


def run(name, agg="token_mean", adv=ADV, mask=MASK, token_weight=None, **params):
    logp = torch.tensor(NEW_P, dtype=D).log().requires_grad_(True)
    old = torch.tensor(OLD_P, dtype=D).log()
    loss, stats = POLICY_LOSSES[name](logp, old, adv, mask, agg=agg, max_len=4, params=LossParams(**params),
                                      token_weight=token_weight)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad, stats


def t(rows):
    return torch.tensor([r + [0.0] * (4 - len(r)) for r in rows], dtype=D)


PPO = dict(eps_low=0.2, eps_high=0.2)


def test_ppo_clip_is_the_registered_entry_and_matches_reference():
    assert POLICY_LOSSES["ppo_clip"] is ppo_clip
    loss, grad, stats = run("ppo_clip", dual_clip=None, **PPO)
    assert loss == pytest.approx(0.1714, abs=1e-4)
    assert_close(grad, t([[0.0, -0.1429, -0.1000], [0.0929, 0.0, 0.0786, 0.3571]]), **TOL)
    assert run("ppo_clip", agg="seq_mean_token_mean", dual_clip=None, **PPO)[0] == pytest.approx(0.0292, abs=1e-4)


def test_cispo_worked_example():
    loss, grad, stats = run("cispo", cispo_cap=1.2)
    assert loss == pytest.approx(0.0454, abs=1e-4)
    assert_close(grad, t([[-0.1714, -0.1429, -0.1000], [0.0857, 0.0429, 0.0786, 0.0857]]), **TOL)
    assert run("cispo", agg="seq_mean_token_mean", cispo_cap=1.2)[0] == pytest.approx(0.1659, abs=1e-4)
    assert stats["cispo_cap_frac"].item() == pytest.approx(3 / 7)  # rho 1.5, 1.3, 5.0 exceed 1.2
    # cap 5 (TRL/SkyRL's ScaleRL value): w = rho, no token capped
    _, grad5, _ = run("cispo", cispo_cap=5.0)
    assert_close(grad5, t([[-0.2143, -0.1429, -0.1000], [0.0929, 0.0429, 0.0786, 0.3571]]), **TOL)


def test_gmpo_worked_example_and_empty_row_left_out():
    loss, grad, stats = run("gmpo", gmpo_eps=0.4)
    assert loss == pytest.approx(-0.1374, abs=1e-4)
    assert_close(grad, t([[0.0, -0.1691, -0.1691], [0.0925, 0.0, 0.0925, 0.0925]]), **TOL)
    assert stats["clip_frac"].item() == pytest.approx(2 / 7)  # (0,0) high, (1,1) low
    # agg is ignored
    assert run("gmpo", agg="seq_mean_token_sum_norm", gmpo_eps=0.4)[0] == pytest.approx(loss)
    # an empty third row (A = +2) does not dilute the mean (veRL 0.9.1 would give x 2/3)
    logp = torch.tensor(NEW_P + [[0.5] * 4], dtype=D).log().requires_grad_(True)
    old = torch.tensor(OLD_P + [[0.5] * 4], dtype=D).log()
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=torch.bool)])
    l3, _ = POLICY_LOSSES["gmpo"](logp, old, torch.tensor([1.0, -0.5, 2.0], dtype=D), mask,
                                 agg="token_mean", max_len=4, params=LossParams(gmpo_eps=0.4))
    assert l3.item() == pytest.approx(-0.1374, abs=1e-4)


def test_sapo_worked_example():
    loss, grad, _ = run("sapo", agg="seq_mean_token_mean", tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx(-0.4401, abs=1e-4)
    assert_close(grad, t([[-0.2350, -0.1667, -0.1141], [0.0793, 0.0359, 0.0686, 0.0182]]), **TOL)
    assert run("sapo", tau_pos=1.0, tau_neg=1.05)[0] == pytest.approx(-0.2081, abs=1e-4)


COV = dict(eps_low=0.2, eps_high=0.2, clip_cov_ratio=2e-4)


def test_clip_cov_worked_example():
    loss, grad, stats = run("clip_cov", clip_cov_lb=0.5, clip_cov_ub=5.0, **COV)
    assert loss == pytest.approx(0.0786, abs=1e-4)
    assert_close(grad, t([[0.0, -0.1429, -0.1000], [0.0, 0.0, 0.0786, 0.3571]]), **TOL)
    assert stats["cov_select_frac"].item() == pytest.approx(1 / 7)
    # the default band (1, 5): no token qualifies and Clip-Cov equals PPO
    loss, grad, stats = run("clip_cov", clip_cov_lb=1.0, clip_cov_ub=5.0, **COV)
    assert loss == pytest.approx(0.1714, abs=1e-4) and stats["cov_select_frac"].item() == 0.0
    assert_close(grad, run("ppo_clip", dual_clip=None, **PPO)[1], atol=1e-12, rtol=0)


def test_clip_cov_draw_is_seeded():
    # band (-1, 1) holds the 5 unclipped tokens; ratio 0.3 draws floor(2.1) = 2 of them
    def drops(seed):
        g = torch.Generator().manual_seed(seed)
        _, grad, _ = run("clip_cov", eps_low=0.2, eps_high=0.2, clip_cov_ratio=0.3, clip_cov_lb=-1.0,
                         clip_cov_ub=1.0, generator=g)
        return (grad == 0) & MASK
    ppo_zero = (run("ppo_clip", dual_clip=None, **PPO)[1] == 0) & MASK
    assert int((drops(0) & ~ppo_zero).sum()) == 2
    assert torch.equal(drops(0), drops(0))
    assert any(not torch.equal(drops(0), drops(s)) for s in range(1, 6))


def test_kl_cov_worked_example():
    loss, grad, stats = run("kl_cov", kl_cov_frac=2e-3, kl_cov_coef=1.0)
    assert loss == pytest.approx(0.1518, abs=1e-4)
    assert_close(grad, t([[-0.2143, -0.1429, -0.1000], [0.2357, 0.0429, 0.0786, 0.3571]]), **TOL)
    assert stats["cov_select_frac"].item() == pytest.approx(1 / 7)


def test_gpg_worked_example():
    loss, grad, _ = run("gpg")
    assert loss == pytest.approx(0.0794, abs=1e-4)
    assert_close(grad, t([[-1 / 7] * 3, [0.5 / 7] * 4]), **TOL)
    assert run("gpg", agg="seq_mean_token_mean")[0] == pytest.approx(0.2016, abs=1e-4)


@pytest.mark.parametrize("agg,expected", [("token_mean", 0.1000), ("seq_mean_token_mean", -0.0333)])
def test_delta_is_dual_clip(agg, expected):
    loss, grad, _ = run("delta", agg=agg, delta=4.0, **PPO)
    assert loss == pytest.approx(expected, abs=1e-4)
    assert grad[1, 3].item() == 0.0  # rho = 5 > delta with A < 0: capped, no gradient
    dual_loss, dual_grad, _ = run("ppo_clip", agg=agg, dual_clip=4.0, **PPO)
    assert loss == dual_loss and torch.equal(grad, dual_grad)
    assert run("ppo_clip", agg=agg, dual_clip=3.0, **PPO)[0] == pytest.approx(
        {"token_mean": 0.0286, "seq_mean_token_mean": -0.0958}[agg], abs=1e-4)
    with pytest.raises(ValueError, match="delta"):
        run("delta", delta=1.1, **PPO)


def test_raft_is_sft_on_positive_samples():
    loss, grad, stats = run("raft", adv=torch.tensor([1.0, 0.0], dtype=D))
    # -logp of row 0 only, over the batch's 7 tokens: (1.2040 + 0.6931 + 1.2730) / 7
    assert loss == pytest.approx((-math.log(0.30) - math.log(0.50) - math.log(0.28)) / 7, abs=1e-12)
    assert_close(grad, t([[-1 / 7] * 3, [0.0] * 4]), **TOL)
    assert stats["sft_token_frac"].item() == pytest.approx(3 / 7)


def test_top_entropy_mask_worked_example():
    h = torch.tensor([[0.10, 0.30, 2.00, 9.0], [0.05, 0.20, 1.50, 0.90]], dtype=D)  # 9.0 is padding
    keep = top_entropy_mask(h, MASK, 0.2)
    assert torch.equal(keep, torch.tensor([[0, 0, 1, 0], [0, 0, 1, 0]], dtype=torch.bool))
    loss, grad, _ = run("ppo_clip", dual_clip=None, token_weight=keep, **PPO)
    assert loss == pytest.approx(-0.0214, abs=1e-4)  # (-0.7 + 0.55) / 7: the denominator stays 7
    assert_close(grad, t([[0, 0, -0.1000], [0, 0, 0.0786, 0]]), **TOL)
    assert top_entropy_mask(h, MASK, 1.0).equal(MASK)  # quantile 1 keeps every counted token
    assert not top_entropy_mask(h, torch.zeros_like(MASK), 0.2).any()
    assert top_entropy_mask(torch.ones(2, 4), MASK, 0.2).equal(MASK)  # all tied: all kept
