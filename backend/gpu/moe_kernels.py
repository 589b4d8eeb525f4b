"""Fused MoE for decode-sized batches (B <= 32): route, then per-expert gate_up+SiLU·up, then down.

Four launches per MoE layer, none of which reads an expert that no token routed to:

1. `router_logits`: logits [B, E] in fp32 from h given as a bf16 pair (h, h_lo) so that the
   top-k choice sees h at ~16-bit mantissa precision (bf16 alone flips near-tied experts).
2. `topk_route`: one program. Top-k per row, routing weights (softmax over the k, or sigmoid
   renormalised), and the expert-grouped work list: the distinct experts in ascending id
   (`uniq`, their number `nuniq`), per expert the count of pairs and the pairs themselves
   (pair p = b*K + slot, in token order). Rows >= n_real (bucket padding) route nowhere.
3. `moe_gate_up`: program (expert slot, N tile): reads the gate and up rows of its tile once,
   for all the expert's tokens (BM >= 16 rows, masked), writes act[p] = silu(g)*u (bf16).
4. `moe_down`: program (expert slot, N tile of H): y[p] = w[p] * act[p] @ down[e]^T (fp32).
   The K outputs of a token are summed by the next add_norm (no atomics, deterministic).

Grids are sized for the worst case (min(E, B*K) slots); programs past `nuniq` exit at once.
"""

from __future__ import annotations

import torch

from mkcode.backend.gpu.triton_support import DOT_F32, HAVE_TRITON, next_pow2

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _router_kernel(
        h_ptr,
        hlo_ptr,
        w_ptr,
        out_ptr,
        NB,
        H: tl.constexpr,
        E: tl.constexpr,
        BM: tl.constexpr,
        BE: tl.constexpr,
        BK: tl.constexpr,
        DOTF32: tl.constexpr,
    ):
        pe = tl.program_id(0)
        m = tl.arange(0, BM)
        mmask = m < NB
        e = pe * BE + tl.arange(0, BE)
        kk = tl.arange(0, BK)
        acc = tl.zeros([BM, BE], tl.float32)
        for k0 in range(0, H, BK):
            a_off = m[:, None] * H + k0 + kk[None, :]
            a = tl.load(h_ptr + a_off, mask=mmask[:, None], other=0.0)
            alo = tl.load(hlo_ptr + a_off, mask=mmask[:, None], other=0.0)
            w = tl.load(w_ptr + e[None, :] * H + (k0 + kk)[:, None])
            if DOTF32:
                a = a.to(tl.float32)
                alo = alo.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(a, w)
            acc += tl.dot(alo, w)
        tl.store(out_ptr + m[:, None] * E + e[None, :], acc, mask=mmask[:, None])

    @triton.jit
    def _topk_route_kernel(
        logits_ptr,
        nreal_ptr,
        topw_ptr,
        topi_ptr,
        uniq_ptr,
        nuniq_ptr,
        cnt_ptr,
        pairs_ptr,
        E: tl.constexpr,
        K: tl.constexpr,
        KP: tl.constexpr,
        BB: tl.constexpr,
        SOFTMAX: tl.constexpr,
        NORM: tl.constexpr,
    ):
        bb = tl.arange(0, BB)
        e = tl.arange(0, E)
        kk = tl.arange(0, KP)
        nreal = tl.load(nreal_ptr)
        rowvalid = bb < nreal
        work = tl.load(logits_ptr + bb[:, None] * E + e[None, :])
        sel = tl.zeros([BB, E], tl.int32)
        kpos = tl.zeros([BB, E], tl.int32)
        topv = tl.full([BB, KP], float("-inf"), tl.float32)
        topi = tl.zeros([BB, KP], tl.int32)
        for j in tl.static_range(K):
            mx = tl.max(work, axis=1)
            am = tl.min(tl.where(work == mx[:, None], e[None, :], E), axis=1)
            hit = e[None, :] == am[:, None]
            sel = tl.where(hit, 1, sel)
            kpos = tl.where(hit, j, kpos)
            work = tl.where(hit, float("-inf"), work)
            topv = tl.where(kk[None, :] == j, mx[:, None], topv)
            topi = tl.where(kk[None, :] == j, am[:, None], topi)
        kvalid = kk[None, :] < K
        if SOFTMAX:
            ex = tl.where(kvalid, tl.exp(topv - tl.max(topv, axis=1)[:, None]), 0.0)
            wts = ex / tl.sum(ex, axis=1)[:, None]
        else:
            wts = tl.where(kvalid, 1.0 / (1.0 + tl.exp(-topv)), 0.0)
            if NORM:
                wts = wts / tl.sum(wts, axis=1)[:, None]
        out_mask = rowvalid[:, None] & kvalid
        tl.store(topw_ptr + bb[:, None] * K + kk[None, :], wts, mask=out_mask)
        tl.store(topi_ptr + bb[:, None] * K + kk[None, :], topi, mask=out_mask)
        # expert-grouped work list over the real rows
        sel = tl.where(rowvalid[:, None], sel, 0)
        present = tl.max(sel, axis=0)
        slot = tl.cumsum(present, axis=0) - present
        tl.store(uniq_ptr + slot, e, mask=present > 0)
        tl.store(nuniq_ptr, tl.sum(present, axis=0))
        tl.store(cnt_ptr + slot, tl.sum(sel, axis=0), mask=present > 0)
        rank = tl.cumsum(sel, axis=0) - sel
        pair = bb[:, None] * K + kpos
        tl.store(pairs_ptr + slot[None, :] * BB + rank, pair, mask=sel > 0)

    @triton.jit
    def _moe_gate_up_kernel(
        h_ptr,
        wgu_ptr,
        uniq_ptr,
        nuniq_ptr,
        cnt_ptr,
        pairs_ptr,
        act_ptr,
        H: tl.constexpr,
        I: tl.constexpr,
        K: tl.constexpr,
        BB: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        DOTF32: tl.constexpr,
    ):
        s = tl.program_id(0)
        n = tl.program_id(1)
        if s < tl.load(nuniq_ptr):
            ex = tl.load(uniq_ptr + s).to(tl.int64)
            cnt = tl.load(cnt_ptr + s)
            m = tl.arange(0, BM)
            mrow = m < cnt
            pair = tl.load(pairs_ptr + s * BB + m, mask=mrow, other=0)
            tok = pair // K
            nn = n * BN + tl.arange(0, BN)
            kk = tl.arange(0, BK)
            wg_base = wgu_ptr + ex * (2 * I * H) + nn[None, :] * H
            wu_base = wg_base + I * H
            acc_g = tl.zeros([BM, BN], tl.float32)
            acc_u = tl.zeros([BM, BN], tl.float32)
            for k0 in range(0, H, BK):
                a = tl.load(h_ptr + tok[:, None] * H + (k0 + kk)[None, :], mask=mrow[:, None], other=0.0)
                wg = tl.load(wg_base + (k0 + kk)[:, None])
                wu = tl.load(wu_base + (k0 + kk)[:, None])
                if DOTF32:
                    a = a.to(tl.float32)
                    wg = wg.to(tl.float32)
                    wu = wu.to(tl.float32)
                acc_g += tl.dot(a, wg)
                acc_u += tl.dot(a, wu)
            act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
            tl.store(
                act_ptr + pair[:, None] * I + nn[None, :],
                act.to(act_ptr.dtype.element_ty),
                mask=mrow[:, None],
            )

    @triton.jit
    def _moe_down_kernel(
        act_ptr,
        wd_ptr,
        topw_ptr,
        uniq_ptr,
        nuniq_ptr,
        cnt_ptr,
        pairs_ptr,
        y_ptr,
        H: tl.constexpr,
        I: tl.constexpr,
        BB: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        DOTF32: tl.constexpr,
    ):
        s = tl.program_id(0)
        n = tl.program_id(1)
        if s < tl.load(nuniq_ptr):
            ex = tl.load(uniq_ptr + s).to(tl.int64)
            cnt = tl.load(cnt_ptr + s)
            m = tl.arange(0, BM)
            mrow = m < cnt
            pair = tl.load(pairs_ptr + s * BB + m, mask=mrow, other=0)
            nn = n * BN + tl.arange(0, BN)
            kk = tl.arange(0, BK)
            w_base = wd_ptr + ex * (H * I) + nn[None, :] * I
            acc = tl.zeros([BM, BN], tl.float32)
            for k0 in range(0, I, BK):
                a = tl.load(act_ptr + pair[:, None] * I + (k0 + kk)[None, :], mask=mrow[:, None], other=0.0)
                w = tl.load(w_base + (k0 + kk)[:, None])
                if DOTF32:
                    a = a.to(tl.float32)
                    w = w.to(tl.float32)
                acc += tl.dot(a, w)
            wt = tl.load(topw_ptr + pair, mask=mrow, other=0.0)
            acc = acc * wt[:, None]
            tl.store(y_ptr + pair[:, None] * H + nn[None, :], acc, mask=mrow[:, None])


class MoeWorkspace:
    """Buffers for one MoE layer at up to `max_batch` rows (shared by all layers and buckets)."""

    def __init__(self, max_batch: int, hidden: int, inter: int, num_experts: int, top_k: int, device):
        f32, i32 = torch.float32, torch.int32
        self.logits = torch.zeros(max_batch, num_experts, device=device, dtype=f32)
        self.topw = torch.zeros(max_batch * top_k, device=device, dtype=f32)
        self.topi = torch.zeros(max_batch * top_k, device=device, dtype=i32)
        self.uniq = torch.zeros(num_experts, device=device, dtype=i32)
        self.cnt = torch.zeros(num_experts, device=device, dtype=i32)
        self.pairs = torch.zeros(num_experts * max_batch, device=device, dtype=i32)
        self.act = torch.zeros(max_batch * top_k, inter, device=device, dtype=torch.bfloat16)
        self.y = torch.zeros(max_batch * top_k, hidden, device=device, dtype=f32)


def _tiles(bucket: int) -> tuple[int, int, int]:
    """(BM, BN gate_up, BN down): rows padded to >= 16 for the tensor cores; narrow N tiles at
    small batches so that 8 experts still spread over every SM."""
    bm = max(16, next_pow2(bucket))
    return bm, 16 if bucket <= 4 else 32, 32


def moe_decode(
    h: torch.Tensor,
    h_lo: torch.Tensor,
    n_real: torch.Tensor,
    router: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    softmax: bool,
    norm_topk: bool,
    ws: MoeWorkspace,
    nuniq: torch.Tensor,
    use_triton: bool,
) -> torch.Tensor:
    """Routed-expert output for a bucket of B rows; returns y [B*K, H] fp32 (row b*K+k is token b's
    k-th expert output times its routing weight). `nuniq` (int32 [1]) receives the number of
    distinct experts routed to (the bytes this layer reads)."""
    B, H = h.shape
    E, I2, _ = gate_up.shape
    I = I2 // 2
    bb = next_pow2(B)
    assert bb == B, "the graph backend pads batches to power-of-two buckets"
    logits, y = ws.logits[:B], ws.y[: B * top_k]
    if use_triton:
        bm, bn_gu, bn_d = _tiles(B)
        _router_kernel[(E // 16,)](
            h, h_lo, router, logits, B, H=H, E=E, BM=bm, BE=16, BK=256, DOTF32=DOT_F32, num_warps=4
        )
        _topk_route_kernel[(1,)](
            logits,
            n_real,
            ws.topw,
            ws.topi,
            ws.uniq,
            nuniq,
            ws.cnt,
            ws.pairs,
            E=E,
            K=top_k,
            KP=next_pow2(top_k),
            BB=B,
            SOFTMAX=softmax,
            NORM=norm_topk,
            num_warps=4,
        )
        slots = min(E, B * top_k)
        _moe_gate_up_kernel[(slots, I // bn_gu)](
            h,
            gate_up,
            ws.uniq,
            nuniq,
            ws.cnt,
            ws.pairs,
            ws.act,
            H=H,
            I=I,
            K=top_k,
            BB=B,
            BM=bm,
            BN=bn_gu,
            BK=128,
            DOTF32=DOT_F32,
            num_warps=4,
            num_stages=4,
        )
        _moe_down_kernel[(slots, H // bn_d)](
            ws.act,
            down,
            ws.topw,
            ws.uniq,
            nuniq,
            ws.cnt,
            ws.pairs,
            y,
            H=H,
            I=I,
            BB=B,
            BM=bm,
            BN=bn_d,
            BK=128,
            DOTF32=DOT_F32,
            num_warps=4,
            num_stages=4,
        )
        return y
    # torch twin (same outputs, same work-list layout)
    logits.copy_((h.float() + h_lo.float()) @ router.float().t())
    topv, topi = torch.topk(logits, top_k, dim=-1)
    if softmax:
        wts = torch.softmax(topv, -1)
    else:
        wts = torch.sigmoid(topv)
        if norm_topk:
            wts = wts / wts.sum(-1, keepdim=True)
    nr = int(n_real)
    ws.topw[: B * top_k].copy_(wts.reshape(-1))
    ws.topi[: B * top_k].copy_(topi.reshape(-1).int())
    ids = topi[:nr].reshape(-1)
    experts = torch.unique(ids)
    nuniq.fill_(len(experts))
    for s, ex in enumerate(experts.tolist()):
        pairs = (ids == ex).nonzero()[:, 0]
        ws.uniq[s] = ex
        ws.cnt[s] = len(pairs)
        ws.pairs[s * B : s * B + len(pairs)] = pairs.int()
        x = h[pairs // top_k]
        gu = x @ gate_up[ex].t()
        act = (torch.nn.functional.silu(gu[:, :I].float()) * gu[:, I:].float()).to(ws.act.dtype)
        ws.act[pairs] = act
        y[pairs] = (act @ down[ex].t()).float() * ws.topw[pairs][:, None]
    return y
