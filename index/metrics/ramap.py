"""RAMAP: radius-aware mean average precision (Jiang, Li & Li, "On the Evaluation Metric for
Hashing", arXiv:1905.10951).

``RAAP(q, R) = 1/(R+1) * sum_{r=0..R} P(q, r) / c(r)`` with the modeled cost of searching the
ball of radius r ``c(r) = sum_{i=0..r} C(Q, i)`` (probes, in units of one bucket lookup t0, so
``c(0) = 1``), and ``RAMAP@R`` the mean of ``RAAP(q, R)`` over queries. ``P(q, r)`` is the
precision at radius r with the conventions of :mod:`bucketsearch.index.metrics.conventions` (empty
ball: 0).
Costs are exact Python integers (``math.comb``); only ``1 / c(r)`` is rounded to a float, so
Q = 64 or 256 cannot overflow.

Measured-cost variant: ``measured_cost[r]`` is the measured time to search the ball of radius r
(e.g. the engine's per-radius statistics; cumulative unless ``cumulative=False``, in which case
the per-radius times are summed); it is normalized by ``measured_cost[0]`` so radius 0 costs 1.
"""
from __future__ import annotations

import math

import numpy as np

from bucketsearch.index.metrics.conventions import (DEFAULT, Conventions, apply_no_relevant,
                                                    mean_over_queries)
from bucketsearch.index.metrics.histogram import Histograms
from bucketsearch.index.metrics.radius import precision_at_radius


def ball_probes(bits: int, radius: int) -> int:
    """Exact number of buckets in a Hamming ball: ``sum_{i=0..radius} C(bits, i)``."""
    return sum(math.comb(bits, i) for i in range(min(radius, bits) + 1))


def modeled_costs(bits: int, radius_max: int | None = None) -> list[int]:
    """``[c(0), ..., c(radius_max)]`` as exact ints, ``c(r) = sum_{i<=r} C(bits, i)``."""
    radius_max = bits if radius_max is None else radius_max
    out, total = [], 0
    for r in range(radius_max + 1):
        total += math.comb(bits, r)
        out.append(total)
    return out


def _inverse_costs(bits: int, n_radius: int, measured_cost, cumulative: bool) -> np.ndarray:
    if measured_cost is None:
        return np.array([1.0 / c for c in modeled_costs(bits, n_radius - 1)])
    t = np.asarray(measured_cost, dtype=np.float64)
    if t.ndim != 1 or len(t) < n_radius:
        raise ValueError(f"measured_cost must be 1-D with at least {n_radius} per-radius values "
                         f"(r = 0..{n_radius - 1}), got shape {t.shape}")
    t = t[:n_radius]
    if not cumulative:
        t = np.cumsum(t)
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("measured_cost values must be finite and > 0")
    return t[0] / t


def raap_from_precision(precision: np.ndarray, bits: int, measured_cost=None,
                        cumulative: bool = True) -> np.ndarray:
    """RAAP(q, R) for R = 0..(columns - 1) from per-query precisions ``P(q, r)`` (nq, R+1).

    Example (Jiang, Li & Li, Table 3): Q = 8 and precisions 0.1896, 0.1651, 0.1433, 0.1261 give
    0.1896, 0.1040, 0.0706, 0.0533.
    """
    p = np.atleast_2d(np.asarray(precision, dtype=np.float64))
    inv = _inverse_costs(bits, p.shape[1], measured_cost, cumulative)
    return np.cumsum(p * inv[None, :], axis=1) / np.arange(1, p.shape[1] + 1)[None, :]


def ramap(hist: Histograms, conv: Conventions = DEFAULT, measured_cost=None,
          cumulative: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per-query RAAP ``(nq, Q+1)`` and RAMAP@R (R = 0..Q), modeled or measured cost."""
    prec = precision_at_radius(hist, conv)
    raap = raap_from_precision(prec, hist.bits, measured_cost, cumulative)
    raap = apply_no_relevant(raap, hist.n_relevant > 0, conv)
    return raap, mean_over_queries(raap)
