"""Loading a Hugging Face `cohere2_moe` checkpoint directory onto a device.

`load_checkpoint(dir)` reads `config.json`, finds the safetensors shards (through
`model.safetensors.index.json` when present), checks that the stored tensors are exactly the
model's (`layout.plan_load`), preallocates every canonical tensor on the target device in the
target dtype, and streams the stored tensors into them through safetensors' memory map, chunk by
chunk — per-expert tensors land directly in their slot of the fused expert tensors. The model is
never materialised on the host.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from mkcode.backend.checkpoint.errors import CheckpointConfigError, CheckpointError
from mkcode.backend.checkpoint.layout import LoadPlan, Placement, plan_load
from mkcode.backend.checkpoint.progress import ByteProgress
from mkcode.backend.checkpoint.sources import collect_tensors
from mkcode.backend.checkpoint.transfer import ChunkCopier, copy_stored_tensor
from mkcode.backend.model.config import ConfigError, ModelConfig
from mkcode.backend.model.weights import EMBED, ModelWeights

TORCH_DTYPES: dict[str, torch.dtype] = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass
class LoadedCheckpoint:
    """A loaded model: its config and weights, plus facts about where and how it was read."""

    config: ModelConfig
    weights: ModelWeights
    path: Path
    files: list[Path]
    expert_layout: str  # how the experts were stored: "fused", "per_expert", "mixed", "none"
    used_index: bool  # whether model.safetensors.index.json decided the files
    nbytes: int  # bytes read from the shards
    seconds: float  # wall time of the tensor reads (config and headers excluded)
    tokenizer_file: Path | None = None
    generation_config: dict[str, Any] = field(default_factory=dict)

    @property
    def gb_per_s(self) -> float:
        return self.nbytes / 1e9 / self.seconds if self.seconds > 0 else float("inf")


def read_config(ckpt_dir: str | Path) -> ModelConfig:
    """The checkpoint's config.json; a missing or invalid one raises `CheckpointConfigError`."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"{ckpt_dir}: not a directory (a checkpoint is a directory with config.json)")
    try:
        return ModelConfig.from_file(ckpt_dir / "config.json")
    except ConfigError as e:
        raise CheckpointConfigError(str(e)) from None


def plan_checkpoint(ckpt_dir: str | Path, config: ModelConfig | None = None) -> tuple[LoadPlan, bool]:
    """Validate a checkpoint directory without reading tensor data: (plan, whether an index was used)."""
    ckpt_dir = Path(ckpt_dir)
    cfg = config if config is not None else read_config(ckpt_dir)
    tensors, used_index = collect_tensors(ckpt_dir)
    return plan_load(cfg, tensors, where=str(ckpt_dir)), used_index


def resolve_dtype(plan: LoadPlan, dtype: torch.dtype | None) -> torch.dtype:
    """`dtype`, or when None the dtype holding most of the checkpoint's bytes."""
    if dtype is not None:
        return dtype
    by_dtype = plan.storage_dtypes()
    return TORCH_DTYPES[max(by_dtype, key=lambda k: by_dtype[k])] if by_dtype else torch.float32


def load_state_dict(
    ckpt_dir: str | Path,
    config: ModelConfig | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    progress: bool | Callable[[int, int], None] = True,
) -> dict[str, torch.Tensor]:
    """Canonical-name tensors of a checkpoint on `device` (tied lm_head omitted, as in `expected_shapes`)."""
    plan, _ = plan_checkpoint(ckpt_dir, config)
    sd, _ = _execute(plan, torch.device(device), resolve_dtype(plan, dtype), progress, Path(ckpt_dir))
    return sd


def load_checkpoint(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    progress: bool | Callable[[int, int], None] = True,
) -> LoadedCheckpoint:
    """Load the Hugging Face checkpoint directory `path` onto `device` in `dtype` (None: as stored).

    Raises `CheckpointError` (naming tensor and file) for anything that does not match config.json,
    and `CheckpointConfigError` (also a `ConfigError`) for a missing or invalid config.json.
    """
    ckpt_dir = Path(path)
    plan, used_index = plan_checkpoint(ckpt_dir)
    dev = torch.device(device)
    sd, seconds = _execute(plan, dev, resolve_dtype(plan, dtype), progress, ckpt_dir)
    weights = ModelWeights.from_state_dict(plan.config, sd)
    tok = ckpt_dir / "tokenizer.json"
    gen_path = ckpt_dir / "generation_config.json"
    gen: dict[str, Any] = {}
    if gen_path.exists():
        try:
            gen = json.loads(gen_path.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{gen_path}: not valid JSON ({e})") from e
    return LoadedCheckpoint(
        config=plan.config,
        weights=weights,
        path=ckpt_dir,
        files=plan.files,
        expert_layout=plan.expert_layout,
        used_index=used_index,
        nbytes=plan.nbytes,
        seconds=seconds,
        tokenizer_file=tok if tok.exists() else None,
        generation_config=gen,
    )


def _execute(
    plan: LoadPlan,
    device: torch.device,
    dtype: torch.dtype,
    progress: bool | Callable[[int, int], None],
    ckpt_dir: Path,
) -> tuple[dict[str, torch.Tensor], float]:
    """Allocate the targets and fill them from the shards; returns (state dict, seconds)."""
    targets = {name: torch.empty(shape, device=device, dtype=dtype) for name, shape in plan.targets.items()}
    by_file: dict[Path, list[Placement]] = defaultdict(list)
    for p in plan.placements:
        by_file[p.source.file].append(p)
    copier = ChunkCopier(device)
    t0 = time.perf_counter()
    callback = progress if callable(progress) else None
    bar_on = bool(progress) and callback is None
    with ByteProgress(f"loading {ckpt_dir.name}", plan.nbytes, enabled=bar_on, callback=callback) as bar:
        tied: list[Placement] = []
        files = list(by_file)
        for i, (file, placements) in enumerate(by_file.items()):
            for ahead in files[i : i + 2]:  # this shard and the next: kernel readahead off the disk
                _prefetch(ahead)
            with _open(file) as handle:
                for p in placements:  # header order = offset order: sequential reads
                    if p.tied_check:
                        tied.append(p)
                        continue
                    dst = targets[p.target][p.index] if p.index else targets[p.target]
                    try:
                        copy_stored_tensor(handle, p.source.name, dst, copier, bar.advance)
                    except SafetensorError as e:
                        raise CheckpointError(f"tensor {p.source.name!r} in {file}: cannot read ({e})") from e
        copier.finish()
        for p in tied:
            _check_tied(p, targets[EMBED], copier)
            bar.advance(p.source.nbytes)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return targets, time.perf_counter() - t0


def _prefetch(file: Path) -> None:
    """Ask the kernel to start reading `file` into the page cache (no-op where unsupported)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError:
        return
    try:
        advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def _open(file: Path) -> Any:
    try:
        return safe_open(file, framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from e


def _check_tied(p: Placement, embed: torch.Tensor, copier: ChunkCopier) -> None:
    """An lm_head stored next to tied embeddings must equal them (after the same dtype cast)."""
    with _open(p.source.file) as handle:
        scratch = torch.empty_like(embed)
        copy_stored_tensor(handle, p.source.name, scratch, copier)
        copier.finish()
        same = torch.equal(scratch, embed)
    if not same:
        raise CheckpointError(
            f"tensor {p.source.name!r} in {p.source.file} differs from {EMBED!r}, but config.json has "
            "tie_word_embeddings=true (set it to false to use a separate LM head)"
        )
