"""The fused lm-head log-prob function (ablate/rl/fused_head.py): hand-computed values and gradients, and the
autograd path's numbers for every entropy mode, bias, temperature and chunking."""

import math

import pytest
import torch

from ablate.rl import losses
from ablate.rl.fused_head import linear_token_logprobs

F64 = torch.float64


def test_two_token_vocabulary_by_hand():
    # W = I, h = (0, ln 3): logits (0, ln 3), p = (1/4, 3/4); token 1
    h = torch.tensor([[0.0, math.log(3.0)]], dtype=F64, requires_grad=True)
    W = torch.eye(2, dtype=F64, requires_grad=True)
    logp, ent = linear_token_logprobs(h, W, None, torch.tensor([1]), 1.0, "grad")
    H = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.562335
    assert logp.item() == pytest.approx(math.log(0.75), abs=1e-12)
    assert ent.item() == pytest.approx(H, abs=1e-12)
    (g_h,) = torch.autograd.grad(logp.sum(), h, retain_graph=True)
    assert g_h.flatten().tolist() == pytest.approx([-0.25, 0.25], abs=1e-12)  # onehot - p (W = I)
    (g_h,) = torch.autograd.grad(ent.sum(), h)
    # dH/dz_k = -p_k (log p_k + H): (0.2060, -0.2060)
    want = [-0.25 * (math.log(0.25) + H), -0.75 * (math.log(0.75) + H)]
    assert g_h.flatten().tolist() == pytest.approx(want, abs=1e-12) and want[0] == pytest.approx(0.2060, abs=1e-4)


def test_temperature_by_hand():
    # logits (0, ln 3) at T = 0.5: z = (0, 2 ln 3), p = (1/10, 9/10)
    h = torch.tensor([[0.0, math.log(3.0)]], dtype=F64)
    logp, _ = linear_token_logprobs(h, torch.eye(2, dtype=F64), None, torch.tensor([0]), 0.5)
    assert logp.item() == pytest.approx(math.log(0.1), abs=1e-12)


@pytest.mark.parametrize("entropy", ["none", "value", "grad"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature,chunk", [(1.0, None), (0.7, 3), (1.3, 1)])
def test_values_and_gradients_equal_the_autograd_path(entropy, bias, temperature, chunk):
    torch.manual_seed(0)
    M, H, V = 7, 5, 11
    h = torch.randn(M, H, dtype=F64, requires_grad=True)
    W = torch.randn(V, H, dtype=F64, requires_grad=True)
    b = torch.randn(V, dtype=F64, requires_grad=True) if bias else None
    tok = torch.randint(V, (M,))
    g_logp, g_ent = torch.randn(M, dtype=F64), torch.randn(M, dtype=F64)
    inputs = [h, W] + ([b] if bias else [])

    def run(fn):
        logp, ent = fn()
        loss = (logp * g_logp).sum() + ((ent * g_ent).sum() if entropy == "grad" else 0.0)
        return logp, ent, torch.autograd.grad(loss, inputs)

    fused = run(lambda: linear_token_logprobs(h, W, b, tok, temperature, entropy, dtype=F64, chunk=chunk))
    plain = run(lambda: losses.chunked_token_logprobs(h, lambda x: torch.nn.functional.linear(x, W, b), tok,
                                                      temperature, entropy, chunk=chunk))
    torch.testing.assert_close(fused[0], plain[0], rtol=1e-12, atol=1e-12)
    assert (fused[1] is None) == (plain[1] is None) == (entropy == "none")
    if entropy != "none":
        torch.testing.assert_close(fused[1], plain[1], rtol=1e-12, atol=1e-12)
        assert fused[1].requires_grad == (entropy == "grad")
    for a, c in zip(fused[2], plain[2]):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)


def test_minus_infinity_logits_give_zero_terms_not_nan():
    torch.manual_seed(1)
    h = torch.randn(4, 3, dtype=F64, requires_grad=True)
    W = torch.randn(5, 3, dtype=F64)
    b = torch.tensor([0.0, 0.0, -math.inf, 0.0, 0.0], dtype=F64)  # token 2 is impossible
    tok = torch.tensor([0, 1, 3, 4])
    logp, ent = linear_token_logprobs(h, W, b, tok, 1.0, "grad")
    (g_h,) = torch.autograd.grad(logp.sum() + ent.sum(), h)
    ref_logp, ref_ent = losses.chunked_token_logprobs(h, lambda x: torch.nn.functional.linear(x, W, b), tok, 1.0,
                                                      "grad")
    (ref_g,) = torch.autograd.grad(ref_logp.sum() + ref_ent.sum(), h)
    assert torch.isfinite(ent).all() and torch.isfinite(g_h).all()
    torch.testing.assert_close(ent, ref_ent, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_h, ref_g, rtol=1e-10, atol=1e-12)


def test_a_frozen_head_gets_no_gradient_and_the_hidden_states_still_do():
    # LoRA without the lm-head among its targets: the head weight is frozen
    torch.manual_seed(2)
    h = torch.randn(6, 4, requires_grad=True)
    W = torch.randn(9, 4)
    logp, _ = linear_token_logprobs(h, W, None, torch.randint(9, (6,)), 1.0)
    logp.sum().backward()
    assert W.grad is None and h.grad is not None and h.grad.abs().sum() > 0


def test_bf16_matmul_is_close_to_fp32():
    # autocast without fp32 logits: the matmul runs in bf16, the softmax in fp32
    torch.manual_seed(3)
    h, W, tok = torch.randn(8, 16), torch.randn(50, 16) * 0.3, torch.randint(50, (8,))
    lp32, _ = linear_token_logprobs(h, W, None, tok, 1.0)
    lp16, _ = linear_token_logprobs(h, W, None, tok, 1.0, dtype=torch.bfloat16)
    assert lp16.dtype == torch.float32 and not torch.equal(lp16, lp32)
    torch.testing.assert_close(lp16, lp32, rtol=0, atol=0.05)


def test_no_rows():
    logp, ent = linear_token_logprobs(torch.zeros(0, 4), torch.randn(9, 4), None, torch.zeros(0, dtype=torch.long),
                                      1.0, "value")
    assert logp.shape == ent.shape == (0,)
