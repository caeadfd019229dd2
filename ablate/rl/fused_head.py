"""Token log-probs and entropies straight from final hidden states and a linear lm-head, fused.

    logits z = (h W^T + b) / temperature         [M, V], one chunk of rows at a time, never all M rows
    logp     = z[token] - logsumexp(z)          [M]
    entropy  = logsumexp(z) - sum_j p_j z_j     [M]    (p = softmax(z))

`losses.chunked_token_logprobs` computes the same numbers through autograd (each chunk checkpointed), which
at a real vocabulary (V ~ 150k) holds ~5 chunk-sized temporaries in backward and allocates fresh ones for
every chunk. Here the backward is written out, so a chunk needs two [rows, V] buffers, allocated once per
call and reused (fresh pages of a large allocation cost the CPU a page fault each). With g = dL/dlogp and
e = dL/dentropy per row, the gradient at the logits is (Liger-Kernel's fused linear cross-entropy does the
same for the cross-entropy: Hsu et al. 2024, arXiv:2410.10989)

    dL/dz_j = g (1[j = token] - p_j) - e p_j (log p_j + entropy)

and dL/dh = (dL/dz / temperature) W, dL/dW = (dL/dz / temperature)^T h, dL/db = column sums; the backward
recomputes each chunk's logits (as the checkpoint does) instead of storing them.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

INF = float("inf")
CHUNK_ELEMENTS = 2**24  # logits per chunk: 64 MiB in fp32, over glibc's 32 MiB mmap threshold (docs/scale.md)


def logits_into(out: Tensor, h: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """out[:n] = (h W^T + b) / temperature, in out's dtype; [n, H] -> [n, V] view of out."""
    z = out[:h.shape[0]]
    if h.dtype == z.dtype:
        if bias is None:
            torch.mm(h, weight.t(), out=z)
        else:
            torch.addmm(bias, h, weight.t(), out=z)
    else:  # a bf16 matmul (autocast without fp32 logits): the product is cast up
        z.copy_(torch.nn.functional.linear(h, weight, bias))
    if temperature != 1.0:
        z.div_(temperature)
    return z


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, entropy, dtype, chunk):
        # hidden [M,H], weight [V,H], bias [V] or None, tokens [M] -> logp [M], entropy [M] (or empty)
        out_dtype = torch.promote_types(dtype, torch.float32)
        M, V = hidden.shape[0], weight.shape[0]
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        z_buf = hidden.new_empty(min(chunk, M), V, dtype=out_dtype)
        e_buf = torch.empty_like(z_buf)
        logp = hidden.new_empty(M, dtype=out_dtype)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if entropy != "none" else logp.new_empty(0)
        with torch.no_grad(), _no_autocast(hidden):
            for s in range(0, M, chunk):
                h, tok = hidden[s:s + chunk].to(dtype), tokens[s:s + chunk, None]
                z = logits_into(z_buf, h, w, b, temperature)  # [n, V]
                m = z.amax(-1, keepdim=True)  # [n, 1]
                e = torch.sub(z, m, out=e_buf[:len(z)]).exp_()  # exp(z - m)
                total = e.sum(-1, keepdim=True)  # [n, 1]
                lse[s:s + chunk] = (m + total.log()).squeeze(-1)
                logp[s:s + chunk] = z.gather(-1, tok).squeeze(-1) - lse[s:s + chunk]
                if entropy != "none":  # H = lse - sum p z
                    pz = e.mul_(z).sum(-1, keepdim=True) / total
                    if pz.isnan().any():  # a z = -inf (p = 0): its p z is 0, not 0 * -inf = NaN; rare, so redone
                        pz = torch.sub(z, m, out=e).exp_().mul_(z).nan_to_num_(0.0, INF, -INF).sum(-1, keepdim=True) / total
                    ent[s:s + chunk] = lse[s:s + chunk] - pz.squeeze(-1)
        ctx.save_for_backward(hidden, weight, bias, tokens, lse, ent if entropy == "grad" else None)
        ctx.temperature, ctx.dtype, ctx.chunk = temperature, dtype, chunk
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, bias, tokens, lse, ent = ctx.saved_tensors
        T, dtype, chunk = ctx.temperature, ctx.dtype, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        out_dtype, V = lse.dtype, weight.shape[0]
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        z_buf = hidden.new_empty(min(chunk, len(lse)), V, dtype=out_dtype)
        p_buf = torch.empty_like(z_buf)
        g_h = torch.empty(hidden.shape, dtype=out_dtype, device=hidden.device) if need_h else None
        g_w = torch.zeros(weight.shape, dtype=out_dtype, device=weight.device) if need_w else None
        g_b = torch.zeros(V, dtype=out_dtype, device=weight.device) if need_b else None
        g_logp = g_logp.to(out_dtype)
        with torch.no_grad(), _no_autocast(hidden):
            for s in range(0, len(lse), chunk):
                h, g = hidden[s:s + chunk].to(dtype), g_logp[s:s + chunk, None]  # [n, H], [n, 1]
                logp = logits_into(z_buf, h, w, b, T).sub_(lse[s:s + chunk, None])  # log p, [n, V]
                p = torch.exp(logp, out=p_buf[:len(h)])
                if ent is not None and g_ent is not None:  # p's coefficient: -g - e (log p + H)
                    e = g_ent[s:s + chunk, None].to(out_dtype)
                    p.mul_(logp.add_(ent[s:s + chunk, None]).mul_(-e).sub_(g)).nan_to_num_(0.0, INF, -INF)
                else:  # (p = 0 where log p = -inf: its product is 0, not 0 * inf = NaN)
                    p.mul_(-g)
                grad_z = p.scatter_add_(1, tokens[s:s + chunk, None], g)  # dL/dz [n, V]
                if T != 1.0:
                    grad_z.div_(T)  # dL/d(h W^T + b)
                if need_h:
                    g_h[s:s + chunk] = grad_z.to(dtype) @ w  # [n, H]
                if need_w:
                    g_w.addmm_(grad_z.t(), h.to(out_dtype))  # [V, n] @ [n, H]
                if need_b:
                    g_b += grad_z.sum(0)
        cast = lambda x, like: None if x is None else x.to(like.dtype)  # noqa: E731
        return cast(g_h, hidden), cast(g_w, weight), cast(g_b, bias), None, None, None, None, None


def _no_autocast(like: Tensor):
    """Our own dtypes inside: autocast would turn the fp32 matmuls (fp32 logits) into bf16 ones."""
    return torch.autocast(like.device.type, enabled=False)


def linear_token_logprobs(
    hidden: Tensor,  # [M,H] final hidden states at the scored positions
    weight: Tensor,  # [V,H] the lm-head's weight
    bias: Tensor | None,  # [V] or None
    tokens: Tensor,  # [M] token ids
    temperature: float,
    entropy: Literal["none", "value", "grad"] = "none",
    dtype: torch.dtype = torch.float32,  # the matmul's dtype (bf16 under autocast without fp32 logits)
    chunk: int | None = None,  # rows per chunk (default CHUNK_ELEMENTS // V)
) -> tuple[Tensor, Tensor | None]:
    """(logp [M], entropy [M] or None): `losses.chunked_token_logprobs` for a linear head, with the same
    `entropy` modes ("grad": differentiable; "value": computed, no gradient flows through it; "none")."""
    if chunk is None:
        chunk = max(1, CHUNK_ELEMENTS // weight.shape[0])
    dtype = torch.promote_types(dtype, hidden.dtype) if hidden.dtype == torch.float64 else dtype
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.promote_types(dtype, torch.float32))
        return empty, (empty if entropy != "none" else None)
    logp, ent = _LinearLogprobs.apply(hidden, weight, bias, tokens.long(), float(temperature), entropy, dtype, chunk)
    if entropy == "none":
        return logp, None
    return logp, (ent if entropy == "grad" else ent.detach())
