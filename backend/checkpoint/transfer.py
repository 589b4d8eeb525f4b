"""Copying stored tensors into preallocated target tensors, in bounded chunks.

Reading goes through safetensors' memory map one chunk (at most `CHUNK_BYTES`) at a time, so the
host never holds more than a couple of chunks of the model. For a CUDA target the chunk is staged
in one of two pinned buffers and sent on a side stream, so reading the next chunk from the page
cache overlaps the DMA of the previous one; a dtype change happens on the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mkcode.backend.checkpoint.layout import itemsize

CHUNK_BYTES = 64 << 20
# Stage CUDA copies through pinned buffers (set False to measure plain pageable copies).
STAGED = True


class ChunkCopier:
    """Writes host tensors into `device` tensors (`copy(dst, src)`); call `finish()` before use."""

    def __init__(self, device: torch.device, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.device = device
        self.chunk_bytes = chunk_bytes
        self._cuda = device.type == "cuda" and STAGED
        if self._cuda:
            self._stream = torch.cuda.Stream(device=device)
            self._bufs = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            self._events: list[torch.cuda.Event | None] = [None, None]
            self._next = 0

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst[...] = src (converted to dst's dtype). src is a host tensor of at most chunk_bytes."""
        if not self._cuda or src.nbytes > self.chunk_bytes:
            dst.copy_(src)
            return
        i = self._next
        self._next = 1 - i
        ev = self._events[i]
        if ev is not None:
            ev.synchronize()  # the DMA that last used this buffer is done
        staged = self._bufs[i][: src.nbytes].view(src.dtype).view(src.shape)
        staged.copy_(src)
        with torch.cuda.stream(self._stream):
            if dst.dtype == src.dtype:
                dst.copy_(staged, non_blocking=True)
            else:
                dst.copy_(staged.to(self.device, non_blocking=True))
            ev = torch.cuda.Event()
            ev.record(self._stream)
        self._events[i] = ev

    def finish(self) -> None:
        """Wait for every copy in flight; afterwards the targets are safe to use on any stream."""
        if self._cuda:
            self._stream.synchronize()


def copy_stored_tensor(
    handle: Any,
    name: str,
    dst: torch.Tensor,
    copier: ChunkCopier,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Copy tensor `name` of an open `safe_open` handle into `dst`, chunked along its first dim."""
    sl = handle.get_slice(name)
    shape = [int(d) for d in sl.get_shape()]
    if not shape:
        src = handle.get_tensor(name)
        copier.copy(dst, src)
        if on_bytes:
            on_bytes(src.nbytes)
        return
    row_bytes = itemsize(sl.get_dtype()) * math.prod(shape[1:])
    rows = max(1, copier.chunk_bytes // max(1, row_bytes))
    for a in range(0, shape[0], rows):
        b = min(shape[0], a + rows)
        src = sl[a:b]
        copier.copy(dst[a:b], src)
        if on_bytes:
            on_bytes(src.nbytes)
