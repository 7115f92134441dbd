"""Per-index cost bookkeeping of the server: per-radius histograms and counters of every search,
and the cost model's estimates of them (pure, no I/O). Every formula is in
:mod:`bucketsearch.index.costmodel`; this module only collects the samples and names their source.

Per radius ``r`` (a :class:`RadiusRecord`, over the queries that reached r since the server
started): log-spaced histograms of ``T(r)`` (the radius's own in-kernel lookup time) and of
``T(R)`` (the query's cumulative lookup time up to r), their sums, the probes, empty buckets and
items, and ``empty_ball`` (queries whose ball up to r held no item of the main table: the
delta segment, scanned linearly, has no per-radius counters). The histograms have
``SUB_BUCKETS`` buckets per power of two (about 4.4% relative resolution); a quantile is the
upper bound of the bucket holding it.

Estimates (each named, :mod:`bucketsearch.index.costmodel`):

* ``radius_fit`` and ``query_model`` over the most recent ``EXTENDED_BUFFER_ROWS`` queries,
  refit when ``GET .../cost-model`` or a ``/metrics`` scrape finds new searches (about 0.1 s
  for a full buffer on the 2-core machine); a search's ``modeled_ns`` uses the last fit, so no
  search pays for a refit;
* a calibration (:func:`calibrate`): sampled queries searched at every radius 0..R, then
  :func:`bucketsearch.index.costmodel.fit_all` with the ``microbenchmark`` of the single table.

The t0 the server models with (``modeled_ns`` in search stats, the per-radius paper columns) is
the calibration's ``radius_fit`` when there is one, else the observed ``radius_fit``.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from bucketsearch.index.base import ENGINES
from bucketsearch.index.costmodel import (CONFIDENCE, RADIUS_FIT, CostSamples, T0Estimate,
                                          fit_all, fit_query_model, measured_row,
                                          paper_columns, probe_microbenchmark, radius_fit,
                                          t0_agreement, t0_from_query_model, t0_radius_fit,
                                          t_quantile)
from bucketsearch.index.costmodel.engines import QuerySamples, engine_report

SUB_BUCKETS = 16  # per octave
OCTAVES = 40  # 1 ns .. 2^40 ns (about 18 minutes)
N_BUCKETS = SUB_BUCKETS * OCTAVES + 1
EXTENDED_BUFFER_ROWS = 20_000
MAX_PENDING = 1024  # queued searches folded in by the request that exceeds this
OBSERVED = "observed searches"
HISTORY_VERSION = 1
CALIBRATION = "calibration"


def bucket_of(ns: np.ndarray) -> np.ndarray:
    """Histogram bucket of each latency: ``floor(SUB_BUCKETS * log2(max(ns, 1)))``."""
    v = np.maximum(np.asarray(ns, dtype=np.float64), 1.0)
    return np.minimum((SUB_BUCKETS * np.log2(v)).astype(np.int64), N_BUCKETS - 1)


def bucket_upper_ns(b: np.ndarray | int) -> np.ndarray:
    return 2.0 ** ((np.asarray(b, dtype=np.float64) + 1) / SUB_BUCKETS)


def _zeros():
    return np.zeros(N_BUCKETS, dtype=np.int64)


def histogram_quantile(counts: np.ndarray, n: int, q: float) -> float | None:
    """Upper bound of the bucket holding the ``ceil(q n)``-th smallest value (None: empty)."""
    if n == 0:
        return None
    rank = max(int(math.ceil(q * n)), 1)
    return float(bucket_upper_ns(int(np.searchsorted(np.cumsum(counts), rank))))


@dataclass
class RadiusRecord:
    """Everything the server keeps of one radius (see the module docstring); the first five
    fields are what the Prometheus series of radius r were built from before."""

    counts: np.ndarray = field(default_factory=_zeros)      # histogram of T(r)
    n: int = 0                                              # queries that reached r
    sum_ns: float = 0.0                                     # sum of T(r)
    probes_total: int = 0
    empty_total: int = 0
    cum_counts: np.ndarray = field(default_factory=_zeros)  # histogram of T(R), R = r
    cum_sum_ns: float = 0.0
    items_total: int = 0
    empty_ball: int = 0                                     # queries with no item up to r

    ADDITIVE = ("counts", "n", "sum_ns", "probes_total", "empty_total", "cum_counts",
                "cum_sum_ns", "items_total", "empty_ball")

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(self.counts, self.n, q)

    def cumulative_quantile(self, q: float) -> float | None:
        return histogram_quantile(self.cum_counts, self.n, q)

    def copy(self) -> RadiusRecord:
        return RadiusRecord(**{f: (getattr(self, f).copy() if f.endswith("counts")
                                   else getattr(self, f)) for f in self.ADDITIVE})

    def add(self, other: RadiusRecord) -> RadiusRecord:
        """``self += other`` field by field (the records of two workers or two radii)."""
        for f in self.ADDITIVE:
            setattr(self, f, getattr(self, f) + getattr(other, f))
        return self

    def to_json(self) -> dict:
        """JSON form (histograms sparse: ``[[bucket, count], ...]``)."""
        out = {f: (float(getattr(self, f)) if f.endswith("_ns") else int(getattr(self, f)))
               for f in self.ADDITIVE if not f.endswith("counts")}
        for f in ("counts", "cum_counts"):
            arr = getattr(self, f)
            out[f] = [[int(b), int(arr[b])] for b in arr.nonzero()[0]]
        return out

    @classmethod
    def from_json(cls, data: dict) -> RadiusRecord:
        rec = cls(**{f: data.get(f, 0) for f in cls.ADDITIVE if not f.endswith("counts")})
        for f in ("counts", "cum_counts"):
            for b, c in data.get(f, ()):
                getattr(rec, f)[b] += c
        return rec

    def summary(self, cumulative: bool = False) -> dict:
        """``{count, p50_ns, p90_ns, p99_ns, mean_ns}`` of ``T(r)`` (or of ``T(R)``)."""
        q = self.cumulative_quantile if cumulative else self.quantile
        total = self.cum_sum_ns if cumulative else self.sum_ns
        return {"count": self.n, "p50_ns": q(0.5), "p90_ns": q(0.9), "p99_ns": q(0.99),
                "mean_ns": total / self.n if self.n else None}


def paper_rows(st):
    """The queries of ``st`` the paper's model describes: range queries that ran single-table
    probing (all of them when the search did not record its engine); None when none."""
    engine, k = _per_query(st, "engine"), _per_query(st, "k")
    keep = (k == 0) & ((engine == ENGINES.index("single")) | (engine == 0))
    if keep.all():
        return st
    return st.rows(keep) if keep.any() else None


def live_rows(records: dict[int, RadiusRecord], bits: int, t0: float | None) -> list[dict]:
    """Per radius the measured row of the records and the paper's columns
    (:func:`bucketsearch.index.costmodel.paper_columns`), plus ``modeled_ns = t0 x mean probes``."""
    rows = []
    for r, rec in sorted(records.items()):
        if not rec.n:
            continue
        probes = rec.probes_total / rec.n
        row = measured_row(r, rec.n, probes, rec.summary(), rec.summary(cumulative=True),
                           rec.empty_total / rec.n, rec.empty_ball)
        row["modeled_ns"] = t0 * probes if t0 is not None else None
        rows.append(row)
    return paper_columns(rows, bits, t0)


def _per_query(st, name: str) -> np.ndarray:
    """``st.engine`` or ``st.k`` (zeros when the search did not record it: engine unknown,
    a range query)."""
    arr = getattr(st, name, None)
    return np.zeros(len(st.radii), dtype=np.int64) if arr is None else np.asarray(arr)


def _fold_radii(records: dict, st, cum_ns, cum_items, rows: np.ndarray) -> int:
    """Fold the per-radius samples of the queries ``rows`` (boolean) into ``records``;
    returns the (query, radius) samples added."""
    radii = np.asarray(st.radii)
    added = 0
    for r in range(st.probes.shape[1]):
        reached = rows & (radii > r)
        if not reached.any():
            continue
        t = st.lookup_ns[reached, r].astype(np.float64)
        cum = cum_ns[reached, r].astype(np.float64)
        added += len(t)
        rec = records.setdefault(r, RadiusRecord())
        rec.counts += np.bincount(bucket_of(t), minlength=N_BUCKETS)
        rec.cum_counts += np.bincount(bucket_of(cum), minlength=N_BUCKETS)
        rec.n += len(t)
        rec.sum_ns += float(t.sum())
        rec.cum_sum_ns += float(cum.sum())
        rec.probes_total += int(st.probes[reached, r].sum())
        rec.empty_total += int(st.empty_buckets[reached, r].sum())
        rec.items_total += int(st.items[reached, r].sum())
        rec.empty_ball += int((cum_items[reached, r] == 0).sum())
    return added


class _FoldRows:
    """The per-query rows :meth:`CostTracker._fold` reads (``radii, lookup_ns, items, probes,
    empty_buckets``) of many SearchStats, one after the other, zero-padded to the widest: one
    ``np.concatenate`` per field when the widths agree (the usual case: one radius), where
    ``SearchStats.concat`` copies every part of every field in a Python loop (~20 us per
    single-query request at MAX_PENDING parts; issue 13)."""

    FIELDS = ("lookup_ns", "items", "probes", "empty_buckets")

    def __init__(self, batch: list):
        self.radii = np.concatenate([p.radii for p in batch])
        self.engine = np.concatenate([_per_query(p, "engine") for p in batch])
        self.k = np.concatenate([_per_query(p, "k") for p in batch])
        widths = {p.probes.shape[1] for p in batch}
        width = max(widths)
        for name in self.FIELDS:
            arrays = [getattr(p, name) for p in batch]
            if len(widths) == 1:
                out = np.concatenate(arrays)
            else:
                out = np.zeros((len(self.radii), width), dtype=arrays[0].dtype)
                row = 0
                for a in arrays:
                    out[row:row + len(a), :a.shape[1]] = a
                    row += len(a)
            setattr(self, name, out)


class CostTracker:
    """Accumulates the per-radius work counters of every search of one index (thread-safe)."""

    def __init__(self, bits: int):
        self.bits = bits
        self._lock = threading.Lock()
        self.radii: dict[int, RadiusRecord] = {}  # range queries, whatever engine ran them
        self.paper_radii: dict[int, RadiusRecord] = {}  # those that ran single-table probing
        self._samples = 0
        self.queries = 0
        self.knn_queries = 0
        self._pending: deque = deque()  # SearchStats not yet folded in (see drain)
        self._recent: list = []  # recent SearchStats for the query model
        self._recent_rows = 0
        self.calibrated_t0: float | None = None
        self.calibration: dict | None = None
        self._folds = 0  # batches folded in: the cached fits are of this many
        self._fits_cache: tuple[int, tuple] | None = None  # (folds, fits)
        self._engines_cache: tuple | None = None  # (key, engine report)

    def observe(self, st) -> None:
        """Queue a :class:`bucketsearch.index.probe.SearchStats` (O(1): the request does not pay for
        the bookkeeping; :meth:`drain` folds the queue in, on every read of the figures)."""
        if st is not None and len(st.radii):
            self._pending.append(st)  # deque.append is thread-safe
            if len(self._pending) > MAX_PENDING:
                self.drain()

    def drain(self) -> None:
        """Fold every queued SearchStats into the histograms and the t0 sums (one numpy pass
        over all of them)."""
        with self._lock:
            batch = []
            while self._pending:
                batch.append(self._pending.popleft())
            if batch:
                self._fold(batch)

    def _fold(self, batch: list) -> None:
        st = _FoldRows(batch) if len(batch) > 1 else batch[0]
        radii = np.asarray(st.radii)
        cum_ns = np.cumsum(st.lookup_ns, axis=1)
        cum_items = np.cumsum(st.items, axis=1)
        engine, k = _per_query(st, "engine"), _per_query(st, "k")
        ranged = k == 0  # a k-NN query is its own class: no per-radius row, no p50 moved
        self.queries += int(((radii > 0) & ranged).sum())
        self.knn_queries += int((~ranged).sum())
        self._samples += _fold_radii(self.radii, st, cum_ns, cum_items, ranged)
        # the paper's model: range queries that ran single-table probing (0: not recorded)
        _fold_radii(self.paper_radii, st, cum_ns, cum_items,
                    ranged & ((engine == ENGINES.index("single")) | (engine == 0)))
        self._folds += 1
        for one in batch:
            self._recent.append(one)
            self._recent_rows += len(one.radii)
        while self._recent_rows > EXTENDED_BUFFER_ROWS and len(self._recent) > 1:
            self._recent_rows -= len(self._recent.pop(0).radii)

    def set_calibration(self, t0: float | None, info: dict) -> None:
        with self._lock:
            self.calibrated_t0 = t0
            self.calibration = info

    def _observed(self, refit: bool = True) -> tuple:
        """``(radius_fit, query_model)`` over the recent searches (the model None before any),
        refit when searches were folded in since (``refit``) or when there is no fit yet."""
        self.drain()
        with self._lock:
            folds, recent, cached = self._folds, list(self._recent), self._fits_cache
        if cached is not None and (cached[0] == folds or not refit):
            return cached[1]
        paper = [p for p in (paper_rows(one) for one in recent) if p is not None]
        if paper:
            samples = CostSamples.from_stats(paper)
            fits = (t0_radius_fit(samples), fit_query_model(samples))
        else:
            fits = (radius_fit([], []), None)
        with self._lock:
            self._fits_cache = (folds, fits)
        return fits

    def observed_t0(self) -> T0Estimate:
        """``radius_fit`` over the recent searches."""
        return self._observed()[0]

    def observed_query_model(self):
        """``query_model`` over the recent searches (None before any)."""
        return self._observed()[1]

    def t0(self, refit: bool = False) -> tuple[float | None, str | None]:
        """The t0 to model with: the last calibration's ``radius_fit``, else the observed one
        (the last fit; ``refit``: refit first if new searches came in)."""
        if self.calibrated_t0 is not None:
            return self.calibrated_t0, CALIBRATION
        t0 = self._observed(refit)[0].t0_ns
        return (t0, OBSERVED) if t0 is not None else (None, None)

    def extended(self) -> dict | None:
        """The query model to show: the calibration's when there is one, else the observed
        one; ``source`` says which (None before any search or calibration)."""
        cal = self.calibration
        if cal is not None and cal.get("fits"):
            return {**cal["fits"]["query_model"],
                    "source": f"{CALIBRATION}: {cal['queries']} sampled queries at radii "
                              f"0..{cal['max_distance']}"}
        model = self.observed_query_model()
        if model is None:
            return None
        return {**model.to_dict(),
                "source": f"{OBSERVED}: the last {model.fit.samples} queries"}

    def estimates(self) -> list[dict]:
        """Every t0 estimate with its ``source``: the observed ``radius_fit`` and
        ``query_model.probes``, then the calibration's."""
        out = [{**self.observed_t0().to_dict(), "source": OBSERVED}]
        model = self.observed_query_model()
        if model is not None:
            out.append({**t0_from_query_model(model).to_dict(), "source": OBSERVED})
        cal = self.calibration
        if cal is not None and cal.get("t0_ns") is not None:
            out.append({"estimator": cal["estimator"], "t0_ns": cal["t0_ns"],
                        "ci_ns": cal["ci_ns"], "samples": len(cal["rounds"]),
                        "formula": "mean of the rounds' radius_fit t0; Student's t interval "
                                   "over the rounds", "confidence": CONFIDENCE,
                        "detail": {"rounds": cal["rounds"], "stable": cal["stable"],
                                   "verdict": cal["verdict"]}, "source": CALIBRATION})
        if cal is not None and cal.get("fits"):
            out += [{**e, "source": CALIBRATION} for e in cal["fits"]["t0"]]
        return out

    def engines(self, t0: float | None, paper: dict) -> dict | None:
        """:func:`bucketsearch.index.costmodel.engines.engine_report` of the recent searches (the
        model of what ran; None before any search), with the paper's ``t0`` (``radius_fit``) and
        verdict ``paper``; cached until new searches are folded in or ``t0`` changes."""
        self.drain()
        with self._lock:
            folds, recent, cached = self._folds, list(self._recent), self._engines_cache
        key = (folds, t0, tuple(paper.get("holds_at", ())), tuple(paper.get("fails_at", ())))
        if cached is not None and cached[0] == key:
            return cached[1]
        report = engine_report(QuerySamples.from_stats(recent), self.bits, t0,
                               RADIUS_FIT if t0 is not None else None, paper) if recent else None
        with self._lock:
            self._engines_cache = (key, report)
        return report

    def history(self) -> dict:
        """The figures kept across a restart (JSON): the per-radius records of every search so
        far (all range queries, and those of the paper's model) and the query counts. The fits
        of recent searches are not kept: they refit on the searches after the restart."""
        self.drain()
        with self._lock:
            return {"version": HISTORY_VERSION, "bits": self.bits, "queries": self.queries,
                    "knn_queries": self.knn_queries, "samples": self._samples,
                    "radii": {str(r): rec.to_json() for r, rec in self.radii.items()},
                    "paper_radii": {str(r): rec.to_json()
                                    for r, rec in self.paper_radii.items()}}

    def restore(self, history: dict) -> None:
        """Add a :meth:`history` (of an index of the same bits) to the figures; ValueError
        naming what does not fit."""
        if not isinstance(history, dict) or history.get("version") != HISTORY_VERSION:
            raise ValueError(f"cost history: version {HISTORY_VERSION} expected, got "
                             f"{history.get('version') if isinstance(history, dict) else history!r}")
        if history.get("bits") != self.bits:
            raise ValueError(f"cost history: bits {history.get('bits')!r}, the index has "
                             f"{self.bits}")
        with self._lock:
            for name in ("radii", "paper_radii"):
                records = getattr(self, name)
                for r, rec in history.get(name, {}).items():
                    records.setdefault(int(r), RadiusRecord()).add(RadiusRecord.from_json(rec))
            self.queries += int(history.get("queries", 0))
            self.knn_queries += int(history.get("knn_queries", 0))
            self._samples += int(history.get("samples", 0))

    def snapshot(self, paper: bool = False) -> dict[int, RadiusRecord]:
        """Per radius, the records of the range queries (``paper``: of those that ran
        single-table probing, what the paper's model is judged on)."""
        self.drain()
        with self._lock:
            return {r: rec.copy() for r, rec in (self.paper_radii if paper
                                                 else self.radii).items()}


    @property
    def samples(self) -> int:
        self.drain()
        return self._samples


def agreement(estimates: list[dict]) -> dict:
    """:func:`bucketsearch.index.costmodel.t0_agreement` of estimate dicts (named
    ``source/estimator``)."""
    return t0_agreement([T0Estimate(f"{e['source']}/{e['estimator']}", e["t0_ns"],
                                    tuple(e["ci_ns"]) if e["ci_ns"] else None, e["samples"],
                                    e["formula"]) for e in estimates])


#: rounds of a calibration: at least ``CALIBRATION_ROUNDS[0]``, then more until the interval
#: over the rounds is tight, at most ``CALIBRATION_ROUNDS[1]``
CALIBRATION_ROUNDS = (3, 8)
#: calls per radius and round: one query each up to this many queries, then batches (a
#: calibration of 100,000 queries is not 900,000 calls)
CALIBRATION_MAX_CALLS = 256
#: searches of each query and radius a calibration makes at most: a warm pass and the rounds
CALIBRATION_PASSES = 1 + CALIBRATION_ROUNDS[1]
#: "tight": the interval's half-width at most this fraction of t0
CALIBRATION_TIGHT = 0.10
CALIBRATION_ESTIMATOR = f"{RADIUS_FIT}, mean over repeated rounds"


def round_interval(values, confidence: float = CONFIDENCE) -> tuple[float, tuple | None]:
    """Mean of per-round estimates and Student's t interval over the rounds (None for one)."""
    v = np.asarray(values, dtype=np.float64)
    mean = float(v.mean())
    if len(v) < 2:
        return mean, None
    half = t_quantile((1 + confidence) / 2, len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(
        len(v))
    return mean, (mean - half, mean + half)


def calibrate(live, tracker: CostTracker, n_queries: int, radius: int, seed: int = 0,
              rounds: tuple[int, int] = CALIBRATION_ROUNDS,
              tight: float = CALIBRATION_TIGHT) -> float | None:
    """The paper's t0 of the index's single table (``live.paper_engine()``), repeated until it
    can be trusted; returns it (now the t0 the server models with) or None (no single table).

    ``n_queries`` sampled queries (``live.query_sample``) are searched at every radius
    0..``radius`` (so the per-probe cost can be told from the fixed cost per query) with
    statistics, as served searches run: one query per call (at most
    :data:`CALIBRATION_MAX_CALLS` calls per radius, in batches beyond; a batch keeps the
    caches warmer than served one-query requests find them: 4 ns a probe against 14.5 served,
    on the demo's data), one untimed round first (code compiled, table pages warm), then
    rounds of the same searches, each giving a ``radius_fit`` t0, until the interval over the
    rounds (Student's t, :func:`round_interval`) is within ``tight`` of
    the mean after at least ``rounds[0]`` rounds; after ``rounds[1]`` it is reported unstable
    with its interval. ``t0`` is the mean over the rounds (estimator
    :data:`CALIBRATION_ESTIMATOR`); :func:`bucketsearch.index.costmodel.fit_all` of every round's
    searches with the probe micro-benchmark is kept under ``fits``."""
    engine = live.paper_engine()
    info = {"queries": n_queries, "max_distance": radius, "seed": seed, "at": time.time(),
            "estimator": CALIBRATION_ESTIMATOR}
    if engine is None:
        info.update(t0_ns=None, ci_ns=None, stable=None, rounds=[], fits=None,
                    reason="no single table to time (multi-index hashing or a scan): the "
                           "paper's t0 is not calibrated; each engine's own model is fitted "
                           "on the searches it serves")
        tracker.set_calibration(None, info)
        return None
    xq = live.query_sample(n_queries, seed)

    calls = np.array_split(xq, min(len(xq), CALIBRATION_MAX_CALLS))

    def one_round():  # one query per call (as served searches mostly come), up to the cap
        return [engine.range_search(part, r, stats=True)[3]
                for r in range(radius + 1) for part in calls]

    one_round()  # warm: compiled code, the table's pages and caches, as served queries find them
    per_round, stats = [], []
    while len(per_round) < rounds[1]:
        st = one_round()
        per_round.append(t0_radius_fit(CostSamples.from_stats(st)).t0_ns)
        stats += st
        if len(per_round) >= rounds[0]:
            t0, ci = round_interval(per_round)
            if ci is not None and (ci[1] - ci[0]) / 2 <= tight * t0:
                break
    t0, ci = round_interval(per_round)
    stable = ci is not None and (ci[1] - ci[0]) / 2 <= tight * t0
    bench = probe_microbenchmark(engine.table, seed=seed) if engine.ntotal else None
    fits = json_safe(fit_all(CostSamples.from_stats(stats), live.bits, microbenchmark=bench))
    info.update(t0_ns=t0, ci_ns=None if ci is None else list(ci), stable=stable,
                rounds=per_round, engine=engine.kind, fits=fits,
                rule=f"rounds until the {round(100 * CONFIDENCE)}% interval over the rounds "
                     f"is within +-{tight:.0%} of t0 ({rounds[0]} to {rounds[1]} rounds)",
                verdict=(f"stable: {len(per_round)} rounds, t0 {t0:.3g} ns (CI {ci[0]:.3g} .. "
                         f"{ci[1]:.3g})" if stable else
                         f"unstable after {len(per_round)} rounds: t0 {t0:.3g} ns, interval "
                         + ("none" if ci is None else f"{ci[0]:.3g} .. {ci[1]:.3g}")
                         + " (a busy machine; recalibrate when it is quiet)"))
    tracker.set_calibration(t0, info)
    return t0


def json_safe(value):
    """``value`` with every non-finite float made None and numpy scalars Python numbers."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value
