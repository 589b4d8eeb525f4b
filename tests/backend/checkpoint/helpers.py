"""Helpers for the checkpoint tests: read every stored tensor, write (broken) variants."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def read_all(ckpt: Path) -> dict[str, torch.Tensor]:
    """Every stored tensor of a checkpoint directory, by stored name."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(f, framework="pt") as h:
            for k in h.keys():  # noqa: SIM118 (safe_open has no __iter__)
                out[k] = h.get_tensor(k)
    return out


def write_variant(
    src: Path, dst: Path, shards: Mapping[str, Mapping[str, torch.Tensor]], *, index: bool = False
) -> Path:
    """A checkpoint at `dst` with src's config.json and the given {file name: tensors} shards."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    weight_map = {}
    for fname, tensors in shards.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, dst / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
    if index:
        (dst / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    return dst
