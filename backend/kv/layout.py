"""The physical layout of the paged KV pool: one source of truth for the engine, the torch decode
path, the CPU emulator and the CUDA kernels.

The pool is one tensor `[num_pages, 2, Hkv, PAGE_SIZE, head_dim]` (index 0 = K, 1 = V). A page holds
PAGE_SIZE consecutive positions of one layer of one sequence, so each (page, kv-head) is one
contiguous PAGE_SIZE x head_dim tile (16 KB in bf16 at head_dim 128): attention reads whole tiles.

Block tables are int32 `[num_layers, batch, max_pages]`: entry [l, b, p] is the physical page holding
positions [p*PAGE_SIZE, (p+1)*PAGE_SIZE) of sequence b on layer l, or NO_PAGE where a sliding-window
layer has released it (or it was never needed). Per-layer tables let sliding layers free pages
wholly outside their window while full layers keep theirs.
"""

from __future__ import annotations

import torch

PAGE_SIZE = 64
NO_PAGE = -1


def pool_shape(num_pages: int, num_kv_heads: int, head_dim: int) -> tuple[int, int, int, int, int]:
    return (num_pages, 2, num_kv_heads, PAGE_SIZE, head_dim)


def page_bytes(num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    return 2 * num_kv_heads * PAGE_SIZE * head_dim * torch.empty((), dtype=dtype).element_size()


def pages_for(num_tokens: int) -> int:
    return (num_tokens + PAGE_SIZE - 1) // PAGE_SIZE


def first_visible_position(position: int, window: int | None) -> int:
    """The oldest key position a query at `position` sees (window counts the current token)."""
    return 0 if window is None else max(0, position - window + 1)


def write_tokens(
    pool: torch.Tensor,
    block_table_row: torch.Tensor,
    positions: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Write k, v [T, Hkv, d] of one sequence and layer at `positions` [T] through its block-table
    row [max_pages] (int32)."""
    pages = block_table_row.to(torch.long)[positions // PAGE_SIZE]
    if bool((pages < 0).any()):
        raise RuntimeError("KV write to a position whose page is not allocated")
    slots = positions % PAGE_SIZE
    pool[pages, 0, :, slots] = k.to(pool.dtype)
    pool[pages, 1, :, slots] = v.to(pool.dtype)


def gather_tokens(
    pool: torch.Tensor, block_table_row: torch.Tensor, start: int, end: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read K, V [end-start, Hkv, d] of positions [start, end) of one sequence and layer."""
    positions = torch.arange(start, end, device=pool.device)
    pages = block_table_row.to(torch.long)[positions // PAGE_SIZE]
    if bool((pages < 0).any()):
        raise RuntimeError(f"KV read of positions [{start}, {end}) touches a released page")
    slots = positions % PAGE_SIZE
    k = pool[pages, 0, :, slots]
    v = pool[pages, 1, :, slots]
    return k, v


def append_and_gather(
    pool: torch.Tensor,
    block_table_row: torch.Tensor,
    window: int | None,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference model's `KVStore.append` over one layer's block-table row: write k, v
    [T, Hkv, d] at `positions` (consecutive), then return every key, value and key position the
    first of those queries can see (the window counts the current token), in k's dtype. Every
    paged KV view (engine sequences, decode batches, test cases) goes through this one function."""
    write_tokens(pool, block_table_row, positions, k, v)
    first, last = int(positions[0]), int(positions[-1])
    start = first_visible_position(first, window)
    K, V = gather_tokens(pool, block_table_row, start, last + 1)
    return K.to(k.dtype), V.to(v.dtype), torch.arange(start, last + 1, device=k.device)
