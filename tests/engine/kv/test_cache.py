"""Page pool, page tables and the prefix cache, on their own."""

import numpy as np
import pytest

from engine.kv.cache import (
    KVGeometry,
    NoRoomError,
    PagePool,
    PageTable,
    PrefixCache,
    append_rows,
    read_rows,
    truncate_table,
)

MIXED = KVGeometry(((2, 16, "float32"), (2, 16, "float32"), (4, 8, "float16"), (4, 8, "float16")))


def _rows(geometry: KVGeometry, n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((h, n, d)).astype(t) for h, d, t in geometry.shapes]


@pytest.mark.parametrize("geometry", [
    KVGeometry(((2, 16, "float32"),) * 4),
    KVGeometry(((2, 16, "float16"),) * 4),
    MIXED,
])
def test_page_bytes_from_the_formula_match_the_allocation(geometry):
    pool = PagePool(geometry, page_size=8, max_pages=64)
    pages = [page for page in (pool.alloc() for _ in range(5)) if page is not None]
    assert len(pages) == 5
    per_page = sum(h * d * np.dtype(t).itemsize for h, d, t in geometry.shapes) * 8
    assert geometry.page_bytes(8) == per_page
    for page in pages:  # what numpy really allocated for each page
        assert sum(a.nbytes for a in pool._arrays(page)) == per_page
    assert pool.nbytes == 5 * per_page
    pool.release(pages[0])  # a freed page's bytes are returned
    assert pool.nbytes == 4 * per_page


def test_rows_round_trip_through_pages_with_mixed_head_dims():
    pool = PagePool(MIXED, page_size=8, max_pages=16)
    table = PageTable()
    rows = _rows(MIXED, 21)
    append_rows(pool, table, [r[:, :5] for r in rows])
    append_rows(pool, table, [r[:, 5:] for r in rows])
    assert table.length == 21 and len(table.pages) == 3
    for got, want in zip(read_rows(pool, table, 8, 21), rows, strict=True):
        np.testing.assert_array_equal(got, want[:, 8:])


def test_prefix_cache_finds_the_longest_full_page_prefix():
    pool = PagePool(MIXED, page_size=4, max_pages=16)
    cache = PrefixCache(pool)
    tokens = list(range(100, 111))  # 2 full pages + 3 tokens
    table = PageTable()
    append_rows(pool, table, _rows(MIXED, 11))
    for i, h in enumerate(cache.chain(tokens)):
        cache.insert(h, table.pages[i])
    assert len(cache) == 2
    pages, _ = cache.lookup(tokens[:8] + [1, 2, 3], limit=10)
    assert pages == table.pages[:2]
    # a different first block breaks the chain even if later blocks match
    assert cache.lookup([0] + tokens[1:], limit=10)[0] == []
    assert cache.lookup(tokens, limit=7)[0] == table.pages[:1]  # limit keeps a token to run


def test_unreferenced_cached_pages_are_evicted_lru_and_referenced_ones_never():
    pool = PagePool(MIXED, page_size=4, max_pages=3)
    cache = PrefixCache(pool)
    owned = PageTable()
    append_rows(pool, owned, _rows(MIXED, 4))  # a sequence keeps this page
    cache.insert(cache.chain([1, 2, 3, 4])[0], owned.pages[0])
    for n, toks in enumerate(([5, 6, 7, 8], [9, 10, 11, 12])):
        page = pool.alloc()
        assert page is not None
        cache.insert(cache.chain(toks)[0], page)
        pool.release(page)
        cache.released(page)
        assert cache.idle_pages == n + 1
    cache.lookup([5, 6, 7, 8, 0], limit=4)  # touch: now the most recently used
    fresh = PageTable()
    append_rows(pool, fresh, _rows(MIXED, 4), cache)  # pool full: evicts the LRU idle page
    assert cache.lookup([9, 10, 11, 12, 0], limit=4)[0] == []
    assert cache.lookup([5, 6, 7, 8, 0], limit=4)[0] != []
    assert cache.lookup([1, 2, 3, 4, 0], limit=4)[0] == owned.pages
    with pytest.raises(NoRoomError):
        append_rows(pool, PageTable(), _rows(MIXED, 12), cache)


def test_shared_partial_page_is_copied_on_write():
    pool = PagePool(MIXED, page_size=8, max_pages=8)
    a = PageTable()
    rows = _rows(MIXED, 5)
    append_rows(pool, a, rows)
    b = PageTable(list(a.pages), a.length)
    pool.retain(b.pages[0])
    append_rows(pool, b, _rows(MIXED, 2, seed=1))
    assert b.pages[0] != a.pages[0]
    for got, want in zip(read_rows(pool, a, 0, 5), rows, strict=True):
        np.testing.assert_array_equal(got, want)  # a's rows are untouched
    truncate_table(pool, b, 0)
    assert pool.refcount(a.pages[0]) == 1


def test_int8_page_bytes_match_the_quantized_rows():
    from engine.kv.quant import quantize_int8

    rows = _rows(MIXED, 8)
    quantized = [quantize_int8(r) for r in rows]
    assert sum(q.nbytes for q in quantized) == MIXED.int8_page_bytes(8)
    assert MIXED.int8_page_bytes(8) < MIXED.page_bytes(8) / 1.5
