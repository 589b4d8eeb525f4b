"""`mkcode bench prefill`: GPU prefill throughput (tok/s) for single prompts of 1K-32K tokens at
the full geometry, writing KV into an engine-style paged pool."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import torch

from mkcode.backend.bench.decode import write_report
from mkcode.backend.bench.synthetic import bench_model
from mkcode.backend.bench.timing import median, time_cuda
from mkcode.backend.kv.pool import KVPool
from mkcode.backend.kv.sequence import SequenceKV
from mkcode.backend.model.config import ModelConfig, north_mini_code_config
from mkcode.backend.model.reference import Segment


@dataclass
class PrefillBenchOptions:
    lengths: list[int]
    chunk_tokens: int = 8192
    repeats: int = 3
    routing: str = "uniform"
    out: Path | None = None
    config: ModelConfig | None = None
    model: object | None = None  # reuse a model already on the GPU


def run_prefill_bench(opts: PrefillBenchOptions, log=print) -> dict:
    from mkcode.backend.gpu.prefill import GpuPrefill

    cfg = opts.config or north_mini_code_config()
    model = opts.model or bench_model(cfg, device="cuda", routing=opts.routing)
    cfg = model.cfg
    prefill = GpuPrefill(model, chunk_tokens=opts.chunk_tokens)
    longest = max(opts.lengths)
    pool = KVPool(
        cfg.num_hidden_layers * (longest // 64 + 2),
        cfg.num_hidden_layers,
        cfg.num_key_value_heads,
        cfg.head_dim,
        device="cuda",
        dtype=torch.bfloat16,
        enable_prefix_cache=False,
    )
    results = []
    for n in opts.lengths:
        seq = SequenceKV(cfg)
        seq.ensure_capacity(pool, n)
        ids = torch.randint(0, cfg.vocab_size, (n,), device="cuda")
        pos = torch.arange(n, device="cuda")
        segs = [Segment(0, n, seq.view(pool))]
        times = time_cuda(lambda: prefill(ids, pos, segs), opts.repeats, 1)  # noqa: B023
        ms = median(times)
        results.append(
            {"tokens": n, "ms": ms, "tok_per_s": n / (ms / 1e3), "chunk_tokens": opts.chunk_tokens}
        )
        log(f"prefill {n:>6} tokens: {ms:9.1f} ms  {n / (ms / 1e3):9.0f} tok/s")
        seq.free_all(pool)
    report = {
        "kind": "prefill",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "results": results,
    }
    if opts.out:
        write_report(report, opts.out, "prefill")
    return report
