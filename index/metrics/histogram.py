"""Per-query Hamming distance histograms: the one pass every metric is computed from.

For query ``q`` and distance ``d = 0..Q`` the kernel counts

* ``count[q, d]``: database items at Hamming distance ``d``;
* ``relevant[q, d]``: relevant items among them (gain ``g > 0``);
* ``gain[q, d]``: the sum of their gains ``g`` (graded: number of shared labels or the
  user's matrix value; binary: 1);
* ``gain_exp[q, d]``: the sum of ``2^g - 1`` (the NDCG gain).

Relevance is read on the fly per (query, item) from compact label arrays
(:mod:`index.relevance`), so nothing of size ``nq x nb`` is ever allocated: memory is
``O(nq * (Q + 1))`` plus ``O(nb)`` per thread for the optional as-ranked pass.

As-ranked metrics need the order (distance, db index). The pass visits items in db index order,
so for every relevant item it knows how many items (and relevant items, and gain) precede it at
the same distance; after the pass, its rank is ``#items at smaller distance + that + 1``. The
kernel reduces these to per-query sums (AP numerators, relevant in the top k, DCG@k, the
weighted-AP numerator) without sorting anything.

A second kernel (:func:`code_histograms`) runs over the *distinct* database codes with their
multiplicities, giving per distance the number of distinct occupied codes and the largest bucket:
what mLGAP and the empty-bucket statistics need.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
from numba import prange

from index._jit import njit, pjit, popcount64
from index.codes import as_words
from index.relevance import Relevance

#: columns of ``ranked`` per cut-off k: AP numerator, relevant in top k, DCG@k, weighted-AP numerator
RANKED_FIELDS = 4


@njit
def _histogram_query(q, xq, xb, mode, qlab, blab, indptr, indices, data, graded, count, nrel,
                     gsum, gexp, levels, want_ranked, ks, ranked, buf_d, buf_p, buf_rp, buf_gp,
                     buf_g, cum_c, cum_r, cum_g):
    nb = xb.shape[0]
    n_w = xb.shape[1]
    lw = qlab.shape[1] if mode == 1 else 0
    ptr = indptr[q] if mode == 2 else 0
    end = indptr[q + 1] if mode == 2 else 0
    nbuf = 0
    n_levels = levels.shape[1]
    for i in range(nb):
        if n_w == 1:
            d = popcount64(xq[q, 0] ^ xb[i, 0])
        else:
            d = 0
            for w in range(n_w):
                d += popcount64(xq[q, w] ^ xb[i, w])
        g = 0.0
        if mode == 0:
            if qlab[q, 0] == blab[i, 0]:
                g = 1.0
        elif mode == 1:
            s = 0
            for w in range(lw):
                s += popcount64(qlab[q, w] & blab[i, w])
            if s > 0:
                g = float(s) if graded else 1.0
        else:
            while ptr < end and indices[ptr] < i:
                ptr += 1
            if ptr < end and indices[ptr] == i:
                g = data[ptr] if graded else 1.0
        if g > 0.0:
            if want_ranked:
                buf_d[nbuf] = d
                buf_p[nbuf] = count[q, d]
                buf_rp[nbuf] = nrel[q, d]
                buf_gp[nbuf] = gsum[q, d]
                buf_g[nbuf] = g
                nbuf += 1
            nrel[q, d] += 1
            gsum[q, d] += g
            gexp[q, d] += 2.0 ** g - 1.0
            if mode != 2 and n_levels > 1:
                levels[q, int(g)] += 1
        count[q, d] += 1
    if not want_ranked:
        return
    # exclusive prefix sums over distance
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
    ap_all = 0.0
    for j in range(nbuf):
        d = buf_d[j]
        rank = cum_c[d] + buf_p[j] + 1
        relc = cum_r[d] + buf_rp[j] + 1
        g = buf_g[j]
        prec = relc / rank
        ap_all += prec
        for kk in range(nk):
            if rank <= ks[kk]:
                base = 1 + RANKED_FIELDS * kk
                ranked[q, base] += prec
                ranked[q, base + 1] += 1.0
                ranked[q, base + 2] += (2.0 ** g - 1.0) / math.log2(rank + 1.0)
                ranked[q, base + 3] += (cum_g[d] + buf_gp[j] + g) / rank
    ranked[q, 0] = ap_all


@pjit
def _histogram_batch(xq, xb, mode, qlab, blab, indptr, indices, data, graded, count, nrel, gsum,
                     gexp, levels, want_ranked, ks, ranked, n_threads):
    nq = xq.shape[0]
    nb = xb.shape[0]
    n_d = count.shape[1]
    size = nb if want_ranked else 1
    for t in prange(n_threads):
        buf_d = np.empty(size, dtype=np.int64)
        buf_p = np.empty(size, dtype=np.int64)
        buf_rp = np.empty(size, dtype=np.int64)
        buf_gp = np.empty(size, dtype=np.float64)
        buf_g = np.empty(size, dtype=np.float64)
        cum_c = np.empty(n_d, dtype=np.int64)
        cum_r = np.empty(n_d, dtype=np.int64)
        cum_g = np.empty(n_d, dtype=np.float64)
        for q in range(t, nq, n_threads):
            _histogram_query(q, xq, xb, mode, qlab, blab, indptr, indices, data, graded, count,
                             nrel, gsum, gexp, levels, want_ranked, ks, ranked, buf_d, buf_p,
                             buf_rp, buf_gp, buf_g, cum_c, cum_r, cum_g)


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


def prepare_codes(db_codes, query_codes, bits: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
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

    ``db_codes``/``query_codes``: anything :func:`index.codes.as_words` accepts ((n, Q) {0,1} or
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
        # class ids as uint64 too, so one kernel signature serves both label modes
        qlab = np.ascontiguousarray(qlab.astype(np.int64).view(np.uint64))
        blab = np.ascontiguousarray(blab.astype(np.int64).view(np.uint64))
    ranked = np.zeros((nq, 1 + RANKED_FIELDS * len(ks)))
    threads = int(n_threads or numba.get_num_threads())
    if nq and nb:
        _histogram_batch(xq, xb, mode, qlab, blab, relevance.indptr, relevance.indices,
                         relevance.data, bool(graded), count, nrel, gsum, gexp, levels,
                         bool(as_ranked), ks, ranked, max(1, min(threads, nq)))
    disc = _discount_table(int(min(ks.max(), nb)) if ks.size else 0)
    kcap = np.minimum(ks, nb)
    if mode == 2:
        idcg = _idcg_csr(relevance.indptr, relevance.data, kcap, disc, bool(graded))
    else:
        idcg = _idcg_levels(levels, kcap, disc)
    hist = Histograms(bits, nb, bool(graded), count, nrel, gsum, gexp, ks, idcg,
                      ranked if as_ranked else None)
    if code_stats:
        hist.code_count, hist.code_max = code_histograms(xb, xq, bits)
    return hist


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
