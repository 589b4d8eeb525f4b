"""Tiny transformers `Cohere2MoeConfig`s covering every feature the reference model implements."""

from __future__ import annotations

from typing import Any


def hf_tiny_config(**overrides: Any):
    from transformers import Cohere2MoeConfig

    n = overrides.pop("num_hidden_layers", 6)
    dense = overrides.pop("first_k_dense", 1)
    kw: dict[str, Any] = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=32,
        prefix_dense_intermediate_size=96,
        num_hidden_layers=n,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        expert_selection_fn="softmax",
        norm_topk_prob=True,
        sliding_window=16,
        rope_theta=50000.0,
        rms_norm_eps=1e-6,
        logit_scale=0.5,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        layer_types=["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n)],
        mlp_layer_types=["dense" if i < dense else "sparse" for i in range(n)],
        prefix_dense_sliding_window_pattern=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    kw.update(overrides)
    return Cohere2MoeConfig(**kw)
