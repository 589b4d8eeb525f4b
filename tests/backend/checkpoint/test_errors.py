"""Every broken checkpoint is a CheckpointError that names the tensor and the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mkcode.backend.checkpoint import CheckpointConfigError, CheckpointError, load_checkpoint
from mkcode.backend.model.config import ConfigError
from tests.backend.checkpoint.helpers import read_all, write_variant

Q0 = "model.layers.0.self_attn.q_proj.weight"


def _load(path: Path) -> None:
    load_checkpoint(path, progress=False)


def test_missing_tensor(tiny_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_dir)
    del stored[Q0]
    d = write_variant(tiny_dir, tmp_path / "m", {"model.safetensors": stored})
    with pytest.raises(CheckpointError, match=rf"missing tensor '{Q0}'.*{tmp_path / 'm'}"):
        _load(d)


def test_missing_expert_piece(tiny_per_expert_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_per_expert_dir)
    del stored["model.layers.2.mlp.experts.5.up_proj.weight"]
    d = write_variant(tiny_per_expert_dir, tmp_path / "m", {"model.safetensors": stored})
    with pytest.raises(CheckpointError, match=r"'model\.layers\.2\.mlp\.experts\.5\.up_proj\.weight'"):
        _load(d)


def test_unexpected_tensor(tiny_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_dir)
    d = write_variant(
        tiny_dir,
        tmp_path / "u",
        {"a.safetensors": stored, "b.safetensors": {"model.layers.0.mlp.bias": torch.zeros(3)}},
    )
    with pytest.raises(
        CheckpointError, match=r"unexpected tensor 'model\.layers\.0\.mlp\.bias' in .*b\.safetensors"
    ):
        _load(d)


def test_expert_index_out_of_range_is_unexpected(tiny_per_expert_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_per_expert_dir)
    stored["model.layers.1.mlp.experts.16.down_proj.weight"] = stored[
        "model.layers.1.mlp.experts.0.down_proj.weight"
    ].clone()
    d = write_variant(tiny_per_expert_dir, tmp_path / "u", {"model.safetensors": stored})
    with pytest.raises(
        CheckpointError, match=r"unexpected tensor 'model\.layers\.1\.mlp\.experts\.16\.down_proj"
    ):
        _load(d)


def test_wrong_shape(tiny_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_dir)
    stored[Q0] = stored[Q0][:-1]
    d = write_variant(tiny_dir, tmp_path / "s", {"w.safetensors": stored})
    with pytest.raises(
        CheckpointError,
        match=rf"tensor '{Q0}' in .*w\.safetensors has shape \[127, 96\], expected \[128, 96\]",
    ):
        _load(d)


def test_duplicated_tensor_across_shards(tiny_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_dir)
    d = write_variant(tiny_dir, tmp_path / "d", {"a.safetensors": stored, "b.safetensors": {Q0: stored[Q0]}})
    with pytest.raises(CheckpointError, match=rf"duplicated tensor '{Q0}'.*a\.safetensors.*b\.safetensors"):
        _load(d)


def test_duplicated_tensor_outside_the_index(tiny_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_dir)
    rest = {k: v for k, v in stored.items() if k != Q0}
    d = write_variant(tiny_dir, tmp_path / "d", {"a.safetensors": stored, "b.safetensors": {Q0: stored[Q0]}})
    index = {"weight_map": {**dict.fromkeys(rest, "a.safetensors"), Q0: "b.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"duplicated tensor '{Q0}'.*a\.safetensors.*b\.safetensors"):
        _load(d)


def test_experts_both_fused_and_per_expert(tiny_dir: Path, tiny_per_expert_dir: Path, tmp_path: Path) -> None:
    fused = read_all(tiny_dir)
    piece = "model.layers.3.mlp.experts.0.gate_proj.weight"
    extra = {piece: read_all(tiny_per_expert_dir)[piece]}
    d = write_variant(tiny_dir, tmp_path / "x", {"a.safetensors": fused, "b.safetensors": extra})
    with pytest.raises(
        CheckpointError, match=r"duplicated weights: .*experts.*b\.safetensors.*a\.safetensors"
    ):
        _load(d)


def test_index_points_to_missing_file(tiny_dir: Path, tmp_path: Path) -> None:
    d = Path(shutil.copytree(tiny_dir, tmp_path / "i"))
    victim = sorted(d.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(
        CheckpointError, match=rf"maps tensor '.*' .*to .*{victim.name}, which does not exist"
    ):
        _load(d)


def test_index_lists_tensor_missing_from_file(tiny_dir: Path, tmp_path: Path) -> None:
    d = Path(shutil.copytree(tiny_dir, tmp_path / "i"))
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.layers.0.mlp.ghost.weight"] = "model-00001-of-00003.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(
        CheckpointError, match=r"'model\.layers\.0\.mlp\.ghost\.weight' in .*model-00001-of-00003"
    ):
        _load(d)


def test_file_holds_tensor_not_in_index(tiny_dir: Path, tmp_path: Path) -> None:
    d = Path(shutil.copytree(tiny_dir, tmp_path / "i"))
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    fname = index["weight_map"].pop(Q0)
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"tensor '{Q0}' in .*{fname} is not listed in"):
        _load(d)


def test_corrupted_safetensors_header(tiny_dir: Path, tmp_path: Path) -> None:
    d = Path(shutil.copytree(tiny_dir, tmp_path / "c"))
    victim = sorted(d.glob("model-*.safetensors"))[0]
    data = bytearray(victim.read_bytes())
    data[8:40] = b"#" * 32  # inside the JSON header
    victim.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{victim.name}: not a readable safetensors file"):
        _load(d)


def test_truncated_safetensors_file(tiny_dir: Path, tmp_path: Path) -> None:
    d = Path(shutil.copytree(tiny_dir, tmp_path / "t"))
    victim = sorted(d.glob("model-*.safetensors"))[-1]
    victim.write_bytes(victim.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=rf"{victim.name}"):
        _load(d)


def test_unsupported_dtype(tiny_dir: Path, tmp_path: Path) -> None:
    stored = read_all(tiny_dir)
    stored[Q0] = stored[Q0].double()
    d = write_variant(tiny_dir, tmp_path / "f64", {"w.safetensors": stored})
    with pytest.raises(
        CheckpointError, match=rf"unsupported dtype F64 for tensor '{Q0}' in .*w\.safetensors"
    ):
        _load(d)


def test_missing_config_json(tiny_dir: Path, tmp_path: Path) -> None:
    d = Path(shutil.copytree(tiny_dir, tmp_path / "nc"))
    (d / "config.json").unlink()
    with pytest.raises(CheckpointConfigError, match=r"config\.json") as info:
        _load(d)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, CheckpointError)


def test_bad_config(tiny_dir: Path, tmp_path: Path) -> None:
    d = Path(shutil.copytree(tiny_dir, tmp_path / "bc"))
    raw = json.loads((d / "config.json").read_text())
    raw["num_experts_per_tok"] = 99
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"config\.json: num_experts_per_tok"):
        _load(d)


def test_config_geometry_disagrees_with_tensors(tiny_dir: Path, tmp_path: Path) -> None:
    d = Path(shutil.copytree(tiny_dir, tmp_path / "geo"))
    raw = json.loads((d / "config.json").read_text())
    raw["hidden_size"] = 128
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"tensor 'model\.embed_tokens\.weight' in .*has shape"):
        _load(d)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        _load(tmp_path / "nope")


def test_no_safetensors(tiny_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    shutil.copy(tiny_dir / "config.json", d / "config.json")
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        _load(d)
