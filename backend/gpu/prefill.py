"""GPU prefill: the engine's `prefill_fn(token_ids, positions, segments) -> logits`, chunked.

Per layer over the flat token batch (all segments together):
- h = norm(x) with x the fp32 residual stream; QKV as one GEMM; interleaved RoPE.
- per segment: the chunk's K/V written into its pages, the visible window gathered back from
  the pages (sliding layers start at pos - window + 1), attention through
  `scaled_dot_product_attention` with a causal + window mask by absolute position.
- MoE as grouped GEMM: fp32 router, top-k, token-expert pairs sorted by expert, then
  `torch._grouped_mm` for gate_up and for down (one launch each, every expert at once), SiLU·up
  between, routing-weighted scatter-add back to tokens.

Segments whose KV store is not the engine's paged view (e.g. the reference's DenseKVCache) go
through `kv.append`, so the same function runs over any KVStore.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mkcode.backend.gpu.prepared import PreparedModel, prepare
from mkcode.backend.kv.layout import PAGE_SIZE, first_visible_position
from mkcode.backend.kv.sequence import PagedKVView
from mkcode.backend.model import ops
from mkcode.backend.model.reference import ReferenceModel, Segment


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved-pair RoPE on x [T, heads, d] (fp32 math), cos/sin [T, 1, d/2]."""
    xf = x.float()
    e, o = xf[..., 0::2], xf[..., 1::2]
    return torch.stack((e * cos - o * sin, e * sin + o * cos), dim=-1).flatten(-2)


def grouped_experts(
    h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """Routed experts for T tokens as two grouped GEMMs; returns [T, H] fp32.

    h [T, H] bf16; weights [T, k] fp32; ids [T, k]; gate_up [E, 2I, H]; down [E, H, I]."""
    T, k = ids.shape
    E, I2, H = gate_up.shape
    I = I2 // 2
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tok = order // k
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    a = h[tok]
    gu = torch._grouped_mm(a, gate_up.transpose(1, 2), offs=offs)
    act = (F.silu(gu[:, :I].float()) * gu[:, I:].float()).to(h.dtype)
    y = torch._grouped_mm(act, down.transpose(1, 2), offs=offs)
    out = torch.zeros(T, H, device=h.device, dtype=torch.float32)
    out.index_add_(0, tok, y.float() * weights.reshape(-1)[order, None])
    return out


class GpuPrefill:
    """Callable with the engine's prefill signature (plus the reference's optional `logits_for`)."""

    def __init__(self, model: ReferenceModel, *, chunk_tokens: int = 8192):
        self.model = model
        self.cfg = model.cfg
        self.pm: PreparedModel = prepare(model)
        self.chunk_tokens = chunk_tokens

    @torch.inference_mode()
    def __call__(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        segments: list[Segment],
        logits_for: torch.Tensor | None = None,
    ) -> torch.Tensor:
        N = int(token_ids.shape[0])
        want = [s.end - 1 for s in segments] if logits_for is None else [int(i) for i in logits_for.tolist()]
        rows: dict[int, torch.Tensor] = {}
        for c0 in range(0, N, self.chunk_tokens):
            c1 = min(N, c0 + self.chunk_tokens)
            segs = [
                Segment(max(s.start, c0) - c0, min(s.end, c1) - c0, s.kv)
                for s in segments
                if s.start < c1 and s.end > c0
            ]
            local = [i for i in want if c0 <= i < c1]
            out = self._forward(token_ids[c0:c1], positions[c0:c1], segs, [i - c0 for i in local])
            rows.update(zip(local, out, strict=True))
        return torch.stack([rows[i] for i in want])

    # ---- one chunk ---------------------------------------------------------------------------

    def _forward(
        self, ids: torch.Tensor, pos: torch.Tensor, segs: list[Segment], logits_rows: list[int]
    ) -> torch.Tensor:
        cfg, pm = self.cfg, self.pm
        eps = cfg.rms_norm_eps
        Hq, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        T = ids.shape[0]
        ang = pos.float()[:, None] * pm.inv_freq[None, :]
        cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
        host_pos = pos.tolist()
        tables = [self._table(s) for s in segs]
        x = pm.embed[ids].float()
        for i, pl in enumerate(pm.layers):
            hf = _rms(x, pl.norm, eps)
            h = hf.to(pm.embed.dtype)
            qkv = h @ pl.qkv.t()
            q = qkv[:, : Hq * d].view(T, Hq, d)
            k = qkv[:, Hq * d : (Hq + Hkv) * d].view(T, Hkv, d)
            v = qkv[:, (Hq + Hkv) * d :].view(T, Hkv, d)
            if pl.rope:
                q = _rope(q, cos, sin).to(h.dtype)
                k = _rope(k, cos, sin).to(h.dtype)
            attn = torch.empty(T, Hq * d, device=h.device, dtype=h.dtype)
            for s, table in zip(segs, tables, strict=True):
                sl = slice(s.start, s.end)
                K, V, kpos = self._kv(
                    i, s, table, k[sl], v[sl], pos[sl], host_pos[s.start], host_pos[s.end - 1]
                )
                attn[sl] = self._sdpa(q[sl], K, V, pos[sl], kpos, pl.window)
            a = attn @ pl.o.t()
            if pl.dense_gate_up is not None:
                D = cfg.prefix_dense_intermediate_size
                gu = h @ pl.dense_gate_up.t()
                m = (F.silu(gu[:, :D].float()) * gu[:, D:].float()).to(h.dtype) @ pl.dense_down.t()
                x = x + a.float() + m.float()
            else:
                logits = hf @ pl.router.float().t()
                top, sel = torch.topk(logits, cfg.num_experts_per_tok, dim=-1)
                w = ops.route_weights(top, cfg.expert_selection_fn, cfg.norm_topk_prob)
                x = x + a.float() + grouped_experts(h, w, sel, pl.experts_gate_up, pl.experts_down)
        if not logits_rows:
            return torch.empty(0, cfg.vocab_size, device=x.device)
        hfin = _rms(x[logits_rows], pm.final_norm, eps).to(pm.embed.dtype)
        return (hfin @ pm.lm_head.t()).float() * cfg.logit_scale

    def _table(self, seg: Segment) -> torch.Tensor | None:
        """The segment's block tables [L, P] on the device, when its KV is the paged view."""
        if not isinstance(seg.kv, PagedKVView):
            return None
        return torch.from_numpy(seg.kv.seq.array.astype("int64")).to(self.pm.device)

    def _kv(self, layer, seg, table, k, v, pos, first, last):
        if table is None:
            return seg.kv.append(layer, k, v, pos)
        pool = seg.kv.pool.tensor
        row = table[layer]
        pages = row[pos // PAGE_SIZE]
        slots = pos % PAGE_SIZE
        pool[pages, 0, :, slots] = k.to(pool.dtype)
        pool[pages, 1, :, slots] = v.to(pool.dtype)
        start = first_visible_position(first, self.cfg.window(layer))
        kpos = torch.arange(start, last + 1, device=pool.device)
        kp = row[kpos // PAGE_SIZE]
        ks = kpos % PAGE_SIZE
        return pool[kp, 0, :, ks].to(k.dtype), pool[kp, 1, :, ks].to(v.dtype), kpos

    def _sdpa(self, q, K, V, qpos, kpos, window) -> torch.Tensor:
        T, Hq, d = q.shape
        G = Hq // K.shape[1]
        visible = kpos[None, :] <= qpos[:, None]
        if window is not None:
            visible &= (qpos[:, None] - kpos[None, :]) < window
        qh = q.transpose(0, 1)[None]
        kh = K.repeat_interleave(G, dim=1).transpose(0, 1)[None]
        vh = V.repeat_interleave(G, dim=1).transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible, scale=1.0 / math.sqrt(d))
        return o[0].transpose(0, 1).reshape(T, Hq * d)
