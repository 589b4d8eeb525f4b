"""The `torch` decode backend: the reference model's ops over the paged KV pool (CPU or GPU).

Readable and exact rather than fast; it is the oracle the graph and megakernel backends are
checked against, and the backend of CPU-only machines.
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

    def __init__(self, model: ReferenceModel):
        self.model = model

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        segments = [
            Segment(b, b + 1, _TableView(self.model, batch.kv_pool, batch.block_tables, b))
            for b in range(batch.size)
        ]
        return self.model.forward(batch.token_ids, batch.positions, segments)
