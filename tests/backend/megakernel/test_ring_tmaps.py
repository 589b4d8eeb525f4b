"""The weight ring's tensor maps on the host (backend/megakernel/tensor_maps.py, mk_abi.h MK_TMAP_*):
the geometry each map describes, the refusals of what the driver or the kernel's box addressing
cannot take, the box rows per kind for the tilings a backend runs, and the table behind the layer
pointers where a ring kernel finds them (no GPU: a fake encoder stands in for the driver)."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest
import torch

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel import tensor_maps as tm
from mkcode.backend.megakernel.build import RING_ENV
from mkcode.backend.megakernel.tiling import Tiling, default_tiling, tiling_for_batch
from mkcode.backend.model.config import north_mini_code_config
from mkcode.backend.model.weights import random_weights
from tests.backend.megakernel.cases import tiny_config

from .test_backend_host import FakeNative


def _spec(**kw) -> tm.MapSpec:
    base = dict(
        layer=0, kind=abi.MK_TMAP_O, ptr=0x7F0000001000, rows=2048, cols=4096, row_bytes=8192, box_rows=128
    )
    return tm.MapSpec(**{**base, **kw})


def _fake_map(spec: tm.MapSpec) -> bytes:
    """128 bytes that say which spec they encode (layer, kind, ptr, rows, cols, stride, box rows)."""
    head = struct.pack(
        "<iiqqqqi", spec.layer, spec.kind, spec.ptr, spec.rows, spec.cols, spec.row_bytes, spec.box_rows
    )
    return head + bytes(tm.MAP_BYTES - len(head))


def test_the_abi_constants_describe_one_swizzle_span_and_a_cu_tensor_map():
    assert tm.MAP_BYTES == 128  # sizeof(CUtensorMap): the module static_asserts the same
    assert abi.MK_TMAP_BOX_K * 2 == abi.MK_TMAP_SWIZZLE == 128
    assert abi.MK_TMAP_BOX_ROWS_MAX == 256 and abi.MK_TMAP_BOX_ROWS_MIN == 16
    assert abi.MK_TMAP_SMEM_ALIGN == 8 * abi.MK_TMAP_SWIZZLE  # the swizzle's period: 8 rows of 128 B
    assert sorted(tm.KIND_NAMES) == list(range(abi.MK_TMAP_KINDS))
    assert struct.pack("<i", abi.MK_TMAP_MAGIC) == b"TMAP"


def test_a_spec_is_the_drivers_geometry():
    s = _spec()
    s.check()
    assert s.dims == (4096, 2048)  # innermost first: columns, rows
    assert s.strides == (8192,)
    assert s.box == (64, 128)
    assert s.box_bytes == 128 * 128
    assert s.box_bytes % abi.MK_TMAP_SMEM_ALIGN == 0


@pytest.mark.parametrize(
    "change,why",
    [
        (dict(ptr=0x7F0000001008), "aligned"),
        (dict(ptr=0), "aligned"),
        (dict(row_bytes=8200), "multiple of 16"),
        (dict(row_bytes=1 << 40), "multiple of 16"),
        (dict(row_bytes=4096), "overlap"),
        (dict(cols=32, row_bytes=64), "fewer than a box row"),
        (dict(rows=0), "outside"),
        (dict(cols=(1 << 32) + 64, row_bytes=1 << 34), "outside"),
        (dict(box_rows=8), "powers of two"),
        (dict(box_rows=48), "powers of two"),
        (dict(box_rows=512), "powers of two"),
        (dict(kind=abi.MK_TMAP_KINDS), "unknown"),
    ],
)
def test_specs_the_ring_cannot_take_are_refused_with_the_reason(change, why):
    with pytest.raises(tm.TensorMapError, match=why):
        _spec(**change).check()


@pytest.mark.parametrize(
    "n,ok",
    [
        (16, True),
        (32, True),
        (64, True),
        (128, True),
        (256, True),
        (0, False),
        (8, False),
        (24, False),
        (48, False),
        (96, False),
        (512, False),
    ],
)
def test_swizzle_legal_box_rows(n, ok):
    assert tm.swizzle_legal_box_rows(n) is ok


@pytest.mark.parametrize(
    "counts,rows",
    [
        ([64], 64),
        ([64, 128], 64),
        ([2048], 256),
        ([2048, 512, 128], 128),
        ([96], 32),
        ([384, 2048], 128),
        ([24], 0),  # 8 rows: less than one mma row group
        ([], 0),
        ([0, 64], 0),
    ],
)
def test_box_rows_divide_every_tile_of_the_kind(counts, rows):
    got = tm.box_rows_for(counts)
    assert got == rows
    if rows:
        assert tm.swizzle_legal_box_rows(got) and all(c % got == 0 for c in counts)


def test_release_box_rows_on_the_engines_tilings():
    """At the release geometry every per-batch tiling (short and long contexts) gives O-proj tiles of 128
    rows, dense down tiles of 64 and fused slices of every hidden row: boxes of 128, 64 and 256 rows."""
    cfg = north_mini_code_config()
    tilings = [tiling_for_batch(cfg, default_tiling(cfg), b, p) for b in range(1, 9) for p in (None, 1 << 20)]
    counts = tm.kind_row_counts(cfg, tilings)
    assert counts == {abi.MK_TMAP_O: {128}, abi.MK_TMAP_DENSE_DOWN: {64}, abi.MK_TMAP_EXP_DOWN: {2048}}
    assert tm.kind_box_rows(cfg, tilings) == {
        abi.MK_TMAP_O: 128,
        abi.MK_TMAP_DENSE_DOWN: 64,
        abi.MK_TMAP_EXP_DOWN: 256,
    }


def test_k_range_down_tiles_bring_their_rows_into_the_experts_kind():
    cfg = north_mini_code_config()
    t = replace(default_tiling(cfg), norm_inline=1, moe_down_ready=1, moe_down_rows=384)
    assert tm.kind_row_counts(cfg, [t])[abi.MK_TMAP_EXP_DOWN] == {2048, 384}
    assert tm.kind_box_rows(cfg, [t])[abi.MK_TMAP_EXP_DOWN] == 128


def test_a_config_without_dense_layers_or_experts_has_no_such_kinds():
    cfg = replace(tiny_config(), prefix_dense_intermediate_size=0, num_experts=0)
    assert tm.kind_row_counts(cfg, [Tiling(o_rows=32)]) == {abi.MK_TMAP_O: {32}}
    assert tm.kind_box_rows(cfg, [Tiling(o_rows=32)]) == {abi.MK_TMAP_O: 32, 1: 0, 2: 0}


def test_table_layout_offsets():
    for L in (1, 6, 49):
        off = tm.table_offset(L)
        assert (
            off % tm.MAP_BYTES == 0
            and L * abi.MK_LW_COUNT * 8 <= off < L * abi.MK_LW_COUNT * 8 + tm.MAP_BYTES
        )
        assert tm.map_offset(L, 0, 0) == off + tm.MAP_BYTES
        assert tm.map_offset(L, L - 1, tm.KINDS - 1) + tm.MAP_BYTES == tm.table_bytes(L)
    assert tm.table_offset(49) == 4352  # 49 x 11 x 8 = 4312, rounded up to 128


def _ptrs(L: int) -> list[list[int]]:
    return [[(l + 1) * 1000 + s for s in range(abi.MK_LW_COUNT)] for l in range(L)]


def test_the_table_keeps_the_pointers_and_places_every_map():
    L = 3
    rows = {abi.MK_TMAP_O: 64, abi.MK_TMAP_DENSE_DOWN: 0, abi.MK_TMAP_EXP_DOWN: 256}
    specs = [
        _spec(layer=l, kind=k, box_rows=rows[k], ptr=0x10000 * (l + 1) + 0x100 * k)
        for l in range(L)
        for k in (abi.MK_TMAP_O, abi.MK_TMAP_EXP_DOWN)
    ]
    words = tm.layer_table(_ptrs(L), specs, rows, _fake_map)
    assert words.dtype == np.int64 and words.nbytes == tm.table_bytes(L)
    assert words[: L * abi.MK_LW_COUNT].reshape(L, -1).tolist() == _ptrs(L)
    raw = words.tobytes()
    head = struct.unpack_from("<32i", raw, tm.table_offset(L))
    assert head[abi.MK_TH_MAGIC] == abi.MK_TMAP_MAGIC and head[abi.MK_TH_LAYERS] == L
    assert [head[abi.MK_TH_ROWS0 + k] for k in range(tm.KINDS)] == [64, 0, 256]
    for s in specs:
        off = tm.map_offset(L, s.layer, s.kind)
        assert raw[off : off + tm.MAP_BYTES] == _fake_map(s)
    off = tm.map_offset(L, 1, abi.MK_TMAP_DENSE_DOWN)  # an absent map: zeros
    assert raw[off : off + tm.MAP_BYTES] == bytes(tm.MAP_BYTES)


def test_without_maps_the_header_stays_zero():
    words = tm.layer_table(_ptrs(2))
    raw = words.tobytes()
    assert words[: 2 * abi.MK_LW_COUNT].reshape(2, -1).tolist() == _ptrs(2)
    assert raw[tm.table_offset(2) :] == bytes(tm.table_bytes(2) - tm.table_offset(2))


@pytest.mark.parametrize(
    "specs,why",
    [
        ([_spec(layer=3)], "the table has 2 layers"),
        ([_spec(box_rows=64)], "header says 128"),
        ([_spec(), _spec(ptr=0x7F0000002000)], "two maps"),
        ([_spec(ptr=0x7F0000001004)], "aligned"),
    ],
)
def test_a_table_refuses_inconsistent_maps(specs, why):
    with pytest.raises(tm.TensorMapError, match=why):
        tm.layer_table(_ptrs(2), specs, {abi.MK_TMAP_O: 128}, _fake_map)


def test_an_encoder_of_the_wrong_size_is_refused():
    with pytest.raises(tm.TensorMapError, match="64 bytes"):
        tm.layer_table(_ptrs(1), [_spec()], {abi.MK_TMAP_O: 128}, lambda s: bytes(64))


def test_layer_specs_read_each_matrix_as_rows_of_its_last_dimension():
    cfg = tiny_config()
    w = random_weights(cfg, device="cpu", dtype=torch.bfloat16, seed=1)
    rows = {abi.MK_TMAP_O: 32, abi.MK_TMAP_DENSE_DOWN: 64, abi.MK_TMAP_EXP_DOWN: 64}
    specs = {(s.layer, s.kind): s for s in tm.layer_specs(w.layers, rows)}
    H, I, E = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts
    for i, lw in enumerate(w.layers):
        o = specs[(i, abi.MK_TMAP_O)]
        assert (o.ptr, o.rows, o.cols, o.row_bytes, o.box_rows) == (
            lw.o.data_ptr(),
            H,
            cfg.q_width,
            2 * cfg.q_width,
            32,
        )
        assert ((i, abi.MK_TMAP_DENSE_DOWN) in specs) == (lw.down is not None)
        assert ((i, abi.MK_TMAP_EXP_DOWN) in specs) == (lw.experts_down is not None)
        if lw.experts_down is not None:
            e = specs[(i, abi.MK_TMAP_EXP_DOWN)]
            assert (e.ptr, e.rows, e.cols, e.row_bytes) == (lw.experts_down.data_ptr(), E * H, I, 2 * I)
        if lw.down is not None:
            d = specs[(i, abi.MK_TMAP_DENSE_DOWN)]
            assert (d.rows, d.cols) == (H, cfg.prefix_dense_intermediate_size)
    # a kind without box rows gets no maps
    none = tm.layer_specs(w.layers, {**rows, abi.MK_TMAP_EXP_DOWN: 0})
    assert not [s for s in none if s.kind == abi.MK_TMAP_EXP_DOWN]


class EncodingNative(FakeNative):
    """The fake extension with the module's encoder (records its calls)."""

    def __init__(self):
        super().__init__()
        self.encoded: list[tuple] = []

    def encode_tensor_map(self, ptr, rows, cols, row_bytes, box_rows):
        self.encoded.append((ptr, rows, cols, row_bytes, box_rows))
        return _fake_map(tm.MapSpec(0, 0, ptr, rows, cols, row_bytes, box_rows))


def test_the_module_encoder_checks_first_and_passes_the_geometry():
    mod = EncodingNative()
    enc = tm.module_encoder(mod)
    s = _spec()
    assert enc(s) == _fake_map(replace(s, layer=0, kind=0))
    assert mod.encoded == [(s.ptr, s.rows, s.cols, s.row_bytes, s.box_rows)]
    with pytest.raises(tm.TensorMapError):
        enc(_spec(row_bytes=8200))
    assert len(mod.encoded) == 1  # refused before the driver saw it


@pytest.mark.parametrize("env,maps", [("1", True), ("0", False), (None, False)])
def test_a_backend_builds_the_maps_for_a_ring_kernel_only(monkeypatch, env, maps):
    from mkcode.backend.megakernel.backend import MegakernelBackend

    if env is None:
        monkeypatch.delenv(RING_ENV, raising=False)
    else:
        monkeypatch.setenv(RING_ENV, env)
    cfg = tiny_config()
    w = random_weights(cfg, device="cpu", dtype=torch.bfloat16, seed=2)
    mod = EncodingNative()
    t = Tiling(
        qkv_rows=32, o_rows=32, router_rows=4, mlp_splits=2, moe_down_rows=32, lm_rows=96, max_splits=4
    )
    be = MegakernelBackend(cfg, w, tiling=t, native_module=mod)
    L = cfg.num_hidden_layers
    raw = be.layer_w.cpu().numpy().tobytes()
    assert len(raw) == tm.table_bytes(L)
    ptrs = np.frombuffer(raw[: L * abi.MK_LW_COUNT * 8], dtype=np.int64).reshape(L, -1)
    assert int(ptrs[0, abi.MK_LW_O]) == w.layers[0].o.data_ptr()
    head = struct.unpack_from("<32i", raw, tm.table_offset(L))
    if not maps:
        assert head[abi.MK_TH_MAGIC] == 0 and not mod.encoded and be.tmap_box_rows == {}
        return
    assert head[abi.MK_TH_MAGIC] == abi.MK_TMAP_MAGIC and head[abi.MK_TH_LAYERS] == L
    # the backend's one tiling: O-proj tiles of 32 rows, dense down 64 (hidden 64), the experts'
    # hidden rows 64 (no K-range down tiles)
    assert be.tmap_box_rows == {abi.MK_TMAP_O: 32, abi.MK_TMAP_DENSE_DOWN: 64, abi.MK_TMAP_EXP_DOWN: 64}
    n_dense = sum(lw.down is not None for lw in w.layers)
    n_moe = sum(lw.experts_down is not None for lw in w.layers)
    assert len(mod.encoded) == L + n_dense + n_moe
    off = tm.map_offset(L, 0, abi.MK_TMAP_O)
    assert raw[off : off + tm.MAP_BYTES] == _fake_map(
        tm.MapSpec(0, 0, w.layers[0].o.data_ptr(), cfg.hidden_size, cfg.q_width, 2 * cfg.q_width, 32)
    )
