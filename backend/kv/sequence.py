"""One sequence's block tables over the pool, and its KV view for the reference model.

`SequenceKV.tables[l][p]` is the physical page of block p on layer l (NO_PAGE once a sliding layer
released it). The sequence holds one pool reference per mapped page.
"""

from __future__ import annotations

import torch

from mkcode.backend.kv.layout import NO_PAGE, PAGE_SIZE, first_visible_position, gather_tokens, write_tokens
from mkcode.backend.kv.pool import KVPool, PrefixEntry
from mkcode.backend.model.config import ModelConfig


class SequenceKV:
    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.tables: list[list[int]] = [[] for _ in range(cfg.num_hidden_layers)]
        self.registered_blocks = 0  # full blocks already offered to the prefix cache

    # ---- allocation ---------------------------------------------------------------------------

    def pages_needed(self, num_tokens: int) -> int:
        """New pages required so that positions < num_tokens are mapped on every layer."""
        blocks = (num_tokens + PAGE_SIZE - 1) // PAGE_SIZE
        return sum(max(0, blocks - len(t)) for t in self.tables)

    def ensure_capacity(self, pool: KVPool, num_tokens: int) -> None:
        """Map pages for every position < num_tokens (caller checked pages_needed is available)."""
        blocks = (num_tokens + PAGE_SIZE - 1) // PAGE_SIZE
        for table in self.tables:
            while len(table) < blocks:
                table.append(pool.allocate())

    def adopt_prefix(self, pool: KVPool, entries: list[PrefixEntry]) -> None:
        """Map cached prefix blocks (must be called on an empty sequence)."""
        assert all(not t for t in self.tables)
        for entry in entries:
            for layer, page in enumerate(entry.pages):
                pool.ref(page)
                self.tables[layer].append(page)
        self.registered_blocks = len(entries)

    def register_full_blocks(self, pool: KVPool, keys: list[bytes], num_computed: int) -> None:
        """Offer blocks whose every position is computed to the prefix cache."""
        full = min(num_computed // PAGE_SIZE, len(keys))
        while self.registered_blocks < full:
            b = self.registered_blocks
            pages = [t[b] for t in self.tables]
            if all(p != NO_PAGE for p in pages):
                pool.register_prefix(keys[b], pages)
            self.registered_blocks += 1

    def release_outside_window(self, pool: KVPool, next_position: int) -> None:
        """Sliding layers drop pages wholly before the oldest key the next query can see."""
        for layer, table in enumerate(self.tables):
            window = self.cfg.window(layer)
            if window is None:
                continue
            oldest = first_visible_position(next_position, window)
            for b in range(min(oldest // PAGE_SIZE, len(table))):
                if table[b] != NO_PAGE:
                    pool.unref(table[b])
                    table[b] = NO_PAGE

    def free_all(self, pool: KVPool) -> None:
        for table in self.tables:
            for p in table:
                if p != NO_PAGE:
                    pool.unref(p)
            table.clear()
        self.registered_blocks = 0

    @property
    def mapped_pages(self) -> int:
        return sum(1 for t in self.tables for p in t if p != NO_PAGE)

    # ---- views --------------------------------------------------------------------------------

    def table_tensor(self, layer: int, width: int, device: torch.device | str) -> torch.Tensor:
        row = self.tables[layer] + [NO_PAGE] * (width - len(self.tables[layer]))
        return torch.tensor(row, dtype=torch.int32, device=device)

    def view(self, pool: KVPool) -> PagedKVView:
        return PagedKVView(self, pool)


class PagedKVView:
    """The reference model's `KVStore` over a sequence's pages (writes through, gathers the window)."""

    def __init__(self, seq: SequenceKV, pool: KVPool):
        self.seq = seq
        self.pool = pool
        self._rows: dict[int, torch.Tensor] = {}

    def append(self, layer, k, v, positions):
        table = self.seq.tables[layer]
        row = torch.tensor(table, dtype=torch.int32, device=self.pool.tensor.device)
        write_tokens(self.pool.tensor, row, positions, k, v)
        first, last = int(positions[0]), int(positions[-1])
        start = first_visible_position(first, self.seq.cfg.window(layer))
        K, V = gather_tokens(self.pool.tensor, row, start, last + 1)
        kpos = torch.arange(start, last + 1, device=k.device)
        return K.to(k.dtype), V.to(v.dtype), kpos
