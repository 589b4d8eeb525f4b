"""Rank 0's face of the parallel model, the other ranks' serve loop, and the decode backend.

Rank 0 runs the engine and scheduler unchanged: `ParallelModel` has the surface the engine uses of
`ReferenceModel` (cfg, device, dtype, `forward(token_ids, positions, segments, logits_for)`), and
`ParallelDecodeBackend` is a `DecodeBackend`. Each call broadcasts the step's inputs (token ids,
positions, segment bounds, block tables) and then runs rank 0's own share; ranks 1.. sit in
`serve()` running the same steps on their shards until rank 0 calls `shutdown()`.

KV: every rank has a pool with the same page count (`build_kv_pool`, collective), holding its own
kv heads; the page bookkeeping (free list, prefix cache, block tables) lives only in rank 0's
engine, and the other ranks learn the tables from each step.
"""

from __future__ import annotations

import threading
import time

import torch

from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.kv.pool import KVPool
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.reference import Segment
from mkcode.backend.model.weights import ModelWeights
from mkcode.backend.parallel.comm import Comm
from mkcode.backend.parallel.plan import ShardPlan
from mkcode.backend.parallel.shard import shard_weights
from mkcode.backend.parallel.sharded_model import ShardedModel
from mkcode.backend.parallel.step import StepInputs, recv_step, send_ping, send_step


def _segment_tables(seg: Segment) -> list[list[int]]:
    """Per-layer page lists of a segment's KV store (the engine's `SequenceKV.view(pool)`)."""
    seq = getattr(seg.kv, "seq", None)
    tables = getattr(seq, "tables", None)
    if tables is None:
        raise TypeError(
            f"ParallelModel needs paged KV (SequenceKV.view(pool)), got {type(seg.kv).__name__}: "
            "a contiguous cache cannot be shared across ranks"
        )
    return tables


class ParallelModel:
    def __init__(self, sharded: ShardedModel):
        self.shard = sharded
        self.cfg: ModelConfig = sharded.cfg
        self.comm = sharded.comm
        self.steps = 0
        # Rank 0: one thread at a time puts collectives on the wire (the engine's steps, the
        # keep-alive's pings, shutdown), so every rank sees them in the same order.
        self._lock = threading.Lock()
        self._closed = False
        self.broken: str | None = None  # why the ranks may be out of step (then no more steps)
        self.last_send = time.monotonic()

    @property
    def device(self) -> torch.device:
        return self.shard.device

    @property
    def dtype(self) -> torch.dtype:
        return self.shard.dtype

    @property
    def rank(self) -> int:
        return self.comm.rank

    # ---- rank 0 --------------------------------------------------------------------------------

    def run_step(self, step: StepInputs) -> torch.Tensor:
        """Rank 0: broadcast `step`, run its share, return fp32 logits [M, V]."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 drives steps; other ranks call serve()")
        with self._lock:
            if self._closed:
                raise RuntimeError("the parallel model was shut down")
            if self.broken is not None:
                raise RuntimeError(f"the parallel group is out of step after a failed step ({self.broken})")
            send_step(self.comm, step, self.device)
            self.steps += 1
            try:
                return self.shard.run(step)
            except Exception as e:
                # The other ranks may be inside a collective this rank never reached: no later
                # message can be matched safely, so refuse further steps (restart the server).
                self.broken = f"{type(e).__name__}: {e}"
                raise
            finally:
                self.last_send = time.monotonic()

    def ping(self, idle_s: float = 0.0) -> bool:
        """Rank 0: a no-op message to the other ranks if nothing was sent for `idle_s` seconds
        (keeps their pending receive under the process-group timeout). Returns whether it pinged."""
        with self._lock:
            if self._closed or self.broken or time.monotonic() - self.last_send < idle_s:
                return False
            send_ping(self.comm, self.device)
            self.last_send = time.monotonic()
            return True

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        segments: list[Segment],
        logits_for: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ReferenceModel.forward's contract over paged segments (the engine's prefill)."""
        step = StepInputs.from_tables(
            token_ids,
            positions,
            [(s.start, s.end) for s in segments],
            [_segment_tables(s) for s in segments],
            logits_for,
        )
        return self.run_step(step)

    def shutdown(self) -> None:
        """Rank 0: release the other ranks from serve(), once per serve() round. The ranks may be
        put back into serve() for another round (the bench does, once per KV pool)."""
        if self.rank == 0:
            with self._lock:
                send_step(self.comm, None, self.device)
                self.last_send = time.monotonic()

    def close(self) -> None:
        """Rank 0: the final shutdown (idempotent); later steps and pings are refused."""
        if self.rank != 0:
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            send_step(self.comm, None, self.device)

    # ---- ranks 1.. -----------------------------------------------------------------------------

    def serve(self) -> int:
        """Ranks other than 0: run rank 0's steps until it shuts down; returns the step count."""
        if self.rank == 0:
            raise RuntimeError("rank 0 drives steps; serve() is for the other ranks")
        while (step := recv_step(self.comm, self.device)) is not None:
            self.shard.run(step)
            self.steps += 1
        return self.steps


class ParallelDecodeBackend:
    """The engine's decode backend over a ParallelModel (rank 0 only)."""

    name = "parallel"

    def __init__(self, model: ParallelModel, max_batch: int = 8):
        self.model = model
        self.max_batch = max_batch

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        if batch.kv_pool is not self.model.shard.kv_pool:
            raise ValueError("the batch's KV pool is not the one attached to the parallel model")
        return self.model.run_step(StepInputs.decode(batch.token_ids, batch.positions, batch.block_tables))


def build_parallel_model(
    cfg: ModelConfig, weights: ModelWeights, plan: ShardPlan, comm: Comm
) -> ParallelModel:
    """Shard `weights` for this rank (the full weights may be freed afterwards)."""
    return ParallelModel(ShardedModel(cfg, shard_weights(cfg, weights, plan), plan, comm))


def build_kv_pool(model: ParallelModel, num_pages: int, *, enable_prefix_cache: bool = True) -> KVPool:
    """Collective: every rank allocates the same page count (the smallest any rank asked for) of its
    own kv heads, and attaches it to its shard. Rank 0 hands the returned pool to its engine."""
    cfg, shard = model.cfg, model.shard
    n = model.comm.min_int(num_pages, model.device)
    pool = KVPool(
        n,
        cfg.num_hidden_layers,
        shard.kv_heads,
        cfg.head_dim,
        device=model.device,
        dtype=model.dtype,
        enable_prefix_cache=enable_prefix_cache,
    )
    shard.attach_pool(pool.tensor)
    return pool
