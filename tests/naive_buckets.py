"""Plain-numpy twins of the hashtable-bucket evaluation: literal retrieved sets and metrics."""
from __future__ import annotations

import numpy as np


def naive_retrieved(db, q, k, n_tables, r):
    """(nq, nb) bool: item shares a segment within distance r with the query in some table."""
    db = np.asarray(db, dtype=np.int64)
    q = np.asarray(q, dtype=np.int64)
    out = np.zeros((len(q), len(db)), dtype=bool)
    for j in range(n_tables):
        seg = slice(j * k, (j + 1) * k)
        d = (q[:, None, seg] != db[None, :, seg]).sum(axis=2)
        out |= d <= r
    return out


def naive_metrics(retrieved, gains, empty_precision=0.0, beta=1.0):
    """Literal macro and micro P, R, F-beta of retrieved sets (queries without relevant items
    kept with value 0, the default convention)."""
    rel = gains > 0
    tp = (retrieved & rel).sum(1).astype(float)
    n = retrieved.sum(1).astype(float)
    n_rel = rel.sum(1).astype(float)
    p = np.where(n > 0, tp / np.maximum(n, 1), empty_precision)
    rc = np.where(n_rel > 0, tp / np.maximum(n_rel, 1), 0.0)
    p = np.where(n_rel > 0, p, 0.0)
    b2 = beta * beta

    def f(pp, rr):
        den = b2 * pp + rr
        return np.where(den > 0, (1 + b2) * pp * rr / np.where(den > 0, den, 1), 0.0)

    pm = tp.sum() / n.sum() if n.sum() > 0 else empty_precision
    rm = tp.sum() / n_rel.sum() if n_rel.sum() > 0 else 0.0
    return {"precision_macro": p.mean(), "recall_macro": rc.mean(),
            "f_beta_macro": f(p, rc).mean(), "precision_micro": pm, "recall_micro": rm,
            "f_beta_micro": float(f(np.array(pm), np.array(rm))), "retrieved_mean": n.mean()}
