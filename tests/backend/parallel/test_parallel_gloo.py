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
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend (CI machines are shared)
    try:
        return _reference()
    finally:
        torch.set_num_threads(threads)


def _reference() -> dict:
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


RUNS = [
    (2, 2, 1),
    (2, 1, 2),
    (2, 2, 2),
    (4, 4, 4),  # tp 4 > 2 kv heads: each rank keeps one q head and a copy of its kv head
    (4, 1, 4),
    (4, 4, 1),
]


@pytest.fixture(scope="module")
def parallel_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One start of 4 gloo processes runs every layout (world-2 layouts on ranks 0-1). Forked where
    possible: a spawned child re-imports torch, which costs seconds per process on a busy machine."""
    out = tmp_path_factory.mktemp("parallel")
    fork_ok = "fork" in mp.get_all_start_methods() and not torch.cuda.is_initialized()
    mp.start_processes(
        cases.run_rank,
        args=(4, _free_port(), str(out), RUNS),
        nprocs=4,
        join=True,
        start_method="fork" if fork_ok else "spawn",
    )
    return out


@pytest.mark.parametrize(("world", "tp", "ep"), RUNS)
def test_parallel_matches_reference(
    world: int, tp: int, ep: int, parallel_results: Path, reference: dict
) -> None:
    got = torch.load(parallel_results / f"w{world}_tp{tp}_ep{ep}.pt")
    _check(got, reference, f"world {world} tp {tp} ep {ep}")
