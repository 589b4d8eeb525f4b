"""Weights rearranged once for the GPU path, shared by prefill and the graph decode backend.

Fused copies where one GEMM beats several: QKV as one [(Hq+2Hkv)*d, H] matrix, the dense layer's
gate and up as one [2D, H]. Everything else is the model's own tensor (no copy). The fused copies
cost 1.2 GB at the full geometry; they are made once per model and cached.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.reference import ReferenceModel


@dataclass
class PreparedLayer:
    norm: torch.Tensor
    qkv: torch.Tensor  # [(Hq+2Hkv)*d, H]
    o: torch.Tensor  # [H, Hq*d]
    rope: bool
    window: int | None
    dense_gate_up: torch.Tensor | None = None  # [2D, H]
    dense_down: torch.Tensor | None = None  # [H, D]
    router: torch.Tensor | None = None  # [E, H]
    experts_gate_up: torch.Tensor | None = None  # [E, 2I, H]
    experts_down: torch.Tensor | None = None  # [E, H, I]


@dataclass
class PreparedModel:
    cfg: ModelConfig
    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    layers: list[PreparedLayer]
    inv_freq: torch.Tensor  # [d/2] fp32, computed exactly as ops.rope_cos_sin does

    @property
    def device(self) -> torch.device:
        return self.embed.device


_CACHE: weakref.WeakKeyDictionary[ReferenceModel, PreparedModel] = weakref.WeakKeyDictionary()


def prepare(model: ReferenceModel) -> PreparedModel:
    if model in _CACHE:
        return _CACHE[model]
    cfg, w = model.cfg, model.w
    layers = []
    for i, lw in enumerate(w.layers):
        pl = PreparedLayer(
            norm=lw.norm,
            qkv=torch.cat([lw.q, lw.k, lw.v], 0).contiguous(),
            o=lw.o,
            rope=cfg.uses_rope(i),
            window=cfg.window(i),
        )
        if cfg.is_dense(i):
            pl.dense_gate_up = torch.cat([lw.gate, lw.up], 0).contiguous()
            pl.dense_down = lw.down
        else:
            pl.router = lw.router
            pl.experts_gate_up = lw.experts_gate_up
            pl.experts_down = lw.experts_down
        layers.append(pl)
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, device=w.device, dtype=torch.float32) / d))
    pm = PreparedModel(cfg, w.embed, w.final_norm, w.lm_head, layers, inv_freq)
    _CACHE[model] = pm
    return pm
