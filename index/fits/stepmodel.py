"""The planner's per-radius-step model (estimator ``step_model``), fitted on (query, radius)
samples: ``t = c + a probes + b nonempty + d items (+ e candidates)`` where ``c`` is a cost per
radius step (:func:`fit_extended`). :mod:`bucketsearch.index.planner` sums it over the steps of a
search to
predict a path's cost. The per-*query* extended model with intervals and the identifiability
rule, what every report shows, is :func:`bucketsearch.index.costmodel.estimators.fit_query_model`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from bucketsearch.index.fits.paper import r_squared, reached_mask, relative_errors

EXTENDED_TERMS = ("const", "probes", "nonempty_buckets", "items", "candidates")


@dataclass
class ExtendedModel:
    """``t = c + a probes + b nonempty + d items (+ e candidates)`` per (query, radius) sample."""

    terms: tuple[str, ...]
    coef: dict[str, float]
    r2: float = float("nan")
    rel_error: list[float] = field(default_factory=list)   # per radius, of the means
    max_rel_error: float = float("nan")
    samples: int = 0

    def predict(self, features: dict) -> np.ndarray:
        """Modeled ns for arrays of features (``const`` is implied)."""
        out = self.coef.get("const", 0.0)
        for name in self.terms:
            if name != "const":
                out = out + self.coef[name] * np.asarray(features[name], dtype=np.float64)
        return np.asarray(out, dtype=np.float64)

    def to_dict(self) -> dict:
        return asdict(self)


def stats_features(stats) -> dict:
    """Per-(query, radius) feature arrays of a SearchStats (``candidates`` when recorded)."""
    feats = {name: getattr(stats, name) for name in ("probes", "nonempty_buckets", "items")}
    if getattr(stats, "candidates", None) is not None:
        feats["candidates"] = stats.candidates
    return feats


def fit_extended(stats, terms: tuple[str, ...] | None = None, nonnegative: bool = True,
                 relative: bool = False) -> ExtendedModel:
    """Least squares fit of the extended model on every (query, radius) sample of ``stats``.

    ``terms`` defaults to const, probes, nonempty_buckets, items (+ candidates when the stats
    have them). With ``nonnegative`` a term whose coefficient comes out negative is dropped and
    the fit redone (a cost is never negative; it keeps the extrapolation sane). With
    ``relative`` the squared *relative* residuals ``((t - that) / max(t, 50 ns))^2`` are
    minimised (weighted least squares), so cheap radii weigh as much as expensive ones (what a
    planner comparing costs needs); R^2 is always the plain one.
    """
    feats = stats_features(stats)
    if terms is None:
        terms = tuple(t for t in EXTENDED_TERMS if t == "const" or t in feats)
    reached = reached_mask(stats)
    y = stats.lookup_ns[reached].astype(np.float64)
    active = list(terms)
    coef = dict.fromkeys(terms, 0.0)
    while active:
        X = np.column_stack([np.ones(len(y)) if t == "const" else
                             feats[t][reached].astype(np.float64) for t in active])
        wts = 1.0 / np.maximum(y, 50.0) if relative else np.ones(len(y))
        sol = (np.linalg.lstsq(X * wts[:, None], y * wts, rcond=None)[0] if len(y)
               else np.zeros(len(active)))
        bad = [t for t, c in zip(active, sol) if c < 0]
        if not nonnegative or not bad:
            coef.update({t: float(c) for t, c in zip(active, sol)})
            break
        active.remove(min(bad, key=lambda t: sol[active.index(t)]))
    model = ExtendedModel(tuple(terms), coef, samples=int(len(y)))
    full = {t: feats[t] for t in terms if t != "const"}
    yhat_all = model.predict(full) * np.ones(stats.lookup_ns.shape)
    model.r2 = r_squared(y, yhat_all[reached])
    counts = np.maximum(reached.sum(axis=0), 1)
    meas = np.where(reached, stats.lookup_ns, 0).sum(axis=0) / counts
    mod = np.where(reached, yhat_all, 0).sum(axis=0) / counts
    model.rel_error = relative_errors(meas, mod)
    finite = [e for e in model.rel_error if not math.isnan(e)]
    model.max_rel_error = max(finite) if finite else float("nan")
    return model
