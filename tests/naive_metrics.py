"""Plain-numpy twins of the metrics kernels: literal formulas, explicit sorting, brute force.

Slow and obviously correct; every test compares :mod:`bucketsearch.index.metrics` with these. Inputs
are the ``(n, Q)`` 0/1 bit arrays and a dense ``(nq, nb)`` gain matrix ``G`` (0 = not relevant).
"""
from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np


def distances(db_bits, q_bits):
    db = np.asarray(db_bits, dtype=np.int64)
    q = np.asarray(q_bits, dtype=np.int64)
    return (q[:, None, :] != db[None, :, :]).sum(axis=2)


def histograms(D, G, bits):
    nq = D.shape[0]
    count = np.zeros((nq, bits + 1), dtype=np.int64)
    rel = np.zeros((nq, bits + 1), dtype=np.int64)
    gain = np.zeros((nq, bits + 1))
    gexp = np.zeros((nq, bits + 1))
    for q in range(nq):
        for i in range(D.shape[1]):
            d = D[q, i]
            count[q, d] += 1
            if G[q, i] > 0:
                rel[q, d] += 1
                gain[q, d] += G[q, i]
                gexp[q, d] += 2.0 ** G[q, i] - 1
    return count, rel, gain, gexp


def precision_recall_radius(D, G, r, empty_precision=0.0):
    """Per-query (precision, recall) at radius r (d <= r), recall NaN without relevant items."""
    p, rc = [], []
    for q in range(D.shape[0]):
        ball = D[q] <= r
        rel = G[q] > 0
        n = ball.sum()
        tp = (ball & rel).sum()
        p.append(tp / n if n else empty_precision)
        rc.append(tp / rel.sum() if rel.sum() else np.nan)
    return np.array(p), np.array(rc)


def micro_precision_recall(D, G, r, empty_precision=0.0):
    n = (D <= r).sum()
    tp = ((D <= r) & (G > 0)).sum()
    total = (G > 0).sum()
    return (tp / n if n else empty_precision), (tp / total if total else np.nan)


def raap(precisions, bits):
    """RAAP(R) for R = 0..len-1 from per-radius precisions, literal formula with math.comb."""
    out = []
    for big_r in range(len(precisions)):
        s = 0.0
        for r in range(big_r + 1):
            s += precisions[r] / sum(math.comb(bits, i) for i in range(r + 1))
        out.append(s / (big_r + 1))
    return np.array(out)


def lgap(db_bits, q_bits, G, r_max, empty_precision=0.0, denominator="all-codes"):
    """LGAP(q, r) literal: per ball, count items per code with a Counter; B = largest bin x
    (every code of the ball, sum_{i<=k} C(Q, i), or the occupied ones)."""
    bits = np.asarray(db_bits).shape[1]
    db = [tuple(row) for row in np.asarray(db_bits)]
    D = distances(db_bits, q_bits)
    out = np.zeros((len(q_bits), r_max + 1))
    for q in range(len(q_bits)):
        terms = []
        for k in range(r_max + 1):
            ball = np.flatnonzero(D[q] <= k)
            if len(ball) == 0:
                terms.append(empty_precision * 1.0)
                continue
            prec = (G[q, ball] > 0).sum() / len(ball)
            per_code = Counter(db[i] for i in ball)
            codes = len(per_code) if denominator == "occupied-codes" else \
                sum(math.comb(bits, i) for i in range(k + 1))
            phi = len(ball) / (max(per_code.values()) * codes)
            terms.append(prec * phi)
        out[q] = np.cumsum(terms) / np.arange(1, r_max + 2)
    return out


def ranked_metrics(order, g, k, total_rel, ideal):
    """Metrics of one explicit ranking ``order`` (db indices) with gains ``g``.

    Returns AP@k (all-relevant denominator), AP@k (relevant-in-top-k denominator), relevant in
    top k, DCG@k/IDCG@k, weighted AP@k, reciprocal rank of the first relevant item (0 if none
    in the top k)."""
    kc = min(k, len(order))
    rr = next((1.0 / (pos + 1) for pos in range(kc) if g[order[pos]] > 0), 0.0)
    hits = 0
    ap = 0.0
    dcg = 0.0
    cum_gain = 0.0
    wap = 0.0
    for pos in range(kc):
        gi = g[order[pos]]
        cum_gain += gi
        if gi > 0:
            hits += 1
            ap += hits / (pos + 1)
            wap += cum_gain / (pos + 1)
        dcg += (2.0 ** gi - 1) / math.log2(pos + 2)
    idcg = sum((2.0 ** v - 1) / math.log2(i + 2) for i, v in enumerate(ideal[:kc]))
    return dict(ap_all=ap / total_rel if total_rel else 0.0, ap_topk=ap / hits if hits else 0.0,
                relk=hits, ndcg=dcg / idcg if idcg > 0 else 0.0,
                wap=wap / hits if hits else 0.0, precision=hits / kc,
                recall=hits / total_rel if total_rel else 0.0,
                f1=2 * hits / (kc + total_rel) if total_rel else 0.0, acg=cum_gain / kc, rr=rr)


def as_ranked(D, G, q, k):
    """Ranking by (distance, db index)."""
    order = np.lexsort((np.arange(D.shape[1]), D[q]))
    g = G[q]
    return ranked_metrics(order, g, k, int((g > 0).sum()), sorted(g, reverse=True))


def best_worst(D, G, q, k, worst=False):
    """Relevant items first (best) or last (worst) inside every tie, then db index."""
    rel = (G[q] > 0).astype(int)
    order = np.lexsort((np.arange(D.shape[1]), rel if worst else -rel, D[q]))
    g = G[q]
    return ranked_metrics(order, g, k, int((g > 0).sum()), sorted(g, reverse=True))


def tie_orderings(dist_row):
    """Every ranking consistent with the distances (all permutations inside each tie)."""
    groups = [np.flatnonzero(dist_row == d).tolist() for d in sorted(set(dist_row.tolist()))]
    for perms in itertools.product(*[itertools.permutations(gr) for gr in groups]):
        yield [i for p in perms for i in p]


def tie_average(D, G, q, k):
    """The mean of each metric over all orderings inside ties (brute force, tiny inputs)."""
    g = G[q]
    ideal = sorted(g, reverse=True)
    total = int((g > 0).sum())
    acc = Counter()
    n = 0
    for order in tie_orderings(D[q]):
        for key, val in ranked_metrics(order, g, k, total, ideal).items():
            acc[key] += val
        n += 1
    return {key: val / n for key, val in acc.items()}


def tie_aware_ap_all(D, G, q):
    """Tie-aware AP over the whole ranking by the literal per-position formula of McSherry &
    Najork: position j of a tie group (t items, r relevant, N items and R relevant before) holds
    a relevant item with probability r/t, preceded in its group by (j-1)(r-1)/(t-1) relevant
    items in expectation. O(nb) loop, no closed-form harmonic sums."""
    rel = G[q] > 0
    total = rel.sum()
    if total == 0:
        return 0.0
    n0 = r0 = 0
    s = 0.0
    for d in sorted(set(D[q].tolist())):
        members = D[q] == d
        t = int(members.sum())
        r = int((members & rel).sum())
        for j in range(1, t + 1):
            inside = (j - 1) * (r - 1) / (t - 1) if t > 1 else 0.0
            s += r / t * (r0 + 1 + inside) / (n0 + j)
        n0 += t
        r0 += r
    return s / total


def ramap_naive(D, G, bits, r_max, empty_precision=0.0):
    out = []
    for q in range(D.shape[0]):
        precs = [precision_recall_radius(D[q:q + 1], G[q:q + 1], r, empty_precision)[0][0]
                 for r in range(r_max + 1)]
        out.append(raap(precs, bits))
    return np.array(out)


def auprc_thesis(D, G, bits, empty_precision=0.0):
    """Thesis chapter 3: micro P and R at every radius 1..Q, plain trapezoid over recall."""
    pts = [micro_precision_recall(D, G, r, empty_precision) for r in range(1, bits + 1)]
    area = 0.0
    for (p0, r0), (p1, r1) in zip(pts, pts[1:]):
        area += (r1 - r0) * (p0 + p1) / 2
    return area


def tie_aware_rr(D, G, q, k):
    """Tie-aware reciprocal rank@k by the literal formula: the first group holding relevant
    items (t items, r relevant, N before) puts its first relevant item at position j with
    probability C(t-j, r-1) / C(t, r) (exact integers); 0 past k."""
    rel = G[q] > 0
    n0 = 0
    for d in sorted(set(D[q].tolist())):
        members = D[q] == d
        t, r = int(members.sum()), int((members & rel).sum())
        if r:
            return sum(math.comb(t - j, r - 1) / math.comb(t, r) / (n0 + j)
                       for j in range(1, t - r + 2) if n0 + j <= k)
        n0 += t
    return 0.0


def tie_aware_wap_all(D, G, q):
    """Tie-aware weighted AP over the whole ranking, literal per position: position j of a tie
    group (t items, r relevant with gain sum S, N items and gain Gb before) contributes
    E[rel_j * ACG@(N+j)] = (Gb r/t + S/t + (j-1) S (r-1) / (t (t-1))) / (N + j)."""
    g = G[q]
    total = (g > 0).sum()
    if total == 0:
        return 0.0
    n0, gb, s = 0, 0.0, 0.0
    for d in sorted(set(D[q].tolist())):
        members = D[q] == d
        t = int(members.sum())
        r = int((members & (g > 0)).sum())
        gs = float(g[members].sum())
        for j in range(1, t + 1):
            pair = (j - 1) * gs * (r - 1) / (t * (t - 1)) if t > 1 else 0.0
            s += (gb * r / t + gs / t + pair) / (n0 + j)
        n0 += t
        gb += gs
    return s / total
