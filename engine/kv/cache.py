"""Paged KV memory: a page pool with refcounts, page tables, and a prefix cache.

A page holds the KV of `page_size` consecutive tokens for every KV pair of the model
(pairs may differ in heads, head dim and dtype). Sequences own pages through page tables;
the prefix cache indexes full pages by a hash chain over their tokens, so a new request
finds the longest cached prefix in one pass. Pages nobody references stay cached until
the pool needs them (LRU).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from engine.model.io_spec import KVPair

_ROOT_HASH = b"kv-root"


@dataclass(frozen=True)
class KVGeometry:
    """Per-pair `(heads, head_dim, dtype)`; all byte accounting derives from it."""

    shapes: tuple[tuple[int, int, str], ...]

    @classmethod
    def from_pairs(cls, pairs: Sequence[KVPair]) -> KVGeometry:
        return cls(tuple((p.num_heads, p.head_dim, p.dtype) for p in pairs))

    @cached_property
    def bytes_per_token(self) -> int:  # (asked several hundred times a request)
        return sum(h * d * np.dtype(t).itemsize for h, d, t in self.shapes)

    def page_bytes(self, page_size: int) -> int:
        return self.bytes_per_token * page_size

    def int8_page_bytes(self, page_size: int) -> int:
        """A page moved off the device as int8: one byte per value plus a float32 scale
        per head (engine.kv_quant)."""
        return sum(h * d * page_size + 4 * h for h, d, _ in self.shapes)


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """Hash of a full block chained to its parent: equal hash => equal token prefix."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return digest.digest()


class PagePool:
    """Fixed-size pages, each its own per-pair arrays `[heads, page_size, head_dim]`.

    A page's memory exists only while something references it: freeing a page returns its
    bytes, so evicting cached pages really lowers what the engine holds.
    """

    def __init__(self, geometry: KVGeometry, page_size: int, max_pages: int) -> None:
        if page_size < 1 or max_pages < 0:
            raise ValueError("page_size must be positive and max_pages >= 0")
        self.geometry = geometry
        self.page_size = page_size
        self.max_pages = max_pages
        self._pages: list[list[np.ndarray] | None] = []
        self._refs: list[int] = []
        self._free: list[int] = []
        self._live = 0
        #: Asked before each new page (the governor's budget); False means no room.
        self.admit: Callable[[int], bool] = lambda nbytes: True

    @property
    def allocated_pages(self) -> int:
        return self._live

    @property
    def nbytes(self) -> int:
        return self._live * self.geometry.page_bytes(self.page_size)

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def alloc(self) -> int | None:
        """A page with refcount 1, or None when the pool is at its cap ("no room")."""
        if self._live >= self.max_pages or not self.admit(self.geometry.page_bytes(
                self.page_size)):
            return None
        arrays = [np.zeros((h, self.page_size, d), dtype=t) for h, d, t in self.geometry.shapes]
        if self._free:
            page = self._free.pop()
            self._pages[page] = arrays
        else:
            page = len(self._pages)
            self._pages.append(arrays)
            self._refs.append(0)
        self._refs[page] = 1
        self._live += 1
        return page

    def retain(self, page: int) -> None:
        self._refs[page] += 1

    def release(self, page: int) -> bool:
        """Drop one reference; True when the page was freed (its memory returned)."""
        self._refs[page] -= 1
        assert self._refs[page] >= 0, f"page {page} released too often"
        if self._refs[page] == 0:
            self._pages[page] = None
            self._free.append(page)
            self._live -= 1
            return True
        return False

    def _arrays(self, page: int) -> list[np.ndarray]:
        arrays = self._pages[page]
        assert arrays is not None, f"page {page} is free"
        return arrays

    def write(self, page: int, rows: Sequence[np.ndarray], offset: int = 0) -> None:
        """Write per-pair rows `[heads, n, head_dim]` at token `offset` of `page`."""
        for array, data in zip(self._arrays(page), rows, strict=True):
            array[:, offset:offset + data.shape[1]] = data

    def read(self, pages: Sequence[int], n_tokens: int) -> list[np.ndarray]:
        """Per-pair `[heads, n_tokens, head_dim]` copies of the first tokens of `pages`."""
        per_page = [self._arrays(p) for p in pages]
        return [np.concatenate([arrays[i] for arrays in per_page], axis=1)[:, :n_tokens]
                for i in range(len(self.geometry.shapes))]


@dataclass
class PageTable:
    """The pages of one sequence, in order, and how many tokens they hold."""

    pages: list[int] = field(default_factory=list)
    length: int = 0


class PrefixCache:
    """Full pages indexed by a hash chain; unreferenced pages are evicted LRU."""

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self._by_hash: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        # Cached pages only the cache references (refcount 1), oldest first.
        self._idle: OrderedDict[int, None] = OrderedDict()
        self.hits = 0
        self.hit_tokens = 0
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._by_hash)

    def lookup(self, tokens: Sequence[int], limit: int) -> tuple[list[int], list[bytes]]:
        """Pages of the longest cached prefix of `tokens` within `limit` tokens."""
        size = self.pool.page_size
        pages: list[int] = []
        hashes: list[bytes] = []
        parent = _ROOT_HASH
        for start in range(0, limit - size + 1, size):
            h = block_hash(parent, tokens[start:start + size])
            page = self._by_hash.get(h)
            if page is None:
                break
            pages.append(page)
            hashes.append(h)
            parent = h
        self.lookups += 1
        if pages:
            self.hits += 1
            self.hit_tokens += len(pages) * size
            for page in pages:
                if page in self._idle:
                    self._idle.move_to_end(page)
        return pages, hashes

    def chain(self, tokens: Sequence[int]) -> list[bytes]:
        """Hashes of every full block of `tokens`."""
        size = self.pool.page_size
        out: list[bytes] = []
        parent = _ROOT_HASH
        for start in range(0, len(tokens) - size + 1, size):
            parent = block_hash(parent, tokens[start:start + size])
            out.append(parent)
        return out

    def contains(self, h: bytes) -> bool:
        return h in self._by_hash

    def insert(self, h: bytes, page: int) -> None:
        """Index a full page (the cache takes its own reference)."""
        if h in self._by_hash:
            return
        self.pool.retain(page)
        self._by_hash[h] = page
        self._hash_of[page] = h
        self._note_idle(page)

    def _note_idle(self, page: int) -> None:
        if self.pool.refcount(page) == 1:
            self._idle[page] = None
            self._idle.move_to_end(page)
        else:
            self._idle.pop(page, None)

    def released(self, page: int) -> None:
        """A sequence let go of `page`; it may now be idle in the cache."""
        if page in self._hash_of:
            self._note_idle(page)

    def acquired(self, page: int) -> None:
        self._idle.pop(page, None)

    def evict(self, pages_needed: int) -> int:
        """Free up to `pages_needed` idle cached pages, least recently used first."""
        freed = 0
        while freed < pages_needed and self._idle:
            page, _ = self._idle.popitem(last=False)
            h = self._hash_of.pop(page)
            del self._by_hash[h]
            self.pool.release(page)
            freed += 1
        return freed

    @property
    def idle_pages(self) -> int:
        return len(self._idle)


class NoRoomError(Exception):
    """The page pool is at its cap and nothing can be evicted."""


def append_rows(pool: PagePool, table: PageTable, rows: Sequence[np.ndarray],
                cache: PrefixCache | None = None) -> None:
    """Append per-pair rows `[heads, n, head_dim]` to a sequence's pages.

    A shared, partly filled last page is copied first (copy on write). Raises NoRoomError
    when no page can be had even after evicting idle cached pages.
    """
    n = rows[0].shape[1] if rows else 0
    size = pool.page_size
    done = 0
    while done < n:
        offset = table.length % size
        if offset == 0:
            page = _alloc(pool, cache)
            table.pages.append(page)
        else:
            page = table.pages[-1]
            if pool.refcount(page) > 1:
                page = _copy_page(pool, page, offset, cache)
                table.pages[-1] = page
        take = min(size - offset, n - done)
        pool.write(page, [r[:, done:done + take] for r in rows], offset)
        table.length += take
        done += take


def _alloc(pool: PagePool, cache: PrefixCache | None) -> int:
    page = pool.alloc()
    if page is None and cache is not None and cache.evict(1):
        page = pool.alloc()
    if page is None:
        raise NoRoomError(f"the KV page pool is full ({pool.max_pages} pages)")
    return page


def _copy_page(pool: PagePool, page: int, rows: int, cache: PrefixCache | None) -> int:
    fresh = _alloc(pool, cache)
    pool.write(fresh, pool.read([page], rows))
    release_page(pool, page, cache)
    return fresh


def release_page(pool: PagePool, page: int, cache: PrefixCache | None) -> None:
    pool.release(page)
    if cache is not None:
        cache.released(page)


def truncate_table(pool: PagePool, table: PageTable, length: int,
                   cache: PrefixCache | None = None) -> None:
    """Keep the first `length` tokens; pages past them go back to the pool."""
    keep = -(-length // pool.page_size)
    for page in table.pages[keep:]:
        release_page(pool, page, cache)
    del table.pages[keep:]
    table.length = min(table.length, length)


def read_rows(pool: PagePool, table: PageTable, start: int, end: int) -> list[np.ndarray]:
    """Rows `[start, end)` of a sequence; `start` must be page-aligned."""
    size = pool.page_size
    assert start % size == 0 and end <= table.length
    first, last = start // size, -(-end // size)
    return pool.read(table.pages[first:last], end - start)


def read_any_rows(pool: PagePool, table: PageTable, start: int, end: int) -> list[np.ndarray]:
    """Rows `[start, end)` of a sequence, from any start."""
    size = pool.page_size
    first = start // size
    rows = read_rows(pool, table, first * size, end)
    return [r[:, start - first * size:] for r in rows]
