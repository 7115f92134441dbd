"""The small-radius paths (issue 17) against brute force: the single table's resumable one-word
kernel (radius 0 by two passes, radius >= 1 by sphere enumeration) and multi-index hashing's
exact-substring plan (``R < m``: ``R + 1`` exact substring lookups, duplicates found by masks
instead of visit stamps), with their statistics, result cap, buffer growth and threads."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index import base, make_index
from bucketsearch.index.codes import unpack_words
from bucketsearch.index.mih import CLOCK_GROUP, MultiIndex, substring_ranges
from bucketsearch.index.probe import HammingIndex
from tests import naive


def _data(draw, bits, n, nq):
    """Codes with many duplicates and near-duplicates; queries from the codes, some flipped."""
    top = (1 << bits) - 1
    seeds = draw(st.lists(st.integers(0, top), min_size=1, max_size=6))
    values = []
    for _ in range(n):
        v = draw(st.sampled_from(seeds))
        for _ in range(draw(st.integers(0, 2))):
            v ^= 1 << draw(st.integers(0, bits - 1))
        values.append(v)
    xb = np.array(values, dtype=np.uint64).reshape(-1, 1)
    queries = [draw(st.sampled_from(seeds)) ^ (draw(st.integers(0, 3)) << draw(
        st.integers(0, max(bits - 2, 0)))) & top for _ in range(nq)]
    xq = np.array(queries, dtype=np.uint64).reshape(-1, 1)
    ids = np.array(draw(st.permutations(range(3 * n + 1)))[:n], dtype=np.int64)
    return xb, xq, ids


def _same(got, expected):
    lims, D, I = got[:3]
    el, eD, eI = expected
    assert (lims == el).all() and (D == eD).all() and (I == eI).all()


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([1, 5, 16, 17, 40, 63, 64]), n=st.integers(0, 60),
       nq=st.integers(1, 20), R=st.integers(0, 4), threads=st.sampled_from([1, 2]),
       data=st.data())
def test_single_table_word_kernel_matches_brute_force(bits, n, nq, R, threads, data):
    R = min(R, bits)
    xb, xq, ids = _data(data.draw, bits, n, nq)
    index = HammingIndex(bits)
    index.add(xb, ids)
    index.threads = threads
    expected = naive.range_search(xq, xb, ids, bits, R)
    _same(index.range_search(xq, R), expected)
    lims, D, I, st_ = index.range_search(xq, R, stats=True)
    _same((lims, D, I), expected)
    probes, nonempty, items = naive.per_radius_counts(xq, xb, bits, R) if n else (
        np.array([[math.comb(bits, r) for r in range(R + 1)]] * nq), np.zeros((nq, R + 1)),
        np.zeros((nq, R + 1)))
    assert (st_.probes == probes).all() and (st_.nonempty_buckets == nonempty).all()
    assert (st_.items == items).all() and (st_.empty_buckets == probes - nonempty).all()
    assert (st_.radii == R + 1).all() and (st_.scanned_from == -1).all()
    assert (st_.lookup_ns >= 0).all() and (st_.total_ns >= 0).all()


def _substring_counts(xq, xb, bits, m, R):
    """Per query and step j <= R: items equal to the query on substring j (candidates), and
    those not equal on any substring before j (unique candidates)."""
    starts, widths = substring_ranges(bits, m)
    qb, xbb = unpack_words(xq, bits).astype(bool), unpack_words(xb, bits).astype(bool)
    eq = np.stack([(qb[:, None, s:s + w] == xbb[None, :, s:s + w]).all(axis=2)
                   for s, w in zip(starts, widths)], axis=2)  # (nq, n, m)
    cands = eq[:, :, :R + 1].sum(axis=1)
    first = np.cumsum(eq, axis=2) == 1
    unique = (eq & first)[:, :, :R + 1].sum(axis=1)
    return cands, unique


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([4, 16, 33, 63, 64]), m=st.integers(1, 6), n=st.integers(0, 60),
       nq=st.integers(1, 20), threads=st.sampled_from([1, 2]), data=st.data())
def test_mih_exact_substring_plan_matches_brute_force(bits, m, n, nq, threads, data):
    m = min(m, bits)
    R = data.draw(st.integers(0, m - 1))  # the exact-substring plan: every substring at 0
    xb, xq, ids = _data(data.draw, bits, n, nq)
    index = MultiIndex(bits, substrings=m)
    index.add(xb, ids)
    index.threads = threads
    expected = naive.range_search(xq, xb, ids, bits, R)
    _same(index.range_search(xq, R), expected)
    lims, D, I, st_ = index.range_search(xq, R, stats=True)
    _same((lims, D, I), expected)
    assert (st_.probes == 1).all()
    cands, unique = _substring_counts(xq, xb, bits, m, R)
    assert (st_.candidates == cands).all() and (st_.unique_candidates == unique).all()
    items = np.array([[(D[lims[q]:lims[q + 1]] == r).sum() for r in range(R + 1)]
                      for q in range(nq)])
    assert (st_.items == items).all()
    assert (st_.nonempty_buckets == (cands > 0)).all()


# the result cap, the buffer growth and the scratch growth: tests/test_kernels.py (they run in
# `make coverage-kernels` too)


@pytest.mark.parametrize("mode", ["single", "mih", "auto", "scan"])
def test_queries_in_any_layout_and_after_rebuild_and_load(tmp_path, mode):
    """Without statistics, C-contiguous writable queries run through the kernels' compiled
    entries (:func:`bucketsearch.index._jit.compiled_entry`, kept with the table's arguments);
    read-only
    and strided queries through numba's dispatcher. Both answer alike, one query at a time and
    in batches, after an add (new arguments) and from a memory-mapped snapshot (read-only
    table arrays: other types, other entries)."""
    rng = np.random.default_rng(3)
    bits = 64
    xb = rng.integers(0, 1 << 63, (3000, 1), dtype=np.uint64)
    xb[1500:] = xb[:1500] ^ (np.uint64(1) << rng.integers(0, bits, (1500, 1)).astype(np.uint64))
    index = make_index(bits, mode)
    index.add(xb[:2000])
    index.threads = 1
    xq = np.ascontiguousarray(xb[::50])
    read_only = xq.copy()
    read_only.flags.writeable = False
    strided = np.repeat(xq, 2, axis=0)[::2]
    assert not strided.flags.c_contiguous

    def check(ix, ids):
        for R in (0, 1, 2):
            expected = naive.range_search(xq, xb[ids], ids, bits, R)
            for queries in (xq, read_only, strided):
                _same(ix.range_search(queries, R), expected)
                for q in range(0, len(xq), 7):
                    one = ix.range_search(queries[q:q + 1], R)
                    lo, hi = expected[0][q], expected[0][q + 1]
                    assert (one[2] == expected[2][lo:hi]).all()
                    assert (one[1] == expected[1][lo:hi]).all()

    check(index, np.arange(2000))
    index.add(xb[2000:], np.arange(2000, 3000))
    check(index, np.arange(3000))
    index.save(tmp_path / "ix")
    check(type(index).load(tmp_path / "ix", mmap=True), np.arange(3000))


def test_mih_exact_scratch_too_small_is_grown():
    """The exact-substring kernel's run bounds and its block's lookups (``2 * (R + 2) + 2 *
    (R + 1) * CLOCK_GROUP`` entries) live in the thread's ``hits`` scratch: when it is shorter
    the kernel asks for more and the search resumes."""
    rng = np.random.default_rng(4)
    xb = rng.integers(0, 1 << 40, (500, 1), dtype=np.uint64)
    index = MultiIndex(40, substrings=3)
    index.add(xb)
    index.threads = 1
    xq = xb[::10] ^ np.uint64(1)
    buf = base._BUFFERS
    buf.hits = np.empty(1, dtype=np.int64)
    buf.all = (buf.d, buf.i, buf.hits)  # (as grow_hits: the short way reads the three at once)
    _same(index.range_search(xq, 2), naive.range_search(xq, xb, np.arange(500), 40, 2))
    assert len(base._BUFFERS.hits) >= 2 * 4 + 2 * 3 * CLOCK_GROUP
