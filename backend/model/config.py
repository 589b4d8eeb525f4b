"""North Mini Code's configuration, read from a checkpoint's `config.json` (HF `cohere2_moe`).

Every field the architecture uses is read and validated here, so that the rest of the code can
trust a `ModelConfig` without re-checking. Errors name the field and say what was expected.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MODEL_TYPE = "cohere2_moe"
LAYER_TYPES = ("full_attention", "sliding_attention")
MLP_LAYER_TYPES = ("dense", "sparse")
SELECTION_FNS = ("softmax", "sigmoid")


class ConfigError(ValueError):
    """A config.json that mkcode cannot run, with the reason."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # routed expert intermediate size
    prefix_dense_intermediate_size: int  # dense (prefix) MLP intermediate size
    num_experts: int
    num_experts_per_tok: int
    expert_selection_fn: str
    norm_topk_prob: bool
    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    sliding_window: int
    rope_theta: float
    prefix_dense_sliding_window_pattern: int
    rms_norm_eps: float
    logit_scale: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    torch_dtype: str = "bfloat16"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ---- derived facts the model and the fast paths use -------------------------------------

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def gqa_group(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "sliding_attention"

    def is_dense(self, layer: int) -> bool:
        return self.mlp_layer_types[layer] == "dense"

    def uses_rope(self, layer: int) -> bool:
        """RoPE on sliding layers, and on dense-prefix layers when the prefix pattern is 1.

        Full-attention MoE layers use no position encoding at all (as transformers does)."""
        return self.is_sliding(layer) or (
            self.is_dense(layer) and self.prefix_dense_sliding_window_pattern == 1
        )

    def window(self, layer: int) -> int | None:
        """Number of keys a query sees on this layer (the current token included), or None."""
        return self.sliding_window if self.is_sliding(layer) else None

    @property
    def dense_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_dense(i)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        return d

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ConfigError(f"{path}: no config.json (is this a Hugging Face checkpoint directory?)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from e
        try:
            return cls.from_dict(raw)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        if not isinstance(raw, dict):
            raise ConfigError("config must be a JSON object")
        model_type = raw.get("model_type")
        if model_type != MODEL_TYPE:
            raise ConfigError(f"model_type is {model_type!r}; mkcode runs {MODEL_TYPE!r} checkpoints")

        def req(name: str, typ: type | tuple[type, ...] = int) -> Any:
            if name not in raw or raw[name] is None:
                raise ConfigError(f"missing field {name!r}")
            v = raw[name]
            if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise ConfigError(f"field {name!r} must be an integer, got {v!r}")
            if typ is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ConfigError(f"field {name!r} must be a number, got {v!r}")
            return v

        def positive(name: str) -> int:
            v = req(name)
            if v <= 0:
                raise ConfigError(f"field {name!r} must be > 0, got {v}")
            return v

        n_layers = positive("num_hidden_layers")
        hidden = positive("hidden_size")
        n_heads = positive("num_attention_heads")
        n_kv = raw.get("num_key_value_heads") or n_heads
        head_dim = raw.get("head_dim") or hidden // n_heads
        if n_heads % n_kv:
            raise ConfigError(
                f"num_attention_heads ({n_heads}) must be a multiple of num_key_value_heads ({n_kv})"
            )
        if head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {head_dim}")

        hidden_act = raw.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise ConfigError(f"unsupported hidden_act {hidden_act!r} (only 'silu')")
        if raw.get("attention_bias", False):
            raise ConfigError("unsupported attention_bias=true (North Mini Code has no biases)")
        if raw.get("num_shared_experts", 0):
            raise ConfigError(f"unsupported num_shared_experts={raw['num_shared_experts']} (only 0)")
        eps = raw.get("rms_norm_eps")
        if eps is None:
            raise ConfigError("missing field 'rms_norm_eps' (the LayerNorm variant is not supported)")

        # RoPE: transformers 5 writes rope_parameters; older files write rope_theta (+ rope_scaling).
        rope = raw.get("rope_parameters") or {}
        if isinstance(rope, dict) and "full_attention" in rope:  # per-layer-type form
            rope = rope.get("sliding_attention") or rope["full_attention"]
        rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
        scaling = raw.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type != "default":
            raise ConfigError(f"unsupported rope_type {rope_type!r} (only 'default')")
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        if theta is None:
            theta = raw.get("rope_theta")
        if theta is None:
            raise ConfigError("missing field 'rope_theta' (or rope_parameters.rope_theta)")

        first_k_dense = raw.get("first_k_dense_replace", 0) or 0
        dense_pattern = raw.get("prefix_dense_sliding_window_pattern", 1)
        sliding_pattern = raw.get("sliding_window_pattern", 4)
        layer_types = raw.get("layer_types")
        if layer_types is None:  # same derivation as transformers' Cohere2MoeConfig
            layer_types = [
                "sliding_attention" if (i + 1) % dense_pattern else "full_attention"
                for i in range(first_k_dense)
            ] + [
                "sliding_attention" if (i + 1) % sliding_pattern else "full_attention"
                for i in range(n_layers - first_k_dense)
            ]
        mlp_types = raw.get("mlp_layer_types")
        if mlp_types is None:
            mlp_types = ["dense" if i < first_k_dense else "sparse" for i in range(n_layers)]
        for name, values, allowed in (
            ("layer_types", layer_types, LAYER_TYPES),
            ("mlp_layer_types", mlp_types, MLP_LAYER_TYPES),
        ):
            if not isinstance(values, list) or len(values) != n_layers:
                got = len(values) if isinstance(values, list) else type(values).__name__
                raise ConfigError(f"{name} must list one entry per layer ({n_layers}), got {got}")
            bad = sorted({v for v in values if v not in allowed})
            if bad:
                raise ConfigError(f"{name} has unsupported value(s) {bad}; allowed: {list(allowed)}")

        sliding_window = raw.get("sliding_window")
        if "sliding_attention" in layer_types and (
            not isinstance(sliding_window, int) or sliding_window <= 0
        ):
            raise ConfigError(f"sliding_window must be a positive integer, got {sliding_window!r}")

        n_experts = raw.get("num_experts") or 0
        top_k = raw.get("num_experts_per_tok") or 0
        if "sparse" in mlp_types:
            if n_experts <= 0:
                raise ConfigError("missing field 'num_experts' (needed by the sparse MoE layers)")
            if not 0 < top_k <= n_experts:
                raise ConfigError(f"num_experts_per_tok must be in 1..num_experts ({n_experts}), got {top_k}")
            positive("intermediate_size")
        selection = raw.get("expert_selection_fn", "softmax")
        if selection not in SELECTION_FNS:
            raise ConfigError(
                f"expert_selection_fn {selection!r} unsupported; allowed: {list(SELECTION_FNS)}"
            )
        dense_inter = raw.get("prefix_dense_intermediate_size") or raw.get("intermediate_size")
        if "dense" in mlp_types and not dense_inter:
            raise ConfigError("missing field 'prefix_dense_intermediate_size' (needed by the dense layers)")

        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        known = {f for f in cls.__dataclass_fields__}
        return cls(
            vocab_size=positive("vocab_size"),
            hidden_size=hidden,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=int(n_kv),
            head_dim=int(head_dim),
            intermediate_size=int(raw.get("intermediate_size") or 0),
            prefix_dense_intermediate_size=int(dense_inter or 0),
            num_experts=int(n_experts),
            num_experts_per_tok=int(top_k),
            expert_selection_fn=selection,
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            layer_types=tuple(layer_types),
            mlp_layer_types=tuple(mlp_types),
            sliding_window=int(sliding_window or 0),
            rope_theta=float(theta),
            prefix_dense_sliding_window_pattern=int(dense_pattern),
            rms_norm_eps=float(eps),
            logit_scale=float(raw.get("logit_scale", 1.0)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
            max_position_embeddings=int(raw.get("max_position_embeddings") or 8192),
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
            pad_token_id=raw.get("pad_token_id"),
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"),
            extra={k: v for k, v in raw.items() if k not in known},
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json body in transformers' format (used by the synthetic checkpoints)."""
        return {
            "architectures": ["Cohere2MoeForCausalLM"],
            "model_type": MODEL_TYPE,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "prefix_dense_intermediate_size": self.prefix_dense_intermediate_size,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "num_shared_experts": 0,
            "expert_selection_fn": self.expert_selection_fn,
            "norm_topk_prob": self.norm_topk_prob,
            "layer_types": list(self.layer_types),
            "mlp_layer_types": list(self.mlp_layer_types),
            "sliding_window": self.sliding_window,
            "rope_theta": self.rope_theta,
            "prefix_dense_sliding_window_pattern": self.prefix_dense_sliding_window_pattern,
            "rms_norm_eps": self.rms_norm_eps,
            "logit_scale": self.logit_scale,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "eos_token_id": list(self.eos_token_ids)
            if len(self.eos_token_ids) != 1
            else self.eos_token_ids[0],
            "bos_token_id": self.bos_token_id,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": self.torch_dtype,
        }


def north_mini_code_config(num_layers: int = 49, **overrides: Any) -> ModelConfig:
    """The release geometry of North Mini Code (docs/ENGINE.md, Model), for synthetic 30B-shaped models.

    `num_layers` keeps the release layer pattern (full attention every 4th layer from 0, one dense
    layer first) at any depth; `overrides` replace config.json fields (e.g. a reduced geometry)."""
    n = num_layers
    raw: dict[str, Any] = {
        "model_type": MODEL_TYPE,
        "vocab_size": 262144,
        "hidden_size": 2048,
        "num_hidden_layers": n,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 768,
        "prefix_dense_intermediate_size": 3072,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "expert_selection_fn": "softmax",
        "norm_topk_prob": True,
        "layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n)],
        "mlp_layer_types": ["dense"] + ["sparse"] * (n - 1),
        "sliding_window": 4096,
        "rope_theta": 50000.0,
        "prefix_dense_sliding_window_pattern": 1,
        "rms_norm_eps": 1e-6,
        "logit_scale": 1.0,
        "tie_word_embeddings": True,
        "max_position_embeddings": 262144,
        "eos_token_id": 255001,
        "bos_token_id": 2,
        "pad_token_id": 0,
    }
    raw.update(overrides)
    return ModelConfig.from_dict(raw)
