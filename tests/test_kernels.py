"""The shared kernels of index/kernels.py against plain-numpy twins (hypothesis)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.base import ResultLimitError, csr_to_knn
from bucketsearch.index.codes import pack_bits
from bucketsearch.index.kernels import (EMPTY, ITEMS, NONEMPTY, PROBES, counting_sort, grow,
                                        hamming, merge_rows, record_radius, rows_done,
                                        sort_run)
from bucketsearch.index.mih import MultiIndex
from bucketsearch.index.probe import HammingIndex, _lookup_words, _range_word0_short
from bucketsearch.index.scan import LinearScan
from bucketsearch.index import radix
from bucketsearch.index.item_table import ItemTable, slot_layout
from bucketsearch.index.table import BucketTable, sort_items
from tests import naive

# ----------------------------------------------------------------------------- numpy twins


def hamming_twin(q_bits: np.ndarray, x_bits: np.ndarray) -> int:
    """Distance of two unpacked bit rows: positions that differ."""
    return int((q_bits != x_bits).sum())


def counting_sort_twin(cand_d, cand_p, n, ids, lo, cut):
    """``(D, I)`` of the candidates with ``lo <= d <= cut``, ordered by (distance, id)."""
    d = np.asarray(cand_d[:n], dtype=np.int64)
    i = ids[np.asarray(cand_p[:n])]
    keep = (d >= lo) & (d <= cut)
    order = np.lexsort((i[keep], d[keep]))
    return d[keep][order], i[keep][order]


def merge_twin(rows_a, rows_b, drop, k):
    """Per query: the valid entries (id >= 0, ids of ``a`` not in ``drop``) of both rows,
    ordered by (distance, id), the first ``k`` (k >= 1) or all (k < 0)."""
    out = []
    for (da, ia), (db, ib) in zip(rows_a, rows_b):
        keep_a = (ia >= 0) & ~np.isin(ia, drop)
        d = np.concatenate([da[keep_a], db[ib >= 0]]).astype(np.int64)
        i = np.concatenate([ia[keep_a], ib[ib >= 0]])
        order = np.lexsort((i, d))
        out.append((d[order][:k] if k >= 1 else d[order], i[order][:k] if k >= 1 else i[order]))
    return out


def position_twin(xq, words):
    """Per query the first position of its code in code-sorted ``words`` (-1: none) and the
    number of items with that code."""
    first, size = {}, {}
    for p, c in enumerate(words[:, 0].tolist()):
        first.setdefault(c, p)
        size[c] = size.get(c, 0) + 1
    hits = np.array([first.get(int(q), -1) for q in xq[:, 0]], dtype=np.int64)
    sizes = np.array([size.get(int(q), 0) for q in xq[:, 0]], dtype=np.int64)
    return hits, sizes


# ----------------------------------------------------------------------------- strategies


def sorted_rows(draw, nq, id_pool, max_len, pad):
    """Per query a list of (distance, id) ordered by (distance, id), ids unique in the row,
    optionally padded at the end with (-1, -1)."""
    rows = []
    for _ in range(nq):
        n = draw(st.integers(0, max_len))
        ids = np.array(draw(st.lists(st.sampled_from(id_pool), min_size=n, max_size=n,
                                     unique=True)), dtype=np.int64)
        d = np.array(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)), dtype=np.int32)
        order = np.lexsort((ids, d))
        d, ids = d[order], ids[order]
        if pad:
            extra = draw(st.integers(0, 3))
            d = np.concatenate([d, np.full(extra, -1, np.int32)])
            ids = np.concatenate([ids, np.full(extra, -1, np.int64)])
        rows.append((d, ids))
    return rows


def as_csr(rows):
    lims = np.zeros(len(rows) + 1, dtype=np.int64)
    lims[1:] = np.cumsum([len(r[1]) for r in rows])
    D = np.concatenate([r[0] for r in rows]) if rows else np.empty(0, np.int32)
    I = np.concatenate([r[1] for r in rows]) if rows else np.empty(0, np.int64)
    return lims, D.astype(np.int32), I.astype(np.int64)


# ----------------------------------------------------------------------------- tests


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([1, 7, 63, 64, 65, 128, 200, 256]), data=st.data())
def test_hamming_matches_unpacked_bits(bits, data):
    rows = data.draw(st.lists(st.lists(st.integers(0, 1), min_size=bits, max_size=bits),
                              min_size=2, max_size=5))
    b = np.array(rows, dtype=np.uint8)
    words = pack_bits(b)
    for qi in range(len(b)):
        for i in range(len(b)):
            assert hamming(words, qi, words, i, words.shape[1]) == hamming_twin(b[qi], b[i])


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 40), need=st.integers(0, 200), seed=st.integers(0, 2**31))
def test_grow_keeps_the_prefix_and_has_room(size, need, seed):
    buf = np.random.default_rng(seed).integers(-50, 50, size).astype(np.int64)
    out = grow(buf, need)
    assert len(out) >= need and (out[:size] == buf).all()
    if need <= size:
        assert out is buf
    else:
        assert len(out) >= 2 * size  # doubling: n appends cost O(n)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(-10**12, 10**12), max_size=80), data=st.data())
def test_sort_run_sorts_only_its_slice(values, data):
    a = np.array(values, dtype=np.int64)
    lo = data.draw(st.integers(0, len(a)))
    hi = data.draw(st.integers(lo, len(a)))
    expected = a.copy()
    expected[lo:hi] = np.sort(a[lo:hi])
    sort_run(a, lo, hi)
    assert (a == expected).all()


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 120), bits=st.integers(1, 20), data=st.data())
def test_counting_sort_matches_lexsort(n, bits, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    ids = rng.permutation(10 * n + 5)[:n + 3].astype(np.int64) - 2
    cand_p = rng.permutation(len(ids))[:n].astype(np.int64)
    cand_d = rng.integers(0, bits + 1, n).astype(np.int32)
    extra = data.draw(st.integers(0, 5))  # scratch past n must be ignored
    cand_d = np.concatenate([cand_d, np.zeros(extra, np.int32)])
    cand_p = np.concatenate([cand_p, np.zeros(extra, np.int64)])
    lo = data.draw(st.integers(0, bits))
    cut = data.draw(st.integers(lo, bits))
    hist = np.zeros(bits + 2, dtype=np.int64)
    np.add.at(hist, cand_d[:n], 1)
    n_out = data.draw(st.integers(0, 4))
    out_d = np.full(n_out + data.draw(st.integers(0, 8)), 99, dtype=np.int32)
    out_i = np.full(len(out_d), 99, dtype=np.int64)
    fill = np.zeros(bits + 2, dtype=np.int64)
    need = n_out + int(hist[lo:cut + 1].sum())
    out_d, out_i = grow(out_d, need), grow(out_i, need)
    form = data.draw(st.sampled_from(["positions", "ids", "ascending ids"]))
    if form == "positions":
        total = counting_sort(cand_d, cand_p, n, ids, hist, lo, cut, fill, out_d, out_i, n_out)
    else:  # the scan's form: the candidates' ids themselves, in id order when ascending
        given_ids = ids[cand_p]
        if form == "ascending ids":
            order = np.argsort(given_ids[:n], kind="stable")
            given_ids[:n], cand_d[:n] = given_ids[:n][order], cand_d[:n][order]
            cand_p[:n] = cand_p[:n][order]
        total = counting_sort(cand_d, given_ids, n, None, hist, lo, cut, fill, out_d, out_i,
                              n_out, form == "ascending ids")
    tD, tI = counting_sort_twin(cand_d, cand_p, n, ids, lo, cut)
    assert total == len(tD)
    assert (out_d[n_out:n_out + total] == tD).all() and (out_i[n_out:n_out + total] == tI).all()
    assert (out_d[:n_out] == 99).all() and (out_i[:n_out] == 99).all()  # kept as it was


def test_record_radius_writes_one_row():
    stats = np.zeros((5, 3, 4), dtype=np.int64)
    record_radius(stats, 1, 2, 10, 3, 7)
    expected = np.zeros_like(stats)
    expected[PROBES, 1, 2], expected[NONEMPTY, 1, 2] = 10, 3
    expected[EMPTY, 1, 2], expected[ITEMS, 1, 2] = 7, 7
    assert (stats == expected).all()


@settings(max_examples=150, deadline=None)
@given(nq=st.integers(0, 5), k=st.sampled_from([-1, 1, 2, 5]), data=st.data())
def test_merge_rows_matches_sorting_the_union(nq, k, data):
    pool_a, pool_b = list(range(0, 30)), list(range(20, 50))  # overlapping id ranges
    rows_a = sorted_rows(data.draw, nq, pool_a, 8, pad=True)
    # an id lives in b only when a's copy is dropped (the live layer's tombstone rule)
    drop = np.array(sorted(data.draw(st.sets(st.sampled_from(pool_a)))), dtype=np.int64)
    rows_b = [(d[~np.isin(i, pool_a) | np.isin(i, drop)], i[~np.isin(i, pool_a)
                                                              | np.isin(i, drop)])
              for d, i in sorted_rows(data.draw, nq, pool_b, 8, pad=data.draw(st.booleans()))]
    counts, D, I = merge_rows(*as_csr(rows_a), *as_csr(rows_b), drop, k)
    twin = merge_twin(rows_a, rows_b, drop, k)
    if k >= 1:
        D, I = D.reshape(nq, k), I.reshape(nq, k)
        for q, (td, ti) in enumerate(twin):
            assert counts[q] == len(ti)
            assert (D[q, :len(td)] == td).all() and (I[q, :len(ti)] == ti).all()
            assert (D[q, len(td):] == -1).all() and (I[q, len(ti):] == -1).all()
    else:
        assert (counts == [len(t[1]) for t in twin]).all()
        assert (D == np.concatenate([t[0] for t in twin] or [[]])).all()
        assert (I == np.concatenate([t[1] for t in twin] or [[]])).all()


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([3, 16, 30, 64]), n=st.integers(0, 50), clock=st.booleans(),
       data=st.data())
def test_lookup_words_matches_a_dict(bits, n, clock, data):
    top = (1 << bits) - 1
    xb = np.array(data.draw(st.lists(st.integers(0, min(top, 40)) if data.draw(st.booleans())
                                     else st.integers(0, top), min_size=n, max_size=n)),
                  dtype=np.uint64).reshape(-1, 1)
    table = ItemTable.build(bits, xb, np.arange(n, dtype=np.int64))
    misses = data.draw(st.lists(st.integers(0, top), max_size=12))  # first: the filter is read
    xq = np.concatenate([np.array(misses, dtype=np.uint64).reshape(-1, 1), xb[:5],
                         np.array([[0], [top], [7 & top]], dtype=np.uint64)])
    q_start = data.draw(st.integers(0, len(xq)))
    hits = np.full(len(xq), -9, dtype=np.int64)
    lims = np.zeros(len(xq) + 1, dtype=np.int64)
    ticks = np.zeros(len(xq), dtype=np.int64)
    total = _lookup_words(xq, q_start, *table.lookup_args(), hits, lims, clock, ticks)
    th, ts = position_twin(xq, table.words)
    assert (hits[q_start:] == th[q_start:]).all() and (hits[:q_start] == -9).all()
    assert (lims[q_start + 1:] == ts[q_start:]).all() and total == ts[q_start:].sum()
    if clock:
        assert (ticks[q_start:] > 0).all() and (ticks[:q_start] == 0).all()
    else:
        assert (ticks == 0).all()


def exact_match_twin(xq, words, ids):
    """Radius 0 in plain numpy: per query the ids of the items whose code equals it,
    ascending, as CSR ``(lims, I)``."""
    parts = [np.sort(ids[words[:, 0] == q]) for q in xq[:, 0]]
    lims = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=lims[1:])
    return lims, np.concatenate(parts or [np.empty(0, np.int64)])


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([3, 16, 30, 64]), n=st.integers(0, 60),
       layout=st.sampled_from([None, (np.uint32, 1), (np.uint64, 2)]), cap=st.integers(0, 40),
       data=st.data())
def test_range_word0_short_matches_the_twin(bits, n, layout, cap, data):
    """The one-pass radius-0 kernel of the short way against :func:`exact_match_twin`: direct
    and hashed tables (fingerprints of 1-2 bits, so most fingerprint matches are false), runs
    of equal codes, misses first (the filter is read) and hits first (it is not), and an
    output buffer of ``cap`` entries that may fill (then ``-1 - q``, the results before query
    ``q`` final and nothing written past ``cap``)."""
    top = (1 << bits) - 1
    few = data.draw(st.booleans())
    xb = np.array(data.draw(st.lists(st.integers(0, min(top, 12)) if few
                                     else st.integers(0, top), min_size=n, max_size=n)),
                  dtype=np.uint64).reshape(-1, 1)
    ids = np.array(data.draw(st.permutations(range(n))), dtype=np.int64) * 3 - 7
    words, sorted_ids = sort_items(xb, ids)
    table = ItemTable.from_sorted(bits, words, sorted_ids,
                                  layout=layout if bits > 16 else None)
    misses = data.draw(st.lists(st.integers(0, top), max_size=12))
    head = [xb[:6], np.array(misses, dtype=np.uint64).reshape(-1, 1)]
    xq = np.concatenate(head if data.draw(st.booleans()) else head[::-1])
    xq = np.concatenate([xq, np.array([[0], [top], [7 & top]], dtype=np.uint64)])
    lims = np.zeros(len(xq) + 1, dtype=np.int64)
    out_i = np.full(cap, -99, dtype=np.int64)
    words_, slots, fp_bits, direct, bitmap = table.lookup_args()
    got = _range_word0_short(xq, lims, out_i, words_, slots, fp_bits, direct, bitmap, table.ids)
    tl, ti = exact_match_twin(xq, xb, ids)
    if got >= 0:
        assert got == tl[-1] <= cap
        assert (lims == tl).all() and (out_i[:got] == ti).all()
    else:
        q = -1 - got
        assert tl[q + 1] > cap >= tl[q]  # the first query whose results did not fit
        assert (lims[:q + 1] == tl[:q + 1]).all() and (out_i[:tl[q]] == ti[:tl[q]]).all()


def test_range_word0_short_walks_false_fingerprints_and_wraps():
    """The same kernel on a table whose 1-bit fingerprints match half the slots they pass and
    whose last slots are taken, probed without the filter (hits first) by every code and
    thousands of absent ones: false fingerprint matches and walks past the last slot, every
    answer the twin's (the hypothesis test's few examples may miss these paths)."""
    rng = np.random.default_rng(2)  # a seed whose table has its last two slots taken
    xb = rng.integers(0, 2**63, (300, 1), dtype=np.uint64)
    ids = np.arange(300, dtype=np.int64)
    words, sorted_ids = sort_items(xb, ids)
    table = ItemTable.from_sorted(64, words, sorted_ids, layout=(np.uint32, 1))
    assert table.slots[-1] != 0  # a walk from the last slot wraps to the first
    xq = np.concatenate([xb, rng.integers(0, 2**63, (5000, 1), dtype=np.uint64)])
    lims = np.zeros(len(xq) + 1, dtype=np.int64)
    out_i = np.empty(len(xq), dtype=np.int64)
    words_, slots, fp_bits, direct, bitmap = table.lookup_args()
    got = _range_word0_short(xq, lims, out_i, words_, slots, fp_bits, direct, bitmap, table.ids)
    tl, ti = exact_match_twin(xq, xb, ids)
    assert got == 300 and (lims == tl).all() and (out_i[:got] == ti).all()


@settings(max_examples=80, deadline=None)
@given(bits=st.sampled_from([25, 40, 64, 128]), n=st.integers(0, 400), spread=st.integers(1, 40),
       layout=st.sampled_from([None, (np.uint32, 1), (np.uint32, 3), (np.uint64, 32),
                               (np.uint64, 2)]),
       seed=st.integers(0, 2**31))
def test_item_table_finds_every_code_and_no_other(bits, n, spread, layout, seed):
    """Hashed slots of positions (wrap-around included: small tables, clustered homes; 32- and
    64-bit slots; fingerprints of 1-3 bits, so most fingerprint matches are false) find every
    code's first position and nothing else (the twin: a dict of code -> first position)."""
    from bucketsearch.index.item_table import find_row
    rng = np.random.default_rng(seed)
    W = (bits + 63) // 64
    top = 2**min(bits, 63)
    codes = rng.integers(0, min(top, 2**spread), (n, W), dtype=np.uint64)
    codes[:, 0] |= np.uint64(top >> 1) if bits < 64 and n % 2 else np.uint64(0)
    words, ids = sort_items(codes, np.arange(n, dtype=np.int64))
    table = ItemTable.from_sorted(bits, words, ids, layout=layout)
    assert not table.direct and table.words is words and table.ids is ids
    twin = {}
    for p, c in enumerate(words.tolist()):
        twin.setdefault(tuple(c), p)
    probes = np.concatenate([codes, rng.integers(0, min(top, 2**spread), (50, W),
                                                 dtype=np.uint64)])
    args = table.lookup_args()
    for q in probes:
        assert find_row(q, W, *args) == twin.get(tuple(q.tolist()), -1)
    assert (table.slots != 0).sum() == table.distinct_codes == len(twin)
    assert table.slots.dtype == (layout[0] if layout else np.uint32)


def filter_twin(h: int, n_words: int) -> tuple[int, int]:
    """The filter word and bits of hash ``h`` (Python ints)."""
    bits = 0
    for shift in (20, 26, 32):
        bits |= 1 << ((h >> shift) & 63)
    return ((h >> 32) * n_words) >> 32, bits


@settings(max_examples=200, deadline=None)
@given(h=st.integers(0, 2**64 - 1), n_words=st.integers(1, 2**31))
def test_filter_word_bits_matches_the_twin(h, n_words):
    from bucketsearch.index.item_table import filter_word_bits
    f, bits = filter_word_bits(np.uint64(h), n_words)
    assert (int(f), int(bits)) == filter_twin(h, n_words) and int(f) < n_words
    assert bin(int(bits)).count("1") <= 3


def test_filter_size_by_distinct_codes_and_its_false_positives():
    """12 bits per code at the least, up to 32 while the filter fits 4 MiB; no false
    negative, and few false positives on random absent codes."""
    from bucketsearch.index.item_table import (FILTER_CACHE_BYTES, filter_words,
                                               passes_filter)
    from bucketsearch.index.table import HASH_MULTIPLIER
    assert filter_words(1) == 1 and filter_words(1000) == 500  # 32 bits a code
    assert filter_words(3_000_000) == 562_500  # 12 bits a code: 1.5 bytes
    assert filter_words(2_000_000) * 8 == FILTER_CACHE_BYTES  # between: 4 MiB
    rng = np.random.default_rng(4)
    codes = np.unique(rng.integers(0, 2**63, 100_000, dtype=np.uint64))
    table = ItemTable.build(64, codes.reshape(-1, 1), np.arange(len(codes), dtype=np.int64))
    absent = np.setdiff1d(rng.integers(0, 2**63, 50_000, dtype=np.uint64), codes)
    passes = [bool(passes_filter(h, table.bitmap)) for h in codes[:5000] * HASH_MULTIPLIER]
    assert all(passes)  # (array products: uint64 wrap-around, no warning)
    false = np.mean([bool(passes_filter(h, table.bitmap)) for h in absent * HASH_MULTIPLIER])
    assert false < 0.01  # 32 bits a code, 3 bits set: 0.17% measured on 1M codes


def test_filter_of_an_older_scheme_is_filled_again_at_load():
    """A snapshot's table whose meta names no filter scheme (the 4-bit filter of a second
    multiply) gets its filter filled again; one of this scheme is taken as it is."""
    from bucketsearch.index.item_table import find_row
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 2**63, (300, 1), dtype=np.uint64)
    table = ItemTable.build(64, codes, np.arange(300, dtype=np.int64))
    arrays = {**table.arrays(), "bitmap": np.zeros_like(table.bitmap)}  # an unusable filter
    old_meta = {k: v for k, v in table.meta().items() if k != "filter"}
    old = ItemTable.from_arrays(64, arrays, old_meta)
    same = ItemTable.from_arrays(64, arrays, table.meta())
    assert (old.bitmap == table.bitmap).all() and same.bitmap is arrays["bitmap"]
    for q in codes:
        assert find_row(q, 1, *old.lookup_args()) >= 0
        assert find_row(q, 1, *same.lookup_args()) == -1  # the zeroed filter is read


def test_slot_layout_keeps_32_bit_slots_with_a_fingerprint_below_2_31_items():
    assert slot_layout(10_000_000) == (np.uint32, 8)
    assert slot_layout(100_000_000) == (np.uint32, 5)
    assert slot_layout(2**31 - 1) == (np.uint32, 1)
    assert slot_layout(2**31) == (np.uint64, 32)
    assert slot_layout(0) == (np.uint32, 31)


def _same(got, expected):
    lims, D, I = got[:3]
    el, eD, eI = expected
    assert (lims == el).all() and (D == eD).all() and (I == eI).all()


@pytest.mark.parametrize("cls", [HammingIndex, MultiIndex, LinearScan])
@pytest.mark.parametrize("R", [0, 1])
def test_small_radius_kernels_result_cap_and_buffer_growth(cls, R):
    """Results past the per-thread buffer (4096) resume after growing it (the scan's hits
    scratch too: 5,000 hits of one query); the cap raises."""
    bits = 20
    xb = np.full((5000, 1), 12345, dtype=np.uint64)
    xb[::2] ^= np.uint64(1)
    ids = np.arange(5000, dtype=np.int64)
    index = cls(bits, substrings=4) if cls is MultiIndex else cls(bits)
    index.add(xb, ids)
    index.threads = 1
    xq = np.array([[12345], [999], [12344]], dtype=np.uint64)
    expected = naive.range_search(xq, xb, ids, bits, R)
    _same(index.range_search(xq, R), expected)
    total = int(expected[0][-1])
    _same(index.range_search(xq, R, max_results=total), expected)
    with pytest.raises(ResultLimitError) as err:
        index.range_search(xq, R, max_results=total - 1)
    assert err.value.reached > total - 1


def test_radius_kernel_scratch_grows_for_many_queries_and_buckets():
    """Radius 0 needs one scratch entry per query (more than 4096 here); radius 7 of 13-bit
    codes finds more than 4096 non-empty buckets in one radius."""
    bits = 13
    xb = np.arange(1 << bits, dtype=np.uint64).reshape(-1, 1)
    ids = np.arange(1 << bits, dtype=np.int64)
    index = HammingIndex(bits)
    index.add(xb, ids)
    index.threads = 1
    xq = xb[::-1].copy()
    _same(index.range_search(xq, 0), naive.range_search(xq, xb, ids, bits, 0))
    lims, D, I = index.range_search(xq[:1], 7)
    assert lims[-1] == sum(math.comb(bits, r) for r in range(8))
    assert (np.diff(D) >= 0).all()


def test_small_radius_statistics_with_the_cap_and_threads():
    """Statistics through the chunked driver (two threads), the cap counted over chunks."""
    bits = 16
    rng = np.random.default_rng(3)
    xb = rng.integers(0, 1 << bits, (400, 1), dtype=np.uint64)
    ids = np.arange(400, dtype=np.int64)
    xq = np.concatenate([xb[:40], rng.integers(0, 1 << bits, (10, 1), dtype=np.uint64)])
    for index in (HammingIndex(bits), MultiIndex(bits, substrings=3), LinearScan(bits)):
        index.add(xb, ids)
        index.threads = 2
        for R in (0, 2):
            expected = naive.range_search(xq, xb, ids, bits, R)
            got = index.range_search(xq, R, stats=True)
            _same(got, expected)
            assert (got[3].items.sum(axis=1) == np.diff(expected[0])).all()
            total = int(expected[0][-1])
            with pytest.raises(ResultLimitError):
                index.range_search(xq, R, stats=True, max_results=total - 1)
            assert math.isfinite(float(got[3].total_ns.sum()))


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([30, 48, 64]), values=st.lists(st.integers(0, 7), min_size=1,
                                                            max_size=60),
       high=st.integers(0, 2**64 - 1), negative=st.booleans(), stats=st.booleans(),
       R=st.integers(0, 2), short=st.integers(0, 2))
def test_hashed_single_table_range_search_matches_brute_force(bits, values, high, negative,
                                                              stats, R, short):
    """Radius 0 of a hashed one-word table (alone, and before radius 1-2): buckets of one and
    of several items (negative ids too); queries that miss; a result cap at the total passes,
    under it raises."""
    top = np.uint64((1 << bits) - 1)
    xb = ((np.array(values, dtype=np.uint64) * np.uint64(high | 1)) & top).reshape(-1, 1)
    ids = np.arange(len(xb), dtype=np.int64) * 7 - (5 if negative else 0)
    index = HammingIndex(bits)
    index.add(xb, ids)
    index.threads = 1
    assert not index.table.direct
    xq = np.concatenate([xb, xb ^ np.uint64(1), xb ^ np.uint64(6)])
    expected = naive.range_search(xq, xb, ids, bits, R)
    got = index.range_search(xq, R, stats=stats)
    _same(got, expected)
    if stats:
        assert (got[3].items.sum(axis=1) == np.diff(got[0])).all()
    total = int(expected[0][-1])
    if short and total >= short:
        with pytest.raises(ResultLimitError):
            index.range_search(xq, R, stats=stats, max_results=total - short)
    _same(index.range_search(xq, R, stats=stats, max_results=total), expected)


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([8, 32, 64, 100]), n=st.integers(0, 60), R=st.integers(0, 6),
       k=st.integers(1, 8), stats=st.booleans(), stored=st.sampled_from(["add", "snapshot"]),
       seed=st.integers(0, 2**31))
def test_linear_scan_in_any_storage_order_matches_brute_force(bits, n, R, k, stats, stored,
                                                              seed):
    """The scan stores items by id (each distance's hits then come in id order, unsorted);
    a snapshot in another order (written before) is put in id order at load."""
    rng = np.random.default_rng(seed)
    xb = pack_bits(rng.integers(0, 2, (n, bits)))
    xb[n // 2:] = xb[:n - n // 2]  # duplicate codes: ties broken by id
    ids = rng.permutation(10 * n + 3)[:n].astype(np.int64) - 3
    if stored == "add":
        index = LinearScan(bits)
        index.add(xb, ids)
        assert (np.diff(index.ids) > 0).all()
    else:
        index = LinearScan.from_snapshot(bits, {}, {"words": xb, "ids": ids})
    xq = np.concatenate([xb[:5], pack_bits(rng.integers(0, 2, (3, bits)))])
    got = index.range_search(xq, R, stats=stats)
    _same(got, naive.range_search(xq, xb, ids, bits, R))
    D, I = index.search(xq, k)[:2]
    eD, eI = naive.knn(xq, xb, ids, bits, k)
    assert (D == eD).all() and (I == eI).all()


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 6), min_size=0, max_size=12), k=st.integers(1, 6),
       full=st.booleans())
def test_csr_to_knn_matches_a_padded_copy(counts, k, full):
    """Rows of at most k results padded with -1; when every row is full the result reshapes
    the CSR arrays (no copy), otherwise a padded copy."""
    counts = [k] * len(counts) if full else [min(c, k) for c in counts]
    lims = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    D = np.arange(lims[-1], dtype=np.int32)
    I = np.arange(lims[-1], dtype=np.int64) * 3 + 1
    out_d, out_i = csr_to_knn(lims, D, I, k)
    assert out_d.shape == out_i.shape == (len(counts), k)
    assert out_d.dtype == np.int32 and out_i.dtype == np.int64
    for q, c in enumerate(counts):
        assert (out_d[q, :c] == D[lims[q]:lims[q + 1]]).all() and (out_d[q, c:] == -1).all()
        assert (out_i[q, :c] == I[lims[q]:lims[q + 1]]).all() and (out_i[q, c:] == -1).all()


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.integers(-1, 30), min_size=0, max_size=6), min_size=0,
                     max_size=8), width=st.integers(0, 6), k=st.integers(1, 6),
       drop=st.lists(st.integers(0, 30), max_size=10), all_seen=st.booleans())
def test_rows_done_matches_isin(rows, width, k, drop, all_seen):
    """A k-NN row settles its query when it holds k live ids (not -1, not tombstoned), ends
    in padding, or the search covered every item."""
    I = np.full((len(rows), width), -1, dtype=np.int64)
    for q, row in enumerate(rows):
        row = row[:width]
        I[q, :len(row)] = row
    drop = np.unique(np.array(drop, dtype=np.int64))
    live = ((I >= 0) & ~np.isin(I, drop)).sum(axis=1)
    padded = I[:, -1] < 0 if width else np.zeros(len(rows), dtype=bool)
    expected = (live >= k) | padded | all_seen
    assert (rows_done(I, drop, k, all_seen) == expected).all()


_KEYS = st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1),
                  st.sampled_from([0, 255, 256, 2**32, 2**63, 2**64 - 1]))


@settings(max_examples=120, deadline=None)
@given(keys=st.lists(_KEYS, max_size=300), seed=st.integers(0, 2**31))
def test_radix_sort_pairs_is_a_stable_sort(keys, seed):
    """The radix sort orders the keys and keeps equal keys' values in input order (the
    twin: numpy's stable sort), skipped bytes included (keys agreeing on a byte)."""
    keys = np.array(keys, dtype=np.uint64)
    values = np.random.default_rng(seed).integers(-2**40, 2**40, len(keys))
    before = keys.copy(), values.copy()
    out_k, out_v = radix.sort_pairs(keys, values)
    order = np.argsort(keys, kind="stable")
    assert (out_k == keys[order]).all() and (out_v == values[order]).all()
    assert (keys == before[0]).all() and (values == before[1]).all()  # inputs untouched


@settings(max_examples=120, deadline=None)
@given(codes=st.lists(_KEYS, max_size=200), data=st.data())
def test_radix_sort_codes_ids_matches_lexsort(codes, data):
    """(code, id) order, ids increasing (one sort by code) or in any order (by id, then code),
    negative ids included."""
    n = len(codes)
    ids = np.array(data.draw(st.lists(st.integers(-2**62, 2**62), min_size=n, max_size=n,
                                      unique=True)), dtype=np.int64)
    if data.draw(st.booleans()):
        ids = np.sort(ids)
    codes = np.array(codes, dtype=np.uint64)
    out_c, out_i = radix.sort_codes_ids(codes, ids)
    twin_c, twin_i = naive.sort_codes_ids(codes, ids)
    assert (out_c == twin_c).all() and (out_i == twin_i).all()


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([12, 20, 32, 64]), n=st.integers(0, 300), seed=st.integers(0, 2**31))
def test_item_table_from_its_arrays_finds_the_same(bits, n, seed):
    """A table rebuilt from its arrays and metadata (a snapshot's) answers as the built one,
    direct or hashed; the hashed slots are 32-bit below 2^26 items."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**min(bits, 12), n, dtype=np.uint64).reshape(-1, 1)
    ids = rng.permutation(n).astype(np.int64) * 3 - 7
    table = ItemTable.from_sorted(bits, *sort_items(codes, ids))
    assert table.slots.dtype == np.uint32  # direct or hashed: one type for the kernels
    loaded = ItemTable.from_arrays(bits, table.arrays(), table.meta())
    xq = np.concatenate([codes, rng.integers(0, 2**min(bits, 12), (20, 1), dtype=np.uint64)])
    for got in (table, loaded):
        hits = np.zeros(len(xq), dtype=np.int64)
        lims = np.zeros(len(xq) + 1, dtype=np.int64)
        _lookup_words(xq, 0, *got.lookup_args(), hits, lims, False, hits.copy())
        th, ts = position_twin(xq, table.words)
        assert (hits == th).all() and (lims[1:] == ts).all()


@settings(max_examples=120, deadline=None)
@given(codes=st.lists(_KEYS, max_size=150), split=st.integers(0, 150), seed=st.integers(0, 2**31))
def test_merge_sorted_matches_sorting_the_union(codes, split, seed):
    """Two (code, id)-sorted runs with disjoint ids merged in one pass equal the union sorted
    (the twin); ``sort_ids`` equals ``np.sort``."""
    n = len(codes)
    codes = np.array(codes, dtype=np.uint64)
    ids = np.random.default_rng(seed).permutation(4 * n + 1)[:n].astype(np.int64) - n
    a = naive.sort_codes_ids(codes[:split], ids[:split])
    b = naive.sort_codes_ids(codes[split:], ids[split:])
    out_c, out_i = radix.merge_sorted(*a, *b)
    twin_c, twin_i = naive.sort_codes_ids(codes, ids)
    assert (out_c == twin_c).all() and (out_i == twin_i).all()
    assert (radix.sort_ids(ids) == np.sort(ids)).all()


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([25, 40, 64, 128]), n=st.integers(0, 400), spread=st.integers(1, 40),
       seed=st.integers(0, 2**31))
def test_hashed_table_finds_every_code_and_no_other(bits, n, spread, seed):
    """Hashed slots (wrap-around included: small tables, clustered homes) find
    every bucket's code and nothing else (the twin: a dict of code -> bucket); the table's
    counts agree with the twin's, direct tables (16 bits) too."""
    from bucketsearch.index.table import find_bucket
    rng = np.random.default_rng(seed)
    W = (bits + 63) // 64
    top = 2**min(bits, 63)
    codes = rng.integers(0, min(top, 2**spread), (n, W), dtype=np.uint64)
    codes[:, 0] |= np.uint64(top >> 1) if bits < 64 and n % 2 else np.uint64(0)
    small = BucketTable.build(16, codes[:, :1] & np.uint64(0xFFFF), np.arange(n))
    assert small.direct and small.ntotal == n
    assert (np.sort(small.slots[small.slots >= 0]) == np.arange(small.distinct_codes)).all()
    table = BucketTable.build(bits, codes, np.arange(n))
    assert table.ntotal == n and table.bucket_sizes().sum() == n
    assert table.memory_bytes() == sum(a.nbytes for a in table.arrays().values())
    if table.direct:
        return
    twin = {tuple(c): b for b, c in enumerate(table.codes.tolist())}
    probes = np.concatenate([codes, rng.integers(0, min(top, 2**spread), (50, W),
                                                 dtype=np.uint64)])
    args = table.lookup_args()
    for q in probes:
        assert find_bucket(q, W, *args) == twin.get(tuple(q.tolist()), -1)
    assert (table.slots >= 0).sum() == table.distinct_codes


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), spread=st.integers(1, 20), seed=st.integers(0, 2**31),
       shuffled=st.booleans())
def test_mih_build_orders_positions_and_items(n, spread, seed, shuffled):
    """A multi-index build (counting sorts of 21- and 22-bit substrings visiting the positions
    in id order) keeps each table's positions ordered by (substring, id): each bucket's ids
    ascending, the exact kernel's runs (the twin: a lexsort of the substrings and ids of the
    code-sorted items)."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**spread, (n, 1), dtype=np.uint64) << np.uint64(64 - spread)
    ids = rng.permutation(3 * n + 1)[:n].astype(np.int64) if shuffled else np.arange(n)
    index = MultiIndex(64, substrings=3)
    index.add(words, ids)
    order = np.lexsort((index.ids, index.words[:, 0]))
    assert (order == np.arange(n)).all()  # the items by (code, id)
    subs = index.substring_codes(index.words)
    for j in range(3):
        want = np.lexsort((index.ids, subs[:, j]))
        assert (index.tables.rows(j) == want).all()
