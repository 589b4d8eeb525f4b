"""One sequence's block tables over the pool, and its KV view for the reference model.

`SequenceKV.tables[l][p]` is the physical page of block p on layer l (NO_PAGE once a sliding layer
released it). The sequence holds one pool reference per mapped page.
"""

from __future__ import annotations

import numpy as np
import torch

from mkcode.backend.kv.layout import NO_PAGE, PAGE_SIZE, append_and_gather, first_visible_position
from mkcode.backend.kv.pool import KVPool, PrefixEntry
from mkcode.backend.model.config import ModelConfig


class SequenceKV:
    """Block tables of one sequence: an int32 array [L, capacity] (the first `num_blocks` columns
    are live), kept as an array so that a decode step gathers a batch's tables with one numpy copy
    per sequence rather than Python lists per layer."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.num_layers = cfg.num_hidden_layers
        self._array = np.full((self.num_layers, 16), NO_PAGE, dtype=np.int32)
        self.num_blocks = 0  # blocks mapped on every layer (released sliding pages stay NO_PAGE)
        self.registered_blocks = 0  # full blocks already offered to the prefix cache
        self._released_blocks = 0  # sliding-layer blocks [0, n) already released
        windows = {cfg.window(i) for i in range(self.num_layers)} - {None}
        self._window = min(windows) if windows else None
        self._sliding = np.array([cfg.window(i) is not None for i in range(self.num_layers)])

    @property
    def array(self) -> np.ndarray:
        """Live block tables [L, num_blocks] (a view; NO_PAGE where released)."""
        return self._array[:, : self.num_blocks]

    @property
    def tables(self) -> list[list[int]]:
        """Per-layer page lists (a copy, for accounting checks and readers that want lists)."""
        return self.array.tolist()

    def _grow(self, blocks: int) -> None:
        if blocks > self._array.shape[1]:
            cap = max(blocks, 2 * self._array.shape[1])
            grown = np.full((self.num_layers, cap), NO_PAGE, dtype=np.int32)
            grown[:, : self.num_blocks] = self._array[:, : self.num_blocks]
            self._array = grown

    # ---- allocation ---------------------------------------------------------------------------

    def pages_needed(self, num_tokens: int) -> int:
        """New pages required so that positions < num_tokens are mapped on every layer."""
        blocks = (num_tokens + PAGE_SIZE - 1) // PAGE_SIZE
        return max(0, blocks - self.num_blocks) * self.num_layers

    def ensure_capacity(self, pool: KVPool, num_tokens: int) -> None:
        """Map pages for every position < num_tokens (caller checked pages_needed is available)."""
        blocks = (num_tokens + PAGE_SIZE - 1) // PAGE_SIZE
        if blocks <= self.num_blocks:
            return
        self._grow(blocks)
        for b in range(self.num_blocks, blocks):
            for layer in range(self.num_layers):
                self._array[layer, b] = pool.allocate()
            self.num_blocks = b + 1

    def adopt_prefix(self, pool: KVPool, entries: list[PrefixEntry]) -> None:
        """Map cached prefix blocks (must be called on an empty sequence)."""
        assert self.num_blocks == 0
        self._grow(len(entries))
        for b, entry in enumerate(entries):
            for layer, page in enumerate(entry.pages):
                pool.ref(page)
                self._array[layer, b] = page
            self.num_blocks = b + 1
        self.registered_blocks = len(entries)

    def register_full_blocks(self, pool: KVPool, keys: list[bytes], num_computed: int) -> None:
        """Offer blocks whose every position is computed to the prefix cache."""
        full = min(num_computed // PAGE_SIZE, len(keys))
        while self.registered_blocks < full:
            b = self.registered_blocks
            pages = self._array[:, b].tolist()
            if all(p != NO_PAGE for p in pages):
                pool.register_prefix(keys[b], pages)
            self.registered_blocks += 1

    def release_outside_window(self, pool: KVPool, next_position: int) -> None:
        """Sliding layers drop pages wholly before the oldest key the next query can see."""
        if self._window is None:
            return
        upto = min(first_visible_position(next_position, self._window) // PAGE_SIZE, self.num_blocks)
        if upto <= self._released_blocks:
            return
        for b in range(self._released_blocks, upto):
            for layer in np.flatnonzero(self._sliding):
                p = int(self._array[layer, b])
                if p != NO_PAGE:
                    pool.unref(p)
                    self._array[layer, b] = NO_PAGE
        self._released_blocks = upto

    def trim(self, pool: KVPool, num_tokens: int) -> None:
        """Unmap every block past the one holding position num_tokens - 1 (after a verify step: the
        blocks that only rejected drafts' K/V reached, past the sequence's computed tokens). Such
        blocks were never registered with the prefix cache (only fully computed blocks are) nor
        released by the window (only blocks before the oldest visible key are)."""
        keep = (num_tokens + PAGE_SIZE - 1) // PAGE_SIZE
        if keep >= self.num_blocks:
            return
        assert self.registered_blocks <= keep and self._released_blocks <= keep
        tail = self._array[:, keep : self.num_blocks]
        for p in tail[tail != NO_PAGE].tolist():
            pool.unref(p)
        tail[:] = NO_PAGE
        self.num_blocks = keep

    def free_all(self, pool: KVPool) -> None:
        for p in self.array[self.array != NO_PAGE].tolist():
            pool.unref(p)
        self._array[:, : self.num_blocks] = NO_PAGE
        self.num_blocks = 0
        self.registered_blocks = 0
        self._released_blocks = 0

    @property
    def mapped_pages(self) -> int:
        return int((self.array != NO_PAGE).sum())

    # ---- views --------------------------------------------------------------------------------

    def table_tensor(self, layer: int, width: int, device: torch.device | str) -> torch.Tensor:
        row = np.full(width, NO_PAGE, dtype=np.int32)
        row[: self.num_blocks] = self._array[layer, : self.num_blocks]
        return torch.from_numpy(row).to(device)

    def view(self, pool: KVPool) -> PagedKVView:
        return PagedKVView(self, pool)


class PagedKVView:
    """The reference model's `KVStore` over a sequence's pages (writes through, gathers the window)."""

    def __init__(self, seq: SequenceKV, pool: KVPool):
        self.seq = seq
        self.pool = pool
        self._rows: dict[int, torch.Tensor] = {}

    def append(self, layer, k, v, positions):
        row = torch.from_numpy(self.seq.array[layer].copy()).to(self.pool.tensor.device)
        return append_and_gather(self.pool.tensor, row, self.seq.cfg.window(layer), k, v, positions)
