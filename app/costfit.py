"""Per-index cost bookkeeping: per-radius latency histograms and the t0 fit (pure, no I/O).

Until ``index.costmodel`` lands this module holds the fallback fit the server uses:

* ``t0`` (RAMAP's cost of one probe, Jiang, Li & Li): least squares through the origin of the
  measured per-radius lookup time against the probes of that radius,
  ``t0 = sum_j p_j t_j / sum_j p_j^2`` over every (query, radius) sample (:func:`fit_t0`).
* an extended model ``t = a * probes + b * nonempty_buckets + c * items`` fitted by least
  squares on the same samples (normal equations accumulated online).

Latencies go into log-spaced histograms (``SUB_BUCKETS`` buckets per power of two, about 4.4%
relative resolution), recorded with numpy in one call per search; quantiles are read from them
and the Prometheus collector exposes them as histograms with power-of-two boundaries.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np

SUB_BUCKETS = 16  # per octave
OCTAVES = 40  # 1 ns .. 2^40 ns (about 18 minutes)
N_BUCKETS = SUB_BUCKETS * OCTAVES + 1
EXTENDED_TERMS = ("probes", "nonempty_buckets", "items")


def fit_t0(probes: np.ndarray, lookup_ns: np.ndarray) -> float | None:
    """Least squares through the origin: ``argmin_t0 sum (t - t0 p)^2 = sum p t / sum p^2``."""
    p = np.asarray(probes, dtype=np.float64)
    t = np.asarray(lookup_ns, dtype=np.float64)
    den = float(p @ p)
    return float(p @ t) / den if den > 0 else None


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
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self.calibrated_t0: float | None = None
        self.calibration: dict | None = None

    def observe(self, st) -> None:
        """Record a :class:`index.probe.SearchStats` (only radii each query really searched)."""
        if st is None or not len(st.radii):
            return
        width = st.probes.shape[1]
        valid = np.arange(width)[None, :] < np.asarray(st.radii)[:, None]
        probes = st.probes[valid].astype(np.float64)
        t = st.lookup_ns[valid].astype(np.float64)
        radius = np.broadcast_to(np.arange(width), st.probes.shape)[valid]
        x = np.stack([probes, st.nonempty_buckets[valid].astype(np.float64),
                      st.items[valid].astype(np.float64)], axis=1)
        empty = st.empty_buckets[valid]
        buckets = bucket_of(t)
        with self._lock:
            self._pt += float(probes @ t)
            self._pp += float(probes @ probes)
            self._samples += len(t)
            self._xtx += x.T @ x
            self._xty += x.T @ t
            for r in np.unique(radius):
                sel = radius == r
                rec = self.radii.setdefault(int(r), RadiusRecord())
                np.add.at(rec.counts, buckets[sel], 1)
                rec.n += int(sel.sum())
                rec.sum_ns += float(t[sel].sum())
                rec.probes_total += int(st.probes[valid][sel].sum())
                rec.empty_total += int(empty[sel].sum())

    def set_calibration(self, t0: float | None, info: dict) -> None:
        with self._lock:
            self.calibrated_t0 = t0
            self.calibration = info

    def t0(self) -> tuple[float | None, str | None]:
        """The t0 to model with: the last calibration, else the fit over observed searches."""
        if self.calibrated_t0 is not None:
            return self.calibrated_t0, "calibration"
        if self._pp > 0:
            return self._pt / self._pp, "observed searches"
        return None, None

    def extended(self) -> tuple[list[float], int] | None:
        with self._lock:
            if self._samples < 3:
                return None
            coef, *_ = np.linalg.lstsq(self._xtx, self._xty, rcond=None)
            return [float(c) for c in coef], self._samples

    def snapshot(self) -> dict[int, RadiusRecord]:
        with self._lock:
            return {r: RadiusRecord(rec.counts.copy(), rec.n, rec.sum_ns, rec.probes_total,
                                    rec.empty_total) for r, rec in self.radii.items()}

    @property
    def samples(self) -> int:
        return self._samples


def sample_queries(live, n: int, seed: int) -> np.ndarray:
    """``n`` query words: half codes present in the index, half uniform random codes."""
    from index.codes import pack_bits

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


def calibrate(live, tracker: CostTracker, n_queries: int, radius: int, seed: int = 0) -> float | None:
    """Fit t0 on sampled radius-``radius`` searches and store it in ``tracker``."""
    import time

    xq = sample_queries(live, n_queries, seed)
    st = live.state.main.range_search(xq, radius, stats=True)[3]
    valid = np.arange(st.probes.shape[1])[None, :] < st.radii[:, None]
    t0 = fit_t0(st.probes[valid], st.lookup_ns[valid])
    tracker.set_calibration(t0, {"queries": n_queries, "max_distance": radius, "seed": seed,
                                 "at": time.time()})
    return t0
