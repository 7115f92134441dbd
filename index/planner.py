"""Cost-based planner (``mode="auto"``): single-table probing, multi-index hashing or the scan.

For a query batch and a radius R (or a k-NN search) the planner predicts the per-query cost of
the three exact paths from calibrated models and from the data, runs the cheapest, and records
the choice with the predicted costs in ``stats.plan`` (and in :attr:`AutoIndex.last_plan`).

Predicted per-query cost (ns), with per-step extended models fitted by
:func:`index.costmodel.fit_extended` on the index's own statistics:

* single table: ``o_s + sum_{r<=R} (c + a C(Q, r) + b E[nonempty_r] + d E[items_r])``;
* multi-index:  ``o_m + sum_{R'<=R} (c + a C(w_j, s) + b E[nonempty_{j,s}] + d E[items_R']
  + e E[candidates_{j,s}])`` with ``j = R' mod m``, ``s = floor(R'/m)`` (one substring shell per
  radius step, see :mod:`index.mih`);
* scan: ``t_item * N``; a k-NN scan of one-word codes (:func:`index.scan._knn_word_kernel`,
  blocked over the queries): ``N (c + s / q) + e k (1 + ln(N / k))`` per query, ``q`` the
  queries sharing a pass over the items (the batch, per thread, at most
  :data:`~index.scan.KNN_QUERY_BLOCK`), ``c`` the popcount per item, ``s`` the items' stream
  from memory, ``e`` the cost of a kept item (about ``k (1 + ln(N / k))`` of them: the k-th
  distance so far is beaten by ~k/i of the i-th item's peers).

plus the per-query time outside the radius phases (``total_ns - sum lookup_ns``: sorting and
emitting the results), ``o0 + o1 * work`` with work = results (single) or candidates (mih). At
the calibrated radii the model is corrected to the cost measured there (``measured / modeled``
per radius, measured = a radius-r search of the calibration queries as served, without
statistics: the least of 3 runs interleaved with the other paths', less the per-call overhead,
per query; beyond the last calibrated radius the last correction carries on), so noise in the
fitted coefficients cannot move a prediction away from what was measured. The per-call
overhead is a one-query search's wall time without statistics less the kernel's own time.

The expectations come from a *data profile* made at calibration: for the sampled queries, the
histograms of distances to (a sample of) the items and to the distinct codes of the single
table, and of substring distances to the items and to the distinct substring codes of every
table, scaled to N. So the occupancy of the tables (how many items a bucket holds, how many
buckets are empty), N and Q all enter the prediction; the calibration queries stand for the
batches to come (:meth:`AutoIndex.calibrate` accepts real queries to re-profile).

A single-table plan is never chosen when its exact probe count exceeds ``max_probes``, nor a
multi-index range search over its own limit (k-NN by multi-index never fails: it switches to a
scan, see :mod:`index.mih`). k-NN plans use the radius ``R_k``, the smallest with
``E[items within R_k] >= k``. A k-NN plan of one-word codes (multi-index or scan) runs every query
by the multi-index first under a time budget (:func:`index.mih_knn.knn_search`): the plan
multi-index, ``min(S, max(S / 8, 2 P))`` (S the scan's predicted cost, P the multi-index's);
the plan scan, ``S / 16``. A query over it is given up and answered by the blocked scan with
the others given up: a query far from the items costs at most the budget more than the scan,
one near them microseconds, whatever the profile expected (the profile's R_k is that of the
calibration queries, and a sampled profile misses near duplicates).
"""
from __future__ import annotations

import math
import os
import platform
import time
from functools import partial

import numba
import numpy as np

from bucketsearch.index._jit import njit, popcount64
from bucketsearch.index._jit import default_threads
from bucketsearch.index.base import (DEFAULT_MAX_PROBES, PARALLEL_MIN_QUERIES, IndexBase,
                                     ProbeLimitError)
from bucketsearch.index.codes import check_bits, n_words
from bucketsearch.index.fits.paper import PaperModel, fit_paper_model
from bucketsearch.index.fits.stepmodel import ExtendedModel, fit_extended
from bucketsearch.index.disk.hugepages import wait_for_collapse
from bucketsearch.index.mih import MultiIndex
from bucketsearch.index.mih_knn import knn_search
from bucketsearch.index.mih_tables import ids_order_words
from bucketsearch.index.pool import run_parts
from bucketsearch.index.probe import HammingIndex
from bucketsearch.index.scan import KNN_QUERY_BLOCK, LinearScan
from bucketsearch.index.item_table import ItemTable
from bucketsearch.index.kernels import run_bounds_at
from bucketsearch.index.table import sort_items

PLAN_MODES = ("single", "mih", "scan")
DEFAULT_CALIBRATION_QUERIES = 64
CALIBRATION_PROBE_BUDGET = 50_000   # per query, single table and multi-index each
CALIBRATION_MAX_RADIUS = 8
PROFILE_SAMPLE = 200_000            # items (and distinct codes) the profile compares against
SCAN_CALIBRATION_QUERIES = 4
#: items of the k-NN scan's batch calibration (its per-item compute cost)
SCAN_KNN_CALIBRATION_ITEMS = 1 << 20
SCAN_CALIBRATION_ITEMS = 1 << 22  # a scan's cost per item is timed on at most this many
#: items a one-query k-NN scan's stream from memory is timed over: 128 MB of 64-bit codes, 4x
#: this machine's last-level cache (timed over 4M items, 32 MB, the best of three runs found
#: them cached, and a 20M scan took up to 1.7x its prediction)
SCAN_STREAM_ITEMS = 1 << 24
CALIBRATION_REPEATS = 5             # per-sample minimum over repeated, interleaved runs
SERVED_REPEATS = 3                  # rounds of each batch timed as served (the least)
#: how a calibration state's costs were timed (:meth:`AutoIndex.restore_calibration` takes back
#: only states timed this way): searches as served, without statistics
CALIBRATION_TIMED = "as served"
#: seconds a calibration waits at most for the last build's arrays to be in huge pages
CALIBRATION_COLLAPSE_WAIT = 30.0
CALL_REPEATS = 50                   # rounds of the per-call overhead's minimum

#: Models used before any calibration (an empty index): a 20 ns probe, a 2 ns scanned item.
DEFAULT_COEF = {
    "single": {"const": 50.0, "probes": 20.0, "nonempty_buckets": 20.0, "items": 5.0},
    "mih": {"const": 50.0, "probes": 20.0, "nonempty_buckets": 20.0, "items": 5.0,
            "candidates": 10.0},
}
DEFAULT_OVERHEAD_NS = 300.0
#: k-NN by multi-index hashing (:mod:`index.mih_knn`) before calibration: ns per substring
#: probe and per candidate verified
DEFAULT_KNN_COEF = (20.0, 5.0)
#: k of the k-NN run of the calibration queries that fits those two costs
KNN_CALIBRATION_K = 64
#: calibration queries of that k-NN run: each is a k = 64 search of near queries (milliseconds
#: at 500k items), so the fit takes a few of them, not all (all of them took 5 of a merge's 8 s)
KNN_CALIBRATION_QUERIES = 8
DEFAULT_SCAN_NS_PER_ITEM = 2.0
#: the k-NN scan's ``(c, s, e)`` before calibration: ns per item per query, ns per item per
#: pass (the stream), ns per kept item (the module docstring)
DEFAULT_SCAN_KNN = (0.1, 0.2, 100.0)
#: a multi-index k-NN query's work budget: at least this share of the scan's predicted cost
KNN_MIH_BUDGET_SHARE = 1 / 8
#: the work budget of the multi-index try that precedes a k-NN scan, as a share of its cost
KNN_MIH_TRY_SHARE = 1 / 16
#: the k-NN stop radius's distribution (AutoIndex.knn_radius_weights) drops a tail this small
KNN_TAIL = 1e-4
#: a query is given up only once its modeled work (probes, candidates) passes this share of
#: its budget too (the model underestimates far queries' time 2-5x; a preempted near query
#: has its time inflated, not its work)
KNN_MIH_MIN_WORK_SHARE = 1 / 8


def _trimmed(within: np.ndarray, n: int) -> np.ndarray:
    """``within`` (queries x radii, cumulative counts) without the radii past the first at
    which every query counts all ``n`` items (a reader takes the last column beyond it)."""
    full = np.flatnonzero((within >= n - 0.5).all(axis=0))
    return np.round(within[:, :full[0] + 1 if len(full) else within.shape[1]], 3)


@njit
def _distance_histograms(xq, data, weights, max_d):
    """``(nq, max_d + 1)``: the sum of ``weights[i]`` over the ``data`` rows ``i`` at each
    Hamming distance from each query."""
    nq, W = xq.shape
    out = np.zeros((nq, max_d + 1), dtype=np.float64)
    for qi in range(nq):
        for i in range(data.shape[0]):
            d = 0
            for w in range(W):
                d += popcount64(xq[qi, w] ^ data[i, w])
            out[qi, d] += weights[i]
    return out


def _distinct_sample(words: np.ndarray, size: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Rows standing for the distinct codes of the code-sorted ``words`` and their weights:
    every distinct code (weight 1) when ``words`` has at most ``size`` rows, else ``size``
    random rows, each weighted ``n / (size x its code's count)`` (Horvitz-Thompson: a code is
    drawn with probability ``count / n``, so the weighted count of codes at a distance is
    unbiased), found by a galloping search from the row's position: no pass over the items."""
    n = len(words)
    if n <= size:
        new = np.ones(n, dtype=bool)
        new[1:] = np.any(words[1:] != words[:-1], axis=1)
        distinct = np.ascontiguousarray(words[new])
        return distinct, np.ones(len(distinct))
    at = rng.integers(0, n, size)
    rows = np.ascontiguousarray(words[at])
    first, end = run_bounds_at(words, at)
    return rows, n / (size * (end - first).astype(np.float64))


def machine_fingerprint() -> str:
    """The machine a calibration was timed on: host name, CPU model and count."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.node()}|{model or platform.processor()}|{os.cpu_count()}"


def _sample_rows(arr: np.ndarray, size: int, rng) -> tuple[np.ndarray, float]:
    """At most ``size`` rows of ``arr`` and the scale ``len(arr) / rows``."""
    if len(arr) <= size:
        return np.ascontiguousarray(arr), 1.0
    idx = np.sort(rng.choice(len(arr), size, replace=False))
    return np.ascontiguousarray(arr[idx]), len(arr) / size


def _fit_overhead(rest_ns, work) -> tuple[float, float]:
    """``(o0, o1)`` of the per-query time outside the radius phases, ``o0 + o1 * work``
    (``work``: results for the single table, unique candidates for mih: what is sorted and
    emitted at the end), by least squares with both coefficients kept >= 0."""
    y = np.asarray(rest_ns, dtype=np.float64)
    x = np.asarray(work, dtype=np.float64)
    if len(y) == 0:
        return (DEFAULT_OVERHEAD_NS, 0.0)
    if np.ptp(x) > 0:
        o1, o0 = np.polyfit(x, y, 1)
        if o0 >= 0 and o1 >= 0:
            return (float(o0), float(o1))
        if o1 > 0:  # negative intercept: through the origin
            return (0.0, float(max((x @ y) / (x @ x), 0.0)))
    return (float(max(np.median(y), 0.0)), 0.0)


def _rounds(repeats: int) -> int:
    """A calibration's rounds: ``repeats``, or 1 when the kernels run as plain Python
    (``NUMBA_DISABLE_JIT``, the coverage run: its timings mean nothing, and each round of
    searches takes seconds)."""
    return 1 if numba.config.DISABLE_JIT else repeats


def _call_overheads(indexes: dict, xq1, repeats: int = CALL_REPEATS) -> dict:
    """Per-call time outside the kernel's queries of every ``indexes[mode]``: the least wall
    time of a one-query radius-0 search as served (without statistics: with them a call also
    assembles them, ~10 us of a ~3 us call) less the least ``total_ns`` of that query, the
    kernel's own clock in a search with statistics.

    The minima over ``repeats`` rounds (``total_ns``: the first :data:`CALIBRATION_REPEATS`),
    the modes in turn in every round (as :func:`_interleaved_min_stats`), so noise does not
    decide a single query's plan; a mode that evicts the caches (the scan reads every item)
    would inflate the next one's call, so such modes go in a round of their own after the
    others (``indexes`` order)."""
    wall = dict.fromkeys(indexes, float("inf"))
    work = dict.fromkeys(indexes, float("inf"))
    groups = [[m for m in indexes if m != "scan"], [m for m in indexes if m == "scan"]]
    for group in groups:
        for i in range(repeats):
            for mode in group:
                t = time.perf_counter_ns()
                indexes[mode].range_search(xq1, 0)
                wall[mode] = min(wall[mode], time.perf_counter_ns() - t)
                if i < CALIBRATION_REPEATS:
                    st = indexes[mode].range_search(xq1, 0, stats=True)[3]
                    work[mode] = min(work[mode], float(st.total_ns.sum()))
    return {mode: max(wall[mode] - work[mode], 0.0) for mode in indexes}


def _interleaved_min_batch_ns(jobs: dict, repeats: int) -> dict:
    """The least wall time (ns) of every ``jobs[key] = (index, xq, R)`` batch searched as
    served (no statistics), over ``repeats`` rounds with the jobs in turn in every round, each
    timed right after a run of its own (else a small radius timed after a large one's search
    measured the caches that search emptied: 3-9x a radius-0 batch's time)."""
    best = dict.fromkeys(jobs, float("inf"))
    for _ in range(repeats):
        for key, (index, xq, R) in jobs.items():
            index.range_search(xq, R)
            t = time.perf_counter_ns()
            index.range_search(xq, R)
            best[key] = min(best[key], time.perf_counter_ns() - t)
    return best


def _interleaved_min_stats(jobs: dict, repeats: int) -> dict:
    """Range-search statistics of every ``jobs[mode] = (index, xq, R)`` with each (query,
    radius) time the minimum over ``repeats`` runs. The counts are deterministic and a time can
    only be inflated (preemption on a shared machine, a cold cache), so the minimum is the cost
    of the work; the modes run in turn in every round, so a load that comes and goes hits them
    alike and does not decide the plan."""
    for index, xq, R in jobs.values():
        index.range_search(xq[:1], R)  # compiled, warm
    out = {}
    for _ in range(repeats):
        for mode, (index, xq, R) in jobs.items():
            st = index.range_search(xq, R, stats=True)[3]
            if mode not in out:
                out[mode] = st
            else:
                out[mode].lookup_ns = np.minimum(out[mode].lookup_ns, st.lookup_ns)
                out[mode].total_ns = np.minimum(out[mode].total_ns, st.total_ns)
    return out


def _best_thread_ns(run, repeats: int = CALIBRATION_REPEATS) -> float:
    """Best thread CPU time of ``run()`` over ``repeats`` runs, in ns (one-thread runs)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time_ns()
        run()
        best = min(best, time.thread_time_ns() - t)
    return float(best)


def calibration_queries(words: np.ndarray, bits: int, nq: int, seed: int = 0,
                        max_flips: int = 3) -> np.ndarray:
    """Database codes with ``0..max_flips`` random bits flipped (uniformly many): the default
    stand-in for the batches to come."""
    from bucketsearch.index.codes import word_widths
    rng = np.random.default_rng(seed)
    xq = words[rng.integers(0, len(words), nq)].copy()
    widths = word_widths(bits)
    for row in xq:
        for j in rng.choice(bits, size=min(int(rng.integers(0, max_flips + 1)), bits),
                            replace=False):
            w = int(j) // 64
            row[w] ^= np.uint64(1) << np.uint64(widths[w] - 1 - int(j) % 64)
    return xq


class AutoIndex(IndexBase):
    """Exact search that picks, per batch, the cheapest of single table, multi-index, scan.

    Holds a :class:`~index.probe.HammingIndex`, a :class:`~index.mih.MultiIndex` and a
    :class:`~index.scan.LinearScan` over one copy of the items: the codes and ids sorted once by
    (code, id) (:func:`index.table.sort_items`), the multi-index's ``words`` and ``ids``, which
    are also the single table's ``ids`` and the scan's items. Every rebuild (add/remove)
    re-calibrates unless ``calibrate_on_build=False``.
    """

    kind = "auto"
    sorted_by_code = True

    def __init__(self, bits: int, substrings: int | None = None,
                 max_probes: int = DEFAULT_MAX_PROBES,
                 calibration_queries: int = DEFAULT_CALIBRATION_QUERIES,
                 calibrate_on_build: bool = True, seed: int = 0):
        bits = check_bits(bits)
        self.single = HammingIndex(bits, max_probes=max_probes)
        self.mih = MultiIndex(bits, substrings=substrings, max_probes=max_probes)
        self.scan = LinearScan(bits)
        super().__init__(bits)
        if isinstance(calibration_queries, bool) or not isinstance(calibration_queries, int) \
                or calibration_queries < 1:
            raise ValueError(f"calibration_queries must be an int >= 1, got "
                             f"{calibration_queries!r}")
        self.calibration_queries = calibration_queries
        self.calibrate_on_build = calibrate_on_build
        self.seed = seed
        self._last_plan: tuple = (None, None)  # (plan, batch size): last_plan
        self._set_default_models()

    # ------------------------------------------------------------------ plumbing
    @property
    def threads(self):
        return self._threads

    @threads.setter
    def threads(self, value):
        self._threads = value
        for child in (self.single, self.mih, self.scan):
            child.threads = value

    @property
    def max_probes(self) -> int:
        return self.single.max_probes

    @max_probes.setter
    def max_probes(self, value: int) -> None:
        self.single.max_probes = self.mih.max_probes = int(value)

    @property
    def substrings(self) -> int:
        return self.mih.substrings

    @property
    def ntotal(self) -> int:
        return self.mih.ntotal

    @property
    def ids(self) -> np.ndarray:
        return self.mih.ids

    @property
    def words(self) -> np.ndarray:
        return self.mih.words

    def memory_bytes(self) -> int:
        """Bytes of every array of the three engines, a shared one counted once."""
        arrays = {**self.single.memory_arrays(), **self.mih.memory_arrays(),
                  **self.scan.memory_arrays()}
        return sum(a.nbytes for a in arrays.values())

    def probe_count(self, max_distance: int, nq: int = 1) -> int:
        """Bucket lookups per query of the engine the plan of a radius-``max_distance`` search
        of ``nq`` queries runs: its ``probe_count`` (0 for the scan). Plans over
        ``max_probes`` are never chosen, so this is at most ``max_probes``."""
        mode = self.plan(max_distance=max_distance, nq=nq)["mode"]
        return self._index_for(mode).probe_count(max_distance)

    def _rebuild(self, words, ids):
        words = np.asarray(words, dtype=np.uint64).reshape(-1, n_words(self.bits))
        # one sort, one copy for the three
        sorted_words, sorted_ids = sort_items(words, ids, self.build_threads)
        self._rebuild_sorted(sorted_words, sorted_ids, id_words=ids_order_words(words, ids))

    def _rebuild_sorted(self, words: np.ndarray, ids: np.ndarray, id_words=None,
                        tables=None) -> None:
        """The three engines over items already sorted by (code, id), sharing the arrays; on
        two threads or more the single table is filled beside the multi-index's tables
        (``id_words``, ``tables``: :meth:`MultiIndex._rebuild_sorted`)."""
        threads = self.build_threads
        if threads > 1:
            run_parts([partial(self.mih._rebuild_sorted, words, ids, id_words, threads - 1,
                               tables),
                       partial(self.single._rebuild_sorted, words, ids)])
        else:
            self.mih._rebuild_sorted(words, ids, id_words, tables=tables)
            self.single._rebuild_sorted(words, ids)
        self.scan.share(words, ids)
        if self.calibrate_on_build:
            self.calibrate()
        else:
            self._set_default_models()

    # ------------------------------------------------------------------ calibration
    def _set_default_models(self):
        self.models = {mode: ExtendedModel(tuple(coef), dict(coef))
                       for mode, coef in DEFAULT_COEF.items()}
        self.overhead_ns = {"single": (DEFAULT_OVERHEAD_NS, 0.0),
                            "mih": (DEFAULT_OVERHEAD_NS, 0.0)}
        self.scan_ns_per_item = DEFAULT_SCAN_NS_PER_ITEM
        self.knn_coef = DEFAULT_KNN_COEF
        self.scan_knn = DEFAULT_SCAN_KNN
        self.call_ns = dict.fromkeys(PLAN_MODES, 0.0)
        self.correction = {}
        self.paper = None
        self.calibrated = False
        self.calibration = {"calibrated": False, "reason": "not calibrated: default models"}
        self._profile_defaults()
        self._plan_cache = {}

    def _profile_defaults(self):
        """Data expectations of uniform codes: ``N C(Q, d) / 2^Q`` items at distance d."""
        n = self.ntotal
        q = self.bits
        self.items_d = np.array([n * math.comb(q, d) / 2 ** q for d in range(q + 1)])
        self.items_within_q = np.cumsum(self.items_d)[None, :]
        self.codes_d = np.minimum(self.items_d, [math.comb(q, d) for d in range(q + 1)])
        self.sub_items, self.sub_codes = [], []
        for w in self.mih.sub_widths:
            w = int(w)
            it = np.array([n * math.comb(w, r) / 2 ** w for r in range(w + 1)])
            self.sub_items.append(it)
            self.sub_codes.append(np.minimum(it, [math.comb(w, r) for r in range(w + 1)]))

    def profile(self, xq: np.ndarray) -> None:
        """Expected per-distance counts for queries like ``xq`` (see the module docstring)."""
        rng = np.random.default_rng(self.seed)
        data, scale = _sample_rows(self.mih.words, PROFILE_SAMPLE, rng)
        per_query = _distance_histograms(xq, data, np.full(len(data), scale), self.bits)
        self.items_d = per_query.mean(axis=0)
        self.items_within_q = np.cumsum(per_query, axis=1)
        codes, weights = _distinct_sample(self.mih.words, PROFILE_SAMPLE, rng)
        self.codes_d = _distance_histograms(xq, codes, weights, self.bits).mean(axis=0)
        qsubs = self.mih.substring_codes(xq)
        dsubs = self.mih.substring_codes(data)
        self.sub_items, self.sub_codes = [], []
        for j in range(self.mih.substrings):
            w = int(self.mih.sub_widths[j])
            qj = np.ascontiguousarray(qsubs[:, j:j + 1])
            self.sub_items.append(_distance_histograms(
                qj, np.ascontiguousarray(dsubs[:, j:j + 1]),
                np.full(len(data), self.ntotal / max(len(data), 1)), w).mean(axis=0))
            values, weights = self.mih.distinct_substring_sample(j, PROFILE_SAMPLE, rng)
            self.sub_codes.append(_distance_histograms(
                qj, np.ascontiguousarray(values.reshape(-1, 1)), weights, w).mean(axis=0))

    def calibrate(self, queries=None, n_queries: int | None = None) -> dict:
        """Fit the planner's models on sampled queries (default: database codes with 0-3 bits
        flipped) and re-profile the data, once the arrays of the last build are in huge pages
        (:func:`bucketsearch.index.disk.hugepages.wait_for_collapse`, at most
        :data:`CALIBRATION_COLLAPSE_WAIT` s: the timings are those of the memory it serves
        from). Returns a summary (also in :attr:`calibration`)."""
        self._plan_cache = {}
        wait_for_collapse(CALIBRATION_COLLAPSE_WAIT)
        if self.ntotal == 0:
            self._set_default_models()
            self.calibration["reason"] = "empty index: default models"
            return self.calibration
        n_queries = n_queries or self.calibration_queries
        if queries is None:
            xq = calibration_queries(self.mih.words, self.bits, n_queries, seed=self.seed)
        else:
            xq = self._check_queries(queries)
        saved = self._threads
        self.threads = 1
        try:
            self.profile(xq)
            self.correction = {}
            summary = {"calibrated": True, "queries": len(xq)}
            jobs = {}
            for mode, index in (("single", self.single), ("mih", self.mih)):
                R = 0
                budget = min(CALIBRATION_PROBE_BUDGET, index.max_probes)
                while R < min(self.bits, CALIBRATION_MAX_RADIUS) and \
                        index.probe_count(R + 1) <= budget:
                    R += 1
                for r in range(R + 1):  # radius-r searches: their measured cost
                    jobs[(mode, r)] = (index, xq, r)
            # a scan's cost is linear in the items: timed on a prefix of them (a restart of a
            # 100M index timed three passes over all of them per query)
            scan, scanned = self._prefix_scan(SCAN_CALIBRATION_ITEMS)
            jobs[("scan", 0)] = (scan, xq[:SCAN_CALIBRATION_QUERIES], 0)
            measured_stats = _interleaved_min_stats(jobs, _rounds(CALIBRATION_REPEATS))
            self.call_ns = _call_overheads({m: scan if m == "scan" else self._index_for(m)
                                            for m in PLAN_MODES}, xq[:1], _rounds(CALL_REPEATS))
            summary["call_overhead_ns"] = dict(self.call_ns)
            batch_ns = _interleaved_min_batch_ns(
                {key: job for key, job in jobs.items() if key[0] != "scan"},
                _rounds(SERVED_REPEATS))
            for mode in ("single", "mih"):
                R = max(r for m, r in jobs if m == mode)
                st = measured_stats[(mode, R)]
                self.models[mode] = fit_extended(st, relative=True)
                reached = np.arange(st.lookup_ns.shape[1])[None, :] < st.radii[:, None]
                lookup = np.where(reached, st.lookup_ns, 0).sum(axis=1)
                work = np.where(reached, st.unique_candidates if mode == "mih" else st.items,
                                0).sum(axis=1)
                self.overhead_ns[mode] = _fit_overhead(st.total_ns - lookup, work)
                # measured cost a query of a radius-r search of these queries as served
                # (without statistics, whose own cost at radius 0 was 6x the single table's
                # search and 1.7x the multi-index's), the call's overhead taken out, r <= R
                measured = np.array([max((batch_ns[(mode, r)] - self.call_ns[mode]) / len(xq),
                                         1.0) for r in range(R + 1)])
                self.correction[mode] = [
                    float(measured[r] / max(self.modeled(mode, r), 1.0)) for r in range(R + 1)]
                summary[mode] = {"radius": R, "model": self.models[mode].to_dict(),
                                 "overhead_ns": self.overhead_ns[mode],
                                 "measured_ns": measured.tolist(),
                                 "correction": self.correction[mode]}
                if mode == "single":
                    self.paper = fit_paper_model(st, self.bits)
                    summary["paper"] = self.paper.to_dict()
            st = measured_stats[("scan", 0)]
            self.scan_ns_per_item = float(np.median(st.total_ns)) / scanned
            summary["scan"] = {"ns_per_item": self.scan_ns_per_item}
            self.knn_coef = self._fit_knn(xq)
            summary["mih_knn"] = {"ns_per_probe": self.knn_coef[0],
                                  "ns_per_candidate": self.knn_coef[1]}
            # a k-NN scan keeps a top-k (the radius-0 scan above does not): timed apart
            self.scan_knn = self._fit_scan_knn(xq)
            summary["scan"]["knn"] = dict(zip(("ns_per_item", "ns_per_item_pass",
                                               "ns_per_kept"), self.scan_knn))
        finally:
            self.threads = saved
        self.calibrated = True
        self.calibration = summary
        return summary

    def _fit_scan_knn(self, xq) -> tuple[float, float, float]:
        """``(c, s, e)`` of the k-NN scan's cost (the module docstring): ``c`` from the
        calibration queries (a batch of up to :data:`KNN_QUERY_BLOCK`, sharing each pass) with
        k = 1 over the first :data:`SCAN_KNN_CALIBRATION_ITEMS` items (a compute cost: cached
        or not, the same per item), ``e`` from the same with k = :data:`KNN_CALIBRATION_K`
        (``+ e k (1 + ln(N / k))`` per query), ``s`` from one query with k = 1 over the first
        :data:`SCAN_STREAM_ITEMS` items (``c + s`` per item: the stream from memory); each
        the best thread CPU time of :data:`CALIBRATION_REPEATS` runs, every coefficient kept
        >= 0."""
        batch = xq[:KNN_QUERY_BLOCK]
        q = len(batch)
        part, m = self._prefix_scan(SCAN_KNN_CALIBRATION_ITEMS)
        shared = _best_thread_ns(lambda: part.search(batch, 1)) / q / m
        k = min(KNN_CALIBRATION_K, m)
        with_k = _best_thread_ns(lambda: part.search(batch, k)) / q
        stream, streamed = self._prefix_scan(SCAN_STREAM_ITEMS)
        one = _best_thread_ns(lambda: stream.search(xq[:1], 1)) / streamed
        e = max(with_k - shared * m, 0.0) / (k * (1 + math.log(m / k)))
        return (shared, max(one - shared, 0.0), e)

    def scan_knn_predicted(self, k: int, nq: int) -> float:
        """Predicted ns per query of a k-NN scan of a batch of ``nq`` queries (the module
        docstring's model; the batch split over the threads as :func:`index.base.run_chunked`
        does)."""
        n = max(self.ntotal, 1)
        threads = 1 if nq < PARALLEL_MIN_QUERIES else self._threads or default_threads()
        q = max(1, min(-(-max(nq, 1) // max(threads, 1)), KNN_QUERY_BLOCK))
        c, s, e = self.scan_knn
        kk = max(1, min(k, n))
        return n * (c + s / q) + e * kk * (1 + math.log(n / kk))

    def _prefix_scan(self, items: int) -> tuple[LinearScan, int]:
        """A scan the calibration times and its item count: the index's own, or one over
        the first ``items`` of its items (shared, not copied)."""
        m = min(self.ntotal, items)
        if m == self.ntotal:
            return self.scan, m
        part = LinearScan(self.bits)
        part.threads = 1  # (the calibration's thread CPU time counts the calling thread's)
        part.share(self.mih.words[:m], self.mih.ids[:m])
        return part, m

    def _fit_knn(self, xq) -> tuple[float, float]:
        """``(ns per probe, ns per candidate)`` of multi-index k-NN: :data:`DEFAULT_KNN_COEF`
        scaled by ``t / sum(f)``, ``t`` the thread CPU time of a k = :data:`KNN_CALIBRATION_K`
        search of :data:`KNN_CALIBRATION_QUERIES` calibration queries and ``f`` their cost
        under the default coefficients (one factor: probes and candidates grow together, a
        two-term fit of them is ill-conditioned); the least of two such scales, each timed on
        queries not searched before (CPU time, not the kernel's wall clock, which a loaded
        machine inflates). A query's buckets are in the caches once searched: a repeat of the
        same queries took half the time, and the fit was 2x under the measured costs.
        Queries that switched to a scan are left out."""
        k = min(KNN_CALIBRATION_K, self.ntotal)
        a, b = DEFAULT_KNN_COEF
        scales = []
        for part in (xq[:KNN_CALIBRATION_QUERIES],
                     xq[KNN_CALIBRATION_QUERIES:2 * KNN_CALIBRATION_QUERIES]):
            if len(part) == 0:
                continue
            t = time.thread_time_ns()
            self.mih.search(part, k)
            t = time.thread_time_ns() - t
            st = self.mih.search(part, k, stats=True)[2]
            keep = st.scanned_from < 0
            if not keep.all():  # the kept queries timed again (warm: the best available)
                t = _best_thread_ns(lambda: self.mih.search(part[keep], k), 1) if keep.any() else 0
            f = float((a * st.probes.sum(axis=1) + b * st.candidates.sum(axis=1))[keep].sum())
            if f > 0 and t > 0:
                scales.append(t / f)
        if not scales:
            return DEFAULT_KNN_COEF
        return a * min(scales), b * min(scales)

    def knn_predicted(self, R: int) -> float:
        """Predicted ns of a multi-index k-NN query that stops at radius step ``R``: the mih
        per-query overhead plus ``a * probes + b * candidates`` of steps ``0..R`` (from the
        profile; ``a, b`` of :meth:`_fit_knn`)."""
        f = self._features("mih", R)
        a, b = self.knn_coef
        return self.overhead_ns["mih"][0] + a * float(np.sum(f["probes"])) \
            + b * float(np.sum(f["candidates"]))

    # ------------------------------------------------------------------ prediction
    def knn_radius(self, k: int) -> int:
        """Smallest R with ``E[items within R] >= min(k, N)`` (the k-NN stop radius)."""
        need = min(k, self.ntotal)
        cum = np.cumsum(self.items_d)
        hit = np.flatnonzero(cum >= need - 1e-9)
        return int(hit[0]) if len(hit) else self.bits

    def knn_radius_weights(self, k: int, max_distance: int | None = None) -> list:
        """``[(R, P(D = R))]``: the distribution of the radius D a k-NN search stops at (the
        k-th neighbour's distance, at most ``max_distance``), over queries like the profile's:
        the items within R of the profile's query q taken as Poisson with its sampled mean
        ``items_within_q[q, R]``, ``P(D <= R) = mean_q P(Poisson >= min(k, N))``; a tail under
        :data:`KNN_TAIL` goes to the last radius kept. A k-NN search's cost grows steeply
        with R, and the stop radius differs from query to query (clustered data): the expected
        cost is the weighted sum, not the cost at the mean radius (3x under the measured mean
        of 32-bit codes; the single table chosen at 70 us a query for the multi-index's 2-4 us
        on clustered codes)."""
        from scipy.special import pdtr  # Poisson CDF, vectorised
        need = min(k, self.ntotal)
        last = self.bits if max_distance is None else min(max_distance, self.bits)
        within = self.items_within_q
        weights, below = [], 0.0
        for R in range(last + 1):
            at_most = 1.0 if R == last or need == 0 else float(
                np.mean(1.0 - pdtr(need - 1, within[:, min(R, within.shape[1] - 1)])))
            if at_most >= 1.0 - KNN_TAIL:
                at_most = 1.0
            if at_most > below:
                weights.append((R, at_most - below))
                below = at_most
            if below >= 1.0:
                break
        return weights

    def _features(self, mode: str, R: int) -> dict:
        """Expected per-radius features of a radius-R search by ``mode`` (from the profile)."""
        if mode == "single":
            return {"probes": [math.comb(self.bits, r) for r in range(R + 1)],
                    "nonempty_buckets": self.codes_d[:R + 1], "items": self.items_d[:R + 1]}
        m = self.mih.substrings
        widths = self.mih.sub_widths
        probes, nonempty, cands = [], [], []
        for step in range(R + 1):
            j, s = step % m, step // m
            ok = s <= widths[j]
            probes.append(math.comb(int(widths[j]), s))
            nonempty.append(self.sub_codes[j][s] if ok else 0.0)
            cands.append(self.sub_items[j][s] if ok else 0.0)
        return {"probes": probes, "nonempty_buckets": nonempty, "items": self.items_d[:R + 1],
                "candidates": cands}

    def modeled(self, mode: str, R: int) -> float:
        """Extended model of a radius-R query: ``o0 + o1 * work + sum_r model(features_r)``."""
        f = self._features(mode, R)
        o0, o1 = self.overhead_ns[mode]
        work = float(np.sum(f["candidates"] if mode == "mih" else f["items"]))
        return o0 + o1 * work + float(self.models[mode].predict(f).sum())

    def predict(self, R: int) -> dict:
        """Predicted per-query ns of each path for a radius-R search (None: not allowed).

        The modeled cost times the calibration's correction ``measured / modeled`` at radius
        ``min(R, R_cal)`` (1 before calibration): at the calibrated radii the prediction is
        the cost measured on the calibration queries, beyond them the model extrapolates from
        the last one.
        """
        out = {"single": None, "mih": None}
        for mode, index in (("single", self.single), ("mih", self.mih)):
            if index.probe_count(R) <= index.max_probes:
                corr = self.correction.get(mode) or [1.0]
                out[mode] = self.modeled(mode, R) * corr[min(R, len(corr) - 1)]
        out["scan"] = self.scan_ns_per_item * max(self.ntotal, 1)
        return out

    def plan(self, max_distance: int | None = None, k: int | None = None, nq: int = 1) -> dict:
        """The plan of a batch of ``nq`` queries: a radius search (``max_distance``), a k-NN
        search (``k``), or both (the k nearest within ``max_distance``: planned at radius
        ``min(R_k, max_distance)``). ``predicted_ns`` are per query, the per-call overhead
        spread over the batch included; None marks a path that is not allowed."""
        # the limits are part of the key: a shallow copy with a lower max_probes (the server's
        # per-request limit) shares this cache
        key = (max_distance, k, nq, self.single.max_probes, self.mih.max_probes)
        if key in self._plan_cache:
            return dict(self._plan_cache[key])
        R = max_distance if k is None else self.knn_radius(k) if max_distance is None \
            else min(self.knn_radius(k), max_distance)
        predicted = self.predict(R)
        if k is not None:  # expected costs over the stop radius (knn_radius_weights)
            weights = self.knn_radius_weights(k, max_distance)
            at = {r: self.predict(r) for r, _ in weights}
            predicted["single"] = (None if any(at[r]["single"] is None for r, _ in weights)
                                   else sum(p * at[r]["single"] for r, p in weights))
            predicted["scan"] = self.scan_knn_predicted(k, nq)
            # mih k-NN of one-word codes (index.mih_knn) has its own costs; longer codes
            # switch to a scan past the probe budget, never fail
            predicted["mih"] = (sum(p * self.knn_predicted(r) for r, p in weights)
                                if self.mih.knn_incremental()
                                else predicted["mih"] or predicted["scan"])
        work = dict(predicted)
        predicted = {m: None if v is None else v + self.call_ns[m] / max(nq, 1)
                     for m, v in predicted.items()}
        feasible = {m: v for m, v in predicted.items() if v is not None}
        mode = min(feasible, key=lambda m: (feasible[m], PLAN_MODES.index(m)))
        plan = {"mode": mode, "radius": R, "k": k, "predicted_ns": predicted,
                "calibrated": self.calibrated,
                "reason": (f"{mode} has the lowest predicted cost "
                           f"({feasible[mode]:.0f} ns/query)"
                           + ("; single table excluded: "
                              f"{self.single.probe_count(R):,} probes > max_probes"
                              if predicted["single"] is None else ""))}
        if k is not None and mode in ("mih", "scan") and self.mih.knn_incremental():
            # every query tries the multi-index first under a work budget, the ones over it
            # scanned together: a query near the data is answered in microseconds whatever
            # the profile expected (a sampled profile misses near duplicates), one far from
            # it costs the scan and at most the budget more
            scan_ns = work["scan"]
            plan["mih_budget_ns"] = (
                min(scan_ns, max(KNN_MIH_BUDGET_SHARE * scan_ns, 2 * work["mih"]))
                if mode == "mih" else KNN_MIH_TRY_SHARE * scan_ns)
        if len(self._plan_cache) > 4096:
            self._plan_cache.clear()
        self._plan_cache[key] = plan
        return dict(plan)

    # ------------------------------------------------------------------ search
    def _index_for(self, mode: str):
        if mode not in PLAN_MODES:
            raise KeyError(mode)
        return getattr(self, mode)

    @property
    def last_plan(self) -> dict | None:
        """The plan of the last search (a copy, ``nq`` its batch size), None before any."""
        plan, nq = self._last_plan
        return plan if plan is None or nq is None else {**plan, "nq": nq}

    @last_plan.setter
    def last_plan(self, plan: dict | None) -> None:
        self._last_plan = (plan, None)

    def range_search(self, queries, max_distance: int, stats: bool = False,
                     max_results: int | None = None):
        """Radius search by the path the planner predicts cheapest; ``stats.plan`` says which.
        ``max_results`` caps the batch's results (:class:`~index.probe.ResultLimitError`).

        A batch given as a 2-D array, without statistics or cap, whose plan is cached (a
        batch of its size and radius planned before, under the same probe limits) goes to the
        planned engine's own ``range_search`` (which validates it as this method would, and
        has its short way): the plan's copy for :attr:`last_plan` is made when it is read. A
        one-query radius-0 call was 2.2x a bare Numba call of a minimal probe, 1.8 us of it
        here (bench/RESULTS.md section 32)."""
        if (stats is False and max_results is None and type(queries) is np.ndarray
                and queries.ndim == 2):
            plan = self._plan_cache.get((max_distance, None, queries.shape[0],
                                         self.single._max_probes, self.mih.max_probes))
            if plan is not None:
                self._last_plan = (plan, queries.shape[0])
                return getattr(self, plan["mode"]).range_search(queries, max_distance)
        R, xq = self._check_range(queries, max_distance, max_results)
        plan = self.plan(max_distance=R, nq=len(xq))
        plan["nq"] = len(xq)
        self.last_plan = plan
        # the plan checked the probe limits: run the chosen kernel without validating again
        out = self._index_for(plan["mode"])._run(xq, R, -1, stats, max_results)
        if stats:
            out[3].plan = plan
        return out

    def _knn_csr(self, xq, k, stats, max_radius):
        plan = self.plan(max_distance=None if max_radius == self.bits else max_radius, k=k,
                         nq=len(xq))
        plan["nq"] = len(xq)
        order = sorted((m for m, v in plan["predicted_ns"].items() if v is not None),
                       key=lambda m: (m != plan["mode"], plan["predicted_ns"][m]))
        if "mih_budget_ns" in plan:  # mih under the budget, the queries over it scanned
            info = {}
            out = knn_search(self.mih, xq, k, stats, max_radius,
                             budget_ns=plan["mih_budget_ns"], scan=self.scan, info=info,
                             work_coef=self.knn_coef,
                             min_work_ns=KNN_MIH_MIN_WORK_SHARE * plan["mih_budget_ns"])
            plan["deferred_to_scan"] = info["deferred"]
            plan["ran"] = ("mih" if info["deferred"] == 0 else "scan"
                           if info["deferred"] == len(xq) else "mih+scan")
            order = []
        for mode in order:
            try:
                out = self._index_for(mode)._knn_csr(xq, k, stats, max_radius)
            except ProbeLimitError as exc:
                plan.setdefault("fallbacks", []).append(f"{mode}: {str(exc).split(';')[0]}")
                continue
            plan["mode"] = plan["ran"] = mode
            break
        self.last_plan = plan
        if stats:
            out[3].plan = plan
        return out

    # ------------------------------------------------------------------ persistence
    def calibration_state(self) -> dict | None:
        """What :meth:`calibrate` learned (profile, models, corrections, per-call and scan
        costs), JSON-able, with the machine it was timed on; None before a calibration."""
        if not self.calibrated:
            return None
        return {"machine": machine_fingerprint(), "ntotal": self.ntotal,
                "items_d": np.asarray(self.items_d).tolist(),
                "items_within_q": _trimmed(self.items_within_q, self.ntotal).tolist(),
                "codes_d": np.asarray(self.codes_d).tolist(),
                "sub_items": [np.asarray(a).tolist() for a in self.sub_items],
                "sub_codes": [np.asarray(a).tolist() for a in self.sub_codes],
                "models": {m: v.to_dict() for m, v in self.models.items()},
                "overhead_ns": {m: list(v) for m, v in self.overhead_ns.items()},
                "correction": self.correction, "call_ns": dict(self.call_ns),
                "paper": self.paper.to_dict() if self.paper is not None else None,
                "scan_ns_per_item": self.scan_ns_per_item,
                "scan_knn": list(self.scan_knn),
                "knn_coef": list(self.knn_coef), "timed": CALIBRATION_TIMED,
                "summary": self.calibration}

    def restore_calibration(self, state: dict | None) -> bool:
        """Take a :meth:`calibration_state` back when it was timed on this machine
        (:func:`machine_fingerprint`) over these items (a snapshot's own): a restart then
        plans at once instead of timing every engine again (a 100M index: some 25 s). False,
        and nothing changed, otherwise."""
        if not state or state.get("machine") != machine_fingerprint() \
                or state.get("ntotal") != self.ntotal or "scan_knn" not in state \
                or state.get("timed") != CALIBRATION_TIMED:
            return False  # (a state without scan_knn timed the k-NN scan before it was
            #                blocked; one without "timed", its searches with statistics)
        self.items_d, self.codes_d = np.array(state["items_d"]), np.array(state["codes_d"])
        self.items_within_q = np.array(state.get("items_within_q")
                                       or [np.cumsum(self.items_d).tolist()])  # (older states)
        self.sub_items = [np.array(a) for a in state["sub_items"]]
        self.sub_codes = [np.array(a) for a in state["sub_codes"]]
        self.models = {m: ExtendedModel(**{**d, "terms": tuple(d["terms"])})
                       for m, d in state["models"].items()}
        self.overhead_ns = {m: tuple(v) for m, v in state["overhead_ns"].items()}
        self.correction, self.call_ns = dict(state["correction"]), dict(state["call_ns"])
        self.paper = PaperModel(**state["paper"]) if state["paper"] else None
        self.scan_ns_per_item = state["scan_ns_per_item"]
        self.scan_knn = tuple(state["scan_knn"])
        self.knn_coef = tuple(state["knn_coef"])
        self.calibrated = True
        self.calibration = {**state["summary"], "restored": True}
        self._plan_cache = {}
        return True

    def snapshot(self) -> tuple[dict, dict]:
        mih_meta, mih_arrays = self.mih.snapshot()
        meta = {"mih": mih_meta, "single_table": self.single.table.meta(),
                "max_probes": self.max_probes, "calibration_queries": self.calibration_queries,
                "calibrate_on_build": self.calibrate_on_build, "seed": self.seed,
                "calibration_state": self.calibration_state()}
        # the single table's words and ids are the multi-index's (one array each): stored once,
        # as mih_words and mih_ids
        arrays = {**{f"mih_{k}": v for k, v in mih_arrays.items()},
                  "single_slots": self.single.table.slots,
                  "single_bitmap": self.single.table.bitmap}
        return meta, arrays

    @classmethod
    def from_snapshot(cls, bits: int, meta: dict, arrays: dict) -> AutoIndex:
        """Load the tables; the calibration saved with them when it was timed on this
        machine, else calibrate again (timings belong to the machine that loads)."""
        index = cls(bits, substrings=meta["mih"]["fixed_substrings"],
                    max_probes=meta["max_probes"],
                    calibration_queries=meta["calibration_queries"],
                    calibrate_on_build=meta["calibrate_on_build"], seed=meta["seed"])
        index.mih = MultiIndex.from_snapshot(
            bits, meta["mih"], {k[4:]: v for k, v in arrays.items() if k.startswith("mih_")})
        if "single_table" in meta:
            index.single.table = ItemTable.from_arrays(
                bits, {"words": index.mih.words, "ids": index.mih.ids,
                       "slots": arrays["single_slots"], "bitmap": arrays["single_bitmap"]},
                meta["single_table"])
        else:  # formats 1-2: a bucket table of distinct codes; index the shared items again
            index.single._rebuild_sorted(index.mih.words, index.mih.ids)
        index.scan.share(index.mih.words, index.mih.ids)
        index.threads = None
        if not index.calibrate_on_build:
            index._set_default_models()
        elif not index.restore_calibration(meta.get("calibration_state")):
            index.calibrate()
        return index


__all__ = ["AutoIndex", "PLAN_MODES", "calibration_queries"]
