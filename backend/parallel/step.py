"""One step's inputs, as rank 0 broadcasts them to the other ranks.

A step is a flat batch of N tokens in S segments (one per sequence; a decode step has S = N, one
token each; a prefill chunk has longer segments), the batch rows whose logits are wanted, and the
segments' block tables [L, S, P]. Page ids are global: every rank's KV pool has the same pages,
each holding that rank's kv heads, so one table serves every rank.

Wire format: a fixed header (int64 [6]: op, N, S, M, L, P) and then, for a forward, one int32
payload (token ids, positions, segment bounds, logits rows, block tables): two broadcasts per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mkcode.backend.kv.layout import NO_PAGE
from mkcode.backend.parallel.comm import Comm

OP_STOP = 0
OP_FORWARD = 1
OP_PING = 2  # no work: keeps an idle server's pending collective under the process-group timeout
HEADER_LEN = 6


@dataclass
class StepInputs:
    token_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    bounds: torch.Tensor  # [S, 2] int64: segment s is batch rows [start, end)
    logits_for: torch.Tensor  # [M] int64: rows whose logits are returned
    block_tables: torch.Tensor  # [L, S, P] int32, NO_PAGE where unmapped

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @classmethod
    def from_tables(
        cls,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        bounds: list[tuple[int, int]],
        tables: list[list[list[int]]],
        logits_for: torch.Tensor | None = None,
    ) -> StepInputs:
        """Build from per-segment page lists: tables[s][layer] = physical pages of segment s."""
        dev = token_ids.device
        L = len(tables[0])
        P = max(1, max(len(row) for seg in tables for row in seg))
        bt = torch.full((L, len(tables), P), NO_PAGE, dtype=torch.int32)
        for s, seg in enumerate(tables):
            for layer, row in enumerate(seg):
                if row:
                    bt[layer, s, : len(row)] = torch.tensor(row, dtype=torch.int32)
        if logits_for is None:
            logits_for = torch.tensor([end - 1 for _, end in bounds], device=dev)
        return cls(
            token_ids=token_ids.long(),
            positions=positions.long(),
            bounds=torch.tensor(bounds, dtype=torch.long, device=dev).view(-1, 2),
            logits_for=logits_for.long().to(dev),
            block_tables=bt.to(dev),
        )

    @classmethod
    def decode(
        cls, token_ids: torch.Tensor, positions: torch.Tensor, block_tables: torch.Tensor
    ) -> StepInputs:
        """One token per sequence (a DecodeBatch's fields): S = N, every row's logits."""
        n = int(token_ids.shape[0])
        rows = torch.arange(n, device=token_ids.device)
        return cls(
            token_ids=token_ids.long(),
            positions=positions.long(),
            bounds=torch.stack((rows, rows + 1), dim=1),
            logits_for=rows,
            block_tables=block_tables.to(torch.int32),
        )


def send_step(comm: Comm, step: StepInputs | None, device: torch.device) -> None:
    """Rank 0: announce a forward (or, with None, the end of service) to every other rank."""
    if comm.world == 1:
        return
    if step is None:
        comm.broadcast_(torch.tensor([OP_STOP, 0, 0, 0, 0, 0], dtype=torch.int64, device=device))
        return
    L, S, P = step.block_tables.shape
    N, M = step.num_tokens, int(step.logits_for.shape[0])
    comm.broadcast_(torch.tensor([OP_FORWARD, N, S, M, L, P], dtype=torch.int64, device=device))
    payload = torch.cat(
        [
            step.token_ids.to(device, torch.int32),
            step.positions.to(device, torch.int32),
            step.bounds.reshape(-1).to(device, torch.int32),
            step.logits_for.to(device, torch.int32),
            step.block_tables.reshape(-1).to(device, torch.int32),
        ]
    )
    comm.broadcast_(payload)


def send_ping(comm: Comm, device: torch.device) -> None:
    """Rank 0: a header with no work. An idle server's other ranks wait in a broadcast; NCCL (and
    gloo) fail a collective pending longer than the process-group timeout, so rank 0 pings well
    inside it."""
    if comm.world > 1:
        comm.broadcast_(torch.tensor([OP_PING, 0, 0, 0, 0, 0], dtype=torch.int64, device=device))


def recv_step(comm: Comm, device: torch.device) -> StepInputs | None:
    """Other ranks: wait for rank 0's next step (skipping pings); None means stop serving."""
    while True:
        header = comm.broadcast_(torch.zeros(HEADER_LEN, dtype=torch.int64, device=device))
        op, N, S, M, L, P = (int(v) for v in header.tolist())
        if op != OP_PING:
            break
    if op == OP_STOP:
        return None
    if op != OP_FORWARD:
        raise RuntimeError(f"unknown step op {op} from rank 0 (mismatched mkcode versions?)")
    payload = comm.broadcast_(torch.empty(2 * N + 2 * S + M + L * S * P, dtype=torch.int32, device=device))
    parts = torch.split(payload, [N, N, 2 * S, M, L * S * P])
    return StepInputs(
        token_ids=parts[0].long(),
        positions=parts[1].long(),
        bounds=parts[2].long().view(S, 2),
        logits_for=parts[3].long(),
        block_tables=parts[4].view(L, S, P).clone(),
    )
