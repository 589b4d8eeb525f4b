"""config.json validation: every field the architecture uses is read, bad values are clear errors."""

from __future__ import annotations

import json

import pytest

from mkcode.backend.model.config import ConfigError, ModelConfig, north_mini_code_config
from tests.backend.engine.helpers import tiny_config


def _raw(**kw):
    d = tiny_config().to_hf_dict()
    d.update(kw)
    return d


def test_release_geometry():
    cfg = north_mini_code_config()
    assert cfg.q_width == 4096 and cfg.hidden_size == 2048 and cfg.gqa_group == 8
    assert [i for i in range(49) if not cfg.is_sliding(i)] == list(range(0, 49, 4))
    assert cfg.dense_layers == [0]
    assert cfg.uses_rope(0) and cfg.uses_rope(1) and not cfg.uses_rope(4)
    assert cfg.window(1) == 4096 and cfg.window(4) is None


def test_round_trip_through_hf_dict(tmp_path):
    cfg = tiny_config()
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    assert ModelConfig.from_file(tmp_path) == cfg


def test_derives_layer_types_like_transformers():
    d = _raw(first_k_dense_replace=1, sliding_window_pattern=4)
    del d["layer_types"], d["mlp_layer_types"]
    cfg = ModelConfig.from_dict(d)
    assert cfg.layer_types == (
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
    )
    assert cfg.mlp_layer_types == ("dense",) + ("sparse",) * 5


def test_rope_parameters_form():
    d = _raw(rope_parameters={"rope_theta": 1234.0, "rope_type": "default"})
    del d["rope_theta"]
    assert ModelConfig.from_dict(d).rope_theta == 1234.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": None}, "missing field 'hidden_size'"),
        ({"layer_types": ["full_attention"] * 5}, "layer_types must list one entry per layer"),
        ({"layer_types": ["full_attention"] * 5 + ["chunked"]}, "unsupported value"),
        ({"mlp_layer_types": ["dense"] * 7}, "mlp_layer_types must list one entry per layer"),
        ({"expert_selection_fn": "relu"}, "expert_selection_fn"),
        ({"num_experts_per_tok": 99}, "num_experts_per_tok"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"num_shared_experts": 1}, "num_shared_experts"),
        ({"rms_norm_eps": None}, "rms_norm_eps"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"model_type": "llama"}, "cohere2_moe"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "rope_type"),
        ({"num_attention_heads": 3}, "multiple of num_key_value_heads"),
        ({"vocab_size": "big"}, "must be an integer"),
    ],
)
def test_bad_configs_are_clear_errors(change, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict(_raw(**change))


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"no config\.json"):
        ModelConfig.from_file(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_file(tmp_path)
