"""The weight ring's tensor maps (csrc/mk_abi.h, MK_TMAP_*): the TMA descriptors through which a ring
kernel (MKCODE_MK_RING=1, MK_MODE_RING) streams the GEMV tiles over a K range of longer rows (O-proj,
dense down, MoE down tiles of a K range, fused items' down slices) as boxes of
[box rows][MK_TMAP_BOX_K] bf16 with the 128-byte swizzle.

One map per (layer, weight kind), built once per backend: `MapSpec` is its geometry (checked here,
so that a bad pointer or stride is refused with a reason instead of an opaque driver code), the
module's `encode_tensor_map` makes the 128 bytes (cuTensorMapEncodeTiled), and `layer_table` lays
them out behind the layer pointer table (`layer_w`), where the kernel finds them. A kind's box rows
(`box_rows_for`) divide every tile row count the backend's tilings give that kind, so its tiles are
whole boxes; a tile that is not (a hand-made descriptor) keeps the register GEMV in the kernel.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from mkcode.backend.megakernel import abi

BOX_K = abi.MK_TMAP_BOX_K
MAP_BYTES = abi.MK_TMAP_BYTES
KINDS = abi.MK_TMAP_KINDS
ELEM_BYTES = 2  # bf16
# cuTensorMapEncodeTiled's limits for a 2D tiled map (CUDA driver API): the global address 16-byte
# aligned, strides multiples of 16 below 2^40, dimensions 1 .. 2^32, box dimensions at most 256.
GLOBAL_ALIGN = 16
STRIDE_ALIGN = 16
MAX_STRIDE = 1 << 40
MAX_DIM = 1 << 32
KIND_NAMES = {abi.MK_TMAP_O: "o", abi.MK_TMAP_DENSE_DOWN: "dense_down", abi.MK_TMAP_EXP_DOWN: "experts_down"}
assert BOX_K * ELEM_BYTES == abi.MK_TMAP_SWIZZLE, "a box row must be one 128-byte swizzle span"
assert (abi.MK_TMAP_BOX_ROWS_MIN * BOX_K * ELEM_BYTES) % abi.MK_TMAP_SMEM_ALIGN == 0


class TensorMapError(ValueError):
    """A weight matrix the ring cannot describe with a tensor map; the message says why."""


@dataclass(frozen=True)
class MapSpec:
    """The tensor map of one weight matrix: `rows` rows of `cols` bf16 at `ptr`, `row_bytes` apart."""

    layer: int
    kind: int
    ptr: int
    rows: int
    cols: int
    row_bytes: int
    box_rows: int

    @property
    def dims(self) -> tuple[int, int]:
        """The driver's globalDim (innermost first)."""
        return (self.cols, self.rows)

    @property
    def strides(self) -> tuple[int]:
        """The driver's globalStrides (bytes, the outer dimension's only)."""
        return (self.row_bytes,)

    @property
    def box(self) -> tuple[int, int]:
        """The driver's boxDim (innermost first)."""
        return (BOX_K, self.box_rows)

    @property
    def box_bytes(self) -> int:
        return BOX_K * ELEM_BYTES * self.box_rows

    def check(self) -> None:
        """Refuse (TensorMapError) what the driver or the kernel's box addressing cannot take."""
        where = f"layer {self.layer} {KIND_NAMES.get(self.kind, self.kind)}"
        if self.kind not in KIND_NAMES:
            raise TensorMapError(f"{where}: unknown tensor-map kind")
        if self.ptr <= 0 or self.ptr % GLOBAL_ALIGN:
            raise TensorMapError(f"{where}: address {self.ptr:#x} is not {GLOBAL_ALIGN}-byte aligned")
        if not (1 <= self.rows <= MAX_DIM and 1 <= self.cols <= MAX_DIM):
            raise TensorMapError(f"{where}: {self.rows} x {self.cols} is outside 1 .. 2^32 per dimension")
        if self.cols < BOX_K:
            raise TensorMapError(f"{where}: {self.cols} columns, fewer than a box row's {BOX_K}")
        if self.row_bytes < self.cols * ELEM_BYTES:
            raise TensorMapError(
                f"{where}: rows {self.row_bytes} bytes apart overlap ({self.cols} bf16 each)"
            )
        if self.row_bytes % STRIDE_ALIGN or self.row_bytes >= MAX_STRIDE:
            raise TensorMapError(
                f"{where}: row stride {self.row_bytes} bytes is not a multiple of {STRIDE_ALIGN} below 2^40"
            )
        if not swizzle_legal_box_rows(self.box_rows):
            raise TensorMapError(
                f"{where}: {self.box_rows} box rows; the ring takes powers of two from "
                f"{abi.MK_TMAP_BOX_ROWS_MIN} to {abi.MK_TMAP_BOX_ROWS_MAX}"
            )


def swizzle_legal_box_rows(n: int) -> bool:
    """Box rows the ring takes (the kernel's box_tile checks the same): a power of two of whole mma row
    groups (so a box is a multiple of the 128-byte swizzle's 1024-byte period, its stages stay
    aligned and the consumers deal its row groups over the warps evenly), within the hardware's 256."""
    return abi.MK_TMAP_BOX_ROWS_MIN <= n <= abi.MK_TMAP_BOX_ROWS_MAX and n & (n - 1) == 0


def box_rows_for(row_counts: Iterable[int]) -> int:
    """The box rows of a kind: the largest power of two up to MK_TMAP_BOX_ROWS_MAX dividing every tile
    row count; 0 (the kind keeps the register GEMV) when none is at least MK_TMAP_BOX_ROWS_MIN."""
    counts = [int(c) for c in row_counts]
    if not counts or min(counts) <= 0:
        return 0
    g = math.gcd(*counts)
    n = min(g & -g, abi.MK_TMAP_BOX_ROWS_MAX)
    return n if n >= abi.MK_TMAP_BOX_ROWS_MIN else 0


def kind_row_counts(cfg, tilings: Iterable) -> dict[int, set[int]]:
    """The row counts of each kind's K-range tiles on these tilings (mkcode.backend.megakernel.tiling):
    O-proj tiles, dense down tiles, and the experts' down matrix's fused slices (every hidden row)
    and K-range down tiles (moe_down_ready = 1)."""
    out: dict[int, set[int]] = {abi.MK_TMAP_O: set()}
    if cfg.prefix_dense_intermediate_size:
        out[abi.MK_TMAP_DENSE_DOWN] = set()
    if cfg.num_experts:
        out[abi.MK_TMAP_EXP_DOWN] = {cfg.hidden_size}
    for t in tilings:
        out[abi.MK_TMAP_O].add(t.o_rows)
        if abi.MK_TMAP_DENSE_DOWN in out:
            out[abi.MK_TMAP_DENSE_DOWN].add(t.dense_down_rows)
        if abi.MK_TMAP_EXP_DOWN in out and t.moe_down_ready == 1:
            out[abi.MK_TMAP_EXP_DOWN].add(t.moe_down_rows)
    return out


def kind_box_rows(cfg, tilings: Iterable) -> dict[int, int]:
    """Box rows per kind (0: none) for a backend whose steps use these tilings."""
    counts = kind_row_counts(cfg, list(tilings))
    return {k: box_rows_for(counts.get(k, ())) for k in range(KINDS)}


def _layer_matrices(layer) -> dict[int, object]:
    """A layer's weight tensors per kind (mkcode.backend.model.weights.LayerWeights)."""
    return {
        abi.MK_TMAP_O: layer.o,
        abi.MK_TMAP_DENSE_DOWN: layer.down,
        abi.MK_TMAP_EXP_DOWN: layer.experts_down,
    }


def layer_specs(layers, box_rows: dict[int, int]) -> list[MapSpec]:
    """The maps of every layer's present matrices whose kind has box rows: a [.., cols] tensor as
    prod(leading dims) rows of its last dimension (the experts' [E][H][I] down matrix: E * H rows)."""
    specs = []
    for i, lw in enumerate(layers):
        for kind, t in _layer_matrices(lw).items():
            if t is None or not box_rows.get(kind):
                continue
            if not t.is_contiguous():
                raise TensorMapError(f"layer {i} {KIND_NAMES[kind]}: not contiguous")
            cols = int(t.shape[-1])
            specs.append(
                MapSpec(
                    i,
                    kind,
                    int(t.data_ptr()),
                    int(t.numel()) // cols,
                    cols,
                    cols * ELEM_BYTES,
                    box_rows[kind],
                )
            )
    return specs


def table_offset(num_layers: int) -> int:
    """Byte offset of the tensor-map header in layer_w: after the [L][MK_LW_COUNT] int64 pointers,
    rounded up to MK_TMAP_BYTES."""
    raw = num_layers * abi.MK_LW_COUNT * 8
    return -(-raw // MAP_BYTES) * MAP_BYTES


def map_offset(num_layers: int, layer: int, kind: int) -> int:
    """Byte offset in layer_w of the map of (layer, kind)."""
    return table_offset(num_layers) + MAP_BYTES * (1 + layer * KINDS + kind)


def table_bytes(num_layers: int) -> int:
    return map_offset(num_layers, num_layers, 0)


Encoder = Callable[[MapSpec], bytes]


def module_encoder(mod) -> Encoder:
    """The extension's cuTensorMapEncodeTiled for a MapSpec (checked first)."""

    def encode(spec: MapSpec) -> bytes:
        spec.check()
        return mod.encode_tensor_map(spec.ptr, spec.rows, spec.cols, spec.row_bytes, spec.box_rows)

    return encode


def layer_table(
    ptr_rows: list[list[int]],
    specs: list[MapSpec] | None = None,
    box_rows: dict[int, int] | None = None,
    encode: Encoder | None = None,
) -> np.ndarray:
    """layer_w's int64 words: the [L][MK_LW_COUNT] pointers, then the tensor-map header and maps.
    Without specs (or encoder) the header stays zero: a ring kernel then finds no table and keeps
    every K-range tile on the register GEMV; the default kernel reads only the pointers."""
    L = len(ptr_rows)
    buf = bytearray(table_bytes(L))
    for i, row in enumerate(ptr_rows):
        if len(row) != abi.MK_LW_COUNT:
            raise ValueError(f"layer {i}: {len(row)} weight pointers, the ABI has {abi.MK_LW_COUNT}")
        struct.pack_into(f"<{abi.MK_LW_COUNT}q", buf, i * abi.MK_LW_COUNT * 8, *row)
    if specs and encode is not None:
        rows = box_rows or {}
        head = [0] * (MAP_BYTES // 4)
        head[abi.MK_TH_MAGIC] = abi.MK_TMAP_MAGIC
        head[abi.MK_TH_LAYERS] = L
        for k in range(KINDS):
            head[abi.MK_TH_ROWS0 + k] = int(rows.get(k, 0))
        seen = set()
        for s in specs:
            s.check()
            if not 0 <= s.layer < L:
                raise TensorMapError(f"layer {s.layer}: the table has {L} layers")
            if s.box_rows != head[abi.MK_TH_ROWS0 + s.kind]:
                raise TensorMapError(
                    f"layer {s.layer} {KIND_NAMES[s.kind]}: {s.box_rows} box rows, the kind's header says "
                    f"{head[abi.MK_TH_ROWS0 + s.kind]}"
                )
            if (s.layer, s.kind) in seen:
                raise TensorMapError(f"layer {s.layer} {KIND_NAMES[s.kind]}: two maps")
            seen.add((s.layer, s.kind))
            blob = bytes(encode(s))
            if len(blob) != MAP_BYTES:
                raise TensorMapError(f"the encoder gave {len(blob)} bytes, a map is {MAP_BYTES}")
            off = map_offset(L, s.layer, s.kind)
            buf[off : off + MAP_BYTES] = blob
        struct.pack_into(f"<{len(head)}i", buf, table_offset(L), *head)
    return np.frombuffer(bytes(buf), dtype=np.int64).copy()


def wanted(mod) -> bool:
    """Build maps for a backend: a ring kernel (MKCODE_MK_RING=1, the same switch that builds it) whose
    module can encode them."""
    from mkcode.backend.megakernel.build import RING_ENV

    return os.environ.get(RING_ENV) == "1" and hasattr(mod, "encode_tensor_map")


def backend_table(cfg, weights, ptr_rows: list[list[int]], tilings: Iterable, mod) -> tuple[np.ndarray, dict]:
    """layer_w's words for a backend and the box rows per kind it chose ({} without maps)."""
    if not wanted(mod):
        return layer_table(ptr_rows), {}
    rows = kind_box_rows(cfg, tilings)
    specs = layer_specs(weights.layers, rows)
    return layer_table(ptr_rows, specs, rows, module_encoder(mod)), rows
