"""The `torch` decode backend: the reference model's ops over the paged KV pool (CPU or GPU).

Readable and exact rather than fast; it is the oracle the graph and megakernel backends are
checked against, and the backend of CPU-only machines.

Verify rows (several rows of one sequence at consecutive positions, `DecodeBatch.seq_rows`) run as
one segment of the reference forward, as a prefill chunk does: each layer writes every row's K/V
first (`append_and_gather`), then each row attends to the keys at positions up to its own (the
causal mask of `ops.attention`), so row i sees what rows < i wrote in the same step.
"""

from __future__ import annotations

import torch

from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.kv.layout import append_and_gather
from mkcode.backend.model.reference import ReferenceModel, Segment


class _TableView:
    """KVStore over one row of a DecodeBatch's block tables."""

    def __init__(self, model: ReferenceModel, pool: torch.Tensor, tables: torch.Tensor, b: int):
        self.model, self.pool, self.tables, self.b = model, pool, tables, b

    def append(self, layer, k, v, positions):
        row = self.tables[layer, self.b]
        return append_and_gather(self.pool, row, self.model.cfg.window(layer), k, v, positions)


class TorchDecodeBackend:
    name = "torch"
    max_batch = 256
    verify_rows = True

    def __init__(self, model: ReferenceModel):
        self.model = model

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        spans = batch.seq_rows or (1,) * batch.size
        if sum(spans) != batch.size:
            raise ValueError(f"seq_rows {spans} do not cover the batch's {batch.size} rows")
        if batch.has_verify_rows:
            pos, start = batch.positions_on_host(), 0
            for n in spans:
                if pos[start : start + n] != list(range(pos[start], pos[start] + n)):
                    raise ValueError(f"verify rows at positions {pos[start : start + n]} are not consecutive")
                start += n
        segments, start = [], 0
        for n in spans:  # a sequence's rows share its block table: the first row's stands for all
            segments.append(
                Segment(start, start + n, _TableView(self.model, batch.kv_pool, batch.block_tables, start))
            )
            start += n
        rows = torch.arange(batch.size, device=batch.token_ids.device)
        return self.model.forward(batch.token_ids, batch.positions, segments, logits_for=rows)
