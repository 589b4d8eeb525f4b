"""The model's tensors: their canonical names and shapes, and a typed container.

Canonical names are transformers' `Cohere2MoeForCausalLM` names with experts fused
(`mlp.experts.gate_up_proj [E, 2I, H]`, gate rows first, then up; `mlp.experts.down_proj [E, H, I]`).
The checkpoint loader maps per-expert files onto these names; everything after loading sees only
this layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mkcode.backend.model.config import ModelConfig

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config must hold, with its shape (canonical names)."""
    H, E, I = cfg.hidden_size, cfg.num_experts, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {EMBED: (cfg.vocab_size, H), FINAL_NORM: (H,)}
    if not cfg.tie_word_embeddings:
        shapes[LM_HEAD] = (cfg.vocab_size, H)
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i)
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "self_attn.q_proj.weight"] = (cfg.q_width, H)
        shapes[p + "self_attn.k_proj.weight"] = (cfg.kv_width, H)
        shapes[p + "self_attn.v_proj.weight"] = (cfg.kv_width, H)
        shapes[p + "self_attn.o_proj.weight"] = (H, cfg.q_width)
        if cfg.is_dense(i):
            D = cfg.prefix_dense_intermediate_size
            shapes[p + "mlp.gate_proj.weight"] = (D, H)
            shapes[p + "mlp.up_proj.weight"] = (D, H)
            shapes[p + "mlp.down_proj.weight"] = (H, D)
        else:
            shapes[p + "mlp.gate.weight"] = (E, H)
            shapes[p + "mlp.experts.gate_up_proj"] = (E, 2 * I, H)
            shapes[p + "mlp.experts.down_proj"] = (E, H, I)
    return shapes


@dataclass
class LayerWeights:
    norm: torch.Tensor  # [H]
    q: torch.Tensor  # [Hq*d, H]
    k: torch.Tensor  # [Hkv*d, H]
    v: torch.Tensor  # [Hkv*d, H]
    o: torch.Tensor  # [H, Hq*d]
    # dense layers
    gate: torch.Tensor | None = None  # [D, H]
    up: torch.Tensor | None = None  # [D, H]
    down: torch.Tensor | None = None  # [H, D]
    # sparse (MoE) layers
    router: torch.Tensor | None = None  # [E, H]
    experts_gate_up: torch.Tensor | None = None  # [E, 2I, H]
    experts_down: torch.Tensor | None = None  # [E, H, I]


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, H]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]; the same storage as embed when tied
    layers: list[LayerWeights]

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> ModelWeights:
        """Build from canonical names; missing or misshapen tensors raise KeyError/ValueError."""
        shapes = expected_shapes(cfg)
        for name, shape in shapes.items():
            if name not in sd:
                raise KeyError(f"missing tensor {name!r}")
            if tuple(sd[name].shape) != shape:
                raise ValueError(f"tensor {name!r} has shape {tuple(sd[name].shape)}, expected {shape}")
        layers = []
        for i in range(cfg.num_hidden_layers):
            p = layer_prefix(i)
            lw = LayerWeights(
                norm=sd[p + "input_layernorm.weight"],
                q=sd[p + "self_attn.q_proj.weight"],
                k=sd[p + "self_attn.k_proj.weight"],
                v=sd[p + "self_attn.v_proj.weight"],
                o=sd[p + "self_attn.o_proj.weight"],
            )
            if cfg.is_dense(i):
                lw.gate = sd[p + "mlp.gate_proj.weight"]
                lw.up = sd[p + "mlp.up_proj.weight"]
                lw.down = sd[p + "mlp.down_proj.weight"]
            else:
                lw.router = sd[p + "mlp.gate.weight"]
                lw.experts_gate_up = sd[p + "mlp.experts.gate_up_proj"]
                lw.experts_down = sd[p + "mlp.experts.down_proj"]
            layers.append(lw)
        embed = sd[EMBED]
        lm_head = embed if cfg.tie_word_embeddings else sd[LM_HEAD]
        return cls(embed=embed, final_norm=sd[FINAL_NORM], lm_head=lm_head, layers=layers)

    def state_dict(self, cfg: ModelConfig) -> dict[str, torch.Tensor]:
        """Canonical-name view of these tensors (no copies)."""
        sd = {EMBED: self.embed, FINAL_NORM: self.final_norm}
        if not cfg.tie_word_embeddings:
            sd[LM_HEAD] = self.lm_head
        for i, lw in enumerate(self.layers):
            p = layer_prefix(i)
            sd[p + "input_layernorm.weight"] = lw.norm
            sd[p + "self_attn.q_proj.weight"] = lw.q
            sd[p + "self_attn.k_proj.weight"] = lw.k
            sd[p + "self_attn.v_proj.weight"] = lw.v
            sd[p + "self_attn.o_proj.weight"] = lw.o
            if cfg.is_dense(i):
                sd[p + "mlp.gate_proj.weight"] = lw.gate
                sd[p + "mlp.up_proj.weight"] = lw.up
                sd[p + "mlp.down_proj.weight"] = lw.down
            else:
                sd[p + "mlp.gate.weight"] = lw.router
                sd[p + "mlp.experts.gate_up_proj"] = lw.experts_gate_up
                sd[p + "mlp.experts.down_proj"] = lw.experts_down
        return sd  # type: ignore[return-value]

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype


def random_weights(
    cfg: ModelConfig,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    std: float = 0.02,
) -> ModelWeights:
    """Random weights made in place on `device` (the full 30B geometry fits an H200 this way, with
    no disk). Norm weights are 1 + small noise so that tests see them matter."""
    gen = torch.Generator(device=device).manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for name, shape in expected_shapes(cfg).items():
        t = torch.empty(shape, device=device, dtype=dtype)
        if name.endswith("layernorm.weight") or name == FINAL_NORM:
            t.normal_(1.0, 0.05, generator=gen)
        else:
            t.normal_(0.0, std, generator=gen)
        sd[name] = t
    return ModelWeights.from_state_dict(cfg, sd)
