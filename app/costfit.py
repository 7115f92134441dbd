"""Per-index cost bookkeeping: per-radius latency histograms and the t0 fit (pure, no I/O).

* ``t0`` (RAMAP's cost of one probe, Jiang, Li & Li): least squares through the origin of the
  measured per-radius lookup time against the probes of that radius,
  ``t0 = sum_j p_j t_j / sum_j p_j^2`` over every (query, radius) sample of every search since
  start (running sums, so exact over all of them; the formula of ``index.costmodel.fit_t0``,
  which fits calibration samples).
* the extended model: ``index.costmodel.fit_extended`` on the stats of the most recent searches
  (a bounded buffer of ``EXTENDED_BUFFER_ROWS`` queries).

Latencies go into log-spaced histograms (``SUB_BUCKETS`` buckets per power of two, about 4.4%
relative resolution), recorded with numpy in one call per search; quantiles are read from them
and the Prometheus collector exposes them as histograms with power-of-two boundaries.
"""
from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from bucketsearch.index.costmodel import fit_extended, fit_paper_model, fit_t0
from bucketsearch.index.probe import SearchStats

SUB_BUCKETS = 16  # per octave
OCTAVES = 40  # 1 ns .. 2^40 ns (about 18 minutes)
N_BUCKETS = SUB_BUCKETS * OCTAVES + 1
EXTENDED_BUFFER_ROWS = 20_000
MAX_PENDING = 1024  # queued searches folded in by the request that exceeds this


def bucket_of(ns: np.ndarray) -> np.ndarray:
    """Histogram bucket of each latency: ``floor(SUB_BUCKETS * log2(max(ns, 1)))``."""
    v = np.maximum(np.asarray(ns, dtype=np.float64), 1.0)
    return np.minimum((SUB_BUCKETS * np.log2(v)).astype(np.int64), N_BUCKETS - 1)


def bucket_upper_ns(b: np.ndarray | int) -> np.ndarray:
    return 2.0 ** ((np.asarray(b, dtype=np.float64) + 1) / SUB_BUCKETS)


@dataclass
class RadiusRecord:
    counts: np.ndarray = field(default_factory=lambda: np.zeros(N_BUCKETS, dtype=np.int64))
    n: int = 0
    sum_ns: float = 0.0
    probes_total: int = 0
    empty_total: int = 0

    def quantile(self, q: float) -> float | None:
        if self.n == 0:
            return None
        rank = max(int(math.ceil(q * self.n)), 1)
        b = int(np.searchsorted(np.cumsum(self.counts), rank))
        return float(bucket_upper_ns(b))


class CostTracker:
    """Accumulates the per-radius work counters of every search of one index (thread-safe)."""

    def __init__(self, bits: int):
        self.bits = bits
        self._lock = threading.Lock()
        self.radii: dict[int, RadiusRecord] = {}
        self._pt = 0.0  # sum p * t
        self._pp = 0.0  # sum p^2
        self._samples = 0
        self._pending: deque = deque()  # SearchStats not yet folded in (see drain)
        self._recent: list = []  # recent SearchStats for the extended model
        self._recent_rows = 0
        self.calibrated_t0: float | None = None
        self.calibration: dict | None = None

    def observe(self, st) -> None:
        """Queue a :class:`index.probe.SearchStats` (O(1): the request does not pay for the
        bookkeeping; :meth:`drain` folds the queue in, on every read of the figures)."""
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
        st = SearchStats.concat(batch) if len(batch) > 1 else batch[0]
        radii = np.asarray(st.radii)
        for r in range(st.probes.shape[1]):
            reached = radii > r
            if not reached.any():
                continue
            t = st.lookup_ns[reached, r].astype(np.float64)
            p = st.probes[reached, r].astype(np.float64)
            self._pt += float(p @ t)
            self._pp += float(p @ p)
            self._samples += len(t)
            rec = self.radii.setdefault(r, RadiusRecord())
            rec.counts += np.bincount(bucket_of(t), minlength=N_BUCKETS)
            rec.n += len(t)
            rec.sum_ns += float(t.sum())
            rec.probes_total += int(st.probes[reached, r].sum())
            rec.empty_total += int(st.empty_buckets[reached, r].sum())
        for one in batch:
            self._recent.append(one)
            self._recent_rows += len(one.radii)
        while self._recent_rows > EXTENDED_BUFFER_ROWS and len(self._recent) > 1:
            self._recent_rows -= len(self._recent.pop(0).radii)

    def set_calibration(self, t0: float | None, info: dict) -> None:
        with self._lock:
            self.calibrated_t0 = t0
            self.calibration = info

    def t0(self) -> tuple[float | None, str | None]:
        """The t0 to model with: the last calibration, else the fit over observed searches."""
        if self.calibrated_t0 is not None:
            return self.calibrated_t0, "calibration"
        if self._pending:
            self.drain()
        if self._pp > 0:
            return self._pt / self._pp, "observed searches"
        return None, None

    def extended(self) -> dict | None:
        """``index.costmodel.fit_extended`` over the recent searches (None before any)."""
        self.drain()
        with self._lock:
            recent = list(self._recent)
        if not recent:
            return None
        st = type(recent[0]).concat(recent)
        model = fit_extended(st)
        out = model.to_dict()
        out["source"] = (f"bucketsearch.index.costmodel.fit_extended over the last "
                         f"{len(st.radii)} queries")
        return out

    def snapshot(self) -> dict[int, RadiusRecord]:
        self.drain()
        with self._lock:
            return {r: RadiusRecord(rec.counts.copy(), rec.n, rec.sum_ns, rec.probes_total,
                                    rec.empty_total) for r, rec in self.radii.items()}

    @property
    def samples(self) -> int:
        self.drain()
        return self._samples


def sample_queries(live, n: int, seed: int) -> np.ndarray:
    """``n`` query words: half codes present in the index, half uniform random codes."""
    from bucketsearch.index.codes import pack_bits

    rng = np.random.default_rng(seed)
    state = live.state
    pool = [np.asarray(state.main.words)] if state.main.ntotal else []
    if len(state.delta_words):
        pool.append(state.delta_words)
    n_random = n if not pool else n // 2
    parts = [pack_bits(rng.integers(0, 2, size=(n_random, live.bits), dtype=np.uint8))]
    if pool:
        words = np.concatenate(pool) if len(pool) > 1 else pool[0]
        parts.append(words[rng.integers(0, len(words), size=n - n_random)])
    return np.ascontiguousarray(np.concatenate(parts))


def calibrate(live, tracker: CostTracker, n_queries: int, radius: int,
              seed: int = 0) -> float | None:
    """Fit t0 on sampled radius-``radius`` searches of the main table and store it.

    Single-table indexes use ``index.costmodel.fit_paper_model`` (t0, R^2 and relative errors of
    the cumulative model ``t0 * sum_{r<=R} C(Q, r)``); other modes fit t0 on the probes their
    stats report (substring probes for multi-index hashing)."""
    import time

    xq = sample_queries(live, n_queries, seed)
    main = live.state.main
    st = main.range_search(xq, radius, stats=True)[3]
    info = {"queries": n_queries, "max_distance": radius, "seed": seed, "at": time.time()}
    if getattr(main, "kind", "") == "single":
        paper = fit_paper_model(st, live.bits, radius)
        t0 = paper.t0_ns
        info["paper_model"] = {"r2": _finite(paper.r2), "max_rel_error":
                               _finite(paper.max_rel_error)}
    else:
        valid = np.arange(st.probes.shape[1])[None, :] < st.radii[:, None]
        t0 = fit_t0(st.probes[valid], st.lookup_ns[valid]) or None
    tracker.set_calibration(t0, info)
    return t0


def _finite(x):
    return None if x is None or not math.isfinite(x) else float(x)
