"""A tiny model and engine for CPU engine tests (fp32, random weights, no disk)."""

from __future__ import annotations

import torch

from mkcode.backend.engine.engine import Engine, EngineOptions
from mkcode.backend.engine.torch_backend import TorchDecodeBackend
from mkcode.backend.kv.pool import KVPool
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.reference import ReferenceModel
from mkcode.backend.model.weights import random_weights

N_LAYERS = 6


def tiny_config(**overrides) -> ModelConfig:
    raw = {
        "model_type": "cohere2_moe",
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": N_LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 32,
        "prefix_dense_intermediate_size": 96,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(N_LAYERS)],
        "mlp_layer_types": ["dense"] + ["sparse"] * (N_LAYERS - 1),
        "sliding_window": 64,
        "rope_theta": 50000.0,
        "rms_norm_eps": 1e-6,
        "logit_scale": 0.5,
        "max_position_embeddings": 1024,
        "eos_token_id": 2,
    }
    raw.update(overrides)
    return ModelConfig.from_dict(raw)


_MODELS: dict = {}


def tiny_model(seed: int = 0, **overrides) -> ReferenceModel:
    key = (seed, tuple(sorted(overrides.items())))
    if key not in _MODELS:
        cfg = tiny_config(**overrides)
        _MODELS[key] = ReferenceModel(cfg, random_weights(cfg, seed=seed, std=0.08))
    return _MODELS[key]


def make_engine(model: ReferenceModel, num_pages: int = 600, **opts) -> Engine:
    cfg = model.cfg
    pool = KVPool(
        num_pages,
        cfg.num_hidden_layers,
        cfg.num_key_value_heads,
        cfg.head_dim,
        dtype=torch.float32,
        enable_prefix_cache=opts.pop("enable_prefix_cache", True),
    )
    return Engine(model, pool, TorchDecodeBackend(model), options=EngineOptions(**opts))


def reference_greedy(
    model: ReferenceModel, prompt: list[int], n: int, eos: set[int] = frozenset()
) -> list[int]:
    """Greedy tokens from the reference model with a contiguous cache (no paging, no batching)."""
    cache = model.new_cache(len(prompt) + n + 1)
    logits = model.prefill(cache, prompt, chunk=1 << 20)
    out: list[int] = []
    for _ in range(n):
        tok = int(logits.argmax())
        out.append(tok)
        if tok in eos:
            break
        logits = model.decode(cache, tok, len(prompt) + len(out) - 1)
    return out
