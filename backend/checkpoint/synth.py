"""Synthetic checkpoints: complete Hugging Face directories that load exactly like a real one.

`synth_checkpoint("tiny", dir)` writes config.json (`ModelConfig.to_hf_dict()`), safetensors
shards plus `model.safetensors.index.json`, tokenizer.json and tokenizer_config.json (a synthetic
BPE tokenizer with the chat template) and generation_config.json. Files are byte-identical for the
same arguments. Experts are written fused (transformers' parameter layout) or per expert
(transformers' `save_pretrained` layout); both hold the same numbers.

`synthetic_model_on_device(...)` gives config + weights + tokenizer without touching the disk, for
benchmarks; see its docstring for the tokenizer of the full 262,144-token geometry.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer

from mkcode.backend.checkpoint.init import (
    expert_piece_name,
    make_fused_down,
    make_fused_gate_up,
    make_tensor,
)
from mkcode.backend.checkpoint.layout import EXPERT_LAYOUT_FUSED, EXPERT_LAYOUT_PER_EXPERT
from mkcode.backend.checkpoint.presets import SHARD_BYTES, preset_raw
from mkcode.backend.checkpoint.writer import TensorSpec, write_safetensors_shards
from mkcode.backend.model.config import ModelConfig, north_mini_code_config
from mkcode.backend.model.weights import ModelWeights, expected_shapes, random_weights

EXPERT_LAYOUTS = (EXPERT_LAYOUT_FUSED, EXPERT_LAYOUT_PER_EXPERT)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.lru_cache(maxsize=8)
def synthetic_tokenizer(vocab_size: int, seed: int = 0) -> Tokenizer:
    """The chat package's synthetic BPE tokenizer, trained once per process per (vocab, seed).

    Callers get the cached object: treat it as read-only (or `Tokenizer.from_str(tok.to_str())`)."""
    from mkcode.backend.chat.tokenizer_synth import train_synthetic_tokenizer

    return train_synthetic_tokenizer(vocab_size, seed)


def special_token_ids(tok: Tokenizer) -> dict[str, int | None]:
    """eos (`<|END_OF_TURN_TOKEN|>`), bos and pad ids of a synthetic tokenizer."""
    from mkcode.backend.chat import special_tokens as st

    eos = tok.token_to_id(st.EOS_TOKEN)
    if eos is None:
        raise ValueError(f"the synthetic tokenizer has no {st.EOS_TOKEN!r} token")
    return {"eos": eos, "bos": tok.token_to_id(st.BOS_TOKEN), "pad": tok.token_to_id(st.PAD_TOKEN)}


def synthetic_config(
    size: str, tok: Tokenizer | None = None, config_overrides: dict[str, Any] | None = None
) -> ModelConfig:
    """The config of a synthetic checkpoint; special-token ids come from `tok` unless overridden."""
    raw = preset_raw(size)
    if tok is not None:
        ids = special_token_ids(tok)
        raw.update(eos_token_id=ids["eos"], bos_token_id=ids["bos"], pad_token_id=ids["pad"])
    raw.update(config_overrides or {})
    return ModelConfig.from_dict(raw)


def tensor_specs(
    cfg: ModelConfig, seed: int, dtype: torch.dtype, experts_layout: str = EXPERT_LAYOUT_FUSED
) -> list[TensorSpec]:
    """What a synthetic checkpoint stores, in writing order (layer by layer, HF names)."""
    if experts_layout not in EXPERT_LAYOUTS:
        raise ValueError(f"experts_layout must be one of {EXPERT_LAYOUTS}, got {experts_layout!r}")
    specs: list[TensorSpec] = []
    I, H = cfg.intermediate_size, cfg.hidden_size

    def plain(name: str, shape: tuple[int, ...]) -> TensorSpec:
        return TensorSpec(name, shape, dtype, lambda: make_tensor(cfg, name, shape, seed, dtype))

    for name, shape in expected_shapes(cfg).items():
        if name.endswith("mlp.experts.gate_up_proj"):
            layer = int(name.split(".")[2])
            if experts_layout == EXPERT_LAYOUT_FUSED:
                specs.append(
                    TensorSpec(
                        name, shape, dtype, functools.partial(make_fused_gate_up, cfg, layer, seed, dtype)
                    )
                )
            else:
                for e in range(cfg.num_experts):
                    specs.append(plain(expert_piece_name(layer, e, "gate"), (I, H)))
                    specs.append(plain(expert_piece_name(layer, e, "up"), (I, H)))
        elif name.endswith("mlp.experts.down_proj"):
            layer = int(name.split(".")[2])
            if experts_layout == EXPERT_LAYOUT_FUSED:
                specs.append(
                    TensorSpec(
                        name, shape, dtype, functools.partial(make_fused_down, cfg, layer, seed, dtype)
                    )
                )
            else:
                specs.extend(
                    plain(expert_piece_name(layer, e, "down"), (H, I)) for e in range(cfg.num_experts)
                )
        else:
            specs.append(plain(name, shape))
    return specs


def synth_checkpoint(
    size: str,
    out_dir: str | Path,
    seed: int = 0,
    *,
    experts_layout: str = EXPERT_LAYOUT_FUSED,
    shard_bytes: int | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> Path:
    """Write a complete synthetic HF checkpoint of preset `size` ("tiny" | "small") into `out_dir`.

    `experts_layout`: "fused" (transformers' parameters) or "per_expert" (what `save_pretrained`
    writes). `shard_bytes`: maximum shard size (default: the preset's; tiny is sharded).
    `config_overrides`: raw config.json fields applied over the preset (e.g. `tie_word_embeddings`,
    `expert_selection_fn`, `num_hidden_layers`; `torch_dtype` sets the stored dtype). Returns `out_dir`.
    """
    from mkcode.backend.chat.template import chat_template
    from mkcode.backend.chat.tokenizer_synth import save_tokenizer_files

    out = Path(out_dir)
    vocab = int(preset_raw(size, config_overrides)["vocab_size"])
    tok = synthetic_tokenizer(min(vocab, preset_raw(size)["vocab_size"]), 0)
    if tok.get_vocab_size() > vocab:
        raise ValueError(
            f"vocab_size {vocab} is smaller than the synthetic tokenizer's {tok.get_vocab_size()}"
        )
    cfg = synthetic_config(size, tok, config_overrides)
    dtype = _DTYPES.get(cfg.torch_dtype)
    if dtype is None:
        raise ValueError(
            f"torch_dtype {cfg.torch_dtype!r} unsupported for synthesis; use one of {list(_DTYPES)}"
        )
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", cfg.to_hf_dict())
    _write_json(out / "generation_config.json", _generation_config(cfg))
    save_tokenizer_files(tok, out, chat_template())
    write_safetensors_shards(
        tensor_specs(cfg, seed, dtype, experts_layout),
        out,
        shard_bytes=shard_bytes if shard_bytes is not None else SHARD_BYTES[size],
    )
    return out


def synthetic_weights(
    cfg: ModelConfig, seed: int = 0, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> ModelWeights:
    """Exactly the weights `synth_checkpoint` writes for `cfg` and `seed`, made in memory (CPU draws)."""
    sd: dict[str, torch.Tensor] = {}
    for spec in tensor_specs(cfg, seed, dtype, EXPERT_LAYOUT_FUSED):
        sd[spec.name] = spec.make().to(device)
    return ModelWeights.from_state_dict(cfg, sd)


@dataclass
class SyntheticModel:
    """A model for benchmarks and tests, without files: config, weights and a tokenizer."""

    config: ModelConfig
    weights: ModelWeights
    tokenizer: Tokenizer


FULL = "full"


def synthetic_model_on_device(
    size: str = FULL,
    *,
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    config_overrides: dict[str, Any] | None = None,
) -> SyntheticModel:
    """Config, weights and tokenizer made directly in memory on `device`.

    size "tiny" / "small": the same weights as `synth_checkpoint(size, seed=seed)` (drawn on the CPU,
    then moved), cast to `dtype`.

    size "full": North Mini Code's release geometry (`north_mini_code_config()`), weights from
    `random_weights` made in place on `device` (30.5B parameters: ~61 GB in bf16, fits one H200).
    The tokenizer: training a 262,144-token BPE takes too long, so the `tiny` synthetic tokenizer
    (4,096 tokens) is padded with unused special tokens `<|unused_N|>` up to the model's vocab, so
    every id the model can produce decodes; eos/bos/pad in the config are that tokenizer's ids
    (not the release's 255001). Padding takes a few seconds and is cached per process.
    """
    if size == FULL:
        base = synthetic_tokenizer(int(preset_raw("tiny")["vocab_size"]), 0)
        ids = special_token_ids(base)
        raw = {"eos_token_id": ids["eos"], "bos_token_id": ids["bos"], "pad_token_id": ids["pad"]}
        raw.update(config_overrides or {})
        cfg = north_mini_code_config(**raw)
        tok = padded_tokenizer(base.to_str(), cfg.vocab_size)
        weights = random_weights(cfg, device=device, dtype=dtype, seed=seed)
        return SyntheticModel(cfg, weights, tok)
    tok = synthetic_tokenizer(int(preset_raw(size)["vocab_size"]), 0)
    cfg = synthetic_config(size, tok, config_overrides)
    return SyntheticModel(cfg, synthetic_weights(cfg, seed, device=device, dtype=dtype), tok)


@functools.lru_cache(maxsize=2)
def padded_tokenizer(tokenizer_json: str, vocab_size: int) -> Tokenizer:
    """A copy of a tokenizer with `<|unused_N|>` special tokens appended up to `vocab_size` ids."""
    tok = Tokenizer.from_str(tokenizer_json)
    n = vocab_size - tok.get_vocab_size()
    if n > 0:
        tok.add_special_tokens([AddedToken(f"<|unused_{i}|>", special=True) for i in range(n)])
    return tok


def _generation_config(cfg: ModelConfig) -> dict[str, Any]:
    eos: Any = list(cfg.eos_token_ids) if len(cfg.eos_token_ids) != 1 else cfg.eos_token_ids[0]
    return {
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": cfg.pad_token_id,
        "do_sample": False,
    }


def _write_json(path: Path, body: dict[str, Any]) -> None:
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
