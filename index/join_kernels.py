"""Compiled kernels of the self-join (:mod:`bucketsearch.index.join`): every pair of items within
radius R.

Items are ``words`` ``(n, W)`` uint64 and ``ids`` ``(n,)`` int64 (one row per live item); a pair
is emitted as ``(a, b, d)`` with ``a = min(id) < b = max(id)`` and ``d = sum_w popcount(x_w XOR
y_w) <= R``, into caller-owned buffers ``out_a``, ``out_b``, ``out_d``. Every kernel is
resumable: it returns where it stopped when the buffers cannot take the next step's pairs, and
the caller drains them and calls again from there. Counters go to ``tally``
(:data:`T_CANDIDATES`, :data:`T_PROBES`, :data:`T_PAIRS`).

* :func:`scan_pairs`: all ``n (n - 1) / 2`` pairs compared (items sorted by id, so pairs come
  out already ordered by ``(a, b)``).
* :func:`hash_blocks` + :func:`block_pairs`: one table of the block join. A table is a bit mask
  ``M_t`` (``k`` of ``b`` contiguous blocks of the code); two items collide in it when their
  codes agree on the mask. Items are counting-sorted by the top bits of a hash of ``x & M_t``
  (:func:`bucketsearch.index.table.hash_words`), and every pair of a group with equal hashes is
  verified by
  its full distance. A pair within R is emitted only by the FIRST table (in table order) whose
  mask it agrees on (``(x XOR y) & M_t == 0``), so each pair once over all tables.
* :func:`probe_pairs`: probing, for every distinct code ``u`` of a bucket table, the codes at
  distance ``1..R`` (XOR masks in next-combination order); a pair of buckets is emitted from the
  one with the smaller bucket number (codes sorted, so the smaller code), pairs inside a bucket
  at distance 0.
* :func:`union_pairs` / :func:`drop_later`: union-find and the greedy keep-first rule over
  positions of a pair stream.

Plain-numpy twins: tests/naive.py (``join_pairs``, ``components``, ``keep_first``).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index._jit import njit, popcount64
from bucketsearch.index.table import find_bucket, hash_words

#: Rows of the ``tally`` counters.
T_CANDIDATES, T_PROBES, T_PAIRS = range(3)


@njit(inline="always")
def _distance(words, x, y, W):
    d = 0
    for w in range(W):
        d += popcount64(words[x, w] ^ words[y, w])
    return d


@njit(inline="always")
def _emit(ix, iy, d, out_a, out_b, out_d, n_out):
    if ix < iy:
        out_a[n_out] = ix
        out_b[n_out] = iy
    else:
        out_a[n_out] = iy
        out_b[n_out] = ix
    out_d[n_out] = d
    return n_out + 1


@njit
def scan_pairs(words, ids, R, i, j, i_end, out_a, out_b, out_d, tally):
    """Pairs of the linear scan from position ``(i, j)`` (``j <= i`` means ``i + 1``) to row
    ``i_end`` (excluded): rows in id order, so ``a = ids[i] < b = ids[j]`` and the output is
    ordered by ``(a, b)``. Returns ``(i, j, n_out)``; ``i == i_end`` when done, else the buffers
    are full and the scan resumes at ``(i, j)``."""
    n, W = words.shape
    cap = len(out_a)
    n_out = 0
    while i < i_end:
        if j <= i:
            j = i + 1
        start = j
        if W == 1:
            x = words[i, 0]
            while j < n:
                d = popcount64(x ^ words[j, 0])
                if d <= R:
                    if n_out == cap:
                        tally[T_CANDIDATES] += j - start
                        tally[T_PAIRS] += n_out
                        return i, j, n_out
                    out_a[n_out] = ids[i]
                    out_b[n_out] = ids[j]
                    out_d[n_out] = d
                    n_out += 1
                j += 1
        else:
            while j < n:
                d = _distance(words, i, j, W)
                if d <= R:
                    if n_out == cap:
                        tally[T_CANDIDATES] += j - start
                        tally[T_PAIRS] += n_out
                        return i, j, n_out
                    out_a[n_out] = ids[i]
                    out_b[n_out] = ids[j]
                    out_d[n_out] = d
                    n_out += 1
                j += 1
        tally[T_CANDIDATES] += j - start
        i += 1
        j = i + 1
    tally[T_PAIRS] += n_out
    return i, j, n_out


@njit(inline="always")
def _masked_hash(words, i, mask, W, tmp):
    for w in range(W):
        tmp[w] = words[i, w] & mask[w]
    return hash_words(tmp, W)


@njit
def hash_blocks(words, mask, top_bits, order, sorted_h, sorted_w, tmp_order, tmp_h, tmp_w,
                counts):
    """Radix sort (two LSD passes over the top ``top_bits`` bits, ``counts`` scratch of
    ``2^ceil(top_bits / 2) + 1``) of the items by the hash ``h`` of their masked code ``x &
    mask`` (:func:`index.table.hash_words`): ``order`` gets the rows, ``sorted_h`` their hashes
    and ``sorted_w`` their codes (so a run's candidates are verified from contiguous memory),
    items with equal top bits adjacent (``tmp_*``: scratch of the same shapes). Returns the
    longest run of equal top bits (the most pairs one row of :func:`block_pairs` emits, + 1)."""
    n, W = words.shape
    tmp = np.empty(W, dtype=np.uint64)
    lo_bits = top_bits // 2
    hi_bits = top_bits - lo_bits
    lo_shift = np.uint64(64 - top_bits)
    hi_shift = np.uint64(64 - hi_bits)
    lo_mask = np.uint64((1 << lo_bits) - 1)
    # pass 1: by the low half of the top bits, rows 0..n-1 into (tmp_order, tmp_h, tmp_w)
    counts[:] = 0
    for i in range(n):
        h = _masked_hash(words, i, mask, W, tmp)
        sorted_h[i] = h  # scratch until pass 2
        counts[np.int64((h >> lo_shift) & lo_mask) + 1] += 1
    for g in range(1, (1 << lo_bits) + 1):
        counts[g] += counts[g - 1]
    for i in range(n):
        h = sorted_h[i]
        g = np.int64((h >> lo_shift) & lo_mask)
        p = counts[g]
        counts[g] = p + 1
        tmp_order[p] = i
        tmp_h[p] = h
        for w in range(W):
            tmp_w[p, w] = words[i, w]
    # pass 2: by the high half, stable, into (order, sorted_h, sorted_w)
    counts[:] = 0
    for i in range(n):
        counts[np.int64(tmp_h[i] >> hi_shift) + 1] += 1
    for g in range(1, (1 << hi_bits) + 1):
        counts[g] += counts[g - 1]
    for i in range(n):
        h = tmp_h[i]
        g = np.int64(h >> hi_shift)
        p = counts[g]
        counts[g] = p + 1
        order[p] = tmp_order[i]
        sorted_h[p] = h
        for w in range(W):
            sorted_w[p, w] = tmp_w[i, w]
    longest = 0
    run = 0
    for i in range(n):
        if i > 0 and (sorted_h[i] >> lo_shift) == (sorted_h[i - 1] >> lo_shift):
            run += 1
        else:
            run = 1
        if run > longest:
            longest = run
    return longest


@njit
def first_agreeing_table(words, x, y, masks):
    """Index of the first table whose mask the codes of rows ``x`` and ``y`` agree on, or -1."""
    T, W = masks.shape
    for t in range(T):
        same = True
        for w in range(W):
            if (words[x, w] ^ words[y, w]) & masks[t, w] != 0:
                same = False
                break
        if same:
            return t
    return -1


@njit
def block_pairs(sorted_w, order, sorted_h, R, t, masks, top_bits, p, out_a, out_b, out_d, tally):
    """Pairs of rows of block table ``t`` (after :func:`hash_blocks` with ``masks[t]``) from
    sorted row ``p`` on. A candidate is a pair of rows with equal hashes (so in one run of equal
    top bits); it is emitted when its distance is at most ``R`` and ``t`` is its
    :func:`first_agreeing_table`. Returns ``(p, n_out)``: ``p == n`` when done, else the
    buffers could not take row ``p``'s pairs (they must hold the longest run) and the table
    resumes there."""
    n, W = sorted_w.shape
    cap = len(out_a)
    n_out = 0
    shift = np.uint64(64 - top_bits)
    cand = 0
    end = p  # end of the current run of equal top bits (found once per run)
    while p < n - 1:
        hp = sorted_h[p]
        if end <= p:
            top = hp >> shift
            end = p + 1
            while end < n and (sorted_h[end] >> shift) == top:
                end += 1
        if cap - n_out < end - p - 1:
            break
        for q in range(p + 1, end):
            if sorted_h[q] != hp:
                continue
            cand += 1
            d = _distance(sorted_w, p, q, W)
            if d <= R and first_agreeing_table(sorted_w, p, q, masks) == t:
                n_out = _emit(np.int64(order[p]), np.int64(order[q]), d, out_a, out_b, out_d,
                              n_out)
        p += 1
    if p == n - 1:
        p = n
    tally[T_CANDIDATES] += cand
    tally[T_PAIRS] += n_out
    return p, n_out


@njit
def probe_pairs(codes, offsets, ids, slots, bitmap, table_shift, filter_shift, direct, bits,
                flip_word, flip_mask, R, u, r, u_end, hits, out_a, out_b, out_d, tally):
    """Pairs by probing the bucket table (:class:`bucketsearch.index.table.BucketTable` of the
    items: distinct
    ``codes`` sorted, bucket ``u`` holding ``ids[offsets[u]:offsets[u + 1]]``) from bucket ``u``,
    radius ``r``: radius 0 gives the pairs inside bucket ``u``; radius ``1..R`` probes the
    ``C(Q, r)`` codes at distance ``r`` (bit ``j`` flipped by ``flip_mask[j]`` in word
    ``flip_word[j]``) and pairs bucket ``u`` with every non-empty bucket ``v > u`` found (each
    pair of buckets once: from the smaller), up to bucket ``u_end`` (excluded). Returns ``(u,
    r, n_out, need)``: ``u == u_end`` when done; else the buffers cannot take the pairs of step ``(u, r)`` (``need`` > 0: ``hits``
    needs ``need`` entries; ``need == 0``: the output buffers are full, drain them, or grow them
    when they were empty)."""
    nu, W = codes.shape
    cap = len(out_a)
    n_out = 0
    cur = np.empty(W, dtype=np.uint64)
    pos = np.empty(max(R, 1), dtype=np.int64)
    while u < u_end:
        lo = offsets[u]
        hi = offsets[u + 1]
        size = hi - lo
        while r <= R:
            if r == 0:
                if cap - n_out < size * (size - 1) // 2:
                    return u, r, n_out, 0
                for s in range(lo, hi):
                    for s2 in range(s + 1, hi):
                        n_out = _emit(ids[s], ids[s2], 0, out_a, out_b, out_d, n_out)
                tally[T_PROBES] += 1
                r += 1
                continue
            if r > bits:
                break
            # the codes at distance exactly r, positions pos[0] < ... < pos[r - 1]
            for w in range(W):
                cur[w] = codes[u, w]
            for j in range(r):
                pos[j] = j
                cur[flip_word[j]] ^= flip_mask[j]
            nh = 0
            probes = 0
            while True:
                probes += 1
                b = find_bucket(cur, W, codes, slots, bitmap, table_shift, filter_shift, direct)
                if b > u:
                    if nh < len(hits):
                        hits[nh] = b
                    nh += 1
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
            if nh > len(hits):
                return u, r, n_out, nh
            need = 0
            for h in range(nh):
                need += offsets[hits[h] + 1] - offsets[hits[h]]
            if cap - n_out < need * size:
                return u, r, n_out, 0
            tally[T_PROBES] += probes
            tally[T_CANDIDATES] += need * size
            for h in range(nh):
                v = hits[h]
                for s in range(lo, hi):
                    for s2 in range(offsets[v], offsets[v + 1]):
                        n_out = _emit(ids[s], ids[s2], r, out_a, out_b, out_d, n_out)
            r += 1
        u += 1
        r = 0
    tally[T_PAIRS] += n_out
    return u, r, n_out, 0


@njit(inline="always")
def _find(parent, x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]  # path halving
        x = parent[x]
    return x


@njit
def union_pairs(parent, pa, pb):
    """Union-find over positions: every pair ``(pa[i], pb[i])`` joins its two sets, the root
    being the smaller position (so, positions ordered by id, the component's smallest id)."""
    for i in range(len(pa)):
        x = _find(parent, pa[i])
        y = _find(parent, pb[i])
        if x < y:
            parent[y] = x
        elif y < x:
            parent[x] = y


@njit
def roots(parent):
    """Each position's root (the smallest position of its component)."""
    out = np.empty(len(parent), dtype=np.int64)
    for x in range(len(parent)):
        out[x] = _find(parent, x)
    return out


@njit
def drop_later(dropped, pa, pb):
    """The greedy keep-first rule over pairs ordered by ``a``: a kept ``a`` (not yet dropped)
    drops every ``b`` it pairs with. ``a``'s own status is final when its pairs arrive (every
    pair that could drop it has a smaller first item, so came before)."""
    for i in range(len(pa)):
        if not dropped[pa[i]]:
            dropped[pb[i]] = True


@njit
def rows_below(words, mask, threshold, out):
    """Rows whose masked-code hash (as :func:`hash_blocks`) is below ``threshold``, into
    ``out``; returns their count. Two items that agree on ``mask`` have one hash, so a pair of
    a table is in the selection with probability ``threshold / 2^64`` (the join's estimate)."""
    n, W = words.shape
    tmp = np.empty(W, dtype=np.uint64)
    k = 0
    for i in range(n):
        if _masked_hash(words, i, mask, W, tmp) < threshold:
            out[k] = i
            k += 1
    return k
