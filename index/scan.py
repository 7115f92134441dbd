"""Popcount linear scan: the Hamming-ranking baseline, the planner's fallback and the test oracle.

Every query is compared with every item: ``d(q, x) = sum_w popcount(q_w XOR x_w)``. Results use
the layouts of :class:`index.probe.HammingIndex`, ordered by (distance, id).
"""
from __future__ import annotations

import numpy as np

from index._jit import monotonic_ns, njit, popcount64
from index.codes import word_widths
from index.probe import IndexBase, SearchStats, run_chunked


@njit(inline="always")
def _distance(xq, qi, words, i, W):
    d = 0
    for w in range(W):
        d += popcount64(xq[qi, w] ^ words[i, w])
    return d


@njit
def _sorted_by_distance(dist, ids, sel, bits, max_d, limit):
    """Items ``sel`` ordered by (distance, id) with distance <= max_d, at most ``limit``.

    Counting sort by distance, then ids sorted inside each distance block.
    """
    hist = np.zeros(bits + 2, dtype=np.int64)
    for i in sel:
        hist[dist[i] + 1] += 1
    starts = np.cumsum(hist)
    fill = starts[:-1].copy()
    out_i = np.empty(len(sel), dtype=np.int64)
    out_d = np.empty(len(sel), dtype=np.int32)
    for i in sel:
        p = fill[dist[i]]
        out_i[p] = ids[i]
        out_d[p] = dist[i]
        fill[dist[i]] += 1
    for d in range(max_d + 1):
        if starts[d + 1] - starts[d] > 1:
            out_i[starts[d]:starts[d + 1]] = np.sort(out_i[starts[d]:starts[d + 1]])
    n = min(limit, len(sel))
    return out_d[:n], out_i[:n], hist[1:max_d + 2]


@njit
def _distances(xq, qi, words, dist, cut, k):
    """Pass 1: every item's distance into ``dist``; returns the final cut-off distance.

    Range search (``k < 0``) keeps ``cut``. k-NN keeps a running cut-off ``tau`` with at least
    ``k`` items at distance <= tau and lowers it as closer items arrive; only items within the
    cut-off touch the counters, so the loop has no histogram dependency chain.
    """
    n, W = words.shape
    if k < 0:
        for i in range(n):
            dist[i] = _distance(xq, qi, words, i, W)
        return cut
    tau = cut
    cnt = np.zeros(cut + 1, dtype=np.int64)
    within = 0  # items at distance <= tau
    for i in range(n):
        d = _distance(xq, qi, words, i, W)
        dist[i] = d
        if d <= tau:
            cnt[d] += 1
            within += 1
            while tau > 0 and within - cnt[tau] >= k:
                within -= cnt[tau]
                tau -= 1
    return tau


@njit
def _scan_kernel(xq, words, ids, bits, max_radius, k, with_clock):
    """Range search (``k < 0``, all items with ``d <= max_radius``) or k-NN (``k >= 1``)."""
    nq, W = xq.shape
    n = words.shape[0]
    counts = np.zeros(nq, dtype=np.int64)
    items = np.zeros((nq, bits + 1), dtype=np.int64)
    radii = np.zeros(nq, dtype=np.int64)
    total_ns = np.zeros(nq, dtype=np.int64)
    dist = np.empty(n, dtype=np.int16)
    out_d = np.empty(1024, dtype=np.int32)
    out_i = np.empty(1024, dtype=np.int64)
    n_out = 0
    for qi in range(nq):
        t0 = monotonic_ns() if with_clock else 0
        cut = _distances(xq, qi, words, dist, max_radius if k < 0 else bits, k)
        m = 0
        for i in range(n):
            m += dist[i] <= cut
        sel = np.empty(m, dtype=np.int64)
        j = 0
        for i in range(n):
            if dist[i] <= cut:
                sel[j] = i
                j += 1
        d_sorted, i_sorted, per_d = _sorted_by_distance(dist, ids, sel, bits, cut,
                                                        n if k < 0 else k)
        got = len(i_sorted)
        if n_out + got > len(out_i):
            size = max(2 * len(out_i), n_out + got)
            grown_i = np.empty(size, dtype=np.int64)
            grown_d = np.empty(size, dtype=np.int32)
            grown_i[:n_out] = out_i[:n_out]
            grown_d[:n_out] = out_d[:n_out]
            out_i, out_d = grown_i, grown_d
        out_i[n_out:n_out + got] = i_sorted
        out_d[n_out:n_out + got] = d_sorted
        n_out += got
        counts[qi] = got
        items[qi, :cut + 1] = per_d
        radii[qi] = cut + 1
        if with_clock:
            total_ns[qi] = monotonic_ns() - t0
    return counts, out_d[:n_out].copy(), out_i[:n_out].copy(), items, radii, total_ns


class LinearScan(IndexBase):
    """Exhaustive popcount search with the API of :class:`index.probe.HammingIndex`.

    Its statistics have ``items`` per radius, ``probes = 0`` and ``lookup_ns = 0`` (a scan has
    no per-radius phases) and ``total_ns`` per query.
    """

    kind = "scan"

    def __init__(self, bits: int):
        super().__init__(bits)
        self._rebuild(np.empty((0, len(word_widths(self.bits))), np.uint64),
                      np.empty(0, np.int64))

    def _rebuild(self, words, ids):
        self.words = np.ascontiguousarray(words, dtype=np.uint64)
        self.ids = np.ascontiguousarray(ids, dtype=np.int64)

    @property
    def ntotal(self) -> int:
        return len(self.ids)

    def memory_bytes(self) -> int:
        return self.words.nbytes + self.ids.nbytes

    def _run(self, xq, max_radius, k, stats):
        lims, D, I, rest = run_chunked(
            lambda chunk: _scan_kernel(chunk, self.words, self.ids, self.bits, max_radius, k,
                                       stats), xq, self.threads)
        if not stats:
            return lims, D, I
        radii = np.concatenate([r[1] for r in rest])
        width = max(int(radii.max(initial=0)), 1)
        items = np.concatenate([r[0] for r in rest])[:, :width]
        zeros = np.zeros_like(items)
        return lims, D, I, SearchStats(zeros, zeros.copy(), zeros.copy(), items, zeros.copy(),
                                       radii=radii, total_ns=np.concatenate([r[2] for r in rest]))

    def range_search(self, queries, max_distance: int, stats: bool = False):
        """All items with ``d <= max_distance``: ``(lims, D, I)`` in faiss's CSR layout."""
        R = self._check_radius(max_distance, self.bits)
        return self._run(self._check_queries(queries), R, -1, stats)

    def _knn_csr(self, xq, k, stats):
        return self._run(xq, self.bits, k, stats)

    def save(self, path) -> None:
        from index.store import save_index
        save_index(path, self)

    @classmethod
    def load(cls, path, mmap: bool = False) -> LinearScan:
        from index.store import load_index
        return load_index(path, mmap=mmap, expected_kind=cls.kind)
