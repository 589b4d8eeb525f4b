"""Geometries of the synthetic checkpoints (`tiny`, `small`) as raw config.json bodies.

`tiny` exercises every architectural feature on a CPU in seconds: 6 layers with full attention on
layers 0 and 4 (every 4th from 0) and a 64-token sliding window elsewhere, one dense prefix layer
that gets RoPE (`prefix_dense_sliding_window_pattern` 1), 16 experts top-4, Q width (4 × 32 = 128)
≠ hidden (96), GQA 2:1, `logit_scale` 0.25, tied embeddings, float32.

`small` is a larger bf16 geometry (~330 MB) for load-speed and performance smoke tests.

The layer patterns are left to `ModelConfig.from_dict`'s derivation (`first_k_dense_replace`,
`sliding_window_pattern`), so overriding `num_hidden_layers` keeps them consistent; the written
config.json lists them explicitly.
"""

from __future__ import annotations

from typing import Any

SIZES = ("tiny", "small")

_COMMON: dict[str, Any] = {
    "model_type": "cohere2_moe",
    "first_k_dense_replace": 1,
    "sliding_window_pattern": 4,
    "prefix_dense_sliding_window_pattern": 1,
    "expert_selection_fn": "softmax",
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        **_COMMON,
        "vocab_size": 4096,
        "hidden_size": 96,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 64,
        "prefix_dense_intermediate_size": 192,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "sliding_window": 64,
        "rope_theta": 50000.0,
        "logit_scale": 0.25,
        "max_position_embeddings": 4096,
        "torch_dtype": "float32",
    },
    "small": {
        **_COMMON,
        "vocab_size": 16384,
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "intermediate_size": 384,
        "prefix_dense_intermediate_size": 1536,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "sliding_window": 512,
        "rope_theta": 50000.0,
        "logit_scale": 0.125,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    },
}

# Default shard size per preset: several shards for `tiny` (so tests exercise sharding).
SHARD_BYTES: dict[str, int] = {"tiny": 3 << 20, "small": 128 << 20}


def preset_raw(size: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The raw config body of a preset with `overrides` applied (unknown size: ValueError)."""
    if size not in PRESETS:
        raise ValueError(f"unknown synthetic size {size!r}; choose from {', '.join(SIZES)}")
    raw = dict(PRESETS[size])
    raw.update(overrides or {})
    return raw
