"""Popcount linear scan: the Hamming-ranking baseline, the planner's fallback and the test oracle.

Every query is compared with every item: ``d(q, x) = sum_w popcount(q_w XOR x_w)``
(:func:`bucketsearch.index.kernels.hamming`). Results use the layouts of
:class:`bucketsearch.index.base.IndexBase`, ordered by (distance, id).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index._jit import monotonic_ns, njit, popcount64
from bucketsearch.index.base import (STAT_FIELDS, IndexBase, check_max_results, raise_if_over,
                                     raise_if_reached, run_chunked, run_resumable_chunked,
                                     stats_from_chunks)
from bucketsearch.index.codes import word_widths
from bucketsearch.index.kernels import (ITEMS, chunk_outputs, chunk_result, counting_sort, grow,
                                        hamming)


@njit
def _collect_word(q0, flat, cut, sel, sel_d, limit):
    """:func:`_collect` of a range search of one-word codes: one popcount and one rarely taken
    branch per item, nothing else in the loop (the general pass, with its k-NN cut-off and
    word loop, measured 1.3x slower on 1M 32-bit codes; reading a hit's id in the pass, a
    cache miss that stalls it, 1.8x slower at 3,500 hits). Returns ``kept``."""
    cap = len(sel)
    kept = 0
    for i in range(len(flat)):
        d = popcount64(q0 ^ flat[i])
        if d <= cut:
            if kept < cap:
                sel[kept] = i
                sel_d[kept] = d
            kept += 1
            if kept > limit:
                break
    return kept


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
    compacting = True
    flat = words.reshape(n * W)
    q0 = xq[qi, 0]
    for i in range(n):
        if W == 1:  # the fast path: one contiguous word per item
            d = popcount64(q0 ^ flat[i])
        else:
            d = hamming(xq, qi, words, i, W)
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
                if kept == cap and compacting:
                    # the buffer is full: drop kept items beyond the current cut-off; when
                    # none is (k > cap), stop compacting, so the pass overflows and is redone
                    # with room (compacting a buffer past its end dropped items never stored)
                    j = 0
                    for t in range(cap):
                        if sel_d[t] <= tau:
                            sel[j] = sel[t]
                            sel_d[j] = sel_d[t]
                            j += 1
                    compacting = j < cap
                    kept = j
    return kept, tau


#: items per block of the blocked k-NN scan (:func:`_knn_word_kernel`): 4 KiB of codes, read
#: from L1 by every query of the query block in turn
KNN_ITEM_BLOCK = 512
#: queries that share one pass over the items (the codes stream from memory once per block)
KNN_QUERY_BLOCK = 128
#: bound on ``query block x kept-item capacity`` (entries of 12 bytes: 24 MiB)
KNN_BLOCK_ENTRIES = 1 << 21


@njit
def _block_distances(q0, codes, dist):
    """``dist[i] = popcount(q0 XOR codes[i])`` (uint8) for every ``i``; returns the minimum.
    A loop from 0 with no branch: LLVM vectorizes it (VPOPCNTQ on AVX-512 machines, eight
    codes an instruction); an index from a block's start instead makes numba's wraparound
    check turn the loads into gathers (6x slower)."""
    low = 64
    for i in range(len(codes)):
        d = popcount64(q0 ^ codes[i])
        dist[i] = np.uint8(d)
        low = min(low, d)
    return low


#: bytes 0x01 and 0x80 in every byte of a word (the SWAR test of :func:`_keep_within`)
_LOW_BYTES = np.uint64(0x0101010101010101)
_HIGH_BYTES = np.uint64(0x8080808080808080)


@njit(inline="always")
def _keep_within(dist, packed, start, k, b, tau, sel, sel_d, kept, cnt, within):
    """:func:`_collect`'s k-NN step over one block's distances ``dist`` (uint8, positions
    ``start + i``; padded with 255 to the ``len(packed)`` words of ``packed``, the same bytes
    read as uint64) for query row ``b`` of the block
    state: keep every item with ``d <= tau[b]`` in ``sel[b]`` / ``sel_d[b]``, lower the running
    cut-off ``tau[b]`` (at least ``k`` kept items at distance <= tau) as closer items arrive,
    compact the row when it fills (dropping kept items beyond the cut-off). ``kept[b]`` past
    the row's capacity means the row overflowed (more items tie within the cut-off than it
    holds): the caller redoes that query.

    Eight distances are tested at once (SWAR on a uint64 of eight bytes < 128): byte ``x``
    is ``<= t`` exactly when ``(x | 0x80) - (t + 1)`` has its top bit clear, so a word whose
    ``~((x | 0x80..80) - (t + 1) x 0x01..01) & 0x80..80`` is zero holds nothing to keep."""
    cap = sel.shape[1]
    t = tau[b]
    n_kept = kept[b]
    w = within[b]
    compacting = n_kept <= cap
    for g in range(len(packed)):
        if ~((packed[g] | _HIGH_BYTES) - np.uint64(t + 1) * _LOW_BYTES) & _HIGH_BYTES == 0:
            continue
        for i in range(8 * g, 8 * g + 8):
            d = np.int64(dist[i])
            if d > t:
                continue
            if n_kept < cap:
                sel[b, n_kept] = start + i
                sel_d[b, n_kept] = d
            n_kept += 1
            cnt[b, d] += 1
            w += 1
            while t > 0 and w - cnt[b, t] >= k:
                w -= cnt[b, t]
                t -= 1
            if n_kept == cap and compacting:
                j = 0
                for c in range(cap):
                    if sel_d[b, c] <= t:
                        sel[b, j] = sel[b, c]
                        sel_d[b, j] = sel_d[b, c]
                        j += 1
                compacting = j < cap
                n_kept = j
    tau[b] = t
    kept[b] = n_kept
    within[b] = w


@njit
def _knn_word_kernel(xq, flat, ids, by_id, bits, max_radius, k, with_stats):
    """k-NN of one-word codes (``k >= 1``: the ``k`` nearest within ``max_radius``), blocked:
    the queries in blocks of up to :data:`KNN_QUERY_BLOCK`, the items in blocks of
    :data:`KNN_ITEM_BLOCK`; for each item block every query of the block computes its
    distances to the block's codes (:func:`_block_distances`, vectorized) and, only when their
    minimum is within its running cut-off, keeps them (:func:`_keep_within`). The codes
    stream from memory once per query block, not once per query; after the first blocks a
    query's cut-off is near its k-th distance and the keep step is rare.

    The kept items are emitted in (distance, id) order by
    :func:`bucketsearch.index.kernels.counting_sort`, as :func:`_scan_kernel` does (whose
    single-query pass redoes a query whose kept row overflowed: more ties within the cut-off
    than the row holds). Statistics ``(5, nq, bits + 1)`` hold ``items`` per distance; a
    query's ``total_ns`` is its block's time divided among the block's queries. Returns
    :func:`chunk_result`'s tuple."""
    nq = xq.shape[0]
    n = len(flat)
    counts, stats, radii, total_ns, scanned_from, out_d, out_i = chunk_outputs(
        nq, len(STAT_FIELDS), nq if with_stats else 0, bits + 1)
    cap = min(max(1024, 4 * k), max(n, 1))
    qb = max(1, min(KNN_QUERY_BLOCK, KNN_BLOCK_ENTRIES // cap))
    sel = np.empty((qb, cap), dtype=np.int64)
    sel_d = np.empty((qb, cap), dtype=np.int32)
    cnt = np.zeros((qb, max_radius + 1), dtype=np.int64)
    tau = np.empty(qb, dtype=np.int64)
    kept = np.zeros(qb, dtype=np.int64)
    within = np.zeros(qb, dtype=np.int64)
    dist = np.empty(KNN_ITEM_BLOCK, dtype=np.uint8)
    dist_words = dist.view(np.uint64)
    hist = np.zeros(bits + 2, dtype=np.int64)
    fill = np.zeros(bits + 2, dtype=np.int64)
    words = flat.reshape(n, 1)
    redo = np.empty(1024, dtype=np.int64)
    redo_d = np.empty(1024, dtype=np.int32)
    n_out = 0
    for q0 in range(0, nq, qb):
        t0 = monotonic_ns() if with_stats else 0
        nb = min(qb, nq - q0)
        tau[:nb] = max_radius
        kept[:nb] = 0
        within[:nb] = 0
        cnt[:nb] = 0
        for i0 in range(0, n, KNN_ITEM_BLOCK):
            codes = flat[i0:i0 + KNN_ITEM_BLOCK]
            packed = dist_words[:(len(codes) + 7) >> 3]  # the last block's tail: 255
            dist[len(codes):] = 255
            for b in range(nb):
                if kept[b] > cap:
                    continue  # overflowed: redone below
                if _block_distances(xq[q0 + b, 0], codes, dist) <= tau[b]:
                    _keep_within(dist, packed, i0, k, b, tau, sel, sel_d, kept, cnt, within)
        share = (monotonic_ns() - t0) // nb if with_stats else 0
        for b in range(nb):
            qi = q0 + b
            t1 = monotonic_ns() if with_stats else 0
            if kept[b] > cap:  # rare: the single-query pass, its buffer grown until it fits
                while True:
                    n_kept, t = _collect(xq, qi, words, max_radius, k, redo, redo_d,
                                         np.iinfo(np.int64).max)
                    if n_kept <= len(redo):
                        break
                    redo = np.empty(2 * n_kept, dtype=np.int64)
                    redo_d = np.empty(2 * n_kept, dtype=np.int32)
                cand, cand_d = redo, redo_d
            else:
                n_kept, t = kept[b], tau[b]
                cand, cand_d = sel[b], sel_d[b]
            # the kept items within the final cut-off (~k of the ~k ln(n / k) kept), their
            # positions to ids: one random read each, so only theirs
            hist[:t + 1] = 0
            j = 0
            for c in range(n_kept):
                if cand_d[c] <= t:
                    hist[cand_d[c]] += 1
                    cand[j] = cand[c]
                    cand_d[j] = cand_d[c]
                    j += 1
            n_kept = j
            for c in range(n_kept):
                cand[c] = ids[cand[c]]
            out_i = grow(out_i, n_out + n_kept)
            out_d = grow(out_d, n_out + n_kept)
            got = min(counting_sort(cand_d, cand, n_kept, None, hist, 0, t, fill, out_d, out_i,
                                    n_out, by_id), k)
            n_out += got
            counts[qi] = got
            radii[qi] = t + 1
            if with_stats:
                stats[ITEMS, qi, :t + 1] = hist[:t + 1]
                total_ns[qi] = share + monotonic_ns() - t1
    return chunk_result(counts, out_d, out_i, n_out, stats, radii, total_ns, scanned_from, -1)


@njit
def _scan_kernel(xq, words, ids, by_id, bits, max_radius, k, with_stats, max_results, stop):
    """Range search (``k < 0``, all items with ``d <= max_radius``) or k-NN (``k >= 1``: the
    ``k`` nearest within ``max_radius``).

    The kept items are emitted in (distance, id) order by
    :func:`bucketsearch.index.kernels.counting_sort`
    (``by_id``: ``ids`` is increasing, :meth:`LinearScan._rebuild`, so no distance needs a sort
    by id; else, items shared in another order, each distance's ids are sorted).
    Statistics ``(5, nq, bits + 1)`` (allocated only ``with_stats``) hold ``items`` per
    distance; a scan probes no bucket. Result cap (range search): a query's pass stops once the
    chunk's results would pass ``max_results``; the kernel then sets ``stop[0]`` (read before
    every query by every chunk) and returns the count reached, a lower bound of the true total.
    Returns ``(counts, D, I, stats, radii, total_ns, scanned_from, reached)`` like the probing
    kernels (``scanned_from`` all -1).
    """
    nq, W = xq.shape
    counts, stats, radii, total_ns, scanned_from, out_d, out_i = chunk_outputs(
        nq, len(STAT_FIELDS), nq if with_stats else 0, bits + 1)
    sel = np.empty(4096, dtype=np.int64)
    sel_d = np.empty(4096, dtype=np.int32)
    hist = np.zeros(bits + 2, dtype=np.int64)
    fill = np.zeros(bits + 2, dtype=np.int64)
    n_out = 0
    reached = -1  # >= 0 once the result cap stopped this chunk
    limit = np.iinfo(np.int64).max
    word_range = W == 1 and k < 0
    flat = words.reshape(words.shape[0] * W)
    for qi in range(nq):
        if stop[0] != 0:
            break
        t0 = monotonic_ns() if with_stats else 0
        if k < 0:
            limit = max_results - n_out
        while True:
            if word_range:
                kept, tau = _collect_word(xq[qi, 0], flat, max_radius, sel, sel_d,
                                          limit), max_radius
            else:
                kept, tau = _collect(xq, qi, words, max_radius, k, sel, sel_d, limit)
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
        hist[:tau + 1] = 0
        for t in range(kept):
            if sel_d[t] <= tau:
                hist[sel_d[t]] += 1
        out_i = grow(out_i, n_out + kept)
        out_d = grow(out_d, n_out + kept)
        for t in range(kept):  # positions to ids first: a loop of one store per hit keeps
            sel[t] = ids[sel[t]]  # many of its cache misses in flight (in the sort, 1.3x slower)
        got = counting_sort(sel_d, sel, kept, None, hist, 0, tau, fill, out_d, out_i, n_out,
                            by_id)
        if k >= 0 and got > k:
            got = k
        n_out += got
        counts[qi] = got
        radii[qi] = tau + 1
        if with_stats:
            stats[ITEMS, qi, :tau + 1] = hist[:tau + 1]
            total_ns[qi] = monotonic_ns() - t0
    return chunk_result(counts, out_d, out_i, n_out, stats, radii, total_ns, scanned_from,
                        reached)


@njit
def _scan_word_kernel(xq, flat, ids, by_id, R, with_stats, max_results, q_start, n_out, lims,
                      out_d, out_i, hits, stats, total_ns):
    """Range search of one-word codes over the resumable output buffers
    (:func:`bucketsearch.index.base.run_resumable`): per query, :func:`_collect_word` keeps the
    positions
    within ``R`` in ``hits`` (their distances in a scratch of the same length), the positions
    become ids, and :func:`bucketsearch.index.kernels.counting_sort` emits them by (distance, id)
    (``by_id``:
    items stored by id, so no distance needs a sort). Returns ``(q_end, n_out, reached, need)``:
    ``need`` when ``hits`` is too short for a query's hits, a stop when the output buffers are
    full, ``reached`` (a lower bound) once the results pass ``max_results``. Statistics:
    ``items`` per distance and ``total_ns``; a scan probes no bucket."""
    nq = xq.shape[0]
    sel_d = np.empty(len(hits), dtype=np.int32)
    hist = np.zeros(R + 2, dtype=np.int64)
    fill = np.zeros(R + 2, dtype=np.int64)
    for qi in range(q_start, nq):
        t0 = monotonic_ns() if with_stats else 0
        limit = max_results - n_out
        kept = _collect_word(xq[qi, 0], flat, R, hits, sel_d, limit)
        if kept > limit:
            return qi, n_out, n_out + kept, 0
        if kept > len(hits):
            return qi, n_out, -1, kept
        if n_out + kept > len(out_i):
            return qi, n_out, -1, 0
        hist[:R + 1] = 0
        for t in range(kept):
            hist[sel_d[t]] += 1
        for t in range(kept):  # positions to ids first (see _scan_kernel)
            hits[t] = ids[hits[t]]
        n_out += counting_sort(sel_d, hits, kept, None, hist, 0, R, fill, out_d, out_i, n_out,
                               by_id)
        lims[qi + 1] = n_out
        if with_stats:
            stats[ITEMS, qi, :R + 1] = hist[:R + 1]
            total_ns[qi] = monotonic_ns() - t0
    return nq, n_out, -1, 0


#: the compiled entries of :func:`_scan_word_kernel`, by the types of a scan's arrays (their
#: layout and writeability: every scan of one kind shares them, e.g. each new delta segment)
_ENTRIES: dict[tuple, dict] = {}


class LinearScan(IndexBase):
    """Exhaustive popcount search with the API of :class:`bucketsearch.index.probe.HammingIndex`.

    Its statistics have ``items`` per radius, ``probes = 0`` and ``lookup_ns = 0`` (a scan has
    no per-radius phases) and ``total_ns`` per query.
    """

    kind = "scan"

    def __init__(self, bits: int):
        super().__init__(bits)
        self._rebuild(np.empty((0, len(word_widths(self.bits))), np.uint64),
                      np.empty(0, np.int64))

    def _rebuild(self, words, ids):
        """Items stored by id, so a pass meets each distance's hits in id order."""
        order = np.argsort(ids, kind="stable")
        self._set_items(np.asarray(words, dtype=np.uint64)[order],
                        np.asarray(ids, dtype=np.int64)[order])

    @classmethod
    def of_items_by_id(cls, bits: int, words: np.ndarray, ids: np.ndarray) -> LinearScan:
        """A scan over items already in id order (``ids`` unique and increasing: not checked,
        not copied; e.g. a job's saved items, or row numbers as ids)."""
        index = cls(bits)
        index._set_items(words, ids)
        return index

    def share(self, words: np.ndarray, ids: np.ndarray) -> None:
        """Scan another engine's items in their order (not copied; auto's scan reads its
        multi-index's arrays, sorted by (code, id)): each distance's ids are sorted per query."""
        self._set_items(words, ids, by_id=False)

    def _set_items(self, words: np.ndarray, ids: np.ndarray, by_id: bool = True) -> None:
        """The items (stored by id unless ``by_id`` is False) and what the one-word range
        kernel reads of them."""
        self.words, self.ids, self.by_id = words, ids, by_id
        self._flat = words.reshape(-1) if words.shape[1] == 1 else None
        if self._flat is not None:
            key = tuple(bool(getattr(a.flags, f)) for a in (self._flat, ids)
                        for f in ("writeable", "c_contiguous"))
            self._entries = _ENTRIES.setdefault(key, {})

    def snapshot(self) -> tuple[dict, dict]:
        return {}, {"words": self.words, "ids": self.ids}

    @classmethod
    def from_snapshot(cls, bits: int, meta: dict, arrays: dict) -> LinearScan:
        """A snapshot written before the scan stored items by id is put in id order (a copy);
        one in id order is used as loaded (``mmap`` stays shared)."""
        index = cls(bits)
        words, ids = arrays["words"], arrays["ids"]
        if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
            index._rebuild(words, ids)
        else:
            index._set_items(words, ids)
        return index

    @property
    def ntotal(self) -> int:
        return len(self.ids)

    def memory_bytes(self) -> int:
        return self.words.nbytes + self.ids.nbytes

    def memory_arrays(self) -> dict:
        """Every array the index holds, by identity (see :meth:`HammingIndex.memory_arrays`)."""
        return {id(a): a for a in (self.words, self.ids)}

    def probe_count(self, max_distance: int, nq: int = 1) -> int:
        """A scan probes no bucket: 0 (it compares every query with all ``ntotal`` items)."""
        return 0

    def _run(self, xq, max_radius, k, stats, max_results=None):
        if k < 0 and self._flat is not None:
            return self._run_range_word(xq, max_radius, stats, max_results)
        if self._flat is not None:  # k-NN of one-word codes: the blocked kernel
            lims, D, I, rest = run_chunked(
                lambda chunk: _knn_word_kernel(chunk, self._flat, self.ids, self.by_id,
                                               self.bits, max_radius, k, bool(stats)),
                xq, self.threads)
            return ((lims, D, I, self._tagged(stats_from_chunks(rest), k)) if stats
                    else (lims, D, I))
        stop = np.zeros(1, dtype=np.int64)
        cap = check_max_results(max_results)
        lims, D, I, rest = run_chunked(
            lambda chunk: _scan_kernel(chunk, self.words, self.ids, self.by_id, self.bits,
                                       max_radius, k, stats, cap, stop), xq, self.threads)
        raise_if_over(max_results, stop, [r[4] for r in rest], lims)
        return ((lims, D, I, self._tagged(stats_from_chunks(rest), k)) if stats
                else (lims, D, I))

    def _run_range_word(self, xq, R, stats, max_results):
        """Range search of one-word codes: :func:`_scan_word_kernel`, resumable over the
        thread's output buffers (no per-query allocation, no statistics unless asked)."""
        stats = bool(stats)
        args = (self._flat, self.ids, self.by_id, R, stats, check_max_results(max_results))
        lims, D, I, st, reached = run_resumable_chunked(_scan_word_kernel, xq, R + 1, stats,
                                                        len(STAT_FIELDS), self.threads, args,
                                                        self._entries)
        raise_if_reached(max_results, reached, lims)
        return (lims, D, I, self._tagged(st, -1)) if stats else (lims, D, I)
