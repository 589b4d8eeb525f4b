"""The reference North Mini Code model in plain PyTorch (docs/ENGINE.md, Model).

`ReferenceModel.forward` runs any number of tokens of any number of sequences at once: all matrix
work is batched over the flat token list, attention runs per sequence against that sequence's KV
store. Chunked prefill is a forward over a chunk of one sequence; a decode step is a forward of one
token per sequence. The KV store is an interface (`KVStore`): `DenseKVCache` (here) keeps one
sequence's keys contiguously; the engine's paged cache provides the same interface over pages.

Layer (a parallel block with one norm):  h = rmsnorm(x);  x = x + attn(h) + mlp(h)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from mkcode.backend.model import ops
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.weights import ModelWeights


class KVStore(Protocol):
    """One sequence's keys and values, per layer."""

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store k, v [T, Hkv, d] at `positions` [T]; return every key, value and key position this
        layer's attention may need for those queries ([S, Hkv, d], [S, Hkv, d], [S])."""
        ...


class DenseKVCache:
    """A contiguous KV cache for one sequence (the reference; no paging, keeps every token)."""

    def __init__(self, cfg: ModelConfig, max_tokens: int, device: torch.device | str, dtype: torch.dtype):
        shape = (cfg.num_hidden_layers, max_tokens, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = [0] * cfg.num_hidden_layers
        self.max_tokens = max_tokens

    def append(self, layer, k, v, positions):
        start = self.length[layer]
        T = k.shape[0]
        if start + T > self.max_tokens:
            raise ValueError(f"DenseKVCache full: {start} + {T} > {self.max_tokens} tokens")
        if int(positions[0]) != start:
            raise ValueError(
                f"DenseKVCache expects consecutive positions, got {int(positions[0])} at {start}"
            )
        self.k[layer, start : start + T] = k
        self.v[layer, start : start + T] = v
        self.length[layer] = start + T
        n = start + T
        pos = torch.arange(n, device=k.device)
        return self.k[layer, :n], self.v[layer, :n], pos


@dataclass
class Segment:
    """A run of tokens of one sequence inside a flat batch: tokens [start, end) of the batch."""

    start: int
    end: int
    kv: KVStore


class ReferenceModel:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights):
        self.cfg = cfg
        self.w = weights

    @property
    def device(self) -> torch.device:
        return self.w.device

    @property
    def dtype(self) -> torch.dtype:
        return self.w.dtype

    def new_cache(self, max_tokens: int) -> DenseKVCache:
        return DenseKVCache(self.cfg, max_tokens, self.device, self.dtype)

    # ---- one layer ---------------------------------------------------------------------------

    def attention_block(self, i: int, h: torch.Tensor, positions: torch.Tensor, segments: list[Segment]):
        cfg, lw = self.cfg, self.w.layers[i]
        T = h.shape[0]
        q = F.linear(h, lw.q).view(T, cfg.num_attention_heads, cfg.head_dim)
        k = F.linear(h, lw.k).view(T, cfg.num_key_value_heads, cfg.head_dim)
        v = F.linear(h, lw.v).view(T, cfg.num_key_value_heads, cfg.head_dim)
        if cfg.uses_rope(i):
            q = ops.apply_rope(q, positions, cfg.rope_theta)
            k = ops.apply_rope(k, positions, cfg.rope_theta)
        out = torch.empty(T, cfg.q_width, device=h.device, dtype=h.dtype)
        for seg in segments:
            sl = slice(seg.start, seg.end)
            K, V, kpos = seg.kv.append(i, k[sl], v[sl], positions[sl])
            out[sl] = ops.attention(q[sl], K, V, positions[sl], kpos, cfg.window(i))
        return F.linear(out, lw.o)

    def mlp_block(self, i: int, h: torch.Tensor) -> torch.Tensor:
        cfg, lw = self.cfg, self.w.layers[i]
        if cfg.is_dense(i):
            return ops.swiglu(h, lw.gate, lw.up, lw.down)
        weights, ids = ops.route(
            h, lw.router, cfg.num_experts_per_tok, cfg.expert_selection_fn, cfg.norm_topk_prob
        )
        return ops.moe(h, weights, ids, lw.experts_gate_up, lw.experts_down)

    def layer(
        self, i: int, x: torch.Tensor, positions: torch.Tensor, segments: list[Segment]
    ) -> torch.Tensor:
        h = ops.rms_norm(x, self.w.layers[i].norm, self.cfg.rms_norm_eps)
        return x + self.attention_block(i, h, positions, segments) + self.mlp_block(i, h)

    # ---- whole model -------------------------------------------------------------------------

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = ops.rms_norm(x, self.w.final_norm, self.cfg.rms_norm_eps)
        return ops.lm_head(h, self.w.lm_head, self.cfg.logit_scale)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        segments: list[Segment],
        logits_for: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run a flat batch of tokens; return logits [len(logits_for), V] (fp32).

        token_ids, positions: [N] on the model's device; segments cover [0, N) in order;
        logits_for: batch indices whose logits are wanted (default: the last token of each segment).
        """
        if logits_for is None:
            logits_for = torch.tensor([s.end - 1 for s in segments], device=token_ids.device)
        x = F.embedding(token_ids, self.w.embed)
        for i in range(self.cfg.num_hidden_layers):
            x = self.layer(i, x, positions, segments)
        return self.logits(x[logits_for]).float()

    def prefill(self, cache: KVStore, token_ids: list[int], start: int = 0, chunk: int = 512) -> torch.Tensor:
        """Chunked prefill of one sequence from position `start`; returns the last token's logits [V]."""
        if not token_ids:
            raise ValueError("prefill needs at least one token")
        logits = None
        for c in range(0, len(token_ids), chunk):
            ids = torch.tensor(token_ids[c : c + chunk], device=self.device)
            pos = torch.arange(start + c, start + c + len(ids), device=self.device)
            logits = self.forward(ids, pos, [Segment(0, len(ids), cache)])
        assert logits is not None
        return logits[0]

    def decode(self, cache: KVStore, token_id: int, position: int) -> torch.Tensor:
        """One-token decode step of one sequence; returns logits [V]."""
        ids = torch.tensor([token_id], device=self.device)
        pos = torch.tensor([position], device=self.device)
        return self.forward(ids, pos, [Segment(0, 1, cache)])[0]

    def all_logits(self, cache: KVStore, token_ids: list[int], start: int = 0) -> torch.Tensor:
        """Logits of every position of a prompt (one chunk), [T, V]; used by parity tests."""
        ids = torch.tensor(token_ids, device=self.device)
        pos = torch.arange(start, start + len(ids), device=self.device)
        return self.forward(ids, pos, [Segment(0, len(ids), cache)], logits_for=torch.arange(len(ids)))
