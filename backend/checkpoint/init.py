"""Deterministic synthetic weights whose activations stay O(1) through the layers.

Each stored tensor gets its own generator, seeded from (seed, tensor name), so a tensor's values do
not depend on the order of writing or on the expert layout: the fused `gate_up_proj` of a layer is
exactly the concatenation of the per-expert `gate_proj`/`up_proj` tensors of the same seed.

Scales: embeddings N(0, 1) (so the residual stream starts O(1)); input projections N(0, 1/fan_in)
(outputs O(1) for O(1) inputs after RMSNorm); output projections (o_proj, down) N(0, (2/sqrt(fan_in))²)
so each layer's contribution is comparable to the embedding (with gain 1 the residual stays
dominated by the input embedding and the tied LM head predicts the input token ~95 % of the time;
with gain 2 ~30 %, and the logits' entropy is ~5 nats on `tiny`); norm weights 1 + N(0, 0.1) (so
tests see them matter); the router N(0, 1/H) (router logits O(1), top-k ties have probability
zero). With `logit_scale` < 1 the logits have a standard deviation of a few units.
"""

from __future__ import annotations

import math
import zlib

import torch

from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.weights import EMBED, FINAL_NORM, LM_HEAD

OUTPUT_GAIN = 2.0


def tensor_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed for tensor `name` of synthetic checkpoint `seed`."""
    return (seed * 0x9E3779B97F4A7C15 + zlib.crc32(name.encode())) % (1 << 63)


def init_std(cfg: ModelConfig, name: str) -> tuple[float, float]:
    """(mean, std) of the synthetic values of canonical or per-expert tensor `name`."""
    H = cfg.hidden_size
    if name.endswith("layernorm.weight") or name == FINAL_NORM:
        return 1.0, 0.1
    if name in (EMBED, LM_HEAD):
        return 0.0, 1.0
    if name.endswith("o_proj.weight"):
        return 0.0, OUTPUT_GAIN / math.sqrt(cfg.q_width)
    if name.endswith("mlp.down_proj.weight"):
        return 0.0, OUTPUT_GAIN / math.sqrt(cfg.prefix_dense_intermediate_size)
    if name.endswith("down_proj.weight") or name.endswith("experts.down_proj"):  # expert down
        return 0.0, OUTPUT_GAIN / math.sqrt(cfg.intermediate_size)
    return 0.0, 1.0 / math.sqrt(H)  # q/k/v, dense gate/up, router, expert gate/up (fused too)


def make_tensor(
    cfg: ModelConfig,
    name: str,
    shape: tuple[int, ...],
    seed: int,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """The synthetic values of one stored tensor (float32 draws, then cast to `dtype`)."""
    gen = torch.Generator(device=device).manual_seed(tensor_seed(seed, name))
    mean, std = init_std(cfg, name)
    t = torch.empty(shape, dtype=torch.float32, device=device)
    t.normal_(mean, std, generator=gen)
    return t.to(dtype)


def expert_piece_name(layer: int, expert: int, proj: str) -> str:
    """Per-expert tensor name as transformers' save_pretrained writes it (proj: gate/up/down)."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}_proj.weight"


def make_fused_gate_up(
    cfg: ModelConfig, layer: int, seed: int, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """[E, 2I, H]: for each expert its gate rows, then its up rows (the per-expert pieces stacked)."""
    I, H = cfg.intermediate_size, cfg.hidden_size
    out = torch.empty((cfg.num_experts, 2 * I, H), dtype=dtype, device=device)
    for e in range(cfg.num_experts):
        out[e, :I] = make_tensor(cfg, expert_piece_name(layer, e, "gate"), (I, H), seed, dtype, device)
        out[e, I:] = make_tensor(cfg, expert_piece_name(layer, e, "up"), (I, H), seed, dtype, device)
    return out


def make_fused_down(
    cfg: ModelConfig, layer: int, seed: int, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """[E, H, I]: the per-expert down projections stacked."""
    I, H = cfg.intermediate_size, cfg.hidden_size
    out = torch.empty((cfg.num_experts, H, I), dtype=dtype, device=device)
    for e in range(cfg.num_experts):
        out[e] = make_tensor(cfg, expert_piece_name(layer, e, "down"), (H, I), seed, dtype, device)
    return out
