"""Synthetic checkpoints: complete, deterministic, and loading back to exactly what was written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.checkpoint import load_checkpoint, synth_checkpoint, synthetic_model_on_device
from mkcode.backend.checkpoint.presets import PRESETS
from mkcode.backend.checkpoint.stats import param_counts
from mkcode.backend.checkpoint.synth import synthetic_config, synthetic_weights
from mkcode.backend.model.config import ModelConfig
from tests.backend.checkpoint.helpers import read_all

FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors.index.json",
)


def test_tiny_directory_is_complete_and_sharded(tiny_dir: Path) -> None:
    for name in FILES:
        assert (tiny_dir / name).is_file(), name
    shards = sorted(tiny_dir.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    tok_cfg = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] and tok_cfg["eos_token"] == st.EOS_TOKEN


def test_tiny_config_exercises_every_feature(tiny_dir: Path) -> None:
    cfg = ModelConfig.from_file(tiny_dir)
    assert cfg.num_hidden_layers == 6
    assert [i for i in range(6) if not cfg.is_sliding(i)] == [0, 4]
    assert cfg.dense_layers == [0] and cfg.uses_rope(0) and not cfg.uses_rope(4)
    assert cfg.sliding_window == 64
    assert cfg.q_width != cfg.hidden_size and cfg.gqa_group == 2
    assert 8 <= cfg.num_experts <= 16 and 2 <= cfg.num_experts_per_tok <= 4
    assert cfg.logit_scale != 1.0 and cfg.tie_word_embeddings
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == cfg.vocab_size
    gen = json.loads((tiny_dir / "generation_config.json").read_text())
    assert cfg.eos_token_ids == (tok.token_to_id(st.EOS_TOKEN),) == (gen["eos_token_id"],)
    assert cfg.bos_token_id == tok.token_to_id(st.BOS_TOKEN) == gen["bos_token_id"]


def test_round_trip_identical_tensors(tiny_dir: Path) -> None:
    loaded = load_checkpoint(tiny_dir, progress=False)
    stored = read_all(tiny_dir)
    ours = loaded.weights.state_dict(loaded.config)
    assert set(ours) == set(stored)
    for name, t in stored.items():
        assert torch.equal(ours[name], t), name
    assert loaded.weights.lm_head is loaded.weights.embed
    assert loaded.weights.dtype == torch.float32
    # the in-memory twin is the same model
    twin = synthetic_weights(loaded.config, 0).state_dict(loaded.config)
    assert all(torch.equal(twin[k], ours[k]) for k in ours)


def test_same_seed_is_byte_identical(tiny_dir: Path, tmp_path: Path) -> None:
    again = synth_checkpoint("tiny", tmp_path / "again", seed=0)
    names = sorted(p.name for p in tiny_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (tiny_dir / name).read_bytes() == (again / name).read_bytes(), name


def test_different_seeds_differ(tiny_dir: Path, tmp_path: Path) -> None:
    other = read_all(synth_checkpoint("tiny", tmp_path / "seed1", seed=1))
    base = read_all(tiny_dir)
    assert set(other) == set(base)
    for name in base:
        assert not torch.equal(other[name], base[name]), name


def test_fused_and_per_expert_load_the_same(tiny_dir: Path, tiny_per_expert_dir: Path) -> None:
    stored = read_all(tiny_per_expert_dir)
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in stored
    assert not any(k.endswith("experts.gate_up_proj") for k in stored)
    a = load_checkpoint(tiny_dir, progress=False)
    b = load_checkpoint(tiny_per_expert_dir, progress=False)
    assert (a.expert_layout, b.expert_layout) == ("fused", "per_expert")
    sa, sb = a.weights.state_dict(a.config), b.weights.state_dict(b.config)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    # gate rows first, then up
    I = a.config.intermediate_size
    assert torch.equal(
        sa["model.layers.1.mlp.experts.gate_up_proj"][3, :I],
        stored["model.layers.1.mlp.experts.3.gate_proj.weight"],
    )
    assert torch.equal(
        sa["model.layers.1.mlp.experts.gate_up_proj"][3, I:],
        stored["model.layers.1.mlp.experts.3.up_proj.weight"],
    )


def test_config_overrides_and_stored_dtype(tmp_path: Path) -> None:
    out = synth_checkpoint(
        "tiny",
        tmp_path / "c",
        config_overrides={"tie_word_embeddings": False, "num_hidden_layers": 3, "torch_dtype": "bfloat16"},
        shard_bytes=1 << 40,
    )
    assert (out / "model.safetensors").exists()
    stored = read_all(out)
    assert "lm_head.weight" in stored and stored["lm_head.weight"].dtype == torch.bfloat16
    loaded = load_checkpoint(out, progress=False)
    assert loaded.config.num_hidden_layers == 3 and loaded.weights.dtype == torch.bfloat16
    assert loaded.weights.lm_head is not loaded.weights.embed


def test_small_preset_geometry() -> None:
    cfg = synthetic_config("small")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok) == (
        512,
        8,
        32,
        4,
    )
    assert cfg.vocab_size == PRESETS["small"]["vocab_size"] == 16384
    mb = param_counts(cfg).total * 2 / 1e6  # bf16
    assert 150 < mb < 600


def test_synthetic_model_on_device_tiny_matches_disk(tiny_dir: Path) -> None:
    m = synthetic_model_on_device("tiny", device="cpu", dtype=torch.float32)
    loaded = load_checkpoint(tiny_dir, progress=False)
    assert m.config == loaded.config
    a, b = m.weights.state_dict(m.config), loaded.weights.state_dict(loaded.config)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert m.tokenizer.get_vocab_size() == m.config.vocab_size


def test_activations_stay_order_one(tiny_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model = transformers.Cohere2MoeForCausalLM.from_pretrained(tiny_dir).eval()
    ids = torch.randint(0, 4000, (1, 96), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    for h in out.hidden_states:
        assert 0.3 < h.float().std().item() < 20
    logits = out.logits[0]
    assert torch.isfinite(logits).all() and 0.5 < logits.std().item() < 10
    assert (logits.argmax(-1) == ids[0]).float().mean() < 0.6  # not a copy-the-input model


@pytest.mark.slow
def test_synthetic_model_full_path_pads_the_tokenizer() -> None:
    """The `full` path at a shrunken geometry (same 262,144 vocab): the tokenizer covers every id."""
    n = 2
    small = {
        "hidden_size": 32,
        "num_hidden_layers": n,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "intermediate_size": 8,
        "prefix_dense_intermediate_size": 16,
        "layer_types": ["full_attention", "sliding_attention"],
        "mlp_layer_types": ["dense", "sparse"],
    }
    m = synthetic_model_on_device("full", device="cpu", dtype=torch.float32, config_overrides=small)
    assert m.config.vocab_size == 262144 == m.tokenizer.get_vocab_size()
    assert m.config.eos_token_ids == (m.tokenizer.token_to_id(st.EOS_TOKEN),)
    assert m.tokenizer.id_to_token(262143) == "<|unused_" + str(262143 - 4096) + "|>"
    assert m.weights.embed.shape == (262144, 32)
