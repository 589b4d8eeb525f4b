"""The weight ring's model (backend/megakernel/ring_model.py): its geometry against the kernel's
constraints, and its role protocol under random and adversarial interleavings: the kernel's rules
never deadlock nor read a stage overwritten before its release; a loader that runs past its call,
an armer that arms more than the ring holds, or a loader that skips the empty wait is caught."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel import ring_model as rm
from mkcode.backend.megakernel.ring_model import RING_CW, RING_D, RING_ROWS, RING_STAGE, ring_tile, run_block
from mkcode.backend.megakernel.tiling import default_tiling, tiling_for_batch
from mkcode.backend.model.config import north_mini_code_config


def test_header_constants_are_the_kernels():
    c = rm.header_constants()
    assert c == {"RING_D": RING_D, "RING_STAGE": RING_STAGE, "RING_ROWS": RING_ROWS, "RING_CW": RING_CW}
    assert RING_D >= 2  # a stage streams while another is read


@pytest.mark.parametrize("klen", [256, 512, 768, 1024, 2048])
def test_contiguous_tiles_go_through_the_ring(klen):
    assert ring_tile(klen, 256, nsplit=128) == 256 // RING_ROWS
    assert klen * 2 * RING_ROWS <= RING_STAGE  # a stage (8 whole rows) fits its slot
    assert klen % (32 * RING_CW) == 0  # every consumer warp gets whole k-steps of 32


@pytest.mark.parametrize(
    "klen,nrows,nsplit,ld",
    [
        (4096, 64, 64, 4096),  # 8 rows over a stage
        (1024, 64, 64, 4096),  # a K range of longer rows (O-proj)
        (96, 64, 64, 96),  # not whole k-steps per warp
        (2048, 20, 20, 2048),  # not whole stages of 8 rows
        (2048, 32, 12, 2048),  # a stage straddling the gate / up split
        (0, 64, 64, 0),
    ],
)
def test_shapes_that_keep_the_register_gemv(klen, nrows, nsplit, ld):
    assert ring_tile(klen, nrows, nsplit, ld) is None


RING_KINDS = {"qkv", "router", "moe_up", "moe_down", "lm_head", "dense_up"}


@pytest.mark.parametrize("B", [1, 2, 4, 8])
def test_which_release_gemvs_go_through_the_ring(B):
    """At the release geometry on the engine's tiling for the batch: the tiles of whole rows go
    through the ring (MoE down tiles too: their K is the whole intermediate size), the K ranges of
    longer rows (O-proj, dense down, a fused item's down slice) keep the register GEMV."""
    cfg = north_mini_code_config()
    t = tiling_for_batch(cfg, default_tiling(cfg), B)
    for name, shape in rm.gemv_shapes(cfg, t).items():
        assert (ring_tile(*shape) is not None) == (name in RING_KINDS), (name, shape)


def _random_items(rng: random.Random, n: int) -> list[list[int]]:
    items = []
    for _ in range(n):
        tiles = [rng.randint(1, 3 * RING_D)]
        if rng.random() < 0.5:  # a fused item: up tile + down slice
            tiles.append(rng.randint(1, 3 * RING_D))
        items.append(tiles)
    return items


ADVERSARIES = {
    "random": None,
    "loader_first": lambda en: next((i for i, e in enumerate(en) if e[0] == "issue"), 0),
    "land_last": lambda en: max(range(len(en)), key=lambda i: (en[i][0] != "land", en[i][0] == "issue")),
    "warp0_starves": lambda en: max(
        range(len(en)), key=lambda i: (en[i] != ("consume", 0), en[i][0] == "land")
    ),
    "newest_copy_first": lambda en: max(range(len(en)), key=lambda i: (en[i][0] == "land", en[i][1])),
}


def _pick(adversaries: dict, name: str, trial: int):
    """The scheduler `name` of `adversaries`; "random" (None): one seeded by `trial`."""
    pick = adversaries[name]
    if pick is None:
        r = random.Random(trial)
        pick = lambda en, r=r: r.randrange(len(en))  # noqa: E731
    return pick


@pytest.mark.parametrize("adversary", list(ADVERSARIES))
def test_the_kernels_protocol_never_deadlocks_nor_overwrites(adversary):
    rng = random.Random(hash(adversary) & 0xFFFF)
    for trial in range(40):
        items = _random_items(rng, 6)
        res = run_block(items, pick=_pick(ADVERSARIES, adversary, trial))
        assert res.ok and not res.deadlock, (items, res)


def test_a_loader_running_past_its_call_deadlocks():
    """Issuing the down slice's stages beyond D during the up call waits for releases that only the
    down call makes: the up call's barrier never completes."""
    res = run_block([[2, 2 * RING_D]], upto=lambda ends, t, total, d: total)
    assert res.deadlock
    assert run_block([[2, 2 * RING_D]]).ok  # the kernel's rule on the same item


def test_arming_more_than_the_ring_holds_deadlocks():
    res = run_block([[3 * RING_D]], arm=lambda total, d: min(total, d + 1))
    assert res.deadlock


def test_a_loader_skipping_the_empty_wait_overwrites_a_stage():
    caught = False
    for seed in range(20):
        r = random.Random(seed)
        res = run_block(
            [[4 * RING_D], [RING_D, 3]], pick=lambda en, r=r: r.randrange(len(en)), wait_empty=False
        )
        caught |= bool(res.overwritten)
    assert caught


def test_consumers_reading_two_stages_at_once_stay_deadlock_free():
    """The paired variant (a 16-row group over two stages, measured slower) is safe as well."""
    for seed in range(10):
        r = random.Random(seed)
        res = run_block(_random_items(r, 5), group=2, pick=lambda en, r=r: r.randrange(len(en)))
        assert res.ok, res


def test_one_consumer_warp_holds_back_the_loader_but_not_forever():
    """With warp 0 served last, the loader still finishes: every stage it waits for is released by
    warps that can run."""
    res = run_block([[RING_D * 5, RING_D * 2]] * 3, pick=ADVERSARIES["warp0_starves"])
    assert res.ok and res.steps > 0


# ---- K-range tiles as TMA boxes ------------------------------------------------------------------------

BOX_GEOMS = [  # (klen, rows, box rows): release O-proj, dense down, fused slices; reduced; odd k blocks
    (1024, 128, 128),
    (768, 64, 64),
    (128, 2048, 256),
    (256, 2048, 256),
    (64, 512, 256),
    (384, 384, 128),
    (1024, 64, 64),
    (256, 64, 64),
    (192, 32, 16),
    (320, 16, 16),
]


@pytest.mark.parametrize("klen,rows,rbox", BOX_GEOMS)
def test_box_stages_are_whole_aligned_boxes_of_one_row_block(klen, rows, rbox):
    plan = rm.box_plan(klen, rows, rbox)
    assert plan is not None
    assert plan.stage_bytes <= RING_STAGE and plan.stage_bytes % abi.MK_TMAP_SMEM_ALIGN == 0
    assert plan.kb % plan.bps == 0  # a stage never straddles two row blocks
    seen = []
    for st in range(plan.stages):
        boxes = rm.stage_boxes(plan, st, x0=192, y0=4096)
        assert len({y for _, y in boxes}) == 1  # one row block
        assert [x for x, _ in boxes] == list(range(boxes[0][0], boxes[0][0] + plan.bps * 64, 64))
        seen += boxes
    want = [(192 + 64 * k, 4096 + rbox * b) for b in range(rows // rbox) for k in range(klen // 64)]
    assert seen == want  # every box once, row block major


def test_stages_are_as_large_as_the_k_blocks_allow():
    assert rm.box_plan(1024, 128, 128).stage_bytes == RING_STAGE  # release O-proj: 8 stages of 32 KB
    assert rm.box_plan(1024, 128, 128).stages == 8
    assert rm.box_plan(768, 64, 64).stages == 3  # release dense down: 96 KB
    assert rm.box_plan(128, 2048, 256).stages == 16  # a BS 1 fused slice: 512 KB
    assert rm.box_plan(192, 64, 64).bps == 1  # 3 k blocks: one box per stage


@pytest.mark.parametrize(
    "klen,rows,rbox",
    [
        (96, 64, 64),
        (1024, 96, 64),
        (1024, 128, 48),
        (1024, 128, 8),
        (1024, 512, 512),
        (0, 64, 64),
        (64, 0, 64),
    ],
)
def test_box_shapes_that_keep_the_register_gemv(klen, rows, rbox):
    assert rm.box_plan(klen, rows, rbox) is None


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _box_case(klen, rows, rbox, pad, seed):
    rng = np.random.default_rng(seed)
    x0, y0 = 128, 48
    W = _bf16_bits(rng.standard_normal((y0 + rows + 32, x0 + klen + 64)))
    act = np.zeros((8, klen + pad), dtype=np.uint16)
    act[:, :klen] = _bf16_bits(rng.standard_normal((8, klen)))
    act[:, klen:] = _bf16_bits(np.full((8, pad), np.nan))  # padding never read
    want = _values(W[y0 : y0 + rows, x0 : x0 + klen]) @ _values(act[:, :klen]).T
    return W, act, x0, y0, want


@pytest.mark.parametrize(
    "klen,rows,rbox,pad",
    [
        (256, 64, 64, 32),  # G = 4 < 8 warps: two warps per group, boxes dealt by twos
        (1024, 128, 128, 32),  # G = 8: one group per warp
        (128, 512, 256, 32),  # G = 16: two groups per warp; a slice's k blocks over two stages
        (128, 256, 256, 0),  # a fused item's act rows (lds = n)
        (192, 32, 16, 32),  # G = 1, one box per stage: most warps idle
        (320, 32, 32, 64),
    ],
)
def test_the_box_consumers_undo_the_swizzle(klen, rows, rbox, pad):
    """ring_consume_box lane by lane (ldmatrix addresses, mma fragments, the row blocks' adds) over the
    bytes the TMA leaves in the stages gives W act exactly (fp64 sums of bf16 products)."""
    plan = rm.box_plan(klen, rows, rbox)
    W, act, x0, y0, want = _box_case(klen, rows, rbox, pad, seed=klen + rows)
    got = rm.consume_boxes(W, act, plan, rows, x0, y0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


def test_consumers_that_ignore_the_swizzle_read_the_wrong_k(monkeypatch):
    """The same consumers over unswizzled stages: the check above is sensitive to the XOR."""
    plan = rm.box_plan(256, 64, 64)
    W, act, x0, y0, want = _box_case(256, 64, 64, 32, seed=5)
    monkeypatch.setattr(rm, "swizzle128", lambda off: off)
    got = rm.consume_boxes(W, act, plan, 64, x0, y0)
    assert np.abs(got - want).max() > 1.0


@pytest.mark.parametrize("B", [1, 2, 4, 8])
def test_with_tensor_maps_every_release_gemv_goes_through_the_ring(B):
    """At the release geometry with the backend's tensor maps every GEMV item kind streams through the
    ring: whole-row tiles as rows, O-proj, dense down and fused slices as boxes; without maps the K
    ranges keep the register GEMV."""
    from mkcode.backend.megakernel import tensor_maps as tm

    cfg = north_mini_code_config()
    tilings = [tiling_for_batch(cfg, default_tiling(cfg), b, p) for b in range(1, 9) for p in (None, 1 << 20)]
    rows = tm.kind_box_rows(cfg, tilings)
    t = tiling_for_batch(cfg, default_tiling(cfg), B)
    with_maps = rm.item_tiles(cfg, t, rows)
    without = rm.item_tiles(cfg, t, {})
    for name, tiles in with_maps.items():
        assert tiles, name
        assert all(n > 0 for n in tiles)
        if name in ("oproj", "dense_down"):
            assert without[name] == []
    for name, shape in rm.gemv_shapes(cfg, t).items():
        path = rm.ring_path(shape, rows.get(rm.BOX_KINDS.get(name, -1), 0))
        want = "boxes" if name in ("oproj", "dense_down", "moe_down_slice") else "rows"
        assert path is not None and path[0] == want, (name, shape, path)
    if t.moe_fused:  # up tile then its slice, and the slice alone without maps is not streamed
        assert len(with_maps["moe_fused"]) == 2 and len(without["moe_fused"]) == 1


def _desc(op, a=(0, 0, 0, 0, 0)) -> list[int]:
    d = [0] * abi.MK_DESC_WORDS
    d[abi.MK_F_OP] = op
    d[abi.MK_F_A0 : abi.MK_F_A4 + 1] = a
    return d


@pytest.mark.parametrize("B", [1, 8])
def test_a_descriptors_plan_is_its_kinds(B):
    """desc_stages (the kernel's ring_plan from descriptor words, which the GPU tests use to expect the
    stages consumed) agrees with item_tiles (the tiling's shapes)."""
    from mkcode.backend.megakernel import tensor_maps as tm

    cfg = north_mini_code_config()
    t = tiling_for_batch(cfg, default_tiling(cfg), B)
    rows = tm.kind_box_rows(cfg, [t])
    kinds = rm.item_tiles(cfg, t, rows)
    G = cfg.gqa_group * cfg.head_dim
    D = cfg.prefix_dense_intermediate_size
    descs = {
        "qkv": _desc(abi.MK_OP_QKV, (t.qkv_rows, t.qkv_rows, 0, 0, 0)),
        "router": _desc(abi.MK_OP_ROUTER, (0, t.router_rows, 0, 0, 0)),
        "oproj": _desc(abi.MK_OP_OPROJ, (t.o_rows, t.o_rows, G, 2 * G, 1)),
        "dense_up": _desc(abi.MK_OP_DENSE_UP, (0, t.dense_up_cols, 0, 0, 0)),
        "dense_down": _desc(
            abi.MK_OP_DENSE_DOWN, (0, t.dense_down_rows, D // t.mlp_splits, 2 * D // t.mlp_splits, 1)
        ),
        "moe_up": _desc(abi.MK_OP_MOE_UP, (3, t.moe_up_cols, t.moe_up_cols, 0, 0)),
        "moe_down": _desc(abi.MK_OP_MOE_DOWN, (3, t.moe_down_rows, t.moe_down_rows, 0, 0)),
        "lm_head": _desc(abi.MK_OP_LM_HEAD, (0, t.lm_rows, 0, 0, 0)),
    }
    if t.moe_fused:
        descs["moe_fused"] = _desc(abi.MK_OP_MOE_FUSED, (3, t.moe_up_cols, t.moe_up_cols, 0, 0))
    for name, d in descs.items():
        assert rm.desc_stages(cfg, d, rows) == kinds[name], name
    # a MoE down tile of a K range (moe_down_ready) goes as boxes of the experts' map
    k_range = _desc(abi.MK_OP_MOE_DOWN, (3, 0, 128, 256, 128))
    assert rm.desc_stages(cfg, k_range, {abi.MK_TMAP_EXP_DOWN: 128}) == [rm.box_plan(128, 128, 128).stages]
    assert rm.desc_stages(cfg, k_range, {}) == []


@pytest.mark.parametrize("adversary", list(ADVERSARIES))
@pytest.mark.parametrize("B", [1, 8])
def test_release_items_with_box_tiles_never_deadlock(adversary, B):
    """Blocks of release items (their real stage counts, with the tensor maps): QKV, O-proj boxes, MoE
    up tiles, fused items (up tile, then its 16-stage slice, the loader running on into the slice by
    RING_D stages) and fused items whose up tile keeps the registers (the slice alone), LM tiles, in
    random orders, under every scheduler."""
    from mkcode.backend.megakernel import tensor_maps as tm

    cfg = north_mini_code_config()
    t = tiling_for_batch(cfg, default_tiling(cfg), B)
    kinds = {k: v for k, v in rm.item_tiles(cfg, t, tm.kind_box_rows(cfg, [t])).items() if v}
    if "moe_fused" in kinds:
        kinds["slice_only"] = kinds["moe_fused"][1:]
    rng = random.Random(B * 7 + len(adversary))
    names = sorted(kinds)
    for trial in range(6):
        items = [kinds[rng.choice(names)] for _ in range(8)]
        res = run_block(items, pick=_pick(ADVERSARIES, adversary, trial))
        assert res.ok and not res.deadlock, (items, res)


# ---- a loader running ahead across items: a grid of blocks with dependency waits ---------------------


def _random_grid(rng: random.Random, nblocks: int, nitems: int) -> list[list[rm.GridItem]]:
    """Per-block lists of items in one global topological order: item g depends on some earlier
    items of other blocks (a DAG, deadlock-free without the ring); a fifth of the items stream
    nothing through the ring (attention, norms), a third are fused (two tiles)."""
    blocks: list[list[rm.GridItem]] = [[] for _ in range(nblocks)]
    placed: list[tuple[int, int]] = []
    for _ in range(nitems):
        b = rng.randrange(nblocks)
        others = [p for p in placed if p[0] != b]
        deps = rng.sample(others, min(len(others), rng.randint(0, 2)))
        u = rng.random()
        tiles = [] if u < 0.2 else [rng.randint(1, 3 * RING_D)]
        if tiles and u > 0.66:
            tiles.append(rng.randint(1, 3 * RING_D))
        blocks[b].append(rm.GridItem(tiles, deps))
        placed.append((b, len(blocks[b]) - 1))
    return blocks


GRID_ADVERSARIES = {
    "random": None,
    "loader_first": lambda en: next((i for i, e in enumerate(en) if e[0] == "issue"), 0),
    "land_last": lambda en: max(range(len(en)), key=lambda i: (en[i][0] != "land", en[i][0] == "issue")),
    "wait_last": lambda en: max(range(len(en)), key=lambda i: (en[i][0] != "wait", en[i][0] == "issue")),
    "block0_starves": lambda en: max(range(len(en)), key=lambda i: (en[i][1] != 0, en[i][0] != "land")),
    "newest_copy_first": lambda en: max(range(len(en)), key=lambda i: (en[i][0] == "land", en[i][2])),
}


@pytest.mark.parametrize("adversary", list(GRID_ADVERSARIES))
def test_claim_ahead_never_deadlocks_and_each_item_reads_its_own_weights(adversary):
    """Every block streams its next item's first stages during its current item's last call (or at
    the start of an item without ring stages); across blocks whose waits depend on each other, no
    deadlock, no stage overwritten before its release, and each item reads exactly its weights in
    order."""
    rng = random.Random(hash(adversary) & 0xFFFF)
    ahead = 0
    for trial in range(30):
        grid = _random_grid(rng, rng.randint(2, 4), 14)
        for on in (False, True):
            res = rm.run_grid(grid, ahead=on, pick=_pick(GRID_ADVERSARIES, adversary, trial))
            assert res.ok and not res.deadlock, (grid, res.errors)
            if not on:
                assert res.ahead_issued == 0
            ahead += res.ahead_issued
    assert ahead > 0  # the run-ahead happened


def test_the_next_items_stages_stream_before_its_wait_which_another_sm_holds():
    """Block 0: A (3 stages), then B (its wait needs block 1's C, which needs A): with the
    run-ahead B's first D stages are issued during A's call, while C cannot have run yet."""
    grid = [
        [rm.GridItem([3]), rm.GridItem([3 * RING_D], [(1, 0)])],
        [rm.GridItem([2], [(0, 0)])],
    ]
    for seed in range(20):
        r = random.Random(seed)
        res = rm.run_grid(grid, pick=lambda en, r=r: r.randrange(len(en)))
        assert res.ok, res.errors
        assert res.early == {(0, 1): RING_D}
        off = rm.run_grid(grid, ahead=False, pick=lambda en, r=r: r.randrange(len(en)))
        assert off.ok and off.early == {}


def test_an_item_without_ring_stages_arms_the_next_one():
    grid = [[rm.GridItem([]), rm.GridItem([2 * RING_D]), rm.GridItem([]), rm.GridItem([1])]]
    res = rm.run_grid(grid)
    assert res.ok and res.early == {(0, 1): RING_D, (0, 3): 1}


def test_running_ahead_by_more_than_the_ring_holds_deadlocks():
    """A loader that streams more of the next item than the current call frees waits for releases
    that only the next item's consumers make, after its wait: the current call never ends."""
    grid = [[rm.GridItem([2]), rm.GridItem([3 * RING_D])]]
    assert rm.run_grid(grid).ok
    assert rm.run_grid(grid, ahead_n=lambda nt, d: nt).deadlock
    assert rm.run_grid(grid, ahead_n=lambda nt, d: min(nt, d + 1)).deadlock
    # across SMs: block 1's item waits on block 0's first, which never signals
    grid2 = [grid[0], [rm.GridItem([4], [(0, 0)])]]
    assert rm.run_grid(grid2, ahead_n=lambda nt, d: nt).deadlock


def test_a_loader_order_other_than_the_consumers_is_caught():
    """The loader streams items 1 and 2 swapped: same shapes, so the stage counts meet, but item
    1's consumers read item 2's weights (caught by the copies' tags, not by the slots' phases)."""
    grid = [[rm.GridItem([RING_D]), rm.GridItem([RING_D + 2]), rm.GridItem([RING_D + 2]), rm.GridItem([3])]]
    assert rm.run_grid(grid).ok
    res = rm.run_grid(grid, loader_order=[[0, 2, 1, 3]])
    assert not res.ok
    assert "block 0 item 1 stage 0 read (2, 0)'s weights" in res.errors, res.errors
    # other shapes: caught as well (wrong weights, an overwrite or a deadlock)
    grid = [[rm.GridItem([RING_D]), rm.GridItem([2]), rm.GridItem([2 * RING_D, 3]), rm.GridItem([3])]]
    for seed in range(10):
        r = random.Random(seed)
        res = rm.run_grid(grid, loader_order=[[0, 2, 1, 3]], pick=lambda en, r=r: r.randrange(len(en)))
        assert not res.ok


def test_the_grid_model_agrees_with_the_block_model_without_run_ahead():
    """One block, no dependencies, no run-ahead: run_grid is run_block's protocol."""
    rng = random.Random(5)
    for _ in range(10):
        items = _random_items(rng, 6)
        res = rm.run_grid([[rm.GridItem(t) for t in items]], ahead=False)
        assert res.ok and run_block(items).ok
        assert sum(len(v) for v in res.consumed.values()) == sum(map(sum, items))
