"""Radix sorts of ``(key, value)`` pairs: the builds' one sort, and the merge of two sorted runs.

:func:`sort_pairs` orders uint64 ``keys`` with their ``values`` (stable: pairs of equal keys
keep their input order). One pass splits the pairs by their leading digit: the
:data:`MSD_BITS` bits that end at the highest bit on which any two keys differ
(:func:`msd_shift`; the bits above are the same in every key), counted (:func:`msd_histogram`)
and scattered to their digit's run (:func:`msd_scatter`, exclusive prefix sums of the counts):
``2^11`` runs, each written front to back. Each run is then sorted by the bits below the digit
(:func:`sort_digit_runs`): an insertion sort up to :data:`SMALL_RUN` pairs, else the least
significant digit radix sort, one byte a pass, after one pass that counts every byte at once
(a byte on which the run agrees is skipped). At 10M uniform 64-bit keys a run holds ~5,000
pairs (80 kB), so its seven passes stay in the cache and only the first pass reads and writes
main memory: 0.30 against 0.42 CPU s for eight passes over the whole array (bench/RESULTS.md
section 29). ``O(n)`` per pass, no comparison but in runs of at most 32, no Python per item.

:func:`sort_pairs_threads` runs the same kernels on several threads: the leading digit's counts
and scatter by chunks of the input (chunk ``t``'s pairs of a digit placed after those of the
chunks before it, so the split stays stable), then the runs by groups of about ``n / threads``
pairs; the result is the one-thread result, bit for bit.

:func:`sort_codes_ids` sorts one-word codes by ``(code, id)``: by code alone when the ids
already increase (stability keeps them so), else by id first then by code.
:func:`merge_sorted` merges two such sorted runs in one pass (a live index's merge: the main
index's items, already in that order, and the sorted delta). :func:`repeated_id` checks a batch
of ids for repeats in one pass when they increase.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from bucketsearch.index._jit import clz64, njit
from bucketsearch.index.pool import run_parts

DIGIT_BITS = 8
DIGITS = 64 // DIGIT_BITS
RADIX = 1 << DIGIT_BITS
SIGN = np.uint64(1 << 63)
MSD_BITS = 11              # the first pass's digit: 2,048 runs, each written sequentially
MSD_RADIX = 1 << MSD_BITS
SMALL_RUN = 32             # runs up to this many pairs: insertion sort
PARALLEL_MIN_PAIRS = 1 << 16  # fewer pairs: one thread (splitting costs more than it saves)


@njit
def _digit_starts(hist, d, n, fill):
    """Byte ``d``'s run starts into ``fill`` (exclusive prefix sums of its histogram); False,
    and nothing written, when every key has the same byte ``d`` (the pass would move nothing)."""
    if n == 0:
        return False
    for b in range(RADIX):
        if hist[d, b] == n:
            return False
    acc = 0
    for b in range(RADIX):
        fill[b] = acc
        acc += hist[d, b]
    return True


@njit
def msd_shift(keys):
    """The first bit of the leading digit: the :data:`MSD_BITS` bits that end at the highest
    bit on which ``keys`` differ (0 when fewer bits differ); -1 when no two keys differ."""
    n = len(keys)
    if n < 2:
        return -1
    k0 = keys[0]
    diff = np.uint64(0)
    for i in range(1, n):
        diff |= keys[i] ^ k0
    if diff == np.uint64(0):
        return -1
    return max(63 - np.int64(clz64(diff)) + 1 - MSD_BITS, 0)


@njit
def msd_histogram(keys, a, b, shift, hist):
    """Counts of the leading digit (bits ``shift .. shift + MSD_BITS``) of ``keys[a:b]``,
    added to ``hist`` (``MSD_RADIX``)."""
    mask = np.uint64(MSD_RADIX - 1)
    sh = np.uint64(shift)
    for i in range(a, b):
        hist[(keys[i] >> sh) & mask] += 1


@njit
def msd_scatter(keys, values, a, b, shift, fill, k_out, v_out):
    """Pairs ``a:b`` to their leading digit's run (``fill``: each digit's next slot, advanced),
    in input order (stable)."""
    mask = np.uint64(MSD_RADIX - 1)
    sh = np.uint64(shift)
    for i in range(a, b):
        k = keys[i]
        d = (k >> sh) & mask
        j = fill[d]
        k_out[j] = k
        v_out[j] = values[i]
        fill[d] = j + 1


@njit
def _lsd_run(keys, values, tk, tv, hist, digits):
    """Stable LSD sort of ``keys`` / ``values`` (views of one run) by their ``digits`` low
    bytes, through the scratch ``tk`` / ``tv`` (at least as long); a byte on which the run
    agrees is skipped. The result is left in ``keys`` / ``values``."""
    m = len(keys)
    mask = np.uint64(RADIX - 1)
    for d in range(digits):
        for b in range(RADIX):
            hist[d, b] = 0
    for i in range(m):
        k = keys[i]
        for d in range(digits):
            hist[d, (k >> np.uint64(d * DIGIT_BITS)) & mask] += 1
    k_in, v_in, k_out, v_out = keys, values, tk[:m], tv[:m]
    moved = False
    for d in range(digits):
        if not _digit_starts(hist, d, m, hist[DIGITS]):
            continue
        fill = hist[DIGITS]
        shift = np.uint64(d * DIGIT_BITS)
        for i in range(m):
            k = k_in[i]
            b = (k >> shift) & mask
            j = fill[b]
            k_out[j] = k
            v_out[j] = v_in[i]
            fill[b] = j + 1
        k_in, k_out = k_out, k_in
        v_in, v_out = v_out, v_in
        moved = not moved
    if moved:  # the last pass wrote the scratch
        for i in range(m):
            keys[i] = k_in[i]
            values[i] = v_in[i]


@njit
def sort_digit_runs(keys, values, bounds, g0, g1, shift):
    """Sort, in place, each run ``bounds[g]:bounds[g + 1]`` (``g0 <= g < g1``) of pairs that
    agree on every bit from ``shift`` up, by their bits below ``shift``: insertion sort up to
    :data:`SMALL_RUN` pairs, else LSD by bytes through scratch of the largest run's size (a
    run of a few thousand pairs stays in the cache for all its passes)."""
    largest = 0
    for g in range(g0, g1):
        largest = max(largest, bounds[g + 1] - bounds[g])
    digits = (shift + DIGIT_BITS - 1) // DIGIT_BITS
    if largest < 2 or digits == 0:
        return
    tk = np.empty(largest, dtype=keys.dtype)
    tv = np.empty(largest, dtype=values.dtype)
    hist = np.empty((DIGITS + 1, RADIX), dtype=np.int64)  # row DIGITS: the fill pointers
    for g in range(g0, g1):
        a, b = bounds[g], bounds[g + 1]
        if b - a < 2:
            continue
        if b - a <= SMALL_RUN:
            for i in range(a + 1, b):  # stable insertion sort
                k, v = keys[i], values[i]
                j = i - 1
                while j >= a and keys[j] > k:
                    keys[j + 1] = keys[j]
                    values[j + 1] = values[j]
                    j -= 1
                keys[j + 1] = k
                values[j + 1] = v
            continue
        _lsd_run(keys[a:b], values[a:b], tk, tv, hist, digits)


@njit
def _exclusive_sums(hist):
    out = np.empty(len(hist) + 1, dtype=np.int64)
    acc = 0
    for b in range(len(hist)):
        out[b] = acc
        acc += hist[b]
    out[len(hist)] = acc
    return out


@njit
def sort_pairs(keys, values):
    """``(sorted keys, values in that order)``, stable; the inputs are not modified. One pass
    splits the pairs by their leading :data:`MSD_BITS` varying bits (:func:`msd_shift`), then
    each of those runs is sorted by the bits below, in the cache (:func:`sort_digit_runs`):
    at 10M uniform 64-bit keys the runs hold ~5,000 pairs, so only the first pass reads and
    writes main memory (:func:`sort_pairs_threads` runs the same kernels on several threads)."""
    n = len(keys)
    k_out = np.empty_like(keys)
    v_out = np.empty_like(values)
    shift = msd_shift(keys)
    if shift < 0:
        k_out[:] = keys
        v_out[:] = values
        return k_out, v_out
    hist = np.zeros(MSD_RADIX, dtype=np.int64)
    msd_histogram(keys, 0, n, shift, hist)
    bounds = _exclusive_sums(hist)
    msd_scatter(keys, values, 0, n, shift, bounds[:MSD_RADIX].copy(), k_out, v_out)
    sort_digit_runs(k_out, v_out, bounds, 0, MSD_RADIX, shift)
    return k_out, v_out


def sort_pairs_threads(keys: np.ndarray, values: np.ndarray, threads: int = 1):
    """:func:`sort_pairs` on ``threads`` threads (:func:`bucketsearch.index.pool.run_parts`):
    the leading digit's histogram and scatter by chunks of the input (each chunk's runs
    placed after the earlier chunks', so the split is stable), then the runs sorted by groups
    of about ``n / threads`` pairs. The same result as :func:`sort_pairs`, bit for bit."""
    n = len(keys)
    if threads <= 1 or n < PARALLEL_MIN_PAIRS:
        return sort_pairs(keys, values)
    shift = int(msd_shift(keys))
    if shift < 0:
        return keys.copy(), values.copy()
    cuts = np.linspace(0, n, threads + 1).astype(np.int64)
    hists = np.zeros((threads, MSD_RADIX), dtype=np.int64)
    run_parts([partial(msd_histogram, keys, int(a), int(b), shift, hists[t])
               for t, (a, b) in enumerate(zip(cuts, cuts[1:]))])
    bounds = np.zeros(MSD_RADIX + 1, dtype=np.int64)
    np.cumsum(hists.sum(axis=0), out=bounds[1:])
    fills = bounds[:MSD_RADIX] + np.cumsum(hists, axis=0) - hists  # chunk t after chunks < t
    k_out, v_out = np.empty_like(keys), np.empty_like(values)
    run_parts([partial(msd_scatter, keys, values, int(a), int(b), shift, fills[t], k_out, v_out)
               for t, (a, b) in enumerate(zip(cuts, cuts[1:]))])
    groups = np.searchsorted(bounds, np.linspace(0, n, threads + 1)).clip(0, MSD_RADIX)
    groups[0], groups[-1] = 0, MSD_RADIX
    run_parts([partial(sort_digit_runs, k_out, v_out, bounds, int(g0), int(g1), shift)
               for g0, g1 in zip(groups, groups[1:]) if g1 > g0])
    return k_out, v_out


@njit
def _increasing(ids):
    for i in range(1, len(ids)):
        if ids[i] <= ids[i - 1]:
            return False
    return True


def increasing(ids) -> bool:
    """Whether int64 ``ids`` strictly increase (one pass)."""
    return bool(_increasing(ids))


@njit
def _id_keys(ids):
    """int64 ids as uint64 keys of the same order (the sign bit flipped)."""
    out = np.empty(len(ids), dtype=np.uint64)
    for i in range(len(ids)):
        out[i] = np.uint64(ids[i]) ^ SIGN
    return out


@njit
def _gather(keys, order):
    out = np.empty(len(order), dtype=keys.dtype)
    for i in range(len(order)):
        out[i] = keys[order[i]]
    return out


def sort_codes_ids(codes: np.ndarray, ids: np.ndarray, threads: int = 1):
    """One-word ``codes`` (uint64, ``(n,)``) and their int64 ``ids`` sorted by ``(code, id)``:
    ``(codes, ids)`` in that order, on ``threads`` threads (the same result on any number)."""
    if _increasing(ids):
        return sort_pairs_threads(codes, ids, threads)
    # positions in id order, then by code (stable: ids ascending within a code)
    _, by_id = sort_pairs_threads(_id_keys(ids), np.arange(len(ids)), threads)
    sorted_codes, order = sort_pairs_threads(_gather(codes, by_id), by_id, threads)
    return sorted_codes, _gather(ids, order)


@njit
def sort_ids(ids):
    """int64 ``ids`` in ascending order (a copy), by the radix sort."""
    return sort_pairs(_id_keys(ids), ids)[1]


@njit
def merge_sorted(codes_a, ids_a, codes_b, ids_b):
    """Two runs of one-word codes and ids, each sorted by (code, id), merged into one sorted
    run (one linear pass; ties cannot occur: an id is in one run only)."""
    na, nb = len(codes_a), len(codes_b)
    codes = np.empty(na + nb, dtype=np.uint64)
    ids = np.empty(na + nb, dtype=np.int64)
    i = j = 0
    for t in range(na + nb):
        if j >= nb or (i < na and (codes_a[i] < codes_b[j]
                                   or (codes_a[i] == codes_b[j] and ids_a[i] < ids_b[j]))):
            codes[t] = codes_a[i]
            ids[t] = ids_a[i]
            i += 1
        else:
            codes[t] = codes_b[j]
            ids[t] = ids_b[j]
            j += 1
    return codes, ids


def id_keys(ids):
    """int64 ids as uint64 keys of the same order."""
    return _id_keys(ids)


@njit
def _first_repeat(sorted_ids):
    """The first value of ascending ``sorted_ids`` that its successor repeats, and whether
    there is one."""
    for i in range(1, len(sorted_ids)):
        if sorted_ids[i] == sorted_ids[i - 1]:
            return sorted_ids[i], True
    return np.int64(0), False


def repeated_id(ids) -> int | None:
    """The smallest int64 id of ``ids`` that appears more than once, or None: one pass when
    the ids increase (a build's usual ids), else the radix sort (:func:`sort_ids`) and one
    pass, where ``np.unique`` sorts by comparisons (1.5 s of a 2.5 s build of 10M items)."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if len(ids) < 2 or _increasing(ids):
        return None
    value, found = _first_repeat(sort_ids(ids))
    return int(value) if found else None


__all__ = ["id_keys", "increasing", "merge_sorted", "repeated_id", "sort_codes_ids", "sort_ids",
           "sort_pairs", "sort_pairs_threads"]
