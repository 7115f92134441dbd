"""Least squares with confidence intervals and an identifiability rule (numpy and the standard
library only).

Model ``y = X b + e`` over ``n`` samples and the terms (columns) the rule keeps.

* Estimate: ``b = argmin ||y - X b||^2`` (``numpy.linalg.lstsq``).
* Covariance: ``HC3`` (default; MacKinnon & White 1985), robust to errors whose variance grows
  with the work of a query: ``(X'X)^-1 X' diag(e_i^2 / (1 - h_ii)^2) X (X'X)^-1`` with ``h_ii``
  the leverages; or ``classical``: ``s^2 (X'X)^-1`` with ``s^2 = SS_res / (n - k)``.
* Interval: ``b_j +- t_{(1+c)/2, n-k} se_j`` (Student's t; :func:`t_quantile`).
* ``R^2 = 1 - SS_res / SS_tot``, ``SS_tot`` centred (so a constant predictor scores 0).

Identifiability (:func:`select_terms`): the terms are tried in a fixed priority order and a
term is kept only when (1) its column is not zero in every sample, (2) there are more samples
than kept terms (so an error variance can be estimated), and (3) the *condition index* of the
kept columns with it, each scaled to unit length and not centred (Belsley, Kuh & Welsch,
"Regression Diagnostics", 1980), is at most :data:`COND_MAX` = 30, their bound for a strong
dependence. A term that fails is reported unidentified with the reason and the relation that
makes it so (e.g. ``items ~ 1.00 fixed``: at radius 0 every query finds about one item, so a
per-item cost cannot be told from the fixed cost per query), and is left out of the fit. The
scaled, uncentred index is used because a centred diagnostic (the variance inflation factor)
cannot see a term that is collinear with the constant.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

COND_MAX = 30.0
EXACT_COND = 1e10  # beyond this the columns are dependent to rounding error
CONFIDENCE = 0.95
COVARIANCES = ("HC3", "classical")


def _t_two_sided(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        term, total = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return (2 / math.pi) * (theta + s * total) if df > 1 else 2 * theta / math.pi
    term, total = 1.0, 0.0
    for k in range(1, df // 2 + 1):
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return s * total


def t_quantile(p: float, df: float) -> float:
    """Quantile ``p`` of Student's t with ``df`` degrees of freedom: for ``df <= 100`` (an
    integer) the exact distribution function (A&S 26.7.3-4) inverted by bisection; beyond, the
    Cornish-Fisher series of A&S 26.7.5 around the normal quantile (error below 1e-6)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    if df <= 100 and float(df).is_integer():
        target, sign = abs(2 * p - 1), 1.0 if p >= 0.5 else -1.0
        lo, hi = 0.0, 1.0
        while _t_two_sided(hi, int(df)) < target:
            hi *= 2
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _t_two_sided(mid, int(df)) < target else (lo, mid)
        return sign * (lo + hi) / 2
    z = NormalDist().inv_cdf(p)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4


def condition_index(X: np.ndarray) -> float:
    """Largest over smallest singular value of ``X`` with every column scaled to unit length
    (not centred); inf when a column is zero or the columns are linearly dependent."""
    X = np.asarray(X, dtype=np.float64)
    if X.shape[1] == 0:
        return 1.0
    norms = np.linalg.norm(X, axis=0)
    if not np.all(norms > 0) or X.shape[0] < X.shape[1]:
        return math.inf
    s = np.linalg.svd(X / norms, compute_uv=False)
    return float(s[0] / s[-1]) if s[-1] > s[0] * 1e-15 else math.inf


def _relation(name: str, x: np.ndarray, kept: list[str], columns: dict) -> str:
    """``x ~ a term1 + b term2`` (least squares on the kept columns, uncentred R^2)."""
    if not kept:
        return f"{name} is zero in every sample"
    A = np.column_stack([columns[k] for k in kept])
    coef = np.linalg.lstsq(A, x, rcond=None)[0]
    res = x - A @ coef
    r2 = 1.0 - float(res @ res) / float(x @ x)
    parts = [f"{c:.3g} {k}" for c, k in zip(coef, kept) if abs(c) * np.linalg.norm(
        columns[k]) > 1e-3 * np.linalg.norm(x)]
    return f"{name} ~ {' + '.join(parts) or '0'} (uncentred R^2 {r2:.4f})"


def select_terms(columns: dict[str, np.ndarray], order: tuple[str, ...] | list[str],
                 cond_max: float = COND_MAX) -> tuple[list[str], dict[str, str], float]:
    """The identifiable terms of ``order`` (see the module docstring): ``(kept, unidentified,
    condition index of the kept columns)``; ``unidentified`` maps a term to its reason."""
    kept: list[str] = []
    unidentified: dict[str, str] = {}
    cond = 1.0
    n = len(next(iter(columns.values()))) if columns else 0
    for name in order:
        x = np.asarray(columns[name], dtype=np.float64)
        if n == 0:
            unidentified[name] = "no samples"
            continue
        if not np.any(x):
            unidentified[name] = f"{name} is zero in every sample"
            continue
        if n <= len(kept) + 1:
            unidentified[name] = (f"{n} samples: too few for {len(kept) + 1} terms and an "
                                  "error estimate")
            continue
        c = condition_index(np.column_stack([columns[k] for k in kept] + [x]))
        if c > cond_max:
            shown = ("exactly collinear" if c > EXACT_COND
                     else f"condition index {c:.3g} > {cond_max:g}")
            unidentified[name] = f"collinear: {_relation(name, x, kept, columns)}; {shown}"
            continue
        kept.append(name)
        cond = c
    return kept, unidentified, cond


@dataclass
class LinearFit:
    """A least-squares fit: coefficients of the kept terms with standard errors and intervals,
    the terms left out as unidentified (with the reason), R^2 and the sample count."""

    terms: list[str]
    coef: dict[str, float]
    se: dict[str, float]
    ci: dict[str, tuple[float, float]]
    unidentified: dict[str, str] = field(default_factory=dict)
    r2: float = float("nan")
    samples: int = 0
    dof: int = 0
    condition_index: float = 1.0
    covariance: str = "HC3"
    confidence: float = CONFIDENCE

    def significant(self, name: str) -> bool:
        """Whether the interval of ``name`` excludes 0."""
        lo, hi = self.ci[name]
        return lo > 0 or hi < 0

    def predict(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """``sum_j b_j x_j`` over the kept terms."""
        out = 0.0
        for name in self.terms:
            out = out + self.coef[name] * np.asarray(columns[name], dtype=np.float64)
        return np.asarray(out, dtype=np.float64)

    def to_dict(self) -> dict:
        return {"terms": {name: {"coef_ns": self.coef[name], "se_ns": self.se[name],
                                 "ci_ns": list(self.ci[name]),
                                 "significant": self.significant(name)}
                          for name in self.terms},
                "coef": dict(self.coef), "unidentified": dict(self.unidentified),
                "r2": self.r2,
                "samples": self.samples, "dof": self.dof,
                "condition_index": self.condition_index, "covariance": self.covariance,
                "confidence": self.confidence}


def fit_linear(columns: dict[str, np.ndarray], y, order, covariance: str = "HC3",
               confidence: float = CONFIDENCE, cond_max: float = COND_MAX) -> LinearFit:
    """Least squares of ``y`` on the identifiable terms of ``order`` (columns by name), with
    ``covariance`` (``HC3`` or ``classical``) intervals at ``confidence``."""
    if covariance not in COVARIANCES:
        raise ValueError(f"covariance must be one of {COVARIANCES}, got {covariance!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    y = np.asarray(y, dtype=np.float64).ravel()
    kept, unidentified, cond = select_terms(columns, order, cond_max)
    n, k = len(y), len(kept)
    out = LinearFit(kept, {}, {}, {}, unidentified, samples=n, dof=n - k,
                    condition_index=cond, covariance=covariance, confidence=confidence)
    if not kept:
        return out
    X = np.column_stack([np.asarray(columns[t], dtype=np.float64) for t in kept])
    b = np.linalg.lstsq(X, y, rcond=None)[0]
    res = y - X @ b
    xtx_inv = np.linalg.pinv(X.T @ X)
    if covariance == "classical":
        cov = xtx_inv * float(res @ res) / (n - k)
    else:
        lev = np.einsum("ij,jk,ik->i", X, xtx_inv, X)
        w = (res / np.maximum(1.0 - lev, 1e-12)) ** 2
        cov = xtx_inv @ (X.T * w) @ X @ xtx_inv
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    tq = t_quantile((1 + confidence) / 2, n - k)
    for j, name in enumerate(kept):
        out.coef[name] = float(b[j])
        out.se[name] = float(se[j])
        out.ci[name] = (float(b[j] - tq * se[j]), float(b[j] + tq * se[j]))
    ss_tot = float(((y - y.mean()) ** 2).sum())
    out.r2 = 1.0 - float(res @ res) / ss_tot if ss_tot > 0 else float("nan")
    return out


def fit_nonnegative(columns: dict[str, np.ndarray], y, order, covariance: str = "HC3",
                    confidence: float = CONFIDENCE,
                    cond_max: float = COND_MAX) -> tuple[LinearFit, dict[str, str]]:
    """:func:`fit_linear`, then, while a coefficient is negative, the most negative term left
    out and the fit redone (a cost is never negative: a negative per-item or fixed term fitted
    on noisy samples predicts negative times). Returns the fit and ``{term: reason}`` of the
    terms left out so."""
    order, dropped = list(order), {}
    while True:
        fit = fit_linear(columns, y, order, covariance, confidence, cond_max)
        bad = [t for t in fit.terms if fit.coef[t] < 0]
        if not bad:
            return fit, dropped
        worst = min(bad, key=lambda t: fit.coef[t])
        dropped[worst] = f"negative coefficient ({fit.coef[worst]:.3g} ns): left out"
        order.remove(worst)
