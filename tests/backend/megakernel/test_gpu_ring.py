"""GPU tests of engine v2's weight ring (`MK_MODE_RING`, csrc/mk_ring.cuh; `-m gpu`): they run only
in a process whose kernel was built with the ring compiled in (`MKCODE_MK_RING=1`), and skip
otherwise. Every GEMV-shaped op through the ring against its torch semantics on fresh random inputs
with poisoned outputs (the per-op check of test_gpu.py): tiles of whole rows as bulk copies, K ranges
(O-proj, dense down, a fused item's down slice) as TMA tensor-map boxes; whole steps against the
fp32 reference at the reduced geometry (BS 1, 2, 4, 8, ragged contexts crossing pages and the
window), steps in a row, and the release geometry at 8K. Each test also checks the stages the ring
consumed (`MK_ERR_RING_STAGES`): per op exactly the plan's (ring_model.desc_stages, the kernel's
ring_plan from the same descriptors), so neither a silent fallback to the register GEMV nor a box
path that streams the wrong amount can pass for the ring."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace
from functools import partial

import pytest
import torch

from mkcode.backend.megakernel import abi, ring_model, tensor_maps
from mkcode.backend.megakernel.build import RING_ENV

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if os.environ.get(RING_ENV) != "1":
    pytest.skip(f"needs the ring kernel ({RING_ENV}=1)", allow_module_level=True)

from mkcode.backend.megakernel.backend import MegakernelBackend  # noqa: E402
from mkcode.backend.megakernel.emulator_ops import moe_item  # noqa: E402
from mkcode.backend.megakernel.schedule import expert_counter  # noqa: E402
from mkcode.backend.megakernel.tiling import Tiling, default_tiling, tiling_for_batch  # noqa: E402
from mkcode.backend.model.config import north_mini_code_config  # noqa: E402
from mkcode.backend.model.weights import random_weights  # noqa: E402

from .test_gpu import (  # noqa: E402
    BS8_CONTEXTS,
    CFG,
    _consecutive_steps,
    _op_check,
    _op_descs,
    _step_check,
)

RING = abi.MK_MODE_RING
# every GEMV-shaped op: tiles of whole rows as bulk copies, the K ranges (O-proj, dense down) as boxes
RING_OPS = (
    abi.MK_OP_QKV,
    abi.MK_OP_ROUTER,
    abi.MK_OP_DENSE_UP,
    abi.MK_OP_MOE_UP,
    abi.MK_OP_MOE_DOWN,
    abi.MK_OP_LM_HEAD,
    abi.MK_OP_OPROJ,
    abi.MK_OP_DENSE_DOWN,
)
K_RANGE_OPS = (abi.MK_OP_OPROJ, abi.MK_OP_DENSE_DOWN)


def _stages(be) -> int:
    return int(be.err[abi.MK_ERR_RING_STAGES])


def _planned(be, descs) -> int:
    """The stages the kernel's plans stream for these descriptors (ring_model.desc_stages)."""
    return sum(sum(ring_model.desc_stages(be.cfg, d, be.tmap_box_rows)) for d in descs)


@contextmanager
def ring(be, stages: int | None = None):
    """The backend in ring mode, afterwards back to the default. Asserts that the ring consumed
    exactly `stages` stages, or (None) some."""
    before = _stages(be)
    be.prefetch_mode = RING
    try:
        yield
    finally:
        be.prefetch_mode = abi.MK_PREFETCH_DEFAULT
    torch.cuda.synchronize()
    got = _stages(be) - before
    if stages is None:
        assert got > 0, "no GEMV went through the ring"
    else:
        assert got == stages, f"the ring consumed {got} stages, the plans stream {stages}"


@contextmanager
def without_tensor_maps(be):
    """The backend's layer table with its tensor-map header zeroed (the pointers kept): a ring kernel
    then keeps every K-range tile on the register GEMV."""
    saved = be.layer_w.clone()
    L = be.cfg.num_hidden_layers
    ptrs = saved[: L * abi.MK_LW_COUNT].view(L, abi.MK_LW_COUNT).tolist()
    be.layer_w.copy_(torch.from_numpy(tensor_maps.layer_table(ptrs)).to(be.layer_w.device))
    rows, be.tmap_box_rows = be.tmap_box_rows, {}
    try:
        yield
    finally:
        be.layer_w.copy_(saved)
        be.tmap_box_rows = rows


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, device="cuda", dtype=torch.bfloat16, seed=3, std=0.05)


@pytest.fixture(scope="module")
def plain(weights):
    return weights, MegakernelBackend(CFG, weights, tiling=replace(default_tiling(CFG), norm_inline=0))


@pytest.fixture(scope="module")
def inline(weights):
    return weights, MegakernelBackend(CFG, weights, tiling=replace(default_tiling(CFG), norm_inline=1))


def test_the_backend_built_its_tensor_maps(plain, inline):
    """The ring kernel's backends carry a map of every kind, box rows fitted to their tiling (O-proj
    and dense down tiles of 64 rows, the experts' 512 hidden rows in boxes of 256)."""
    for _, be in (plain, inline):
        assert be.tmap_box_rows == {abi.MK_TMAP_O: 64, abi.MK_TMAP_DENSE_DOWN: 64, abi.MK_TMAP_EXP_DOWN: 256}
        raw = be.layer_w.cpu().numpy().tobytes()
        off = tensor_maps.table_offset(CFG.num_hidden_layers)
        assert int.from_bytes(raw[off : off + 4], "little") == abi.MK_TMAP_MAGIC


@pytest.mark.parametrize("op", RING_OPS, ids=lambda o: abi.OPNAMES[o])
@pytest.mark.parametrize("B", [1, 5, 8])
def test_gemv_op_through_the_ring(plain, op, B):
    w, be = plain
    n = _planned(be, _op_descs(op, B, op * 10 + B))  # _op_check's descriptors (its seed)
    assert n > 0
    with ring(be, stages=n):
        _op_check(CFG, w, be, op, B)


@pytest.mark.parametrize("op", RING_OPS, ids=lambda o: abi.OPNAMES[o])
@pytest.mark.parametrize("B", [1, 8])
def test_gemv_op_norm_inline_through_the_ring(inline, op, B):
    """With norm_inline: the staging's RMSNorm factors scale the ring's sums; O-proj, dense and MoE
    down add into x."""
    w, be = inline
    n = _planned(be, _op_descs(op, B, op * 10 + B))
    with ring(be, stages=n):
        _op_check(CFG, w, be, op, B)


@pytest.mark.parametrize("op", K_RANGE_OPS, ids=lambda o: abi.OPNAMES[o])
def test_k_range_tiles_without_tensor_maps_keep_the_register_gemv(plain, op):
    w, be = plain
    with without_tensor_maps(be), ring(be, stages=0):
        _op_check(CFG, w, be, op, 5)


def _fused_descs(cols: int, B: int, seed: int) -> list[list[int]]:
    """Fused MoE items of `cols` columns: their up tiles go through the ring as rows, their down
    slices as boxes (64 or 128 columns; 32 is not a whole box: the register slice)."""
    import numpy as np

    c = CFG
    rng = np.random.default_rng(seed)
    slots = sorted(rng.choice(B * c.num_experts_per_tok, size=min(B, 3), replace=False).tolist())
    table = [(5, slots), (11, [s for s in range(B * c.num_experts_per_tok) if s not in slots][:8])]
    per = c.intermediate_size // cols
    return [
        moe_item(
            table,
            2,
            i,
            0,
            per,
            partial(Tiling(moe_up_cols=cols).moe_up_tile, CFG),
            0,
            128,
            lambda ly, e: expert_counter(CFG, ly, e),
            True,
        )
        for i in range(2 * per)
    ]


@pytest.mark.parametrize("cols", [32, 64, 128])
@pytest.mark.parametrize("B", [1, 5, 8])
@pytest.mark.parametrize("fixture", ["plain", "inline"])
def test_fused_moe_item_in_ring_mode(request, fixture, cols, B):
    """A fused item's up tile through the ring (rows), then its down slice (boxes, the loader running
    on into them during the up GEMV) into moe_acc (plain) or the layer's sum x(l+1) (norm_inline)."""
    w, be = request.getfixturevalue(fixture)
    descs = _fused_descs(cols, B, seed=B + cols)
    plans = [ring_model.desc_stages(CFG, d, be.tmap_box_rows) for d in descs]
    assert all(len(p) == (1 if cols == 32 else 2) for p in plans), plans
    with ring(be, stages=sum(map(sum, plans))):
        _op_check(CFG, w, be, abi.MK_OP_MOE_FUSED, B, descs=descs)


@pytest.mark.parametrize(
    "contexts",
    [[300], [63, 64], [5, 300, 255, 256], [1, 64, 65, 127, 128, 257, 511, 700]],
    ids=lambda c: f"bs{len(c)}",
)
def test_step_through_the_ring_reduced(weights, contexts):
    """A whole step on the engine's tiling for the batch (fused MoE items and lazy claims at BS 1,
    norm_inline) against the routed fp32 reference."""
    t = tiling_for_batch(CFG, default_tiling(CFG), len(contexts))
    be = MegakernelBackend(CFG, weights, tiling=t)
    with ring(be):
        _step_check(CFG, weights, be, contexts, seed=len(contexts) + 70)


def test_step_with_k_range_down_tiles_through_the_ring(weights):
    """MoE down tiles over one up tile's columns (moe_down_ready = 1; up tiles of 128 of the 256
    columns, so the downs are K ranges, not whole rows) go through the ring as boxes of the experts'
    map: a whole BS 8 step against the reference."""
    t = replace(tiling_for_batch(CFG, default_tiling(CFG), 8), moe_down_ready=1, moe_up_cols=128)
    t.validate(CFG)
    be = MegakernelBackend(CFG, weights, tiling=t)
    rb = be.tmap_box_rows[abi.MK_TMAP_EXP_DOWN]
    I = CFG.intermediate_size
    assert ring_model.ring_tile(t.moe_up_cols, t.moe_down_rows, None, I) is None  # not whole rows
    assert ring_model.box_plan(t.moe_up_cols, t.moe_down_rows, rb) is not None  # boxes
    with ring(be):
        _step_check(CFG, weights, be, BS8_CONTEXTS, seed=77)


@pytest.mark.parametrize("contexts", [[300], BS8_CONTEXTS], ids=["bs1", "bs8"])
def test_consecutive_steps_through_the_ring(weights, contexts):
    """Four steps in a row on one backend: the ring's stage numbering runs on across items and
    launches are independent (each launch starts its ring afresh)."""
    t = tiling_for_batch(CFG, default_tiling(CFG), len(contexts))
    be = MegakernelBackend(CFG, weights, tiling=t)
    with ring(be):
        _consecutive_steps(weights, be, contexts, seed=83, steps=4)


@pytest.fixture(scope="module")
def release():
    cfg = north_mini_code_config()
    return cfg, random_weights(cfg, device="cuda", dtype=torch.bfloat16, seed=0)


@pytest.mark.parametrize(
    "contexts", [[8192], [100, 4095, 4096, 4097, 8192, 63, 64, 9000]], ids=["bs1", "bs8"]
)
def test_step_through_the_ring_release_geometry(release, contexts):
    cfg, w = release
    t = tiling_for_batch(cfg, default_tiling(cfg), len(contexts))
    be = MegakernelBackend(cfg, w, tiling=t)
    with ring(be):
        _step_check(cfg, w, be, contexts, seed=len(contexts) + 90)
