"""The decode-backend interface: what the engine hands a backend for one decode step.

Backends: `torch` (the reference ops over the paged cache; CPU or GPU), `graph` (per-op GPU kernels
captured in CUDA graphs) and `megakernel` (one persistent CUDA kernel). All read and write the same
paged KV pool (`mkcode.backend.kv.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class DecodeBatch:
    """One decode step for B sequences (one new token each), all tensors on the model's device.

    token_ids [B] int64: the token to feed; positions [B] int64: its position (= tokens already in
    the cache); block_tables [L, B, P] int32: pages per layer (NO_PAGE where released or unused); the
    pages that hold `positions` are allocated by the engine before the step. kv_pool: the pool tensor
    `[num_pages, 2, Hkv, PAGE_SIZE, d]`. The backend writes each token's K/V at its position.
    host_positions: the same positions on the host when the caller has them (the engine does); a
    backend that needs them there (the megakernel's schedule, the hybrid's choice) reads them here
    instead of copying the device tensor back, which waits for all queued GPU work.

    seq_rows: rows per sequence, in row order (sum = B), when some sequence has several rows (a
    speculative verify step); None means one row each. A sequence's rows are consecutive, at
    consecutive positions (L, L+1, ..., L+k) over the same block table, and row i attends to every
    position up to its own, including the K/V that rows before it write in this same step: a
    backend must write all of a step's K/V before any row reads (backends that can say so set
    `verify_rows = True`; the engine sends several rows of one sequence to no other).
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    block_tables: torch.Tensor
    kv_pool: torch.Tensor
    host_positions: tuple[int, ...] | None = None
    seq_rows: tuple[int, ...] | None = None

    @property
    def size(self) -> int:
        return int(self.token_ids.shape[0])

    def positions_on_host(self) -> list[int]:
        """The positions as Python ints: `host_positions` when given, else read from the device."""
        if self.host_positions is not None:
            if len(self.host_positions) != self.size:
                raise ValueError(
                    f"host_positions has {len(self.host_positions)} entries for {self.size} rows"
                )
            return list(self.host_positions)
        return [int(p) for p in self.positions.tolist()]

    @property
    def has_verify_rows(self) -> bool:
        """Some sequence has several rows in this step."""
        return self.seq_rows is not None and any(n > 1 for n in self.seq_rows)


class DecodeBackend(Protocol):
    name: str
    max_batch: int  # the largest batch one call accepts; the engine splits larger batches
    # optional `verify_rows: bool`: True when the backend honours DecodeBatch.seq_rows (several
    # staggered rows of one sequence); a backend without it gets one row per sequence

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        """Run one step; return fp32 logits [B, vocab]."""
        ...
