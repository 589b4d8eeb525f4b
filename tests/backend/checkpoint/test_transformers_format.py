"""The real on-disk format: transformers' save_pretrained output loads, and it loads our output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mkcode.backend.checkpoint import load_checkpoint
from tests.backend.checkpoint.helpers import read_all

transformers = pytest.importorskip("transformers")


def _hf_model(tie: bool) -> object:
    n = 5
    cfg = transformers.Cohere2MoeConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=32,
        prefix_dense_intermediate_size=96,
        num_hidden_layers=n,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        sliding_window=16,
        rope_theta=50000.0,
        rms_norm_eps=1e-6,
        logit_scale=0.5,
        tie_word_embeddings=tie,
        layer_types=["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n)],
        mlp_layer_types=["dense"] + ["sparse"] * (n - 1),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.Cohere2MoeForCausalLM(cfg)
    with torch.no_grad():  # init leaves some parameters at fixed values; make every one distinct
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


@pytest.mark.parametrize("tie", [True, False])
def test_save_pretrained_output_loads(tmp_path: Path, tie: bool) -> None:
    model = _hf_model(tie)
    model.save_pretrained(tmp_path)
    stored = read_all(tmp_path)
    # what transformers writes: per-expert names, fp32, no lm_head when tied
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in stored
    assert ("lm_head.weight" in stored) is (not tie)
    assert {t.dtype for t in stored.values()} == {torch.float32}
    loaded = load_checkpoint(tmp_path, progress=False)
    assert loaded.expert_layout == "per_expert"
    ref = model.state_dict()
    ours = loaded.weights.state_dict(loaded.config)
    for name, t in ours.items():
        assert torch.equal(t, ref[name]), name
    assert (loaded.weights.lm_head is loaded.weights.embed) is tie
    if not tie:
        assert torch.equal(loaded.weights.lm_head, ref["lm_head.weight"])


def test_save_pretrained_bf16_sharded_loads(tmp_path: Path) -> None:
    model = _hf_model(True).to(torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size="200KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    loaded = load_checkpoint(tmp_path, progress=False)
    assert loaded.used_index and len(loaded.files) > 1 and loaded.weights.dtype == torch.bfloat16
    ref = model.state_dict()
    assert all(torch.equal(t, ref[k]) for k, t in loaded.weights.state_dict(loaded.config).items())


@pytest.mark.parametrize("layout", ["fused", "per_expert"])
def test_from_pretrained_loads_synth_output(tiny_dir: Path, tiny_per_expert_dir: Path, layout: str) -> None:
    path = tiny_dir if layout == "fused" else tiny_per_expert_dir
    model = transformers.Cohere2MoeForCausalLM.from_pretrained(path)
    loaded = load_checkpoint(tiny_dir, progress=False)
    ref = model.state_dict()
    for name, t in loaded.weights.state_dict(loaded.config).items():
        assert torch.equal(ref[name], t), name
    assert model.config.logit_scale == loaded.config.logit_scale
    assert model.config.layer_types == list(loaded.config.layer_types)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    assert tok.eos_token_id == loaded.config.eos_token_ids[0]
