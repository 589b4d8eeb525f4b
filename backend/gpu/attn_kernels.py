"""Decode attention over the paged KV pool: RoPE + KV write, split-KV attention, LSE combine.

Pool layout (kv/layout.py): `[num_pages, 2, Hkv, PAGE, d]`, block tables `[B, P]` per layer
(int32, NO_PAGE = -1). A query at position `pos` sees keys `[start, pos]`, where
`start = max(0, pos - window + 1)` on sliding layers and 0 on full layers; pages before `start`
may be released (NO_PAGE) and are never touched.

Split-KV: program (b, kv-head, split) walks a contiguous run of the row's visible pages with all
the GQA group's query heads as one tile (group padded to 16 rows for the tensor cores) and writes
a normalised partial output and its log-sum-exp (base 2); the combine kernel merges the splits.
The number of splits is a per-bucket constant (so the step can be captured in a CUDA graph); the
pages per split follow each row's length at run time.
"""

from __future__ import annotations

import math

import torch

from mkcode.backend.gpu.triton_support import DOT_F32, HAVE_TRITON, next_pow2
from mkcode.backend.kv.layout import PAGE_SIZE

LOG2E = 1.4426950408889634
FULL_WINDOW = 1 << 30  # 'no window' for the kernels: start = max(pos - 2**30 + 1, 0) = 0

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_kv_kernel(
        qkv_ptr,
        pos_ptr,
        bt_ptr,
        pool_ptr,
        q_ptr,
        inv_freq_ptr,
        P,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        D: tl.constexpr,
        PAGE: tl.constexpr,
        ROPE: tl.constexpr,
    ):
        b = tl.program_id(0)
        head = tl.program_id(1)  # 0..HQ-1: query heads; HQ..HQ+HKV-1: kv heads
        W: tl.constexpr = (HQ + 2 * HKV) * D
        HALF: tl.constexpr = D // 2
        i = tl.arange(0, HALF)
        pos = tl.load(pos_ptr + b).to(tl.int32)
        src = qkv_ptr + b * W + head * D
        even = tl.load(src + 2 * i).to(tl.float32)
        odd = tl.load(src + 2 * i + 1).to(tl.float32)
        if ROPE:
            ang = pos.to(tl.float32) * tl.load(inv_freq_ptr + i)
            c = tl.cos(ang)
            s = tl.sin(ang)
            even, odd = even * c - odd * s, even * s + odd * c
        if head < HQ:
            dst = q_ptr + (b * HQ + head) * D
            tl.store(dst + 2 * i, even.to(tl.bfloat16))
            tl.store(dst + 2 * i + 1, odd.to(tl.bfloat16))
        else:
            kvh = head - HQ
            page = tl.load(bt_ptr + b * P + pos // PAGE).to(tl.int64)
            if page >= 0:
                slot = pos % PAGE
                kdst = pool_ptr + (((page * 2) * HKV + kvh) * PAGE + slot) * D
                vdst = pool_ptr + (((page * 2 + 1) * HKV + kvh) * PAGE + slot) * D
                tl.store(kdst + 2 * i, even.to(pool_ptr.dtype.element_ty))
                tl.store(kdst + 2 * i + 1, odd.to(pool_ptr.dtype.element_ty))
                j = tl.arange(0, D)
                v = tl.load(qkv_ptr + b * W + (HQ + HKV + kvh) * D + j)
                tl.store(vdst + j, v.to(pool_ptr.dtype.element_ty))

    @triton.jit
    def _attn_split_kernel(
        q_ptr,
        pool_ptr,
        bt_ptr,
        pos_ptr,
        o_ptr,
        lse_ptr,
        P,
        window,
        scale_log2,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        G: tl.constexpr,
        GP: tl.constexpr,
        D: tl.constexpr,
        PAGE: tl.constexpr,
        S: tl.constexpr,
        DOTF32: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        s = tl.program_id(2)
        pos = tl.load(pos_ptr + b).to(tl.int32)
        start = tl.maximum(pos - window + 1, 0)  # full layers pass window = 2**30
        first_pg = start // PAGE
        last_pg = pos // PAGE
        per = (last_pg - first_pg + S) // S  # ceil(n / S) with n = last - first + 1
        pg0 = first_pg + s * per
        pg1 = tl.minimum(pg0 + per, last_pg + 1)

        g = tl.arange(0, GP)
        gmask = g < G
        d = tl.arange(0, D)
        t = tl.arange(0, PAGE)
        q = tl.load(
            q_ptr + ((b * HQ + kvh * G + g) * D)[:, None] + d[None, :], mask=gmask[:, None], other=0.0
        )
        if DOTF32:
            q = q.to(tl.float32)
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        for pg in range(pg0, pg1):
            page = tl.load(bt_ptr + b * P + pg).to(tl.int64)
            ok = page >= 0
            kbase = pool_ptr + ((page * 2) * HKV + kvh) * PAGE * D
            vbase = pool_ptr + ((page * 2 + 1) * HKV + kvh) * PAGE * D
            tile = t[:, None] * D + d[None, :]
            tmask = (t[:, None] >= 0) & ok
            k = tl.load(kbase + tile, mask=tmask, other=0.0)
            v = tl.load(vbase + tile, mask=tmask, other=0.0)
            if DOTF32:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            sc = tl.dot(q, tl.trans(k)) * scale_log2  # [GP, PAGE], log2 domain
            kpos = pg * PAGE + t
            vis = (kpos >= start) & (kpos <= pos) & ok
            sc = tl.where(vis[None, :], sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(sc - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if DOTF32:
                pv = tl.dot(p, v)
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        row = (b * HQ + kvh * G + g) * S + s
        tl.store(o_ptr + row[:, None] * D + d[None, :], out, mask=gmask[:, None])
        tl.store(lse_ptr + row, lse, mask=gmask)

    @triton.jit
    def _attn_combine_kernel(o_ptr, lse_ptr, out_ptr, HQ: tl.constexpr, D: tl.constexpr, S: tl.constexpr):
        b = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.arange(0, S)
        d = tl.arange(0, D)
        row = (b * HQ + h) * S + s
        lse = tl.load(lse_ptr + row)
        m = tl.max(lse, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp2(lse - m_safe)
        tot = tl.sum(w, axis=0)
        w = w / tl.where(tot == 0.0, 1.0, tot)
        o = tl.load(o_ptr + row[:, None] * D + d[None, :])
        out = tl.sum(o * w[:, None], axis=0)
        tl.store(out_ptr + (b * HQ + h) * D + d, out.to(out_ptr.dtype.element_ty))


def num_splits(bucket: int, num_kv_heads: int, target_programs: int = 256) -> int:
    """Splits per (row, kv head): enough programs to cover the SMs twice, 4..64, a power of 2."""
    want = max(1, -(-target_programs // (bucket * num_kv_heads)))
    return max(4, min(64, next_pow2(want)))


def rope_kv_write(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    pool: torch.Tensor,
    q_out: torch.Tensor,
    inv_freq: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    rope: bool,
    use_triton: bool,
) -> None:
    """Split qkv [B, (Hq+2Hkv)*d]; RoPE (interleaved pairs) on q and k when `rope`; q -> q_out
    [B, Hq, d]; k, v -> the pool at each row's position (rows whose page is NO_PAGE are skipped)."""
    B = qkv.shape[0]
    D = q_out.shape[-1]
    if use_triton:
        _rope_kv_kernel[(B, num_heads + num_kv_heads)](
            qkv,
            positions,
            block_table,
            pool,
            q_out,
            inv_freq,
            block_table.stride(0),
            HQ=num_heads,
            HKV=num_kv_heads,
            D=D,
            PAGE=PAGE_SIZE,
            ROPE=rope,
            num_warps=1,
        )
        return
    q = qkv[:, : num_heads * D].float().view(B, num_heads, D)
    k = qkv[:, num_heads * D : (num_heads + num_kv_heads) * D].float().view(B, num_kv_heads, D)
    v = qkv[:, (num_heads + num_kv_heads) * D :].view(B, num_kv_heads, D)
    if rope:
        ang = positions.float()[:, None] * inv_freq[None, :]
        c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]

        def rot(x: torch.Tensor) -> torch.Tensor:
            e, o = x[..., 0::2], x[..., 1::2]
            return torch.stack((e * c - o * s, e * s + o * c), dim=-1).flatten(-2)

        q, k = rot(q), rot(k)
    q_out.copy_(q)
    pages = block_table.long().gather(1, (positions // PAGE_SIZE).long()[:, None])[:, 0]
    ok = pages >= 0
    rows = ok.nonzero()[:, 0]
    slots = (positions % PAGE_SIZE).long()
    pool[pages[rows], 0, :, slots[rows]] = k[rows].to(pool.dtype)
    pool[pages[rows], 1, :, slots[rows]] = v[rows].to(pool.dtype)


def paged_decode_attention(
    q: torch.Tensor,
    pool: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    window: int | None,
    o_part: torch.Tensor,
    lse_part: torch.Tensor,
    out: torch.Tensor,
    use_triton: bool,
) -> None:
    """out [B, Hq*d] = softmax(q k^T / sqrt(d)) v over each row's visible keys (the new token's K/V
    already written). o_part [B, Hq, S, d] fp32 and lse_part [B, Hq, S] fp32 are the split-KV
    workspace; S = o_part.shape[2]."""
    B, HQ, D = q.shape
    HKV = pool.shape[2]
    G = HQ // HKV
    S = o_part.shape[2]
    w = window or 0
    if use_triton:
        _attn_split_kernel[(B, HKV, S)](
            q,
            pool,
            block_table,
            positions,
            o_part,
            lse_part,
            block_table.stride(0),
            w if w > 0 else FULL_WINDOW,
            LOG2E / math.sqrt(D),
            HQ=HQ,
            HKV=HKV,
            G=G,
            GP=max(16, next_pow2(G)),
            D=D,
            PAGE=PAGE_SIZE,
            S=S,
            DOTF32=DOT_F32,
            num_warps=4,
            num_stages=2,
        )
        _attn_combine_kernel[(B, HQ)](o_part, lse_part, out, HQ=HQ, D=D, S=S, num_warps=4)
        return
    for b in range(B):  # torch twin: one row at a time, by gathering the visible keys
        pos = int(positions[b])
        start = 0 if not w else max(0, pos - w + 1)
        kpos = torch.arange(start, pos + 1, device=pool.device)
        pages = block_table[b].long()[kpos // PAGE_SIZE]
        if bool((pages < 0).any()):
            out[b].zero_()
            continue
        k = pool[pages, 0, :, kpos % PAGE_SIZE].float()  # [S, Hkv, d]
        v = pool[pages, 1, :, kpos % PAGE_SIZE].float()
        qf = q[b].float().view(HKV, G, D)
        sc = torch.einsum("kgd,skd->kgs", qf, k) / math.sqrt(D)
        o = torch.einsum("kgs,skd->kgd", sc.softmax(-1), v)
        out[b].copy_(o.reshape(HQ * D))
