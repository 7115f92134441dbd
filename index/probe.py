"""Exact Hamming-ball probing of a bucket table, with per-radius accounting.

A radius-``r`` probe enumerates all ``C(Q, r)`` codes at Hamming distance exactly ``r`` from the
query (XOR masks of ``r`` bit positions, next-combination order) and looks each up in the
:class:`~bucketsearch.index.item_table.ItemTable`. Range search probes radii ``0..R`` (radius
inclusive: ``d <= R``); k-NN probes radius after radius until ``k`` items are found, finishing
the last radius so that ties are broken exactly by (distance, id) (the bucket search of Jiang, Li
& Li).

Per query and radius the kernel records ``probes`` (= ``C(Q, r)``), ``nonempty_buckets``,
``empty_buckets``, ``items`` and ``lookup_ns`` (``clock_gettime(CLOCK_MONOTONIC)`` read inside
the compiled kernel at each radius boundary). Range search of one-word codes (Q <= 64) runs
:func:`_range_word_kernel` (radius 0: :func:`_range_word0_kernel`), written for small radii and
single queries, whose clock is the CPU's time-stamp counter
(:func:`bucketsearch.index._jit.cycle_counter`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bucketsearch.index._jit import (clz64, compiled_entry, ctz64, cycle_counter, monotonic_ns,
                                    njit, ns_per_tick, prefetch)
from bucketsearch.index.base import (DEFAULT_MAX_PROBES, NO_RESULT_CAP, OUTPUT_BUFFERS,
                                     PARALLEL_MIN_QUERIES, PROBE_CAP, STAT_FIELDS, WORD_DTYPE,
                                     IndexBase, ProbeLimitError,
                                     ResultLimitError, SearchStats, check_max_results, csr_to_knn,
                                     probe_counts, raise_if_over, raise_if_reached, run_chunked,
                                     run_resumable_chunked, stats_from_chunks)
from bucketsearch.index.codes import word_widths
from bucketsearch.index.disk.hugepages import collapse_later
from bucketsearch.index.kernels import (ITEMS, LOOKUP_NS, NONEMPTY, chunk_outputs, chunk_result,
                                        counting_sort, grow, record_radius, sort_run)
from bucketsearch.index.item_table import (ItemTable, filter_word_bits, find_row, find_word,
                                           home_and_fingerprint, probe_word, run_end)
from bucketsearch.index.scan import _collect
from bucketsearch.index.table import HASH_MULTIPLIER, sort_items

N_STAT_FIELDS = len(STAT_FIELDS)
_ROW_STRIDES = (8, 8)  # a C-contiguous (nq, 1) uint64 array's
_NDARRAY, _INT64, _INT32 = np.ndarray, np.dtype(np.int64), np.dtype(np.int32)


class _Binding(NamedTuple):
    """A table and what its searches derive from it, in one attribute, so a search never pairs
    a table with another's arguments: the arguments of :func:`_range_word0_kernel` and
    :func:`_range_word_kernel` after the head (both the table's :meth:`ItemTable.lookup_args`
    and its ids), those of :func:`_range_word_small` after the buffers (the same; none unless
    the codes have one word), and the kernels' compiled entries for those arguments
    (:func:`bucketsearch.index.base.run_resumable`)."""

    table: ItemTable
    args: tuple
    short_args: tuple
    compiled: dict

__all__ = ["DEFAULT_MAX_PROBES", "NO_RESULT_CAP", "PARALLEL_MIN_QUERIES", "PROBE_CAP",
           "STAT_FIELDS", "HammingIndex", "IndexBase", "ProbeLimitError", "ResultLimitError",
           "SearchStats", "check_max_results", "csr_to_knn", "flip_masks", "probe_counts",
           "raise_if_over", "run_chunked"]


def flip_masks(bits: int) -> tuple[np.ndarray, np.ndarray]:
    """For every bit position ``j``: the word that holds it and the XOR mask that flips it."""
    flip_word = np.empty(bits, dtype=np.int64)
    flip_mask = np.empty(bits, dtype=np.uint64)
    j = 0
    for w, width in enumerate(word_widths(bits)):
        for i in range(width):
            flip_word[j] = w
            flip_mask[j] = np.uint64(1) << np.uint64(width - 1 - i)
            j += 1
    return flip_word, flip_mask


@njit(inline="always")
def _emit(lo, r, words, ids, out_i, out_d, n_out):
    """Append the items of the bucket starting at position ``lo`` at distance ``r`` to the
    growing result buffers."""
    hi = run_end(words, lo)
    out_i = grow(out_i, n_out + hi - lo)
    out_d = grow(out_d, n_out + hi - lo)
    for t in range(lo, hi):
        out_i[n_out] = ids[t]
        out_d[n_out] = r
        n_out += 1
    return out_i, out_d, n_out


@njit(inline="always")
def _record_hit(b, hits, nonempty):
    """Keep bucket ``b`` (its first position) while the buffer has room; the count goes on
    regardless."""
    if nonempty < len(hits):
        hits[nonempty] = b
    return nonempty + 1


@njit(inline="always")
def next_prefix(prefix, bits):
    """The next larger ``bits``-bit integer with the popcount of ``prefix`` (Gosper's hack)
    that leaves a free position above its highest bit, or 0 when there is none (prefix 0, of
    radius 1, has no successor)."""
    one = np.uint64(1)
    if prefix == 0:
        return prefix
    c = prefix & (~prefix + one)
    rr = prefix + c
    if rr == 0:
        return rr
    prefix = rr | (((prefix ^ rr) >> np.uint64(2)) >> ctz64(c))
    if (prefix >> np.uint64(bits - 1)) != 0:  # the last bit needs a free position above
        return np.uint64(0)
    return prefix


@njit
def _probe_radius_word(q, r, bits, words, slots, fp_bits, direct, bitmap, ids, hits):
    """Probe the radius-r sphere of a one-word code (Q <= 64): ``(probes, nonempty)``.

    The r-bit masks are a prefix of r - 1 bits (enumerated with Gosper's hack: the next larger
    integer with the same popcount) and a last bit above the prefix's highest one, walked by the
    tight inner loop. Non-empty buckets go to ``hits``; the loop never allocates.
    """
    probes = 0
    nonempty = 0
    if r == 0:
        b = find_word(q, words, slots, fp_bits, direct, bitmap)
        if b >= 0:
            prefetch(ids, b)
            nonempty = _record_hit(b, hits, nonempty)
        return 1, nonempty
    one = np.uint64(1)
    prefix = (one << np.uint64(r - 1)) - one
    while True:
        base = q ^ prefix
        low = 64 - int(clz64(prefix))  # first position above the prefix
        bit = one << np.uint64(low)
        for _ in range(low, bits):
            probes += 1
            b = find_word(base ^ bit, words, slots, fp_bits, direct, bitmap)
            if b >= 0:
                prefetch(ids, b)  # its id, read when the radius is emitted
                nonempty = _record_hit(b, hits, nonempty)
            bit <<= one
        prefix = next_prefix(prefix, bits)
        if prefix == 0:
            break
    return probes, nonempty


@njit
def _probe_radius_words(q, r, bits, flip_word, flip_mask, cur, pos, words, slots, fp_bits,
                        direct, bitmap, hits):
    """Probe the radius-r sphere of a several-word code: ``(probes, nonempty)``.

    Bit positions ``pos[0] < ... < pos[r-1]`` advance in next-combination order; ``cur`` is
    the query with those bits flipped.
    """
    W = len(q)
    probes = 0
    nonempty = 0
    for w in range(W):
        cur[w] = q[w]
    for j in range(r):
        pos[j] = j
        cur[flip_word[j]] ^= flip_mask[j]
    while True:
        probes += 1
        b = find_row(cur, W, words, slots, fp_bits, direct, bitmap)
        if b >= 0:
            nonempty = _record_hit(b, hits, nonempty)
        i = r - 1
        while i >= 0 and pos[i] == bits - r + i:
            i -= 1
        if i < 0:
            break
        for j in range(i, r):
            cur[flip_word[pos[j]]] ^= flip_mask[pos[j]]
        pos[i] += 1
        for j in range(i + 1, r):
            pos[j] = pos[j - 1] + 1
        for j in range(i, r):
            cur[flip_word[pos[j]]] ^= flip_mask[pos[j]]
    return probes, nonempty


@njit(inline="always")
def _same_row(words, i, j, W):
    for w in range(W):
        if words[i, w] != words[j, w]:
            return False
    return True


@njit
def _finish_by_scan(xq, qi, r, k, found, max_radius, words, ids, hist, fill, stats, out_i,
                    out_d, n_out):
    """k-NN fallback: rank the items by distance instead of probing radius ``r`` on.

    One pass over the items with a running cut-off (:func:`bucketsearch.index.scan._collect`:
    the least distance within which ``k`` items lie, lowered as closer items arrive, so the
    pass is one popcount and a predictable branch per item) keeps the items within it; those
    at distance ``r..cut`` (the ``found`` items closer than ``r`` were emitted by the probes)
    are emitted by :func:`bucketsearch.index.kernels.counting_sort`, every radius to the cut
    complete, so ties stay exact by (distance, id). Per radius the statistics record
    ``probes = 0``, the buckets and items found there. Returns the output buffers, their
    length and the last radius. (The scratch is allocated here, once per fallback: a buffer
    carried through the kernel's query loop costs every query its refcounting.)
    """
    W = words.shape[1]
    sel = np.empty(4096, dtype=np.int64)
    sel_d = np.empty(4096, dtype=np.int32)
    while True:
        kept, cut = _collect(xq, qi, words, max_radius, k, sel, sel_d, NO_RESULT_CAP)
        if kept <= len(sel):
            break
        sel = np.empty(2 * kept, dtype=np.int64)  # rare: many ties within the cut-off
        sel_d = np.empty(2 * kept, dtype=np.int32)
    hist[:] = 0
    for t in range(kept):
        d = sel_d[t]
        if r <= d <= cut:
            hist[d] += 1
            i = sel[t]  # positions ascend: a code's run of items is kept whole
            if i == 0 or not _same_row(words, i, i - 1, W):
                stats[NONEMPTY, qi, d] += 1
    acc = 0
    for d in range(r, cut + 1):
        acc += hist[d]
    out_i = grow(out_i, n_out + acc)
    out_d = grow(out_d, n_out + acc)
    total = counting_sort(sel_d, sel, kept, ids, hist, r, cut, fill, out_d, out_i, n_out)
    for d in range(r, cut + 1):
        stats[ITEMS, qi, d] = hist[d]
    return out_i, out_d, n_out + total, cut


@njit
def _probe_kernel(xq, bits, flip_word, flip_mask, per_radius, max_radius, k, max_probes,
                  with_clock, max_results, stop, words, slots, fp_bits, direct, bitmap, ids,
                  n_codes):
    """Probe every query's Hamming ball to ``max_radius``; range search when ``k < 0``, k-NN
    (the ``k`` nearest within ``max_radius``) otherwise.

    k-NN grows the radius until ``k`` items are found or ``max_radius`` is done. When the next
    radius would take a query over ``max_probes``, or probe more buckets than there are distinct
    codes (``n_codes``), the query ranks the items by distance instead (:func:`_finish_by_scan`:
    exact, and cheaper), so k-NN never fails. Returns CSR results (counts, distances, ids)
    sorted by (distance, id) per query, the per-radius statistics, radii, total_ns, per query
    the radius from which it scanned (-1: none), and the results counted (``reached``).

    Result cap (range search): before a bucket's items are emitted, the chunk's result count
    plus the bucket's size is compared with ``max_results``; past it the kernel stops, sets
    ``stop[0]`` (shared by the chunks of one search, read before every query, so the other
    chunks stop too) and returns the count reached, a lower bound of the true total. The output
    buffers so never hold more than about ``max_results`` items.
    """
    nq, W = xq.shape
    ntotal = len(ids)
    width = max_radius + 1
    counts, stats, radii, total_ns, scanned_from, out_d, out_i = chunk_outputs(
        nq, len(STAT_FIELDS), nq, width)
    hist = np.zeros(bits + 2, dtype=np.int64)
    fill = np.zeros(bits + 2, dtype=np.int64)
    n_out = 0
    cur = np.empty(W, dtype=np.uint64)
    pos = np.empty(max(max_radius, 1), dtype=np.int64)
    hits = np.empty(4096, dtype=np.int64)
    reached = -1  # >= 0 once the result cap stopped this chunk
    for qi in range(nq):
        if stop[0] != 0:
            break
        start = n_out
        spent = 0
        t_query = monotonic_ns() if with_clock else 0  # one clock read per radius boundary
        t_prev = t_query
        for r in range(width):
            if k >= 0 and (spent + per_radius[r] > max_probes or per_radius[r] > n_codes):
                scanned_from[qi] = r
                out_i, out_d, n_out, last = _finish_by_scan(
                    xq, qi, r, k, n_out - start, max_radius, words, ids, hist, fill,
                    stats, out_i, out_d, n_out)
                if with_clock:
                    t_now = monotonic_ns()
                    stats[LOOKUP_NS, qi, r] = t_now - t_prev  # the whole scan, charged to r
                    t_prev = t_now
                radii[qi] = last + 1
                break
            spent += per_radius[r]
            seg = n_out
            while True:
                if W == 1:
                    probes, nonempty = _probe_radius_word(
                        xq[qi, 0], r, bits, words, slots, fp_bits, direct, bitmap, ids, hits)
                else:
                    probes, nonempty = _probe_radius_words(
                        xq[qi], r, bits, flip_word, flip_mask, cur, pos, words, slots, fp_bits,
                        direct, bitmap, hits)
                if nonempty <= len(hits):
                    break
                hits = np.empty(2 * nonempty, dtype=np.int64)  # rare: probe the radius again
            for h in range(nonempty):
                lo = hits[h]
                size = run_end(words, lo) - lo
                if n_out + size > max_results:
                    reached = n_out + size
                    break
                out_i, out_d, n_out = _emit(lo, r, words, ids, out_i, out_d, n_out)
            if reached >= 0:
                break
            sort_run(out_i, seg, n_out)
            record_radius(stats, qi, r, probes, nonempty, n_out - seg)
            if with_clock:
                t_now = monotonic_ns()
                stats[LOOKUP_NS, qi, r] = t_now - t_prev
                t_prev = t_now
            radii[qi] = r + 1
            if k >= 0 and (n_out - start >= k or n_out - start >= ntotal):
                break
        if reached >= 0:
            stop[0] = 1
            counts[qi] = n_out - start
            break
        if k >= 0 and n_out - start > k:
            n_out = start + k
        counts[qi] = n_out - start
        total_ns[qi] = t_prev - t_query
    return chunk_result(counts, out_d, out_i, n_out, stats, radii, total_ns, scanned_from,
                        reached)


@njit(inline="always")
def _lookup_words(xq, q_start, words, slots, fp_bits, direct, bitmap, hits, lims, with_clock,
                  ticks):
    """Radius-0 lookups of queries ``q_start..``: ``hits[qi]`` the first position of the
    query's bucket (-1: none), ``lims[qi + 1]`` its size and, ``with_clock``, ``ticks[qi]`` the
    clock after the lookup. Returns the sizes' sum.

    A hashed table's filter is read while the batch's misses outnumber its hits (a miss then
    costs one load of the filter instead of a walk along the slots: 17% less a query at 3
    misses in 4), not while hits do (the filter's load only adds to a hit's: 40% more a query
    when all hit). A loop with no exit and no store but these: written like this the lookups
    of successive queries overlap; with an early return, a ``clock_gettime`` call or a
    statistics row in the loop, even on branches not taken, it measured 40-45 ns a query."""
    total = 0
    found = 0
    for qi in range(q_start, xq.shape[0]):
        size = 0
        if direct or 2 * found < qi - q_start:
            h = find_word(xq[qi, 0], words, slots, fp_bits, direct, bitmap)
        else:
            h = probe_word(xq[qi, 0], words, slots, fp_bits)
        if h >= 0:
            size = run_end(words, h) - h
            found += 1
        hits[qi] = h
        lims[qi + 1] = size
        total += size
        if with_clock:
            ticks[qi] = cycle_counter()
    return total


@njit
def _range_word0_kernel(xq, with_stats, tick_ns, max_results, words, slots, fp_bits, direct,
                        bitmap, ids, q_start, n_out, lims, out_d, out_i, hits, stats, total_ns):
    """:func:`_range_word_kernel` at radius 0: all lookups first (:func:`_lookup_words`, into
    ``hits``, which must hold ``nq`` entries: else ``need = nq`` is returned), then, the room
    checked once, the results copied. With ``with_stats`` a query's ``lookup_ns`` and
    ``total_ns`` are the time between the end of its lookup and the end of the previous one,
    plus the time its items took to copy (``tick_ns``: ns per clock tick)."""
    nq = xq.shape[0]
    if len(hits) < nq:
        return q_start, n_out, -1, nq
    t_start = cycle_counter() if with_stats else 0
    total = _lookup_words(xq, q_start, words, slots, fp_bits, direct, bitmap, hits, lims,
                          with_stats, total_ns)
    if n_out + total > max_results:
        return q_start, n_out, n_out + total, 0
    if n_out + total > len(out_i):
        return q_start, n_out, -1, 0
    t_copy = cycle_counter() if with_stats else 0
    first = n_out
    for qi in range(q_start, nq):
        h = hits[qi]
        size = lims[qi + 1]  # 0 when h < 0
        for t in range(size):
            out_i[n_out + t] = ids[h + t]
        n_out += size
        lims[qi + 1] = n_out
        if with_stats:
            record_radius(stats, qi, 0, 1, 1 if h >= 0 else 0, size)
            t_end = total_ns[qi]
            t_now = cycle_counter()  # the copy of its items is part of a query's lookup
            total_ns[qi] = int(((t_end - t_start) + (t_now - t_copy)) * tick_ns)
            stats[LOOKUP_NS, qi, 0] = total_ns[qi]
            t_start, t_copy = t_end, t_now
    out_d[first:n_out] = 0
    return nq, n_out, -1, 0


@njit
def _range_word_kernel(xq, R, bits, with_stats, tick_ns, max_results, words, slots, fp_bits,
                       direct, bitmap, ids, q_start, n_out, lims, out_d, out_i, hits, stats,
                       total_ns):
    """Range search (``d <= R``, ``R >= 1``; radius 0 alone: :func:`_range_word0_kernel`) of
    one-word codes (Q <= 64) written for small radii and single queries: hits go straight to
    the caller's output buffers, nothing is allocated and no array is reassigned in the query
    loop, and with ``with_stats`` off no statistic is written and no clock read.

    Queries ``q_start..`` are searched; ``lims[qi + 1]`` receives the end of query ``qi``'s
    results in ``out_d`` / ``out_i`` (``lims[0] = 0`` is the caller's); ``hits`` is scratch for
    the non-empty buckets of one radius. Returns ``(q_end, n_out, reached, need)``: with
    ``q_end < nq`` and ``reached < 0`` the kernel stopped before query ``q_end`` (its partial
    results dropped) because the output buffers are full (``need == 0``) or ``hits`` needs
    ``need`` entries: grow them and call again from ``q_end`` with this ``n_out``;
    ``reached >= 0``: the result cap ``max_results`` was passed (a lower bound of the total).
    With ``with_stats``, ``stats`` ``(5, nq, R + 1)`` and ``total_ns`` ``(nq,)`` are filled;
    the clock (:func:`bucketsearch.index._jit.cycle_counter`, ``tick_ns`` ns per tick) is read
    once per radius boundary, the end of a query being the start of the next.
    """
    nq = xq.shape[0]
    cap = len(out_i)
    t_prev = cycle_counter() if with_stats else 0
    for qi in range(q_start, nq):
        q = xq[qi, 0]
        start = n_out
        t_query = t_prev
        for r in range(R + 1):
            seg = n_out
            probes, nonempty = _probe_radius_word(q, r, bits, words, slots, fp_bits, direct,
                                                  bitmap, ids, hits)
            if nonempty > len(hits):
                return qi, start, -1, nonempty
            for h in range(nonempty):
                lo = hits[h]
                hi = run_end(words, lo)
                if n_out + hi - lo > max_results:
                    return qi, start, n_out + hi - lo, 0
                if n_out + hi - lo > cap:
                    return qi, start, -1, 0
                for t in range(lo, hi):
                    out_i[n_out] = ids[t]
                    out_d[n_out] = r
                    n_out += 1
            if nonempty > 1:
                sort_run(out_i, seg, n_out)
            if with_stats:
                record_radius(stats, qi, r, probes, nonempty, n_out - seg)
                t_now = cycle_counter()
                stats[LOOKUP_NS, qi, r] = int((t_now - t_prev) * tick_ns)
                t_prev = t_now
        lims[qi + 1] = n_out
        if with_stats:
            total_ns[qi] = int((t_prev - t_query) * tick_ns)
    return nq, n_out, -1, 0


@njit
def _range_word0_short(xq, lims, out_i, words, slots, fp_bits, direct, bitmap, ids):
    """Radius 0 of a batch of one-word codes from its first query, in one pass: per query the
    lookup of its code (the filter read while the batch's misses outnumber its hits, as in
    :func:`_lookup_words`), then its bucket's ids copied to ``out_i`` (ascending: the items
    are sorted by (code, id)) and ``lims[qi + 1]`` set to the end of its results
    (``lims[0] = 0`` is the caller's). Returns the results' count, or ``-1 - q`` when
    ``out_i`` has no room for query ``q``'s (``lims[:q + 1]`` and the results before
    ``lims[q]`` are final).

    The probe is written out here, not called: this loop takes no array through an inlined
    function, so numba leaves no reference counting in it whatever its branches (the
    two-pass :func:`_range_word0_kernel`'s loop kept its speed only while it had no exit; a
    prefetch added to it brought back increments and decrements of three arrays, 3.5x
    slower). One pass instead of that kernel's lookups, then copies, then a fill of the
    distances (left to the caller: all 0): 4.6 against 5.6 us a batch of 1,000 uniform
    queries, 1 in 4 of them hits (bench/RESULTS.md section 32)."""
    nq = xq.shape[0]
    n = words.shape[0]
    cap = len(out_i)
    n_slots = np.uint64(len(slots))
    fpb = np.uint64(fp_bits)
    fp_mask = (np.uint64(1) << fpb) - np.uint64(1)
    n_filter = len(bitmap)
    n_out = 0
    found = 0
    for qi in range(nq):
        q = xq[qi, 0]
        lo = np.int64(-1)
        hi = np.int64(-1)
        if direct:
            lo = np.int64(slots[q])
            hi = np.int64(slots[q + np.uint64(1)])
        else:
            h = q * HASH_MULTIPLIER
            f, bits = filter_word_bits(h, n_filter)
            if 2 * found >= qi or (bitmap[f] & bits) == bits:
                s, fp = home_and_fingerprint(h, n_slots, fpb)
                while True:
                    e = np.uint64(slots[s])
                    if e == np.uint64(0):
                        break
                    if (e & fp_mask) == fp:
                        p = np.int64(e >> fpb) - 1
                        if words[p, 0] == q:
                            lo = p
                            break
                    s += np.uint64(1)
                    if s == n_slots:
                        s = np.uint64(0)
            if lo >= 0:
                hi = lo + 1
                while hi < n and words[hi, 0] == q:
                    hi += 1
        if hi > lo:
            found += 1
            if n_out + hi - lo > cap:
                return -1 - qi
            for t in range(lo, hi):
                out_i[n_out] = ids[t]
                n_out += 1
        lims[qi + 1] = n_out
    return n_out


@njit
def _range_word_small(xq, R, lims, out_d, out_i, hits, words, slots, fp_bits, direct, bitmap,
                      ids):
    """Range search of a batch of 64-bit codes from its first query, without statistics or
    result cap: :func:`_range_word0_short` (``R = 0``) or :func:`_range_word_kernel`, for the
    short way of :meth:`HammingIndex.range_search`. 12 arguments instead of 20 (each costs
    ~30-50 ns to pass from Python, a one-query call ~2 us) and one int back: the results'
    count, or ``-1 - q`` when a buffer filled before query ``q`` (then ``lims[:q + 1]`` and
    the results before ``lims[q]`` are final)."""
    if R == 0:
        return _range_word0_short(xq, lims, out_i, words, slots, fp_bits, direct, bitmap, ids)
    stats = np.empty((0, 0, 0), dtype=np.int64)
    total_ns = np.empty(0, dtype=np.int64)
    q, n_out, _, _ = _range_word_kernel(xq, R, 64, False, 1.0, NO_RESULT_CAP, words, slots,
                                        fp_bits, direct, bitmap, ids, 0, 0, lims, out_d,
                                        out_i, hits, stats, total_ns)
    return n_out if q == xq.shape[0] else -1 - q


class HammingIndex(IndexBase):
    """Single-table bucket search (hash lookup) over ``bits``-bit codes: an
    :class:`~bucketsearch.index.item_table.ItemTable` over the items sorted by (code, id).

    ``max_probes`` bounds ``sum_{r<=R} C(Q, r)`` of one query: a range search beyond it raises
    :class:`ProbeLimitError` (the planner then picks multi-index hashing or the linear scan);
    a k-NN query that would pass it, or would probe more buckets in one radius than there are
    distinct codes, ranks the items by a scan from that radius on (exact;
    ``stats.scanned_from`` records the radius, and those radii show ``probes = 0``).
    """

    kind = "single"
    sorted_by_code = True
    legacy_kinds = ("hamming",)

    def __init__(self, bits: int, max_probes: int = DEFAULT_MAX_PROBES):
        super().__init__(bits)
        if not 1 <= int(max_probes) <= PROBE_CAP:
            raise ValueError(f"max_probes must be in [1, {PROBE_CAP}], got {max_probes}")
        self._radius_cache: dict[int, tuple] = {}  # _radius_counts by R
        self.max_probes = int(max_probes)
        self.flip_word, self.flip_mask = flip_masks(self.bits)
        self._rebuild(np.empty((0, len(word_widths(self.bits))), np.uint64),
                      np.empty(0, np.int64))

    def _rebuild(self, words, ids):
        words = np.asarray(words, dtype=np.uint64).reshape(-1, len(word_widths(self.bits)))
        self._rebuild_sorted(*sort_items(words, ids, self.build_threads))

    def _rebuild_sorted(self, words: np.ndarray, ids: np.ndarray) -> None:
        """The table of items already sorted by (code, id); ``words`` and ``ids`` are kept, not
        copied (auto shares them with its multi-index and its scan); its arrays then queued for
        huge pages (:func:`bucketsearch.index.disk.hugepages.collapse_later`)."""
        self.table = ItemTable.from_sorted(self.bits, words, ids)
        collapse_later(self.memory_arrays().values())

    @property
    def max_probes(self) -> int:
        return self._max_probes

    @max_probes.setter
    def max_probes(self, value: int) -> None:
        """The limit, and with it the largest radius of the short way of :meth:`range_search`
        (-1: none; codes of one word: radius 0, and for 64-bit codes every radius within the
        limit: :func:`_range_word_small` flips 64 bits)."""
        self._max_probes = int(value)
        r = -1 if self.bits > 64 else 0
        while self.bits == 64 and r < self.bits and self.probe_count(r + 1) <= self._max_probes:
            r += 1
        self._short_radius = r
        # range_search's own short way takes the queries unchecked: whole words only (a
        # query of narrower codes is checked for bits above them first, then _run takes it)
        self._unchecked_radius = r if self.bits == 64 else -1

    @property
    def table(self) -> ItemTable:
        return self._bound.table

    @table.setter
    def table(self, table: ItemTable) -> None:
        """The table and its :class:`_Binding`."""
        args = (*table.lookup_args(), table.ids)
        self._bound = _Binding(table, args, args if self.bits <= 64 else (), {})
        self._short = None  # (the compiled entries of _range_word_small, its arguments, and
        #                      of _range_word0_short: _range_short)

    def snapshot(self) -> tuple[dict, dict]:
        return {"max_probes": self.max_probes, "table": self.table.meta()}, self.table.arrays()

    @classmethod
    def from_snapshot(cls, bits: int, meta: dict, arrays: dict) -> HammingIndex:
        index = cls(bits, max_probes=meta["max_probes"])
        index.table = table_from_snapshot(bits, meta, arrays)
        return index

    @property
    def ntotal(self) -> int:
        return self.table.ntotal

    @property
    def ids(self) -> np.ndarray:
        """Item ids in table order: sorted by (code, id)."""
        return self.table.ids

    @property
    def words(self) -> np.ndarray:
        """Item codes in table order, aligned with :attr:`ids`."""
        return self.table.words

    def memory_bytes(self) -> int:
        return sum(a.nbytes for a in self.memory_arrays().values())

    def memory_arrays(self) -> dict:
        """Every array the index holds, by identity (``id(array)``), so a holder of several
        engines sharing arrays counts each once
        (:meth:`bucketsearch.index.planner.AutoIndex.memory_bytes`)."""
        return {id(a): a for a in self.table.arrays().values()}

    def probe_count(self, max_distance: int, nq: int = 1) -> int:
        """Exact ``sum_{r<=R} C(Q, r)``: buckets probed by one radius-R query (any ``nq``)."""
        return self._radius_counts(max_distance)[0]

    def _radius_counts(self, R: int) -> tuple[int, np.ndarray]:
        """Cached ``(sum_{r<=R} C(Q, r), the C(Q, r) clipped at PROBE_CAP as the kernel's
        int64 array)`` (R + 1 exact binomials: ~8 us of a one-query k-NN search)."""
        hit = self._radius_cache.get(R)
        if hit is None:
            counts = probe_counts(self.bits, R)
            hit = self._radius_cache[R] = (
                sum(counts), np.array([min(c, PROBE_CAP) for c in counts], dtype=np.int64))
        return hit

    def range_search(self, queries, max_distance: int, stats: bool = False,
                     max_results: int | None = None):
        """:meth:`IndexBase.range_search`. The short way, for a search of 64-bit codes given as
        a C-contiguous ``(nq, 1)`` uint64 array (strides 8, 8), within the probe limit, without
        statistics or cap, run on the calling thread (fewer than :data:`PARALLEL_MIN_QUERIES`
        queries, or ``threads = 1``): those checks in a few comparisons, then
        :meth:`_range_short` (a one-query call was 2.7x a bare Numba call of a minimal probe,
        mostly Python: bench/RESULTS.md section 27)."""
        if (stats is False and max_results is None and type(queries) is _NDARRAY
                and queries.dtype is WORD_DTYPE and type(max_distance) is int):
            shape = queries.shape
            if (len(shape) == 2 and shape[1] == 1 and queries.strides == _ROW_STRIDES
                    and 0 <= max_distance <= self._unchecked_radius
                    and (shape[0] < PARALLEL_MIN_QUERIES or self.threads == 1)):
                # _range_short's lines, here: a call less (~0.1 us of ~2)
                short = self._short
                if short is None:
                    return self._range_short(queries, max_distance)
                lims = np.zeros(shape[0] + 1, _INT64)
                if max_distance == 0:  # 9 arguments, not 12; distances 0, not written
                    out_i = OUTPUT_BUFFERS.i
                    n = short[2](queries, lims, out_i, *short[1])
                    if n >= 0:
                        return lims, np.zeros(n, _INT32), out_i[:n].copy()
                else:
                    out_d, out_i, hits = OUTPUT_BUFFERS.all
                    n = short[0](queries, max_distance, lims, out_d, out_i, hits, *short[1])
                    if n >= 0:
                        return lims, out_d[:n].copy(), out_i[:n].copy()
                return self._range_rest(queries, max_distance, lims, -1 - n)
        return IndexBase.range_search(self, queries, max_distance, stats, max_results)

    def _range_short(self, xq: np.ndarray, R: int):
        """Range search of one-word codes ``xq`` (C-contiguous) on the calling thread
        without statistics or cap: one call of :func:`_range_word_small` through its compiled
        entry, into this thread's reusable buffers (:meth:`_range_rest` when they fill). Keeps
        in ``_short`` that entry, the table's arguments and the compiled entry of
        :func:`_range_word0_short` (both compiled here, whatever ``R``: a warm-up leaves
        neither to compile)."""
        bound = self._bound
        out_d, out_i, hits = OUTPUT_BUFFERS.all
        lims = np.zeros(xq.shape[0] + 1, np.int64)
        entry = bound.compiled.get(_range_word_small)
        if entry is None:
            entry = bound.compiled[_range_word_small] = compiled_entry(
                _range_word_small, (xq, R, lims, out_d, out_i, hits, *bound.short_args))
        entry0 = bound.compiled.get(_range_word0_short)
        if entry0 is None:
            entry0 = bound.compiled[_range_word0_short] = compiled_entry(
                _range_word0_short, (xq, lims, out_i, *bound.short_args))
        self._short = (entry, bound.short_args, entry0)
        n = entry(xq, R, lims, out_d, out_i, hits, *bound.short_args)
        if n >= 0:  # (radius 0: the kernel writes no distances, all 0)
            return lims, out_d[:n].copy() if R else np.zeros(n, np.int32), out_i[:n].copy()
        return self._range_rest(xq, R, lims, -1 - n)

    def _range_rest(self, xq: np.ndarray, R: int, lims: np.ndarray, q: int):
        """:meth:`_range_short` after a buffer filled before query ``q``: the results of the
        queries before it (in this thread's buffers, ``lims[:q + 1]``) and those of the queries
        left, run the resumable way (:meth:`_run_range_word`)."""
        out_d, out_i, _ = OUTPUT_BUFFERS.all
        done = int(lims[q])
        head_d = out_d[:done].copy() if R else np.zeros(done, np.int32)
        head_i = out_i[:done].copy()
        rest_lims, rest_d, rest_i = self._run_range_word(xq[q:], R, False, None)
        lims[q + 1:] = rest_lims[1:] + done
        return lims, np.concatenate([head_d, rest_d]), np.concatenate([head_i, rest_i])

    def _run(self, xq, max_radius, k, stats, max_results=None):
        if (k < 0 and not stats and max_results is None and xq.shape[1] == 1
                and max_radius <= self._short_radius and xq.flags.c_contiguous
                and (len(xq) < PARALLEL_MIN_QUERIES or self.threads == 1)):
            return self._range_short(xq, max_radius)  # (an auto index's plan of the table)
        if k < 0 and xq.shape[1] == 1:
            return self._run_range_word(xq, max_radius, stats, max_results)
        per_radius = self._radius_counts(max_radius)[1]
        stop = np.zeros(1, dtype=np.int64)
        table = self.table
        args = (self.bits, self.flip_word, self.flip_mask, per_radius, max_radius, k,
                self.max_probes, stats, check_max_results(max_results), stop,
                *table.lookup_args(), table.ids, table.distinct_codes)
        lims, D, I, rest = run_chunked(lambda chunk: _probe_kernel(chunk, *args), xq,
                                       self.threads)
        raise_if_over(max_results, stop, [r[4] for r in rest], lims)
        return ((lims, D, I, self._tagged(stats_from_chunks(rest), k)) if stats
                else (lims, D, I))

    def _run_range_word(self, xq, R, stats, max_results):
        """Range search of one-word codes: :func:`_range_word_kernel` (radius 0:
        :func:`_range_word0_kernel`; no per-query allocation, no statistics unless asked),
        resumable over the thread's reusable output buffers."""
        stats = bool(stats)
        head = (stats, ns_per_tick() if stats else 1.0, check_max_results(max_results))
        bound = self._bound  # the table's arguments bound once per table
        if R == 0:
            kernel, args = _range_word0_kernel, (*head, *bound.args)
        else:
            kernel, args = _range_word_kernel, (R, self.bits, *head, *bound.args)
        lims, D, I, st, reached = run_resumable_chunked(kernel, xq, R + 1, stats, N_STAT_FIELDS,
                                                        self.threads, args, bound.compiled)
        if max_results is not None:
            raise_if_reached(max_results, reached, lims)
        return (lims, D, I, self._tagged(st, -1)) if stats else (lims, D, I)

    def _check_probe_limit(self, R: int) -> None:
        probes = self.probe_count(R)
        if probes > self.max_probes:
            raise ProbeLimitError(probes, self.max_probes, R, self.bits)


def table_from_snapshot(bits: int, meta: dict, arrays: dict) -> ItemTable:
    """The single table of a snapshot: ``words``, ``ids``, ``slots`` and ``meta["table"]``
    (format 3), or a format 1-2 bucket table (distinct ``codes``, ``offsets``, ``ids``,
    ``slots``, ``bitmap``), whose items are expanded from its buckets and indexed again."""
    if "offsets" not in arrays:
        return ItemTable.from_arrays(bits, arrays, meta["table"])
    offsets = np.asarray(arrays["offsets"], dtype=np.int64)
    words = np.repeat(np.asarray(arrays["codes"]), np.diff(offsets), axis=0)
    return ItemTable.from_sorted(bits, np.ascontiguousarray(words, dtype=np.uint64),
                                 arrays["ids"])
