"""Cut one rank's slice out of the full weights (the checkpoint layout, docs/ENGINE.md, Model) according to a ShardPlan.

A slice that is the whole tensor is the tensor itself (no copy), so a world of one costs no memory;
a proper slice is copied into its own storage so that the full weights can be freed afterwards.
The embedding stays whole on every rank (a decode step reads only B rows of it); with tied weights
the LM head shard is a view of the embedding's vocab rows, costing no memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.weights import LayerWeights, ModelWeights
from mkcode.backend.parallel.plan import ShardPlan


@dataclass
class ShardLayer(LayerWeights):
    """One layer's slice on this rank: the LayerWeights fields hold local shapes (q/k/v rows and o
    columns of this rank's heads, the dense intermediate slice, experts [first_expert, first_expert
    + E_local)); the router stays whole."""

    first_expert: int = 0


@dataclass
class ShardWeights:
    embed: torch.Tensor  # [V, H], whole
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V_local, H]
    layers: list[ShardLayer]

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def nbytes(self) -> int:
        """Bytes this rank holds (the tied LM head counted once)."""
        seen: set[int] = set()
        total = 0
        tensors = [self.embed, self.final_norm, self.lm_head]
        for lw in self.layers:
            tensors += [t for t in vars(lw).values() if isinstance(t, torch.Tensor)]
        for t in tensors:
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        return total


def _take(t: torch.Tensor, dim: int, r: range) -> torch.Tensor:
    """Rows/columns `r` of `t` along `dim`: `t` itself when whole, else an owned contiguous copy."""
    if r.start == 0 and len(r) == t.shape[dim]:
        return t
    return t.narrow(dim, r.start, len(r)).clone(memory_format=torch.contiguous_format)


def shard_weights(cfg: ModelConfig, w: ModelWeights, plan: ShardPlan) -> ShardWeights:
    plan.validate(cfg)
    d = cfg.head_dim
    q_heads, kv_heads = plan.q_heads(cfg), plan.kv_heads(cfg)
    q_rows = range(q_heads.start * d, q_heads.stop * d)
    kv_rows = range(kv_heads.start * d, kv_heads.stop * d)
    experts, dense = plan.experts(cfg), plan.dense_cols(cfg)
    layers = []
    for i, lw in enumerate(w.layers):
        sl = ShardLayer(
            norm=lw.norm,
            q=_take(lw.q, 0, q_rows),
            k=_take(lw.k, 0, kv_rows),
            v=_take(lw.v, 0, kv_rows),
            o=_take(lw.o, 1, q_rows),
        )
        if cfg.is_dense(i):
            assert lw.gate is not None and lw.up is not None and lw.down is not None
            sl.gate, sl.up, sl.down = (
                _take(lw.gate, 0, dense),
                _take(lw.up, 0, dense),
                _take(lw.down, 1, dense),
            )
        else:
            assert lw.experts_gate_up is not None and lw.experts_down is not None
            sl.router = lw.router
            sl.experts_gate_up = _take(lw.experts_gate_up, 0, experts)
            sl.experts_down = _take(lw.experts_down, 0, experts)
            sl.first_expert = experts.start
        layers.append(sl)
    vocab = plan.vocab(cfg)
    if w.lm_head is w.embed and len(vocab) != cfg.vocab_size:
        lm_head = w.embed.narrow(0, vocab.start, len(vocab))  # tied: a view, no memory
    else:
        lm_head = _take(w.lm_head, 0, vocab)
    return ShardWeights(embed=w.embed, final_norm=w.final_norm, lm_head=lm_head, layers=layers)
