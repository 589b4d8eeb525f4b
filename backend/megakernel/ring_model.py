"""A model of engine v2's weight ring (csrc/mk_ring.cuh, MK_MODE_RING): its geometry and its role
protocol, for tests without a GPU.

Geometry (`ring_tile`, the kernel's function of the same name): a GEMV tile whose rows are
contiguous (ld == klen) goes through the ring in stages of RING_ROWS whole rows (one bulk copy each), each consumed on
its own. Other tiles (a K range of longer rows) keep the register
GEMV.

Protocol (`run_block`): one block runs its items in order. An item's plan is one or two tiles (a
fused MoE item: up tile, down slice); stage k of the item is the block's stage number item0 + k
(slot = seq % D, phase parity = (seq // D) & 1). Actors:
- the armer, before the item's dependency wait: issues the plan's first min(D, total) stages;
- per tile, one call: the loader issues on up to `upto` (the kernel: min(total, end of this tile +
  D); the last tile: total), and RING_CW consumer warps consume the tile's stages `group` at a time
  (the kernel: one; a group's stages all landed before any is read, all released after);
  the call ends at a block barrier when all of them are done;
- a copy lands some time after its issue (any order).
Issuing a stage waits for the release of the stage D before it (its slot's empty phase); consuming
waits for the copy (the full phase) and then releases the slot (one arrive per consumer warp).
`run_block` interleaves the actors' steps in an order the caller's scheduler picks (random,
adversarial) and reports a deadlock (no actor can move, the block unfinished) or a consumer that
reads a slot holding another stage's data (a stage overwritten before it was released)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from mkcode.backend.megakernel.abi import CSRC

RING_HEADER = CSRC / "mk_ring.cuh"


def _header_int(name: str, text: str) -> int:
    m = re.search(rf"constexpr int {name} = ([^;]+);", text)
    if m is None:
        raise ValueError(f"{RING_HEADER.name}: no constexpr int {name}")
    expr = m.group(1).replace("NWARPS", "16")
    if not re.fullmatch(r"[\d\s*+/()-]+", expr):
        raise ValueError(f"{RING_HEADER.name}: {name} = {expr!r} is not a constant expression")
    return int(eval(expr))  # digits and operators only (checked above)


def header_constants(path: Path = RING_HEADER) -> dict[str, int]:
    """RING_D, RING_STAGE, RING_ROWS, RING_CW as the kernel defines them."""
    text = path.read_text()
    return {n: _header_int(n, text) for n in ("RING_D", "RING_STAGE", "RING_ROWS", "RING_CW")}


_C = header_constants()
RING_D, RING_STAGE, RING_ROWS, RING_CW = _C["RING_D"], _C["RING_STAGE"], _C["RING_ROWS"], _C["RING_CW"]


def ring_tile(klen: int, nrows: int, nsplit: int | None = None, ld: int | None = None) -> int | None:
    """The kernel's ring_tile: the tile's stages, or None when it keeps the register GEMV."""
    nsplit = nrows if nsplit is None else nsplit
    ld = klen if ld is None else ld
    if ld != klen or klen <= 0 or klen % 256 or klen * 2 * RING_ROWS > RING_STAGE:
        return None
    if nrows <= 0 or nrows % RING_ROWS or nsplit % RING_ROWS:
        return None
    return nrows // RING_ROWS


def gemv_shapes(cfg, tiling) -> dict[str, tuple[int, int, int, int]]:
    """(klen, rows, nsplit, ld) of each GEMV-shaped item kind on a tiling
    (mkcode.backend.megakernel.tiling), as task_gemv builds them. A fused MoE item's down slice is
    hidden rows x its columns of the [H][I] down matrix."""
    H, D, I = cfg.hidden_size, cfg.prefix_dense_intermediate_size, cfg.intermediate_size
    c = tiling.moe_up_cols
    shapes = {
        "qkv": (H, tiling.qkv_rows, tiling.qkv_rows, H),
        "router": (H, tiling.router_rows, tiling.router_rows, H),
        "oproj": (cfg.gqa_group * cfg.head_dim, tiling.o_rows, tiling.o_rows, cfg.q_width),
        "moe_up": (H, 2 * c, c, H),
        "moe_down": (I, tiling.moe_down_rows, tiling.moe_down_rows, I),
        "moe_down_slice": (c, H, H, I),
        "lm_head": (H, tiling.lm_rows, tiling.lm_rows, H),
    }
    if D:
        shapes["dense_up"] = (H, 2 * tiling.dense_up_cols, tiling.dense_up_cols, H)
        shapes["dense_down"] = (D // tiling.mlp_splits, tiling.dense_down_rows, tiling.dense_down_rows, D)
    return shapes


# ---- the protocol ------------------------------------------------------------------------------------


def kernel_upto(tile_ends: list[int], tile: int, total: int, depth: int) -> int:
    """How far (in stages of the item) the kernel's loader issues during call `tile`."""
    return total if tile == len(tile_ends) - 1 else min(total, tile_ends[tile] + depth)


def kernel_arm(total: int, depth: int) -> int:
    return min(depth, total)


@dataclass
class BlockResult:
    ok: bool
    deadlock: bool = False
    overwritten: list[str] = field(default_factory=list)  # "item i tile t stage k read seq s's data"
    steps: int = 0


def run_block(
    items: list[list[int]],
    depth: int = RING_D,
    warps: int = RING_CW,
    group: int = 1,
    pick=None,
    upto=kernel_upto,
    arm=kernel_arm,
    wait_empty: bool = True,
    max_steps: int = 200000,
) -> BlockResult:
    """Run a block's items (each a list of per-tile stage counts) through the ring protocol.

    pick(enabled) -> index chooses which enabled actor moves next (default: random). upto / arm: the
    loader's and the armer's limits (the kernel's by default); wait_empty False models a loader that
    does not wait for a slot's release (a broken protocol the model must catch)."""
    rng = random.Random(0)
    pick = pick or (lambda enabled: rng.randrange(len(enabled)))
    issued = 0  # stages issued so far (block-wide numbering)
    released = [0] * depth  # per slot: completed empty phases (each needs `warps` arrivals)
    arrivals = [0] * depth
    landed = [-1] * depth  # per slot: the seq whose data the slot holds
    in_flight: list[int] = []  # issued, not landed
    full_phase = [0] * depth  # per slot: completed full phases
    res = BlockResult(ok=True)
    item0 = 0

    def can_issue(seq: int) -> bool:
        slot, k = seq % depth, seq // depth
        return not wait_empty or k == 0 or released[slot] >= k

    def issue(seq: int) -> None:
        in_flight.append(seq)

    for i, tiles in enumerate(items):
        total = sum(tiles)
        ends = [sum(tiles[: t + 1]) for t in range(len(tiles))]
        # the armer, before the wait (one actor, alone: the wait is thread 0's, the others idle)
        target = item0 + arm(total, depth)
        while issued < target:
            if not can_issue(issued):
                res.ok, res.deadlock = False, True
                return res
            issue(issued)
            issued += 1
        for t, n in enumerate(tiles):
            start = item0 + (ends[t] - n)
            loader_to = item0 + upto(ends, t, total, depth)
            cons = [start] * warps  # each warp's next stage to consume
            end = start + n
            while True:
                enabled = []
                if issued < loader_to and can_issue(issued):
                    enabled.append(("issue", -1))
                for j in range(len(in_flight)):
                    enabled.append(("land", j))
                for w in range(warps):
                    s = cons[w]
                    g = range(s, min(end, s + group))
                    if s < end and all(full_phase[q % depth] > q // depth for q in g):
                        enabled.append(("consume", w))
                if not enabled:
                    if issued >= loader_to and all(c == end for c in cons):
                        break  # the call's barrier
                    res.ok, res.deadlock = False, True
                    return res
                res.steps += 1
                if res.steps > max_steps:
                    raise RuntimeError("run_block: step limit (a livelock in the model)")
                kind, arg = enabled[pick(enabled)]
                if kind == "issue":
                    issue(issued)
                    issued += 1
                elif kind == "land":
                    seq = in_flight.pop(arg)
                    slot = seq % depth
                    landed[slot] = seq
                    full_phase[slot] = max(full_phase[slot], seq // depth + 1)
                else:
                    w = arg
                    s = cons[w]
                    slot = s % depth
                    if landed[slot] != s:
                        res.ok = False
                        res.overwritten.append(
                            f"item {i} tile {t} stage {s - start} read seq {landed[slot]}'s data"
                        )
                    arrivals[slot] += 1
                    if arrivals[slot] == warps * (released[slot] + 1):
                        released[slot] += 1
                    cons[w] = s + 1
        item0 += total
    return res
