"""A decode backend that hands each step to the faster of two backends for its batch and context.

For a single sequence the megakernel is faster than the graph backend at every context from ~1K
tokens on (docs/PERF.md: BS 1 from 256 to 256K tokens on the H100, 2026-12-07), and slower from
two rows on (BS 2-8 at 8K; BS 2 within ~1 % either way). `--decode auto` therefore runs both over
the same weights and paged KV pool when both load: the megakernel for batches below `split` rows
whose longest row sits at a position in [`from_position`, `below_position`) (no upper bound when
`below_position` is None), the graph backend for every other step. Both implement `DecodeBackend`
and read and write the same pool layout, so the steps of one sequence may alternate between them
as the batch grows and shrinks or the context grows (each step writes its token's K/V at its
position; nothing else carries over between steps).
"""

from __future__ import annotations

import torch

from mkcode.backend.engine.decode_backend import DecodeBackend, DecodeBatch

# The megakernel takes the steps of fewer rows than this when `auto` finds both backends. Measured
# on the H200 at 8K (2026-11-30, one `mkcode bench decode` run, docs/PERF.md): megakernel
# vs graph BS 1 3.063 vs 3.219 ms, BS 2 4.191 vs 3.948, BS 3 5.692 vs 5.090, BS 4 7.135 vs 5.702,
# BS 8 9.788 vs 8.179: the megakernel only at BS 1. Still so after the warp-pipeline attention (2026-12-01,
# `mkcode bench decode --batch 2,3`): BS 2 4.041 vs 3.972 ms
# at 8K, 4.539 vs 4.300 at 32K; BS 3 5.252 vs 5.107, 5.734 vs 5.665 (BS 4 / 8: docs/PERF.md). On
# the H100 (2026-12-07, `mkcode bench decode --batch 2`, two calls) BS 2 is within ~1 % either way:
# megakernel vs graph at 2048 4.537-4.558 vs 4.590-4.610 ms, 8192 4.817-4.839 vs 4.886-4.890, but
# 1024 4.490-4.497 vs 4.475-4.481, 32768 5.303-5.305 vs 5.272-5.274, 131072 7.058-7.063 vs
# 7.008-7.011: too narrow a win (and the H200's 8K figure above the other way) to move the split.
# Again on the H100 (2026-12-07, `gpu_run.sh split`, two rounds): 8192 4.717-4.734 vs 4.808, 131072
# 6.826-6.869 vs 6.863-6.871: ahead by 0-2 %, still no H200 run of today's kernel at two rows.
MEGAKERNEL_BELOW_ROWS = 2
# ... and only once the longest row's position reaches this. Measured on the H200 at BS 1
# (2026-11-30, `mkcode bench decode --batch 1 --ctx ...`, docs/PERF.md): graph vs
# megakernel at position 256 2.714 vs 2.952 ms, 512 2.740 vs 2.982, 768 2.848 vs 2.992, 1024 3.047 vs
# 3.008, 2048 3.107 vs 2.965, 8192 3.227 vs 3.031. The megakernel's step hardly grows with the context
# (its attention runs beside the MoE items); the graph backend's does.
MEGAKERNEL_FROM_POSITION = 1024
# ... at any context (None: no upper bound). It was 65536 while the graph backend was faster from
# ~96K on (H200, 2026-11-30: 98304 3.832 vs 3.913 ms). Since the routing gap's KV prefetch was bounded
# and the split cap at one row is 20 (docs/PERF.md), measured on the H100 (2026-12-07, `mkcode bench
# decode --backend graph,megakernel --batch 1 --ctx ...`, `gpu_run.sh split`, four rounds over two
# calls): graph vs megakernel at 65536 4.145-4.148 vs 3.802-3.826 ms, 98304 4.439-4.447 vs
# 4.142-4.158, 131072 4.739-4.746 vs 4.483-4.507, 262144 5.873-5.875 vs 5.813-5.856: the
# megakernel in every round. (Below 1024 the H100 has the megakernel ahead too, 256: 3.26 vs 2.89-2.95
# ms, but the H200 had graph ahead there by 4-9 % (2026-11-30); the lower bound stays until an H200
# run of today's kernel says otherwise.)
MEGAKERNEL_BELOW_POSITION: int | None = None
# A step of the small-batch backend relative to the large one's of as many rows: the speculation
# policy (backend.spec.policy) weighs a sequence's plain step, which the megakernel runs, against its
# verify steps of 2+ rows, which the graph backend runs. Measured on the H100 at 8K (2026-12-07, the
# same runs as above): 3.137-3.155 vs 3.661-3.667 ms, 0.86 (H200, 2026-12-06: 2.842 vs 3.228, 0.88;
# at 128K 0.95). Below `from_position` the graph runs that step too; the policy does not see positions.
MEGAKERNEL_STEP_RATIO = 0.86


def positions_text(from_position: int, below_position: int | None) -> str:
    """The position range a hybrid gives the small-batch backend, as `describe()` and `mkcode
    doctor` print it (with a leading space; empty when it is every position)."""
    if below_position is not None:
        return f" at positions {from_position}-{below_position - 1}"
    return f" from position {from_position}" if from_position else ""


def auto_choice(graph_loads: bool, megakernel_loads: bool) -> str:
    """The backend `--decode auto` runs on a GPU given which of the two load: "hybrid" with both,
    else the one that loads, else "torch" (backend.runtime.choose_decode_backend; `mkcode doctor`
    predicts it with the same rule)."""
    if graph_loads and megakernel_loads:
        return "hybrid"
    return "graph" if graph_loads else "megakernel" if megakernel_loads else "torch"


class HybridDecodeBackend:
    name = "hybrid"

    def __init__(
        self,
        small: DecodeBackend,
        large: DecodeBackend,
        split: int = MEGAKERNEL_BELOW_ROWS,
        from_position: int = MEGAKERNEL_FROM_POSITION,
        below_position: int | None = MEGAKERNEL_BELOW_POSITION,
        small_step_ratio: float = MEGAKERNEL_STEP_RATIO,
    ):
        if split < 2:
            raise ValueError(f"split {split}: the small-batch backend must take at least one batch size")
        if split - 1 > small.max_batch:
            raise ValueError(
                f"split {split}: {small.name} runs at most {small.max_batch} rows, so it cannot take "
                f"every batch below {split}"
            )
        if from_position < 0:
            raise ValueError(f"from_position {from_position} must be >= 0")
        if below_position is not None and below_position <= from_position:
            raise ValueError(f"below_position {below_position} must be above from_position {from_position}")
        self.small, self.large, self.split = small, large, split
        self.from_position, self.below_position = from_position, below_position
        self.max_batch = large.max_batch  # batches from `split` rows on go to `large`
        # several rows of one sequence (a speculative verify step) go to a backend that runs them
        self.verify_rows = bool(getattr(large, "verify_rows", False))
        if not 0 < small_step_ratio <= 1:
            raise ValueError(
                f"small_step_ratio {small_step_ratio} must be in (0, 1]: `small` is the faster one"
            )
        # the step time by rows (the speculation policy's cost model): `large`'s, scaled by
        # small_step_ratio where `small` runs the step; none when `large` gives none
        self._large_cost = getattr(large, "row_cost", None)
        self.small_step_ratio = small_step_ratio
        self.row_cost = self._row_cost if self._large_cost is not None else None
        self.steps = {small.name: 0, large.name: 0}  # steps each backend ran (diagnostics)

    def _row_cost(self, rows: int) -> float:
        cost = self._large_cost(rows)
        return cost * self.small_step_ratio if rows < self.split else cost

    def backend_for(self, rows: int, longest_position: int) -> DecodeBackend:
        """`small` for batches below `split` rows whose longest row's position is in
        [from_position, below_position); `large` for every other step."""
        below = self.below_position is None or longest_position < self.below_position
        if rows < self.split and longest_position >= self.from_position and below:
            return self.small
        return self.large

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        rows = batch.size
        # the positions are only needed where the row count leaves the choice open (the engine
        # passes them on the host; otherwise this reads the device tensor back)
        window = self.from_position > 0 or self.below_position is not None
        longest = max(batch.positions_on_host()) if rows < self.split and window else 0
        backend = self.backend_for(rows, longest)
        if batch.has_verify_rows and not getattr(backend, "verify_rows", False):
            backend = self.large
        self.steps[backend.name] += 1
        return backend.decode(batch)

    def describe(self) -> str:
        at = positions_text(self.from_position, self.below_position)
        return f"{self.small.name} below {self.split} rows{at}, {self.large.name} otherwise"
