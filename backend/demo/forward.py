"""A differentiable, batched forward of the North Mini Code architecture for training the demo model.

It computes what `ReferenceModel.forward` computes (tests check it), with the reference ops
(`rms_norm`, `apply_rope`, `route`, `swiglu`, `lm_head`) under autograd; attention goes through
`scaled_dot_product_attention` with a causal (and sliding-window) mask, and on a GPU the routed
experts are computed densely (every expert on every token, weighted by the routing weights, zero
for experts not chosen): the same numbers as `ops.moe`, without its per-expert gathers.

Batches share one prefix: every training dialogue starts with the same tokens (BOS and the tool
schemas, ~1,850 tokens), so the prefix runs once per batch and every suffix (the rows of a padded
[B, S] batch, each starting at position P) attends to the prefix's keys and values and to its own
earlier keys, under the usual causal and sliding-window rules. Padding sits at the end of a row,
after every real token, so the causal mask already hides it from them.

Device-agnostic: the tensors live where the weights live (CPU or CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mkcode.backend.model import ops
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.weights import ModelWeights


@dataclass
class Batch:
    """prefix ids [P]; suffixes [B, S] padded at the end; every suffix starts at position P."""

    prefix: torch.Tensor
    suffix: torch.Tensor


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Boolean mask [T, S]: True where key j is visible to query i (causal, within the window)."""
    vis = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        vis &= (q_pos[:, None] - k_pos[None, :]) < window
    return vis


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, T, Hq, d], k/v [B, S, Hkv, d], boolean mask [T, S] → [B, T, Hq*d]. The kv heads are
    repeated for their query groups and the mask made additive, so that a GPU runs the
    memory-efficient kernel (not the math path that stores every score)."""
    B, T, Hq, d = q.shape
    group = Hq // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias
    )
    return out.transpose(1, 2).reshape(B, T, Hq * d)


def moe_dense(h: torch.Tensor, cfg: ModelConfig, router, gate_up, down) -> torch.Tensor:
    """Routed experts, every expert on every token [N, H]; a token's output is the routing-weighted
    sum of its top-k experts' SwiGLU outputs (the others weigh zero), as in `ops.moe`."""
    rw, rid = ops.route(h, router, cfg.num_experts_per_tok, cfg.expert_selection_fn, cfg.norm_topk_prob)
    dense_w = torch.zeros(h.shape[0], gate_up.shape[0], dtype=h.dtype, device=h.device).scatter(1, rid, rw)
    inter = gate_up.shape[1] // 2
    gu = torch.einsum("nh,eih->eni", h, gate_up)
    act = F.silu(gu[..., :inter]) * gu[..., inter:]
    y = torch.einsum("eni,ehi->enh", act, down)
    return torch.einsum("ne,enh->nh", dense_w, y)


def hidden_states(
    cfg: ModelConfig, w: ModelWeights, batch: Batch, prefix_grad: bool = False, dense_moe: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Final-layer hidden states (before the final norm): (prefix [P, H], suffixes [B, S, H]).

    With `prefix_grad` False the prefix is computed without autograd (its keys and values are then
    constants for the suffixes; the prefix is the same text in every dialogue). `dense_moe`
    (default: on a GPU) computes the experts densely."""
    dev = w.embed.device
    dense_moe = dev.type == "cuda" if dense_moe is None else dense_moe
    P = batch.prefix.numel()
    B, S = batch.suffix.shape
    Hq, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    pos_p = torch.arange(P, device=dev)
    pos_s = torch.arange(P, P + S, device=dev)

    def qkv(i: int, lw, h: torch.Tensor, pos: torch.Tensor):
        *lead, _ = h.shape
        q = F.linear(h, lw.q).view(*lead, Hq, d)
        k = F.linear(h, lw.k).view(*lead, Hkv, d)
        v = F.linear(h, lw.v).view(*lead, Hkv, d)
        if cfg.uses_rope(i):
            q = ops.apply_rope(q, pos, cfg.rope_theta)
            k = ops.apply_rope(k, pos, cfg.rope_theta)
        return q, k, v

    def mlp(i: int, lw, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        h = h.reshape(-1, shape[-1])
        if cfg.is_dense(i):
            out = ops.swiglu(h, lw.gate, lw.up, lw.down)
        elif dense_moe:
            out = moe_dense(h, cfg, lw.router, lw.experts_gate_up, lw.experts_down)
        else:
            rw, rid = ops.route(
                h, lw.router, cfg.num_experts_per_tok, cfg.expert_selection_fn, cfg.norm_topk_prob
            )
            out = ops.moe(h, rw, rid, lw.experts_gate_up, lw.experts_down)
        return out.view(shape)

    prefix_kv = []
    with torch.set_grad_enabled(prefix_grad and torch.is_grad_enabled()):
        xp = F.embedding(batch.prefix, w.embed)
        for i, lw in enumerate(w.layers):
            h = ops.rms_norm(xp, lw.norm, cfg.rms_norm_eps)
            q, k, v = qkv(i, lw, h, pos_p)
            att = _attend(q[None], k[None], v[None], visible(pos_p, pos_p, cfg.window(i)))[0]
            prefix_kv.append((k, v))
            xp = xp + F.linear(att, lw.o) + mlp(i, lw, h)
    xs = F.embedding(batch.suffix, w.embed)
    for i, lw in enumerate(w.layers):
        h = ops.rms_norm(xs, lw.norm, cfg.rms_norm_eps)
        q, k, v = qkv(i, lw, h, pos_s)
        window = cfg.window(i)
        lo = 0 if window is None else max(0, P - window + 1)
        kp, vp = prefix_kv[i]
        ks = torch.cat([kp[lo:].expand(B, *kp[lo:].shape), k], dim=1)
        vs = torch.cat([vp[lo:].expand(B, *vp[lo:].shape), v], dim=1)
        mask = visible(pos_s, torch.cat([pos_p[lo:], pos_s]), window)
        xs = xs + F.linear(_attend(q, ks, vs, mask), lw.o) + mlp(i, lw, h)
    return xp, xs


def logits_at(cfg: ModelConfig, w: ModelWeights, x: torch.Tensor) -> torch.Tensor:
    """Logits [N, V] (fp32) of hidden states [N, H]."""
    h = ops.rms_norm(x, w.final_norm, cfg.rms_norm_eps)
    return ops.lm_head(h, w.lm_head, cfg.logit_scale).float()
