"""The weight ring's model (backend/megakernel/ring_model.py): its geometry against the kernel's
constraints, and its role protocol under random and adversarial interleavings: the kernel's rules
never deadlock nor read a stage overwritten before its release; a loader that runs past its call,
an armer that arms more than the ring holds, or a loader that skips the empty wait is caught."""

from __future__ import annotations

import random

import pytest

from mkcode.backend.megakernel import ring_model as rm
from mkcode.backend.megakernel.ring_model import RING_CW, RING_D, RING_ELEMS, RING_STAGE, ring_geom, run_block
from mkcode.backend.megakernel.tiling import default_tiling, tiling_for_batch
from mkcode.backend.model.config import north_mini_code_config


def test_header_constants_are_the_kernels():
    c = rm.header_constants()
    assert c == {"RING_D": RING_D, "RING_STAGE": RING_STAGE, "RING_ELEMS": RING_ELEMS, "RING_CW": RING_CW}
    assert RING_ELEMS // (16 * 32) == 4 * RING_CW  # four units of 16 rows x 32 k per consumer warp


@pytest.mark.parametrize("klen", [64, 128, 256, 512, 768, 1024, 2048, 4096])
def test_geometry_fits_a_stage_and_deals_whole_units(klen):
    g = ring_geom(klen, 2048)
    assert g is not None and g.kc * g.nkc == klen
    assert g.rows_s * g.pitch <= RING_STAGE  # a stage fits its slot
    groups = g.rows_s // 16
    assert groups in (2, 4, 8, 16)  # the consumers' unit map needs a power of two
    assert groups * (g.kc // 32) == 4 * RING_CW  # 32 units: four per consumer warp
    assert g.pitch % 16 == 0  # bulk copies land 16-byte aligned
    if g.pitch != g.kc * 2:  # padded rows: LDS.128 of rows gid and gid + 1 in different banks
        assert (g.pitch // 4) % 32 == 16


@pytest.mark.parametrize("klen", [32, 96, 100, 0])
def test_shapes_off_the_ring(klen):
    assert ring_geom(klen, 64) is None


@pytest.mark.parametrize("B", [1, 2, 4, 8])
def test_every_release_gemv_goes_through_the_ring(B):
    """Every GEMV-shaped item of the engine's tiling for the batch at the release geometry is
    ring-shaped (none falls back to the register GEMV in ring mode)."""
    cfg = north_mini_code_config()
    t = tiling_for_batch(cfg, default_tiling(cfg), B)
    for name, (klen, nrows) in rm.gemv_shapes(cfg, t).items():
        assert ring_geom(klen, nrows) is not None, (name, klen, nrows)


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


@pytest.mark.parametrize("adversary", list(ADVERSARIES))
def test_the_kernels_protocol_never_deadlocks_nor_overwrites(adversary):
    rng = random.Random(hash(adversary) & 0xFFFF)
    for trial in range(40):
        items = _random_items(rng, 6)
        pick = ADVERSARIES[adversary]
        if pick is None:
            r = random.Random(trial)
            pick = lambda en, r=r: r.randrange(len(en))  # noqa: E731
        res = run_block(items, pick=pick)
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


def test_one_consumer_warp_holds_back_the_loader_but_not_forever():
    """With warp 0 served last, the loader still finishes: every stage it waits for is released by
    warps that can run."""
    res = run_block([[RING_D * 5, RING_D * 2]] * 3, pick=ADVERSARIES["warp0_starves"])
    assert res.ok and res.steps > 0
