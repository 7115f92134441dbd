"""Every estimate of a search's cost from one set of per-query samples, each named by the
estimator that made it, with the verdicts that compare them (:func:`fit_all`, :func:`describe`).

Samples (:class:`CostSamples`): per query ``q`` and radius ``r < radii[q]`` the engine's
counters (``probes``, ``nonempty_buckets``, ``empty_buckets``, ``items`` at distance exactly
``r``, ``candidates`` for multi-index hashing) and ``lookup_ns``, the in-kernel time of that
radius. ``T(r)`` is the time of radius r alone (one ring of the Hamming ball); ``T(R) =
sum_{r<=R} T(r)`` the cumulative time of the ball up to R, per query.

Estimators:

* ``radius_fit`` (:mod:`.paper`): the paper's ``t0``, least squares through the origin of
  ``lookup_ns[q, r]`` on ``probes[q, r]``.
* ``microbenchmark`` (:mod:`.microbench`): the paper's ``t0`` from probes timed apart.
* ``query_model`` (:func:`fit_query_model`): per query ``T = fixed + t_probe P + t_item I
  + t_cand C (+ t_nonempty B)``, ``P, I, C, B`` the query's probes, items, candidates and
  non-empty buckets summed over its radii, fitted by least squares on the per-query samples
  with HC3 intervals; terms the data cannot identify are left out and reported
  (:mod:`.regression`). Its ``probes`` coefficient is a third ``t0``,
  ``query_model.probes``.

Per radius (:func:`radius_rows`): measured ``T(r)`` and ``T(R)`` (p50, p90, p99, mean over
the queries that reached r), the paper's ``t0 C(Q, r)`` and ``t0 sum_{i<=r} C(Q, i)``, the
measured ratio ``T(R)/T(0)`` (of the p50s) beside the paper's ``sum_{i<=R} C(Q, i)`` (its
ratio, ``C(Q, 0) = 1``), mean empty buckets, ``queries`` and ``empty_ball_queries`` (queries
whose ball up to R held no item: ``sum_{i<=R} items[q, i] = 0``; the RAMAP paper's Fig. 5).

Outliers: on a shared machine a sample is sometimes inflated many times over (the thread was
preempted, a page was cold); interference only ever adds time. Both fits therefore leave out
samples above Tukey's far-out fence ``Q3 + 3 IQR`` of their group (a radius for
``radius_fit``; the queries that searched the same radii for ``query_model``) and report how
many (``excluded``); ``trim=False`` keeps every sample. The per-radius quantiles keep them all.

Verdicts: the paper model *holds* at radius R when ``1/2 <= t0 sum C / T(R)_p50 <= 2``
(:data:`HOLDS_FACTOR`); two ``t0`` estimates *agree* when their intervals overlap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bucketsearch.index.codes import check_bits
from bucketsearch.index.costmodel.microbench import MICROBENCHMARK, mix_probe_times
from bucketsearch.index.fits.paper import RADIUS_FIT, T0Estimate, radius_fit
from bucketsearch.index.fits.regression import (COND_MAX, CONFIDENCE, LinearFit, fit_linear,
                                                    fit_nonnegative)

QUERY_MODEL = "query_model"
#: terms of the query model in priority order (an unidentified term never pushes out an
#: earlier one)
QUERY_TERMS = ("fixed", "probes", "items", "candidates", "nonempty_buckets")
DEFAULT_QUERY_TERMS = ("fixed", "probes", "items", "candidates")
HOLDS_FACTOR = 2.0
QUANTILES = (("p50_ns", 50), ("p90_ns", 90), ("p99_ns", 99))
COUNTERS = ("probes", "nonempty_buckets", "empty_buckets", "items", "lookup_ns")


@dataclass
class CostSamples:
    """Per-query, per-radius counters and times (arrays ``(nq, W)``; row r of query q valid
    for ``r < radii[q]``); ``candidates`` only for multi-index hashing; ``total_ns`` (whole
    query, in-kernel) when known."""

    probes: np.ndarray
    nonempty_buckets: np.ndarray
    empty_buckets: np.ndarray
    items: np.ndarray
    lookup_ns: np.ndarray
    radii: np.ndarray
    candidates: np.ndarray | None = None
    total_ns: np.ndarray | None = None

    @classmethod
    def from_stats(cls, stats) -> CostSamples:
        """From a :class:`~bucketsearch.index.base.SearchStats` (or a list of them,
        concatenated)."""
        if isinstance(stats, (list, tuple)):
            stats = type(stats[0]).concat(list(stats)) if len(stats) > 1 else stats[0]
        return cls(*(np.asarray(getattr(stats, f), dtype=np.int64) for f in COUNTERS),
                   radii=np.asarray(stats.radii, dtype=np.int64),
                   candidates=None if getattr(stats, "candidates", None) is None
                   else np.asarray(stats.candidates, dtype=np.int64),
                   total_ns=None if getattr(stats, "total_ns", None) is None
                   else np.asarray(stats.total_ns, dtype=np.int64))

    @classmethod
    def from_records(cls, queries: list[list[dict]]) -> CostSamples:
        """From the HTTP form of search statistics: per query a list of per-radius records
        ``{"radius", "probes", "nonempty_buckets", "empty_buckets", "items", "lookup_ns"
        (, "candidates")}`` with radii 0, 1, ... in order (what ``POST .../search`` with
        ``stats`` answers, and what the load tester collects)."""
        if not isinstance(queries, (list, tuple)):
            raise TypeError(f"queries: a list of per-query lists of records, got "
                            f"{type(queries).__name__}")
        width = max((len(q) for q in queries), default=0)
        nq = len(queries)
        arrays = {f: np.zeros((nq, max(width, 1)), dtype=np.int64) for f in COUNTERS}
        with_cand = nq > 0 and all(q and "candidates" in q[0] for q in queries)
        cand = np.zeros((nq, max(width, 1)), dtype=np.int64) if with_cand else None
        for i, recs in enumerate(queries):
            for r, rec in enumerate(recs):
                if not isinstance(rec, dict) or rec.get("radius", r) != r:
                    raise ValueError(f"queries[{i}][{r}]: expected the record of radius {r}, "
                                     f"got {rec!r}")
                for f in COUNTERS:
                    value = rec.get(f, rec.get("probes", 0) - rec.get("nonempty_buckets", 0)
                                    if f == "empty_buckets" else None)
                    if isinstance(value, bool) or not isinstance(value, (int, float)) \
                            or value < 0:
                        raise ValueError(f"queries[{i}][{r}].{f}: a number >= 0 is needed, "
                                         f"got {value!r}")
                    arrays[f][i, r] = value
                if cand is not None:
                    cand[i, r] = rec.get("candidates") or 0
        return cls(**arrays, radii=np.array([len(q) for q in queries], dtype=np.int64),
                   candidates=cand)

    @property
    def nq(self) -> int:
        return len(self.radii)

    @property
    def width(self) -> int:
        return self.probes.shape[1]

    def reached(self) -> np.ndarray:
        """``(nq, W)``: whether query q searched radius r."""
        return np.arange(self.width)[None, :] < self.radii[:, None]

    def per_query(self, name: str) -> np.ndarray:
        """Per query, the sum of a per-radius counter over the radii it searched."""
        return np.where(self.reached(), getattr(self, name), 0).sum(axis=1)


def as_samples(data) -> CostSamples:
    """CostSamples from CostSamples, a SearchStats (or a list of them) or HTTP records."""
    if isinstance(data, CostSamples):
        return data
    if hasattr(data, "lookup_ns") or (isinstance(data, (list, tuple)) and data
                                      and hasattr(data[0], "lookup_ns")):
        return CostSamples.from_stats(data)
    return CostSamples.from_records(data)


# ------------------------------------------------------------------------ estimators
FENCE = 3.0
TRIM_RULE = "left out: samples above Q3 + 3 IQR of their group (Tukey's far-out fence)"


def within_fence(values, groups, fence: float = FENCE) -> np.ndarray:
    """Whether each value is at most ``Q3 + fence * IQR`` of the values of its group."""
    values = np.asarray(values, dtype=np.float64)
    groups = np.asarray(groups)
    keep = np.ones(len(values), dtype=bool)
    for g in np.unique(groups):
        sel = groups == g
        q1, q3 = np.percentile(values[sel], [25, 75])
        keep[sel] = values[sel] <= q3 + fence * (q3 - q1)
    return keep


def t0_radius_fit(samples: CostSamples, confidence: float = CONFIDENCE,
                  trim: bool = True) -> T0Estimate:
    """``radius_fit`` over the (query, radius) samples (``trim``: within the fence of their
    radius)."""
    reached = samples.reached()
    p, t = samples.probes[reached], samples.lookup_ns[reached]
    keep = within_fence(t, np.nonzero(reached)[1]) if trim else np.ones(len(t), dtype=bool)
    est = radius_fit(p[keep], t[keep], confidence)
    est.detail["excluded"] = int((~keep).sum())
    if trim:
        est.detail["rule"] = TRIM_RULE
    return est


@dataclass
class QueryModel:
    """The ``query_model`` fit (see the module docstring): ``fit`` holds the coefficients in
    ns per unit (``fixed`` in ns per query), their intervals and the unidentified terms."""

    fit: LinearFit
    time: str
    excluded: int = 0
    trimmed: bool = True

    def predict(self, features: dict) -> np.ndarray:
        """Modeled ns per query for arrays of per-query features (``fixed`` implied)."""
        cols = {"fixed": np.ones(np.shape(next(iter(features.values()), 1.0)))} | dict(features)
        return self.fit.predict(cols)

    def to_dict(self) -> dict:
        return {"estimator": QUERY_MODEL, "time": self.time,
                "formula": "T_query = fixed + sum_term coef_term * (term summed over the "
                           "query's radii); least squares, HC3 intervals",
                "excluded": self.excluded, "rule": TRIM_RULE if self.trimmed else None,
                **self.fit.to_dict()}


def fit_query_model(samples: CostSamples, terms: tuple[str, ...] = DEFAULT_QUERY_TERMS,
                    time: str = "lookup", covariance: str = "HC3",
                    confidence: float = CONFIDENCE, cond_max: float = COND_MAX,
                    trim: bool = True, nonnegative: bool = True) -> QueryModel:
    """Fit the per-query extended model. ``time``: ``lookup`` (sum of the query's
    ``lookup_ns``, the clock of ``T(R)``) or ``total`` (the query's whole in-kernel time);
    ``trim``: queries within the fence of the queries that searched as many radii;
    ``nonnegative``: a term fitted below 0 is left out and the fit redone
    (:func:`~.regression.fit_nonnegative`; False: plain least squares)."""
    unknown = [t for t in terms if t not in QUERY_TERMS]
    if unknown:
        raise ValueError(f"terms: {unknown[0]!r} is not a term; allowed: {QUERY_TERMS}")
    if time not in ("lookup", "total"):
        raise ValueError(f"time must be 'lookup' or 'total', got {time!r}")
    if time == "total" and samples.total_ns is None:
        raise ValueError("time: 'total' needs the queries' total_ns, which these samples lack")
    y = samples.per_query("lookup_ns") if time == "lookup" else samples.total_ns
    keep = within_fence(y, samples.radii) if trim and len(y) else np.ones(len(y), dtype=bool)
    columns, missing = {"fixed": np.ones(int(keep.sum()))}, {}
    for t in terms:
        if t == "candidates" and samples.candidates is None:
            missing[t] = "not recorded (only multi-index hashing examines candidates)"
        elif t != "fixed":
            columns[t] = samples.per_query(t)[keep]
    order = [t for t in terms if t not in missing]
    if nonnegative:
        fit, dropped = fit_nonnegative(columns, np.asarray(y)[keep], order, covariance,
                                       confidence, cond_max)
        missing.update(dropped)
    else:
        fit = fit_linear(columns, np.asarray(y)[keep], order, covariance, confidence, cond_max)
    fit.unidentified.update(missing)
    return QueryModel(fit, "sum of lookup_ns over the query's radii" if time == "lookup"
                      else "total_ns of the query", int((~keep).sum()), trim)


def t0_from_query_model(model: QueryModel) -> T0Estimate:
    """The query model's per-probe coefficient as a ``t0`` estimate (None if unidentified)."""
    fit = model.fit
    ok = "probes" in fit.coef
    return T0Estimate(f"{QUERY_MODEL}.probes", fit.coef["probes"] if ok else None,
                      tuple(fit.ci["probes"]) if ok else None, fit.samples,
                      "the probes coefficient of the query model",
                      fit.confidence,
                      {} if ok else {"unidentified": fit.unidentified.get("probes")})


# ------------------------------------------------------------------------ per radius
def summary(values) -> dict:
    """``{count, p50_ns, p90_ns, p99_ns, mean_ns}`` of some ns (None when there are none)."""
    v = np.asarray(values, dtype=np.float64)
    out = {"count": int(len(v))}
    for key, q in QUANTILES:
        out[key] = float(np.percentile(v, q)) if len(v) else None
    out["mean_ns"] = float(v.mean()) if len(v) else None
    return out


def measured_row(radius: int, queries: int, probes: float | None, ring: dict,
                 cumulative: dict, mean_empty_buckets: float | None,
                 empty_ball_queries: int) -> dict:
    """The measured half of a per-radius row (``ring``, ``cumulative``: :func:`summary`
    dicts of ``T(r)`` and ``T(R)``); :func:`paper_columns` adds the model's half."""
    return {"radius": int(radius), "queries": int(queries), "probes": probes,
            "measured": ring, "measured_cumulative": cumulative,
            "mean_empty_buckets": mean_empty_buckets,
            "empty_ball_queries": int(empty_ball_queries)}


def paper_columns(rows: list[dict], bits: int, t0: float | None,
                  holds_factor: float = HOLDS_FACTOR) -> list[dict]:
    """``rows`` (from :func:`measured_row`, radius order) with the paper's columns: exact
    ``paper_probes = C(Q, r)`` and ``cumulative_paper_probes = sum_{i<=r} C(Q, i)`` (also the
    paper's ratio ``paper_ratio = T(R)/T(0)``), ``paper_ns = t0 C(Q, r)``,
    ``paper_cumulative_ns``, the measured ratio ``measured_ratio = T(R)_p50 / T(0)_p50``,
    ``paper_over_measured = t0 sum C / T(R)_p50`` and ``paper_holds`` (within a factor
    ``holds_factor``; None without t0 or a measurement)."""
    zero = next((r for r in rows if r["radius"] == 0), None)
    t_zero = zero["measured_cumulative"]["p50_ns"] if zero else None
    out = []
    for row in rows:
        r = row["radius"]
        c = math.comb(bits, r) if r <= bits else 0
        cum = sum(math.comb(bits, i) for i in range(min(r, bits) + 1))
        t_cum = row["measured_cumulative"]["p50_ns"]
        modeled_cum = t0 * float(cum) if t0 is not None else None
        ratio = modeled_cum / t_cum if modeled_cum is not None and t_cum else None
        out.append({**row, "paper_probes": c, "cumulative_paper_probes": cum,
                    "paper_ns": t0 * float(c) if t0 is not None else None,
                    "paper_cumulative_ns": modeled_cum,
                    "measured_ratio": t_cum / t_zero if t_cum is not None and t_zero else None,
                    "paper_ratio": cum,
                    "paper_over_measured": ratio,
                    "paper_holds": None if ratio is None
                    else bool(1 / holds_factor <= ratio <= holds_factor)})
    return out


def radius_rows(samples: CostSamples, bits: int, t0: float | None,
                holds_factor: float = HOLDS_FACTOR) -> list[dict]:
    """Per radius reached by some query: the measured row (exact percentiles) and the paper's
    columns (:func:`paper_columns`)."""
    reached = samples.reached()
    cum_ns = np.cumsum(samples.lookup_ns, axis=1)
    cum_items = np.cumsum(samples.items, axis=1)
    rows = []
    for r in range(samples.width):
        sel = reached[:, r]
        n = int(sel.sum())
        if not n:
            continue
        rows.append(measured_row(
            r, n, float(samples.probes[sel, r].mean()), summary(samples.lookup_ns[sel, r]),
            summary(cum_ns[sel, r]), float(samples.empty_buckets[sel, r].mean()),
            int((cum_items[sel, r] == 0).sum())))
    return paper_columns(rows, bits, t0, holds_factor)


# ------------------------------------------------------------------------ all together
def t0_agreement(estimates: list[T0Estimate]) -> dict:
    """Do the ``t0`` estimates agree? ``ratio`` = largest / smallest value; ``overlap``:
    whether every pair of intervals overlaps."""
    have = [e for e in estimates if e.t0_ns is not None and e.t0_ns > 0]
    if len(have) < 2:
        return {"estimators": [e.estimator for e in have], "ratio": None, "overlap": None,
                "verdict": "fewer than two estimates"}
    values = [e.t0_ns for e in have]
    ivs = [e.ci_ns for e in have if e.ci_ns is not None]
    overlap = len(ivs) == len(have) and max(lo for lo, _ in ivs) <= min(hi for _, hi in ivs)
    ratio = max(values) / min(values)
    return {"estimators": [e.estimator for e in have], "ratio": ratio, "overlap": overlap,
            "verdict": "agree within their intervals" if overlap
            else f"differ (largest / smallest = {ratio:.3g})"}


def fit_all(data, bits: int, microbenchmark: dict | None = None, fill: float | None = None,
            terms: tuple[str, ...] = DEFAULT_QUERY_TERMS, time: str = "lookup",
            confidence: float = CONFIDENCE, holds_factor: float = HOLDS_FACTOR,
            trim: bool = True) -> dict:
    """Every estimate and verdict from one set of samples, as a JSON-ready dict.

    ``data``: :class:`CostSamples`, SearchStats or HTTP records (:func:`as_samples`).
    ``microbenchmark``: a :func:`~.microbench.probe_microbenchmark` result to mix (with
    ``fill``, default the measured fraction of non-empty probes of these samples). The
    per-radius paper columns use the ``radius_fit`` t0 (``t0_estimator`` in the result).
    """
    bits = check_bits(bits)
    samples = as_samples(data)
    reached = samples.reached()
    estimates = [t0_radius_fit(samples, confidence, trim)]
    if microbenchmark is not None:
        probes = float(samples.probes[reached].sum())
        f = fill if fill is not None else (
            float(samples.nonempty_buckets[reached].sum()) / probes if probes else None)
        estimates.append(mix_probe_times(microbenchmark, f, confidence))
    qm = fit_query_model(samples, terms, time, confidence=confidence, trim=trim)
    estimates.append(t0_from_query_model(qm))
    t0 = estimates[0].t0_ns
    rows = radius_rows(samples, bits, t0, holds_factor)
    judged = [r for r in rows if r["paper_holds"] is not None]
    return {
        "bits": int(bits), "queries": samples.nq,
        "samples": int(reached.sum()), "t0_estimator": RADIUS_FIT, "t0_ns": t0,
        "t0": [e.to_dict() for e in estimates],
        "query_model": qm.to_dict(),
        "radii": rows,
        "verdicts": {
            "t0_agreement": t0_agreement(estimates),
            "paper_model": {
                "rule": f"holds at R when 1/{holds_factor:g} <= t0 sum_(i<=R) C(Q, i) / "
                        f"T(R)_p50 <= {holds_factor:g} (t0: {RADIUS_FIT})",
                "holds_at": [r["radius"] for r in judged if r["paper_holds"]],
                "fails_at": [r["radius"] for r in judged if not r["paper_holds"]]},
            "query_model": {
                "identified": list(qm.fit.terms),
                "significant": [t for t in qm.fit.terms if qm.fit.significant(t)],
                "unidentified": dict(qm.fit.unidentified)}},
    }


def _ns(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    v = float(v)
    if abs(v) >= 1e9:
        return f"{v / 1e9:.3g} s"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3g} ms"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.3g} us"
    return f"{v:.3g} ns"


def _ci(ci) -> str:
    return "no interval" if ci is None else f"CI {_ns(ci[0])} .. {_ns(ci[1])}"


def describe(result: dict) -> str:
    """Plain-text rendering of a :func:`fit_all` result (every figure with its estimator)."""
    lines = [f"cost model: {result['bits']}-bit codes, {result['queries']} queries, "
             f"{result['samples']} (query, radius) samples"]
    for e in result["t0"]:
        extra = ""
        if e["estimator"] == MICROBENCHMARK:
            d = e["detail"]
            extra = (f"; empty {_ns(d['empty_ns'])}, non-empty {_ns(d['nonempty_ns'])}, "
                     f"f = {d['f']:.3g}" if d.get("f") is not None else "")
        elif e["t0_ns"] is None and e["detail"].get("unidentified"):
            extra = f"; unidentified: {e['detail']['unidentified']}"
        elif e["detail"].get("excluded"):
            extra = f"; {e['detail']['excluded']} outliers left out"
        conf = f"{round(100 * e['confidence'])}% " if e["ci_ns"] is not None else ""
        lines.append(f"  t0 [{e['estimator']}] = {_ns(e['t0_ns'])} ({conf}{_ci(e['ci_ns'])}, "
                     f"{e['samples']} samples{extra})")
    qm = result["query_model"]
    terms = ", ".join(f"{name} {_ns(t['coef_ns'])} ({_ci(t['ci_ns'])})"
                      for name, t in qm["terms"].items())
    r2 = "-" if qm["r2"] is None or not math.isfinite(qm["r2"]) else f"{qm['r2']:.3f}"
    lines.append(f"  [{qm['estimator']}] per query ({qm['time']}): {terms or 'no term'}; "
                 f"R^2 {r2}, {qm['samples']} queries ({qm['excluded']} outliers left out), "
                 f"{qm['covariance']} intervals")
    for name, why in qm["unidentified"].items():
        lines.append(f"    {name}: unidentified, left out ({why})")
    lines.append(f"  per radius (paper columns with t0 [{result['t0_estimator']}]):")
    lines.append("    R  queries  T(r) p50   T(R) p50/p90/p99            t0*C(Q,r)  t0*sumC"
                 "    T(R)/T(0)  sumC(Q,i)  empty/q    empty balls  holds")
    for r in result["radii"]:
        m, c = r["measured"], r["measured_cumulative"]
        ratio = "-" if r["measured_ratio"] is None else f"{r['measured_ratio']:.3g}"
        empty = "-" if r["mean_empty_buckets"] is None else f"{r['mean_empty_buckets']:.4g}"
        holds = {None: "-", True: "yes", False: "no"}[r["paper_holds"]]
        lines.append(f"    {r['radius']:<2} {r['queries']:>7}  {_ns(m['p50_ns']):>9}  "
                     f"{_ns(c['p50_ns']):>8}/{_ns(c['p90_ns']):>8}/{_ns(c['p99_ns']):>8}  "
                     f"{_ns(r['paper_ns']):>9}  {_ns(r['paper_cumulative_ns']):>9}  "
                     f"{ratio:>9}  {r['paper_ratio']:>9,}  {empty:>9}  "
                     f"{r['empty_ball_queries']:>11}  {holds}")
    v = result["verdicts"]
    lines.append(f"  verdict t0: {v['t0_agreement']['verdict']} "
                 f"({', '.join(v['t0_agreement']['estimators'])})")
    lines.append(f"  verdict paper model: holds at R = {v['paper_model']['holds_at']}, fails "
                 f"at R = {v['paper_model']['fails_at']} ({v['paper_model']['rule']})")
    return "\n".join(lines)
