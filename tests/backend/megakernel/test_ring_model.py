"""The weight ring's model (backend/megakernel/ring_model.py): its geometry against the kernel's
constraints, and its role protocol under random and adversarial interleavings: the kernel's rules
never deadlock nor read a stage overwritten before its release; a loader that runs past its call,
an armer that arms more than the ring holds, or a loader that skips the empty wait is caught."""

from __future__ import annotations

import random

import pytest

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
