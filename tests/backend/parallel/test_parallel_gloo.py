"""Tensor- and expert-parallel runs on the CPU (gloo, one process per rank) equal the
single-process reference: prefill logits at every position, decode logits and greedy tokens, and
the engine's greedy output, for TP alone, EP alone and both, at world sizes 2 and 4."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from mkcode.backend.model.reference import ReferenceModel
from mkcode.backend.model.weights import random_weights
from tests.backend.engine.helpers import reference_greedy, tiny_config
from tests.backend.parallel import cases

TOL = dict(rtol=1e-4, atol=1e-4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference() -> dict:
    """Everything the ranks compute, from the reference model with contiguous caches."""
    cfg = tiny_config()
    model = ReferenceModel(cfg, random_weights(cfg, seed=cases.SEED, std=cases.STD))
    a, b = cases.prompts()
    ca, cb = model.new_cache(len(a) + 16), model.new_cache(len(b) + 16)
    chunk1 = torch.cat([model.all_logits(ca, a[: cases.FIRST_CHUNK]), model.all_logits(cb, b)])
    chunk2 = model.all_logits(ca, a[cases.FIRST_CHUNK :], start=cases.FIRST_CHUNK)[-1:]
    tokens = [[int(chunk2[0].argmax())], [int(chunk1[-1].argmax())]]
    lengths = [len(a), len(b)]
    decode = []
    for _ in range(cases.DECODE_STEPS):
        step = torch.stack([model.decode(c, t[-1], n) for c, t, n in zip((ca, cb), tokens, lengths)])
        decode.append(step)
        for j in range(2):
            tokens[j].append(int(step[j].argmax()))
            lengths[j] += 1
    engine = [reference_greedy(model, p, cases.ENGINE_NEW) for p in cases.engine_prompts()]
    return {
        "chunk1": chunk1,
        "chunk2": chunk2,
        "decode": torch.stack(decode),
        "tokens": tokens,
        "engine": engine,
    }


def _check(got: dict, ref: dict, label: str) -> None:
    for key in ("chunk1", "chunk2", "decode"):
        torch.testing.assert_close(got[key], ref[key], **TOL, msg=lambda m, k=key: f"{label} {k}: {m}")
    assert got["tokens"] == ref["tokens"], label
    assert got["engine"] == ref["engine"], label
    assert got["collectives"] > 0, label


@pytest.mark.parametrize(
    ("world", "layouts"),
    [
        (2, [(2, 1), (1, 2), (2, 2)]),
        # tp 4 > 2 kv heads: each rank keeps one q head and a duplicate of its kv head
        (4, [(4, 4), (1, 4)]),
    ],
)
def test_parallel_matches_reference(world: int, layouts: list, reference: dict, tmp_path: Path) -> None:
    mp.spawn(cases.run_rank, args=(world, _free_port(), str(tmp_path), layouts), nprocs=world, join=True)
    for tp, ep in layouts:
        got = torch.load(tmp_path / f"tp{tp}_ep{ep}.pt")
        _check(got, reference, f"world {world} tp {tp} ep {ep}")
