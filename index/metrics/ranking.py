"""Hamming-ranking metrics from the distance histograms: tie-aware, best, worst, as-ranked.

Ranking the database by Hamming distance leaves ties: the ``t_d`` items at distance d can come
in any order. Per query, with the groups d = 0, 1, ... in turn, ``N`` items and ``R`` relevant
items before group d, ``t = t_d`` items and ``r = r_d`` relevant ones in it, and ``m`` of its
positions inside the cut-off k (``m = min(t, k - N)``):

* **tie-aware** (McSherry & Najork, "Computing information retrieval performance measures
  efficiently in the presence of tied scores", ECIR 2008; He et al., "Hashing as tie-aware
  learning to rank", CVPR 2018): the expectation over all orderings inside the ties, each equally
  likely. The expected sum of precisions at the relevant items of the group's first m positions is
  ``(r/t) * [ (R+1) * S1 + (r-1)/(t-1) * S2 ]``, ``S1 = sum_{j=1..m} 1/(N+j)``,
  ``S2 = sum_{j=1..m} (j-1)/(N+j)`` (position j holds a relevant item with probability r/t, and
  then (j-1)(r-1)/(t-1) relevant items precede it in the group in expectation). Harmonic sums
  are evaluated in O(1) (direct terms below 64, asymptotic expansion of H(b) - H(a) above).
  Expected relevant items in the top k: ``R + m r / t``; expected DCG@k:
  ``sum_d (gexp_d / t) * sum_{i=N+1..N+m} 1/log2(i+1)``.
  AP@k with ``ap_denominator="relevant-in-topk"`` is a ratio of random quantities; it is computed
  exactly: the relevant count X drawn by the cut group is hypergeometric, and
  ``E[num / (R+X)] = E[num_full] E[1/(R+X)] + sum_x P(X=x) E[num_cut | x] / (R+x)``.
  The same sums with gains give the tie-aware weighted AP: with ``G`` the gain before the group
  and ``gbar = S_d / r`` the mean gain of its relevant items, the expected sum of ``ACG@rank``
  at the relevant positions is ``(r/t) [ (G + gbar) S1 + gbar (r-1)/(t-1) S2 ]`` (binary gains:
  G = R, gbar = 1, the AP numerator above), divided by the relevant items in the top k exactly
  as AP@k with ``relevant-in-topk``.
  Reciprocal rank (seed 001: ``RR = 1 / rank of the first relevant item``, 0 when none is in
  the top k): if the first relevant items are r of the t items of group d, the first of them
  is at group position j with probability ``C(t-j, r-1) / C(t, r)``, so
  ``E[RR@k] = sum_{j <= m} C(t-j, r-1) / C(t, r) / (N + j)``.
* **best** case: relevant items first inside every tie; **worst** case: relevant items last.
* **as-ranked**: ties broken by (distance, db index), from the sums the histogram kernel
  accumulated (:class:`bucketsearch.index.metrics.histogram.Histograms` ``ranked``).

Definitions (``kc = min(k, nb)``, ``REL`` = relevant items of the query):
``P@k = relk / kc``, ``R@k = relk / REL``, ``F1@k = 2 relk / (kc + REL)`` (linear in relk, so
its tie-aware value is exact), ``AP@k = sum_{rank<=k, relevant} P@rank / denominator``,
``NDCG@k = DCG@k / IDCG@k`` with gain ``2^g - 1`` and discount ``1/log2(rank + 1)``,
``ACG@k = sum_{rank<=k} g / kc`` and the weighted AP of Zhao et al. (DSRH, CVPR 2015)
``mAP_w@k = sum_{rank<=k, g>0} ACG@rank / relk`` (tie-aware and as-ranked), ``RR@k`` (tie-aware,
best, worst; MRR is its mean over queries). MAP@all is AP@nb (both denominators agree).
Queries with no relevant item follow ``no_relevant``; a zero denominator (no relevant item in
the top k, IDCG = 0) gives 0.
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from bucketsearch.index._jit import njit, pjit
from bucketsearch.index.metrics.conventions import (DEFAULT, Conventions, apply_no_relevant,
                                                    mean_over_queries)
from bucketsearch.index.metrics.histogram import RANKED_FIELDS, Histograms, _discount_table

_DIRECT = 64

#: per-query outputs of the tie-aware kernel (third axis of ``out``)
#: reciprocal rank and weighted AP outputs, named as the metrics
RR_FIELDS = ("mrr_tie_aware", "mrr_best", "mrr_worst", "wmap_tie_aware")
FIELDS = ("ta_num", "ta_ap_topk", "best_num", "best_relk", "worst_num", "worst_relk", "relk",
          "dcg", "gain") + RR_FIELDS


@njit
def _hdiff(a, b):
    """``sum_{j=a+1..b} 1/j`` for integers 0 <= a <= b, to about machine precision."""
    if b <= a:
        return 0.0
    s = 0.0
    j = a + 1
    while j <= b and j <= _DIRECT:
        s += 1.0 / j
        j += 1
    if j > b:
        return s
    x = float(j - 1)
    y = float(b)
    s += math.log1p((y - x) / x)
    s += 0.5 / y - 0.5 / x
    s -= 1.0 / (12.0 * y * y) - 1.0 / (12.0 * x * x)
    s += 1.0 / (120.0 * y ** 4) - 1.0 / (120.0 * x ** 4)
    s -= 1.0 / (252.0 * y ** 6) - 1.0 / (252.0 * x ** 6)
    return s


@njit
def _sum_ratio(a, n0, m):
    """``sum_{j=1..m} (a + j) / (n0 + j)`` (a <= n0)."""
    if m <= 0:
        return 0.0
    if m <= _DIRECT:
        s = 0.0
        for j in range(1, m + 1):
            s += (a + j) / (n0 + j)
        return s
    return m - (n0 - a) * _hdiff(n0, n0 + m)


@njit
def _log_comb(n, k):
    return math.lgamma(n + 1.0) - math.lgamma(k + 1.0) - math.lgamma(n - k + 1.0)


@njit
def _hsum(n0, m):
    """``sum_{j=1..m} 1/(n0 + j)``."""
    if m <= _DIRECT:
        s = 0.0
        for j in range(1, m + 1):
            s += 1.0 / (n0 + j)
        return s
    return _hdiff(n0, n0 + m)


@njit
def _group_num(n0, lead, gbar, t, r, m):
    """Expected ``sum_{j<=m, relevant} (lead-in + gains up to j in the group) / (n0 + j)`` over
    the first m positions of a tie group (t items, r relevant of mean gain ``gbar``), ``lead`` =
    the gain before the group plus ``gbar``. Binary gains (lead = R + 1, gbar = 1): the expected
    sum of precisions at the relevant items (AP numerator); graded: the weighted-AP numerator
    ``sum ACG@rank`` (position j is relevant with probability r/t; then the other items before
    it in the group carry ``gbar (j-1)(r-1)/(t-1)`` of gain in expectation)."""
    if r == 0 or m == 0:
        return 0.0
    val = lead * _hsum(n0, m)
    if t > 1:
        val += gbar * (r - 1.0) / (t - 1.0) * _sum_ratio(-1, n0, m)
    return r / t * val


@njit
def _tie_num(n0, r0, t, r, m):
    """Expected sum of precisions at relevant items in the first m positions of a tie group."""
    return _group_num(n0, r0 + 1.0, 1.0, t, r, m)


@njit
def _cut_ratio(full, n0, r0, lead, gbar, t, r, m):
    """Exact ``E[(full + num_cut) / (r0 + X)]`` for the group cut by k: X (relevant items among
    its first m positions) is hypergeometric; given X = x those positions are a random group of
    m items with x relevant (mean gain gbar), so ``E[num_cut | x] = (x/m) (lead S1 +
    gbar (x-1)/(m-1) S2)`` (module docstring)."""
    s1 = _hsum(n0, m)
    s2 = _sum_ratio(-1, n0, m)
    x_lo = max(0, m - (t - r))
    x_hi = min(r, m)
    base = _log_comb(t, m)
    inv_e = 0.0
    cut_e = 0.0
    for x in range(x_lo, x_hi + 1):
        if r0 + x == 0:
            continue
        if x_lo == x_hi:
            p = 1.0
        else:
            p = math.exp(_log_comb(r, x) + _log_comb(t - r, m - x) - base)
        num = 0.0
        if x > 0:
            num = lead * s1
            if m > 1:
                num += gbar * (x - 1.0) / (m - 1.0) * s2
            num *= x / m
        inv_e += p / (r0 + x)
        cut_e += p * num / (r0 + x)
    return full * inv_e + cut_e


@njit
def _first_relevant(n0, t, r, k):
    """Tie-aware, best and worst reciprocal rank when the first relevant items sit in a tie
    group of t items (r relevant, r > 0) after n0 items, cut-off k (0 past k). The first
    relevant position J in the group has ``P(J = j) = C(t-j, r-1) / C(t, r)``: ``P(1) = r/t``,
    ``P(j+1) = P(j) (t-j-r+1)/(t-j)``."""
    m = min(t, k - n0)
    if m <= 0:
        return 0.0, 0.0, 0.0
    expect = 0.0
    p = r / t
    for j in range(1, min(m, t - r + 1) + 1):
        expect += p / (n0 + j)
        p *= (t - j - r + 1.0) / (t - j) if t > j else 0.0
    worst = 1.0 / (n0 + t - r + 1.0) if t - r + 1 <= m else 0.0
    return expect, 1.0 / (n0 + 1.0), worst


@njit
def _ranking_query(count, nrel, gexp, gsum, ks, disc, out):
    """Tie-aware / best / worst quantities of one query for every cut-off (see module doc)."""
    n_d = count.shape[0]
    total_rel = 0
    for d in range(n_d):
        total_rel += nrel[d]
    for kk in range(ks.shape[0]):
        k = ks[kk]
        n0 = 0
        r0 = 0
        ta_full = 0.0
        best = 0.0
        worst = 0.0
        best_relk = 0
        worst_relk = 0
        relk = 0.0
        dcg = 0.0
        gain = 0.0
        ap_topk = 0.0
        cut_seen = False
        g0 = 0.0
        w_full = 0.0
        wmap = 0.0
        rr_done = False
        for d in range(n_d):
            t = count[d]
            if t == 0:
                continue
            if n0 >= k:
                break
            r = nrel[d]
            m = min(t, k - n0)
            # best: relevant first
            b = min(r, m)
            best += _sum_ratio(r0, n0, b)
            best_relk += b
            # worst: relevant last (positions t-r+1..t)
            w = max(0, m - (t - r))
            worst += _sum_ratio(r0, n0 + t - r, w)
            worst_relk += w
            relk += m * r / t
            gain += gsum[d] * m / t
            dcg += gexp[d] / t * (disc[n0 + m] - disc[n0])
            if r > 0 and not rr_done:
                out[kk, 9], out[kk, 10], out[kk, 11] = _first_relevant(n0, t, r, k)
                rr_done = True
            gbar = gsum[d] / r if r > 0 else 0.0
            if n0 + t >= k:
                # the cut group: exact E[num / (R + X)] over the hypergeometric X
                ap_topk = _cut_ratio(ta_full, n0, r0, r0 + 1.0, 1.0, t, r, m)
                wmap = _cut_ratio(w_full, n0, r0, g0 + gbar, gbar, t, r, m)
                cut_seen = True
            ta_full += _tie_num(n0, r0, t, r, m)
            w_full += _group_num(n0, g0 + gbar, gbar, t, r, m)
            n0 += t
            r0 += r
            g0 += gsum[d]
        if not cut_seen and r0 > 0:
            ap_topk = ta_full / r0  # k beyond the database: every item is in the top k
            wmap = w_full / r0
        out[kk, 0] = ta_full
        out[kk, 1] = ap_topk
        out[kk, 2] = best
        out[kk, 3] = best_relk
        out[kk, 4] = worst
        out[kk, 5] = worst_relk
        out[kk, 6] = relk
        out[kk, 7] = dcg
        out[kk, 8] = gain
        out[kk, 12] = wmap


@pjit
def _ranking_batch(count, nrel, gexp, gsum, ks, disc, out):
    for q in prange(count.shape[0]):
        _ranking_query(count[q], nrel[q], gexp[q], gsum[q], ks, disc, out[q])


def _div(num, den):
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def ranking_metrics(hist: Histograms, conv: Conventions = DEFAULT) -> dict:
    """Every Hamming-ranking metric at the cut-offs ``hist.ks`` and over the whole ranking
    (module docstring). Returns ``{"per_query": {...}, "mean": {...}, "ks", "n_excluded"}``:
    per-query arrays of shape ``(nq, len(ks))`` (``map_all_*``: ``(nq,)``) and their means over
    queries; ``n_excluded`` counts queries left out under ``no_relevant="exclude"``.

    Keys: ``map_{tie_aware,best,worst,ranked}`` (AP@k with ``conv.ap_denominator``),
    ``map_all_{tie_aware,best,worst,ranked}``, ``precision_tie_aware``, ``recall_tie_aware``,
    ``f1_tie_aware``, ``ndcg_tie_aware``, ``acg_tie_aware``, ``wmap_tie_aware`` (weighted mAP@k,
    graded gains), ``mrr_{tie_aware,best,worst}`` (reciprocal rank of the first relevant item,
    0 past k), ``mrr_all_{tie_aware,best,worst}`` and ``wmap_all_tie_aware`` (whole ranking;
    weighted AP over all relevant items) and, when the histograms carry
    the as-ranked sums, ``precision_ranked``, ``ndcg_ranked``, ``wmap_ranked``, ``map_ranked``,
    ``map_all_ranked``.
    """
    ks = hist.ks
    nb = hist.n_db
    nq = hist.n_queries
    nk = len(ks)
    ks_ext = np.concatenate([ks, [max(nb, 1)]]).astype(np.int64)
    disc = _discount_table(int(min(ks_ext.max(), nb)))
    out = np.zeros((nq, nk + 1, len(FIELDS)))
    if nq and nb:
        _ranking_batch(hist.count, hist.relevant, hist.gain_exp, hist.gain, ks_ext, disc, out)
    rel = hist.n_relevant.astype(np.float64)
    has_rel = rel > 0
    kc = np.minimum(ks, max(nb, 1)).astype(np.float64)[None, :]
    all_rel = conv.ap_denominator == "all-relevant"
    relcol = rel[:, None]
    f = {name: out[:, :nk, i] for i, name in enumerate(FIELDS)}
    whole = {name: out[:, nk, i] for i, name in enumerate(FIELDS)}
    pq = {
        "map_tie_aware": _div(f["ta_num"], relcol) if all_rel else f["ta_ap_topk"],
        "map_best": _div(f["best_num"], relcol if all_rel else f["best_relk"]),
        "map_worst": _div(f["worst_num"], relcol if all_rel else f["worst_relk"]),
        "precision_tie_aware": f["relk"] / kc,
        "recall_tie_aware": _div(f["relk"], relcol),
        "f1_tie_aware": _div(2.0 * f["relk"], kc + relcol),
        "ndcg_tie_aware": _div(f["dcg"], hist.idcg),
        "acg_tie_aware": f["gain"] / kc,
        "map_all_tie_aware": _div(whole["ta_num"], rel),
        "map_all_best": _div(whole["best_num"], rel),
        "map_all_worst": _div(whole["worst_num"], rel),
    }
    for name in RR_FIELDS:
        head, _, tail = name.partition("_")
        pq[name] = f[name]
        pq[f"{head}_all_{tail}"] = whole[name]  # mrr_all_*, wmap_all_tie_aware
    if hist.ranked is not None:
        cols = hist.ranked[:, 1:].reshape(nq, nk, RANKED_FIELDS)
        ap_num, relk, dcg, wap = (cols[:, :, i] for i in range(RANKED_FIELDS))
        pq["map_ranked"] = _div(ap_num, relcol if all_rel else relk)
        pq["precision_ranked"] = relk / kc
        pq["ndcg_ranked"] = _div(dcg, hist.idcg)
        pq["wmap_ranked"] = _div(wap, relk)
        pq["map_all_ranked"] = _div(hist.ranked[:, 0], rel)
    pq = {name: apply_no_relevant(v, has_rel, conv) for name, v in pq.items()}
    mean = {name: mean_over_queries(v) for name, v in pq.items()}
    return {"per_query": pq, "mean": mean, "ks": ks,
            "n_excluded": int((~has_rel).sum()) if conv.no_relevant == "exclude" else 0}
