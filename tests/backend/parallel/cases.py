"""What each rank runs in the multi-process tests (importable by torch.multiprocessing's spawn).

Rank 0 drives: (1) a direct run of the parallel model, a two-segment prefill chunk with logits for
every row, a second chunk, then greedy decode steps through the decode backend; (2) the unchanged
engine over the parallel model. It saves what it saw; the test compares that with the
single-process reference. The other ranks serve.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch
import torch.distributed as dist

from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.engine.engine import Engine
from mkcode.backend.engine.request import GenerationRequest
from mkcode.backend.kv.layout import NO_PAGE
from mkcode.backend.kv.sequence import SequenceKV
from mkcode.backend.model.reference import Segment
from mkcode.backend.model.weights import random_weights
from mkcode.backend.parallel.comm import Comm
from mkcode.backend.parallel.driver import (
    ParallelDecodeBackend,
    ParallelModel,
    build_kv_pool,
    build_parallel_model,
)
from mkcode.backend.parallel.launch import init_distributed
from mkcode.backend.parallel.plan import ShardPlan
from mkcode.backend.sampling import SamplingParams
from tests.backend.engine.helpers import tiny_config

SEED, STD = 0, 0.08
PROMPT_A_LEN, PROMPT_B_LEN, FIRST_CHUNK = 70, 9, 50  # A crosses a page and the 64-token window
DECODE_STEPS = 6
ENGINE_PROMPTS = (5, 66, 30)
ENGINE_NEW = 8
NUM_PAGES = 300


def prompts() -> tuple[list[int], list[int]]:
    rng = random.Random(7)
    return (
        [rng.randrange(3, 512) for _ in range(PROMPT_A_LEN)],
        [rng.randrange(3, 512) for _ in range(PROMPT_B_LEN)],
    )


def engine_prompts() -> list[list[int]]:
    rng = random.Random(8)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in ENGINE_PROMPTS]


def _direct(model: ParallelModel, pool) -> dict:
    cfg = model.cfg
    a, b = prompts()
    seqs = [SequenceKV(cfg), SequenceKV(cfg)]
    seqs[0].ensure_capacity(pool, FIRST_CHUNK)
    seqs[1].ensure_capacity(pool, len(b))
    ids = torch.tensor(a[:FIRST_CHUNK] + b)
    pos = torch.tensor(list(range(FIRST_CHUNK)) + list(range(len(b))))
    segs = [
        Segment(0, FIRST_CHUNK, seqs[0].view(pool)),
        Segment(FIRST_CHUNK, FIRST_CHUNK + len(b), seqs[1].view(pool)),
    ]
    chunk1 = model.forward(ids, pos, segs, logits_for=torch.arange(len(ids)))
    seqs[0].ensure_capacity(pool, len(a))
    chunk2 = model.forward(
        torch.tensor(a[FIRST_CHUNK:]),
        torch.arange(FIRST_CHUNK, len(a)),
        [Segment(0, len(a) - FIRST_CHUNK, seqs[0].view(pool))],
    )
    backend = ParallelDecodeBackend(model)
    tokens = [[int(chunk2[0].argmax())], [int(chunk1[-1].argmax())]]
    lengths = [len(a), len(b)]
    decode_logits = []
    for _ in range(DECODE_STEPS):
        for s, n in zip(seqs, lengths):
            s.ensure_capacity(pool, n + 1)
        width = max(len(s.tables[0]) for s in seqs)
        bt = torch.full((cfg.num_hidden_layers, 2, width), NO_PAGE, dtype=torch.int32)
        for j, s in enumerate(seqs):
            for layer, row in enumerate(s.tables):
                bt[layer, j, : len(row)] = torch.tensor(row, dtype=torch.int32)
        batch = DecodeBatch(
            token_ids=torch.tensor([t[-1] for t in tokens]),
            positions=torch.tensor(lengths),
            block_tables=bt,
            kv_pool=pool.tensor,
        )
        logits = backend.decode(batch)
        decode_logits.append(logits)
        for j in range(2):
            tokens[j].append(int(logits[j].argmax()))
            lengths[j] += 1
    for s in seqs:
        s.free_all(pool)
    return {"chunk1": chunk1, "chunk2": chunk2, "decode": torch.stack(decode_logits), "tokens": tokens}


def _engine(model: ParallelModel, pool) -> list[list[int]]:
    engine = Engine(model, pool, ParallelDecodeBackend(model), prefill_fn=model.forward)
    greedy = SamplingParams(max_tokens=ENGINE_NEW, temperature=0.0, ignore_eos=True)
    streams = [engine.submit(GenerationRequest(p, greedy)) for p in engine_prompts()]
    engine.run_until_idle()
    engine.check_accounting()
    return [s.result(timeout=0).token_ids for s in streams]


def run_rank(rank: int, world: int, port: int, out_dir: str, runs: list[tuple[int, int, int]]) -> None:
    """One process of a `world`-process spawn; `runs` are (group size, tp, ep): each run uses the
    first `group size` ranks (the others skip it), so one spawn covers several world sizes."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    init_distributed("gloo", timeout_s=60)
    groups = {n: dist.new_group(list(range(n))) for n in sorted({n for n, _, _ in runs})}
    cfg = tiny_config()
    weights = random_weights(cfg, seed=SEED, std=STD)
    for size, tp, ep in runs:
        if rank >= size:
            continue
        comm = Comm(groups[size])
        model = build_parallel_model(cfg, weights, ShardPlan(size, rank, tp=tp, ep=ep), comm)
        pool = build_kv_pool(model, NUM_PAGES)
        if rank == 0:
            try:
                result = _direct(model, pool)
                result["engine"] = _engine(model, pool)
                result["collectives"] = comm.collectives
            finally:
                model.shutdown()
            torch.save(result, Path(out_dir) / f"w{size}_tp{tp}_ep{ep}.pt")
        else:
            model.serve()
    dist.destroy_process_group()
