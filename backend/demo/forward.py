"""A differentiable forward of the North Mini Code architecture for training the demo model.

It computes exactly what `ReferenceModel.forward` computes (tests check it), with the reference
ops (`rms_norm`, `apply_rope`, `route`, `moe`, `swiglu`, `lm_head`) under autograd; only attention
differs in method: batched matmuls over blocks (a sliding window only looks at the block before)
instead of the reference's full masked einsum, which is several times faster on a CPU.

Batches share one prefix: every training dialogue starts with the same tokens (BOS and the tool
schemas, ~1,700 tokens), so the prefix is run once per batch and every suffix attends to its keys
and values. A suffix token at absolute position p sees prefix key j and its own earlier keys under
the usual causal and sliding-window rules.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mkcode.backend.model import ops
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.weights import ModelWeights


@dataclass
class PackedBatch:
    """prefix ids [P]; suffixes concatenated [N] with their lengths; each suffix starts at position P."""

    prefix: torch.Tensor
    suffix: torch.Tensor
    lengths: list[int]


def _mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Additive mask [T, S]: 0 where key j is visible to query i, -inf elsewhere."""
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= (q_pos[:, None] - k_pos[None, :]) < window
    return torch.zeros(visible.shape).masked_fill_(~visible, float("-inf"))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, group: int) -> torch.Tensor:
    """q [T, Hq, d], k/v [S, Hkv, d], additive mask [T, S] → [T, Hq*d]. Every query must see at
    least one key (true for causal masks), so no fully-masked rows need guarding."""
    T, Hq, d = q.shape
    Hkv = k.shape[1]
    qh = q.reshape(T, Hkv, group, d).permute(1, 2, 0, 3).reshape(Hkv, group * T, d)  # [Hkv, g*T, d]
    kh, vh = k.permute(1, 2, 0), v.permute(1, 0, 2)  # [Hkv, d, S], [Hkv, S, d]
    scores = torch.bmm(qh, kh).view(Hkv, group, T, -1) * (d**-0.5) + mask
    probs = torch.softmax(scores, dim=-1).view(Hkv, group * T, -1)
    out = torch.bmm(probs, vh).view(Hkv, group, T, d)
    return out.permute(2, 0, 1, 3).reshape(T, Hq * d)


def _local_attention(q, k, v, pos, window: int, group: int) -> torch.Tensor:
    """Sliding-window causal attention of a sequence over itself, in blocks of `window` queries
    (each block sees at most its own block and the one before)."""
    T = q.shape[0]
    parts = []
    for a in range(0, T, window):
        b = min(T, a + window)
        lo = max(0, a - window + 1)
        parts.append(_sdpa(q[a:b], k[lo:b], v[lo:b], _mask(pos[a:b], pos[lo:b], window), group))
    return torch.cat(parts)


def hidden_states(
    cfg: ModelConfig, w: ModelWeights, batch: PackedBatch, prefix_grad: bool = False
) -> torch.Tensor:
    """Final-layer hidden states (before the final norm) of [prefix | suffixes], [P + N, H].

    With `prefix_grad` False the prefix is computed without autograd (its keys and values are then
    constants for the suffixes): about half the work of a step, and the prefix is the same text in
    every dialogue, so little is lost."""
    P = batch.prefix.numel()
    Hq, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    group = Hq // Hkv
    pos_p = torch.arange(P)
    seg_pos = [torch.arange(P, P + n) for n in batch.lengths]
    bounds = [0]
    for n in batch.lengths:
        bounds.append(bounds[-1] + n)
    pos_s = torch.cat(seg_pos) if seg_pos else torch.zeros(0, dtype=torch.long)

    def qkv(i: int, lw, h: torch.Tensor, pos: torch.Tensor):
        T = h.shape[0]
        q = F.linear(h, lw.q).view(T, Hq, d)
        k = F.linear(h, lw.k).view(T, Hkv, d)
        v = F.linear(h, lw.v).view(T, Hkv, d)
        if cfg.uses_rope(i):
            q = ops.apply_rope(q, pos, cfg.rope_theta)
            k = ops.apply_rope(k, pos, cfg.rope_theta)
        return q, k, v

    def mlp(i: int, lw, h: torch.Tensor) -> torch.Tensor:
        if cfg.is_dense(i):
            return ops.swiglu(h, lw.gate, lw.up, lw.down)
        rw, rid = ops.route(
            h, lw.router, cfg.num_experts_per_tok, cfg.expert_selection_fn, cfg.norm_topk_prob
        )
        return ops.moe(h, rw, rid, lw.experts_gate_up, lw.experts_down)

    # The prefix, layer by layer, keeping each layer's keys and values.
    prefix_kv = []
    with torch.set_grad_enabled(prefix_grad and torch.is_grad_enabled()):
        xp = F.embedding(batch.prefix, w.embed)
        for i, lw in enumerate(w.layers):
            h = ops.rms_norm(xp, lw.norm, cfg.rms_norm_eps)
            q, k, v = qkv(i, lw, h, pos_p)
            window = cfg.window(i)
            if window is None:
                att = _sdpa(q, k, v, _mask(pos_p, pos_p, None), group)
            else:
                att = _local_attention(q, k, v, pos_p, window, group)
            prefix_kv.append((k, v))
            xp = xp + F.linear(att, lw.o) + mlp(i, lw, h)
    # The suffixes, each over the prefix's keys (those its window reaches) and its own.
    xs = F.embedding(batch.suffix, w.embed)
    for i, lw in enumerate(w.layers):
        h = ops.rms_norm(xs, lw.norm, cfg.rms_norm_eps)
        q, k, v = qkv(i, lw, h, pos_s)
        window = cfg.window(i)
        kp, vp = prefix_kv[i]
        lo = 0 if window is None else max(0, P - window + 1)
        parts = []
        for j, (a, b) in enumerate(itertools.pairwise(bounds)):
            keys_pos = torch.cat([pos_p[lo:], seg_pos[j]])
            mask = _mask(seg_pos[j], keys_pos, window)
            ks, vs = torch.cat([kp[lo:], k[a:b]]), torch.cat([vp[lo:], v[a:b]])
            parts.append(_sdpa(q[a:b], ks, vs, mask, group))
        xs = xs + F.linear(torch.cat(parts), lw.o) + mlp(i, lw, h)
    return torch.cat([xp, xs])


def logits_at(cfg: ModelConfig, w: ModelWeights, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Logits [len(rows), V] of the chosen rows of `hidden_states` (fp32)."""
    h = ops.rms_norm(x[rows], w.final_norm, cfg.rms_norm_eps)
    return ops.lm_head(h, w.lm_head, cfg.logit_scale).float()
