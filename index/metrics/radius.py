"""Precision, recall and F-beta at every Hamming radius; PR curve over radius; AUPRC.

All from the per-query histograms (:mod:`bucketsearch.index.metrics.histogram`) in O(Q) per query.
With ``N(q, r)`` items and ``TP(q, r)`` relevant items in the Hamming ball of radius r (``d <= r``,
see :mod:`bucketsearch.index.metrics.conventions`) and ``REL(q)`` relevant items in all:

* ``P(q, r) = TP / N`` (``empty_precision`` when N = 0), ``R(q, r) = TP / REL``;
* macro: the mean over queries of ``P(q, r)`` / ``R(q, r)``;
* micro: pooled, ``sum_q TP / sum_q N`` and ``sum_q TP / sum_q REL`` (the pooled precision of
  an all-empty radius is ``empty_precision``);
* ``F_beta = (1 + beta^2) P R / (beta^2 P + R)`` (0 when P = R = 0), per query then averaged
  (macro), or from the micro P and R (micro).

Precision/recall at a Hamming radius is the hash-lookup protocol of e.g. Wang, Kumar & Chang
(SSH) and Jiang, Li & Li; the macro/micro distinction and the empty-ball convention are usually
left implicit.

Two AUPRC forms: :func:`auprc` (this project's default: the macro curve over radius 0..Q plus
one anchor point at recall 0) and :func:`auprc_thesis` (thesis chapter 3, seed 003: the micro,
pooled curve over radius 1..Dmax with the plain trapezoid rule, no point added).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bucketsearch.index.metrics.conventions import (DEFAULT, Conventions, apply_no_relevant,
                                                    mean_over_queries)
from bucketsearch.index.metrics.histogram import Histograms


def ball_cumsum(per_distance: np.ndarray, inclusive: bool = True) -> np.ndarray:
    """``out[:, r]`` = sum over the Hamming ball of radius r (``d <= r``, or ``d < r``)."""
    cum = np.cumsum(per_distance, axis=1)
    if inclusive:
        return cum
    out = np.zeros_like(cum)
    out[:, 1:] = cum[:, :-1]
    return out


@dataclass
class RadiusMetrics:
    """Per-query ``(nq, Q+1)`` arrays and their means (macro) or pooled values (micro)."""

    precision: np.ndarray
    recall: np.ndarray
    f_beta: np.ndarray
    precision_macro: np.ndarray
    recall_macro: np.ndarray
    f_beta_macro: np.ndarray
    precision_micro: np.ndarray
    recall_micro: np.ndarray
    f_beta_micro: np.ndarray
    n_excluded: int


def _f_beta(p, r, beta):
    b2 = beta * beta
    with np.errstate(invalid="ignore", divide="ignore"):
        den = b2 * p + r
        return np.where(den > 0, (1 + b2) * p * r / np.where(den > 0, den, 1.0), 0.0)


def precision_at_radius(hist: Histograms, conv: Conventions = DEFAULT) -> np.ndarray:
    """``P(q, r)`` for r = 0..Q, before the no-relevant convention (empty ball:
    ``empty_precision``)."""
    n = ball_cumsum(hist.count, conv.radius_inclusive)
    tp = ball_cumsum(hist.relevant, conv.radius_inclusive)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, tp / np.maximum(n, 1), float(conv.empty_precision))


def radius_metrics(hist: Histograms, conv: Conventions = DEFAULT) -> RadiusMetrics:
    """Precision, recall and F-beta at every radius r = 0..Q, macro and micro (module docstring)."""
    n = ball_cumsum(hist.count, conv.radius_inclusive)
    tp = ball_cumsum(hist.relevant, conv.radius_inclusive)
    rel = hist.n_relevant
    has_rel = rel > 0
    prec = precision_at_radius(hist, conv)
    with np.errstate(invalid="ignore", divide="ignore"):
        rec = np.where(has_rel[:, None], tp / np.maximum(rel, 1)[:, None], 0.0)
    f = _f_beta(prec, rec, conv.beta)
    prec = apply_no_relevant(prec, has_rel, conv)
    rec = apply_no_relevant(rec, has_rel, conv)
    f = apply_no_relevant(f, has_rel, conv)
    keep = has_rel if conv.no_relevant == "exclude" else np.ones(len(rel), dtype=bool)
    n_sum, tp_sum, rel_sum = n[keep].sum(0), tp[keep].sum(0), rel[keep].sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        p_micro = np.where(n_sum > 0, tp_sum / np.maximum(n_sum, 1), float(conv.empty_precision))
        r_micro = tp_sum / rel_sum if rel_sum > 0 else np.zeros(len(tp_sum))
    return RadiusMetrics(prec, rec, f, mean_over_queries(prec), mean_over_queries(rec),
                         mean_over_queries(f), p_micro, r_micro,
                         _f_beta(p_micro, r_micro, conv.beta),
                         int((~has_rel).sum()) if conv.no_relevant == "exclude" else 0)


def pr_curve(hist: Histograms, conv: Conventions = DEFAULT, average: str = "macro"):
    """PR curve over radius: ``(recall[r], precision[r])`` for r = 0..Q, macro or micro."""
    m = radius_metrics(hist, conv)
    if average == "macro":
        return m.recall_macro, m.precision_macro
    if average == "micro":
        return m.recall_micro, m.precision_micro
    raise ValueError(f"average must be 'macro' or 'micro', got {average!r}")


def auprc(recall: np.ndarray, precision: np.ndarray, anchor: str | None = "first") -> float:
    """Area under the PR curve over radius by the trapezoid rule over recall.

    The points are (recall[r], precision[r]) for r = 0..Q (recall is non-decreasing in r). One
    point is added at recall 0: ``anchor="first"`` uses precision[0] (the curve starts flat),
    ``anchor="one"`` uses precision 1, ``anchor=None`` adds none (the plain trapezoid over the
    given points). NaN points (nothing left after exclusion) are dropped.
    """
    recall = np.asarray(recall, dtype=np.float64)
    precision = np.asarray(precision, dtype=np.float64)
    ok = ~(np.isnan(recall) | np.isnan(precision))
    recall, precision = recall[ok], precision[ok]
    if not len(recall):
        return float("nan")
    if anchor is None:
        x, y = recall, precision
    elif anchor in ("first", "one"):
        p0 = precision[0] if anchor == "first" else 1.0
        x = np.concatenate([[0.0], recall])
        y = np.concatenate([[p0], precision])
    else:
        raise ValueError(f"anchor must be 'first', 'one' or None, got {anchor!r}")
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2.0))


def auprc_thesis(hist: Histograms, conv: Conventions = DEFAULT) -> float:
    """AUPRC as thesis chapter 3 (seed 003) computes it: the micro (pooled) PR curve
    ``(R_micro(r), P_micro(r))`` over the radii r = 1..Dmax (Dmax = Q, the largest Hamming
    distance), integrated by the plain trapezoid rule over recall, no point added at recall 0.
    Radius 0 is not a point of the curve. Q = 1 leaves one point: the area is 0."""
    m = radius_metrics(hist, conv)
    return auprc(m.recall_micro[1:], m.precision_micro[1:], anchor=None)
