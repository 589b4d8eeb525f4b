"""Bytes a decode step must read (docs/PERF.md, Speed of light), and speed-of-light from a measured bandwidth.

bytes = attention weights (QKV + O, every layer) + dense-layer MLP + routers + the DISTINCT
experts the batch routed to on each MoE layer + LM head + KV of every row (a full layer reads
every key up to the new token; a sliding layer at most `window` keys). The new token's K/V
write, activations and the embedding rows are left out (under 0.1 % at any batch here).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mkcode.backend.model.config import ModelConfig


@dataclass(frozen=True)
class StepBytes:
    attention: int
    dense_mlp: int
    router: int
    experts: int
    lm_head: int
    kv: int

    @property
    def weights(self) -> int:
        return self.attention + self.dense_mlp + self.router + self.experts + self.lm_head

    @property
    def total(self) -> int:
        return self.weights + self.kv

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "weights": self.weights, "total": self.total}


def expected_distinct_uniform(num_experts: int, top_k: int, batch: int) -> float:
    """E[distinct experts] when B tokens each pick k of E uniformly: E (1 - (1 - k/E)^B)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


def kv_tokens_read(cfg: ModelConfig, layer: int, position: int) -> int:
    """Keys a query at `position` reads on this layer (itself included)."""
    window = cfg.window(layer)
    return position + 1 if window is None else min(position + 1, window)


def step_bytes(
    cfg: ModelConfig,
    positions: list[int],
    distinct_experts: list[int] | float | None = None,
    dtype_bytes: int = 2,
) -> StepBytes:
    """Bytes one decode step reads for rows whose new tokens sit at `positions` (= contexts).

    distinct_experts: per layer (as measured; dense layers ignored), or one number for every MoE
    layer, or None for the uniform-routing expectation."""
    H, L = cfg.hidden_size, cfg.num_hidden_layers
    moe_layers = [i for i in range(L) if not cfg.is_dense(i)]
    attn = L * (cfg.q_width + 2 * cfg.kv_width) * H + L * H * cfg.q_width
    dense = sum(3 * cfg.prefix_dense_intermediate_size * H for i in range(L) if cfg.is_dense(i))
    router = len(moe_layers) * cfg.num_experts * H
    expert = 3 * H * cfg.intermediate_size
    if distinct_experts is None:
        d = expected_distinct_uniform(cfg.num_experts, cfg.num_experts_per_tok, len(positions))
        n_experts = d * len(moe_layers)
    elif isinstance(distinct_experts, (int, float)):
        n_experts = float(distinct_experts) * len(moe_layers)
    else:
        if len(distinct_experts) != L:
            raise ValueError(f"distinct_experts has {len(distinct_experts)} entries, expected {L}")
        n_experts = sum(distinct_experts[i] for i in moe_layers)
    lm_head = cfg.vocab_size * H
    kv_per_token = 2 * cfg.num_key_value_heads * cfg.head_dim
    kv = sum(kv_tokens_read(cfg, i, p) for p in positions for i in range(L)) * kv_per_token
    b = dtype_bytes
    return StepBytes(
        attention=attn * b,
        dense_mlp=dense * b,
        router=router * b,
        experts=round(n_experts * expert * b),
        lm_head=lm_head * b,
        kv=kv * b,
    )


def speed_of_light(total_bytes: int, bandwidth_bytes_s: float, batch: int) -> tuple[float, float]:
    """(ms per step, tokens/s) if every byte streamed at `bandwidth_bytes_s`."""
    sec = total_bytes / bandwidth_bytes_s
    return sec * 1e3, batch / sec
