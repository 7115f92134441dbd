"""The small-radius paths (issue 17) against brute force: the single table's resumable one-word
kernel (radius 0 by two passes, radius >= 1 by sphere enumeration) and multi-index hashing's
exact-substring plan (``R < m``: ``R + 1`` exact substring lookups, duplicates found by masks
instead of visit stamps), with their statistics, result cap, buffer growth and threads."""
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.codes import unpack_words
from bucketsearch.index.mih import MultiIndex, substring_ranges
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
