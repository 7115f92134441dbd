"""Multi-index hashing's substring tables (positions only, :mod:`index.mih_tables`) and its
exact-substring path (issue 17, ``R < m``, one-word codes) piece by piece against plain-numpy
twins: each table's positions by (substring, position), its bucket end bits and its
lookups, the memory they take, the ordering of a query's results
(:func:`_merge_sub_runs`), and the whole search
against brute force with direct and hashed tables, statistics clocked per group of queries,
many results per query, a full output buffer with statistics on, the result cap and a
snapshot loaded (mapped) without a rebuild."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.base import OUTPUT_BUFFERS, ResultLimitError
from bucketsearch.index.kernels import CANDIDATES, ITEMS, UNIQUE_CANDIDATES
from bucketsearch.index.mih import (CLOCK_GROUP, SMALL_QUERY, MIHProbeLimitError, MultiIndex,
                                    _merge_sub_runs, _mih_exact_kernel, substring_ranges)
from bucketsearch.index.mih_tables import (T_DIRECT, T_ROW_BITS, T_TAG_BITS, T_TAG_START,
                                           TAG_MAX_BITS, bucket_ends, ends_bit_base)
from bucketsearch.index.codes import unpack_words
from tests import naive
from tests.test_small_radii import _data, _same, _substring_counts

# ----------------------------------------------------------------------------- layout


def table_twin(xb, ids, bits, m, j):
    """Table ``j`` of code-sorted ``xb``: positions by (substring, id) (a lexsort of the
    substrings, read bit by bit, and the ids) and the substring values."""
    starts, widths = substring_ranges(bits, m)
    s, w = int(starts[j]), int(widths[j])
    bitrows = unpack_words(xb, bits)[:, s:s + w].astype(np.uint64)
    subs = np.zeros(len(xb), dtype=np.uint64)
    for c in range(w):
        subs = (subs << np.uint64(1)) | bitrows[:, c]
    return np.lexsort((ids, subs)), subs


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([6, 20, 40, 64]), m=st.integers(1, 4), n=st.integers(0, 80),
       data=st.data())
def test_tables_hold_positions_by_substring_then_id(bits, m, n, data):
    """Each table is every position once, ordered by (substring, id); a lookup of any value
    (present or not) gives exactly the positions whose substring has it; the arrays are
    uint32 and no copy of codes, ids or distinct substrings is kept. Counting sort (short
    substrings), radix sort (long ones) and the leading table alike."""
    m = min(m, bits)
    xb, _, ids = _data(data.draw, bits, n, 1)
    index = MultiIndex(bits, substrings=m)
    index.add(xb, ids - n)
    t = index.tables
    assert t.positions.dtype == np.uint32 and t.positions.shape == (m * n,)
    for j in range(m):
        order, subs = table_twin(index.words, index.ids, bits, m, j)
        assert (t.rows(j) == order).all()
        assert t.distinct[j] == len(np.unique(subs))
        assert (index.distinct_substrings(j) == np.unique(subs)).all()
        probe = np.unique(np.concatenate([subs, subs ^ np.uint64(1), [np.uint64(0)]]))
        probe &= np.uint64((1 << int(index.sub_widths[j])) - 1)
        for v in probe:
            got = index.bucket_positions(j, int(v))
            assert (got == order[np.isin(order, np.flatnonzero(subs == v))]).all()
    assert index.memory_bytes() == sum(a.nbytes for a in (
        index.words, index.ids, t.positions, t.starts, t.slots, t.bitmap, t.tables, t.ends))
    _check_end_bits(index)
    check_tags(index)


def check_tags(index):
    """Every entry of table ``j`` is its row in the bits below ``T_ROW_BITS`` (``max(1,
    bit_length(n))``) and its table's tag above them: the code's ``T_TAG_BITS`` bits from
    ``T_TAG_START`` (twin: the code's bits unpacked), outside substring ``j`` (after it, the
    last table's before it), as many as the entry's spare bits hold, at most TAG_MAX_BITS,
    none over 64 bits."""
    t, n, bits, m = index.tables, index.ntotal, index.bits, index.substrings
    rb = int(t.tables[0, T_ROW_BITS])
    assert rb == max(1, n.bit_length()) and (t.tables[:, T_ROW_BITS] == rb).all()
    unpacked = unpack_words(index.words, bits).astype(np.uint64)
    spare = 8 * t.positions.dtype.itemsize - rb
    for j in range(m):
        s, w = int(index.sub_starts[j]), int(index.sub_widths[j])
        room = bits - s - w if j < m - 1 else s
        tb, ts = int(t.tables[j, T_TAG_BITS]), int(t.tables[j, T_TAG_START])
        assert tb == (min(spare, TAG_MAX_BITS, room) if bits <= 64 else 0)
        assert tb == 0 or ts + tb <= s or ts >= s + w
        entries = t.positions[j * n:(j + 1) * n].astype(np.uint64)
        rows = (entries & np.uint64((1 << rb) - 1)).astype(np.int64)
        want = np.zeros(n, dtype=np.uint64)
        for c in range(tb):
            want = (want << np.uint64(1)) | unpacked[rows, ts + c]
        assert ((entries >> np.uint64(rb)) == want).all()


def _check_end_bits(index):
    """A hashed table's end bits are set exactly at the last position of each run of equal
    substrings (twin: the substrings in table order compared with the next); none for a
    direct table; the same bits computed from the slots (an older snapshot's load)."""
    t, n = index.tables, index.ntotal
    subs = index.substring_codes(index.words)
    bits = np.unpackbits(t.ends.view(np.uint8), bitorder="little")
    hashed = 0
    for j in range(index.substrings):
        if t.tables[j, T_DIRECT]:
            continue
        base = ends_bit_base(t.tables, j, n)
        col = subs[t.rows(j), j]
        want = np.append(col[1:] != col[:-1], True) if n else np.zeros(0, bool)
        assert (bits[base:base + n] == want).all()
        assert not bits[base + n:base + 64 * ((n + 63) // 64)].any()
        hashed += 1
    assert len(t.ends) == max(1, hashed * ((n + 63) // 64))
    assert (bucket_ends(t.slots, t.tables, n) == t.ends).all()


def test_a_hashed_table_from_the_counting_sort():
    """17-bit substrings of many items with few values: sorted by counting, looked up hashed."""
    rng = np.random.default_rng(4)
    values = rng.integers(0, 1 << 34, 5, dtype=np.uint64)
    xb = values[rng.integers(0, 5, 40_000)].reshape(-1, 1)
    index = MultiIndex(34, substrings=2)
    index.add(xb)
    assert index.table_direct() == [False, False]
    xq = np.concatenate([values.reshape(-1, 1), values.reshape(-1, 1) ^ np.uint64(1 << 20)])
    for R in (0, 1, 3):
        _same(index.range_search(xq, R),
              naive.range_search(xq, xb, np.arange(len(xb)), 34, R))


def test_memory_is_items_positions_and_bucket_starts():
    """24-bit codes, 2 direct tables of 12 bits: 16 + 2 x 4 bytes per item and 2 x 4097
    starts."""
    rng = np.random.default_rng(0)
    index = MultiIndex(24, substrings=2)
    index.add(rng.integers(0, 1 << 24, (1000, 1), dtype=np.uint64))
    t = index.tables
    assert index.table_direct() == [True, True] and len(t.starts) == 2 * (4096 + 1)
    assert index.memory_bytes() == 1000 * 16 + 2 * 1000 * 4 + 2 * 4097 * 4 + t.slots.nbytes \
        + t.bitmap.nbytes + t.tables.nbytes + t.ends.nbytes
    assert t.ends.nbytes == 8  # no end bits for direct tables


# ----------------------------------------------------------------------------- ordering


@settings(max_examples=120, deadline=None)
@given(data=st.data(), width=st.integers(1, 5))
def test_merge_sub_runs_matches_lexsort(data, width):
    """Sub-runs (table j, distance d) of ascending ids (distinct over the query), any sizes
    and empty ones, laid out as the exact kernel lays them (each with room for its table's
    candidates, past the query's results): (distance, id) order at ``o``, the entries before
    ``o`` untouched (the numpy twin: a lexsort)."""
    ids = data.draw(st.lists(st.integers(-10**6, 10**6), unique=True, max_size=90))
    owner = data.draw(st.lists(st.integers(0, width * width - 1), min_size=len(ids),
                               max_size=len(ids)))
    o = data.draw(st.integers(0, 3))
    size = len(ids)
    room = [data.draw(st.integers(0, 3)) for _ in range(width)]
    out_i = np.full(o + (width + 3) * size + width * sum(room) + 1, -7, dtype=np.int64)
    out_d = np.full(len(out_i), -7, dtype=np.int32)
    sub_lo = np.zeros(width * width, dtype=np.int64)
    sub_end = np.zeros(width * width, dtype=np.int64)
    at = o + size
    for j in range(width):
        mine = [k for k in range(width * width) if k // width == j]
        cap = sum(owner.count(k) for k in mine) + room[j]
        for k in mine:
            run = sorted(v for v, w in zip(ids, owner) if w == k)
            sub_lo[k] = at
            out_i[at:at + len(run)] = run
            sub_end[k] = at + len(run)
            at += cap
    end = _merge_sub_runs(out_d, out_i, o, width, sub_lo, sub_end, at)
    d = np.array([w % width for w in owner], dtype=np.int32)
    expected = naive_order(d, np.array(ids, dtype=np.int64))
    assert end == o + size
    assert (out_d[o:end] == expected[0]).all() and (out_i[o:end] == expected[1]).all()
    assert (out_d[:o] == -7).all() and (out_i[:o] == -7).all()


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_small_query_results_in_distance_id_order(data):
    """A query of at most SMALL_QUERY candidates, its results at tied distances found in any
    id order (table 0's bucket read in code order, then the other tables'): the run is sorted
    by (distance, id) at the query's end, as brute force orders it."""
    bits, m = 24, 3
    R = data.draw(st.integers(1, 2))
    q = np.uint64(data.draw(st.integers(0, 2**bits - 1)))
    flips = data.draw(st.lists(st.integers(1, 2**bits - 1).filter(lambda v: bin(v).count("1")
                                                                  <= 2),
                               min_size=1, max_size=SMALL_QUERY // m, unique=True))
    xb = np.array([[q ^ np.uint64(f)] for f in flips], dtype=np.uint64)
    ids = np.array(data.draw(st.permutations(range(len(flips)))), dtype=np.int64) * 7 + 3
    index = MultiIndex(bits, substrings=m)
    index.add(xb, ids)
    index.threads = 1
    xq = np.array([[q], [q ^ np.uint64(1)]], dtype=np.uint64)
    _same(index.range_search(xq, R), naive.range_search(xq, xb, ids, bits, R))


def _run_exact_kernel(index, xq, R, step, with_stats):
    """The exact kernel called as :func:`index.base.run_resumable` calls it, its output buffers
    starting at ``step`` entries and ``step`` more at every return: ``(lims, D, I, stats,
    returns)``."""
    t, nq = index.tables, len(xq)
    lims = np.zeros(nq + 1, dtype=np.int64)
    out_d, out_i = np.empty(step, dtype=np.int32), np.empty(step, dtype=np.int64)
    scratch = np.empty(1, dtype=np.int64)
    stats = np.zeros((UNIQUE_CANDIDATES + 1, nq, R + 1), dtype=np.int64) if with_stats else None
    total_ns = np.zeros(nq, dtype=np.int64) if with_stats else None
    q = n_out = returns = 0
    while True:
        q, n_out, reached, need = _mih_exact_kernel(
            xq, R, t.tables, t.starts, t.slots, t.bitmap, t.positions, t.ends, index.words,
            index.ids, index._word_width, 1 << 62, 1.0, q, n_out, lims, out_d, out_i, scratch,
            stats, total_ns)
        assert reached == -1
        if q >= nq:
            return lims, out_d[:n_out], out_i[:n_out], stats, returns
        returns += 1
        if need:
            scratch = np.empty(need, dtype=np.int64)
            continue
        out_d = np.concatenate([out_d, np.empty(step, dtype=np.int32)])
        out_i = np.concatenate([out_i, np.empty(step, dtype=np.int64)])


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 150), nq=st.integers(1, 2 * CLOCK_GROUP + 3), step=st.integers(1, 40),
       R=st.integers(1, 2), with_stats=st.booleans(), data=st.data())
def test_exact_kernel_resumes_after_every_full_buffer(n, nq, step, R, with_stats, data):
    """Output buffers too small at any query, small or large (a crowd's candidates are more
    than SMALL_QUERY): the kernel returns before the query, is resumed with a larger buffer,
    and gives brute force's results and the statistics of one uninterrupted search."""
    bits, m = 24, 3
    xb, xq, ids = _data(data.draw, bits, n, nq)
    index = MultiIndex(bits, substrings=m)
    index.add(xb, ids)
    lims, D, I, stats, returns = _run_exact_kernel(index, xq, R, step, with_stats)
    expected = naive.range_search(xq, xb, ids, bits, R)
    _same((lims, D, I), expected)
    assert returns >= len(D) // step - 1  # (a return per step of results, at least)
    if with_stats:
        index.threads = 1
        st_ = index.range_search(xq, R, stats=True)[3]
        assert (stats[ITEMS] == st_.items).all()
        assert (stats[CANDIDATES] == st_.candidates).all()
        assert (stats[UNIQUE_CANDIDATES] == st_.unique_candidates).all()


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


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 5), n=st.integers(0, 80), nq=st.integers(1, 40),
       threads=st.sampled_from([1, 2]), data=st.data())
def test_the_short_way_of_64_bit_codes_matches_brute_force(m, n, nq, threads, data):
    """range_search's short way (64-bit codes as a C-contiguous ``(nq, 1)`` array, R < m, no
    statistics or cap, on the calling thread), the same queries strided (the resumable way)
    and brute force agree; a radius past the probe limit still raises."""
    R = data.draw(st.integers(0, m - 1))
    xb, xq, ids = _data(data.draw, 64, n, nq)
    index = MultiIndex(64, substrings=m)
    index.add(xb, ids)
    index.threads = threads
    expected = naive.range_search(xq, xb, ids, 64, R)
    _same(index.range_search(xq, R), expected)
    strided = np.repeat(xq, 2, axis=0)[::2]
    assert nq == 1 or not strided.flags.c_contiguous
    _same(index.range_search(strided, R), expected)
    if R > 0:
        index.max_probes = R  # R + 1 lookups
        with pytest.raises(MIHProbeLimitError):
            index.range_search(xq, R)


@pytest.mark.parametrize("R", [0, 1, 2])
def test_the_short_way_gives_a_full_buffer_to_the_resumable_way(R):
    """More results than this thread's output buffer (4,096 entries at the start) in one
    short-way call of 64-bit codes: the batch is searched again the resumable way."""
    OUTPUT_BUFFERS.__init__()
    rng = np.random.default_rng(R)
    base = np.uint64(0xABCDEF0123456789)
    xb = np.full((7500, 1), base, dtype=np.uint64)  # 5,000 of them equal to it
    xb[::3, 0] ^= np.uint64(1) << rng.integers(0, 64, 2500).astype(np.uint64)
    xb = np.concatenate([xb, rng.integers(0, 1 << 63, (100, 1), dtype=np.uint64)])
    ids = rng.permutation(10**6)[:len(xb)].astype(np.int64)
    xq = np.array([[xb[7510, 0]], [base], [xb[7520, 0]]], dtype=np.uint64)
    index = MultiIndex(64, substrings=3)
    index.add(xb, ids)
    index.threads = 1
    expected = naive.range_search(xq, xb, ids, 64, R)
    assert expected[0][2] - expected[0][1] > 4096 >= len(OUTPUT_BUFFERS.i)
    _same(index.range_search(xq, R), expected)
    _same(index.range_search(xq[1:2], R), naive.range_search(xq[1:2], xb, ids, 64, R))


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
    assert index.table_direct() == direct
    for R in range(m):
        _same(index.range_search(xq, R), naive.range_search(xq, xb, np.arange(300), bits, R))


@pytest.mark.parametrize("R", [1, 2])
def test_many_results_per_query_with_statistics_and_buffer_growth(R):
    """Many results per query in several sub-runs (merged), more than the output buffer
    (4096) in one batch: searched again after growth, statistics counted once."""
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
    assert np.diff(expected[0]).max() > 4096 and np.diff(expected[0])[1] > SMALL_QUERY
    _same(index.range_search(xq, R), expected)
    lims, D, I, st_ = index.range_search(xq, R, stats=True)
    _same((lims, D, I), expected)
    _check_stats(st_, xq, xb, bits, m, R, lims, D)


@pytest.mark.parametrize("R", [1, 2])
def test_small_queries_before_a_full_buffer_get_their_ids(R):
    """A query of at most SMALL_QUERY candidates writes one run of results, sorted at its end:
    small queries (ids not in position order) before, between and after queries that fill the
    output buffer and return mid-block, with and without statistics and a result cap."""
    bits, m = 24, 3
    rng = np.random.default_rng(10 + R)
    base = np.uint64(0xABCDEF)
    crowd = np.full((5000, 1), base, dtype=np.uint64)
    crowd[::2, 0] ^= np.uint64(1) << rng.integers(0, bits, 2500).astype(np.uint64)
    sparse = rng.integers(0, 1 << bits, (200, 1), dtype=np.uint64)
    xb = np.concatenate([sparse, crowd])
    ids = rng.permutation(10**6)[:len(xb)].astype(np.int64)
    near = sparse[:40] ^ (np.uint64(1) << rng.integers(0, bits, (40, 1)).astype(np.uint64))
    xq = np.concatenate([near[:10], [[base]], near[10:20], [[base ^ np.uint64(1)]],
                         near[20:40]]).astype(np.uint64)
    index = MultiIndex(bits, substrings=m)
    index.add(xb, ids)
    index.threads = 1
    expected = naive.range_search(xq, xb, ids, bits, R)
    sizes = np.diff(expected[0])
    assert sizes[10] > 4096 and 0 < sizes[:10].sum() and sizes[:10].max() <= SMALL_QUERY
    _same(index.range_search(xq, R), expected)
    lims, D, I, st_ = index.range_search(xq, R, stats=True)
    _same((lims, D, I), expected)
    _check_stats(st_, xq, xb, bits, m, R, lims, D)
    total = int(expected[0][-1])
    _same(index.range_search(xq, R, max_results=total), expected)
    with pytest.raises(ResultLimitError):
        index.range_search(xq, R, max_results=total - 1)


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
def test_the_tables_are_loaded_not_rebuilt(tmp_path, mmap):
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
    for name, a in index.tables.arrays().items():
        b = getattr(loaded.tables, name)
        assert np.array_equal(a, b) and a.dtype == b.dtype, name
        assert isinstance(b, np.memmap) == mmap or isinstance(b.base, np.memmap) == mmap


def test_a_snapshot_without_end_bits_loads_with_them_computed():
    """Tables saved before their end bits (format 4 without ``table_ends``): the bits are
    computed at load from the slots, equal to a build's, and the searches agree."""
    rng = np.random.default_rng(3)
    values = rng.integers(0, 1 << 40, 30, dtype=np.uint64)
    xb = values[rng.integers(0, 30, 2000)].reshape(-1, 1)
    xb[::5] ^= np.uint64(1) << rng.integers(0, 40, (400, 1)).astype(np.uint64)
    index = MultiIndex(40, substrings=2)
    index.add(xb, rng.permutation(10**5)[:2000])
    assert index.table_direct() == [False, False]
    meta, arrays = index.snapshot()
    del arrays["table_ends"]
    loaded = MultiIndex.from_snapshot(40, meta, arrays)
    assert (loaded.tables.ends == index.tables.ends).all()
    xq = xb[::9]
    for R in range(4):
        _same(loaded.range_search(xq, R), index.range_search(xq, R))


def test_exact_plan_is_the_pigeonhole_bound():
    """Each radius R < m is answered by R + 1 lookups at substring radius 0."""
    index = MultiIndex(64, substrings=3)
    index.add(np.arange(10, dtype=np.uint64).reshape(-1, 1))
    _, widths = substring_ranges(64, 3)
    for R in range(3):
        st_ = index.range_search(np.zeros((1, 1), dtype=np.uint64), R, stats=True)[3]
        assert st_.probes.sum() == R + 1 == sum(math.comb(int(widths[j]), 0)
                                                for j in range(R + 1))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), distinct=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_run_sizes_match_the_buckets(n, distinct, seed):
    """The bucket size of a table position by galloping search (the planner's profile)
    against the size counted from the items' substrings."""
    from bucketsearch.index.mih_tables import run_sizes
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**64, size=(distinct, 1), dtype=np.uint64, endpoint=False)
    words = values[rng.integers(0, distinct, n)]
    index = MultiIndex(64, substrings=2)
    index.add(words, np.arange(n))
    subs = index.substring_codes(index.words)
    at = np.arange(n)
    for j in range(index.substrings):
        got = run_sizes(index.words, index.tables.positions, j, index.tables.tables,
                        index._word_width, at)
        order = index.tables.rows(j)
        col = subs[order, j]
        assert got.tolist() == [int((col == v).sum()) for v in col.tolist()]
