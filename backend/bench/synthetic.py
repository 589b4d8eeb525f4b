"""Benchmark inputs without disk: full-geometry random weights, synthetic KV, routing modes.

- `bench_model`: random bf16 weights made in place on the device; `routing="skewed"` rescales
  router rows so that expert popularity follows a Zipf-like law (see `skew_router`).
- `synthetic_kv`: a KV pool filled with N(0, 0.01) and block tables for B rows at given contexts,
  laid out the way the engine leaves them (sliding layers hold only their window's pages).
- `reduced_config`: a small geometry with every feature of the real one (dense layer 0, full and
  sliding layers, a window that is not a page multiple, GQA, top-k routing) for quick checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mkcode.backend.kv.layout import NO_PAGE, PAGE_SIZE, first_visible_position, pool_shape
from mkcode.backend.model.config import ModelConfig, north_mini_code_config
from mkcode.backend.model.reference import ReferenceModel
from mkcode.backend.model.weights import ModelWeights, random_weights

ROUTING_MODES = ("uniform", "skewed")


def reduced_config(num_layers: int = 5, **overrides) -> ModelConfig:
    raw = dict(
        vocab_size=1024,
        hidden_size=256,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=128,
        prefix_dense_intermediate_size=256,
        num_experts=16,
        num_experts_per_tok=4,
        sliding_window=96,
        max_position_embeddings=8192,
    )
    raw.update(overrides)
    return north_mini_code_config(num_layers, **raw)


def zipf_law(num_experts: int, exponent: float, seed: int) -> torch.Tensor:
    """rank^-exponent per expert (ranks 1..E shuffled by `seed`): a Zipf-like popularity law."""
    g = torch.Generator().manual_seed(seed)
    ranks = torch.randperm(num_experts, generator=g).float() + 1.0
    return ranks.pow(-exponent)


def skew_router(
    weights: ModelWeights, cfg: ModelConfig, exponent: float = 0.8, top_bias: float = 0.075, seed: int = 7
) -> None:
    """Zipf-like expert popularity through a per-expert bias direction (in place).

    A bias needs a direction the hidden states share: every embedding row gets the same offset
    along a unit vector u (twice a row's typical norm; it persists in the residual stream), and
    router row e gets top_bias * zipf_e * u, so expert e's logit gains top_bias * zipf_e * (h . u)
    with h . u > 0 for every token. Popularity then falls with rank; the distinct experts a batch
    reads are measured in every run, not assumed."""
    H = cfg.hidden_size
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(H, generator=g)
    u = (u / u.norm()).to(weights.embed.device)
    row_norm = float(weights.embed[:64].float().norm(dim=1).mean())
    weights.embed.add_((2.0 * row_norm * u).to(weights.embed.dtype))
    for i, lw in enumerate(weights.layers):
        if lw.router is None:
            continue
        z = zipf_law(cfg.num_experts, exponent, seed=1000 + i).to(u.device)
        lw.router.add_((top_bias * z[:, None] * u[None, :]).to(lw.router.dtype))


def bench_model(
    cfg: ModelConfig | None = None,
    *,
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    routing: str = "uniform",
    seed: int = 0,
) -> ReferenceModel:
    """Random weights of `cfg` (default: the full 30B geometry) on `device`, no disk involved."""
    if routing not in ROUTING_MODES:
        raise ValueError(f"routing must be one of {ROUTING_MODES}, got {routing!r}")
    cfg = cfg or north_mini_code_config()
    w = random_weights(cfg, device=device, dtype=dtype, seed=seed)
    if routing == "skewed":
        skew_router(w, cfg)
    return ReferenceModel(cfg, w)


@dataclass
class SyntheticKV:
    pool: torch.Tensor  # [num_pages, 2, Hkv, PAGE, d]
    block_tables: torch.Tensor  # [L, B, P] int32
    positions: torch.Tensor  # [B] int64: each row's next position (= its context length)


def kv_pages_needed(cfg: ModelConfig, contexts: list[int]) -> int:
    """Pages a pool needs for rows at these contexts (each row's next position mapped too)."""
    total = 0
    for ctx in contexts:
        last = ctx // PAGE_SIZE
        for layer in range(cfg.num_hidden_layers):
            first = first_visible_position(ctx, cfg.window(layer)) // PAGE_SIZE
            total += last - first + 1
    return total


def synthetic_kv(
    cfg: ModelConfig,
    contexts: list[int],
    *,
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    std: float = 0.01,
    seed: int = 0,
    pool: torch.Tensor | None = None,
    fill: bool = True,
) -> SyntheticKV:
    """Rows at `contexts` tokens each: pages for every position the next query sees (sliding
    layers only their window, NO_PAGE before it), filled N(0, std). Pass `pool` to reuse a larger
    pool (pages are numbered from 0)."""
    need = kv_pages_needed(cfg, contexts)
    if pool is None:
        pool = torch.empty(
            pool_shape(need, cfg.num_key_value_heads, cfg.head_dim), device=device, dtype=dtype
        )
    elif pool.shape[0] < need:
        raise ValueError(f"pool of {pool.shape[0]} pages < {need} needed")
    if fill:
        g = torch.Generator(device=pool.device).manual_seed(seed)
        pool[:need].normal_(0.0, std, generator=g)
    width = max(ctx // PAGE_SIZE + 1 for ctx in contexts)
    tables = torch.full((cfg.num_hidden_layers, len(contexts), width), NO_PAGE, dtype=torch.int32)
    nxt = 0
    for b, ctx in enumerate(contexts):
        last = ctx // PAGE_SIZE
        for layer in range(cfg.num_hidden_layers):
            first = first_visible_position(ctx, cfg.window(layer)) // PAGE_SIZE
            n = last - first + 1
            tables[layer, b, first : last + 1] = torch.arange(nxt, nxt + n, dtype=torch.int32)
            nxt += n
    positions = torch.tensor(contexts, dtype=torch.long, device=pool.device)
    return SyntheticKV(pool, tables.to(pool.device), positions)


def distinct_experts(model: ReferenceModel, h: torch.Tensor) -> list[int]:
    """Distinct experts per MoE layer that rows h [B, H] route to through each layer's router
    (the same hidden state fed to every layer: a probe of the routing law, not a model run)."""
    cfg = model.cfg
    out = []
    for lw in model.w.layers:
        if lw.router is None:
            out.append(0)
            continue
        ids = torch.topk(h.float() @ lw.router.float().t(), cfg.num_experts_per_tok, dim=-1).indices
        out.append(int(torch.unique(ids).numel()))
    return out
