"""mLGAP: mean Local Group Average Precision (Ding, Li & Li, "Mean Local Group Average Precision
(mLGAP): A New Performance Metric for Hashing-based Retrieval", arXiv:1811.09763; seed 004).

``LGAP(q, r) = 1/(r+1) * sum_{k=0..r} P(q, k) * phi(S_k)`` where ``S_k`` is the Hamming ball of
radius k around the query, ``P(q, k)`` the precision in it (conventions of
:mod:`bucketsearch.index.metrics.conventions`) and ``phi(S_k) = A / B``: A the number of database
items in ``S_k`` and, as the paper defines it (``denominator="all-codes"``, the default),
``B = (largest bin: most items on one code in S_k) x (number of codes in S_k,
sum_{i<=k} C(Q, i))``. ``phi = 1`` only when every code of the ball holds the same number of
items; one crowded bucket, or a ball of mostly empty codes, drives it towards 0: the collision
and poor code utilization mLGAP exists to penalize. ``mLGAP@r`` is the mean of ``LGAP(q, r)``
over queries.

Worked example of the paper (eqs. 12-15): Q = 4, balls S_0, S_1, S_2 of 1, 6 and 10 items
holding sum_{i<=k} C(4, i) = 1, 5 and 11 codes, largest bin 1, 2, 2, cumulative precisions 1,
4/6, 5/10: ``LGAP@2 = (1 * 1/1 + 4/6 * 6/10 + 5/10 * 10/22) / 3 = 0.5424``.

``denominator="occupied-codes"`` is the earlier variant of this project (B = largest bin x
distinct *occupied* codes of the ball): it is not the paper's metric and gives no penalty when
every item of the ball shares one code; kept only as a named option for old numbers.

Conventions: ``phi`` of an empty ball is 1 (its precision is ``empty_precision``, 0 by default,
so the term is 0); with ``radius_inclusive=False`` the ball ``d < k`` holds
``sum_{i<k} C(Q, i)`` codes. Code counts are exact Python integers (``math.comb``), rounded to
a float once (at most 2^256, far inside the float range), so Q = 256 cannot overflow.

Needs per-code counts in the ball: the histogram pass with ``code_stats=True``
(:func:`bucketsearch.index.metrics.histogram.hamming_histograms`) gives, per distance, the number of
distinct occupied codes and the largest bucket; the ball aggregates them (sum and running max over
d <= k).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index.metrics.conventions import (DEFAULT, Conventions, apply_no_relevant,
                                                    mean_over_queries)
from bucketsearch.index.metrics.histogram import Histograms
from bucketsearch.index.metrics.radius import ball_cumsum, precision_at_radius
from bucketsearch.index.metrics.ramap import modeled_costs

#: what B counts besides the largest bin: every code of the ball (the paper) or the occupied ones
LGAP_DENOMINATORS = ("all-codes", "occupied-codes")


def _codes_in_ball(hist: Histograms, conv: Conventions, denominator: str) -> np.ndarray:
    """The code count of B per query and radius, as floats (exact ints rounded once)."""
    if denominator not in LGAP_DENOMINATORS:
        raise ValueError(f"denominator must be one of {LGAP_DENOMINATORS}, got {denominator!r}")
    if denominator == "occupied-codes":
        return ball_cumsum(hist.code_count, conv.radius_inclusive).astype(np.float64)
    codes = modeled_costs(hist.bits)
    if not conv.radius_inclusive:
        codes = [0] + codes[:-1]
    return np.broadcast_to(np.array([float(c) for c in codes]), hist.count.shape)


def ball_balance(hist: Histograms, conv: Conventions = DEFAULT,
                 denominator: str = "all-codes") -> np.ndarray:
    """``phi(S_r) = A / B`` per query and radius r = 0..Q (1 for an empty ball); see the module
    docstring for ``denominator``."""
    if hist.code_count is None or hist.code_max is None:
        raise ValueError("mLGAP needs histograms computed with code_stats=True")
    codes = _codes_in_ball(hist, conv, denominator)
    items = ball_cumsum(hist.count, conv.radius_inclusive)
    largest = np.maximum.accumulate(hist.code_max, axis=1)
    if not conv.radius_inclusive:
        shifted = np.zeros_like(largest)
        shifted[:, 1:] = largest[:, :-1]
        largest = shifted
    den = largest * codes
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(items > 0, items / np.where(den > 0, den, 1.0), 1.0)


def mlgap(hist: Histograms, conv: Conventions = DEFAULT,
          denominator: str = "all-codes") -> tuple[np.ndarray, np.ndarray]:
    """Per-query ``LGAP(q, r)`` ``(nq, Q+1)`` and ``mLGAP@r`` for r = 0..Q (module docstring)."""
    prec = precision_at_radius(hist, conv)
    phi = ball_balance(hist, conv, denominator)
    lgap = np.cumsum(prec * phi, axis=1) / np.arange(1, prec.shape[1] + 1)[None, :]
    lgap = apply_no_relevant(lgap, hist.n_relevant > 0, conv)
    return lgap, mean_over_queries(lgap)


def lgap_from_balls(precision, items, largest_bin, bits: int) -> np.ndarray:
    """``LGAP@r`` for r = 0..len-1 of one query from its per-ball precisions, item counts and
    largest bins (the paper's worked example is stated this way), with B = largest bin x
    ``sum_{i<=r} C(Q, i)``."""
    p = np.asarray(precision, dtype=np.float64)
    a = np.asarray(items, dtype=np.float64)
    m = np.asarray(largest_bin, dtype=np.float64)
    if not (p.shape == a.shape == m.shape and p.ndim == 1):
        raise ValueError(f"precision, items and largest_bin must be 1-D of one length, got "
                         f"shapes {p.shape}, {a.shape}, {m.shape}")
    codes = np.array([float(c) for c in modeled_costs(bits, len(p) - 1)])
    phi = np.where(a > 0, a / np.where(m > 0, m * codes, 1.0), 1.0)
    return np.cumsum(p * phi) / np.arange(1, len(p) + 1)
