"""Writing tensors as Hugging Face safetensors shards plus `model.safetensors.index.json`.

Tensors are described up front (`TensorSpec`: name, shape, dtype, and a function that makes the
data), so the shard plan and file names (`model-00001-of-00003.safetensors`) are known before any
data exists, and only one shard's tensors are in memory at a time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from mkcode.backend.checkpoint.sources import INDEX_NAME


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: `make()` returns it (contiguous, on the CPU, of `shape` and `dtype`)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def plan_shards(specs: Sequence[TensorSpec], shard_bytes: int) -> list[list[TensorSpec]]:
    """Greedy, in order: a new shard starts when the next tensor would push one over `shard_bytes`."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def shard_name(i: int, n: int) -> str:
    """HF's shard file names; a single shard is `model.safetensors`."""
    return "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def write_safetensors_shards(
    specs: Sequence[TensorSpec], out_dir: str | Path, *, shard_bytes: int, write_index: bool = True
) -> list[Path]:
    """Write `specs` as shards into `out_dir` (and the index); returns the shard paths.

    Output is byte-for-byte a function of the specs' data (sorted JSON, fixed metadata)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("duplicate tensor names in the specs")
    shards = plan_shards(specs, shard_bytes)
    paths: list[Path] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        fname = shard_name(i, len(shards))
        tensors = {}
        for spec in shard:
            t = spec.make()
            if tuple(t.shape) != spec.shape or t.dtype != spec.dtype:
                raise ValueError(
                    f"{spec.name}: made {tuple(t.shape)} {t.dtype}, declared {spec.shape} {spec.dtype}"
                )
            tensors[spec.name] = t.contiguous()
            weight_map[spec.name] = fname
        save_file(tensors, out / fname, metadata={"format": "pt"})
        paths.append(out / fname)
    if write_index:
        index = {
            "metadata": {"total_size": sum(s.nbytes for s in specs)},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (out / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return paths
