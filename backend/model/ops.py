"""The model's operations in plain PyTorch: the oracle every fast path is tested against.

Each function is the readable definition of one step of North Mini Code (docs/ENGINE.md, Model). They work on
CPU and GPU, fp32 and bf16; reductions (norm, softmax) run in fp32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Weight-only RMSNorm with an fp32 reduction; the result is cast back before the weight
    multiply, as transformers' Cohere2MoeRMSNorm does."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, head_dim/2] in fp32 for the given absolute positions."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Interleaved-pair RoPE: the pairs are (x[0::2], x[1::2]) of each head.

    x: [T, heads, head_dim]; positions: [T]. Computed in fp32, returned in x's dtype."""
    cos, sin = rope_cos_sin(positions, x.shape[-1], theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    xf = x.float()
    even, odd = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: int | None,
) -> torch.Tensor:
    """Causal GQA attention of T queries over S keys, by absolute position.

    q: [T, Hq, d]; k, v: [S, Hkv, d]; q_pos [T], k_pos [S]. Key j is visible to query i when
    k_pos[j] <= q_pos[i] and, with a sliding window, q_pos[i] - k_pos[j] < window (the window
    counts the current token). Softmax in fp32. Returns [T, Hq*d] in q's dtype."""
    T, Hq, d = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    qf = q.float().view(T, Hkv, group, d)
    kf, vf = k.float(), v.float()
    scores = torch.einsum("tkgd,skd->kgts", qf, kf) / math.sqrt(d)
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= (q_pos[:, None] - k_pos[None, :]) < window
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("kgts,skd->tkgd", probs, vf)
    return out.reshape(T, Hq * d).to(q.dtype)


def route(
    h: torch.Tensor, router_w: torch.Tensor, top_k: int, selection_fn: str, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: (weights [T, k] in h's dtype, expert ids [T, k]).

    softmax: softmax over the k selected logits (already sums to 1).
    sigmoid: sigmoid of the k logits, renormalised to sum to 1 when norm_topk_prob."""
    logits = F.linear(h, router_w)
    top_logits, ids = torch.topk(logits, top_k, dim=-1)
    return route_weights(top_logits, selection_fn, norm_topk_prob).to(h.dtype), ids


def route_weights(top_logits: torch.Tensor, selection_fn: str, norm_topk_prob: bool) -> torch.Tensor:
    """The routing weights (fp32) of the k selected logits [T, k], as `route` describes."""
    if selection_fn == "softmax":
        return torch.softmax(top_logits.float(), dim=-1)
    if selection_fn == "sigmoid":
        w = torch.sigmoid(top_logits.float())
        return w / w.sum(-1, keepdim=True) if norm_topk_prob else w
    raise ValueError(f"unknown expert_selection_fn {selection_fn!r}")


def swiglu(h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """down(silu(gate(h)) * up(h)); gate/up [I, H], down [H, I]."""
    return F.linear(F.silu(F.linear(h, gate)) * F.linear(h, up), down)


def moe(
    h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """Routed experts, one expert at a time (readable, not fast).

    gate_up [E, 2I, H] (gate rows first), down [E, H, I]. Each token's output is the routing-weighted
    sum of its k experts' SwiGLU outputs."""
    inter = gate_up.shape[1] // 2
    # each (token, slot) pair is written exactly once, then the k slots are summed per token
    # (plain indexed stores: much faster on the CPU than an accumulating index_add_)
    per_slot = torch.zeros(*ids.shape, h.shape[-1], dtype=h.dtype, device=h.device)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        y = swiglu(h[tok], gate_up[e, :inter], gate_up[e, inter:], down[e])
        per_slot[tok, slot] = (y * weights[tok, slot, None]).to(h.dtype)
    return per_slot.sum(dim=1)


def lm_head(h: torch.Tensor, weight: torch.Tensor, logit_scale: float) -> torch.Tensor:
    """Logits = (h @ W.T) * logit_scale, h already final-normed."""
    return F.linear(h, weight) * logit_scale
