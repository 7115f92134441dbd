"""The RAMAP paper's model (Jiang, Li & Li, "On the Evaluation Metric for Hashing"): a radius-R
bucket search costs ``T(R) = t0 * P(R)`` with ``P(R) = sum_{r<=R} C(Q, r)`` probes, ``t0`` the
time of one bucket probe.

``t0`` by the estimator ``radius_fit``: least squares through the origin on samples
``(p_i, t_i)`` (the probes and the measured in-kernel nanoseconds of one query at one radius),
``t0 = sum p_i t_i / sum p_i^2`` (:func:`fit_t0`), with the classical interval
``t0 +- t_{(1+c)/2, n-1} s / sqrt(sum p_i^2)``, ``s^2 = sum (t_i - t0 p_i)^2 / (n - 1)
= (sum t_i^2 - t0 sum p_i t_i) / (n - 1)`` (:func:`radius_fit_from_sums`: four running sums
are enough, so the server keeps the fit over every search since it started).

Goodness of fit: ``R^2 = 1 - SS_res / SS_tot``, ``SS_tot = sum (t_i - mean t)^2`` (centred, also
for the fit through the origin, so a constant predictor scores 0); per radius the relative error
``|mean modeled - mean measured| / mean measured``. Probe counts are exact Python ints
(``math.comb``); they become floats only to multiply a time.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from bucketsearch.index.fits.regression import CONFIDENCE, t_quantile

RADIUS_FIT = "radius_fit"


def paper_probes(bits: int, max_radius: int) -> list[int]:
    """Exact cumulative probes ``P(R) = sum_{r<=R} C(Q, r)`` for ``R = 0..max_radius``."""
    out, total = [], 0
    for r in range(max_radius + 1):
        total += math.comb(bits, r)
        out.append(total)
    return out


def fit_t0(probes, times) -> float:
    """Least squares through the origin: ``t0 = argmin sum (t - t0 p)^2 = sum p t / sum p^2``
    (0.0 when every ``p`` is 0)."""
    p = np.array([float(x) for x in np.ravel(probes)], dtype=np.float64)
    t = np.asarray(times, dtype=np.float64).ravel()
    den = float(p @ p)
    return float(p @ t) / den if den > 0 else 0.0


@dataclass
class T0Estimate:
    """One estimate of the paper's ``t0`` (ns per probe), named by the estimator that made it;
    ``ci_ns`` is the interval at ``confidence`` (None when it cannot be estimated)."""

    estimator: str
    t0_ns: float | None
    ci_ns: tuple[float, float] | None
    samples: int
    formula: str
    confidence: float = CONFIDENCE
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ci_ns"] = None if self.ci_ns is None else list(self.ci_ns)
        return out


RADIUS_FIT_FORMULA = ("t0 = sum p t / sum p^2 over (query, radius) samples (least squares "
                      "through the origin); interval t0 +- t s / sqrt(sum p^2)")


def radius_fit_from_sums(n: int, spt: float, spp: float, stt: float,
                         confidence: float = CONFIDENCE) -> T0Estimate:
    """The ``radius_fit`` estimate from ``n`` samples' sums ``sum p t``, ``sum p^2``,
    ``sum t^2`` (``t0_ns`` None when ``sum p^2 = 0``: no probe was made)."""
    if spp <= 0:
        return T0Estimate(RADIUS_FIT, None, None, int(n), RADIUS_FIT_FORMULA, confidence)
    t0 = spt / spp
    ci = None
    if n > 1:
        s2 = max(stt - t0 * spt, 0.0) / (n - 1)
        half = t_quantile((1 + confidence) / 2, n - 1) * math.sqrt(s2 / spp)
        ci = (t0 - half, t0 + half)
    return T0Estimate(RADIUS_FIT, t0, ci, int(n), RADIUS_FIT_FORMULA, confidence)


def radius_fit(probes, times, confidence: float = CONFIDENCE) -> T0Estimate:
    """The ``radius_fit`` estimate of ``t0`` on ``(probes, times)`` samples."""
    p = np.array([float(x) for x in np.ravel(probes)], dtype=np.float64)
    t = np.asarray(times, dtype=np.float64).ravel()
    return radius_fit_from_sums(len(t), float(p @ t), float(p @ p), float(t @ t), confidence)


def r_squared(measured, modeled) -> float:
    """``1 - sum (y - yhat)^2 / sum (y - mean y)^2`` (nan when every ``y`` is equal)."""
    y = np.asarray(measured, dtype=np.float64).ravel()
    yhat = np.asarray(modeled, dtype=np.float64).ravel()
    ss_tot = float(((y - y.mean()) ** 2).sum()) if len(y) else 0.0
    if ss_tot == 0:
        return float("nan")
    return 1.0 - float(((y - yhat) ** 2).sum()) / ss_tot


def relative_errors(measured, modeled) -> list[float]:
    """``|modeled - measured| / measured`` per entry (nan where measured is 0)."""
    y = np.asarray(measured, dtype=np.float64)
    yhat = np.asarray(modeled, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return [float(v) for v in np.where(y > 0, np.abs(yhat - y) / y, np.nan)]


@dataclass
class PaperModel:
    """``T(R) = t0 * sum_{r<=R} C(Q, r)``, fitted on one radius range."""

    bits: int
    t0_ns: float
    radii: list[int] = field(default_factory=list)      # radii of the fit
    r2: float = float("nan")                            # over per-radius means
    max_rel_error: float = float("nan")
    rel_error: list[float] = field(default_factory=list)  # per radius of the fit

    def predict(self, max_radius: int) -> list[float]:
        """Modeled cumulative cost ``T(R)`` in ns for ``R = 0..max_radius``."""
        return [self.t0_ns * float(p) for p in paper_probes(self.bits, max_radius)]

    def to_dict(self) -> dict:
        return asdict(self)


def reached_mask(stats) -> np.ndarray:
    """``(nq, R + 1)``: whether query q searched radius r (``r < radii[q]``)."""
    return np.arange(stats.probes.shape[1])[None, :] < np.asarray(stats.radii)[:, None]


def per_radius_means(stats, field_name: str) -> np.ndarray:
    """Mean of a per-radius statistic over the queries that reached each radius."""
    arr = getattr(stats, field_name)
    reached = reached_mask(stats)
    counts = np.maximum(reached.sum(axis=0), 1)
    return (np.where(reached, arr, 0).sum(axis=0) / counts).astype(np.float64)


def fit_paper_model(stats, bits: int, max_radius: int | None = None) -> PaperModel:
    """Fit ``t0`` on single-table statistics of a range search (``stats=True``).

    Per radius r the measured cost is the mean ``lookup_ns[:, r]``, the model ``t0 C(Q, r)``;
    ``t0`` is the least-squares slope through the origin over every (query, radius) sample, R^2
    and relative errors compare the cumulative per-radius means ``T(R)`` with ``t0 P(R)``.
    """
    width = stats.probes.shape[1] if max_radius is None else max_radius + 1
    radii = list(range(width))
    probes = np.array([[math.comb(bits, r) for r in radii]] * len(stats.radii), dtype=object)
    reached = reached_mask(stats)[:, :width]
    t0 = fit_t0(probes[reached], stats.lookup_ns[:, :width][reached])
    measured = np.cumsum(per_radius_means(stats, "lookup_ns")[:width])
    modeled = np.array([t0 * float(p) for p in paper_probes(bits, width - 1)])
    rel = relative_errors(measured, modeled)
    return PaperModel(bits, t0, radii, r_squared(measured, modeled),
                      float(np.nanmax(rel)) if rel else float("nan"), rel)
