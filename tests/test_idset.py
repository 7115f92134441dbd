"""index/storage/idset.py: the main index's ids as a bitmap (a dense span) or sorted ids,
against a plain Python set."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.storage.idset import (BITMAP_SPAN_PER_ITEM, ROWS_SPAN_PER_ITEM, IdRows, IdSet,
                                              _set_bits)

ids_lists = st.lists(st.integers(-2**62, 2**62), unique=True, max_size=60)


@settings(max_examples=150, deadline=None)
@given(ids=ids_lists, probes=st.lists(st.integers(-2**62, 2**62), max_size=40),
       dense=st.booleans(), base=st.integers(-1000, 2**40))
def test_contains_len_max_match_a_set(ids, probes, dense, base):
    if dense:  # a span within BITMAP_SPAN_PER_ITEM x n: the bitmap layout
        ids = sorted({base + (abs(i) % (3 * max(len(ids), 1))) for i in ids})
    s = IdSet.of(np.array(ids, dtype=np.int64))
    queries = np.array(ids + probes + [i + 1 for i in ids] + [i - 1 for i in ids],
                       dtype=np.int64)
    expect = np.array([q in set(ids) for q in queries.tolist()], dtype=bool)
    assert s.contains(queries).tolist() == expect.tolist()
    assert len(s) == len(ids)
    assert s.max == (max(ids) if ids else -1)


def test_layout_by_span():
    dense = IdSet.of(np.arange(1000, dtype=np.int64)[::-1])
    assert dense.bitmap is not None and dense.nbytes == 125  # 1/8 byte an id
    sparse = IdSet.of(np.arange(1000, dtype=np.int64) * (BITMAP_SPAN_PER_ITEM + 1))
    assert sparse.bitmap is None and sparse.nbytes == 8000
    assert sparse.contains([0, 9, 10, 8991, -9]).tolist() == [True, True, False, True, False]
    empty = IdSet.of(np.empty(0, np.int64))
    assert len(empty) == 0 and empty.max == -1 and empty.contains([0, 5]).tolist() == [False] * 2


@settings(max_examples=150, deadline=None)
@given(ids=ids_lists, probes=st.lists(st.integers(-2**62, 2**62), max_size=40),
       dense=st.booleans(), base=st.integers(-1000, 2**40), seed=st.integers(0, 100))
def test_rows_by_id_match_a_dict(ids, probes, dense, base, seed):
    """IdRows (the rows of a main index's ids, held in code order) against a dict, for both
    layouts: the inverse table of a narrow span, the ids' order otherwise."""
    if dense:
        ids = sorted({base + (abs(i) % (2 * max(len(ids), 1))) for i in ids})
    ids = np.random.default_rng(seed).permutation(np.array(ids, dtype=np.int64))
    rows = IdRows(ids)
    where = {int(i): r for r, i in enumerate(ids.tolist())}
    queries = np.array(ids.tolist() + probes + [i + 1 for i in ids.tolist()]
                       + [i - 1 for i in ids.tolist()], dtype=np.int64)
    assert rows.rows(queries).tolist() == [where.get(q, -1) for q in queries.tolist()]


def test_rows_layout_by_span():
    dense = IdRows(np.arange(1000, dtype=np.int64)[::-1])
    assert dense.inverse is not None and dense.nbytes == 4000  # 4 bytes an id
    sparse = IdRows(np.arange(1000, dtype=np.int64) * (ROWS_SPAN_PER_ITEM + 1))
    assert sparse.order is not None and sparse.nbytes == 4000
    assert sparse.rows([0, 3, 4, 2997]).tolist() == [0, 1, -1, 999]
    assert IdRows(np.empty(0, np.int64)).rows([1]).tolist() == [-1]


@settings(max_examples=150, deadline=None)
@given(offsets=st.lists(st.integers(0, 500), unique=True, max_size=80),
       lo=st.integers(-2**40, 2**40))
def test_set_bits_is_packbits_of_the_mask(offsets, lo):
    """The kernel's bitmap equals the plain-numpy twin: a bool per id of the span packed
    least significant bit first."""
    ids = np.array(offsets, dtype=np.int64) + lo
    span = max(offsets, default=-1) + 1
    mask = np.zeros(span, dtype=bool)
    mask[np.array(offsets, dtype=np.int64)] = True
    bitmap = np.zeros((span + 7) // 8, dtype=np.uint8)
    _set_bits(ids, np.int64(lo), bitmap)
    assert bitmap.tolist() == np.packbits(mask, bitorder="little").tolist()
