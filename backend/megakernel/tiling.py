"""Tile sizes of the step's matrix work and the attention split policy.

Each GEMV-shaped task streams one weight tile (rows x K) once for all <= 8 tokens; tiles are sized
so that each matrix yields roughly one wave of tasks over the SMs (docs/MEGAKERNEL.md). The kernel needs every
K range a multiple of 32 (one mma k-step pair) and tiles that do not straddle the Q/K/V boundaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from mkcode.backend.kv.layout import PAGE_SIZE, first_visible_position
from mkcode.backend.megakernel import abi
from mkcode.backend.model.config import ModelConfig

# The fused MoE items' column counts the kernel instantiates (its down slice's K: mk_kernel.cuh
# fused_down).
FUSED_UP_COLS = (32, 64, 96, 128, 256)


class TilingError(ValueError):
    """A tiling the kernel cannot run for this config."""


@dataclass(frozen=True)
class Tiling:
    qkv_rows: int = 64  # rows of [Wq; Wk; Wv] per QKV task
    o_rows: int = 64  # rows of Wo per O-proj task (K split by kv head: Hkv splits)
    # experts per router task: 8 tasks of 16 (the router's 512 KB sooner on the MoE chain); measured
    # on the H200 in one call (2026-11-29): BS 8 11.69 vs 11.85-11.88 ms with 32
    router_rows: int = 16
    dense_up_cols: int = 32  # intermediate columns per dense up task (reads 2x that many rows)
    dense_down_rows: int = 64
    mlp_splits: int = 4  # K splits of the dense down projection
    moe_up_cols: int = 32  # intermediate columns per MoE up task
    moe_down_rows: int = 128
    lm_rows: int = 128  # vocab rows per LM-head task (512 KB tiles; the configuration measured fastest)
    max_splits: int = 32  # attention splits per (row, kv head) at most
    # split_tokens > 0: a layer whose rows see more than max_splits * split_tokens tokens may take
    # ceil(visible tokens / split_tokens) splits, up to split_cap (most_splits: the workspace's split
    # stride must hold it). A BS 1 tiling caps its splits low (SMALL_MAX_SPLITS: fewer, longer
    # attention items leave SMs to the MoE items), which at long contexts left the attention items
    # of the full layers outlasting the layer (SMALL_SPLIT_TOKENS).
    split_tokens: int = 0
    split_cap: int = 0
    split_bucket: int = 512  # smallest context bucket (tokens) the split policy plans for (then powers of 2)
    # 1: a layer's attention drains go to the SMs that hold its QKV and router tiles (busy until the
    # attention can start anyway; at most one drain each), so every other SM starts the layer with
    # its MoE drain and takes MoE up tiles as soon as the routing is known (round-robin dealing put
    # the drains on the SMs after the router tiles: idle until the last QKV tile, then attention,
    # and only then their MoE drain)
    attn_with_qkv: int = 0
    # 1: a layer's attention drains go first to the work SMs that hold none of its QKV / router (dense
    # up) tiles, then to the router tiles' SMs, then to the QKV tiles' SMs, so that the first drains
    # wait pre-positioned when the QKV tiles end (dealt round-robin, a BS 1 layer's last ~24 of 64
    # attention items started ~9 us after the QKV tiles, on the SMs that had run them)
    attn_idle_first: int = 0
    # SMs reserved for the layers' control tasks (ROUTE; 0: none, at most half the SMs): everything
    # else is dealt over the other SMs, so these ops always find their code in the instruction cache
    # (an op an SM runs once per layer otherwise fetches it cold: several us)
    ctrl_sms: int = 0
    # 1: one MoE queue item per (expert, up-column tile) that also runs the down projection of those
    # columns for every hidden row (fp32 atomics into the row's sum x(l+1)): no down tiles, no
    # per-expert up -> down dependency. 0: up tiles, then down tiles of moe_down_rows rows.
    moe_fused: int = 0
    # 1: a MoE layer's attention combines run as static tasks on the control SMs (one each in turn)
    # instead of MoE-queue items: they wait warm on an idle SM and need no claim (needs ctrl_sms)
    combine_ctrl: int = 0
    # (No norm switch: the layer's outputs are always added (fp32 atomics) into x(l+1), which its
    # router tiles (EMBED for a dense layer 0) initialise with the residual, and each GEMV over h(l)
    # stages RMSNorm(x(l)) itself (mk_abi.h); the sums' order varies, so two runs of a step can
    # differ in the last bits. The ADD_NORM tasks, Tiling.norm_inline = 0, measured +1.3 % at BS 1
    # and +1.2 % at BS 8 on the H200 (2026-12-01, docs/PERF.md), were removed in ABI 31.)
    # 3: a MoE layer's attention items are the MoE queue's first items, before its up tiles (stored
    # before the tail's items, their count in the tail queue's word 2, mk_abi.h MK_MOE_HEAD), and the
    # layer has no attention drains; the drains claim them before ROUTE (mk_abi.h MK_DRAIN_LATE_ROUTE:
    # the queue head is reset by the EMBED of row 0, not by ROUTE), so the attention starts as soon
    # as the QKV tiles end, and an SM whose attention item ends claims its next item (an up tile)
    # from the same queue, waiting for ROUTE at its first claim past the head: no drain exit, no
    # switch (BS 8: 15.65 -> ~3 us median). Dense layers keep their attention drains. (1, the
    # attention items leading the attention tail, +10 %, and 2, the head claimed after ROUTE,
    # +0.6-0.9 % at BS 8 and +5 % at BS 1, were measured slower and removed; 2026-12-02.)
    attn_in_moe: int = 0
    # 1: one QKV counter per kv head instead of one per layer: a QKV tile signals the counter of the
    # kv head its rows belong to (Q rows of the head's query group, its K rows or its V rows), and an
    # attention item (row, kv head, split) waits for that head's tiles only (20 of 80 at the release
    # geometry) instead of every tile of the layer. Measured 2026-12-02: equal with attention drains (their
    # items are claimed after a QKV tile), faster with attn_in_moe = 3 (WIDE_QKV_BY_HEAD).
    qkv_by_head: int = 0
    # 1 (one row only: build_schedule refuses it at other batch sizes): a MoE layer has no ROUTE and
    # no MoE queue. Its fused items are static tasks on SMs that hold none of the layer's QKV or
    # router tiles; each stages h(l), waits for the router tiles, ranks the logits itself and runs
    # its rank's expert (mk_abi.h MK_MOE_LOCAL). The O-proj tiles go to a host queue whose drains
    # wait for the router tiles too (those initialise the sum x(l+1) the O-proj adds into). Takes
    # ROUTE (~4 us), the MoE drains' wake-up and claim (~3 us) and the item's staging off the
    # MoE chain, which ended each H100 BS 1 layer (2026-12-06 timeline: ROUTE ready 11.7 us after
    # the layer's start, the first up GEMV at 22.0). Needs moe_fused. (2, the items
    # on the QKV tiles' SMs behind their tile, was measured slower and removed; 2026-12-06.)
    moe_local: int = 0
    # > 0 (with moe_local): a MoE layer's fused items in groups of this many SMs. Each SM first runs
    # a router tile of num_experts / moe_group experts into its group's row of the logits (the kernel
    # keeps h(l) staged for the item), and each item waits for its own group's router tiles only
    # (and for group 0's, which alone copy the residual into x(l+1)): no item waits on a few router
    # SMs elsewhere, and the 8 router tiles' SMs are free (docs/MEGAKERNEL.md, the grouped layer).
    moe_group: int = 0
    # > 0 (one row, with moe_local and combine_ctrl): a MoE layer's attention in groups of this many
    # SMs per kv head, every task static on its group's SMs: SM r of head h's group runs a QKV tile
    # of two row ranges (its share of the head's Q rows, then of its K or V rows), then split r of
    # the head's attention (attn_group splits at any context), then O-proj tiles of the head's K
    # range (which wait for x(l+1)'s initialiser, the router tiles); the combines stay on the
    # control SMs. No attention drains, no O-proj queue (docs/MEGAKERNEL.md, the grouped layer).
    attn_group: int = 0

    def validate(self, cfg: ModelConfig) -> None:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise TilingError(f"tiling {self}: {what}")

        need(self.attn_in_moe in (0, 3), "attn_in_moe must be 0 or 3")
        need(self.qkv_by_head in (0, 1), "qkv_by_head must be 0 or 1")
        need(self.moe_local in (0, 1), "moe_local must be 0 or 1")
        need(not self.moe_local or self.moe_fused, "moe_local needs moe_fused")
        need(not (self.moe_local and self.attn_in_moe), "moe_local has no MoE queue for attn_in_moe")
        need(self.moe_group >= 0, "moe_group must be >= 0")
        need(not self.moe_group or self.moe_local, "moe_group needs moe_local")
        if self.attn_group:
            S, G, d = self.attn_group, cfg.gqa_group, cfg.head_dim
            need(self.moe_local and self.combine_ctrl, "attn_group needs moe_local and combine_ctrl")
            need(S > 0 and S % 2 == 0, "attn_group must be even (half its tiles take K rows, half V rows)")
            qn, kvn = self.attn_group_rows(cfg)
            need((G * d) % S == 0 and qn % 2 == 0, "attn_group must split a head's Q rows in even shares")
            need(
                (2 * d) % S == 0 and kvn % 2 == 0,
                "attn_group must split a head's K and V rows in even shares",
            )
            need(qn + kvn <= abi.MK_MAX_TILE_ROWS, "attn_group's QKV tiles are too tall")
            need(
                self.most_splits() >= S,
                "attn_group splits per kv head need a split stride (most_splits) as wide",
            )
        need(
            not self.qkv_by_head or cfg.head_dim % self.qkv_rows == 0,
            "qkv_by_head: qkv_rows must divide head_dim (each QKV tile belongs to one kv head)",
        )

        H, d = cfg.hidden_size, cfg.head_dim
        need(self.qkv_rows % 2 == 0, "qkv_rows must be even (RoPE pairs)")
        need(
            cfg.q_width % self.qkv_rows == 0 and cfg.kv_width % self.qkv_rows == 0,
            "qkv_rows must divide the Q and K/V widths",
        )
        need(H % 32 == 0, "hidden_size must be a multiple of 32")
        need(
            (cfg.gqa_group * d) % 32 == 0, "the O-proj K split (one kv head's heads) must be a multiple of 32"
        )
        need(H % self.o_rows == 0, "o_rows must divide hidden_size")
        need(self.max_splits >= 1, "max_splits must be >= 1")
        need(self.split_tokens >= 0, "split_tokens must be >= 0 (0: max_splits caps the splits)")
        need(
            not self.split_tokens or self.split_cap >= self.max_splits,
            "split_cap (the workspace's split stride) must be >= max_splits when split_tokens is set",
        )
        need(self.attn_with_qkv in (0, 1), "attn_with_qkv must be 0 or 1")
        need(self.attn_idle_first in (0, 1), "attn_idle_first must be 0 or 1")
        need(
            not (self.attn_with_qkv and self.attn_idle_first),
            "attn_with_qkv and attn_idle_first exclude each other",
        )
        need(0 <= self.ctrl_sms <= abi.MK_MAX_TOKENS, f"ctrl_sms must be in 0..{abi.MK_MAX_TOKENS}")
        need(self.moe_fused in (0, 1), "moe_fused must be 0 or 1")
        need(self.combine_ctrl in (0, 1), "combine_ctrl must be 0 or 1")
        need(not self.combine_ctrl or self.ctrl_sms > 0, "combine_ctrl needs control SMs (ctrl_sms > 0)")
        rows = {
            "qkv_rows": self.qkv_rows,
            "o_rows": self.o_rows,
            "router_rows": self.router_rows,
            "2 * dense_up_cols": 2 * self.dense_up_cols,
            "dense_down_rows": self.dense_down_rows,
            "2 * moe_up_cols": 2 * self.moe_up_cols,
            "moe_down_rows": self.moe_down_rows,
            "lm_rows": self.lm_rows,
        }
        for name, n in rows.items():
            need(
                0 < n <= abi.MK_MAX_TILE_ROWS,
                f"{name} = {n} weight rows, the kernel takes 1..{abi.MK_MAX_TILE_ROWS}",
            )
        if cfg.dense_layers:
            D = cfg.prefix_dense_intermediate_size
            need(D % self.dense_up_cols == 0, "dense_up_cols must divide the dense intermediate size")
            need(H % self.dense_down_rows == 0, "dense_down_rows must divide hidden_size")
            need(
                D % self.mlp_splits == 0 and (D // self.mlp_splits) % 32 == 0,
                "mlp_splits must split the dense intermediate size into multiples of 32",
            )
        if any(not cfg.is_dense(i) for i in range(cfg.num_hidden_layers)):
            I, E = cfg.intermediate_size, cfg.num_experts
            need(I % self.moe_up_cols == 0, "moe_up_cols must divide intermediate_size")
            need(I % 32 == 0, "intermediate_size must be a multiple of 32")
            if self.moe_fused:  # the down slice's K is the tile's columns: 1, 2, 3, 4 or 8 mma k-pairs
                need(
                    self.moe_up_cols in FUSED_UP_COLS,
                    f"fused MoE items need moe_up_cols in {', '.join(map(str, FUSED_UP_COLS))}",
                )
            need(H % self.moe_down_rows == 0, "moe_down_rows must divide hidden_size")
            need(E % self.router_rows == 0, "router_rows must divide num_experts")
            need(cfg.num_experts_per_tok <= 8, "top_k must be <= 8")
            need(E <= 384, "num_experts must be <= 384 (ROUTE's shared-memory scratch)")
            if self.moe_group:
                G = self.moe_group
                items = cfg.num_experts_per_tok * (I // self.moe_up_cols)
                need(E % G == 0, "moe_group must divide num_experts (each SM a router tile of E / moe_group)")
                need(items % G == 0, f"moe_group must divide the layer's {items} fused items")
                need(items // G <= abi.MK_MAX_TOKENS, f"at most {abi.MK_MAX_TOKENS} groups (rows of rlogits)")
                problem = norm_geometry_problem(cfg, self.moe_router_rows(cfg))
                need(problem is None, f"moe_group's router tiles: {problem}")
        problem = norm_geometry_problem(cfg, self.router_rows)
        need(problem is None, str(problem))

    def most_splits(self) -> int:
        """The most attention splits per (row, kv head) this tiling gives at any context: the split
        stride of its workspace (o_part / lse_part) and of the kernel's max_splits."""
        return max(self.max_splits, self.split_cap) if self.split_tokens else self.max_splits

    def qkv_tiles(self, cfg: ModelConfig) -> int:
        """QKV tiles per layer: the rows of [Wq; Wk; Wv] in tiles of qkv_rows (validate: they divide)."""
        return (cfg.q_width + 2 * cfg.kv_width) // self.qkv_rows

    def moe_qkv_tiles(self, cfg: ModelConfig) -> int:
        """QKV tiles of a MoE layer: one per SM of each kv head's group with attn_group, else qkv_tiles."""
        return self.attn_group * cfg.num_key_value_heads if self.attn_group else self.qkv_tiles(cfg)

    def attn_group_rows(self, cfg: ModelConfig) -> tuple[int, int]:
        """An attn_group QKV tile's two row ranges: its share of a head's Q rows, of its K or V rows."""
        return cfg.gqa_group * cfg.head_dim // self.attn_group, 2 * cfg.head_dim // self.attn_group

    def moe_router_rows(self, cfg: ModelConfig) -> int:
        """Experts per router tile of a MoE layer: num_experts / moe_group with it, else router_rows."""
        return cfg.num_experts // self.moe_group if self.moe_group else self.router_rows

    def moe_tiles(self, cfg: ModelConfig) -> tuple[int, int]:
        """(up items, down items) per active expert of a MoE queue: fused items have no down tiles
        (the kernel's moe_up_tiles / moe_down_tiles; the emulator and the schedule count the same)."""
        up = cfg.intermediate_size // self.moe_up_cols  # expert-major, moe_up_cols columns each
        return up, 0 if self.moe_fused else cfg.hidden_size // self.moe_down_rows


def norm_geometry_problem(cfg: ModelConfig, router_rows: int) -> str | None:
    """Why the norm inside the GEMVs cannot run `cfg` with router tiles of `router_rows` experts, or
    None. x(l+1), the sum each layer's outputs are added into, needs an initialiser that copies the
    residual x(l) in before any add: EMBED for a dense layer 0, the router tiles (each its share of
    the columns, whole float4s) for a MoE layer; and the GEMVs' staging norms MK_NORM_MAX_HIDDEN
    columns at most (mk_abi.h)."""
    H, E = cfg.hidden_size, max(cfg.num_experts, 1)
    if H > abi.MK_NORM_MAX_HIDDEN:
        return (
            f"hidden_size {H} is above MK_NORM_MAX_HIDDEN = {abi.MK_NORM_MAX_HIDDEN}, the most the "
            "GEMVs' norm staging takes"
        )
    late_dense = [i for i in cfg.dense_layers if i != 0]
    if late_dense:
        return (
            f"dense MLP layers {late_dense} after layer 0: only layer 0's sum has an initialiser "
            "(EMBED); a MoE layer's router tiles initialise its sum"
        )
    if (router_rows * H) % (E * 4):
        return (
            f"router tiles of {router_rows} of {E} experts copy {router_rows * H / E:g} of the "
            f"{H} residual columns each, not a whole number of float4s (4 columns)"
        )
    return None


# The Tiling fields that choose a mode or a placement rather than a tile size (a reduced-geometry
# check copies them as given and scales only the sizes: gpu_check.reduced_check).
SWITCH_FIELDS = frozenset(
    {
        "moe_local",
        "moe_group",
        "attn_group",
        "attn_with_qkv",
        "attn_idle_first",
        "ctrl_sms",
        "moe_fused",
        "combine_ctrl",
        "attn_in_moe",
        "qkv_by_head",
    }
)


def default_tiling(cfg: ModelConfig) -> Tiling:
    """The release tiling, shrunk where a small (test) geometry cannot take it."""

    def fit(want: int, n: int, multiple: int = 1) -> int:
        t = min(want, n)
        while t > multiple and (n % t or t % multiple):
            t -= multiple
        return max(t, multiple)

    H = cfg.hidden_size
    qkv = fit(64, math.gcd(cfg.q_width, cfg.kv_width), 2)
    D = cfg.prefix_dense_intermediate_size or 32
    splits = 4
    while splits > 1 and (D % splits or (D // splits) % 32):
        splits -= 1
    return Tiling(
        qkv_rows=qkv,
        o_rows=fit(64, H),
        router_rows=fit(16, max(cfg.num_experts, 1)),
        dense_up_cols=fit(32, D),
        dense_down_rows=fit(64, H),
        mlp_splits=splits,
        moe_up_cols=fit(32, max(cfg.intermediate_size, 1)),
        moe_down_rows=fit(128, H),
        lm_rows=128,
    )


# Batches from this size on stream MoE weights in wider tiles: up tiles 4x the columns (256 weight
# rows, 1 MB), down tiles 4x the rows (512). Measured on the H200 at 8K, BS 8 (2026-11-29):
# 11.95 ms per step with 4x/4x, 12.40 with 4x/2x, 13.67 with 2x/2x, 16.5 with the default; BS 1 is
# slower with any wider tile (5.86 vs 5.69 ms with 4x/4x). The fixed cost of a queue item (claim,
# staging, reduction, signal: ~5 us, measured by the timeline) is amortised over more bytes once
# there are several waves of items. The crossover between BS 1 and 8 is not measured yet. Measured 2026-11-30
# (2026-11-30, gpu_check, one call): BS 8 up tiles 8x (512 weight rows, 2 MB) 10.656 / 10.789 ms
# against 4x 10.874 / 11.052. (2026-11-30, gpu_check, two calls, with lazy claims, below):
# up tiles 12x (384 columns, 768 weight rows, 3 MB: two per expert, MK_MAX_TILE_ROWS 1024) and 512-row
# down tiles, against 8x up tiles with two up-tile sizes and eager claims: BS 8 at 8K 9.456 / 9.582 /
# 9.482 ms vs 9.874 / 9.936 / 9.785, at position 256 8.174 vs 8.939; BS 4 at 8K 6.529 / 6.579 vs
# 6.927 / 7.052, at 256 5.635 vs 6.148. Half the queue items, so half the ~7-8 us each pays
# outside its GEMV (docs/PERF.md, decision table); 1024-row down tiles with them were slower (BS 8
# 9.67 / 9.52 / 9.53, BS 4 6.84).
WIDE_MOE_FROM_BATCH = 4
# (up columns, down rows) factors, the first the config takes
WIDE_MOE_SCALES = ((12, 4), (8, 4), (4, 4), (4, 2), (2, 2))


# Below WIDE_MOE_FROM_BATCH the MoE tiles are 2x (else 1.5x) the up columns and 2x the down rows
# where the config allows. Measured on the H200 at 8K, BS 1 (gpu_check): 2026-11-29 (eager claims)
# 48/256 4.92 ms per step, 32/128 5.14, 48/128 4.94, 64/128 5.07, 32/64 5.26; 2026-11-29 (lazy
# claims, two calls) 64/256 4.299 and 4.282 ms against 48/256 4.359-4.392 and 4.316-4.327, 64/128
# 4.66, 48/128 4.55; (2026-11-30, after the faster ROUTER / ROUTE and K-in-registers
# attention, one call) 128/256 3.890 ms, 96/256 3.909 against 64/256 3.938 / 3.978: the up tiles
# in one wave on the SMs the attention leaves.
# (up columns, down rows) factors, the first the config takes
SMALL_MOE_SCALES = ((4, 2), (2, 2), (Fraction(3, 2), 2))


def _widest(cfg: ModelConfig, base: Tiling, scales) -> Tiling:
    """`base` with its MoE tiles scaled by the first (up, down) factor pair that gives whole tiles the
    config takes; `base` itself when none does."""
    for up, down in scales:
        cols, rows = base.moe_up_cols * up, base.moe_down_rows * down
        if cols != int(cols) or rows != int(rows):
            continue
        scaled = replace(base, moe_up_cols=int(cols), moe_down_rows=int(rows))
        try:
            scaled.validate(cfg)
        except TilingError:
            continue
        return scaled
    return base


# Claims: lazy at every batch size (the kernel's only policy since ABI 21, mk_abi.h; the others and
# the claim window were removed). Measured on the H200 at 8K in one call (2026-11-29,
# gpu_check): BS 1 4.36 / 4.39 ms lazy, 4.59 lazy at the queues' ends only, 4.74 eager;
# BS 8 11.87 / 11.89 lazy, 11.72 lazy at the ends, 11.55 eager (BS 8 had several waves of up tiles,
# and an eager claim's latency hid behind the running item). Measured 2026-11-30 (gpu_check, same call): with
# the 384-column up tiles BS 8 lazy 9.532 / 9.522 ms, lazy at the end 9.838, eager (the 8x tiles)
# 9.785; a 3-MB up tile claimed ahead holds its successor for ~40 us, while SMs that are free wait.

# Attention splits per (row, kv head) at most below WIDE_MOE_FROM_BATCH rows (only BS 1 reaches the
# default 32 at 8K): fewer, longer attention items leave more SMs to the MoE up tiles of the layer.
# Measured on the H200 at 8K, BS 1 (gpu_check, lazy claims, 64/256 MoE tiles), three runs in two
# calls: 16 splits 4.210, 4.292, 4.258 ms against 32 splits 4.378, 4.441, 4.420 (12: 4.317, 24: 4.293).
# (2026-11-30, gpu_check, two calls), with the attention drains on idle SMs first
# (SMALL_ATTN_IDLE_FIRST): 10 splits 3.070 / 3.082 and 3.082 / 3.098 / 3.083 ms against 16 splits
# without it 3.136 / 3.155 and 3.161 / 3.178 / 3.156 (8 splits 3.157 / 3.136; 12: 3.060 / 3.154;
# idle-first alone 3.111 / 3.212): 40 items per layer, as many as the SMs that hold no QKV / router
# tile, so none starts late on a QKV tile's SM (with 64 items ~24 did, ~9 us after the QKV tiles).
# BS 2 / 3 (one call, two rounds): 4.300 / 4.373 and 5.782 / 5.904 ms vs 16 splits without it 4.367 /
# 4.379 and 5.946 / 5.941: no loss.
SMALL_MAX_SPLITS = 10
SMALL_ATTN_IDLE_FIRST = 1
# ... but at long contexts one split per SMALL_SPLIT_TOKENS visible tokens (up to SMALL_SPLIT_CAP):
# with 10 splits a full layer's attention items at 32K / 64K (~0.8 / 1.7 MB each at ~25-35 GB/s per
# SM) outlasted the layer. Measured on the H200 at BS 1 (2026-11-30, gpu_check, one call,
# splits 10 / 16 / 24 / 32): 16K 3.222 and 3.359 / 3.293 / 3.596 / 3.621 ms (this rule: 10); 32K 3.646
# and 3.774 / **3.526** / 3.833 / 3.803 (16); 64K 4.541 and 4.550 / 4.093 / **4.016** / 4.057 (24).
SMALL_SPLIT_TOKENS = 2048
# ... and at most this many (and never more than the base tiling's max_splits, the workspace's
# split stride, so the per-batch tilings fit the engine's one workspace). Harness at BS 1 (2026-11-30, calls
# 9 and 14, `mkcode bench decode --backend graph,megakernel --batch 1 --ctx ...`, graph in brackets):
# cap 32: 32768 3.404 (3.416), 40960 3.474 (3.463), 49152 3.531 (3.518), 65536 3.667 (3.616) ms;
# cap 24: 3.346 (3.414), 3.432 (3.470), 3.474 (3.514), 3.583 (3.615); 98304 3.913 (3.832). With the
# self-routing fused items (48 SMs at one row) 20: 4 kv heads x 20 = 80 items make one wave on the SMs
# they leave; 96 ran in two. H100, 2026-12-07, gpu_check, one call, two rounds, BS 1 at 128K: 4.631 /
# 4.610 ms vs 24 splits 4.803 / 4.697.
SMALL_SPLIT_CAP = 20
# ... and at two rows at most PAIR_SPLIT_CAP (2 rows x 4 kv heads x 24 splits outnumber the SMs):
# H100, 2026-12-07, gpu_check, one call, two rounds: BS 2 128K 7.080 / 7.072 ms vs 24 splits 7.710 /
# 7.699 (12: 7.272 / 7.329), 32K 5.368 / 5.370 vs 5.494 / 5.482; BS 1 and BS 3 equal either way.
PAIR_SPLIT_CAP = 16


# Control SMs (Tiling.ctrl_sms): one per batch row (measured when each row's add+norm task, since
# removed, had its own SM; ROUTE runs on one of them), and from WIDE_MOE_FROM_BATCH rows the
# attention drains on the SMs of the QKV and router tiles (Tiling.attn_with_qkv). Measured on the
# H200 at 8K (2026-11-30, gpu_check, same call): BS 1 ctrl_sms=1 3.586 / 3.651 ms vs 3.810 / 3.712,
# 3.697 / 3.716 vs 3.790 / 3.811, 3.619 / 3.585 vs 3.671 / 3.718 (three calls); BS 8 ctrl_sms=8 with
# attn_with_qkv 10.555 / 10.701 vs 10.996 / 11.058 and 10.561 / 10.571 vs 10.852 / 10.899
# (ctrl_sms=8 alone 10.604 / 10.806; ctrl_sms=4: 11.15). (2026-12-01, gpu_check, same call): from 4
# rows the attention drains are on every work SM again (below), with at most WIDE_MAX_SPLITS splits.
CTRL_SMS_PER_ROW = 1
WIDE_ATTN_WITH_QKV = 0

# From WIDE_MOE_FROM_BATCH rows at most WIDE_MAX_SPLITS attention splits per (row, kv head) up to
# WIDE_SPLIT_TOKENS visible tokens per split (more at long contexts, up to `base`'s max_splits:
# Tiling.split_tokens), attention drains on every work SM first (WIDE_ATTN_WITH_QKV = 0), and from
# WIDE_BIG_DOWN_FROM_BATCH rows down tiles WIDE_BIG_DOWN_SCALE x as tall as the scaled ones (1024
# rows at the release geometry, where the config takes them). The layer then runs as phases, as the
# graph backend's does (a torch profile of its BS 8 step, 2026-12-01): the attention on every SM in
# less than a wave of items (96 at BS 8: the SMs without one start the up tiles at once), the up
# tiles, then one wave of down tiles (103 at BS 8). Measured on the H200 at 8K (2026-12-01,
# gpu_check, same call, against the drains-on-QKV engine tiling 9.176 / 9.094 ms at BS 8, 6.332 /
# 6.328 at BS 4): BS 8 all three 8.924 / 8.828 (with 100 attention drains 8.836), 2 splits 9.046,
# 3 splits with 512-row downs 9.039, 3 splits alone 9.244; BS 4 3 splits on every SM 6.061, 3 splits
# alone 6.093, with 1024-row downs 6.421 / 6.249 (29 experts: 58 down items). The attention alone
# streams ~1.9 TB/s (the graph backend's kernel ~2.6), the next thing to speed up in this layer. At
# long contexts the phases lose at 8 rows: BS 8 at 32K 12.874 vs 12.420 ms with the drains-on-QKV tiling
# (at 2K 8.240 vs 8.342; 2026-12-01). So from WIDE_LONG_FROM_BATCH rows and a split bucket
# position of WIDE_PHASED_BELOW_POSITION (contexts of 32K tokens and more: a context of C tokens plans
# for the power of two above C) the wide tiling is the drains-on-QKV one: attention drains on the QKV SMs,
# splits for one wave, the scaled down tiles; below 8 rows the phased layer stays at every context.
# Measured on the
# H200 (2026-12-01, gpu_check, phased vs the drains-on-QKV tiling, same call; "ctx" is the
# context, its bucket twice that). With WIDE_SPLIT_TOKENS 8192: BS 8 ctx 16K 9.512 / 9.463 vs 9.894 /
# 9.932 ms, ctx 32K 12.800 / 12.823 vs 12.100 / 12.016 (call 14); BS 4 ctx 32K 6.949 / 6.872 (call 13).
# With 4096 (calls 1 and 4): BS 8 ctx 16K 10.407 / 10.410 vs 10.003 / 10.038 / 10.155, ctx 32K 12.705
# / 12.939 vs 12.176 / 12.161 / 12.132; BS 4 ctx 16K 6.377 vs 6.788 / 7.006 / 6.998, ctx 32K 7.740 vs
# 8.111 / 8.064 / 7.931 and 7.808 / 7.904 vs 7.984 / 8.090; BS 6 ctx 32K 10.281 / 10.282 vs 10.478 /
# 10.463 (with 8192: 10.357, 4096 10.169 in call 14). BS 5 / 7 and BS 4 / 6 beyond 32K not measured.
# Measured 2026-12-01 (the attention as 16 independent warp pipelines, ~1.4x the items' rate): the phased layer
# wins at 32K too, BS 8 ctx 32K 10.366 vs 10.576 ms with the drains-on-QKV tiling, ctx 16K 9.207 vs 9.468
# (gpu_check, same call, 2026-12-01, call 5), so the threshold moved from 32768 to 65536: the phased
# layer up to contexts of 32K tokens (a 32K context plans for a 64K bucket); longer contexts keep
# the drains-on-QKV tiling, not measured since the new attention.
WIDE_PHASED_BELOW_POSITION = 65536
WIDE_LONG_FROM_BATCH = 8
WIDE_LONG_ATTN_WITH_QKV = 1  # the drains-on-QKV placement, where the phased layer is not used
WIDE_MAX_SPLITS = 3
# 8192: an 8K context (split bucket 16K) takes 3 splits in the full layers as in the sliding ones
# (with 4096 it took 4): gpu_check at 8K, same call, BS 8 8.909 / 8.812 vs 8.994 / 8.901 ms (call 11)
# and 8.892 / 8.891 vs 8.981 / 8.989 (call 12); BS 4 6.079 / 5.950 vs 6.076 / 6.058 (call 11)
WIDE_SPLIT_TOKENS = 8192
WIDE_BIG_DOWN_FROM_BATCH = 8
WIDE_BIG_DOWN_SCALE = 2
# From this many rows the phased layer's attention items are its MoE queue's head, claimed before
# ROUTE (Tiling.attn_in_moe = WIDE_ATTN_IN_MOE = 3; no attention drains): the attention starts as the
# QKV tiles end and an SM whose attention item ends takes an up tile from the same drain (its switch
# 10.9 -> 6.9 us median). Measured on the H200 at 8K (2026-12-02, gpu_check, same call):
# BS 8 8.870 / 8.901 vs 8.927 / 9.004 ms; BS 4 equal; BS 1 +2-3 % (3.173 / 3.179 vs 3.083 / 3.127).
# With WIDE_QKV_BY_HEAD against neither: 8K equal to -2 % over four calls, 16K -0.8 %, 32K -3 %
# (10.163 / 10.184 vs 10.490 / 10.497 ms).
WIDE_ATTN_IN_MOE_FROM_BATCH = 8
WIDE_ATTN_IN_MOE = 3
# With it, one QKV counter per kv head (Tiling.qkv_by_head, where the QKV tiles fit the heads): the
# attention items, claimed early by SMs that then wait for the QKV tiles, start when their own
# head's tiles are done. Measured 2026-12-02, same call, BS 8: 8.689 / 8.687 / 8.674 vs 8.867 / 8.746 /
# 8.816 ms (without attn_in_moe = 3 it was equal: 8.871 / 8.901 vs 8.875 / 8.926).
WIDE_QKV_BY_HEAD = 1


# Below WIDE_MOE_FROM_BATCH rows: fused MoE items (Tiling.moe_fused: up tile + down slice, no down
# wave), at least SMALL_CTRL_SMS control SMs and the MoE layers' combines on them (combine_ctrl).
# Measured on the H200 at 8K (2026-11-30, gpu_check, same call each line):
#   BS 1 unfused 3.554 / 3.580 ms, fused 3.424 / 3.421; unfused 3.658 / 3.599, fused 3.383, fused
#   with 64 / 32 columns 3.538 / 4.098; unfused 3.502 / 3.543, fused 3.456 / 3.400, fused + 4 control
#   SMs 3.342, + combines on them 3.367 / 3.347;
#   BS 2 unfused 4.774 / 4.851, fused 4.623 / 4.684, + 4 control SMs 4.625, + combines 4.665 / 4.607;
#   BS 8 (256 columns) fused 10.88 / 10.86 and 10.72 (128 columns 10.70) vs unfused 10.46-10.60: not
#   from WIDE_MOE_FROM_BATCH on. The combines on the control SMs run warm (5.3 vs 7.1 us as queue
#   items) but the step did not change: kept for the shorter attention chain.
SMALL_MOE_FUSED = 1
# ... below this many rows: BS 3 (22.7 experts per layer) runs separate up and down tiles with the
# small batches' other settings. Measured on the H200 at 8K (2026-11-30, gpu_check, one
# call): BS 3 fused 5.921 / 5.868 ms, unfused 5.542; BS 2 fused 4.296 / 4.275, unfused 4.306.
SMALL_FUSED_BELOW = 3
SMALL_CTRL_SMS = 4
SMALL_COMBINE_CTRL = 1
# LM-head tiles of 256 vocab rows below WIDE_MOE_FROM_BATCH rows (half the tiles: half their fixed
# staging / epilogue / signal cost). BS 1, fused default, same call: 3.306 vs 3.355 / 3.317 ms and
# 3.322 vs 3.398 / 3.418 (2026-11-30); an earlier kernel measured it neutral (2026-11-29).
SMALL_LM_ROWS = 256
# O-proj tiles of 128 rows below WIDE_MOE_FROM_BATCH rows (64 items of 256 KB instead of 128 of 128
# KB in the attention tail). BS 1, same call: 3.402 and 3.337 vs 3.450 / 3.428 ms (o_rows 32: 3.741).
SMALL_O_ROWS = 128
# ... and from WIDE_MOE_FROM_BATCH rows too, since the 384-column up tiles (2026-11-30, gpu_check BS 8
# at 8K): 9.287 ms vs 9.588 / 9.480 with 64-row tiles (call 19; combines by the last split 9.400, 8 splits 9.510,
# 64 attention drains 9.794), then 9.242 / 9.228 vs 9.427 / 9.415, at position 256 7.941 vs 8.077
# (call 20). Measured 2026-11-30 (eager claims, 256-column tiles): -1 to -1.5 %.
WIDE_O_ROWS = 128
# QKV tiles of 128 rows at one row (40 tiles instead of 80: the SMs they free take attention items
# before the QKV tiles end). BS 1, gpu_check, same call (2026-12-01): at 8K 3.040 / 3.046 vs 3.111 /
# 3.177 ms (call 6) and 3.086 / 3.092 vs 3.142 / 3.137 (call 7), at 2K 3.001 / 2.991 vs 3.020 / 3.024
# (call 13), at 32K equal (3.436 / 3.454 vs 3.398 / 3.532); across calls the harness shows it within
# the device's noise. BS 2 equal (4.214 / 4.349 vs 4.256 / 4.295), BS 8 +0.8 % (8.961 / 8.925 vs
# 8.829 / 8.914): one row only.
SINGLE_QKV_ROWS = 128

# Tiling.moe_local at one row: the fused items rank the router's logits themselves (no ROUTE, no
# MoE queue). Measured on the H200 at 8K (gpu_check, 2026-12-06, four alternating rounds in one
# call): 2.967 / 2.975 / 3.006 / 2.916 ms against 3.039 / 3.148 / 3.151 / 3.100 (-4.8 % by the
# medians); the layer's MoE chain ends ~9 us sooner and its attention chain now ends the layer.
SINGLE_MOE_LOCAL = 1


def tiling_for_batch(cfg: ModelConfig, base: Tiling, batch: int, position: int | None = None) -> Tiling:
    """The engine's tiling for a batch size (_batch_tiling), at one row with SINGLE_MOE_LOCAL where
    the tiling takes it (`base`'s moe_group and attn_group with it, at one row only: TilingError
    where the config does not take them)."""
    t = _batch_tiling(cfg, replace(base, moe_group=0, attn_group=0), batch, position)
    if batch != 1:
        return t
    t = _if_valid(cfg, replace(t, moe_local=SINGLE_MOE_LOCAL), t)
    if base.moe_group or base.attn_group:  # asked for: one the config does not take is refused
        t = replace(t, moe_group=base.moe_group, attn_group=base.attn_group)
        t.validate(cfg)
    return t


def _batch_tiling(cfg: ModelConfig, base: Tiling, batch: int, position: int | None = None) -> Tiling:
    """The default tiling adapted to a batch size: below WIDE_MOE_FROM_BATCH rows the widest of
    SMALL_MOE_SCALES the config allows, at most SMALL_MAX_SPLITS attention splits (one
    per SMALL_SPLIT_TOKENS visible tokens at long contexts, up to SMALL_SPLIT_CAP (PAIR_SPLIT_CAP at
    two rows) and `base`'s
    max_splits) with
    the attention drains on idle SMs first (SMALL_ATTN_IDLE_FIRST), fused MoE items below
    SMALL_FUSED_BELOW rows (where the tile's columns allow them), the combines on SMALL_CTRL_SMS control SMs,
    SMALL_LM_ROWS-row LM-head tiles and SMALL_O_ROWS-row O-proj tiles (and SINGLE_QKV_ROWS-row QKV
    tiles at one row);
    from there on the widest of WIDE_MOE_SCALES, WIDE_O_ROWS-row O-proj
    tiles, at most WIDE_MAX_SPLITS attention splits (more at long contexts: WIDE_SPLIT_TOKENS) with
    the attention drains on every work SM (`base`'s tiles where no scale fits), down tiles
    WIDE_BIG_DOWN_SCALE x as tall from WIDE_BIG_DOWN_FROM_BATCH rows; one control SM per row at
    every size. `position`: the step's split bucket (split_bucket_position; None: a short context);
    from WIDE_LONG_FROM_BATCH rows and WIDE_PHASED_BELOW_POSITION on the wide tiling keeps the
    attention on the QKV SMs with splits for one wave and the scaled downs."""
    small = batch < WIDE_MOE_FROM_BATCH
    t = _widest(cfg, base, SMALL_MOE_SCALES if small else WIDE_MOE_SCALES)
    t = replace(t, ctrl_sms=min(abi.MK_MAX_TOKENS, CTRL_SMS_PER_ROW * batch))
    if not small:
        t = replace(t, attn_with_qkv=WIDE_LONG_ATTN_WITH_QKV)
        long = (
            batch >= WIDE_LONG_FROM_BATCH and position is not None and position >= WIDE_PHASED_BELOW_POSITION
        )
        if not long:  # the phased layer
            t = replace(
                t,
                attn_with_qkv=WIDE_ATTN_WITH_QKV,
                max_splits=min(t.max_splits, WIDE_MAX_SPLITS),
                split_tokens=WIDE_SPLIT_TOKENS,
                split_cap=max(t.max_splits, t.split_cap),
            )
            if batch >= WIDE_BIG_DOWN_FROM_BATCH:  # where the config takes such tiles
                t = _if_valid(cfg, replace(t, moe_down_rows=t.moe_down_rows * WIDE_BIG_DOWN_SCALE), t)
            if batch >= WIDE_ATTN_IN_MOE_FROM_BATCH:
                t = replace(t, attn_in_moe=WIDE_ATTN_IN_MOE)
                t = _if_valid(cfg, replace(t, qkv_by_head=WIDE_QKV_BY_HEAD), t)
        if cfg.hidden_size % WIDE_O_ROWS == 0:
            t = replace(t, o_rows=WIDE_O_ROWS)
        return t
    t = replace(
        t,
        max_splits=min(t.max_splits, SMALL_MAX_SPLITS),
        split_tokens=SMALL_SPLIT_TOKENS,
        split_cap=min(t.max_splits, PAIR_SPLIT_CAP if batch == 2 else SMALL_SPLIT_CAP),
        attn_idle_first=SMALL_ATTN_IDLE_FIRST,
    )
    tuned = replace(
        t,
        moe_fused=SMALL_MOE_FUSED if batch < SMALL_FUSED_BELOW else 0,
        ctrl_sms=min(abi.MK_MAX_TOKENS, max(t.ctrl_sms, SMALL_CTRL_SMS)),
        combine_ctrl=SMALL_COMBINE_CTRL,
        lm_rows=SMALL_LM_ROWS if cfg.vocab_size % SMALL_LM_ROWS == 0 else t.lm_rows,
        o_rows=SMALL_O_ROWS if cfg.hidden_size % SMALL_O_ROWS == 0 else t.o_rows,
    )
    if batch == 1:
        tuned = _if_valid(cfg, replace(tuned, qkv_rows=SINGLE_QKV_ROWS), tuned)
    return _if_valid(cfg, tuned, t)  # not e.g. with a column count the fused down slice does not take


def _if_valid(cfg: ModelConfig, candidate: Tiling, fallback: Tiling) -> Tiling:
    """`candidate` if the config takes it (Tiling.validate), else `fallback`."""
    try:
        candidate.validate(cfg)
    except TilingError:
        return fallback
    return candidate


def visible_pages(position: int, window: int | None) -> int:
    """Pages a query at `position` touches (the window may straddle one more page than it spans)."""
    lo = first_visible_position(position, window)
    return position // PAGE_SIZE - lo // PAGE_SIZE + 1


def split_bucket_position(positions: list[int], tiling: Tiling) -> int:
    """The context the split policy plans for: the batch's longest row rounded UP to a power of two
    (at least `split_bucket` tokens), minus one. Schedules are cached by the split counts, so the
    step's schedule changes only when the longest row crosses a power of two or the batch size
    changes (rebuilding costs ~0.4 s at the release geometry: never per step)."""
    need = max(positions) + 1
    bucket = max(tiling.split_bucket, 1 << (need - 1).bit_length())
    return bucket - 1


def attention_splits(
    cfg: ModelConfig, positions: list[int], tiling: Tiling, n_sms: int
) -> dict[bool, list[int]]:
    """Splits per row for full (False) and sliding (True) layers: the same count for every row.

    The count is planned for all rows at the bucketed longest context (`split_bucket_position`),
    with a grain that makes roughly one wave of (row, kv head, split) items per layer; each split
    then covers ceil(pages / splits) of its row's REAL visible pages, so shorter rows simply get
    shorter (or empty) splits and the drains balance the rest."""
    if tiling.attn_group and len(positions) == 1:  # one split per SM of a kv head's group
        return {False: [tiling.attn_group], True: [tiling.attn_group]}
    out: dict[bool, list[int]] = {}
    pb = split_bucket_position(positions, tiling)
    for sliding in (False, True):
        pages = visible_pages(pb, cfg.sliding_window if sliding else None)
        total = pages * len(positions) * cfg.num_key_value_heads
        grain = max(2, math.ceil(total / max(n_sms, 1)))
        cap = split_cap(tiling, pages)
        out[sliding] = [max(1, min(cap, math.ceil(pages / grain)))] * len(positions)
    return out


def split_cap(tiling: Tiling, pages: int) -> int:
    """The most splits per (row, kv head) for a layer whose rows see `pages` KV pages: max_splits,
    raised at long contexts by Tiling.split_tokens (up to split_cap)."""
    if not tiling.split_tokens:
        return tiling.max_splits
    return max(tiling.max_splits, min(tiling.split_cap, math.ceil(pages * PAGE_SIZE / tiling.split_tokens)))
