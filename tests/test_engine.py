"""Property tests: HammingIndex (bucket probing) and LinearScan against the numpy twins."""
import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.base import OUTPUT_BUFFER_START, OUTPUT_BUFFERS
from bucketsearch.index.codes import pack_bits
from bucketsearch.index.probe import HammingIndex, ProbeLimitError
from bucketsearch.index.scan import LinearScan
from tests import naive

BITS = [1, 7, 8, 13, 31, 32, 63, 64, 65, 100, 128, 256]
TEST_MAX_PROBES = 200_000


def make_data(bits, n, nq, seed):
    """Codes with duplicates and near neighbours, ids shuffled (not in code order), queries
    near database codes (0-2 flips) and at random."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 2, (max(1, n // 3), bits)).astype(np.uint8)
    xb = pool[rng.integers(0, len(pool), n)]
    flips = rng.random(xb.shape) < 1.5 / bits
    xb = (xb ^ flips).astype(np.uint8)
    ids = rng.permutation(10 * n + 1)[:n].astype(np.int64) - 3
    src = xb[rng.integers(0, n, nq)] if n else rng.integers(0, 2, (nq, bits)).astype(np.uint8)
    xq = src.copy()
    for row in xq:
        row[rng.choice(bits, size=min(bits, int(rng.integers(0, 3))), replace=False)] ^= 1
    xq[: nq // 3] = rng.integers(0, 2, (nq // 3, bits))
    return pack_bits(xb) if n else np.empty((0, (bits + 63) // 64), np.uint64), ids, pack_bits(xq)


def max_radius_for(bits, budget=TEST_MAX_PROBES):
    r = 0
    while r < min(bits, 4) and sum(math.comb(bits, i) for i in range(r + 2)) <= budget:
        r += 1
    return r


def build(cls, bits, xb, ids):
    index = cls(bits, max_probes=TEST_MAX_PROBES) if cls is HammingIndex else cls(bits)
    if len(xb):
        index.add(xb, ids)
    return index


@pytest.mark.parametrize("cls", [HammingIndex, LinearScan])
@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 60), seed=st.integers(0, 2**31))
def test_range_search_matches_brute_force(cls, bits, n, seed):
    xb, ids, xq = make_data(bits, n, 6, seed)
    index = build(cls, bits, xb, ids)
    previous = None
    for R in range(max_radius_for(bits) + 1):
        lims, D, I = index.range_search(xq, R)
        nl, nD, nI = naive.range_search(xq, xb, ids, bits, R)
        assert (lims == nl).all() and (D == nD).all() and (I == nI).all()
        for q in range(len(xq)):  # results never shrink as the radius grows, no duplicates
            got = set(I[lims[q]:lims[q + 1]])
            assert len(got) == lims[q + 1] - lims[q]
            if previous is not None:
                assert previous[q] <= got
        previous = [set(I[lims[q]:lims[q + 1]]) for q in range(len(xq))]


@pytest.mark.parametrize("cls", [HammingIndex, LinearScan])
@pytest.mark.parametrize("bits", [64, 128])
def test_knn_with_k_past_the_scan_buffer(cls, bits):
    """k larger than the scan's first buffer (4,096 kept items): every neighbour is kept (the
    buffer's compaction once dropped items it had never stored: 3,881 of k = 5,000)."""
    xb, ids, xq = make_data(bits, 9000, 3, 7)
    index = build(cls, bits, xb, ids)
    for k in (4095, 4096, 4097, 5000, 9000):
        nD, nI = naive.knn(xq, xb, ids, bits, k)
        D, I = index.search(xq, k)
        assert (D == nD).all() and (I == nI).all(), k


@pytest.mark.parametrize("cls", [HammingIndex, LinearScan])
@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 60), k=st.integers(1, 12),
       seed=st.integers(0, 2**31))
def test_knn_matches_brute_force(cls, bits, n, k, seed):
    xb, ids, xq = make_data(bits, n, 6, seed)
    index = build(cls, bits, xb, ids)
    nD, nI = naive.knn(xq, xb, ids, bits, k)
    D, I = index.search(xq, k)
    assert (D == nD).all() and (I == nI).all()


@pytest.mark.parametrize("cls", [HammingIndex, LinearScan])
@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 60), k=st.integers(1, 12),
       seed=st.integers(0, 2**31), data=st.data())
def test_top_k_within_radius_matches_brute_force(cls, bits, n, k, seed, data):
    """search(k, max_distance): the k nearest with d <= max_distance, padded with -1."""
    xb, ids, xq = make_data(bits, n, 6, seed)
    index = build(cls, bits, xb, ids)
    R = data.draw(st.integers(0, bits))
    D, I, st_ = index.search(xq, k, max_distance=R, stats=True)
    nD, nI = naive.knn_within(xq, xb, ids, bits, k, R)
    assert (D == nD).all() and (I == nI).all()
    assert (st_.radii <= R + 1).all()  # the kernel never searched past max_distance
    D_all, I_all = index.search(xq, k)
    assert (I[I >= 0] == I_all[I >= 0]).all()  # a prefix of the unbounded k-NN answer


def test_top_k_within_radius_probes_only_to_the_radius():
    """The probing kernel stops at max_distance: no radius past it is probed, and a query
    with nothing that close gets a padded row after probing radii 0..R only."""
    bits = 32
    xb, ids, _ = make_data(bits, 50, 1, 5)
    index = build(HammingIndex, bits, xb, ids)
    far = xb[:1] ^ np.uint64(0xFFFF0000)  # 16 bits away from item 0, far from the rest
    D, I, st_ = index.search(far, 5, max_distance=1, stats=True)
    assert (I == -1).all() and (D == -1).all() and st_.radii[0] == 2
    assert st_.probes[0].tolist() == [1, bits] and st_.scanned_from[0] == -1
    # radius 2 probes C(32, 2) = 496 > 50 distinct codes: ranked by a scan, still only to R
    D, I, st_ = index.search(far, 5, max_distance=3, stats=True)
    assert (I == -1).all() and st_.radii[0] == 4 and st_.scanned_from[0] == 2
    with pytest.raises(ValueError, match=r"max_distance must be in \[0, 32\], got 33"):
        index.search(far, 5, max_distance=33)


@settings(max_examples=30, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(1, 60), k=st.integers(1, 12),
       seed=st.integers(0, 2**31))
def test_knn_scan_fallback_is_exact_and_recorded(bits, n, k, seed):
    """k-NN switches to ranking the distinct codes when a radius costs more probes than there
    are codes (or passes max_probes): still exact, and the statistics say where."""
    xb, ids, xq = make_data(bits, n, 6, seed)
    index = build(HammingIndex, bits, xb, ids)
    D, I, st_ = index.search(xq, k, stats=True)
    nD, nI = naive.knn(xq, xb, ids, bits, k)
    assert (D == nD).all() and (I == nI).all()
    dist = naive.hamming_matrix(xq, xb, bits)
    for q in range(len(xq)):
        s = st_.scanned_from[q]
        spent = 0
        for r in range(st_.radii[q]):
            if s < 0 or r < s:  # probed radius: exact C(Q, r)
                assert st_.probes[q, r] == math.comb(bits, r)
                spent += math.comb(bits, r)
            else:
                assert st_.probes[q, r] == 0
            assert st_.items[q, r] == (dist[q] == r).sum()
            assert st_.nonempty_buckets[q, r] == len(np.unique(xb[dist[q] == r], axis=0))
        if s >= 0:  # the switch happened for one of the two documented reasons
            assert (spent + math.comb(bits, s) > TEST_MAX_PROBES
                    or math.comb(bits, s) > len(np.unique(xb, axis=0)))


@settings(max_examples=30, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 40), seed=st.integers(0, 2**31))
def test_per_radius_counts_match_twin(bits, n, seed):
    xb, ids, xq = make_data(bits, n, 4, seed)
    index = build(HammingIndex, bits, xb, ids)
    R = max_radius_for(bits)
    lims, D, I, st_ = index.range_search(xq, R, stats=True)
    probes, nonempty, items = naive.per_radius_counts(xq, xb, bits, R) if n else (
        np.array([[math.comb(bits, r) for r in range(R + 1)]] * len(xq)),
        np.zeros((len(xq), R + 1), int), np.zeros((len(xq), R + 1), int))
    assert (st_.probes == probes).all()
    assert (st_.nonempty_buckets == nonempty).all()
    assert (st_.empty_buckets == probes - nonempty).all()
    assert (st_.items == items).all()
    assert (st_.lookup_ns >= 0).all() and (st_.total_ns >= st_.lookup_ns.sum(axis=1)).all()
    assert (st_.radii == R + 1).all()
    assert st_.per_query(0)[R]["probes"] == math.comb(bits, R)


def test_knn_stats_record_the_radii_searched():
    bits = 16
    xb, ids, xq = make_data(bits, 50, 5, 3)
    index = build(HammingIndex, bits, xb, ids)
    D, I, st_ = index.search(xq, 3, stats=True)
    for q in range(len(xq)):
        assert st_.radii[q] == D[q].max() + 1  # stops after the radius of the k-th item
        assert st_.items[q, :st_.radii[q]].sum() >= 3


@pytest.mark.parametrize("bits, radius", [(128, 4), (256, 4), (64, 4)])
def test_largest_balls_exact(bits, radius):
    xb, ids, xq = make_data(bits, 200, 2, 11)
    index = HammingIndex(bits, max_probes=10**9)
    index.add(xb, ids)
    lims, D, I, st_ = index.range_search(xq[1:], radius, stats=True)
    nl, nD, nI = naive.range_search(xq[1:], xb, ids, bits, radius)
    assert (lims == nl).all() and (I == nI).all()
    assert st_.probes[0].tolist() == [math.comb(bits, r) for r in range(radius + 1)]


@settings(max_examples=25, deadline=None)
@given(nq=st.integers(1, 40), pool=st.integers(1, 4), R=st.integers(0, 2),
       seed=st.integers(0, 2**31))
def test_short_way_matches_brute_force_past_a_full_buffer(nq, pool, R, seed):
    """The short way of a 64-bit range search (HammingIndex.range_search on the calling
    thread: _range_word_small) against the twin; 3,000 items on a few codes, so a batch's
    results pass the thread's 4,096-entry buffer and the queries left run the resumable way
    (_range_rest)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**63, pool, dtype=np.uint64)
    xb = codes[rng.integers(0, pool, 3000)].reshape(-1, 1)
    xb[::7, 0] ^= np.uint64(1) << rng.integers(0, 64, len(xb[::7]), dtype=np.uint64)
    ids = rng.permutation(3000).astype(np.int64) * 2 - 5
    xq = np.where(rng.random((nq, 1)) < 0.5, xb[rng.integers(0, 3000, (nq, 1)), 0],
                  rng.integers(0, 2**63, (nq, 1), dtype=np.uint64))
    index = HammingIndex(64)
    index.add(xb, ids)
    index.threads = 1
    OUTPUT_BUFFERS.__init__()  # the start size, whatever earlier searches grew them to
    assert len(OUTPUT_BUFFERS.i) == OUTPUT_BUFFER_START
    lims, D, I = index.range_search(xq, R)
    nl, nD, nI = naive.range_search(xq, xb, ids, 64, R)
    assert (lims == nl).all() and (D == nD).all() and (I == nI).all()
    assert D.dtype == np.int32 and I.dtype == np.int64 and lims.dtype == np.int64


def test_short_way_keeps_a_lowered_probe_limit():
    """The short way's radius bound follows max_probes, also on a shallow copy given a lower
    limit (the server's per-request limit)."""
    index = HammingIndex(64)
    index.add(np.arange(10, dtype=np.uint64).reshape(-1, 1))
    q = np.array([[3]], dtype=np.uint64)
    low = copy.copy(index)
    low.max_probes = 64
    with pytest.raises(ProbeLimitError, match="probes 65 buckets"):
        low.range_search(q, 1)
    assert low.range_search(q, 0)[2].tolist() == [3]
    assert sorted(index.range_search(q, 1)[2].tolist()) == [1, 2, 3, 7]


def test_probe_guard_reports_the_count():
    index = HammingIndex(64, max_probes=40_000)
    index.add(pack_bits(np.zeros((1, 64), np.uint8)))
    index.range_search(pack_bits(np.zeros((1, 64), np.uint8)), 2)
    with pytest.raises(ProbeLimitError, match="probes 43,745 buckets") as err:
        index.range_search(pack_bits(np.zeros((1, 64), np.uint8)), 3)
    assert err.value.probes == 43_745 and isinstance(err.value, ValueError)


@pytest.mark.parametrize("cls", [HammingIndex, LinearScan])
def test_save_load_identical(cls, tmp_path):
    xb, ids, xq = make_data(32, 500, 20, 5)
    index = cls(32, max_probes=10**9) if cls is HammingIndex else cls(32)
    index.add(xb, ids)
    index.save(tmp_path / "snap")
    for mmap in (False, True):
        loaded = cls.load(tmp_path / "snap", mmap=mmap)
        for a, b in zip(index.range_search(xq, 3), loaded.range_search(xq, 3)):
            assert (a == b).all()
        for a, b in zip(index.search(xq, 5), loaded.search(xq, 5)):
            assert (a == b).all()


def test_add_remove_and_ids():
    index = HammingIndex(8)
    index.add([[0] * 8, [1] * 8])
    assert sorted(index.ids) == [0, 1]
    index.add([[1, 0, 0, 0, 0, 0, 0, 0]], ids=[7])
    with pytest.raises(ValueError, match="id 7 is already in the index"):
        index.add([[0] * 8], ids=[7])
    with pytest.raises(ValueError, match="id 3 appears more than once"):
        index.add([[0] * 8, [0] * 8], ids=[3, 3])
    assert index.remove([7, 99]) == 1
    assert index.ntotal == 2
    D, I = index.search([[1, 0, 0, 0, 0, 0, 0, 0]], 3)
    assert I.tolist() == [[0, 1, -1]] and D.tolist() == [[1, 7, -1]]


def test_parallel_batches_equal_serial():
    xb, ids, xq = make_data(32, 3000, 200, 9)
    index = build(HammingIndex, 32, xb, ids)
    index.threads = 1
    serial = index.range_search(xq, 2)
    index.threads = 4
    for a, b in zip(serial, index.range_search(xq, 2)):
        assert (a == b).all()


@pytest.mark.parametrize("bad, message", [
    (dict(max_distance=-1), "max_distance must be in [0, 16], got -1"),
    (dict(max_distance=17), "max_distance must be in [0, 16], got 17"),
    (dict(max_distance=1.5), "max_distance must be an int"),
])
def test_bad_radius(bad, message):
    index = HammingIndex(16)
    with pytest.raises((ValueError, TypeError)) as err:
        index.range_search([[0] * 16], **bad)
    assert message in str(err.value)


def test_bad_queries_and_k():
    index = HammingIndex(16)
    with pytest.raises(ValueError, match="queries: codes have 8 columns but bits=16"):
        index.range_search([[0] * 8], 1)
    with pytest.raises(ValueError, match="k must be a positive int, got 0"):
        index.search([[0] * 16], 0)
