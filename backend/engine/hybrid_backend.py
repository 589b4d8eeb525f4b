"""A decode backend that hands each step to the faster of two backends for its batch size.

On the H200 at 8K context the megakernel is faster than the graph backend for the smallest batches
and slower from a few rows on (docs/PERF.md: session 14 measured BS 1-4 and 8 in one harness run).
`--decode auto` therefore runs both over the same weights and paged KV pool when both load: the
megakernel below `split` rows, the graph backend from there. Both implement `DecodeBackend` and
read and write the same pool layout, so the steps of one sequence may alternate between them as the
batch grows and shrinks (each step writes its token's K/V at its position; nothing else carries
over between steps).
"""

from __future__ import annotations

import torch

from mkcode.backend.engine.decode_backend import DecodeBackend, DecodeBatch

# The megakernel takes the steps of fewer rows than this when `auto` finds both backends. Measured
# on the H200 at 8K (2026-11-30, session 14, one `mkcode bench decode` run, docs/PERF.md): megakernel
# vs graph BS 1 3.063 vs 3.219 ms, BS 2 4.191 vs 3.948, BS 3 5.692 vs 5.090, BS 4 7.135 vs 5.702,
# BS 8 9.788 vs 8.179: the megakernel only at BS 1.
MEGAKERNEL_BELOW_ROWS = 2


def auto_choice(graph_loads: bool, megakernel_loads: bool) -> str:
    """The backend `--decode auto` runs on a GPU given which of the two load: "hybrid" with both,
    else the one that loads, else "torch" (backend.runtime.choose_decode_backend; `mkcode doctor`
    predicts it with the same rule)."""
    if graph_loads and megakernel_loads:
        return "hybrid"
    return "graph" if graph_loads else "megakernel" if megakernel_loads else "torch"


class HybridDecodeBackend:
    name = "hybrid"

    def __init__(self, small: DecodeBackend, large: DecodeBackend, split: int = MEGAKERNEL_BELOW_ROWS):
        if split < 2:
            raise ValueError(f"split {split}: the small-batch backend must take at least one batch size")
        if split - 1 > small.max_batch:
            raise ValueError(
                f"split {split}: {small.name} runs at most {small.max_batch} rows, so it cannot take "
                f"every batch below {split}"
            )
        self.small, self.large, self.split = small, large, split
        self.max_batch = large.max_batch  # batches from `split` rows on go to `large`
        self.steps = {small.name: 0, large.name: 0}  # steps each backend ran (diagnostics)

    def backend_for(self, rows: int) -> DecodeBackend:
        return self.small if rows < self.split else self.large

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        backend = self.backend_for(batch.size)
        self.steps[backend.name] += 1
        return backend.decode(batch)

    def describe(self) -> str:
        return f"{self.small.name} below {self.split} rows, {self.large.name} from {self.split}"
