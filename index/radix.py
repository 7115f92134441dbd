"""Least-significant-digit radix sort of ``(key, value)`` pairs: the builds' one sort.

:func:`sort_pairs` orders uint64 ``keys`` with their int64 ``values`` (stable: pairs of equal keys
keep their input order) in ``8`` passes of one byte each, after one pass that counts all eight
byte histograms at once; a byte on which every key agrees (the high bytes of short codes, the
bytes of dense ids) is skipped. Each pass reads the pairs once and writes them once to their
digit's run (exclusive prefix sums of the histogram): ``O(n)`` per pass, no comparison, no
Python per item. :func:`sort_codes_ids` sorts one-word codes by ``(code, id)``: by code alone
when the ids already increase (stability keeps them so), else by id first then by code.
:func:`merge_sorted` merges two such sorted runs in one pass (a live index's merge: the main
index's items, already in that order, and the sorted delta).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index._jit import njit

DIGIT_BITS = 8
DIGITS = 64 // DIGIT_BITS
RADIX = 1 << DIGIT_BITS
SIGN = np.uint64(1 << 63)


@njit
def _histograms(keys):
    """``(DIGITS, RADIX)`` counts of every byte of ``keys`` (one pass)."""
    hist = np.zeros((DIGITS, RADIX), dtype=np.int64)
    mask = np.uint64(RADIX - 1)
    for i in range(len(keys)):
        k = keys[i]
        for d in range(DIGITS):
            hist[d, (k >> np.uint64(d * DIGIT_BITS)) & mask] += 1
    return hist


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
def sort_pairs(keys, values):
    """``(sorted keys, values in that order)``, stable; the inputs are not modified."""
    n = len(keys)
    hist = _histograms(keys)
    k_in = keys.copy()
    v_in = values.copy()
    k_out = np.empty_like(k_in)
    v_out = np.empty_like(v_in)
    mask = np.uint64(RADIX - 1)
    fill = np.empty(RADIX, dtype=np.int64)
    for d in range(DIGITS):
        if not _digit_starts(hist, d, n, fill):
            continue
        shift = np.uint64(d * DIGIT_BITS)
        for i in range(n):
            k = k_in[i]
            b = (k >> shift) & mask
            j = fill[b]
            k_out[j] = k
            v_out[j] = v_in[i]
            fill[b] = j + 1
        k_in, k_out = k_out, k_in
        v_in, v_out = v_out, v_in
    return k_in, v_in


@njit
def sort_rows(keys, rows):
    """:func:`sort_pairs` whose values are the rows of ``rows`` (``(n, P)``): ``(sorted keys,
    rows in that order)``, stable; the inputs are not modified. Carrying the rows through the
    passes keeps every read and write front to back, where gathering them afterwards by a
    permutation reads at random (a stall per row on arrays larger than the caches)."""
    n, P = rows.shape
    hist = _histograms(keys)
    k_in = keys.copy()
    r_in = rows.copy()
    k_out = np.empty_like(k_in)
    r_out = np.empty_like(r_in)
    mask = np.uint64(RADIX - 1)
    fill = np.empty(RADIX, dtype=np.int64)
    for d in range(DIGITS):
        if not _digit_starts(hist, d, n, fill):
            continue
        shift = np.uint64(d * DIGIT_BITS)
        for i in range(n):
            k = k_in[i]
            b = (k >> shift) & mask
            j = fill[b]
            k_out[j] = k
            for c in range(P):
                r_out[j, c] = r_in[i, c]
            fill[b] = j + 1
        k_in, k_out = k_out, k_in
        r_in, r_out = r_out, r_in
    return k_in, r_in


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


@njit
def sort_codes_ids(codes, ids):
    """One-word ``codes`` (uint64, ``(n,)``) and their int64 ``ids`` sorted by ``(code, id)``:
    ``(codes, ids)`` in that order."""
    if _increasing(ids):
        return sort_pairs(codes, ids)
    _, by_id = sort_pairs(_id_keys(ids), np.arange(len(ids)))  # positions in id order
    sorted_codes, order = sort_pairs(_gather(codes, by_id), by_id)
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


__all__ = ["id_keys", "increasing", "merge_sorted", "sort_codes_ids", "sort_ids", "sort_pairs",
           "sort_rows"]
