"""The compiled building blocks every engine shares, each written once.

* :func:`hamming`: ``d(q, x) = sum_w popcount(q_w XOR x_w)`` over the ``W`` uint64 words of
  query row ``qi`` and item row ``i``.
* :func:`grow`: a result buffer with room for at least ``need`` entries (doubling, so ``n``
  appends cost O(n)).
* :func:`sort_run`: ids of one distance sorted in place (the tie-break of the (distance, id)
  order).
* :func:`counting_sort`: candidates ``(distance, position)`` emitted in (distance, id) order,
  distances ``lo..cut`` only, by a counting sort on the distance histogram (O(n + Q), no
  comparison sort across distances).
* :func:`record_radius`: one per-radius statistics row (probes, non-empty and empty buckets,
  items) of a query; :func:`chunk_outputs` / :func:`chunk_result`: what every search kernel
  allocates and returns for a chunk of queries.
* :func:`rows_done`: per row of k-NN ids, whether it holds k ids that are not padding nor in a
  sorted ``drop`` list (the tombstones), or is padded.
* :func:`merge_rows`: per query, two result lists sorted by (distance, id) merged into one, ids
  of a sorted ``drop`` list removed from the first, at most ``k`` kept: the live layer's merge of
  the main table, the delta segment and the tombstones, without sorting again.
* :func:`keep_first_rows`: the greedy "keep the first, drop every later item within r of a kept
  one" over the rows of a block's self-search (dedup on ingest,
  :mod:`bucketsearch.index.storage.dedup`).

Every kernel has a plain-numpy twin in tests/test_kernels.py, compared by hypothesis.
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index._jit import njit, popcount64

#: Statistics rows of the engines' ``stats`` arrays ``(rows, nq, R + 1)``.
PROBES, NONEMPTY, EMPTY, ITEMS, LOOKUP_NS, CANDIDATES, UNIQUE_CANDIDATES = range(7)


@njit
def chunk_outputs(nq, rows, stats_nq, width):
    """What a search kernel returns for a chunk of ``nq`` queries, allocated: ``counts``
    (results per query), ``stats`` ``(rows, stats_nq, width)``, ``radii``, ``total_ns``,
    ``scanned_from`` (-1: none) and the growable result buffers ``out_d``, ``out_i``."""
    return (np.zeros(nq, dtype=np.int64), np.zeros((rows, stats_nq, width), dtype=np.int64),
            np.zeros(nq, dtype=np.int64), np.zeros(nq, dtype=np.int64),
            np.full(nq, -1, dtype=np.int64), np.empty(1024, dtype=np.int32),
            np.empty(1024, dtype=np.int64))


@njit
def chunk_result(counts, out_d, out_i, n_out, stats, radii, total_ns, scanned_from, reached):
    """The kernels' return value: CSR ``counts, D, I`` (the buffers cut to ``n_out``), the
    statistics, and ``reached`` (the results counted; ``n_out`` unless the cap stopped the
    chunk)."""
    return (counts, out_d[:n_out].copy(), out_i[:n_out].copy(), stats, radii, total_ns,
            scanned_from, reached if reached >= 0 else n_out)


@njit(inline="always")
def hamming(xq, qi, words, i, W):
    """Hamming distance between ``xq[qi]`` and ``words[i]`` (``W`` uint64 words each)."""
    d = 0
    for w in range(W):
        d += popcount64(xq[qi, w] ^ words[i, w])
    return d


@njit
def grow(buf, need):
    """``buf`` itself when it holds ``need`` entries, else a copy of at least twice its size."""
    if need <= len(buf):
        return buf
    out = np.empty(max(need, 2 * len(buf)), dtype=buf.dtype)
    out[:len(buf)] = buf
    return out


@njit(inline="always")
def sort_run(a, lo, hi):
    """Sort ``a[lo:hi]`` in place: insertion sort for runs of at most 32 (no allocation; the
    common case, a handful of ties), ``np.sort`` beyond."""
    if hi - lo > 32:
        a[lo:hi] = np.sort(a[lo:hi])
        return
    for i in range(lo + 1, hi):
        v = a[i]
        j = i - 1
        while j >= lo and a[j] > v:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = v


@njit
def counting_sort(cand_d, cand_p, n, ids, hist, lo, cut, fill, out_d, out_i, n_out,
                  ascending=False):
    """Emit the candidates ``c < n`` with ``lo <= cand_d[c] <= cut`` at ``out[n_out:]``
    ordered by (distance, id); ``cand_p[c]`` is the candidate's position in ``ids`` (``ids``
    None: its id).
    ``ascending``: the candidates come in ascending id order (a scan of items stored by id),
    so the pass by distance, being stable, already orders each distance by id.

    ``hist[d]`` must be the number of candidates at distance ``d`` (for ``lo <= d <= cut``);
    ``fill`` is scratch of at least ``cut + 1`` entries; the output buffers must have room for
    ``n_out + sum(hist[lo:cut + 1])`` entries (:func:`grow` them first: the buffers are not
    returned, so the caller's loop does not refcount them on every query). Returns the number
    of entries written, ``sum(hist[lo:cut + 1])``. Not inlined: one call per query, and the
    inlined form measured no faster.
    """
    total = 0
    for d in range(lo, cut + 1):
        fill[d] = n_out + total
        total += hist[d]
    for c in range(n):
        d = cand_d[c]
        if lo <= d <= cut:
            out_i[fill[d]] = cand_p[c] if ids is None else ids[cand_p[c]]
            out_d[fill[d]] = d
            fill[d] += 1
    if not ascending:
        start = n_out
        for d in range(lo, cut + 1):
            sort_run(out_i, start, fill[d])
            start = fill[d]
    return total


@njit(inline="always")
def record_radius(stats, qi, r, probes, nonempty, items):
    """Row ``r`` of query ``qi``: probes, non-empty buckets, empty buckets
    (``probes - nonempty``) and items."""
    stats[PROBES, qi, r] = probes
    stats[NONEMPTY, qi, r] = nonempty
    stats[EMPTY, qi, r] = probes - nonempty
    stats[ITEMS, qi, r] = items


@njit(inline="always")
def _dropped(x, drop):
    """``x`` is in the sorted array ``drop`` (binary search)."""
    lo = 0
    hi = len(drop)
    while lo < hi:
        mid = (lo + hi) >> 1
        if drop[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo < len(drop) and drop[lo] == x


@njit
def rows_done(I, drop, k, all_seen):
    """Per row of k-NN ids ``I`` ``(nq, kk)``: whether it settles the query, i.e. it holds k
    live ids (>= 0 and not in the sorted array ``drop``, the tombstones), or it is padded (every
    item within the radius returned), or ``all_seen`` (kk covers the whole index). ``np.isin``
    and the masks cost ~20 us a one-query call."""
    out = np.empty(I.shape[0], dtype=np.bool_)
    for q in range(I.shape[0]):
        live = 0
        for t in range(I.shape[1]):
            if I[q, t] >= 0 and not _dropped(I[q, t], drop):
                live += 1
        out[q] = all_seen or live >= k or (I.shape[1] > 0 and I[q, I.shape[1] - 1] < 0)
    return out


@njit
def merge_rows(lims_a, Da, Ia, lims_b, Db, Ib, drop, k):
    """Per query ``q``, rows ``a[lims_a[q]:lims_a[q+1]]`` and ``b[...]`` (each ordered by
    (distance, id)) merged into one list ordered by (distance, id).

    Entries with id < 0 (padding) are skipped, and so are ids of ``a`` found in the sorted
    array ``drop`` (tombstones). With ``k >= 1`` the output is the ``(nq, k)`` layout flattened
    (first ``k`` per query, padded with id -1 and distance -1); with ``k < 0`` it is CSR, every
    entry kept. Returns ``(counts, D, I)``.
    """
    nq = len(lims_a) - 1
    if k >= 1:
        size = nq * k
    else:
        size = (lims_a[nq] - lims_a[0]) + (lims_b[nq] - lims_b[0])
    out_d = np.full(size, -1, dtype=np.int32)
    out_i = np.full(size, -1, dtype=np.int64)
    counts = np.zeros(nq, dtype=np.int64)
    pos = 0
    for q in range(nq):
        start = q * k if k >= 1 else pos
        pos = start
        cap = start + k if k >= 1 else size
        i = lims_a[q]
        j = lims_b[q]
        end_a = lims_a[q + 1]
        end_b = lims_b[q + 1]
        while pos < cap:
            while i < end_a and (Ia[i] < 0 or _dropped(Ia[i], drop)):
                i += 1
            while j < end_b and Ib[j] < 0:
                j += 1
            if i < end_a and (j >= end_b or Da[i] < Db[j] or (Da[i] == Db[j]
                                                              and Ia[i] <= Ib[j])):
                out_d[pos] = Da[i]
                out_i[pos] = Ia[i]
                i += 1
            elif j < end_b:
                out_d[pos] = Db[j]
                out_i[pos] = Ib[j]
                j += 1
            else:
                break
            pos += 1
        counts[q] = pos - start
    if k < 0:
        return counts, out_d[:pos].copy(), out_i[:pos].copy()
    return counts, out_d, out_i


@njit
def keep_first_rows(blocked, lims, P, start):
    """Greedy in order over a block of items at positions ``start .. start + m - 1``: item ``j``
    is kept unless ``blocked[j]`` or an earlier kept item of the block lies in its row
    ``P[lims[j]:lims[j+1]]`` (positions within the radius; its own position among them).
    Returns the kept mask ``(m,)``."""
    m = len(blocked)
    kept = np.zeros(m, dtype=np.bool_)
    for j in range(m):
        if blocked[j]:
            continue
        ok = True
        for t in range(lims[j], lims[j + 1]):
            p = P[t] - start
            if p < j and kept[p]:
                ok = False
                break
        kept[j] = ok
    return kept


@njit
def row_bounds(words, keys):
    """For each row of ``keys``: ``(first, end)``, the run of rows equal to it in the
    code-sorted ``words`` (compared words first to last, the order of
    :func:`bucketsearch.index.table.sort_items`; ``first == end`` when absent), by binary
    search: O(len(keys) W log n), no pass over the items."""
    n, W = words.shape
    first = np.empty(keys.shape[0], dtype=np.int64)
    end = np.empty(keys.shape[0], dtype=np.int64)
    for k in range(keys.shape[0]):
        for upper in range(2):  # 0: first row >= key; 1: first row > key
            lo, hi = 0, n
            while lo < hi:
                mid = (lo + hi) >> 1
                order = 0
                for w in range(W):
                    if words[mid, w] != keys[k, w]:
                        order = -1 if words[mid, w] < keys[k, w] else 1
                        break
                if order < 0 or (upper and order == 0):
                    lo = mid + 1
                else:
                    hi = mid
            if upper:
                end[k] = lo
            else:
                first[k] = lo
    return first, end


@njit(inline="always")
def _rows_equal(words, a, b):
    for w in range(words.shape[1]):
        if words[a, w] != words[b, w]:
            return False
    return True


@njit
def run_bounds_at(words, at):
    """For each position of ``at``: ``(first, end)``, the run of rows equal to ``words[at[k]]``
    in the code-sorted ``words`` (:func:`row_bounds` of those rows), by a galloping search each
    way from the position: O(W log run) reads next to it, where a binary search of the whole
    array reads ``2 log n`` rows at random (0.29 s of a calibration at 10M items)."""
    n = words.shape[0]
    first = np.empty(len(at), dtype=np.int64)
    end = np.empty(len(at), dtype=np.int64)
    for k in range(len(at)):
        t = np.int64(at[k])
        inner, outer, step = t, np.int64(-1), np.int64(1)  # the run starts in (outer, inner]
        while t - step >= 0:
            if not _rows_equal(words, t - step, t):
                outer = t - step
                break
            inner = t - step
            step *= 2
        lo, hi = outer + 1, inner
        while lo < hi:
            mid = (lo + hi) >> 1
            if _rows_equal(words, mid, t):
                hi = mid
            else:
                lo = mid + 1
        first[k] = lo
        inner, outer, step = t, n, np.int64(1)  # the run ends in [inner + 1, outer]
        while t + step < n:
            if not _rows_equal(words, t + step, t):
                outer = t + step
                break
            inner = t + step
            step *= 2
        lo, hi = inner + 1, outer
        while lo < hi:
            mid = (lo + hi) >> 1
            if _rows_equal(words, mid, t):
                lo = mid + 1
            else:
                hi = mid
        end[k] = lo
    return first, end
