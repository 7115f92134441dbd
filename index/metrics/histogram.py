"""Per-query Hamming distance histograms: the one pass every metric is computed from.

For query ``q`` and distance ``d = 0..Q`` the kernel counts

* ``count[q, d]``: database items at Hamming distance ``d``;
* ``relevant[q, d]``: relevant items among them (gain ``g > 0``);
* ``gain[q, d]``: the sum of their gains ``g`` (graded: number of shared labels or the
  user's matrix value; binary: 1);
* ``gain_exp[q, d]``: the sum of ``2^g - 1`` (the NDCG gain).

Relevance is read on the fly per (query, item) from compact label arrays
(:mod:`bucketsearch.index.evaluation.relevance`), so nothing of size ``nq x nb`` is ever allocated:
memory is ``O(nq * (Q + 1))`` plus ``O(nb)`` per thread for the optional as-ranked pass.

As-ranked metrics need the order (distance, db index). The pass visits items in db index order,
so for every relevant item it knows how many items (and relevant items, and gain) precede it at
the same distance; after the pass, its rank is ``#items at smaller distance + that + 1``. The
kernel reduces these to per-query sums (AP numerators, relevant in the top k, DCG@k, the
weighted-AP numerator) without sorting anything.

With ``code_stats`` the same pass also gives, per distance, the number of distinct occupied
database codes and the largest bucket (what mLGAP and the empty-bucket statistics need): each
item carries the size of its bucket if it is the first item of that code, else 0
(:func:`first_of_code`). :func:`code_histograms` computes the same from the distinct codes
alone (a separate pass; a cross-check).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
from numba import prange

from bucketsearch.index._jit import njit, pjit, popcount64
from bucketsearch.index.codes import as_words
from bucketsearch.index.metrics.relevance import Relevance

#: columns of ``ranked`` per cut-off k: AP numerator, relevant in top k, DCG@k,
#: weighted-AP numerator
RANKED_FIELDS = 4


@njit
def _histogram_range(q, i0, i1, nbuf, ptr, off, xq, xb, mode, qlab, blab, indptr, indices, data,
                     graded,
                     count, nrel, gsum, gexp, levels, want_ranked, buf_d, buf_p, buf_rp, buf_gp,
                     buf_g, want_codes, first_size, ncodes, maxb):
    """Items i0..i1-1 (db index order) for query q. ``nbuf``/``ptr`` carry the query's
    as-ranked buffer fill and CSR cursor from one chunk to the next; returns them updated.
    One loop with the relevance mode as a branch, no calls inside it (a call with array
    arguments costs reference counting per item)."""
    n_w = xb.shape[1]
    n_levels = levels.shape[1]
    lw = qlab.shape[1] if mode == 1 else 0
    row_end = indptr[q + 1] if mode == 2 else 0
    lab = qlab[q if mode == 0 else 0, 0]  # only class ids (mode 0) have a row per query
    for i in range(i0, i1):
        if n_w == 1:
            d = popcount64(xq[q, 0] ^ xb[i, 0])
        else:
            d = 0
            for w in range(n_w):
                d += popcount64(xq[q, w] ^ xb[i, w])
        if want_codes:
            # singletons (size 1, the common case) need nothing here: afterwards
            # distinct codes = items - repeats, largest bucket >= 1 wherever there are items
            size = first_size[i]
            if size != 1:
                if size == 0:
                    ncodes[q, d] += 1  # a repeat of a code seen earlier (counted once there)
                elif size > maxb[q, d]:
                    maxb[q, d] = size
        g = 0.0
        if mode == 0:
            if blab[i, 0] == lab:
                g = 1.0
        elif mode == 1:
            s = 0
            for w in range(lw):
                s += popcount64(np.uint64(qlab[q, w]) & np.uint64(blab[i, w]))
            if s > 0:
                g = float(s) if graded else 1.0
        else:
            # ptr walks the query's sorted CSR row as i increases
            while ptr < row_end and indices[ptr] < i:
                ptr += 1
            if ptr < row_end and indices[ptr] == i:
                g = data[ptr] if graded else 1.0
        if g > 0.0:
            if want_ranked:
                j = off + nbuf
                buf_d[j] = d
                buf_p[j] = count[q, d]
                buf_rp[j] = nrel[q, d]
                if graded:  # binary gains: the gain before is buf_rp, the gain is 1
                    buf_gp[j] = gsum[q, d]
                    buf_g[j] = g
                nbuf += 1
            nrel[q, d] += 1
            gsum[q, d] += g
            gexp[q, d] += 1.0 if g == 1.0 else 2.0 ** g - 1.0
            if mode != 2 and n_levels > 1:
                levels[q, int(g)] += 1
        count[q, d] += 1
    return nbuf, ptr


@njit
def _finish_ranked(q, off, nbuf, count, nrel, gsum, ks, ranked, buf_d, buf_p, buf_rp, buf_gp,
                   buf_g, cum_c, cum_r, cum_g, graded):
    """Per-query as-ranked sums from the buffered relevant items (rank in (distance, index))."""
    n_d = count.shape[1]
    c = 0
    r = 0
    gg = 0.0
    for d in range(n_d):
        cum_c[d] = c
        cum_r[d] = r
        cum_g[d] = gg
        c += count[q, d]
        r += nrel[q, d]
        gg += gsum[q, d]
    nk = ks.shape[0]
    kmax = 0
    for kk in range(nk):
        kmax = max(kmax, ks[kk])
    ap_all = 0.0
    for jj in range(nbuf):
        j = off + jj
        d = buf_d[j]
        rank = cum_c[d] + buf_p[j] + 1
        relc = cum_r[d] + buf_rp[j] + 1
        g = buf_g[j] if graded else 1.0
        prec = relc / rank
        ap_all += prec
        if rank > kmax:
            continue
        for kk in range(nk):
            if rank <= ks[kk]:
                base = 1 + RANKED_FIELDS * kk
                ranked[q, base] += prec
                ranked[q, base + 1] += 1.0
                ranked[q, base + 2] += (2.0 ** g - 1.0) / math.log2(rank + 1.0)
                gp = buf_gp[j] if graded else float(buf_rp[j])
                ranked[q, base + 3] += (cum_g[d] + gp + g) / rank
    ranked[q, 0] = ap_all


@pjit
def _histogram_batch(xq, xb, mode, qlab, blab, indptr, indices, data, graded, count, nrel, gsum,
                     gexp, levels, want_ranked, ks, ranked, n_threads, want_codes, first_size,
                     ncodes, maxb, blocks, caps, buf_size, chunk):
    """Parallel over query blocks: thread t takes blocks t, t + n_threads, ...; a block of
    queries walks the database chunk by chunk, so each chunk is read from memory once per
    block instead of once per query."""
    nb = xb.shape[0]
    n_d = count.shape[1]
    n_blocks = blocks.shape[0] - 1
    for t in prange(n_threads):
        buf_d = np.empty(buf_size, dtype=np.int32)
        buf_p = np.empty(buf_size, dtype=np.int32)
        buf_rp = np.empty(buf_size, dtype=np.int32)
        buf_gp = np.empty(buf_size if graded else 1, dtype=np.float64)
        buf_g = np.empty(buf_size if graded else 1, dtype=np.float64)
        cum_c = np.empty(n_d, dtype=np.int64)
        cum_r = np.empty(n_d, dtype=np.int64)
        cum_g = np.empty(n_d, dtype=np.float64)
        max_b = 1
        for b in range(n_blocks):
            max_b = max(max_b, blocks[b + 1] - blocks[b])
        nbufs = np.zeros(max_b, dtype=np.int64)
        ptrs = np.zeros(max_b, dtype=np.int64)
        offs = np.zeros(max_b + 1, dtype=np.int64)
        for b in range(t, n_blocks, n_threads):
            q0 = blocks[b]
            nqb = blocks[b + 1] - q0
            for j in range(nqb):
                nbufs[j] = 0
                ptrs[j] = indptr[q0 + j] if mode == 2 else 0
                offs[j + 1] = offs[j] + caps[q0 + j]
            for i0 in range(0, nb, chunk):
                i1 = min(nb, i0 + chunk)
                for j in range(nqb):
                    nbufs[j], ptrs[j] = _histogram_range(
                        q0 + j, i0, i1, nbufs[j], ptrs[j], offs[j], xq, xb, mode, qlab, blab,
                        indptr, indices, data, graded, count, nrel, gsum, gexp, levels, want_ranked,
                        buf_d, buf_p, buf_rp, buf_gp, buf_g, want_codes, first_size, ncodes,
                        maxb)
            if want_ranked:
                for j in range(nqb):
                    _finish_ranked(q0 + j, offs[j], nbufs[j], count, nrel, gsum, ks, ranked,
                                   buf_d, buf_p, buf_rp, buf_gp, buf_g, cum_c, cum_r, cum_g,
                                   graded)


@njit
def _code_query(q, xq, ucodes, ucounts, ncodes, maxb):
    n_w = ucodes.shape[1]
    for u in range(ucodes.shape[0]):
        if n_w == 1:
            d = popcount64(xq[q, 0] ^ ucodes[u, 0])
        else:
            d = 0
            for w in range(n_w):
                d += popcount64(xq[q, w] ^ ucodes[u, w])
        ncodes[q, d] += 1
        if ucounts[u] > maxb[q, d]:
            maxb[q, d] = ucounts[u]


@pjit
def _code_batch(xq, ucodes, ucounts, ncodes, maxb):
    for q in prange(xq.shape[0]):
        _code_query(q, xq, ucodes, ucounts, ncodes, maxb)


@njit
def _discount_table(n):
    """``table[i] = sum_{j=1..i} 1 / log2(j + 1)``, i = 0..n."""
    out = np.zeros(n + 1)
    s = 0.0
    for j in range(1, n + 1):
        s += 1.0 / math.log2(j + 1.0)
        out[j] = s
    return out


@njit
def _idcg_levels(levels, ks, disc):
    nq, n_levels = levels.shape
    out = np.zeros((nq, ks.shape[0]))
    for q in range(nq):
        for kk in range(ks.shape[0]):
            k = ks[kk]
            pos = 0
            s = 0.0
            for v in range(n_levels - 1, 0, -1):
                if pos >= k:
                    break
                hi = min(k, pos + levels[q, v])
                s += (2.0 ** v - 1.0) * (disc[hi] - disc[pos])
                pos = hi
            out[q, kk] = s
    return out


@njit
def _idcg_csr(indptr, data, ks, disc, graded):
    nq = indptr.shape[0] - 1
    out = np.zeros((nq, ks.shape[0]))
    for q in range(nq):
        row = data[indptr[q]:indptr[q + 1]]
        g = -np.sort(-row) if graded else np.ones(row.shape[0])
        for kk in range(ks.shape[0]):
            s = 0.0
            for j in range(min(ks[kk], g.shape[0])):
                s += (2.0 ** g[j] - 1.0) / math.log2(j + 2.0)
            out[q, kk] = s
    return out


@dataclass
class Histograms:
    """Per-query distance histograms (rows = queries, columns = distance 0..Q).

    ``ranked`` (present when computed with ``as_ranked=True``): column 0 is the sum over relevant
    items of the precision at their rank in the (distance, db index) order; then for each cut-off
    ``ks[j]`` four columns: AP numerator within the top k, relevant items in the top k, DCG@k
    (gain ``2^g - 1``, discount ``1/log2(rank + 1)``) and the weighted-AP numerator
    ``sum_{rank<=k, g>0} ACG@rank``. ``idcg[:, j]`` is the ideal DCG@ks[j]. ``code_count`` and
    ``code_max`` (present with ``code_stats=True``): distinct occupied codes and largest bucket
    at each distance.
    """

    bits: int
    n_db: int
    graded: bool
    count: np.ndarray
    relevant: np.ndarray
    gain: np.ndarray
    gain_exp: np.ndarray
    ks: np.ndarray
    idcg: np.ndarray
    ranked: np.ndarray | None = None
    code_count: np.ndarray | None = None
    code_max: np.ndarray | None = None

    @property
    def n_queries(self) -> int:
        return self.count.shape[0]

    @property
    def n_relevant(self) -> np.ndarray:
        return self.relevant.sum(axis=1)


def _check_ks(ks) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(ks if ks is not None else [], dtype=np.int64))
    if arr.ndim != 1 or (arr.size and arr.min() < 1):
        raise ValueError(f"k cut-offs must be integers >= 1, got {list(np.atleast_1d(ks))}")
    return arr


def prepare_codes(db_codes, query_codes,
                  bits: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Both code sets as uint64 words, checking they have the same number of bits."""
    if bits is None:
        qb = np.asarray(db_codes).shape[-1] if not isinstance(db_codes, np.ndarray) or \
            db_codes.dtype != np.uint64 else None
        qq = np.asarray(query_codes).shape[-1] if not isinstance(query_codes, np.ndarray) or \
            query_codes.dtype != np.uint64 else None
        if qb is not None and qq is not None and qb != qq:
            raise ValueError(f"db codes have {qb} bits but query codes have {qq} "
                             "(Q must match)")
        bits = qb if qb is not None else qq
        if bits is None:
            raise ValueError("uint64 words need an explicit bits")
    xb = as_words(db_codes, bits)
    xq = as_words(query_codes, bits)
    return xb, xq, int(bits)


def hamming_histograms(db_codes, query_codes, relevance: Relevance, *, bits: int | None = None,
                       ks=(10, 100, 1000), graded: bool = False, as_ranked: bool = True,
                       code_stats: bool = True, n_threads: int | None = None) -> Histograms:
    """One pass over (queries x database) giving per query and distance d = 0..Q the number of
    items, of relevant items and the sums of gains (see the module docstring).

    ``db_codes``/``query_codes``: anything :func:`bucketsearch.index.codes.as_words` accepts ((n, Q)
    {0,1} or
    {-1,+1} arrays; uint64 words with ``bits``). ``graded``: gains are the number of shared labels
    (multi-hot) or the matrix values (explicit relevance); otherwise 1 for every relevant item.
    ``as_ranked``: also accumulate the as-ranked sums for the cut-offs ``ks`` (ties broken by
    (distance, db index)). ``code_stats``: also run the distinct-code histogram (mLGAP,
    empty buckets).
    """
    xb, xq, bits = prepare_codes(db_codes, query_codes, bits)
    nq, nb = len(xq), len(xb)
    if relevance.n_queries != nq:
        raise ValueError(f"relevance covers {relevance.n_queries} queries but there are {nq} "
                         "query codes (query labels of the wrong length?)")
    if relevance.n_db != nb:
        raise ValueError(f"relevance covers {relevance.n_db} db items but there are {nb} db codes "
                         "(db labels of the wrong length?)")
    ks = _check_ks(ks)
    n_d = bits + 1
    count = np.zeros((nq, n_d), dtype=np.int64)
    nrel = np.zeros((nq, n_d), dtype=np.int64)
    gsum = np.zeros((nq, n_d))
    gexp = np.zeros((nq, n_d))
    mode = relevance.mode_id
    if mode == 2:
        levels = np.zeros((nq, 1), dtype=np.int64)
    else:
        levels = np.zeros((nq, (relevance.max_level if graded else 1) + 1), dtype=np.int64)
    qlab = relevance.query_labels.reshape(nq, -1) if mode != 2 else np.zeros((1, 1), np.int64)
    blab = relevance.db_labels.reshape(nb, -1) if mode != 2 else np.zeros((1, 1), np.int64)
    if mode == 1:
        qlab = np.ascontiguousarray(qlab, dtype=np.uint64)
        blab = np.ascontiguousarray(blab, dtype=np.uint64)
    else:
        # class ids: the narrowest integer type that holds them (less memory traffic)
        lo = min(qlab.min(initial=0), blab.min(initial=0))
        hi = max(qlab.max(initial=0), blab.max(initial=0))
        dtype = np.int16 if -2**15 <= lo and hi < 2**15 else \
            np.int32 if -2**31 <= lo and hi < 2**31 else np.int64
        qlab = np.ascontiguousarray(qlab, dtype=dtype)
        blab = np.ascontiguousarray(blab, dtype=dtype)
    ranked = np.zeros((nq, 1 + RANKED_FIELDS * len(ks)))
    threads = int(n_threads or numba.get_num_threads())
    ncodes = np.zeros((nq, n_d), dtype=np.int64)
    maxb = np.zeros((nq, n_d), dtype=np.int64)
    first_size = first_of_code(xb) if code_stats else np.zeros(1, dtype=np.int32)
    if nq and nb:
        caps = _buffer_capacities(relevance, qlab, blab) if as_ranked \
            else np.zeros(nq, dtype=np.int64)
        blocks, buf_size = _query_blocks(caps, nb)
        _histogram_batch(xq, xb, mode, qlab, blab, relevance.indptr, relevance.indices,
                         relevance.data, bool(graded), count, nrel, gsum, gexp, levels,
                         bool(as_ranked), ks, ranked, max(1, min(threads, len(blocks) - 1)),
                         bool(code_stats), first_size, ncodes, maxb, blocks, caps, buf_size,
                         CHUNK)
    disc = _discount_table(int(min(ks.max(), nb)) if ks.size else 0)
    kcap = np.minimum(ks, nb)
    if mode == 2:
        idcg = _idcg_csr(relevance.indptr, relevance.data, kcap, disc, bool(graded))
    else:
        idcg = _idcg_levels(levels, kcap, disc)
    hist = Histograms(bits, nb, bool(graded), count, nrel, gsum, gexp, ks, idcg,
                      ranked if as_ranked else None)
    if code_stats:
        hist.code_count = count - ncodes
        hist.code_max = np.maximum(maxb, (count > 0).astype(np.int64))
    return hist


#: db items per chunk (a chunk of codes, labels and bucket sizes stays in L2 for a query block)
CHUNK = 4096
#: queries per block, and the as-ranked buffer entries a block may hold
BLOCK_QUERIES = 16
BLOCK_BUFFER = 1 << 21


def _buffer_capacities(rel: Relevance, qlab: np.ndarray, blab: np.ndarray) -> np.ndarray:
    """Upper bound of each query's relevant items (the size of its as-ranked buffer)."""
    nq = rel.n_queries
    if rel.mode == "class":
        classes, counts = np.unique(blab[:, 0], return_counts=True)
        pos = np.searchsorted(classes, qlab[:, 0])
        pos = np.minimum(pos, len(classes) - 1)
        return np.where(classes[pos] == qlab[:, 0], counts[pos], 0).astype(np.int64)
    if rel.mode == "csr":
        return np.diff(rel.indptr).astype(np.int64)
    return np.full(nq, rel.n_db, dtype=np.int64)


def _query_blocks(caps: np.ndarray, nb: int) -> tuple[np.ndarray, int]:
    """Consecutive query blocks of at most BLOCK_QUERIES queries whose buffers fit in
    max(BLOCK_BUFFER, nb) entries; returns the block boundaries and the largest block buffer."""
    budget = max(BLOCK_BUFFER, nb)
    bounds = [0]
    total = 0
    largest = 1
    for q, c in enumerate(caps.tolist()):
        if q > bounds[-1] and (q - bounds[-1] >= BLOCK_QUERIES or total + c > budget):
            bounds.append(q)
            total = 0
        total += c
        largest = max(largest, total)
    bounds.append(len(caps))
    return np.array(bounds, dtype=np.int64), int(largest)


def first_of_code(xb: np.ndarray) -> np.ndarray:
    """Per db item: the number of items sharing its code if it is the first (lowest index) of
    them, else 0. Lets the histogram pass count distinct codes and the largest bucket per
    distance without a second pass."""
    if xb.shape[1] == 1:
        _, first, counts = np.unique(xb[:, 0], return_index=True, return_counts=True)
    else:
        _, first, counts = np.unique(xb, axis=0, return_index=True, return_counts=True)
    out = np.zeros(len(xb), dtype=np.int32)
    out[first] = counts
    return out


def distinct_codes(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct database codes (rows of words) and how many items each holds."""
    if xb.shape[1] == 1:
        u, c = np.unique(xb[:, 0], return_counts=True)
        return np.ascontiguousarray(u[:, None]), c.astype(np.int64)
    u, c = np.unique(xb, axis=0, return_counts=True)
    return np.ascontiguousarray(u), c.astype(np.int64)


def code_histograms(xb: np.ndarray, xq: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query and distance d: the number of distinct occupied db codes at distance d and the
    largest number of items on one of them (0 when none)."""
    ucodes, ucounts = distinct_codes(xb)
    ncodes = np.zeros((len(xq), bits + 1), dtype=np.int64)
    maxb = np.zeros((len(xq), bits + 1), dtype=np.int64)
    if len(xq) and len(ucodes):
        _code_batch(xq, ucodes, ucounts, ncodes, maxb)
    return ncodes, maxb
