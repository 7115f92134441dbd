"""Multi-index hashing (Norouzi, Punjani & Fleet, "Fast search in Hamming space with multi-index
hashing", CVPR 2012): ``m`` bucket tables over contiguous substrings of the code.

Substrings: a ``Q``-bit code is cut into ``m`` contiguous bit ranges (the first ``Q mod m`` of
``ceil(Q/m)`` bits, the others of ``floor(Q/m)``; every width <= 64, so a substring is one word),
read most significant bit first like a code (see :mod:`index.codes`). Table ``j`` is the
*positions* of the items in the shared ``(n, W)`` arrays :attr:`MultiIndex.words` and
:attr:`MultiIndex.ids` (items sorted by (code, id)) ordered by (substring ``j``, id), with a
lookup from a substring value to its run (:mod:`index.mih_tables`).

Pigeonhole rule (tight form): if ``d(x, q) <= R`` with ``R = m * s + a`` (``s = floor(R/m)``,
``a = R mod m``), then ``d_j(x, q) <= s`` on one of the substrings ``0..a`` or ``d_j <= s - 1`` on
one of the others (otherwise ``d >= (a+1)(s+1) + (m-a-1) s = R + 1``). Hence a radius-R search
probes substring ``j`` to radius ``floor((R - j) / m)``: substrings ``0..a`` to ``s``, the others
to ``s - 1``. Growing the radius one step, from ``R - 1`` to ``R``, adds exactly one shell:
substring ``R mod m`` at substring radius ``floor(R/m)`` (``C(w_j, floor(R/m))`` probes). That
step is the unit of the per-radius statistics below, and an item first seen at step ``R`` is at
distance ``>= R`` (it would have been found earlier otherwise), so after step ``R`` every item
within ``R`` is known: the exact stop of k-NN by growing the radius.

A *candidate* is one entry of a probed substring bucket: at step ``R`` an item whose substring
``j = R mod m`` is at distance exactly ``floor(R/m)`` from the query's. ``candidates`` counts
them with repetitions (an item is met again by the other substrings), ``unique_candidates``
counts the first visits (an item is first visited at step ``min_j (m d_j + j)``). Duplicates are
dropped with a visit bitset over the items (``n / 8`` bytes, made on first use): a query sets
an item's bit at its first visit and zeroes its candidates' bytes when it ends.
Every unique candidate is verified by its full distance ``sum_w popcount(q_w XOR x_w)``.

Statistics per query and radius step ``R`` (arrays ``(nq, R + 1)`` like
:class:`~index.probe.HammingIndex`): ``probes`` (= ``C(w_j, floor(R/m))`` for ``j = R mod m``,
0 when the substring radius exceeds ``w_j``), ``nonempty_buckets``, ``empty_buckets``, ``items``
(results at distance exactly ``R``), ``lookup_ns`` (probing and verification of the step),
``candidates`` and ``unique_candidates``; ``scanned_from`` ``(nq,)`` is the step at which a k-NN
query switched to a scan (below), -1 when it did not.

Range search of one-word codes (Q <= 64) with ``R < m`` takes a shorter path,
:func:`_mih_exact_kernel`: every substring probed is searched at radius 0, so the search is
``R + 1`` exact lookups, and a candidate already met is recognised by its XOR with the query
(it is 0 on an earlier substring) instead of a visit bit (issue 17; bench/RESULTS.md,
small radii). It reads the candidates through the tables' positions; with statistics it
reads the clock once per :data:`CLOCK_GROUP` queries, so ``total_ns`` and ``lookup_ns`` are
means over the group.

k-NN of one-word codes (every substring under 64 bits) is :mod:`index.mih_knn`'s incremental
search over the same tables (:meth:`MultiIndex._knn_csr`). Longer codes: the k-NN of
:func:`_mih_kernel` grows the radius step by step. When the next step would push the query
over ``max_probes`` or would probe more substring buckets than there are items, it verifies
every item not seen yet instead (a scan of the shared array, exact), so k-NN never raises. Range search raises
:class:`MIHProbeLimitError` up front when its exact probe count exceeds ``max_probes``, like the
single table.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from bucketsearch.index._jit import (clz64, compiled_entry, ctz64, cycle_counter,
                                    monotonic_ns, njit, ns_per_tick, popcount64, prefetch)
from bucketsearch.index.base import (DEFAULT_MAX_PROBES, NO_RESULT_CAP, OUTPUT_BUFFERS,
                                     PARALLEL_MIN_QUERIES, PROBE_CAP, WORD_DTYPE, IndexBase,
                                     ProbeLimitError, check_max_results, raise_if_over,
                                     raise_if_reached, run_chunked, run_resumable_chunked,
                                     stats_from_chunks)
from bucketsearch.index.codes import check_bits, n_words, word_widths
from bucketsearch.index.disk.hugepages import collapse_later
from bucketsearch.index.kernels import (CANDIDATES, EMPTY, ITEMS, LOOKUP_NS, NONEMPTY, PROBES,
                                        UNIQUE_CANDIDATES, chunk_outputs, chunk_result,
                                        counting_sort, grow, hamming, record_radius, sort_run)
from bucketsearch.index.mih_knn import knn_search
from bucketsearch.index.item_table import filter_word_bits, home_and_fingerprint
from bucketsearch.index.table import HASH_MULTIPLIER
from bucketsearch.index.mih_tables import (T_BASE, T_BITMAP, T_BITMAP_WORDS, T_DIRECT, T_FP_BITS,
                                           T_MASK, T_ROW_BITS, T_SHIFT, T_SLOTS, T_START,
                                           T_WIDTH, SubstringTables, code_tag, entry_row,
                                           row_mask, substring_of, tag_distance,
                                           with_tag_columns,
                                           bucket, build_tables, bucket_ends, distinct_values,
                                           ids_order_words, item_substring, run_sizes,
                                           table_rows, table_values_at)
from bucketsearch.index.table import sort_items

MAX_SUBSTRING_BITS = 64
MIN_LOG2_N = 8          # Norouzi's rule uses log2(max(N, 2^8)): tiny indexes get <= Q/8 tables
#: the arrays of a snapshot's substring tables (:class:`index.mih_tables.SubstringTables`)
TABLE_ARRAYS = SubstringTables.ARRAYS
#: Queries per block of the exact-substring kernel (their lookups first, then their candidates)
#: and per clock read with statistics (their mean time).
CLOCK_GROUP = 32
#: Candidates per lookup whose position, code and id are prefetched after a block's lookups,
#: for a query of more than :data:`SMALL_QUERY` candidates (radius >= 1), with no branch (a
#: fixed count); the ids only of a bucket of more (a query's results are then mostly among its
#: candidates). The rest of such a query's buckets is prefetched one query ahead.
PREFETCH_ITEMS = 1
#: A radius >= 1 query of the exact kernel with at most this many candidates has none of its
#: candidates prefetched and writes its results in one run, ordered by insertion; more go to
#: sub-runs merged by id (:func:`_merge_sub_runs`)
SMALL_QUERY = 16
#: A radius >= 1 query of the exact kernel with at most this many candidates skips those whose
#: tag is over the radius (:mod:`index.mih_tables`; a sparse code's candidates, mostly not
#: results: 10M uniform codes at radius 2 hold ~15); a larger query's (a cluster's, mostly
#: results) are all read, without the tag's test (1.1-1.2x in the caches with it)
TAG_QUERY = 64


@njit
def _probe_substring_radius(q, r, bits, j, tables, starts, slots, bitmap, positions, ends,
                            words, word_width, hits):
    """Probe the radius-r sphere of substring value ``q`` (``bits`` <= 64) in substring table
    ``j`` (:func:`index.mih_tables.bucket`, written out: a helper taking the arrays refcounts
    them at every call, and most probes end at the filter): ``(probes, nonempty)``, the
    non-empty buckets' ``(lo, hi)`` in ``hits[2 b], hits[2 b + 1]`` while it has room (the
    count goes on). The keys are ``q`` XOR every mask of ``r`` bits within ``bits``, in
    increasing order (Gosper's hack)."""
    room = len(hits) // 2
    n = words.shape[0]
    one = np.uint64(1)
    direct = tables[j, T_DIRECT]
    sd = tables[j, T_BASE]
    one_word = words.shape[1] == 1
    shift = np.uint64(tables[j, T_SHIFT])
    mask = np.uint64(tables[j, T_MASK])
    f_words = tables[j, T_BITMAP_WORDS]
    f_base = tables[j, T_BITMAP]
    n_slots = np.uint64(tables[j, T_SLOTS])
    fpb = np.uint64(tables[j, T_FP_BITS])
    fp_mask = (one << fpb) - one
    pb = j * n
    eb = 0  # the table's first end bit (ends_bit_base)
    for jj in range(j):
        if not tables[jj, T_DIRECT]:
            eb += 64 * ((n + 63) // 64)
    top = ~np.uint64(0) if bits >= 64 else (one << np.uint64(bits)) - one
    flips = top if r >= 64 else (one << np.uint64(r)) - one
    probes = 0
    nonempty = 0
    while True:
        key = q ^ flips
        probes += 1
        if direct:
            lo = np.int64(starts[sd + np.int64(key)])
            hi = np.int64(starts[sd + np.int64(key) + 1])
        else:
            lo = 0
            hi = 0
            h = key * HASH_MULTIPLIER
            f, fbits = filter_word_bits(h, f_words)
            if bitmap[f_base + np.int64(f)] & fbits == fbits:
                sl, fp = home_and_fingerprint(h, n_slots, fpb)
                while True:
                    e = np.uint64(slots[sd + np.int64(sl)])
                    if e == np.uint64(0):
                        break
                    if (e & fp_mask) == fp:
                        cand = np.int64(e >> fpb) - 1
                        p = entry_row(positions, pb + cand, row_mask(tables))
                        v = (words[p, 0] >> shift) & mask if one_word else \
                            substring_of(words, p, tables[j, T_START], tables[j, T_WIDTH],
                                         word_width)
                        if v == key:
                            lo = cand
                            g = eb + cand  # the bucket's end: the next end bit (next_end)
                            wi = g >> 6
                            bits_w = ends[wi] >> np.uint64(g & 63)
                            if bits_w == np.uint64(0):
                                wi += 1
                                while ends[wi] == np.uint64(0):
                                    wi += 1
                                g = wi << 6
                                bits_w = ends[wi]
                            hi = g + np.int64(ctz64(bits_w)) - eb + 1
                            break
                    sl += one
                    if sl == n_slots:
                        sl = np.uint64(0)
        if hi > lo:
            if nonempty < room:
                hits[2 * nonempty] = lo
                hits[2 * nonempty + 1] = hi
            nonempty += 1
        if flips == 0 or flips == top:
            break
        c = flips & (~flips + one)  # the next mask of r bits (Gosper's hack)
        nxt = flips + c
        flips = (((nxt ^ flips) >> np.uint64(2)) // c) | nxt
        if flips > top or nxt == 0:
            break
    return probes, nonempty


class MIHProbeLimitError(ProbeLimitError):
    """A multi-index search would probe more substring buckets than ``max_probes`` allows."""

    def __init__(self, probes: int, limit: int, radius: int, bits: int, substrings: int):
        self.probes, self.limit, self.radius = probes, limit, radius
        ValueError.__init__(
            self, f"a radius-{radius} multi-index search of {bits}-bit codes with {substrings} "
                  f"substrings probes {probes:,} substring buckets, more than the limit "
                  f"max_probes={limit:,}; use a smaller radius, more substrings, raise the limit, "
                  "or use the linear scan (mode 'scan') or the planner (mode 'auto')")


def min_substrings(bits: int) -> int:
    """Fewest substrings for ``bits``-bit codes: every substring fits one 64-bit word."""
    return -(-check_bits(bits) // MAX_SUBSTRING_BITS)


def default_substrings(bits: int, n: int) -> int:
    """Norouzi's rule ``m = round(Q / log2 N)`` (substrings of about log2 N bits, so a substring
    bucket holds about one item), with ``log2 N`` taken at least ``MIN_LOG2_N``, clamped to
    ``[ceil(Q/64), Q]``."""
    log2n = max(math.log2(max(n, 2)), MIN_LOG2_N)
    return int(min(bits, max(min_substrings(bits), round(bits / log2n), 1)))


def check_substrings(bits: int, substrings) -> int:
    lo = min_substrings(bits)
    if isinstance(substrings, bool) or not isinstance(substrings, (int, np.integer)):
        raise TypeError(f"substrings must be an int in [{lo}, {bits}], got {substrings!r}")
    if not lo <= int(substrings) <= bits:
        raise ValueError(f"substrings must be in [{lo}, {bits}] for {bits}-bit codes (every "
                         f"substring at most {MAX_SUBSTRING_BITS} bits), got {substrings}")
    return int(substrings)


def substring_ranges(bits: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, widths)`` of the ``m`` contiguous substrings: the first ``Q mod m`` have
    ``ceil(Q/m)`` bits, the others ``floor(Q/m)``."""
    widths = np.full(m, bits // m, dtype=np.int64)
    widths[: bits % m] += 1
    starts = np.concatenate([[0], np.cumsum(widths)[:-1]]).astype(np.int64)
    return starts, widths


def step_probe_counts(widths, max_radius: int) -> list[int]:
    """Exact probes of each radius step ``R = 0..max_radius``: ``C(w_{R mod m}, floor(R/m))``
    (``math.comb`` is 0 when the substring radius exceeds the width)."""
    m = len(widths)
    return [math.comb(int(widths[R % m]), R // m) for R in range(max_radius + 1)]


@njit
def _substrings(words, starts, widths, word_width):
    """Substring values ``(n, m)`` of ``(n, W)`` codes (bits read most significant first)."""
    n = words.shape[0]
    m = len(starts)
    out = np.zeros((n, m), dtype=np.uint64)
    for i in range(n):
        for j in range(m):
            s = starts[j]
            e = s + widths[j]
            val = np.uint64(0)
            w = s // 64
            while w * 64 < e:
                ww = word_width[w]
                a = max(s, w * 64)
                b = min(e, w * 64 + ww)
                if b > a:
                    seg = words[i, w] >> np.uint64(ww - (b - w * 64))
                    nb = b - a
                    if nb < 64:
                        seg &= (np.uint64(1) << np.uint64(nb)) - np.uint64(1)
                        val = (val << np.uint64(nb)) | seg
                    else:
                        val = seg
                w += 1
            out[i, j] = val
    return out


@njit(inline="always")
def _within(hist, cut):
    """Candidates at distance ``<= cut``: ``sum(hist[:cut + 1])`` (a loop: a slice would cost
    a refcounted view per query)."""
    within = 0
    for d in range(cut + 1):
        within += hist[d]
    return within


@njit
def _mih_kernel(xq, bits, starts, widths, word_width, step_probes, max_radius, k, max_probes,
                with_clock, max_results, stop, tables, bucket_starts, slots, bitmap, positions,
                ends, words, ids, visited):
    """Multi-index search of every query; range search when ``k < 0``, k-NN (the ``k``
    nearest within ``max_radius``) otherwise.

    Radius step ``R`` probes substring table ``j = R mod m`` at substring radius ``floor(R/m)``
    (:func:`_probe_substring_radius`) and verifies the items of the non-empty buckets, read
    through their positions (the items already visited by this query are skipped). Range
    search runs steps ``0..max_radius``; k-NN stops after the first step ``R`` with ``k``
    items within ``R`` (or all items seen, or ``max_radius`` done); a k-NN step over the probe
    budget verifies every remaining item instead. The candidates within the last step are
    emitted by :func:`index.kernels.counting_sort`. Returns CSR results ordered by
    (distance, id), statistics ``(7, nq, max_radius + 1)``, radii, total_ns, the step at which
    a k-NN query switched to verifying every remaining item (-1: it did not) and the results
    counted (``reached``).

    ``visited``: a bitset over the items (``ceil(n / 8)`` bytes, all zero on entry and on
    return): an item's bit is set at its first visit by a query and the query's candidates'
    bytes are zeroed after it (the whole set when the candidate buffer overflowed).

    Helpers: :func:`index.kernels.hamming` (verification), :func:`index.kernels.counting_sort`
    (emission), :func:`index.kernels.record_radius` (statistics); see bench/RESULTS.md
    section 8 for the speed against the single-function kernel they replaced.

    Result cap (range search): after every step, when the chunk's results plus the query's
    unique candidates pass ``max_results``, the candidates within ``max_radius`` are counted;
    past the cap the kernel stops, sets ``stop[0]`` (read before every query by every chunk of
    the search) and returns the count reached, a lower bound of the true total. The output
    buffers never hold more than ``max_results`` items (the candidate buffers, at most the
    items of the index, are scratch).
    """
    nq, W = xq.shape
    m = len(widths)
    ntotal = len(ids)
    rmask = row_mask(tables)
    width = max_radius + 1
    qsubs = _substrings(xq, starts, widths, word_width)
    counts, stats, radii, total_ns, scanned_from, out_d, out_i = chunk_outputs(
        nq, UNIQUE_CANDIDATES + 1, nq, width)
    n_out = 0
    hits = np.empty(8192, dtype=np.int64)
    cand_p = np.empty(4096, dtype=np.int64)
    cand_d = np.empty(4096, dtype=np.int32)
    hist = np.zeros(bits + 2, dtype=np.int64)
    fill = np.zeros(bits + 2, dtype=np.int64)
    reached = -1  # >= 0 once the result cap stopped this chunk
    one = np.uint8(1)
    for qi in range(nq):
        if stop[0] != 0:
            break
        t_query = monotonic_ns() if with_clock else 0
        while True:  # a retry only when the candidate buffer overflowed (then it is grown)
            n_cand = 0
            spent = 0
            found = 0
            last = -1
            hist[:] = 0
            for R in range(width):
                j = R % m
                r = R // m
                t0 = monotonic_ns() if with_clock else 0
                probes = 0
                nonempty = 0
                cands = 0
                before = n_cand
                # k-NN: a step over the probe budget, or probing more buckets than there are
                # items, verifies every item not seen yet instead (a scan: exact, and cheaper)
                scan_rest = k >= 0 and (spent + step_probes[R] > max_probes
                                        or step_probes[R] > ntotal)
                spans = 0  # position ranges to verify: the non-empty buckets, or one (scan)
                if scan_rest:
                    scanned_from[qi] = R
                    spans = 1
                elif r <= widths[j]:
                    spent += step_probes[R]
                    while True:
                        probes, nonempty = _probe_substring_radius(
                            qsubs[qi, j], r, widths[j], j, tables, bucket_starts, slots,
                            bitmap, positions, ends, words, word_width, hits)
                        if 2 * nonempty <= len(hits):
                            break
                        hits = np.empty(4 * nonempty, dtype=np.int64)  # rare: probe again
                    spans = nonempty
                # verification, written once for both cases and kept in the kernel: as an
                # inlined helper called per bucket, its array arguments were refcounted at
                # every call (NRT calls per bucket: 10-12% slower at radii 3-4 on 1M codes)
                pb = j * ntotal
                for h in range(spans):
                    lo = 0  # scan: every item once, in storage order
                    hi = ntotal
                    if not scan_rest:
                        lo = hits[2 * h]
                        hi = hits[2 * h + 1]
                    cands += hi - lo
                    if not scan_rest and h + 1 < spans:  # the next bucket's items on their way
                        for t in range(hits[2 * h + 2], hits[2 * h + 3]):
                            prefetch(words, entry_row(positions, pb + t, rmask))
                    # an item this query has not visited yet is a unique candidate: its
                    # distance goes to the candidate buffers (while they have room; the
                    # count goes on, so an overflow is detected) and to the histogram
                    for t in range(lo, hi):
                        p = t if scan_rest else entry_row(positions, pb + t, rmask)
                        bit = one << np.uint8(p & 7)
                        if visited[p >> 3] & bit == 0:
                            visited[p >> 3] |= bit
                            d = hamming(xq, qi, words, p, W)
                            if n_cand < len(cand_p):
                                cand_p[n_cand] = p
                                cand_d[n_cand] = d
                            n_cand += 1
                            hist[d] += 1
                record_radius(stats, qi, R, probes, nonempty, hist[R])
                stats[CANDIDATES, qi, R] = cands
                stats[UNIQUE_CANDIDATES, qi, R] = n_cand - before
                if with_clock:
                    stats[LOOKUP_NS, qi, R] = monotonic_ns() - t0
                last = R
                found += hist[R]
                if k >= 0 and (found >= k or n_cand >= ntotal):
                    break
                if k < 0 and n_out + n_cand > max_results:  # unique candidates: upper bound
                    within = _within(hist, max_radius)
                    if n_out + within > max_results:
                        reached = n_out + within
                        break
            if reached >= 0 or n_cand <= len(cand_p):
                break
            visited[:] = 0  # overflowed: not every visit is in cand_p
            cand_p = np.empty(2 * n_cand, dtype=np.int64)
            cand_d = np.empty(2 * n_cand, dtype=np.int32)
        if n_cand <= len(cand_p):
            for c in range(n_cand):
                visited[cand_p[c] >> 3] = 0
        else:
            visited[:] = 0
        if reached >= 0:
            stop[0] = 1
            break
        radii[qi] = last + 1
        # every item seen (k-NN): rank them all, to the radius asked
        cut = max_radius if k >= 0 and n_cand >= ntotal else last
        within = _within(hist, cut)
        out_i = grow(out_i, n_out + within)
        out_d = grow(out_d, n_out + within)
        total = counting_sort(cand_d, cand_p, n_cand, ids, hist, 0, cut, fill, out_d, out_i,
                              n_out)
        if k >= 0 and total > k:
            total = k
        n_out += total
        counts[qi] = total
        if with_clock:
            total_ns[qi] = monotonic_ns() - t_query
    return chunk_result(counts, out_d, out_i, n_out, stats, radii, total_ns, scanned_from,
                        reached)


@njit(inline="always")
def _met_before(diff, j, field0, field1, tables):
    """Whether a candidate of table ``j`` whose code differs from the query's in ``diff`` was
    met at an earlier step: it equals the query on a substring ``jj < j`` (the bits of
    substrings 0 and 1 in ``field0``, ``field1``, held in locals by the caller)."""
    seen = j >= 1 and diff & field0 == 0
    if j >= 2:
        seen = seen or diff & field1 == 0
        for jj in range(2, j):
            if (diff >> np.uint64(tables[jj, T_SHIFT])) & np.uint64(tables[jj, T_MASK]) == 0:
                seen = True
    return seen


@njit(inline="always")
def _merge_two(out_i, a, a_end, b, b_end, o):
    """The ascending runs ``out_i[a:a_end]`` and ``out_i[b:b_end]`` merged into ``out_i[o:]``
    (no overlap); returns the end. The step is branch-free (which run gives the next entry is
    a select, not a jump: the runs of two tables interleave at random)."""
    while a < a_end and b < b_end:
        va = out_i[a]
        vb = out_i[b]
        take_a = np.int64(va < vb)
        out_i[o] = va if take_a else vb
        a += take_a
        b += 1 - take_a
        o += 1
    while a < a_end:
        out_i[o] = out_i[a]
        a += 1
        o += 1
    while b < b_end:
        out_i[o] = out_i[b]
        b += 1
        o += 1
    return o


@njit(inline="always")
def _merge_sub_runs(out_d, out_i, o, width, sub_lo, sub_end, tmp):
    """A query's results in (distance, id) order at ``out[o:]``, from its sub-runs: sub-run
    ``k = j * width + d`` is ``out_i[sub_lo[k]:sub_end[k]]``, the ids (ascending) of table
    ``j``'s results at distance ``d`` (``d < width``). Per distance, its tables' sub-runs are
    merged by id (:func:`_merge_two`; from three on, through the scratch ``out_i[tmp:]`` and
    ``out_i[tmp + size:]``, ``size`` the query's results); then its distances written.
    Returns the end. The sub-runs and the scratch lie past ``o`` + the query's results."""
    size = 0
    for k in range(width * width):
        size += sub_end[k] - sub_lo[k]
    for d in range(width):
        runs = 0
        for j in range(width):
            runs += sub_end[j * width + d] > sub_lo[j * width + d]
        if runs == 0:
            continue
        o_d = o
        met = 0
        acc = 0
        acc_end = 0
        for j in range(width):
            k = j * width + d
            a = sub_lo[k]
            a_end = sub_end[k]
            if a_end == a:
                continue
            met += 1
            if met == 1:
                acc = a
                acc_end = a_end
            elif met < runs:  # into the scratch, alternating halves
                t0 = tmp + (met % 2) * size
                acc_end = _merge_two(out_i, acc, acc_end, a, a_end, t0)
                acc = t0
            else:
                o = _merge_two(out_i, acc, acc_end, a, a_end, o)
        if runs == 1:
            for t in range(acc, acc_end):
                out_i[o] = out_i[t]
                o += 1
        for t in range(o_d, o):
            out_d[t] = d
    return o


@njit(inline="always")
def _close_clock_group(stats, total_ns, g0, g1, t0, tick_ns):
    """The statistics of the queries ``g0:g1`` of one clock group that
    :func:`_mih_exact_kernel` does not count in its loop, at the group's end: ``probes`` 1 per
    step, ``nonempty`` when the step had candidates, ``empty`` the rest; the time since ``t0``
    (ticks) split evenly over the queries (``total_ns``) and a query's share evenly over its
    radius steps (``lookup_ns``, rounded down). Runs over queries and steps, flattened.
    Returns the clock read."""
    t1 = cycle_counter()
    if g1 > g0:
        width = stats.shape[2]
        rows = stats.reshape(stats.shape[0], stats.shape[1] * width)
        per_query = int((t1 - t0) * tick_ns / (g1 - g0))
        per_step = per_query // width
        for c in range(g0 * width, g1 * width):
            nonempty = np.int64(rows[CANDIDATES, c] > 0)
            rows[PROBES, c] = 1
            rows[NONEMPTY, c] = nonempty
            rows[EMPTY, c] = 1 - nonempty
            rows[LOOKUP_NS, c] = per_step
        total_ns[g0:g1] = per_query
    return t1


@njit
def _mih_exact_kernel(xq, R, tables, starts, slots, bitmap, positions, ends, words, ids,
                      word_width, max_results, tick_ns, q_start, n_out, lims, out_d, out_i,
                      scratch, stats, total_ns):
    """Range search of one-word codes for ``R < m``: the pigeonhole rule with every substring
    searched at radius 0 (an item within ``R`` equals the query exactly on one of the
    substrings ``0..R``), so the radius steps are ``R + 1`` exact substring lookups
    (:func:`index.mih_tables.bucket`, written out: a helper taking the arrays refcounts them
    per call). A hashed bucket's end is its next end bit, so every lookup gives ``lo:hi``.

    Radius 0: the one lookup is table 0's, whose bucket ``lo:hi`` is also the rows ``lo:hi``
    of the (code, id)-sorted items: the results are the run of rows equal to the query, read
    in code order up to the first greater code, ids ascending (no position read).

    Radius >= 1: a bucket's candidates are read through their entries (``positions[j * n +
    t]``: the row, then the item's code in ``words``; its id only for a result). A *small*
    query (at most :data:`SMALL_QUERY` candidates) reads table 0's bucket as the rows ``lo:hi``
    (no entry); one of at most :data:`TAG_QUERY` (a sparse code's: mostly not results) skips an
    entry whose tag differs from the query's in more than ``R`` bits (:mod:`index.mih_tables`:
    the item is then at distance > ``R``; its code is neither prefetched nor read); a larger
    query reads every code (its candidates are mostly results), and so does a search with
    statistics (they count unique candidates by their codes). No visit bits: a
    candidate of substring ``j`` was already met at an earlier step exactly when it also
    equals the query on one of the substrings ``0..j-1`` (a mask test on the XOR of the full
    codes, which verification computes anyway). Substring ``j`` of code ``v`` is ``(v >>
    shift_j) & mask_j`` (``tables``' columns ``T_SHIFT``, ``T_MASK``). A bucket's positions are
    in id order, so table ``j``'s results at distance ``d`` are ascending ids: each goes to
    its own sub-run ``(j, d)`` (room for table ``j``'s bucket size each, in the output
    buffer's free room past the query's results), and :func:`_merge_sub_runs` merges them
    into (distance, id) order (a merge of the runs by id then a counting sort by distance
    measured 1.3x slower at radius 2 on clustered codes: it moved each result five times);
    a small query writes its (distance, id) results in one run, ordered by insertion.
    A lookup prefetches its bucket's first position as soon as its bounds are read, unless it
    is empty (no separate pass over the lookups). A large query's first candidates are
    prefetched after the block's lookups, and its other candidates while the query before it
    is verified (their positions read): at 10M clustered codes, radius 2 took 2.3x the old
    layout's time without, 1.0x with (bench/RESULTS.md section 30). A small query gets only
    its first candidate of each table prefetched after the lookups, and runs a loop of its
    own: in batches whose candidates stay in the caches between calls (1,000 queries of 1M
    uniform codes), every candidate's prefetch and the shared loop had made radius 1 take 2.0x
    the time of the layout with table copies (section 41); the first candidates' make batches
    read from memory 0.84-0.93x the time of that layout at uniform codes (section 42).

    Queries run in blocks of :data:`CLOCK_GROUP`: first every lookup of the block (a loop
    with no exit, so the loads of successive queries overlap: 7-10% faster on clustered codes,
    8% at radius 2 on uniform ones, bench notes in RESULTS 15), then each query's candidates.
    The output buffer must hold a query's results before its candidates are read (``n_out +
    C`` entries for a small query of ``C`` candidates; a large one's sub-runs: ``n_out + (R +
    2) * C``, and ``2 * C`` more from ``R = 2``), else the kernel returns to have it grown;
    the result cap is tested once per query. Output and resumption as :func:`index.probe._range_word_kernel` (returns
    ``(q_end, n_out, reached, need)``; ``scratch`` must hold ``need = 2 * (R + 1) *
    (CLOCK_GROUP + R + 1)`` entries: the block's lookups and the sub-runs' bounds).

    ``stats`` and ``total_ns`` are None without statistics (numba compiles that case without
    any of their code). With them: ``candidates``, ``unique_candidates`` and ``items`` as
    :func:`_mih_kernel`'s (``(7, nq, R + 1)``); the loop counts candidates, unique candidates
    and items, and reads the clock (:func:`index._jit.cycle_counter`) once per
    :data:`CLOCK_GROUP` queries, when :func:`_close_clock_group` derives the rest (a query's
    ``total_ns`` is the mean over its group).
    """
    nq = xq.shape[0]
    n = len(ids)
    cap = len(out_i)
    width = R + 1
    n_sub = width * width
    need = 2 * width * CLOCK_GROUP + 2 * n_sub
    if len(scratch) < need:
        return q_start, n_out, -1, need
    spans = scratch[:2 * width * CLOCK_GROUP]  # (lo, hi) of each lookup of the block
    sub_lo = scratch[2 * width * CLOCK_GROUP:2 * width * CLOCK_GROUP + n_sub]
    sub_end = scratch[2 * width * CLOCK_GROUP + n_sub:need]
    end_words = 64 * ((n + 63) // 64)  # the end bits of one hashed table
    field0 = np.uint64(tables[0, T_MASK]) << np.uint64(tables[0, T_SHIFT])
    field1 = (np.uint64(tables[1, T_MASK]) << np.uint64(tables[1, T_SHIFT])
              if width > 1 else np.uint64(0))
    rmask = row_mask(tables)
    rb = np.uint64(tables[0, T_ROW_BITS])
    # the tag filter (without statistics, whose unique candidates need every code): a
    # candidate whose tag differs from the query's in more than R bits is not read
    tag_limit = R if stats is None else 64
    qtags = np.zeros(CLOCK_GROUP * width, dtype=np.uint64)  # the block's query tags
    qlimit = np.zeros(CLOCK_GROUP, dtype=np.int64)  # and the queries' tag limits
    qsize = np.zeros(CLOCK_GROUP, dtype=np.int64)  # and candidates
    t_group = cycle_counter() if stats is not None else 0
    for g_start in range(q_start, nq, CLOCK_GROUP):
        g_end = min(g_start + CLOCK_GROUP, nq)
        # pass 1: the block's lookups, table positions lo:hi of the items whose substring j
        # equals the query's. A loop with no exit: the lookups of successive queries overlap
        for qi in range(g_start, g_end):
            q = xq[qi, 0]
            eb = 0  # the first end bit of table j (ends_bit_base)
            for j in range(width):
                shift_j = np.uint64(tables[j, T_SHIFT])
                mask_j = np.uint64(tables[j, T_MASK])
                key = (q >> shift_j) & mask_j
                if tables[j, T_DIRECT]:
                    sd = tables[j, T_BASE] + np.int64(key)
                    lo = np.int64(starts[sd])
                    hi = np.int64(starts[sd + 1])
                else:
                    lo = 0
                    hi = 0
                    h = key * HASH_MULTIPLIER
                    f, fbits = filter_word_bits(h, tables[j, T_BITMAP_WORDS])
                    if bitmap[tables[j, T_BITMAP] + np.int64(f)] & fbits == fbits:
                        sb = tables[j, T_BASE]
                        n_slots = np.uint64(tables[j, T_SLOTS])
                        fpb = np.uint64(tables[j, T_FP_BITS])
                        sl, fp = home_and_fingerprint(h, n_slots, fpb)
                        fp_mask = (np.uint64(1) << fpb) - np.uint64(1)
                        while True:
                            e = np.uint64(slots[sb + np.int64(sl)])
                            if e == np.uint64(0):
                                break
                            if (e & fp_mask) == fp:
                                cand = np.int64(e >> fpb) - 1
                                pc = cand if j == 0 else entry_row(positions, j * n + cand,
                                                                   rmask)  # table 0: rows
                                if (words[pc, 0] >> shift_j) & mask_j == key:
                                    lo = cand
                                    hi = n
                                    if width == 1 and stats is None:
                                        break  # radius 0 stops at the first greater code
                                    # the bucket's end: the next end bit (next_end)
                                    g = eb + cand
                                    wi = g >> 6
                                    bits = ends[wi] >> np.uint64(g & 63)
                                    if bits == np.uint64(0):
                                        wi += 1
                                        while ends[wi] == np.uint64(0):
                                            wi += 1
                                        g = wi << 6
                                        bits = ends[wi]
                                    hi = g + np.int64(ctz64(bits)) - eb + 1
                                    break
                            sl += np.uint64(1)
                            if sl == n_slots:
                                sl = np.uint64(0)
                    eb += end_words
                c = 2 * ((qi - g_start) * width + j)
                spans[c] = j * n + lo
                spans[c + 1] = j * n + hi
                qtags[c >> 1] = code_tag(q, j, tables)
                if width > 1 and j > 0:  # the bucket's first positions on their way (pass
                    # 1b reads them): issued as soon as the bounds arrive, with no loop of its
                    # own; an empty bucket's goes to position 0 (a select, not a branch on the
                    # load: the line after an empty bucket was a line fetched for nothing).
                    # Table 0's are not (here: 1.07x slower in cache)
                    prefetch(positions, j * n + lo if hi > lo else 0)
        if width == 1:
            # radius 0: table 0's bucket lo:hi is the rows lo:hi; the query's own code is a
            # run of them (ids ascending), found in code order
            for qi in range(g_start, g_end):
                q = xq[qi, 0]
                c = 2 * (qi - g_start)
                lo = spans[c]
                hi = spans[c + 1]
                t = lo
                while t < hi and words[t, 0] < q:
                    t += 1
                first = t
                while t < hi and words[t, 0] == q:
                    if n_out < cap:
                        out_d[n_out] = 0
                        out_i[n_out] = ids[t]
                    n_out += 1
                    t += 1
                if stats is not None:
                    stats[CANDIDATES, qi, 0] = hi - lo
                    stats[UNIQUE_CANDIDATES, qi, 0] = hi - lo
                    stats[ITEMS, qi, 0] = t - first
                if n_out > cap or n_out > max_results:
                    if stats is not None:
                        stats[ITEMS, qi, :] = 0  # searched again after the buffer grows
                        _close_clock_group(stats, total_ns, g_start, qi, t_group, tick_ns)
                    return (qi, n_out - (t - first),
                            max_results + 1 if n_out > max_results else -1, 0)
                lims[qi + 1] = n_out
            if stats is not None:
                t_group = _close_clock_group(stats, total_ns, g_start, g_end, t_group,
                                             tick_ns)
            continue
        # pass 1b: each query's candidates and tag limit; each query's first candidates'
        # codes and ids brought into the caches through their positions (prefetched by pass
        # 1; loads that depend on one another, issued for every lookup of the block before any
        # is waited for). A small query's: one per table, table 0's as its first row (batches
        # read from memory: 0.84-0.93x the time at 1M-10M uniform codes, RESULTS 42)
        for qi in range(g_start, g_end if n > 0 else g_start):  # (reads position 0)
            c0 = 2 * (qi - g_start) * width
            size = 0
            for c in range(c0, c0 + 2 * width, 2):
                size += spans[c + 1] - spans[c]
            qsize[qi - g_start] = size
            limit = tag_limit if size <= TAG_QUERY else 64
            qlimit[qi - g_start] = limit
            if size <= SMALL_QUERY:  # no branch: an empty bucket's or a tag's past R, row 0
                p = spans[c0] if spans[c0 + 1] > spans[c0] else 0
                prefetch(words, p)
                prefetch(ids, p)
                for c in range(c0 + 2, c0 + 2 * width, 2):
                    e = np.uint64(positions[spans[c] if spans[c + 1] > spans[c] else 0])
                    p = np.int64(e & rmask) if tag_distance(e, rb, qtags[c >> 1]) <= limit else 0
                    prefetch(words, p)
                    prefetch(ids, p)
                continue
            for c in range(c0, c0 + 2 * width, 2):
                lo = spans[c]
                hi = spans[c + 1]
                qtag = qtags[c >> 1]
                for k in range(PREFETCH_ITEMS):  # no branch: past the bucket or tag, row 0
                    e = np.uint64(positions[lo + k if lo + k < hi else 0])
                    p = np.int64(e & rmask) if tag_distance(e, rb, qtag) <= limit else 0
                    prefetch(words, p)
                    prefetch(ids, p if hi - lo > PREFETCH_ITEMS else 0)
        # pass 2: the candidates of each query: a small one's results into one run (sorted
        # after), a large one's each into its sub-run (table, distance)
        for qi in range(g_start, g_end):
            q = xq[qi, 0]
            size = qsize[qi - g_start]
            if qi + 1 < g_end and qsize[qi + 1 - g_start] > SMALL_QUERY:
                # the next (large) query's other candidates on their way
                c0 = 2 * (qi + 1 - g_start) * width
                for c in range(c0, c0 + 2 * width, 2):  # past the ones pass 1b fetched
                    if c == c0:  # table 0: rows, one prefetch a line, and the positions
                        lo = spans[c] + PREFETCH_ITEMS
                        hi = spans[c + 1]
                        if hi > lo:
                            for t in range(lo, hi, 8):
                                prefetch(words, t)
                                prefetch(ids, t)
                            prefetch(words, hi - 1)
                            prefetch(ids, hi - 1)
                            if qlimit[qi + 1 - g_start] == 64:
                                for t in range(lo, hi, 16):
                                    prefetch(positions, t)
                                prefetch(positions, hi - 1)
                        continue
                    qtag = qtags[c >> 1]
                    if qlimit[qi + 1 - g_start] == 64:  # every code read: no tag's test
                        for t in range(spans[c] + PREFETCH_ITEMS, spans[c + 1]):
                            p = np.int64(np.uint64(positions[t]) & rmask)
                            prefetch(words, p)
                            prefetch(ids, p)
                        continue
                    for t in range(spans[c] + PREFETCH_ITEMS, spans[c + 1]):
                        e = np.uint64(positions[t])
                        if tag_distance(e, rb, qtag) <= qlimit[qi + 1 - g_start]:
                            p = np.int64(e & rmask)
                            prefetch(words, p)
                            prefetch(ids, p)
            if size <= SMALL_QUERY:  # one run of results, in (distance, id) order after
                if n_out + size > cap:
                    if stats is not None:
                        _close_clock_group(stats, total_ns, g_start, qi, t_group, tick_ns)
                    return qi, n_out, -1, 0
                o = n_out
                for j in range(width):
                    c = 2 * ((qi - g_start) * width + j)
                    qtag = qtags[c >> 1]
                    unique = 0
                    for t in range(spans[c], spans[c + 1]):
                        if j == 0:
                            p = t  # table 0's bucket read as rows (code order)
                        else:
                            e = np.uint64(positions[t])
                            if stats is None and tag_distance(e, rb, qtag) > R:
                                continue  # more than R of the tag's bits differ
                            p = np.int64(e & rmask)
                        prefetch(ids, p)  # (its id's load overlaps the code's)
                        diff = q ^ words[p, 0]
                        if _met_before(diff, j, field0, field1, tables):
                            continue
                        unique += 1
                        d = popcount64(diff)
                        if d <= R:
                            out_d[o] = d
                            out_i[o] = ids[p]
                            o += 1
                            if stats is not None:
                                stats[ITEMS, qi, d] += 1
                    if stats is not None:
                        stats[CANDIDATES, qi, j] = spans[c + 1] - spans[c]
                        stats[UNIQUE_CANDIDATES, qi, j] = unique
                if o > max_results:
                    if stats is not None:
                        _close_clock_group(stats, total_ns, g_start, qi, t_group, tick_ns)
                    return qi, n_out, max_results + 1, 0
                # (distance, id) order by insertion, written out: the same loop in an inlined
                # helper cost 1.25x the whole search in the caches (RESULTS 41)
                for a in range(n_out + 1, o):
                    d = out_d[a]
                    v = out_i[a]
                    b = a - 1
                    while b >= n_out and (out_d[b] > d or (out_d[b] == d and out_i[b] > v)):
                        out_d[b + 1] = out_d[b]
                        out_i[b + 1] = out_i[b]
                        b -= 1
                    out_d[b + 1] = d
                    out_i[b + 1] = v
                n_out = o
                lims[qi + 1] = n_out
                continue
            # a large query: each result into its sub-run (table, distance), room for the
            # table's bucket each
            if n_out + (width + 1) * size + (2 * size if width > 2 else 0) > cap:
                if stats is not None:
                    _close_clock_group(stats, total_ns, g_start, qi, t_group, tick_ns)
                return qi, n_out, -1, 0
            at = n_out + size
            for j in range(width):
                c = 2 * ((qi - g_start) * width + j)
                for d in range(width):
                    sub_lo[j * width + d] = at
                    sub_end[j * width + d] = at
                    at += spans[c + 1] - spans[c]
            found = 0
            check = qlimit[qi - g_start] < 64  # (no tag computed otherwise)
            for j in range(width):
                c = 2 * ((qi - g_start) * width + j)
                unique = 0
                qtag = qtags[c >> 1]
                for t in range(spans[c], spans[c + 1]):
                    e = np.uint64(positions[t])
                    if check and tag_distance(e, rb, qtag) > R:
                        continue  # more than R of the tag's bits differ: not a result
                    p = np.int64(e & rmask)
                    diff = q ^ words[p, 0]
                    if _met_before(diff, j, field0, field1, tables):
                        continue
                    unique += 1
                    d = popcount64(diff)
                    if d <= R:
                        k = j * width + d
                        out_i[sub_end[k]] = ids[p]
                        out_d[sub_end[k]] = d  # (a sub-run's distance: scratch)
                        sub_end[k] += 1
                        found += 1
                        if stats is not None:
                            stats[ITEMS, qi, d] += 1
                if stats is not None:
                    stats[CANDIDATES, qi, j] = spans[c + 1] - spans[c]
                    stats[UNIQUE_CANDIDATES, qi, j] = unique
            if n_out + found > max_results:
                if stats is not None:
                    _close_clock_group(stats, total_ns, g_start, qi, t_group, tick_ns)
                return qi, n_out, max_results + 1, 0
            if found:
                n_out = _merge_sub_runs(out_d, out_i, n_out, width, sub_lo, sub_end, at)
            lims[qi + 1] = n_out
        if stats is not None:
            t_group = _close_clock_group(stats, total_ns, g_start, g_end, t_group, tick_ns)
    return nq, n_out, -1, 0


class _VisitPool:
    """Visit bitsets (``ceil(n / 8)`` bytes over the items, zero between queries), one per
    concurrently running chunk of :func:`_mih_kernel`, made on first use."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []
        self._n = 0

    def reset(self, n: int) -> None:
        with self._lock:
            self._free, self._n = [], n

    def acquire(self) -> np.ndarray:
        with self._lock:
            if self._free:
                return self._free.pop()
            # written, not np.zeros: calloc'd pages would fault on the first searches' random
            # accesses (measured 40 us per query on the first search of 100k items)
            visited = np.empty(max((self._n + 7) // 8, 1), dtype=np.uint8)
            visited.fill(0)
            return visited

    def release(self, visited: np.ndarray) -> None:
        with self._lock:
            if len(visited) == max((self._n + 7) // 8, 1):
                self._free.append(visited)

    def arrays(self) -> list[np.ndarray]:
        with self._lock:
            return list(self._free)


class MultiIndex(IndexBase):
    """Exact radius search and k-NN by multi-index hashing (see the module docstring).

    ``substrings`` is the number of tables ``m`` (default: Norouzi's rule, recomputed from N at
    every rebuild); ``max_probes`` bounds the substring probes of one query
    (:class:`MIHProbeLimitError`). Same API and result layouts as
    :class:`~index.probe.HammingIndex`; statistics add ``candidates`` and ``unique_candidates``.
    """

    kind = "mih"
    sorted_by_code = True

    def __init__(self, bits: int, substrings: int | None = None,
                 max_probes: int = DEFAULT_MAX_PROBES):
        super().__init__(bits)
        self.fixed_substrings = (None if substrings is None
                                 else check_substrings(self.bits, substrings))
        if not 1 <= int(max_probes) <= PROBE_CAP:
            raise ValueError(f"max_probes must be in [1, {PROBE_CAP}], got {max_probes}")
        self.max_probes = int(max_probes)
        self._word_width = np.array(word_widths(self.bits), dtype=np.int64)
        self._visits = _VisitPool()
        self._rebuild(np.empty((0, n_words(self.bits)), np.uint64), np.empty(0, np.int64))

    # ------------------------------------------------------------------ build
    def _rebuild(self, words, ids):
        words = np.asarray(words, dtype=np.uint64).reshape(-1, n_words(self.bits))
        # by (code, id): the items of one code lie together for the general kernel's
        # verification (stored by id, clustered r = 3 measured 1.46x slower)
        sorted_words, sorted_ids = sort_items(words, ids, self.build_threads)
        self._rebuild_sorted(sorted_words, sorted_ids, id_words=ids_order_words(words, ids))

    def _rebuild_sorted(self, words: np.ndarray, ids: np.ndarray, id_words=None,
                        threads: int | None = None,
                        tables: SubstringTables | None = None) -> None:
        """The tables of items already sorted by (code, id), kept as given (not copied: auto
        shares them with its single table and its scan): positions into them by
        (substring, position), :func:`index.mih_tables.build_tables` (a counting or radix sort
        per table, the first table none) on ``threads`` (default :attr:`build_threads`), or
        ``tables`` when given (a live merge's, :func:`index.mih_tables.merge_tables`).
        ``id_words``: the codes in ascending id order when the caller has them (the input of
        a build whose ids increase), which saves a gather. The arrays then queued for huge
        pages (:func:`bucketsearch.index.disk.hugepages.collapse_later`)."""
        if words.dtype != np.uint64 or not words.flags.c_contiguous:
            words = np.ascontiguousarray(words, dtype=np.uint64)
        if ids.dtype != np.int64 or not ids.flags.c_contiguous:
            ids = np.ascontiguousarray(ids, dtype=np.int64)
        m = self.fixed_substrings or default_substrings(self.bits, len(ids))
        starts, widths = substring_ranges(self.bits, m)
        if tables is None:
            tables = build_tables(self.bits, words, ids, starts, widths, self._word_width,
                                  threads or self.build_threads, id_words)
        self._install(words, ids, starts, widths, tables)
        collapse_later(self.memory_arrays().values())

    def _install(self, words, ids, starts, widths, tables: SubstringTables) -> None:
        """Set the shared items and the substring tables."""
        self.words, self.ids = words, ids
        self.substrings = len(widths)
        self.sub_starts, self.sub_widths = starts, widths
        self._step_cache = {}
        self.tables = tables
        self._exact_entries: dict = {}  # the compiled entries of the exact kernel
        self._short = None  # (the exact kernel's compiled entry, its arguments): _short_way
        self._visits.reset(len(ids))

    @property
    def ntotal(self) -> int:
        return len(self.ids)

    @property
    def one_word(self) -> bool:
        """Codes of one word (Q <= 64): the exact-substring path and the incremental k-NN."""
        return self.words.shape[1] == 1

    def memory_bytes(self) -> int:
        """Bytes of the shared items, the substring tables and the visit bitsets made."""
        return sum(a.nbytes for a in self.memory_arrays().values())

    def memory_arrays(self) -> dict:
        """Every array the index holds, by identity (see :meth:`HammingIndex.memory_arrays`)."""
        return {id(a): a for a in (self.words, self.ids, *self.tables.arrays().values(),
                                   *self._visits.arrays()) if isinstance(a, np.ndarray)}

    def substring_codes(self, words: np.ndarray) -> np.ndarray:
        """``(n, m)`` substring values of ``(n, W)`` codes."""
        return _substrings(np.ascontiguousarray(words, dtype=np.uint64), self.sub_starts,
                           self.sub_widths, self._word_width)

    def distinct_substrings(self, j: int) -> np.ndarray:
        """Table ``j``'s distinct substring values, ascending (computed on demand)."""
        return distinct_values(self.tables, self.words, j, self._word_width)

    def distinct_substring_sample(self, j: int, size: int, rng) -> tuple[np.ndarray, np.ndarray]:
        """Values standing for table ``j``'s distinct substrings, and their weights: every
        distinct value (weight 1) when the index has at most ``size`` items, else the values
        of ``size`` random items, each weighted ``n / (size x its bucket's size)``
        (Horvitz-Thompson, as :func:`bucketsearch.index.planner._distinct_sample`): no pass
        over the items."""
        n = self.ntotal
        if n <= size:
            values = self.distinct_substrings(j)
            return values, np.ones(len(values))
        at = rng.integers(0, n, size)
        values = table_values_at(self.words, self.tables.positions, j, self.tables.tables,
                                 self._word_width, at)
        if self.tables.tables[j, T_DIRECT]:  # a bucket's size is read off its starts
            starts = self.tables.starts[int(self.tables.tables[j, T_BASE]):]
            v = values.astype(np.int64)
            sizes = starts[v + 1].astype(np.int64) - starts[v]
        else:
            sizes = run_sizes(self.words, self.tables.positions, j, self.tables.tables,
                              self._word_width, at)
        return values, n / (size * sizes.astype(np.float64))

    def table_direct(self) -> list[bool]:
        """Whether each table is direct-addressed (else hashed)."""
        return self.tables.direct

    def bucket_positions(self, j: int, value: int) -> np.ndarray:
        """Positions (into :attr:`words` / :attr:`ids`) of the items whose substring ``j`` is
        ``value``, ascending: a lookup of table ``j`` (tests and tools)."""
        lo, hi = bucket(np.uint64(value), j, *self.tables.lookup_args(), self.words,
                        self._word_width)
        return self.tables.rows(j, lo, hi)

    # ------------------------------------------------------------------ counts
    def step_probes(self, max_distance: int) -> list[int]:
        """Exact probes of each radius step ``0..R`` (Python ints)."""
        return list(self._steps(max_distance)[0])

    def probe_count(self, max_distance: int, nq: int = 1) -> int:
        """Exact substring probes of one radius-R query (any ``nq``):
        ``sum_j sum_{r <= floor((R - j)/m)} C(w_j, r)`` (Python int)."""
        return self._steps(max_distance)[1]

    def _step_array(self, max_distance: int) -> np.ndarray:
        return self._steps(max_distance)[2]

    def _steps(self, R: int):
        """Cached ``(per-step probes, their sum, int64 array clipped at PROBE_CAP)``."""
        hit = self._step_cache.get(R)
        if hit is None:
            counts = tuple(step_probe_counts(self.sub_widths, R))
            hit = (counts, sum(counts),
                   np.array([min(c, PROBE_CAP) for c in counts], dtype=np.int64))
            self._step_cache[R] = hit
        return hit

    # ------------------------------------------------------------------ search
    def range_search(self, queries, max_distance: int, stats: bool = False,
                     max_results: int | None = None):
        """:meth:`IndexBase.range_search`. The short way, as the single table's
        (:meth:`index.probe.HammingIndex.range_search`): 64-bit codes given as a C-contiguous
        ``(nq, 1)`` uint64 array (whole words: nothing to check), a radius below the
        substrings and the probe limit (``R + 1`` lookups), without statistics or cap:
        those checks in a few comparisons, then :meth:`_short_way`."""
        if (stats is False and max_results is None and type(queries) is np.ndarray
                and queries.dtype is WORD_DTYPE and type(max_distance) is int
                and self.bits == 64 and 0 <= max_distance < self.substrings
                and max_distance < self.max_probes and queries.ndim == 2
                and queries.shape[1] == 1 and queries.flags.c_contiguous):
            out = self._short_way(queries, max_distance)  # (the checks: _check_range's)
            return (out if out is not None
                    else self._run_exact(queries, max_distance, False, None))
        return IndexBase.range_search(self, queries, max_distance, stats, max_results)

    def _short_way(self, xq: np.ndarray, R: int):
        """``(lims, D, I)`` of a range search with ``R < m`` of one-word codes ``xq``
        (C-contiguous), without statistics or cap, by one call of :func:`_mih_exact_kernel`'s
        compiled entry into this thread's buffers; None when it does not apply (a batch run on
        several threads) or a buffer filled: the caller then runs :meth:`_run_exact` (the
        resumable way, from the start). A one-query call took 4.1 us, 1.1 us of it the kernel's (bench/RESULTS.md
        section 42)."""
        nq = xq.shape[0]
        if nq >= PARALLEL_MIN_QUERIES and self.threads != 1:
            return None
        lims = np.zeros(nq + 1, np.int64)
        out_d, out_i, hits = OUTPUT_BUFFERS.all
        short = self._short
        if short is None:
            t = self.tables
            args = (t.tables, t.starts, t.slots, t.bitmap, t.positions, t.ends, self.words,
                    self.ids, self._word_width, NO_RESULT_CAP, 1.0)
            short = self._short = (compiled_entry(_mih_exact_kernel, (
                xq, R, *args, 0, 0, lims, out_d, out_i, hits, None, None)), args)
        q, n_out, _, _ = short[0](xq, R, *short[1], 0, 0, lims, out_d, out_i, hits, None, None)
        if q < nq:
            return None
        return lims, out_d[:n_out].copy(), out_i[:n_out].copy()

    def _run(self, xq, max_radius, k, stats, max_results=None):
        if k < 0 and self.one_word and max_radius < self.substrings:
            if not stats and max_results is None and xq.flags.c_contiguous:
                out = self._short_way(xq, max_radius)  # (an auto index's plan of mih)
                if out is not None:
                    return out
            return self._run_exact(xq, max_radius, stats, max_results)
        per_step = self._step_array(max_radius)
        t = self.tables
        stop = np.zeros(1, dtype=np.int64)
        args = (self.bits, self.sub_starts, self.sub_widths, self._word_width, per_step,
                max_radius, k, self.max_probes, stats, check_max_results(max_results), stop,
                t.tables, t.starts, t.slots, t.bitmap, t.positions, t.ends, self.words,
                self.ids)
        lims, D, I, rest = self._chunked(xq, args)
        raise_if_over(max_results, stop, [r[4] for r in rest], lims)
        return ((lims, D, I, self._tagged(stats_from_chunks(rest), k)) if stats
                else (lims, D, I))

    def knn_incremental(self) -> bool:
        """Whether k-NN runs :mod:`index.mih_knn`'s incremental search (one-word codes, every
        substring narrower than 64 bits) rather than :func:`_mih_kernel`'s radius steps."""
        return self.one_word and int(self.sub_widths.max(initial=0)) < MAX_SUBSTRING_BITS

    def _knn_csr(self, xq, k, stats, max_radius):
        """k-NN: :mod:`index.mih_knn`'s incremental search when :meth:`knn_incremental`, else
        :func:`_mih_kernel`'s radius steps."""
        if not self.knn_incremental():
            return self._run(xq, max_radius, k, stats)
        return knn_search(self, xq, k, stats, max_radius)

    def _run_exact(self, xq, R, stats, max_results):
        """Range search with ``R < m`` of one-word codes: :func:`_mih_exact_kernel` (R + 1
        exact substring lookups, no visit bits), resumable over the thread's output buffers;
        without ``stats`` the kernel gets None for its statistics (its compiled form without
        them)."""
        stats = bool(stats)
        t = self.tables
        args = (R, t.tables, t.starts, t.slots, t.bitmap, t.positions, t.ends, self.words,
                self.ids, self._word_width, check_max_results(max_results),
                ns_per_tick() if stats else 1.0)
        lims, D, I, st, reached = run_resumable_chunked(
            _mih_exact_kernel, xq, R + 1, stats, UNIQUE_CANDIDATES + 1, self.threads, args,
            self._exact_entries, stats_none=True)
        raise_if_reached(max_results, reached, lims)
        return (lims, D, I, self._tagged(st, -1)) if stats else (lims, D, I)

    def _chunked(self, xq, args):
        """:func:`run_chunked` over query chunks, each with its own visit bitset."""
        pool = self._visits

        def kernel(chunk):
            visited = pool.acquire()
            try:
                out = _mih_kernel(chunk, *args, visited)
            except BaseException:
                visited = None  # maybe not cleared: not reused
                raise
            finally:
                if visited is not None:
                    pool.release(visited)
            return out

        return run_chunked(kernel, xq, self.threads)

    def _check_probe_limit(self, R: int) -> None:
        probes = self.probe_count(R)
        if probes > self.max_probes:
            raise MIHProbeLimitError(probes, self.max_probes, R, self.bits, self.substrings)

    # ------------------------------------------------------------------ persistence
    def snapshot(self) -> tuple[dict, dict]:
        """``(meta, arrays)`` of a snapshot (see :mod:`index.storage.store`): the items and the
        substring tables as they are (a load maps them, nothing is rebuilt)."""
        meta = {"substrings": self.substrings, "fixed_substrings": self.fixed_substrings,
                "max_probes": self.max_probes, "layout": "positions",
                "distinct": self.tables.distinct}
        arrays = {"words": self.words, "ids": self.ids,
                  **{f"table_{name}": a for name, a in self.tables.arrays().items()}}
        return meta, arrays

    @classmethod
    def from_snapshot(cls, bits: int, meta: dict, arrays: dict) -> MultiIndex:
        """The index of a snapshot. Formats 1-3 (bucket tables of distinct substrings,
        ``table_codes`` ... ``table_bitmap``): the tables are built again from the items."""
        index = cls(bits, substrings=meta["fixed_substrings"], max_probes=meta["max_probes"])
        m = int(meta["substrings"])
        starts, widths = substring_ranges(index.bits, m)
        words, ids = arrays["words"], arrays["ids"]
        if meta.get("layout") != "positions":
            if not _sorted_by_code_id(words, ids):
                words, ids = sort_items(words, ids)
            index._install(words, ids, starts, widths,
                           build_tables(index.bits, words, ids, starts, widths, index._word_width))
            return index
        ends = arrays.get("table_ends")
        tables = SubstringTables(*(arrays[f"table_{name}"] for name in TABLE_ARRAYS[:-1]),
                                 ends if ends is not None else np.zeros(1, np.uint64),
                                 meta["distinct"])
        tables.tables = with_tag_columns(np.asarray(tables.tables), len(ids))
        rows = table_rows(index.bits, starts, widths, len(ids))
        geometry = slice(T_START, T_ROW_BITS + 1)  # the substrings' bits and the rows' bits
        if tables.tables.shape != rows.shape or \
                (tables.tables[:, geometry] != rows[:, geometry]).any() or \
                tables.positions.shape != (m * len(ids),):
            raise ValueError(f"substring tables of shape {tables.tables.shape} and "
                             f"{tables.positions.shape[0]} positions do not match {m} "
                             f"substrings of {index.bits}-bit codes over {len(ids)} items")
        if ends is None:  # tables saved before their end bits: from the hashed tables' slots
            tables.ends = bucket_ends(tables.slots, tables.tables, len(ids))
        index._install(words, ids, starts, widths, tables)
        return index


@njit
def _sorted_by_code_id_kernel(words, ids):
    n, W = words.shape
    for i in range(1, n):
        order = 0  # -1, 0, 1: row i below, equal to, above row i - 1
        for w in range(W):
            if words[i, w] != words[i - 1, w]:
                order = 1 if words[i, w] > words[i - 1, w] else -1
                break
        if order < 0 or (order == 0 and ids[i] <= ids[i - 1]):
            return False
    return True


def _sorted_by_code_id(words, ids) -> bool:
    """Whether items are in strictly ascending (code, id) order (one pass)."""
    return bool(_sorted_by_code_id_kernel(np.ascontiguousarray(words, dtype=np.uint64),
                                          np.ascontiguousarray(ids, dtype=np.int64)))
