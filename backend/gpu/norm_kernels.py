"""Residual add + RMSNorm, fused (one program per token row).

The residual stream `x` is kept in fp32 across the whole step. Each layer ends with
`x += attn_out + sum_k y[b, k]` (attention's O projection and the K routed-expert outputs, already
weighted) and the next layer's `h = norm(x) * w`; one kernel does both, so the expert outputs are
summed without atomics and `x` is read and written once. `h` is written in bf16 (the GEMM input)
together with the bf16 rounding error `h_lo = bf16(h - h)` so that the router can see h at
~16-bit mantissa precision through two bf16 tensor-core dots (see moe_kernels).
"""

from __future__ import annotations

import torch

from mkcode.backend.gpu.triton_support import HAVE_TRITON, next_pow2

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _norm_store(x, w_ptr, h_ptr, hlo_ptr, row, cols, mask, eps, H: tl.constexpr):
        var = tl.sum(x * x, axis=0) / H
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        h = x * rstd * w
        hb = h.to(tl.bfloat16)
        tl.store(h_ptr + row * H + cols, hb, mask=mask)
        tl.store(hlo_ptr + row * H + cols, (h - hb.to(tl.float32)).to(tl.bfloat16), mask=mask)

    @triton.jit
    def _embed_norm_kernel(
        ids_ptr, embed_ptr, w_ptr, x_ptr, h_ptr, hlo_ptr, eps, H: tl.constexpr, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < H
        tok = tl.load(ids_ptr + row).to(tl.int64)
        x = tl.load(embed_ptr + tok * H + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(x_ptr + row * H + cols, x, mask=mask)
        _norm_store(x, w_ptr, h_ptr, hlo_ptr, row, cols, mask, eps, H)

    @triton.jit
    def _add_norm_kernel(
        x_ptr,
        a_ptr,
        y_ptr,
        w_ptr,
        h_ptr,
        hlo_ptr,
        eps,
        H: tl.constexpr,
        K: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0)
        x += tl.load(a_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
        for k in tl.static_range(K):
            x += tl.load(y_ptr + (row * K + k) * H + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(x_ptr + row * H + cols, x, mask=mask)
        _norm_store(x, w_ptr, h_ptr, hlo_ptr, row, cols, mask, eps, H)


def _norm_torch(x: torch.Tensor, w: torch.Tensor, eps: float, h: torch.Tensor, h_lo: torch.Tensor) -> None:
    hf = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    h.copy_(hf)
    h_lo.copy_(hf - h.float())


def embed_norm(
    ids: torch.Tensor,
    embed: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    x: torch.Tensor,
    h: torch.Tensor,
    h_lo: torch.Tensor,
    use_triton: bool,
) -> None:
    """x[b] = embed[ids[b]] (fp32); h, h_lo = norm(x) * w (bf16 pair)."""
    B, H = x.shape
    if use_triton:
        _embed_norm_kernel[(B,)](ids, embed, w, x, h, h_lo, eps, H=H, BLOCK=next_pow2(H), num_warps=8)
        return
    x.copy_(embed[ids].float())
    _norm_torch(x, w, eps, h, h_lo)


def add_norm(
    x: torch.Tensor,
    a: torch.Tensor,
    y: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    h: torch.Tensor,
    h_lo: torch.Tensor,
    use_triton: bool,
) -> None:
    """x += a + y.view(B, K, H).sum(1) in fp32; then h, h_lo = norm(x) * w.

    x [B, H] fp32; a [B, H] (any float dtype); y [B*K, H] (K >= 1, any float dtype)."""
    B, H = x.shape
    K = y.shape[0] // B
    if use_triton:
        _add_norm_kernel[(B,)](x, a, y, w, h, h_lo, eps, H=H, K=K, BLOCK=next_pow2(H), num_warps=8)
        return
    x.add_(a.float() + y.float().view(B, K, H).sum(1))
    _norm_torch(x, w, eps, h, h_lo)
