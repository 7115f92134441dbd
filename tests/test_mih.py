"""Multi-index hashing against the linear scan and a numpy twin of its per-step counts."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.codes import pack_bits, unpack_words
from bucketsearch.index.mih import (MIHProbeLimitError, MultiIndex, default_substrings,
                                    min_substrings, step_probe_counts, substring_ranges)
from bucketsearch.index.probe import ProbeLimitError
from bucketsearch.index.scan import LinearScan
from tests import naive

BITS = [16, 32, 48, 64, 128, 256]
RADII = range(9)


def make_data(bits, n, nq, seed, clustered=True):
    """Codes (clustered: a few centres with 0-2 flipped bits, so duplicates and near neighbours;
    or uniform), shuffled ids, queries near database codes (0-3 flips) and a third at random."""
    rng = np.random.default_rng(seed)
    if clustered:
        pool = rng.integers(0, 2, (max(1, n // 4), bits)).astype(np.uint8)
        xb = pool[rng.integers(0, len(pool), n)]
        xb = (xb ^ (rng.random(xb.shape) < 1.0 / bits)).astype(np.uint8)
    else:
        xb = rng.integers(0, 2, (n, bits)).astype(np.uint8)
    ids = (rng.permutation(10 * n + 1)[:n] - 3).astype(np.int64)
    src = xb[rng.integers(0, n, nq)] if n else rng.integers(0, 2, (nq, bits)).astype(np.uint8)
    xq = src.copy()
    for row in xq:
        row[rng.choice(bits, size=int(rng.integers(0, 4)), replace=False)] ^= 1
    xq[: nq // 3] = rng.integers(0, 2, (nq // 3, bits))
    words = pack_bits(xb) if n else np.empty((0, (bits + 63) // 64), np.uint64)
    return words, ids, pack_bits(xq)


def substring_distances(xq, xb, bits, m):
    """(nq, nb, m) Hamming distances per substring, from unpacked bits (no index code)."""
    starts, widths = substring_ranges(bits, m)
    q = unpack_words(xq, bits).astype(bool)
    b = unpack_words(xb, bits).astype(bool)
    diff = q[:, None, :] != b[None, :, :]
    return np.stack([diff[:, :, s:s + w].sum(axis=2) for s, w in zip(starts, widths)], axis=2)


def twin_step_counts(xq, xb, bits, m, max_radius):
    """Per query and radius step R (substring j = R mod m probed to s = floor(R/m)): probes
    C(w_j, s), non-empty substring buckets (distinct substring-j codes at distance exactly s),
    candidates (items whose substring j is at distance exactly s) and unique candidates (items
    whose first visit min_j (m d_j + j) is R)."""
    starts, widths = substring_ranges(bits, m)
    sub = substring_distances(xq, xb, bits, m)
    first = (m * sub + np.arange(m)[None, None, :]).min(axis=2) if len(xb) else \
        np.zeros((len(xq), 0), dtype=int)
    nq = len(xq)
    out = {name: np.zeros((nq, max_radius + 1), dtype=np.int64)
           for name in ("probes", "nonempty", "candidates", "unique")}
    for R in range(max_radius + 1):
        j, s = R % m, R // m
        out["probes"][:, R] = math.comb(int(widths[j]), s)
        out["candidates"][:, R] = (sub[:, :, j] == s).sum(axis=1)
        out["unique"][:, R] = (first == R).sum(axis=1)
        if len(xb):
            bits_j = unpack_words(xb, bits)[:, starts[j]:starts[j] + widths[j]]
            codes_j = np.unique(bits_j, axis=0)
            qj = unpack_words(xq, bits)[:, starts[j]:starts[j] + widths[j]]
            dj = (qj[:, None, :] != codes_j[None, :, :]).sum(axis=2)
            out["nonempty"][:, R] = (dj == s).sum(axis=1)
    return out


def check_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert np.array_equal(np.asarray(x), np.asarray(y))


def build(bits, xb, ids, m=None, **kw):
    index = MultiIndex(bits, substrings=m, **kw)
    if len(xb):
        index.add(xb, ids)
    return index


def cheap_substrings(bits, budget=50_000):
    """Fewest substrings whose radius-8 search probes at most ``budget`` buckets."""
    m = min_substrings(bits)
    while sum(step_probe_counts(substring_ranges(bits, m)[1], 8)) > budget:
        m += 1
    return m


def substrings_strategy(bits):
    return st.one_of(st.none(), st.integers(cheap_substrings(bits), min(bits, 9)))


def index_and_scan(bits, n, seed, clustered, m):
    """Six queries, a MultiIndex with ``m`` substrings and its LinearScan twin on the same data."""
    xb, ids, xq = make_data(bits, n, 6, seed, clustered)
    scan = LinearScan(bits)
    if n:
        scan.add(xb, ids)
    return xb, ids, xq, build(bits, xb, ids, m), scan


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 50), seed=st.integers(0, 2**31),
       clustered=st.booleans(), data=st.data())
def test_range_search_matches_scan(bits, n, seed, clustered, data):
    xb, ids, xq, index, scan = index_and_scan(bits, n, seed, clustered,
                                              data.draw(substrings_strategy(bits)))
    for R in RADII:
        check_same(index.range_search(xq, R), scan.range_search(xq, R))


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 50), seed=st.integers(0, 2**31),
       clustered=st.booleans(), k=st.sampled_from([1, 3, 10, 60]), data=st.data())
def test_knn_matches_scan(bits, n, seed, clustered, k, data):
    xb, ids, xq, index, scan = index_and_scan(bits, n, seed, clustered,
                                              data.draw(substrings_strategy(bits)))
    check_same(index.search(xq, k), scan.search(xq, k))
    D, I = index.search(xq, k)
    nD, nI = naive.knn(xq, xb, ids, bits, k) if n else (np.full((6, k), -1), np.full((6, k), -1))
    assert np.array_equal(D, nD) and np.array_equal(I, nI)


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 50), seed=st.integers(0, 2**31),
       clustered=st.booleans(), k=st.sampled_from([1, 3, 10, 60]), data=st.data())
def test_top_k_within_radius_matches_brute_force(bits, n, seed, clustered, k, data):
    """search(k, max_distance) stops at the radius step max_distance (stats.radii) and gives
    the k nearest with d <= max_distance, padded with -1 (also after a switch to the scan)."""
    xb, ids, xq, index, scan = index_and_scan(bits, n, seed, clustered,
                                              data.draw(substrings_strategy(bits)))
    R = data.draw(st.integers(0, bits))
    D, I, stats = index.search(xq, k, max_distance=R, stats=True)
    nD, nI = naive.knn_within(xq, xb, ids, bits, k, R) if n else \
        (np.full((6, k), -1), np.full((6, k), -1))
    assert np.array_equal(D, nD) and np.array_equal(I, nI)
    assert (stats.radii <= R + 1).all() and stats.candidates is not None
    check_same((D, I), scan.search(xq, k, max_distance=R))


@settings(max_examples=25, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 40), seed=st.integers(0, 2**31),
       data=st.data())
def test_per_step_statistics_match_twin(bits, n, seed, data):
    m = data.draw(substrings_strategy(bits))
    xb, ids, xq = make_data(bits, n, 5, seed)
    index = build(bits, xb, ids, m)
    R = 8
    lims, D, I, stats = index.range_search(xq, R, stats=True)
    twin = twin_step_counts(xq, xb, bits, index.substrings, R)
    assert np.array_equal(stats.probes, twin["probes"])
    assert np.array_equal(stats.nonempty_buckets, twin["nonempty"])
    assert np.array_equal(stats.empty_buckets, twin["probes"] - twin["nonempty"])
    assert np.array_equal(stats.candidates, twin["candidates"])
    assert np.array_equal(stats.unique_candidates, twin["unique"])
    for q in range(len(xq)):  # items per radius = results at exactly that distance
        d = D[lims[q]:lims[q + 1]]
        assert [int((d == r).sum()) for r in range(R + 1)] == stats.items[q].tolist()
    assert (stats.radii == R + 1).all()
    assert (stats.lookup_ns >= 0).all() and (stats.total_ns > 0).all()
    rec = stats.per_query(0)
    assert len(rec) == R + 1 and {"candidates", "unique_candidates"} <= set(rec[0])
    assert index.probe_count(R) == int(stats.probes[0].sum())


def test_tight_rule_probe_counts():
    # Q = 64, m = 3 (22, 21, 21 bits): radius 4 = 3*1 + 1 -> substrings 0, 1 to radius 1,
    # substring 2 to radius 0: (1 + 22) + (1 + 21) + 1 = 46 probes
    starts, widths = substring_ranges(64, 3)
    assert widths.tolist() == [22, 21, 21] and starts.tolist() == [0, 22, 43]
    assert step_probe_counts(widths, 4) == [1, 1, 1, 22, 21]
    index = MultiIndex(64, substrings=3)
    assert index.probe_count(4) == 46
    # exact Python ints, far beyond int64
    # (m = 4 substrings of 64 bits, R = 256: substring 0 to radius 64, the others to 63)
    big = MultiIndex(256, substrings=4)
    assert big.probe_count(256) == 4 * 2**64 - 3
    assert isinstance(big.probe_count(200), int)


def test_default_substrings_follow_norouzi():
    assert default_substrings(64, 1_000_000) == 3     # 64 / 19.9
    assert default_substrings(32, 1_000_000) == 2
    assert default_substrings(64, 10_000_000) == 3    # 64 / 23.3
    assert default_substrings(256, 1_000_000) == 13
    assert default_substrings(256, 10) == 32          # log2 N floored at 8
    assert default_substrings(200, 2) == 25
    assert min_substrings(256) == 4 and default_substrings(256, 2**40) == 6


@pytest.mark.parametrize("bits", [16, 64, 128, 256])
def test_duplicates_empty_and_single_item(bits):
    empty = MultiIndex(bits)
    xq = make_data(bits, 3, 4, 1)[2]
    lims, D, I, stats = empty.range_search(xq, 8, stats=True)
    assert lims.tolist() == [0] * 5 and len(I) == 0
    D, I = empty.search(xq, 3)
    assert (I == -1).all() and (D == -1).all()
    one = MultiIndex(bits)
    one.add(xq[:1], [42])
    lims, D, I = one.range_search(xq[:1], 0)
    assert I.tolist() == [42] and D.tolist() == [0]
    dup = MultiIndex(bits, substrings=min_substrings(bits) + 1)
    dup.add(np.repeat(xq[:2], 5, axis=0), np.arange(10)[::-1])
    lims, D, I = dup.range_search(xq[:1], 0)
    assert I.tolist() == [5, 6, 7, 8, 9]  # ids 9..5 hold query 0's code: sorted by id
    D, I = dup.search(xq[:1], 7)
    assert I[0, :5].tolist() == [5, 6, 7, 8, 9] and D[0, :5].tolist() == [0] * 5


def test_add_remove_and_threads():
    bits = 64
    xb, ids, xq = make_data(bits, 400, 40, 3)
    index = MultiIndex(bits, substrings=4)
    index.add(xb[:200], ids[:200])
    index.add(xb[200:], ids[200:])
    assert index.remove(ids[:50].tolist() + [10**9]) == 50
    scan = LinearScan(bits)
    scan.add(xb[50:], ids[50:])
    for threads in (1, 2):
        index.threads = threads  # 40 queries: two chunks, two stamp arrays
        for R in (0, 3, 8):
            check_same(index.range_search(xq, R), scan.range_search(xq, R))
        check_same(index.search(xq, 7), scan.search(xq, 7))
    with pytest.raises(ValueError, match="already in the index"):
        index.add(xb[:1], ids[60:61])


def test_visit_bits_are_cleared_after_an_overflowing_query():
    """A query of the general kernel with more unique candidates than its buffer (4,096: the
    bitset cleared whole, the query searched again), then others: exact, and the bitset
    returned to the pool is all zero."""
    bits = 24
    rng = np.random.default_rng(2)
    xb = np.full((9000, 1), 0xABCDEF, dtype=np.uint64)
    xb[::2, 0] ^= np.uint64(1) << rng.integers(0, bits, 4500).astype(np.uint64)
    index = MultiIndex(bits, substrings=2)
    index.add(xb)
    index.threads = 1
    scan = LinearScan(bits)
    scan.add(xb)
    xq = np.array([[0xABCDEF], [0], [0xABCDEF ^ 3], [123]], dtype=np.uint64)
    for _ in range(2):
        check_same(index.range_search(xq, 3), scan.range_search(xq, 3))
        # brute force, not the scan: LinearScan.search(k=5000) returns 4,096 of them here
        check_same(index.search(xq, 5000), naive.knn(xq, xb, np.arange(9000), bits, 5000))
    visited = index._visits.arrays()
    assert visited and all(not v.any() for v in visited)
    assert index.memory_bytes() >= index.words.nbytes + index.ids.nbytes + visited[0].nbytes


def test_visit_bits_survive_many_queries():
    """The visit bits are cleared after every query: results stay exact over thousands."""
    bits = 32
    xb, ids, _ = make_data(bits, 300, 1, 5)
    index = build(bits, xb, ids, 2)
    scan = LinearScan(bits)
    scan.add(xb, ids)
    xq = make_data(bits, 300, 3000, 6)[2]
    index.threads = 1
    for _ in range(3):
        check_same(index.range_search(xq, 5), scan.range_search(xq, 5))


def test_probe_limit_range_raises_and_knn_switches_to_scan():
    bits = 64
    xb, ids, xq = make_data(bits, 300, 6, 9, clustered=False)
    index = build(bits, xb, ids, 2, max_probes=100)
    with pytest.raises(MIHProbeLimitError) as err:
        index.range_search(xq, 8)
    assert isinstance(err.value, ProbeLimitError) and err.value.probes == index.probe_count(8)
    assert "max_probes=100" in str(err.value)
    scan = LinearScan(bits)
    scan.add(xb, ids)
    D, I, stats = index.search(xq, 5, stats=True)
    sD, sI = scan.search(xq, 5)
    assert np.array_equal(D, sD) and np.array_equal(I, sI)
    assert (stats.scanned_from >= 0).any()


def test_invalid_arguments():
    with pytest.raises(ValueError, match=r"substrings must be in \[4, 256\]"):
        MultiIndex(256, substrings=3)
    with pytest.raises(ValueError, match=r"substrings must be in \[1, 16\]"):
        MultiIndex(16, substrings=17)
    with pytest.raises(TypeError, match="substrings must be an int"):
        MultiIndex(16, substrings=2.0)
    with pytest.raises(ValueError, match="max_probes"):
        MultiIndex(16, max_probes=0)
    index = MultiIndex(16)
    with pytest.raises(ValueError, match=r"max_distance must be in \[0, 16\]"):
        index.range_search(np.zeros((1, 16), np.uint8), 17)


@pytest.mark.parametrize("bits", [32, 100, 256])
@pytest.mark.parametrize("mmap", [False, True])
def test_save_load_identical(tmp_path, bits, mmap):
    xb, ids, xq = make_data(bits, 120, 8, 4)
    index = build(bits, xb, ids, None)
    index.save(tmp_path / "mih")
    loaded = MultiIndex.load(tmp_path / "mih", mmap=mmap)
    assert loaded.substrings == index.substrings and loaded.ntotal == 120
    for R in (0, 2, 6):
        check_same(loaded.range_search(xq, R), index.range_search(xq, R))
    check_same(loaded.search(xq, 9), index.search(xq, 9))
    if not mmap:  # a loaded index can be extended
        loaded.add(xb[:1] ^ np.uint64(1), [10**6])
        assert loaded.ntotal == 121
