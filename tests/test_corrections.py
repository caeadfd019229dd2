"""IS corrections and mismatch metrics on the shared test batch (N=2, T=4; row 0 has 3 tokens) with the
behaviour log-probs of the worked example: log w = old_logp - behav_logp. Tolerance 1e-4."""

import math

import pytest
import torch
from torch.testing import assert_close

from ablate.rl.corrections import IS_CORRECTIONS, mismatch_metrics
from ablate.rl.losses import LossParams, ppo_clip

D = torch.float64
TOL = {"atol": 1e-4, "rtol": 0}
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
OLD_P = [[0.20, 0.50, 0.40, 1.0], [0.10, 0.50, 0.25, 0.10]]   # the pad holds p = 1
NEW_P = [[0.30, 0.50, 0.28, 1.0], [0.13, 0.30, 0.275, 0.50]]
LOG_W = [[-0.05, 0.10, 1.10, 0.0], [0.00, -0.50, 0.05, -0.02]]
OLD = torch.tensor(OLD_P, dtype=D).log()
LOGP = torch.tensor(NEW_P, dtype=D).log()
BEHAV = OLD - torch.tensor(LOG_W, dtype=D)
ADV = torch.tensor([1.0, -0.5], dtype=D)
W = [[0.9512, 1.1052, 3.0042, 1.0], [1.0000, 0.6065, 1.0513, 0.9802]]


def t(rows):
    return torch.tensor(rows, dtype=D)


def apply(name, **params):
    params = {"cap": 2.0, "lo": None, "hi": None, **params}
    return IS_CORRECTIONS[name](OLD, BEHAV, MASK, **params)


def test_behaviour_logp_of_the_worked_example():
    assert_close(BEHAV[MASK], t([-1.5594, -0.7931, -2.0163, -2.3026, -0.1931, -1.4363, -2.2826]), **TOL)


@pytest.mark.parametrize("name, params, weights, keep", [
    ("none", {}, [[1, 1, 1, 1], [1, 1, 1, 1]], MASK),
    ("tis", {"cap": 2.0}, [[0.9512, 1.1052, 2.0000, 1], [1.0000, 0.6065, 1.0513, 0.9802]], MASK),
    ("mis", {"cap": 2.0, "lo": 0.5}, [[0.9512, 1.1052, 0.0, 1], [1.0000, 0.6065, 1.0513, 0.9802]],
     torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)),
    ("mis", {"cap": 2.0}, [[0.9512, 1.1052, 0.0, 1], [1.0000, 0.6065, 1.0513, 0.9802]],  # one-sided
     torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)),
    ("icepop", {"lo": 0.5, "hi": 5.0}, W, MASK),  # nothing outside the band: w itself
    ("icepop", {"lo": 0.61, "hi": 5.0}, [[0.9512, 1.1052, 3.0042, 1], [1.0, 0.0, 1.0513, 0.9802]],
     torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)),
    ("seq_tis", {"cap": 2.0}, [[2.0, 2.0, 2.0, 1], [0.6250] * 4], MASK),
    ("seq_mis", {"cap": 2.0}, [[0.0, 0.0, 0.0, 1], [0.6250] * 4],
     torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)),
    ("seq_geo_mask", {"lo": 0.8, "hi": 1.25}, [[0.0, 0.0, 0.0, 1], [1.0] * 4],
     torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)),
    ("seq_geo_mask", {"lo": 0.99, "hi": 1.01}, [[0.0, 0.0, 0.0, 1], [0.0] * 4], torch.zeros(2, 4, dtype=torch.bool)),
])
def test_worked_example_weights_and_rejections(name, params, weights, keep):
    w_hat, kept, stats = apply(name, **params)
    assert_close(w_hat, t(weights), **TOL)
    assert torch.equal(kept, keep)
    cap_frac = {"tis": 1 / 7, "seq_tis": 3 / 7}.get(name, 0.0)  # tokens whose weight was truncated
    assert stats["is_cap_frac"].item() == pytest.approx(cap_frac, abs=1e-12)


def test_worked_example_row_ratios():
    # W = prod_t w = [3.1582, 0.6250] (the seq_tis cap shows row 1); G = exp(mean log w) = [1.4672, 0.8891]
    w_hat, _, _ = apply("seq_tis", cap=100.0)
    assert_close(w_hat[:, 0], t([3.1582, 0.6250]), **TOL)
    for lo, hi, keep in ((1.4671, 1.4673, [True, False]), (0.8890, 0.8892, [False, True])):
        _, kept, _ = apply("seq_geo_mask", lo=lo, hi=hi)
        assert kept[:, 0].tolist() == keep


def test_worked_example_mismatch_metrics():
    w_hat, keep, _ = apply("tis", cap=2.0)
    out = mismatch_metrics(OLD, BEHAV, MASK, w_hat, keep, lag=torch.tensor([2, 2]))
    expected = {"kl_k1": -0.0971, "kl_k3": 0.1455, "chi2_token": 1.0836, "chi2_seq": 4.1824,
                "ess_frac": 0.7411, "ess_frac_seq": 0.6904, "ess_frac_corrected": 0.8847,
                "weight_mean": sum(W[0][:3] + W[1]) / 7, "weight_max": 3.0042,
                "rejected_token_frac": 0.0, "rejected_seq_frac": 0.0,
                "max_abs_prob_diff": (0.2669 + 0.3244) / 2, "lag_mean": 2.0, "lag_max": 2.0}
    assert set(out) == set(expected)
    for k, v in expected.items():
        assert out[k].item() == pytest.approx(v, abs=1e-4), k
    # ESS in samples: 5.1878 tokens of 7, 1.3809 rows of 2
    assert 7 * out["ess_frac"].item() == pytest.approx(5.1878, abs=1e-4)
    assert 2 * out["ess_frac_seq"].item() == pytest.approx(1.3809, abs=1e-4)
    _, keep, _ = apply("seq_geo_mask", lo=0.8, hi=1.25)  # row 0 rejected: 3 of 7 tokens, 1 of 2 rows
    out = mismatch_metrics(OLD, BEHAV, MASK, torch.ones(2, 4, dtype=D), keep, lag=torch.zeros(2))
    assert out["rejected_token_frac"].item() == pytest.approx(3 / 7, abs=1e-12)
    assert out["rejected_seq_frac"].item() == pytest.approx(0.5, abs=1e-12)


def _loss(w_hat=None, keep=MASK, old=OLD):
    logp = LOGP.clone().requires_grad_(True)
    loss, _ = ppo_clip(logp, old, ADV, keep, agg="token_mean", max_len=4, params=LossParams(eps_low=0.2, eps_high=0.2),
                       token_weight=w_hat)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, logp


def test_decoupled_ppo_times_token_tis():
    w_hat, keep, _ = apply("tis", cap=2.0)
    loss, _, _ = _loss(w_hat, keep)
    assert loss.item() == pytest.approx(0.0392, abs=1e-4)
    # the per-token losses: L_TM * 7 is their sum; each one is w_hat * the plain PPO loss
    ppo = t([[-1.2000, -1.0000, -0.7000, 0], [0.6500, 0.4000, 0.5500, 2.5000]])
    per_token = t([[-1.1415, -1.1052, -1.4000, 0], [0.6500, 0.2426, 0.5782, 2.4505]])
    assert_close(ppo * w_hat * MASK, per_token, **TOL)
    assert loss.item() == pytest.approx(per_token.sum().item() / 7, abs=1e-4)


def test_bypass_mode_arithmetic():
    # bypass (behav as the PPO anchor, no separate weight): rho_b = pi/pi_behav, L_TM = 0.0819
    rho_b = (LOGP - BEHAV).exp()
    assert_close(rho_b[MASK], t([1.4268, 1.1052, 2.1029, 1.3000, 0.3639, 1.1564, 4.9010]), **TOL)
    loss, _, _ = _loss(old=BEHAV)
    assert loss.item() == pytest.approx(0.0819, abs=1e-4)


def test_rejection_edits_the_denominator():
    # token MIS rejects (0, 2): the mean is over the 6 kept tokens, not 7 (the tokens are not just zeroed)
    w_hat, keep, _ = apply("mis", cap=2.0)
    loss, _, _ = _loss(w_hat, keep)
    ppo = t([[-1.2000, -1.0000, -0.7000, 0], [0.6500, 0.4000, 0.5500, 2.5000]])
    assert loss.item() == pytest.approx((ppo * w_hat * keep).sum().item() / 6, abs=1e-4)


def test_registry_is_the_configs_names():
    import typing

    from ablate.config import ISCorrection

    assert list(IS_CORRECTIONS) == list(typing.get_args(ISCorrection))
    assert math.isclose(float(apply("tis", cap=3.0)[0][0, 2]), 3.0, abs_tol=1e-12)  # TRL's cap: w = 3.0042 > 3
