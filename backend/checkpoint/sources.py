"""Finding a checkpoint's safetensors shards and reading their headers (no tensor data).

With `model.safetensors.index.json` the index decides which files belong to the model, and every
entry is checked against the file it names (a tensor listed but absent, or present but not listed,
is an error). Without an index every `*.safetensors` file in the directory is read. Either way a
tensor stored twice is an error naming both files.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

from mkcode.backend.checkpoint.errors import CheckpointError
from mkcode.backend.checkpoint.layout import TensorInfo

INDEX_NAME = "model.safetensors.index.json"


def read_header(file: Path) -> dict[str, TensorInfo]:
    """The tensors of one safetensors file, in file order, without reading their data."""
    try:
        with safe_open(file, framework="pt", device="cpu") as f:
            out = {}
            for name in f.offset_keys():
                sl = f.get_slice(name)
                out[name] = TensorInfo(name, file, tuple(int(d) for d in sl.get_shape()), sl.get_dtype())
            return out
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from e


def read_index(path: Path) -> dict[str, str]:
    """The `weight_map` of an index file: stored tensor name -> shard file name."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read the index ({e})") from e
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointError(f"{path}: no 'weight_map' object mapping tensor names to file names")
    return weight_map


def collect_tensors(ckpt_dir: Path) -> tuple[dict[str, TensorInfo], bool]:
    """Every stored tensor of the checkpoint in `ckpt_dir`, and whether an index file was used."""
    index_path = ckpt_dir / INDEX_NAME
    if index_path.exists():
        return _collect_with_index(ckpt_dir, index_path), True
    files = sorted(ckpt_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{ckpt_dir}: no *.safetensors files and no {INDEX_NAME}")
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        for name, info in read_header(file).items():
            if name in tensors:
                raise CheckpointError(
                    f"duplicated tensor {name!r}: stored in {tensors[name].file} and in {file}"
                )
            tensors[name] = info
    return tensors, False


def _collect_with_index(ckpt_dir: Path, index_path: Path) -> dict[str, TensorInfo]:
    weight_map = read_index(index_path)
    by_file: dict[str, list[str]] = {}
    for name, fname in weight_map.items():
        by_file.setdefault(fname, []).append(name)
    tensors: dict[str, TensorInfo] = {}
    for fname, names in by_file.items():
        file = ckpt_dir / fname
        if not file.is_file():
            raise CheckpointError(
                f"{index_path} maps tensor {names[0]!r} (and {len(names) - 1} more) to {file}, which does not exist"
            )
        header = read_header(file)
        listed = set(names)
        for name in names:
            if name not in header:
                raise CheckpointError(
                    f"{index_path} lists tensor {name!r} in {file}, but that file does not hold it"
                )
        for name, info in header.items():
            if name not in listed:
                other = weight_map.get(name)
                if other is not None:
                    raise CheckpointError(
                        f"duplicated tensor {name!r}: stored in {file} and in {ckpt_dir / other} (the index names the latter)"
                    )
                raise CheckpointError(f"tensor {name!r} in {file} is not listed in {index_path}")
            tensors[name] = info
    return tensors
