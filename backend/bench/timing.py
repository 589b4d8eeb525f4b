"""CUDA-event timing: warm-up, then the median over many steps."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def time_cuda(fn: Callable[[], object], steps: int, warmup: int) -> list[float]:
    """Milliseconds of each of `steps` calls of fn (after `warmup` untimed calls), event-timed."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    for a, b in zip(starts, ends, strict=True):
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(starts, ends, strict=True)]


def median(xs: list[float]) -> float:
    return statistics.median(xs)
