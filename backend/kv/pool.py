"""Page accounting for the paged KV pool: free list, reference counts, prefix cache.

All bookkeeping is on the host; the pool tensor itself lives in `KVPool.tensor`. A page is owned by
reference counts: each request's block table holds one reference per page it maps, and a prefix
cache entry holds one reference on each of its pages. A page returns to the free list when its
count reaches zero. `check()` verifies the invariants exactly (tests call it for leak checks).

Prefix cache: a *block* is PAGE_SIZE consecutive tokens starting at a multiple of PAGE_SIZE; its key
is a chained hash of every token from position 0 to the block's end, so equal keys mean equal
prefixes. An entry holds the block's page on every layer. Entries are evicted least-recently-used
when free pages run out.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import torch

from mkcode.backend.kv.layout import PAGE_SIZE, page_bytes, pool_shape


class OutOfPages(RuntimeError):
    """No free page even after evicting the whole prefix cache."""


def block_key(parent: bytes, tokens: list[int]) -> bytes:
    """Chained hash of one full block of tokens after its parent's key."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(len(tokens).to_bytes(4, "little"))
    for t in tokens:
        h.update(int(t).to_bytes(4, "little", signed=False))
    return h.digest()


ROOT_KEY = b"mkcode-prefix-root"


@dataclass
class PrefixEntry:
    pages: list[int]  # one physical page per layer


class KVPool:
    def __init__(
        self,
        num_pages: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        enable_prefix_cache: bool = True,
    ):
        if num_pages < num_layers:
            raise ValueError(
                f"a KV pool of {num_pages} pages cannot hold one token on each of {num_layers} layers"
            )
        self.num_pages = num_pages
        self.num_layers = num_layers
        self.tensor = torch.empty(pool_shape(num_pages, num_kv_heads, head_dim), device=device, dtype=dtype)
        self.refcount = [0] * num_pages
        self.free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() gives low ids first
        self.prefix: OrderedDict[bytes, PrefixEntry] = OrderedDict()
        self.enable_prefix_cache = enable_prefix_cache
        self.prefix_queries = 0
        self.prefix_hits = 0  # blocks found
        self.prefix_lookups = 0  # blocks looked for

    @classmethod
    def from_budget(
        cls,
        budget_bytes: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        enable_prefix_cache: bool = True,
    ) -> KVPool:
        n = budget_bytes // page_bytes(num_kv_heads, head_dim, dtype)
        return cls(
            int(n),
            num_layers,
            num_kv_heads,
            head_dim,
            device=device,
            dtype=dtype,
            enable_prefix_cache=enable_prefix_cache,
        )

    # ---- capacity ---------------------------------------------------------------------------

    @property
    def tokens_capacity(self) -> int:
        """Tokens the pool holds when every layer keeps every page (full-attention equivalent)."""
        return self.num_pages // self.num_layers * PAGE_SIZE

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_cached_only(self) -> int:
        """Pages held only by the prefix cache (reclaimable by eviction)."""
        held = {p for e in self.prefix.values() for p in e.pages}
        return sum(1 for p in held if self.refcount[p] == 1)

    def available(self) -> int:
        return self.num_free + self.num_cached_only

    # ---- references -------------------------------------------------------------------------

    def allocate(self) -> int:
        if not self.free:
            self._evict_until(1)
        if not self.free:
            raise OutOfPages("KV pool exhausted")
        p = self.free.pop()
        assert self.refcount[p] == 0
        self.refcount[p] = 1
        return p

    def ref(self, page: int) -> None:
        assert self.refcount[page] > 0, f"ref on free page {page}"
        self.refcount[page] += 1

    def unref(self, page: int) -> None:
        assert self.refcount[page] > 0, f"double free of page {page}"
        self.refcount[page] -= 1
        if self.refcount[page] == 0:
            self.free.append(page)

    def ensure_free(self, n: int) -> bool:
        """Make at least n pages free, evicting prefix-cache entries LRU; False if impossible."""
        if len(self.free) < n:
            self._evict_until(n)
        return len(self.free) >= n

    def _evict_until(self, n: int) -> None:
        for key in list(self.prefix.keys()):
            if len(self.free) >= n:
                return
            entry = self.prefix.pop(key)
            for p in entry.pages:
                self.unref(p)

    # ---- prefix cache -----------------------------------------------------------------------

    def prefix_keys(self, tokens: list[int], known: list[bytes] = ()) -> list[bytes]:
        """Chained keys of every full block of `tokens`, extending `known` (the keys of an earlier,
        shorter view of the same token list) instead of rehashing from the start."""
        keys = list(known)
        parent = keys[-1] if keys else ROOT_KEY
        for b in range(len(keys), len(tokens) // PAGE_SIZE):
            parent = block_key(parent, tokens[b * PAGE_SIZE : (b + 1) * PAGE_SIZE])
            keys.append(parent)
        return keys

    def match_prefix(self, keys: list[bytes], max_blocks: int) -> list[PrefixEntry]:
        """The longest cached run of blocks for `keys` (at most max_blocks), marked recently used."""
        found: list[PrefixEntry] = []
        if self.enable_prefix_cache:
            for key in keys[:max_blocks]:
                entry = self.prefix.get(key)
                if entry is None:
                    break
                self.prefix.move_to_end(key)
                found.append(entry)
        return found

    def record_prefix_lookup(self, looked_for: int, found: int) -> None:
        """Count one admitted request's lookup in the hit-rate statistics."""
        if self.enable_prefix_cache:
            self.prefix_queries += 1
            self.prefix_lookups += looked_for
            self.prefix_hits += found

    def lookup_prefix(self, tokens: list[int], max_blocks: int) -> tuple[list[PrefixEntry], list[bytes]]:
        """Keys, match and statistics in one call: (cached entries, keys of every full block)."""
        keys = self.prefix_keys(tokens)
        found = self.match_prefix(keys, max_blocks)
        self.record_prefix_lookup(min(len(keys), max_blocks), len(found))
        return found, keys

    def register_prefix(self, key: bytes, pages: list[int]) -> None:
        """Offer a just-filled block (its page on every layer) to the prefix cache."""
        if not self.enable_prefix_cache:
            return
        if key in self.prefix:
            self.prefix.move_to_end(key)
            return
        for p in pages:
            self.ref(p)
        self.prefix[key] = PrefixEntry(pages=list(pages))

    def clear_prefix_cache(self) -> None:
        self._evict_until(self.num_pages + 1)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_lookups if self.prefix_lookups else 0.0

    # ---- invariants -------------------------------------------------------------------------

    def check(self, live_tables: list[list[list[int]]] = ()) -> None:
        """Verify refcounts equal the references held by `live_tables` (per request, per layer
        page lists) plus the prefix cache, and that the free list is exactly the unreferenced
        pages. Raises AssertionError describing the first mismatch."""
        expect = [0] * self.num_pages
        for table in live_tables:
            for layer_pages in table:
                for p in layer_pages:
                    if p >= 0:
                        expect[p] += 1
        for e in self.prefix.values():
            for p in e.pages:
                expect[p] += 1
        for p in range(self.num_pages):
            assert self.refcount[p] == expect[p], (
                f"page {p}: refcount {self.refcount[p]} != {expect[p]} references"
            )
        free = sorted(self.free)
        assert len(free) == len(set(free)), "a page is on the free list twice"
        assert free == [p for p in range(self.num_pages) if expect[p] == 0], "free list != unreferenced pages"
