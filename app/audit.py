"""The exactness audit: a background sampler re-checks a share of the served search answers
(range and k-NN, with or without a delta and tombstones) against a linear scan of the same
:class:`~bucketsearch.index.storage.live.LiveState` the request read (index/storage/exact.py), off
the request path.

Sampling (``audit_rate`` = p, on by default at 0.01): systematic with a random start in every
block: the answered searches are numbered by one shared counter; in each block of
``P = round(1 / p)`` consecutive searches exactly one, at a uniformly random position, is
sampled. So the share is 1/P, any one search is sampled with probability 1/P, and a fault that
makes every answer wrong is sampled within at most ``2P - 1`` searches (the sampling bound).
The request path pays one ``next()`` of an ``itertools.count`` and one compare when it is not
sampled (:func:`bucketsearch.app.routers.search.run_search`); a sampled request copies up to
``audit_queries`` randomly chosen queries and their served answers (never the whole batch) and
puts them on a bounded queue (``audit_queue``): when it is full the sample is dropped and
counted, the request never waits.

The checker (one daemon thread) computes each sampled query's exact answer and compares ids and
distances in order; a difference is a mismatch: counted, logged at error level, and kept with
its query (the last ``audit_keep``) for ``GET /v1/audit``. Its CPU share is bounded: after a
check that used ``c`` seconds of its thread's CPU time it waits until the process's other
threads have used ``c (1 / s - 1)`` CPU seconds and as many wall seconds have passed
(``s = audit_cpu_share``): the checker's CPU is at most a share s of the CPU spent serving
(what a CPU-bound server loses in throughput) and of one core; on an idle server it waits at
most ``IDLE_SLOWDOWN`` times the wall part. Samples arriving meanwhile wait in the queue or are
dropped.

Sharded indexes are not audited (their state lives in the shard actors).
"""
from __future__ import annotations

import itertools
import logging
import queue
import random
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from bucketsearch.index.codes import to_hex
from bucketsearch.index.storage.exact import exact_answer

log = logging.getLogger("bucketsearch.audit")
#: an idle server's checker waits this many times longer than a busy one's (see _throttle)
IDLE_SLOWDOWN = 10.0
THROTTLE_POLL_S = 0.1  # wake-ups of a waiting checker (each takes the GIL once)
#: ids of one answer kept in a mismatch report (the rest are counted)
REPORT_IDS = 50
_NEVER = float("inf")


@dataclass
class Sample:
    """One sampled request: the view it read (one state) and the chosen queries with their
    answers."""

    index: str
    view: object  # bucketsearch.index.handle.IndexView
    k: int | None
    max_distance: int | None
    queries: np.ndarray  # (m, words) of the chosen queries
    positions: list[int]  # their positions in the request
    served: list[tuple[np.ndarray, np.ndarray]]  # (ids, distances) per chosen query
    at: float


class ExactnessAudit:
    """The sampler, its queue, its checker thread and its counters (module docstring)."""

    def __init__(self, rate: float, queries: int = 4, queue_size: int = 64,
                 cpu_share: float = 0.01, keep: int = 20, seed: int | None = None):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"audit_rate must be in [0, 1], got {rate}")
        if not 0.0 < cpu_share <= 1.0:
            raise ValueError(f"audit_cpu_share must be in (0, 1], got {cpu_share}")
        self.rate = float(rate)
        self.period = max(1, round(1.0 / rate)) if rate > 0 else 0
        self.queries = int(queries)
        self.cpu_share = float(cpu_share)
        self.counter = itertools.count()  # next(): atomic under the GIL
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.next_pick = self._rng.randrange(self.period) if self.period else _NEVER
        self.queue: queue.Queue = queue.Queue(maxsize=int(queue_size))
        self.sampled = self.checked = self.checked_queries = 0
        self.mismatched = self.mismatched_queries = self.dropped = self.errors = 0
        self.busy_s = 0.0
        self.mismatches: deque = deque(maxlen=int(keep))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings) -> ExactnessAudit:
        return cls(settings.audit_rate, settings.audit_queries, settings.audit_queue,
                   settings.audit_cpu_share, settings.audit_keep)

    # ------------------------------------------------------------ request path
    def due(self) -> bool:
        """Whether the search just answered is sampled (the hot path inlines this test)."""
        return next(self.counter) >= self.next_pick

    def submit(self, name: str, view, k: int | None, max_distance: int | None,
               xq: np.ndarray, lims: np.ndarray, D: np.ndarray, I: np.ndarray) -> None:
        """Called when :meth:`due` said so: moves the pick to the next block, copies up to
        ``queries`` random queries of the request with their answers (CSR ``lims, D, I``)
        and queues them (dropped and counted when the queue is full)."""
        with self._lock:
            if self.next_pick is _NEVER:
                return
            block = int(self.next_pick) // self.period + 1
            self.next_pick = block * self.period + self._rng.randrange(self.period)
            self.sampled += 1
            if self.queue.full():  # dropped before anything is copied
                self.dropped += 1
                return
            nq = len(xq)
            chosen = sorted(self._rng.sample(range(nq), min(self.queries, nq)))
        served = [(np.array(I[lims[q]:lims[q + 1]], dtype=np.int64),
                   np.array(D[lims[q]:lims[q + 1]], dtype=np.int32)) for q in chosen]
        sample = Sample(name, view, k, max_distance, np.array(xq[chosen]), chosen, served,
                        time.time())
        try:
            self.queue.put_nowait(sample)
        except queue.Full:
            with self._lock:
                self.dropped += 1
            return
        self._ensure_thread()

    # ------------------------------------------------------------ checker
    def _ensure_thread(self) -> None:
        if self._thread is None and not self._stop.is_set():
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="exactness-audit",
                                                    daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if sample is None:
                break
            c0 = time.thread_time()
            try:
                self.check(sample)
            except Exception:  # noqa: BLE001 -- the checker keeps running; counted and logged
                with self._lock:
                    self.errors += 1
                log.exception("exactness audit: checking a sample of index %s failed",
                              sample.index)
            used = time.thread_time() - c0
            with self._lock:
                self.busy_s += used
            self._throttle(used)

    def _throttle(self, used: float) -> None:
        """After a check that used ``used`` CPU seconds, wait until the rest of the process
        has used ``need = used (1 / s - 1)`` CPU seconds and ``need`` wall seconds have passed
        (so the checker takes at most a share s of the serving CPU, and of one core), or until
        ``IDLE_SLOWDOWN x need`` wall seconds have passed (an idle server still gets its
        samples checked, slowly)."""
        if self.cpu_share >= 1.0 or used <= 0:
            return
        need = used * (1.0 / self.cpu_share - 1.0)
        start = time.monotonic()
        others0 = time.process_time() - time.thread_time()  # CPU of the other threads
        while not self._stop.is_set():
            waited = time.monotonic() - start
            others = time.process_time() - time.thread_time() - others0
            if (waited >= need and others >= need) or waited >= IDLE_SLOWDOWN * need:
                return
            self._stop.wait(min(max(need - waited, 0.0) or THROTTLE_POLL_S, THROTTLE_POLL_S))

    def check(self, sample: Sample) -> int:
        """Compare every query of ``sample`` with the exact answer of its state; returns the
        number of queries that differ (each recorded and logged)."""
        parts = sample.view.item_parts()  # in place: no copy of the items
        bad = 0
        for row, pos, (got_ids, got_d) in zip(sample.queries, sample.positions, sample.served):
            want_ids, want_d = exact_answer(parts, row, max_distance=sample.max_distance,
                                            k=sample.k)
            if np.array_equal(got_ids, want_ids) and np.array_equal(got_d, want_d):
                continue
            bad += 1
            self._record(sample, row, pos, got_ids, got_d, want_ids, want_d)
        with self._lock:
            self.checked += 1
            self.checked_queries += len(sample.positions)
            self.mismatched += bool(bad)
            self.mismatched_queries += bad
        return bad

    def _record(self, sample, row, pos, got_ids, got_d, want_ids, want_d) -> None:
        bits = sample.view.bits
        sizes = sample.view.sizes()
        missing = np.setdiff1d(want_ids, got_ids)
        extra = np.setdiff1d(got_ids, want_ids)
        report = {
            "at": sample.at, "index": sample.index,
            "kind": "range" if sample.k is None else "knn", "k": sample.k,
            "max_distance": sample.max_distance, "position": pos,
            "query": _hex(row, bits), "state_version": int(sample.view.version),
            "delta_items": sizes.delta_size, "tombstones": sizes.tombstoned,
            "served": {"n": int(len(got_ids)), "ids": got_ids[:REPORT_IDS].tolist(),
                       "distances": got_d[:REPORT_IDS].tolist()},
            "expected": {"n": int(len(want_ids)), "ids": want_ids[:REPORT_IDS].tolist(),
                         "distances": want_d[:REPORT_IDS].tolist()},
            "missing_ids": missing[:REPORT_IDS].tolist(),
            "extra_ids": extra[:REPORT_IDS].tolist(),
        }
        with self._lock:
            self.mismatches.append(report)
        log.error("exactness audit: index %s served a wrong %s answer (query %s, k=%s, "
                  "max_distance=%s): %d ids served, %d expected; missing %s, extra %s",
                  sample.index, report["kind"], report["query"], sample.k,
                  sample.max_distance, len(got_ids), len(want_ids),
                  report["missing_ids"][:5], report["extra_ids"][:5])

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every queued sample is checked (tests, the bench); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._done():
                return True
            time.sleep(0.01)
        return False

    def _done(self) -> bool:
        with self._lock:
            return self.queue.empty() and self.checked + self.dropped + self.errors \
                >= self.sampled

    def close(self) -> None:
        self._stop.set()
        try:
            self.queue.put_nowait(None)
        except queue.Full:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def report(self) -> dict:
        """The counters and the kept mismatches (``GET /v1/audit``)."""
        with self._lock:
            return {"enabled": self.period > 0, "rate": self.rate,
                    "period": self.period or None,
                    "sampling_bound": 2 * self.period - 1 if self.period else None,
                    "queries_per_sample": self.queries, "cpu_share": self.cpu_share,
                    "queue": {"size": self.queue.qsize(), "capacity": self.queue.maxsize},
                    "sampled": self.sampled, "checked": self.checked,
                    "checked_queries": self.checked_queries, "mismatched": self.mismatched,
                    "mismatched_queries": self.mismatched_queries, "dropped": self.dropped,
                    "errors": self.errors, "busy_seconds": self.busy_s,
                    "mismatches": list(reversed(self.mismatches))}


def _hex(row: np.ndarray, bits: int) -> str:
    """One query's words as the API's hex code."""
    return to_hex(np.asarray(row, dtype=np.uint64)[None, :], bits)[0]


class AuditCollector:
    """``bucketsearch_audit_*`` on /metrics: sampled, checked, mismatched, dropped requests,
    checked and mismatched queries, checker errors and CPU seconds (this process's audit)."""

    def __init__(self, app):
        self.app = app

    def collect(self):
        registry = getattr(self.app.state, "registry", None)
        audit = getattr(registry, "audit", None)
        rep = audit.report() if audit is not None else None
        for name, doc in (("sampled", "search requests sampled for the exactness audit"),
                          ("checked", "sampled requests re-checked by a linear scan"),
                          ("mismatched", "re-checked requests whose answer differed"),
                          ("dropped", "samples dropped: the audit queue was full"),
                          ("checked_queries", "queries re-checked by a linear scan"),
                          ("mismatched_queries", "re-checked queries whose answer differed"),
                          ("errors", "samples the checker failed to check")):
            family = CounterMetricFamily(f"bucketsearch_audit_{name}", doc)
            family.add_metric([], rep[name] if rep else 0)
            yield family
        cpu = CounterMetricFamily("bucketsearch_audit_cpu_seconds", "CPU time of the checker")
        cpu.add_metric([], rep["busy_seconds"] if rep else 0.0)
        yield cpu
        rate = GaugeMetricFamily("bucketsearch_audit_rate", "share of searches sampled")
        rate.add_metric([], (1.0 / rep["period"]) if rep and rep["period"] else 0.0)
        yield rate
