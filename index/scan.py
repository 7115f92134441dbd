"""Popcount linear scan: the Hamming-ranking baseline, the planner's fallback and the test oracle.

Every query is compared with every item: ``d(q, x) = sum_w popcount(q_w XOR x_w)``. Results use
the layouts of :class:`index.probe.HammingIndex`, ordered by (distance, id).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index._jit import monotonic_ns, njit, popcount64
from bucketsearch.index.base import (IndexBase, SearchStats, check_max_results, raise_if_over,
                                     run_chunked)
from bucketsearch.index.codes import word_widths


@njit(inline="always")
def _distance(xq, qi, words, i, W):
    d = 0
    for w in range(W):
        d += popcount64(xq[qi, w] ^ words[i, w])
    return d


@njit
def _sorted_by_distance(sel_d, sel, ids, kept, bits, max_d, limit):
    """Kept items with distance <= max_d ordered by (distance, id), at most ``limit``.

    Counting sort by distance, then ids sorted inside each distance block. Also returns the
    number of items at each distance 0..max_d.
    """
    hist = np.zeros(bits + 2, dtype=np.int64)
    for t in range(kept):
        if sel_d[t] <= max_d:
            hist[sel_d[t] + 1] += 1
    starts = np.cumsum(hist)
    fill = starts[:-1].copy()
    m = starts[max_d + 1]
    out_i = np.empty(m, dtype=np.int64)
    out_d = np.empty(m, dtype=np.int32)
    for t in range(kept):
        d = sel_d[t]
        if d <= max_d:
            out_i[fill[d]] = ids[sel[t]]
            out_d[fill[d]] = d
            fill[d] += 1
    for d in range(max_d + 1):
        if starts[d + 1] - starts[d] > 1:
            out_i[starts[d]:starts[d + 1]] = np.sort(out_i[starts[d]:starts[d + 1]])
    n = min(limit, m)
    return out_d[:n], out_i[:n], hist[1:max_d + 2]


@njit
def _collect(xq, qi, words, cut, k, sel, sel_d, limit):
    """One pass over the items: keep those within the cut-off in ``sel`` / ``sel_d``.

    Range search (``k < 0``) keeps every item with ``d <= cut``, and stops the pass as soon as
    more than ``limit`` are kept (the result cap: ``kept = limit + 1`` is then a lower bound).
    k-NN keeps a running cut-off ``tau`` (at least ``k`` kept items lie at distance <= tau) and
    lowers it as closer items arrive, so after the first few thousand items almost nothing is
    kept and the loop is one popcount and one predictable branch per item. Returns
    ``(kept, tau)``; ``kept`` larger than ``len(sel)`` means the buffer overflowed and the pass
    must be redone with a bigger one.
    """
    n, W = words.shape
    cap = len(sel)
    tau = cut
    cnt = np.zeros(cut + 1, dtype=np.int64)
    within = 0  # kept items at distance <= tau (k-NN)
    kept = 0
    flat = words.reshape(n * W)
    q0 = xq[qi, 0]
    for i in range(n):
        if W == 1:  # the fast path: one contiguous word per item
            d = popcount64(q0 ^ flat[i])
        else:
            d = _distance(xq, qi, words, i, W)
        if d <= tau:
            if kept < cap:
                sel[kept] = i
                sel_d[kept] = d
            kept += 1
            if kept > limit:
                break
            if k >= 0:
                cnt[d] += 1
                within += 1
                while tau > 0 and within - cnt[tau] >= k:
                    within -= cnt[tau]
                    tau -= 1
                if kept >= cap and kept < 2 * cap:
                    # compact: drop kept items beyond the current cut-off
                    j = 0
                    for t in range(min(kept, cap)):
                        if sel_d[t] <= tau:
                            sel[j] = sel[t]
                            sel_d[j] = sel_d[t]
                            j += 1
                    kept = j
    return kept, tau


@njit
def _scan_kernel(xq, words, ids, bits, max_radius, k, with_clock, max_results, stop):
    """Range search (``k < 0``, all items with ``d <= max_radius``) or k-NN (``k >= 1``).

    Result cap (range search): a query's pass stops once the chunk's results would pass
    ``max_results``; the kernel then sets ``stop[0]`` (read before every query by every chunk)
    and returns the count reached, a lower bound of the true total (last output).
    """
    nq, W = xq.shape
    counts = np.zeros(nq, dtype=np.int64)
    items = np.zeros((nq, bits + 1), dtype=np.int64)
    radii = np.zeros(nq, dtype=np.int64)
    total_ns = np.zeros(nq, dtype=np.int64)
    sel = np.empty(4096, dtype=np.int64)
    sel_d = np.empty(4096, dtype=np.int32)
    out_d = np.empty(1024, dtype=np.int32)
    out_i = np.empty(1024, dtype=np.int64)
    n_out = 0
    reached = -1  # >= 0 once the result cap stopped this chunk
    limit = np.iinfo(np.int64).max
    for qi in range(nq):
        if stop[0] != 0:
            break
        t0 = monotonic_ns() if with_clock else 0
        cut = max_radius if k < 0 else bits
        if k < 0:
            limit = max_results - n_out
        while True:
            kept, tau = _collect(xq, qi, words, cut, k, sel, sel_d, limit)
            if kept > limit:
                reached = n_out + kept
                break
            if kept <= len(sel):
                break
            sel = np.empty(2 * kept, dtype=np.int64)  # rare: redo the pass with room
            sel_d = np.empty(2 * kept, dtype=np.int32)
        if reached >= 0:
            stop[0] = 1
            break
        d_sorted, i_sorted, per_d = _sorted_by_distance(sel_d, sel, ids, kept, bits, tau,
                                                        kept if k < 0 else k)
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
        items[qi, :tau + 1] = per_d
        radii[qi] = tau + 1
        if with_clock:
            total_ns[qi] = monotonic_ns() - t0
    if reached < 0:
        reached = n_out
    return (counts, out_d[:n_out].copy(), out_i[:n_out].copy(), items, radii, total_ns,
            reached)


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

    def snapshot(self) -> tuple[dict, dict]:
        return {}, {"words": self.words, "ids": self.ids}

    @classmethod
    def from_snapshot(cls, bits: int, meta: dict, arrays: dict) -> LinearScan:
        index = cls(bits)
        index.words, index.ids = arrays["words"], arrays["ids"]
        return index

    @property
    def ntotal(self) -> int:
        return len(self.ids)

    def memory_bytes(self) -> int:
        return self.words.nbytes + self.ids.nbytes

    def probe_count(self, max_distance: int) -> int:
        """A scan probes no bucket: 0 (it compares every query with all ``ntotal`` items)."""
        return 0

    def _run(self, xq, max_radius, k, stats, max_results=None):
        stop = np.zeros(1, dtype=np.int64)
        cap = check_max_results(max_results)
        lims, D, I, rest = run_chunked(
            lambda chunk: _scan_kernel(chunk, self.words, self.ids, self.bits, max_radius, k,
                                       stats, cap, stop), xq, self.threads)
        raise_if_over(max_results, stop, [r[3] for r in rest], lims)
        if not stats:
            return lims, D, I
        radii = np.concatenate([r[1] for r in rest])
        width = max(int(radii.max(initial=0)), 1)
        items = np.concatenate([r[0] for r in rest])[:, :width]
        zeros = np.zeros_like(items)
        return lims, D, I, SearchStats(zeros, zeros.copy(), zeros.copy(), items, zeros.copy(),
                                       radii=radii, total_ns=np.concatenate([r[2] for r in rest]))

    def range_search(self, queries, max_distance: int, stats: bool = False,
                     max_results: int | None = None):
        """All items with ``d <= max_distance``: ``(lims, D, I)`` in faiss's CSR layout;
        ``max_results`` caps the batch's results (:class:`~index.probe.ResultLimitError`)."""
        R = self._check_radius(max_distance, self.bits)
        xq = self._check_queries(queries)
        check_max_results(max_results)
        return self._run(xq, R, -1, stats, max_results)
