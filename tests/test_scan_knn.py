"""The blocked k-NN scan of one-word codes (index/scan.py, ``_knn_word_kernel``) against brute
force, and its two steps (the vectorized block distances, the keep step with its running
cut-off, SWAR test and compaction) against plain-python twins."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.scan import (KNN_ITEM_BLOCK, KNN_QUERY_BLOCK, LinearScan,
                                     _block_distances, _keep_within, _knn_word_kernel)
from tests import naive


def one_word_data(bits, n, nq, seed, pool):
    """``n`` codes drawn from ``pool`` distinct random codes (ties when the pool is small),
    each with a random bit flipped at times; ids a shuffle (not in code order); queries near
    database codes and at random."""
    rng = np.random.default_rng(seed)
    top = np.uint64((1 << bits) - 1) if bits < 64 else np.uint64(2**64 - 1)
    codes = rng.integers(0, 2**63, max(pool, 1), dtype=np.int64).astype(np.uint64) & top
    xb = codes[rng.integers(0, len(codes), n)]
    flip = rng.random(n) < 0.3
    xb[flip] ^= np.uint64(1) << rng.integers(0, bits, flip.sum()).astype(np.uint64)
    ids = rng.permutation(3 * n + 1)[:n].astype(np.int64)
    xq = rng.integers(0, 2**63, nq, dtype=np.int64).astype(np.uint64) & top
    if n:
        near = xb[rng.integers(0, n, nq // 2)]
        xq[:nq // 2] = near ^ (np.uint64(1) << rng.integers(0, bits, nq // 2).astype(np.uint64))
    return xb.reshape(-1, 1), ids, xq.reshape(-1, 1)


def twin_keep(dist, tau, k, kept_d, cnt, within):
    """The keep step, plainly: every distance ``<= tau`` (in order) is kept and counted; after
    each, ``tau`` drops while at least ``k`` counted items lie strictly below it. Returns the
    new ``(tau, within)``; ``kept_d`` (a list of (distance, index)) and ``cnt`` grow."""
    for i, d in enumerate(int(x) for x in dist):
        if d > tau:
            continue
        kept_d.append((d, i))
        cnt[d] += 1
        within += 1
        while tau > 0 and within - cnt[tau] >= k:
            within -= cnt[tau]
            tau -= 1
    return tau, within


@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.integers(0, 2**64 - 1), min_size=0, max_size=70),
       q=st.integers(0, 2**64 - 1))
def test_block_distances_match_popcount(words, q):
    codes = np.array(words, dtype=np.uint64)
    dist = np.full(72, 255, dtype=np.uint8)
    low = _block_distances(np.uint64(q), codes, dist)
    want = [bin(q ^ w).count("1") for w in words]
    assert dist[:len(words)].tolist() == want
    assert (dist[len(words):] == 255).all()  # nothing written past the block
    assert low == min(want, default=64)


@settings(max_examples=300, deadline=None)
@given(blocks=st.lists(st.lists(st.integers(0, 64), min_size=1, max_size=40), min_size=1,
                       max_size=6),
       k=st.integers(1, 12), tau=st.integers(0, 64), cap=st.integers(1, 24))
def test_keep_step_matches_twin(blocks, k, tau, cap):
    """Blocks of distances in turn through the keep step of row 1 of a 3-row state: the
    cut-off and the count within it as the twin's; the kept row holds exactly the twin's
    items within the final cut-off (compaction drops only items beyond it), unless it
    overflowed (more kept than ``cap`` after a compaction that freed nothing), which the
    state says. The SWAR test sees the 255 padding as beyond any cut-off."""
    rows, b = 3, 1
    sel = np.full((rows, cap), -7, dtype=np.int64)
    sel_d = np.full((rows, cap), -7, dtype=np.int32)
    cnt = np.zeros((rows, 65), dtype=np.int64)
    taus = np.full(rows, 64, dtype=np.int64)
    taus[b] = tau
    kept = np.zeros(rows, dtype=np.int64)
    within = np.zeros(rows, dtype=np.int64)
    twin_kept, twin_cnt, twin_tau, twin_within = [], [0] * 65, tau, 0
    start = 0
    for block in blocks:
        dist = np.full(-(-len(block) // 8) * 8, 255, dtype=np.uint8)
        dist[:len(block)] = block
        _keep_within(dist, dist.view(np.uint64), start, k, b, taus, sel, sel_d, kept, cnt,
                     within)
        part = []
        twin_tau, twin_within = twin_keep(block, twin_tau, k, part, twin_cnt, twin_within)
        twin_kept += [(d, start + i) for d, i in part]
        start += len(block)
    assert taus[b] == twin_tau and within[b] == twin_within
    assert cnt[b].tolist() == twin_cnt
    want = [(d, p) for d, p in twin_kept if d <= twin_tau]
    if kept[b] <= cap:
        got = [(int(d), int(p)) for d, p in zip(sel_d[b, :kept[b]], sel[b, :kept[b]])
               if d <= taus[b]]
        assert got == want
    else:
        assert len(twin_kept) > cap  # an overflow only when the twin kept more than a row
    # the other rows untouched
    assert (sel[[0, 2]] == -7).all() and (kept[[0, 2]] == 0).all() and (taus[[0, 2]] == 64).all()


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([8, 17, 32, 63, 64]),
       n=st.sampled_from([0, 1, 5, KNN_ITEM_BLOCK - 1, KNN_ITEM_BLOCK, 2 * KNN_ITEM_BLOCK + 3,
                          3000]),
       nq=st.sampled_from([1, 3, KNN_QUERY_BLOCK + 5]), k=st.integers(1, 150),
       pool=st.sampled_from([1, 7, 10_000]), seed=st.integers(0, 2**31), by_id=st.booleans(),
       data=st.data())
def test_knn_scan_matches_brute_force(bits, n, nq, k, pool, seed, by_id, data):
    """The blocked scan's answers, tie order (distance, id) included, with and without a
    radius, over items stored by id (a LinearScan) or in another order (auto's code-sorted
    items, shared): item blocks and query blocks, the last of each partial; small pools tie
    many items. Statistics: ``radii`` is the final cut-off + 1 (min(k-th distance, radius)
    + 1), ``items`` the items at each distance up to it."""
    xb, ids, xq = one_word_data(bits, n, nq, seed, pool)
    index = LinearScan(bits)
    if by_id:
        index.add(xb, ids)
    else:
        order = np.lexsort((ids, xb[:, 0]))
        index.share(xb[order], ids[order])
    R = data.draw(st.sampled_from([bits, 0, 3, bits // 2]), label="max_distance")
    D, I, stats = index.search(xq, k, max_distance=None if R == bits else R, stats=True)
    nD, nI = naive.knn_within(xq, xb, ids, bits, k, R)
    assert np.array_equal(D, nD) and np.array_equal(I, nI)
    dist = naive.hamming_matrix(xq, xb, bits)
    for qi, row in enumerate(dist):
        kth = np.sort(row)[k - 1] if n >= k else R
        cut = min(int(kth), R)
        assert stats.radii[qi] == cut + 1
        assert stats.items[qi, :cut + 1].tolist() == np.bincount(
            row[row <= cut], minlength=cut + 1).tolist()
    assert (stats.codes_compared == n).all()


@pytest.mark.parametrize("by_id", [True, False])
@pytest.mark.parametrize("k", [1, 3, 5000])
def test_more_ties_than_a_kept_row_holds(by_id, k):
    """9,000 items on three codes: every query ties thousands of items at its cut-off, more
    than a kept row holds (max(1,024, 4k)), so the kernel redoes those queries by the
    single-query pass; the answers still brute force's."""
    rng = np.random.default_rng(3)
    codes = np.array([0, 2**64 - 1, 0x0F0F0F0F0F0F0F0F], dtype=np.uint64)
    xb = codes[rng.integers(0, 3, 9000)].reshape(-1, 1)
    ids = rng.permutation(9000).astype(np.int64)
    xq = np.array([[0], [1], [2**63], [0x0F0F0F0F0F0F0F0E]], dtype=np.uint64)
    index = LinearScan(64)
    if by_id:
        index.add(xb, ids)
    else:
        order = np.lexsort((ids, xb[:, 0]))
        index.share(xb[order], ids[order])
    D, I = index.search(xq, k)
    nD, nI = naive.knn(xq, xb, ids, 64, k)
    assert np.array_equal(D, nD) and np.array_equal(I, nI)


def test_threads_split_the_queries_alike():
    """Two threads (each a chunk of the queries, each its own pass over the items) give the
    one-thread answer."""
    xb, ids, xq = one_word_data(64, 5000, 300, 11, 10_000)
    index = LinearScan(64)
    index.add(xb, ids)
    index.threads = 1
    one = index.search(xq, 20)
    index.threads = 2
    two = index.search(xq, 20)
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])
    nD, nI = naive.knn(xq, xb, ids, 64, 20)
    assert np.array_equal(one[0], nD) and np.array_equal(one[1], nI)


def test_kernel_of_an_empty_index():
    xq = np.zeros((3, 1), dtype=np.uint64)
    counts, D, I = _knn_word_kernel(xq, np.empty(0, np.uint64), np.empty(0, np.int64), True,
                                    64, 64, 5, False)[:3]
    assert counts.tolist() == [0, 0, 0] and len(D) == len(I) == 0
