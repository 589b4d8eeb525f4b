"""Shared pieces of the speculative-decoding tests: a one-character detokeniser (so stop strings
work on the tiny model), an engine builder that records every step, prompt families."""

from __future__ import annotations

import random

import torch

from mkcode.backend.engine.engine import Engine, EngineOptions
from mkcode.backend.engine.torch_backend import TorchDecodeBackend
from mkcode.backend.kv.layout import pages_for
from mkcode.backend.kv.pool import KVPool
from mkcode.backend.model.reference import ReferenceModel


class CharDetok:
    """Token t -> one character (a-z, space every 7th id): text for stop strings."""

    def push(self, token_id: int) -> str:
        return " " if token_id % 7 == 0 else chr(ord("a") + token_id % 26)

    def flush(self) -> str:
        return ""


class RecordingBackend(TorchDecodeBackend):
    """The torch backend, recording each call's rows per sequence (None: one row each)."""

    def __init__(self, model: ReferenceModel, max_batch: int = 256):
        super().__init__(model)
        self.max_batch = max_batch
        self.calls: list[tuple[int, ...]] = []

    def decode(self, batch):
        assert batch.size <= self.max_batch
        self.calls.append(batch.seq_rows or (1,) * batch.size)
        return super().decode(batch)


def spec_engine(
    model: ReferenceModel,
    speculative: str,
    *,
    num_pages: int = 800,
    max_batch: int = 256,
    eos: tuple[int, ...] = (),
    drafter_factory=None,
    **opts,
) -> Engine:
    cfg = model.cfg
    pool = KVPool(
        num_pages,
        cfg.num_hidden_layers,
        cfg.num_key_value_heads,
        cfg.head_dim,
        dtype=torch.float32,
        enable_prefix_cache=opts.pop("enable_prefix_cache", True),
    )
    return Engine(
        model,
        pool,
        RecordingBackend(model, max_batch),
        options=EngineOptions(speculative=speculative, **opts),
        eos_token_ids=eos or cfg.eos_token_ids,
        detokenizer_factory=CharDetok,
        drafter_factory=drafter_factory,
    )


def run_checked(engine: Engine) -> None:
    """Run to idle, checking the page accounting after every step and that no running sequence
    maps a block past its computed positions, as after a plain step (rejected drafts leave no page
    behind)."""
    while engine.has_work():
        engine.step()
        engine.check_accounting()
        for s in engine._running:
            if s.decode_ready:
                assert s.kv.num_blocks == pages_for(s.num_computed), (s.kv.num_blocks, s.num_computed)
    engine.check_accounting()


def random_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 512) for _ in range(n)]


def repetitive_prompt(rng: random.Random, n: int) -> list[int]:
    """A short random motif repeated (a loop the drafter matches at once)."""
    motif = random_prompt(rng, rng.randrange(2, 12))
    return [motif[i % len(motif)] for i in range(n)]


def edit_prompt(rng: random.Random, n: int) -> list[int]:
    """A 'file', some other tokens, then the file's start again (a rewrite in progress)."""
    body = random_prompt(rng, max(4, n // 2))
    mid = random_prompt(rng, rng.randrange(1, 8))
    return (body + mid + body[: rng.randrange(3, len(body) + 1)])[:n]
