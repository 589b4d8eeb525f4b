"""Where each tensor of a checkpoint goes in the canonical (fused-expert) layout.

A checkpoint may store a sparse layer's experts fused, as transformers' `Cohere2MoeExperts`
parameters (`mlp.experts.gate_up_proj [E, 2I, H]`, `mlp.experts.down_proj [E, H, I]`), or per
expert, as transformers' `save_pretrained` writes them (`mlp.experts.{e}.gate_proj.weight [I, H]`,
`.up_proj.weight [I, H]`, `.down_proj.weight [H, I]`). This module maps a stored name to a
`Placement` (canonical target + the region of it the tensor fills) and checks that a set of stored
tensors covers every canonical tensor exactly once. It reads no tensor data, so `inspect` uses it
too.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mkcode.backend.checkpoint.errors import CheckpointError
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.weights import EMBED, LM_HEAD, expected_shapes

# safetensors dtype strings the loader accepts (anything else is refused by name).
SUPPORTED_DTYPES = ("F32", "F16", "BF16")

_PER_EXPERT = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$"
)
# Buffers some older exports carry; they hold nothing the model needs.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")

EXPERT_LAYOUT_FUSED = "fused"
EXPERT_LAYOUT_PER_EXPERT = "per_expert"


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as stored: its name, file, shape and safetensors dtype string."""

    name: str
    file: Path
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * _ITEMSIZE[self.dtype]


_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


def itemsize(dtype: str) -> int:
    """Bytes per element of a safetensors dtype string (1 for unknown ones, which are refused later)."""
    return _ITEMSIZE.get(dtype, 1)


@dataclass(frozen=True)
class Placement:
    """Where one stored tensor lands: `target[index]` (the whole target when index is empty)."""

    source: TensorInfo
    target: str
    index: tuple[int | slice, ...] = ()
    # True for an lm_head stored next to tied embeddings: compared with the embedding, not loaded.
    tied_check: bool = False


@dataclass(frozen=True)
class LoadPlan:
    """A validated mapping of every stored tensor onto the canonical tensors of `config`."""

    config: ModelConfig
    targets: dict[str, tuple[int, ...]]  # canonical name -> shape
    placements: list[Placement]
    ignored: list[TensorInfo]
    expert_layout: str  # "fused", "per_expert", "mixed" or "none" (no sparse layers)

    @property
    def files(self) -> list[Path]:
        seen: dict[Path, None] = {}
        for p in self.placements:
            seen.setdefault(p.source.file, None)
        return list(seen)

    @property
    def nbytes(self) -> int:
        return sum(p.source.nbytes for p in self.placements)

    def storage_dtypes(self) -> dict[str, int]:
        """Bytes stored per safetensors dtype string."""
        out: dict[str, int] = defaultdict(int)
        for p in self.placements:
            out[p.source.dtype] += p.source.nbytes
        return dict(out)


def _where(t: TensorInfo) -> str:
    return f"tensor {t.name!r} in {t.file}"


def place(cfg: ModelConfig, shapes: Mapping[str, tuple[int, ...]], t: TensorInfo) -> Placement | None:
    """Map one stored tensor to its canonical target, or None if the model has no such tensor."""
    if t.name in shapes:
        return Placement(t, t.name)
    if t.name == LM_HEAD and cfg.tie_word_embeddings:
        return Placement(t, EMBED, tied_check=True)
    m = _PER_EXPERT.match(t.name)
    if m is None:
        return None
    layer, expert, proj = int(m[1]), int(m[2]), m[3]
    if layer >= cfg.num_hidden_layers or cfg.is_dense(layer) or expert >= cfg.num_experts:
        return None
    prefix = f"model.layers.{layer}.mlp.experts."
    I = cfg.intermediate_size
    if proj == "gate_proj":
        return Placement(t, prefix + "gate_up_proj", (expert, slice(0, I)))
    if proj == "up_proj":
        return Placement(t, prefix + "gate_up_proj", (expert, slice(I, 2 * I)))
    return Placement(t, prefix + "down_proj", (expert,))


def region_shape(target_shape: tuple[int, ...], index: tuple[int | slice, ...]) -> tuple[int, ...]:
    """Shape of `target[index]` for the integer/slice indexes `place` produces."""
    shape: list[int] = []
    for dim, ix in enumerate(index):
        if isinstance(ix, slice):
            start, stop, _ = ix.indices(target_shape[dim])
            shape.append(stop - start)
    shape.extend(target_shape[len(index) :])
    return tuple(shape)


def plan_load(cfg: ModelConfig, tensors: Mapping[str, TensorInfo], *, where: str = "") -> LoadPlan:
    """Check that `tensors` (stored name -> info) is exactly the model of `cfg` and say where each goes.

    Raises `CheckpointError` for an unexpected tensor, a wrong shape, an unsupported dtype, a layer
    stored both fused and per expert, and any canonical tensor (or per-expert piece) that is missing.
    `where` names the checkpoint in the missing-tensor message.
    """
    shapes = expected_shapes(cfg)
    placements: list[Placement] = []
    ignored: list[TensorInfo] = []
    whole: dict[str, TensorInfo] = {}  # target -> the tensor that fills it entirely
    pieces: dict[str, dict[tuple, TensorInfo]] = defaultdict(dict)  # target -> per-expert pieces
    for t in tensors.values():
        p = place(cfg, shapes, t)
        if p is None:
            if _IGNORED.search(t.name):
                ignored.append(t)
                continue
            raise CheckpointError(f"unexpected {_where(t)}: the model of this config.json has no such tensor")
        if t.dtype not in SUPPORTED_DTYPES:
            raise CheckpointError(
                f"unsupported dtype {t.dtype} for {_where(t)}; supported: {', '.join(SUPPORTED_DTYPES)}"
            )
        want = region_shape(shapes[p.target], p.index)
        if t.shape != want:
            raise CheckpointError(f"{_where(t)} has shape {list(t.shape)}, expected {list(want)}")
        if p.tied_check:
            placements.append(p)
            continue
        if p.index:
            other = whole.get(p.target)
            if other is not None:
                raise CheckpointError(
                    f"duplicated weights: {_where(t)} and {_where(other)} both hold experts of the same layer"
                )
            pieces[p.target][_key(p.index)] = t
        else:
            if p.target in pieces:
                other = next(iter(pieces[p.target].values()))
                raise CheckpointError(
                    f"duplicated weights: {_where(t)} and {_where(other)} both hold experts of the same layer"
                )
            whole[p.target] = t
        placements.append(p)

    for name, shape in shapes.items():
        if name in whole:
            continue
        if name not in pieces:
            raise CheckpointError(f"missing tensor {name!r} {list(shape)} in {where or 'the checkpoint'}")
        missing = _missing_pieces(cfg, name, pieces[name])
        if missing:
            more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
            raise CheckpointError(
                f"missing tensor(s) {', '.join(repr(m) for m in missing[:3])}{more} in {where or 'the checkpoint'}: "
                f"{name!r} is stored per expert but incomplete"
            )

    fused = any(n.startswith("model.layers.") and ".mlp.experts." in n for n in whole)
    per_expert = bool(pieces)
    layout = "mixed" if fused and per_expert else "per_expert" if per_expert else "fused" if fused else "none"
    return LoadPlan(config=cfg, targets=shapes, placements=placements, ignored=ignored, expert_layout=layout)


def _key(index: tuple[int | slice, ...]) -> tuple:
    return tuple((ix.start, ix.stop) if isinstance(ix, slice) else ix for ix in index)


def _missing_pieces(cfg: ModelConfig, target: str, have: Mapping[tuple, TensorInfo]) -> list[str]:
    prefix = target.rsplit(".", 1)[0] + "."  # model.layers.N.mlp.experts.
    I = cfg.intermediate_size
    missing = []
    for e in range(cfg.num_experts):
        if target.endswith("gate_up_proj"):
            if (e, (0, I)) not in have:
                missing.append(f"{prefix}{e}.gate_proj.weight")
            if (e, (I, 2 * I)) not in have:
                missing.append(f"{prefix}{e}.up_proj.weight")
        elif (e,) not in have:
            missing.append(f"{prefix}{e}.down_proj.weight")
    return missing
