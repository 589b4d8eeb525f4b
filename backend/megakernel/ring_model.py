"""A model of engine v2's weight ring (csrc/mk_ring.cuh, MK_MODE_RING): its geometry and its role
protocol, for tests without a GPU.

Geometry (`ring_tile`, the kernel's function of the same name): a GEMV tile whose rows are
contiguous (ld == klen) goes through the ring in stages of RING_ROWS whole rows (one bulk copy each), each consumed on
its own. A tile over a K range of longer rows (O-proj, dense down, a MoE down tile of a K range, a
fused item's down slice) goes through it as TMA boxes (`box_plan`, the kernel's box_tile) when the
backend built its kind's tensor map (tensor_maps.py), else it keeps the register GEMV.

Box consumers (`consume_boxes`): the kernel's ring_consume_box lane by lane — ldmatrix addresses in
the 128-byte-swizzled stage that the TMA wrote (`tma_stage`, the hardware's rule on byte offsets),
mma.m16n8k16 fragments, the row blocks' adds — so the CPU tests prove the swizzle is undone and the
fragments meet, for every box geometry the kernel takes.

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

import numpy as np

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.abi import CSRC
from mkcode.backend.megakernel.tensor_maps import BOX_K, swizzle_legal_box_rows

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
    if tiling.moe_down_ready == 1:  # each down tile over one up tile's columns
        shapes["moe_down"] = (c, tiling.moe_down_rows, tiling.moe_down_rows, I)
    if D:
        shapes["dense_up"] = (H, 2 * tiling.dense_up_cols, tiling.dense_up_cols, H)
        shapes["dense_down"] = (D // tiling.mlp_splits, tiling.dense_down_rows, tiling.dense_down_rows, D)
    return shapes


def item_tiles(cfg, tiling, box_rows: dict[int, int]) -> dict[str, list[int]]:
    """Per item kind of a tiling, its plan's stage counts (the kernel's ring_plan): the GEMV's tile
    if it goes through the ring, then a fused item's down slice; an empty list: all registers."""
    shapes = gemv_shapes(cfg, tiling)
    out = {}
    for name, shape in shapes.items():
        if name == "moe_down_slice":
            continue
        path = ring_path(shape, box_rows.get(BOX_KINDS[name], 0) if name in BOX_KINDS else 0)
        out[name] = [] if path is None else [path[1]]
    if tiling.moe_fused:  # the down slice: boxes only (slice_tile)
        klen, nrows, _, _ = shapes["moe_down_slice"]
        rb = box_rows.get(abi.MK_TMAP_EXP_DOWN, 0)
        plan = box_plan(klen, nrows, rb) if rb else None
        out["moe_fused"] = out["moe_up"] + ([] if plan is None else [plan.stages])
    return out


# which tensor map a K-range item kind of gemv_shapes reads (mk_abi.h MkTmapKind)
BOX_KINDS = {
    "oproj": abi.MK_TMAP_O,
    "dense_down": abi.MK_TMAP_DENSE_DOWN,
    "moe_down_slice": abi.MK_TMAP_EXP_DOWN,
    "moe_down": abi.MK_TMAP_EXP_DOWN,
}


@dataclass(frozen=True)
class BoxPlan:
    """A K-range tile as boxes (the kernel's RingTile with a map): box q is row block q // kb, k
    block q % kb; stage k holds boxes [k * bps, k * bps + bps), consecutive k blocks of one row block."""

    rbox: int
    kb: int
    bps: int
    stages: int

    @property
    def stage_bytes(self) -> int:
        return self.bps * self.rbox * BOX_K * 2


def box_plan(klen: int, nrows: int, rbox: int) -> BoxPlan | None:
    """The kernel's box_tile: the tile's box plan, or None (it keeps the register GEMV)."""
    if not swizzle_legal_box_rows(rbox) or nrows <= 0 or nrows % rbox or klen <= 0 or klen % BOX_K:
        return None
    kb = klen // BOX_K
    bps = RING_STAGE // (rbox * BOX_K * 2)
    while kb % bps:
        bps //= 2
    return BoxPlan(rbox, kb, bps, (nrows // rbox) * kb // bps)


def stage_boxes(plan: BoxPlan, stage: int, x0: int, y0: int) -> list[tuple[int, int]]:
    """The loader's boxes of a stage (ring_issue): (column, row) of each in the map, in slot order."""
    q = stage * plan.bps
    y = y0 + (q // plan.kb) * plan.rbox
    x = x0 + (q % plan.kb) * BOX_K
    return [(x + j * BOX_K, y) for j in range(plan.bps)]


def ring_path(shape: tuple[int, int, int, int], box_rows: int = 0) -> tuple[str, int] | None:
    """("rows", stages) for a tile of whole rows, ("boxes", stages) for a K range with a map of
    `box_rows` (0: none), None for the register GEMV; shape as gemv_shapes gives it."""
    klen, nrows, nsplit, ld = shape
    n = ring_tile(klen, nrows, nsplit, ld)
    if n is not None:
        return ("rows", n)
    b = box_plan(klen, nrows, box_rows) if box_rows else None
    return None if b is None else ("boxes", b.stages)


def desc_stages(cfg, d, box_rows: dict[int, int]) -> list[int]:
    """The kernel's ring_plan of a descriptor (MK_F_* words): the stage counts of the tiles it streams
    through the ring, in the order it reads them (its GEMV's tile, then a fused item's down slice)."""
    op = int(d[abi.MK_F_OP])
    a1, a2, a3, a4 = (int(d[f]) for f in (abi.MK_F_A1, abi.MK_F_A2, abi.MK_F_A3, abi.MK_F_A4))
    H, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.prefix_dense_intermediate_size
    rows = {
        abi.MK_OP_QKV: (H, a1, a1, H),
        abi.MK_OP_ROUTER: (H, a1, a1, H),
        abi.MK_OP_LM_HEAD: (H, a1, a1, H),
        abi.MK_OP_DENSE_UP: (H, 2 * a1, a1, H),
        abi.MK_OP_MOE_UP: (H, 2 * a2, a2, H),
        abi.MK_OP_MOE_FUSED: (H, 2 * a2, a2, H),
        abi.MK_OP_OPROJ: (a3 - a2, a1, a1, cfg.q_width),
        abi.MK_OP_DENSE_DOWN: (a3 - a2, a1, a1, D),
        abi.MK_OP_MOE_DOWN: (a4 or I, a2, a2, I),
    }
    kinds = {
        abi.MK_OP_OPROJ: abi.MK_TMAP_O,
        abi.MK_OP_DENSE_DOWN: abi.MK_TMAP_DENSE_DOWN,
        abi.MK_OP_MOE_DOWN: abi.MK_TMAP_EXP_DOWN,
    }
    out = []
    if op in rows:
        path = ring_path(rows[op], box_rows.get(kinds[op], 0) if op in kinds else 0)
        if path is not None:
            out.append(path[1])
    if op == abi.MK_OP_MOE_FUSED:  # the down slice: boxes only (slice_tile), even when a2 == I
        rb = box_rows.get(abi.MK_TMAP_EXP_DOWN, 0)
        plan = box_plan(a2, H, rb) if rb else None
        if plan is not None:
            out.append(plan.stages)
    return out


# ---- the box consumers, lane by lane -----------------------------------------------------------------


def swizzle128(offset: int) -> int:
    """Where the TMA's 128-byte swizzle puts the byte at `offset` of a 1024-byte-aligned destination:
    bits 4-6 (the 16-byte chunk in a 128-byte row) XOR bits 7-9 (the row within 1024 bytes)."""
    return offset ^ (((offset >> 7) & 7) << 4)


def tma_stage(W: np.ndarray, plan: BoxPlan, stage: int, x0: int, y0: int) -> np.ndarray:
    """The stage's bytes as the hardware leaves them (as bf16 bit patterns, uint16 [RING_STAGE // 2]):
    each box of stage_boxes is [rbox][BOX_K] of W (uint16), row-major, swizzled."""
    img = np.zeros(RING_STAGE // 2, dtype=np.uint16)
    box_bytes = plan.rbox * BOX_K * 2
    for j, (x, y) in enumerate(stage_boxes(plan, stage, x0, y0)):
        box = W[y : y + plan.rbox, x : x + BOX_K]
        assert box.shape == (plan.rbox, BOX_K)
        for r in range(plan.rbox):
            for c in range(BOX_K // 8):  # 16-byte chunks
                dst = swizzle128(j * box_bytes + r * 128 + c * 16) // 2
                img[dst : dst + 8] = box[r, 8 * c : 8 * c + 8]
    return img


def _ldmatrix_x4(mem: np.ndarray, addrs: list[int]) -> list[list[int]]:
    """ldmatrix.m8n8.x4.b16: lane l gives the byte address of row l % 8 of matrix l // 8; lane j
    receives, of matrix m, row j // 4's elements 2 (j % 4) and + 1: regs[j][m] = (lo, hi) uint16s."""
    out = []
    for j in range(32):
        regs = []
        for m in range(4):
            a = addrs[8 * m + j // 4] // 2 + 2 * (j % 4)
            regs.append((int(mem[a]), int(mem[a + 1])))
        out.append(regs)
    return out


def _bf16(bits: int) -> float:
    return float(np.array([bits << 16], dtype=np.uint32).view(np.float32)[0])


def _mma16816(c: np.ndarray, a: list, b: list) -> None:
    """mma.m16n8k16.row.col f32 += bf16: c [32][4] per lane; a [32] lanes of (a0, a1, a2, a3), b [32]
    of (b0, b1), each a (lo, hi) pair, in PTX's fragment layout (gid = lane / 4, t = lane % 4): a0 =
    A[gid][2t, 2t+1], a1 = A[gid+8][..], a2 = A[gid][2t+8, 2t+9], a3 = A[gid+8][2t+8..]; b0 =
    B[2t, 2t+1][gid], b1 = B[2t+8, 2t+9][gid]; c0, c1 = C[gid][2t, 2t+1], c2, c3 = C[gid+8][..]."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i, (r, k) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[r, k], A[r, k + 1] = _bf16(a[lane][i][0]), _bf16(a[lane][i][1])
        for i, k in enumerate((2 * t, 2 * t + 8)):
            B[k, g], B[k + 1, g] = _bf16(b[lane][i][0]), _bf16(b[lane][i][1])
    C = A @ B
    for lane in range(32):
        g, t = lane // 4, lane % 4
        c[lane] += (C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1])


def consume_boxes(
    W: np.ndarray, act: np.ndarray, plan: BoxPlan, nrows: int, x0: int = 0, y0: int = 0, warps: int = RING_CW
) -> np.ndarray:
    """ring_consume_box, lane by lane, over every stage of a tile: W uint16 [rows][cols] (bf16 bits),
    act uint16 [8][lds] (token n's column k at [n][k], the tile's K from column 0); the sums
    out[r][n] (float64 [nrows][8]) as the kernel's red.shared adds leave them."""
    lds = act.shape[1]
    act_mem = act.reshape(-1)
    out = np.zeros((nrows, 8))
    groups = plan.rbox // 16
    box_bytes = plan.rbox * BOX_K * 2
    for w in range(warps):
        ng, g0 = (groups // warps, w) if groups >= warps else (1, w % groups)
        box0, bstep = (0, 1) if groups >= warps else (w // groups, warps // groups)
        acc = np.zeros((2, 4, 32, 4))
        for st in range(plan.stages):
            mem = tma_stage(W, plan, st, x0, y0)
            q0 = st * plan.bps
            for box in range(box0, plan.bps, bstep):
                kblk = (q0 + box) % plan.kb
                b = []
                for half in range(2):
                    addrs = [
                        ((ln & 7) * lds + (ln >> 3) * 8) * 2 + kblk * BOX_K * 2 + half * 64
                        for ln in range(32)
                    ]
                    r = _ldmatrix_x4(act_mem, addrs)
                    b += [[(r[j][0], r[j][1]) for j in range(32)], [(r[j][2], r[j][3]) for j in range(32)]]
                for i in range(ng):
                    row = box * box_bytes + (g0 + i * warps) * 16 * 128
                    for ks in range(4):
                        addrs = [
                            row + (ln & 15) * 128 + (((ks * 2 + (ln >> 4)) ^ (ln & 7)) << 4)
                            for ln in range(32)
                        ]
                        a = _ldmatrix_x4(mem, addrs)
                        _mma16816(acc[i, ks], a, b[ks])
            if (q0 + plan.bps) % plan.kb == 0 and box0 < plan.bps:
                rb = q0 // plan.kb
                for i in range(ng):
                    c = acc[i].sum(axis=0)
                    acc[i] = 0
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        r = rb * plan.rbox + (g0 + i * warps) * 16 + g
                        out[r, 2 * t] += c[lane, 0]
                        out[r, 2 * t + 1] += c[lane, 1]
                        out[r + 8, 2 * t] += c[lane, 2]
                        out[r + 8, 2 * t + 1] += c[lane, 3]
    return out


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


# ---- a loader that runs ahead across items -------------------------------------------------------------
#
# The protocol of a loader that streams past the running item into the next one of its block's list,
# before that item's dependency wait (engine v2's role loops, docs/MEGAKERNEL.md; its first kernel
# form, claims one item ahead on the static lists, was measured equal and removed).
# A grid of blocks, each running its static per-SM list of items in order; an item's dependency wait
# passes once the items it names (on any block) have signalled. With `ahead`, the loader of an item's
# last call runs on into the NEXT item of its list: the next item's first min(D, total) stages
# (ahead_upto), gated only by free slots, while the consumers finish this item, before the next
# item's wait; an item whose plan is empty has its armer arm the next item at its start instead. The
# loader learns the next item from the list; `loader_order` lets a test give it another order (a
# broken protocol the model must catch). Every copy carries its (item, stage) tag: a consumer that
# reads another item's weights, or another stage's, is an error.


@dataclass
class GridItem:
    """An item of a block's list: its plan (per-tile stage counts; empty: no ring stages) and the
    items (block, index) whose signals its dependency wait needs."""

    tiles: list[int]
    deps: list[tuple[int, int]] = field(default_factory=list)


def ahead_upto(next_total: int, depth: int) -> int:
    """How many of the next item's stages the last call's loader issues."""
    return min(depth, next_total)


@dataclass
class GridResult:
    ok: bool
    deadlock: bool = False
    errors: list[str] = field(default_factory=list)
    consumed: dict[tuple[int, int], list[tuple[int, int]]] = field(default_factory=dict)  # (b, i): tags read
    ahead_issued: int = 0  # stages issued for a later item than the one running
    # (b, i): item i's stages issued while an earlier item of block b ran (before item i's wait)
    early: dict[tuple[int, int], int] = field(default_factory=dict)
    steps: int = 0


def run_grid(
    blocks: list[list[GridItem]],
    depth: int = RING_D,
    warps: int = RING_CW,
    ahead: bool = True,
    pick=None,
    loader_order: list[list[int]] | None = None,
    ahead_n=ahead_upto,
    max_steps: int = 400000,
) -> GridResult:
    """Run every block's items through the ring protocol (each block its own ring) with dependency
    waits across blocks, interleaving all actors of all blocks as pick(enabled) chooses.

    Per block and item: the pre-wait phase (the armer issues up to min(D, total) of the item's stages
    (with ahead, of the next item's when the item's plan is empty); thread 0's wait passes once every
    dependency signalled; a barrier ends it), then one call per tile (the loader, RING_CW consumer
    warps; the kernel's upto, and with ahead the last call's loader goes on into the next item by
    ahead_n(next_total, D) stages), then the signal. loader_order[b]: the item order block b's loader
    streams (default: its list's order)."""
    rng = random.Random(0)
    pick = pick or (lambda enabled: rng.randrange(len(enabled)))
    res = GridResult(ok=True)
    nb = len(blocks)
    order = loader_order or [list(range(len(items))) for items in blocks]
    # the loader's stream: seq -> (item, stage) in the loader's order
    stream = [[(i, k) for i in order[b] for k in range(sum(blocks[b][i].tiles))] for b in range(nb)]
    # where each item's stages start in the loader's numbering (its view of item0)
    lstart = []
    for b in range(nb):
        at, pos = {}, 0
        for i in order[b]:
            at[i] = pos
            pos += sum(blocks[b][i].tiles)
        lstart.append(at)

    class Blk:
        def __init__(self, b: int):
            self.b = b
            self.item = 0  # the item being run (consumer order = list order)
            self.phase = "pre"  # pre, call, done
            self.tile = 0
            self.item0 = 0  # consumers' numbering of the item's first stage
            self.issued = 0
            self.released = [0] * depth
            self.arrivals = [0] * depth
            self.landed = [(-1, None)] * depth
            self.in_flight: list[int] = []
            self.full_phase = [0] * depth
            self.waited = False
            self.cons: list[int] = []
            self.lo = 0  # loader's (or armer's) target this phase

    blk = [Blk(b) for b in range(nb)]
    signalled: set[tuple[int, int]] = set()

    def total(b: int, i: int) -> int:
        return sum(blocks[b][i].tiles) if 0 <= i < len(blocks[b]) else 0

    def next_total(b: int, i: int) -> int:  # the loader's next item after item i (its order)
        pos = order[b].index(i) if i in order[b] else -1
        return total(b, order[b][pos + 1]) if 0 <= pos < len(order[b]) - 1 else 0

    def can_issue(x: Blk) -> bool:
        if x.issued >= len(stream[x.b]):
            return False
        slot, k = x.issued % depth, x.issued // depth
        return k == 0 or x.released[slot] >= k

    def issue(x: Blk) -> None:
        it = stream[x.b][x.issued][0]
        if it != x.item:  # a later item's stage, issued while this one runs (before its wait)
            res.ahead_issued += 1
            res.early[(x.b, it)] = res.early.get((x.b, it), 0) + 1
        x.in_flight.append(x.issued)
        x.issued += 1

    def start_item(x: Blk) -> None:
        b = x.b
        if x.item >= len(blocks[b]):
            x.phase = "done"
            return
        x.phase, x.tile, x.waited = "pre", 0, False
        t = total(b, x.item)
        if t > 0:
            x.lo = x.item0 + min(depth, t)
        elif ahead:  # an item without ring stages arms the next one
            x.lo = x.item0 + ahead_n(next_total(b, x.item), depth)
        else:
            x.lo = x.item0

    def start_call(x: Blk) -> None:
        b, tiles = x.b, blocks[x.b][x.item].tiles
        ends = [sum(tiles[: t + 1]) for t in range(len(tiles))]
        t, tot = x.tile, ends[-1]
        x.lo = x.item0 + kernel_upto(ends, t, tot, depth)
        if ahead and t == len(tiles) - 1:
            x.lo += ahead_n(next_total(b, x.item), depth)
        x.lo = max(x.lo, x.issued)
        x.cons = [x.item0 + ends[t] - tiles[t]] * warps

    def finish_item(x: Blk) -> None:
        signalled.add((x.b, x.item))
        x.item0 += total(x.b, x.item)
        x.item += 1
        start_item(x)

    for x in blk:
        start_item(x)
    while True:
        enabled = []
        for x in blk:
            b = x.b
            for j in range(len(x.in_flight)):
                enabled.append(("land", b, j))
            if x.phase == "pre":
                if x.issued < x.lo and can_issue(x):
                    enabled.append(("issue", b, -1))
                if not x.waited and all(d in signalled for d in blocks[b][x.item].deps):
                    enabled.append(("wait", b, -1))
                if x.waited and x.issued >= x.lo:
                    enabled.append(("barrier", b, -1))
            elif x.phase == "call":
                if x.issued < x.lo and can_issue(x):
                    enabled.append(("issue", b, -1))
                tiles = blocks[b][x.item].tiles
                end = x.item0 + sum(tiles[: x.tile + 1])
                for w in range(warps):
                    s = x.cons[w]
                    if s < end and x.full_phase[s % depth] > s // depth:
                        enabled.append(("consume", b, w))
                if x.issued >= x.lo and all(c == end for c in x.cons):
                    enabled.append(("barrier", b, -1))
        if not enabled:
            if all(x.phase == "done" for x in blk) and not any(x.in_flight for x in blk):
                break
            res.ok, res.deadlock = False, True
            return res
        res.steps += 1
        if res.steps > max_steps:
            raise RuntimeError("run_grid: step limit (a livelock in the model)")
        kind, b, arg = enabled[pick(enabled)]
        x = blk[b]
        if kind == "land":
            seq = x.in_flight.pop(arg)
            slot = seq % depth
            x.landed[slot] = (seq, stream[b][seq])
            x.full_phase[slot] = max(x.full_phase[slot], seq // depth + 1)
        elif kind == "issue":
            issue(x)
        elif kind == "wait":
            x.waited = True
        elif kind == "barrier":
            if x.phase == "pre":
                if total(b, x.item) == 0:
                    finish_item(x)  # its op runs off the ring, then it signals
                else:
                    x.phase, x.tile = "call", 0
                    start_call(x)
            else:
                x.tile += 1
                if x.tile == len(blocks[b][x.item].tiles):
                    finish_item(x)
                else:
                    start_call(x)
        else:  # consume
            w = arg
            s = x.cons[w]
            slot = s % depth
            seq, tag = x.landed[slot]
            want = (x.item, s - x.item0)
            if seq != s:
                res.ok = False
                res.errors.append(
                    f"block {b} item {x.item} stage {want[1]} read seq {seq}'s data (overwritten)"
                )
            elif tag != want:
                res.ok = False
                res.errors.append(f"block {b} item {x.item} stage {want[1]} read {tag}'s weights")
            if w == 0:
                res.consumed.setdefault((b, x.item), []).append(tag)
            x.arrivals[slot] += 1
            if x.arrivals[slot] == warps * (x.released[slot] + 1):
                x.released[slot] += 1
            x.cons[w] = s + 1
    for b in range(nb):
        for i in range(len(blocks[b])):
            want = [(i, k) for k in range(total(b, i))]
            if res.consumed.get((b, i), []) != want:
                res.ok = False
                res.errors.append(f"block {b} item {i} consumed {res.consumed.get((b, i))}, not its weights")
    return res
