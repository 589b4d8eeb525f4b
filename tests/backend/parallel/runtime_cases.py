"""What each rank runs in the parallel-runtime test (importable by torch.multiprocessing's spawn):
`build_parallel_runtime` on a checkpoint directory; rank 0 generates greedily through the engine's
own thread (as the server does), with the keep-alive pinging in between, and saves the tokens."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from mkcode.backend.engine.request import GenerationRequest
from mkcode.backend.runtime import RuntimeOptions, build_parallel_runtime
from mkcode.backend.sampling import SamplingParams

PROMPTS = ([5, 17, 300, 41], list(range(3, 80)), [9] * 30)  # the second crosses a page and the window
NEW_TOKENS = 8
KV_GB = 0.02


def options(model: str | Path) -> RuntimeOptions:
    return RuntimeOptions(model=Path(model), device="cpu", progress=False, kv_memory_gb=KV_GB)


def generate(engine) -> list[list[int]]:
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    streams = [engine.submit(GenerationRequest(list(p), greedy)) for p in PROMPTS]
    return [s.result(timeout=60).token_ids for s in streams]


def run_rank(rank: int, world: int, port: int, model: str, tp: int, ep: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    rt = build_parallel_runtime(options(model), tp, ep, keepalive_s=0.2)
    if rank != 0:
        assert rt is None
        return
    assert rt is not None
    try:
        rt.engine.start()
        time.sleep(0.5)  # idle: the keep-alive pings the other rank
        tokens = generate(rt.engine)
        time.sleep(0.3)
        tokens += generate(rt.engine)  # prefix-cache hits on the second round
        result = {"tokens": tokens, "steps": rt.model.steps, "note": rt.decode_note}
    finally:
        rt.close()
    torch.save(result, Path(out) / "parallel.pt")
