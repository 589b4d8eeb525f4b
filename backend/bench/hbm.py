"""HBM bandwidth measured the way docs/PERF.md (Speed of light) asks: a large device-to-device copy, bytes read plus
bytes written, CUDA-event timed, median of several copies."""

from __future__ import annotations

import statistics

import torch


def measure_copy_bandwidth(nbytes: int = 2 << 30, repeats: int = 10, device: str = "cuda") -> float:
    """Bytes/s (read + write) of `dst.copy_(src)` over `nbytes`-sized buffers (default 2 GiB)."""
    n = nbytes // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    return 2 * n * 2 / statistics.median(times)
