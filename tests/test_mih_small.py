"""Multi-index hashing's exact-substring path (issue 17, ``R < m``, one-word codes) piece by
piece against plain-numpy twins: the layout it derives from the tables (bucket starts of a
direct table, items in bucket order with ids ascending), the ordering of a query's results
(:func:`_order_runs`), and the whole search against brute force with direct and hashed
tables, statistics clocked per group of queries, many results per query, a full output
buffer with statistics on, the result cap and a snapshot round trip."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.base import ResultLimitError
from bucketsearch.index.mih import (CLOCK_GROUP, SMALL_SORT, MultiIndex, _order_runs,
                                    _table_items, substring_ranges)
from bucketsearch.index.table import BucketTable
from tests import naive
from tests.test_small_radii import _data, _same, _substring_counts

# ----------------------------------------------------------------------------- twins


def starts_twin(codes, offsets, bits):
    """``starts[c]``: the first table position of a code >= c (so ``c``'s items are
    ``starts[c]:starts[c + 1]``)."""
    values = np.arange((1 << bits) + 1, dtype=np.uint64)
    return offsets[np.searchsorted(codes[:, 0], values, side="left")]


def table_items_twin(offsets, positions, words, ids):
    """``(code, id)`` per table position, each bucket's items ordered by id."""
    bucket = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    order = positions[np.lexsort((ids[positions], bucket))]
    return np.stack([words[order, 0], ids[order].view(np.uint64)], axis=1)


# ----------------------------------------------------------------------------- layout


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 12), values=st.lists(st.integers(0, 4095), max_size=40))
def test_bucket_starts_match_a_search_of_the_codes(bits, values):
    xb = (np.array(values, dtype=np.uint64) & np.uint64((1 << bits) - 1)).reshape(-1, 1)
    table = BucketTable.build(bits, xb, np.arange(len(xb), dtype=np.int64))
    assert table.direct
    starts = table.bucket_starts()
    assert starts.dtype == np.int32 and len(starts) == (1 << bits) + 1
    assert (starts == starts_twin(table.codes, table.offsets, bits)).all()
    for c in range(1 << bits):  # every code's items, and none of the others
        assert (np.sort(table.ids[starts[c]:starts[c + 1]])
                == np.flatnonzero(xb[:, 0] == c)).all()


def test_bucket_starts_of_a_hashed_table_is_refused():
    table = BucketTable.build(40, np.array([[1], [2 ** 39]], dtype=np.uint64),
                              np.arange(2, dtype=np.int64))
    assert not table.direct
    with pytest.raises(ValueError, match="direct"):
        table.bucket_starts()


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([6, 20, 40]), m=st.integers(1, 4), n=st.integers(0, 80),
       data=st.data())
def test_table_items_are_the_buckets_with_ids_ascending(bits, m, n, data):
    """Big buckets too (more than SMALL_SORT items: np.argsort), negative ids."""
    xb, _, ids = _data(data.draw, bits, n, 1)
    ids = ids - n
    index = MultiIndex(bits, substrings=m)
    index.add(xb, ids)
    items = index._exact_args[-1]
    assert items.shape == (m * n, 2) and items.dtype == np.uint64
    for j, table in enumerate(index.tables):
        twin = table_items_twin(table.offsets, table.ids, index.words, index.ids)
        assert (items[j * n:(j + 1) * n] == twin).all()
    out = np.zeros((n, 2), dtype=np.uint64)
    if n:  # the kernel itself, on table 0
        _table_items(index.tables[0].offsets, index.tables[0].ids, index.words, index.ids, out)
        assert (out == items[:n]).all()


def test_memory_counts_the_exact_layout():
    rng = np.random.default_rng(0)
    index = MultiIndex(24, substrings=2)
    index.add(rng.integers(0, 1 << 24, (1000, 1), dtype=np.uint64))
    items = index._exact_args[-1]
    starts = index._exact_args[3]
    assert items.nbytes == 2 * 1000 * 16 and len(starts) == 2 * (4096 + 1)
    tables = sum(a.nbytes for a in index.flat.values())
    assert index.memory_bytes() >= index.words.nbytes + index.ids.nbytes + tables + \
        items.nbytes + starts.nbytes


# ----------------------------------------------------------------------------- ordering


@settings(max_examples=80, deadline=None)
@given(data=st.data(), n_runs=st.integers(1, 4), max_d=st.integers(0, 5))
def test_order_runs_matches_lexsort(data, n_runs, max_d):
    """Runs of ascending ids (distinct over the query), any distances: (distance, id) order,
    the entries before ``lo`` untouched."""
    ids = data.draw(st.lists(st.integers(-10**6, 10**6), unique=True, max_size=70))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), min_size=n_runs - 1,
                                     max_size=n_runs - 1)))
    bounds = [0, *cuts, len(ids)]
    runs_ids = [sorted(ids[a:b]) for a, b in zip(bounds, bounds[1:])]
    lo = data.draw(st.integers(0, 3))
    n = len(ids)
    out_i = np.full(lo + 2 * n + 1, -7, dtype=np.int64)
    out_d = np.full(lo + 2 * n + 1, -7, dtype=np.int32)
    out_i[lo:lo + n] = np.concatenate([np.array(r, dtype=np.int64) for r in runs_ids])
    out_d[lo:lo + n] = data.draw(st.lists(st.integers(0, max_d), min_size=n, max_size=n))
    expected = naive_order(out_d[lo:lo + n], out_i[lo:lo + n])
    runs = np.array([lo + b for b in bounds], dtype=np.int64)
    _order_runs(out_d, out_i, lo, lo + n, runs, np.zeros(max_d + 2, dtype=np.int64))
    assert (out_d[lo:lo + n] == expected[0]).all() and (out_i[lo:lo + n] == expected[1]).all()
    assert (out_d[:lo] == -7).all() and (out_i[:lo] == -7).all()


def naive_order(d, i):
    order = np.lexsort((i, d))
    return d[order], i[order]


# ----------------------------------------------------------------------------- search


def _check_stats(st_, xq, xb, bits, m, R, lims, D):
    """Counts exact (twins); times: one mean per clock group, spread over the steps."""
    nq = len(xq)
    assert (st_.probes == 1).all()
    cands, unique = _substring_counts(xq, xb, bits, m, R)
    assert (st_.candidates == cands).all() and (st_.unique_candidates == unique).all()
    assert (st_.nonempty_buckets == (cands > 0)).all()
    assert (st_.empty_buckets == 1 - st_.nonempty_buckets).all()
    items = np.array([[(D[lims[q]:lims[q + 1]] == r).sum() for r in range(R + 1)]
                      for q in range(nq)])
    assert (st_.items == items).all()
    assert (st_.radii == R + 1).all() and (st_.scanned_from == -1).all()
    assert (st_.total_ns >= 0).all() and (st_.lookup_ns >= 0).all()
    assert (st_.lookup_ns.sum(axis=1) <= st_.total_ns).all()
    assert (st_.total_ns - st_.lookup_ns.sum(axis=1) < R + 1).all()
    assert (st_.lookup_ns == st_.lookup_ns[:, :1]).all()


@settings(max_examples=30, deadline=None)
@given(bits=st.sampled_from([16, 30, 40, 64]), m=st.integers(1, 5), n=st.integers(0, 80),
       nq=st.integers(1, 2 * CLOCK_GROUP + 3), data=st.data())
def test_exact_path_with_direct_and_hashed_tables_matches_brute_force(bits, m, n, nq, data):
    """16-bit substrings and below are direct, longer sparse ones hashed: both lookups, in one
    search when the widths straddle the threshold; more queries than a clock group."""
    m = min(m, bits)
    R = data.draw(st.integers(0, m - 1))
    xb, xq, ids = _data(data.draw, bits, n, nq)
    index = MultiIndex(bits, substrings=m)
    index.add(xb, ids)
    index.threads = 1
    expected = naive.range_search(xq, xb, ids, bits, R)
    _same(index.range_search(xq, R), expected)
    lims, D, I, st_ = index.range_search(xq, R, stats=True)
    _same((lims, D, I), expected)
    _check_stats(st_, xq, xb, bits, m, R, lims, D)


@pytest.mark.parametrize("bits, m, direct", [(40, 3, [True] * 3), (40, 2, [False] * 2),
                                             (33, 2, [False, True])])
def test_direct_hashed_and_mixed_tables(bits, m, direct):
    """Substrings of 14/13 bits are direct, sparse ones of 20 hashed, 17 + 16 one of each."""
    rng = np.random.default_rng(5)
    xb = rng.integers(0, 1 << bits, (300, 1), dtype=np.uint64)
    xb[150:] = xb[:150] ^ (np.uint64(1) << rng.integers(0, bits, (150, 1)).astype(np.uint64))
    xq = np.concatenate([xb[:50] ^ np.uint64(1 << 25), xb[50:60], xb[200:210]])
    index = MultiIndex(bits, substrings=m)
    index.add(xb)
    assert [t.direct for t in index.tables] == direct
    for R in range(m):
        _same(index.range_search(xq, R), naive.range_search(xq, xb, np.arange(300), bits, R))


@pytest.mark.parametrize("R", [1, 2])
def test_many_results_per_query_with_statistics_and_buffer_growth(R):
    """More than SMALL_SORT results per query in several runs (merged), more than the output
    buffer (4096) in one batch: searched again after growth, statistics counted once."""
    bits, m = 24, 3
    rng = np.random.default_rng(R)
    base = np.uint64(0xABCDEF)
    flips = rng.integers(0, bits, (6000, 3))
    xb = np.full((6000, 1), base, dtype=np.uint64)
    for c in range(R):  # items at distances 0..R, differing on any substring
        xb[c::R + 1, 0] ^= (np.uint64(1) << flips[c::R + 1, c].astype(np.uint64))
    ids = rng.permutation(10**6)[:6000].astype(np.int64)
    xq = np.array([[base], [base ^ np.uint64(1)], [base ^ np.uint64(1 << 23)], [0]],
                  dtype=np.uint64)
    index = MultiIndex(bits, substrings=m)
    index.add(xb, ids)
    index.threads = 1
    expected = naive.range_search(xq, xb, ids, bits, R)
    assert np.diff(expected[0]).max() > 4096 and np.diff(expected[0])[1] > SMALL_SORT
    _same(index.range_search(xq, R), expected)
    lims, D, I, st_ = index.range_search(xq, R, stats=True)
    _same((lims, D, I), expected)
    _check_stats(st_, xq, xb, bits, m, R, lims, D)


def test_result_cap_with_statistics():
    bits = 20
    xb = np.full((300, 1), 777, dtype=np.uint64)
    xb[::3] ^= np.uint64(1 << 19)
    index = MultiIndex(bits, substrings=3)
    index.add(xb)
    index.threads = 1
    xq = np.array([[777], [5], [777 ^ (1 << 19)]], dtype=np.uint64)
    total = int(naive.range_search(xq, xb, np.arange(300), bits, 1)[0][-1])
    _same(index.range_search(xq, 1, stats=True, max_results=total)[:3],
          naive.range_search(xq, xb, np.arange(300), bits, 1))
    with pytest.raises(ResultLimitError) as err:
        index.range_search(xq, 1, stats=True, max_results=total - 1)
    assert err.value.reached > total - 1


@pytest.mark.parametrize("mmap", [False, True])
def test_the_layout_is_derived_again_after_load(tmp_path, mmap):
    rng = np.random.default_rng(9)
    bits = 48
    xb = rng.integers(0, 1 << bits, (500, 1), dtype=np.uint64)
    xb[250:] = xb[:250] ^ (np.uint64(1) << rng.integers(0, bits, (250, 1)).astype(np.uint64))
    index = MultiIndex(bits, substrings=3)
    index.add(xb, rng.permutation(5000)[:500])
    index.save(tmp_path / "mih")
    loaded = MultiIndex.load(tmp_path / "mih", mmap=mmap)
    xq = xb[::7]
    for R in range(3):
        _same(loaded.range_search(xq, R), index.range_search(xq, R))
    for a, b in zip(loaded._exact_args, index._exact_args):
        assert np.array_equal(a, b)


def test_exact_plan_is_the_pigeonhole_bound():
    """Each radius R < m is answered by R + 1 lookups at substring radius 0."""
    index = MultiIndex(64, substrings=3)
    index.add(np.arange(10, dtype=np.uint64).reshape(-1, 1))
    _, widths = substring_ranges(64, 3)
    for R in range(3):
        st_ = index.range_search(np.zeros((1, 1), dtype=np.uint64), R, stats=True)[3]
        assert st_.probes.sum() == R + 1 == sum(math.comb(int(widths[j]), 0)
                                                for j in range(R + 1))
