"""mLGAP: mean load-balanced generalized average precision (Ding, Li & Li).

``LGAP(q, r) = 1/(r+1) * sum_{k=0..r} P(q, k) * phi(S_k)`` where ``S_k`` is the Hamming ball of
radius k around the query, ``P(q, k)`` the precision in it (conventions of
:mod:`index.metrics.conventions`) and ``phi(S_k) = A / B``: A the number of database items in
``S_k``, B = (largest number of items on one code in ``S_k``) x (number of distinct occupied
codes in ``S_k``). ``phi = 1`` when the items are spread evenly over the occupied codes and
drops towards ``1 / #codes`` when one bucket holds nearly everything. Convention: ``phi`` of an
empty ball is 1 (its precision is ``empty_precision``, 0 by default, so the term is 0).
``mLGAP@r`` is the mean of ``LGAP(q, r)`` over queries.

Needs per-code counts in the ball: the histogram pass with ``code_stats=True``
(:func:`index.metrics.histogram.hamming_histograms`) gives, per distance, the number of distinct
occupied codes and the largest bucket; the ball aggregates them (sum and running max over
d <= k).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index.metrics.conventions import (DEFAULT, Conventions, apply_no_relevant,
                                                    mean_over_queries)
from bucketsearch.index.metrics.histogram import Histograms
from bucketsearch.index.metrics.radius import ball_cumsum, precision_at_radius


def ball_balance(hist: Histograms, conv: Conventions = DEFAULT) -> np.ndarray:
    """``phi(S_r)`` per query and radius r = 0..Q (1 for an empty ball)."""
    if hist.code_count is None or hist.code_max is None:
        raise ValueError("mLGAP needs histograms computed with code_stats=True")
    items = ball_cumsum(hist.count, conv.radius_inclusive)
    codes = ball_cumsum(hist.code_count, conv.radius_inclusive)
    largest = np.maximum.accumulate(hist.code_max, axis=1)
    if not conv.radius_inclusive:
        shifted = np.zeros_like(largest)
        shifted[:, 1:] = largest[:, :-1]
        largest = shifted
    den = largest * codes
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, items / np.maximum(den, 1), 1.0)


def mlgap(hist: Histograms, conv: Conventions = DEFAULT) -> tuple[np.ndarray, np.ndarray]:
    """Per-query ``LGAP(q, r)`` ``(nq, Q+1)`` and ``mLGAP@r`` for r = 0..Q."""
    prec = precision_at_radius(hist, conv)
    phi = ball_balance(hist, conv)
    lgap = np.cumsum(prec * phi, axis=1) / np.arange(1, prec.shape[1] + 1)[None, :]
    lgap = apply_no_relevant(lgap, hist.n_relevant > 0, conv)
    return lgap, mean_over_queries(lgap)
