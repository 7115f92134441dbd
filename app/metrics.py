"""Prometheus metrics: per-app registry (no module globals), request counters and latency
histograms, counts of the requests the guard (app.guard) refused, and the per-index,
per-radius search figures read from each index's CostTracker at scrape time (so a search pays
numpy bookkeeping only, no per-observation Python call).

Labels hold route templates, methods, statuses, index names and radii 0..16 (larger radii
share the label ``gt16``), never a raw URL path or a file path (tests/test_http_guards.py
checks the exposition; tests/test_docs.py the bound on radius series). With ``bucketsearch
serve --workers N`` every series is summed over the workers (:mod:`app.workermetrics`;
tests/test_prometheus_workers.py)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.process_collector import ProcessCollector

from bucketsearch.app.audit import AuditCollector
from bucketsearch.app.costfit import SUB_BUCKETS, bucket_upper_ns, live_rows
from bucketsearch.app.workermetrics import (Publisher, WorkerGauges, multiprocess_dir,
                                            prune_dead_workers, read_search_files)

#: Prometheus boundaries of bucketsearch_lookup_seconds: powers of two from 128 ns to ~34 s
#: (each is a boundary of the CostTracker's finer histogram, so the counts are exact).
LOOKUP_OCTAVES = range(7, 36)
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                   10, 30)


#: Radii above this share one label value, ``gt16``: the per-radius series of an index stay
#: bounded (radius 0..16 and gt16: 18 values x 32 histogram series + 2 counters) whatever radii
#: (up to 256) clients search with.
MAX_RADIUS_LABEL = 16
RADIUS_OVERFLOW_LABEL = f"gt{MAX_RADIUS_LABEL}"


def radius_label(radius: int) -> str:
    """The ``radius`` label of a radius: itself up to MAX_RADIUS_LABEL, else ``gt16``."""
    return str(radius) if radius <= MAX_RADIUS_LABEL else RADIUS_OVERFLOW_LABEL


def add_record(total, rec):
    """``total + rec`` of two RadiusRecords (``total`` None: a copy of ``rec``)."""
    return rec.copy() if total is None else total.add(rec)


def fold_radii(records: dict) -> list[tuple[str, object]]:
    """``{radius: RadiusRecord}`` -> ``[(label, record)]`` in radius order, the records of the
    radii above MAX_RADIUS_LABEL summed into one (a copy: the input is not modified)."""
    out, overflow = [], None
    for radius, rec in sorted(records.items()):
        if radius <= MAX_RADIUS_LABEL:
            out.append((str(radius), rec))
        else:
            overflow = add_record(overflow, rec)
    if overflow is not None:
        out.append((RADIUS_OVERFLOW_LABEL, overflow))
    return out


def label_order(label: str) -> int:
    return MAX_RADIUS_LABEL + 1 if label == RADIUS_OVERFLOW_LABEL else int(label)


def search_figures(registry) -> dict[str, list[tuple[str, object]]]:
    """``{index: fold_radii(its CostTracker)}`` of this process."""
    entries = list(registry.entries.values()) if registry is not None else []
    return {entry.name: fold_radii(entry.cost.snapshot()) for entry in entries}


def add_figures(own: dict, others: list[dict]) -> dict[str, list[tuple[str, object]]]:
    """This worker's figures plus the other workers' (``[{index: {label: record}}]``), summed
    per index and radius label (copies: the inputs are not modified)."""
    totals: dict[str, dict[str, object]] = {}
    for figures in [{name: dict(recs) for name, recs in own.items()}, *others]:
        for name, recs in figures.items():
            into = totals.setdefault(name, {})
            for label, rec in recs.items():
                into[label] = add_record(into.get(label), rec)
    return {name: sorted(recs.items(), key=lambda item: label_order(item[0]))
            for name, recs in totals.items()}


class SearchCollector:
    """Exposes every index's per-radius counters and lookup-time histogram (radius label
    bounded: see :data:`MAX_RADIUS_LABEL`). With ``directory`` (several workers, see
    :mod:`bucketsearch.app.workermetrics`) the figures are this worker's plus the other workers'
    files."""

    def __init__(self, app, directory: Path | None = None):
        self.app = app
        self.directory = directory

    def figures(self) -> dict[str, list[tuple[str, object]]]:
        own = search_figures(getattr(self.app.state, "registry", None))
        if self.directory is None:
            return own
        return add_figures(own, read_search_files(self.directory, os.getpid()))

    def collect(self):
        lookup = HistogramMetricFamily("bucketsearch_lookup_seconds",
                                       "measured lookup time of one radius of one query",
                                       labels=["index", "radius"])
        probes = CounterMetricFamily("bucketsearch_probes",
                                     "buckets probed, per index and radius",
                                     labels=["index", "radius"])
        empty = CounterMetricFamily("bucketsearch_empty_buckets",
                                    "probed buckets that were empty, per index and radius",
                                    labels=["index", "radius"])
        figures = self.figures()
        for name, records in figures.items():
            for radius, rec in records:
                labels = [name, radius]
                cum = np.cumsum(rec.counts)
                buckets = []
                for octave in LOOKUP_OCTAVES:
                    b = SUB_BUCKETS * octave - 1  # last fine bucket below 2^octave ns
                    le = float(bucket_upper_ns(b)) / 1e9
                    buckets.append((repr(le), float(cum[b])))
                buckets.append(("+Inf", float(rec.n)))
                lookup.add_metric(labels, buckets, rec.sum_ns / 1e9)
                probes.add_metric(labels, rec.probes_total)
                empty.add_metric(labels, rec.empty_total)
        yield lookup
        yield probes
        yield empty
        yield from radius_cost_families(figures, getattr(self.app.state, "registry", None))
        yield from self.index_gauges(getattr(self.app.state, "registry", None))

    @staticmethod
    def index_gauges(registry):
        """Per index: the :data:`INDEX_SERIES`, and its state (one series per index, the state
        as a label)."""
        families = [(kind(name, doc, labels=["index"]), value)
                    for kind, name, doc, value in INDEX_SERIES]
        state = GaugeMetricFamily("bucketsearch_index_state", "1 for the index's state (ready, "
                                  "read_only, corrupt, unavailable)", labels=["index", "state"])
        if registry is not None:
            for entry in list(registry.entries.values()):
                live = entry.live
                sizes = live.sizes()
                for family, value in families:
                    family.add_metric([entry.name], value(live, sizes))
            for name, info in registry.states().items():
                state.add_metric([name, info["state"]], 1)
        yield from (family for family, _ in families)
        yield state


#: quantiles of the per-radius time gauges (label ``quantile``)
COST_QUANTILES = (("0.5", "p50_ns"), ("0.9", "p90_ns"), ("0.99", "p99_ns"))


def radius_cost_families(figures: dict, registry):
    """The live per-radius cost model (docs/cost-model.md) of every index, radii 0..16 only
    (the ``gt16`` record mixes radii, so it has no single T(R) or C(Q, R)): queries and
    empty-ball queries (counters), T(r) and T(R) quantiles, t0 C(Q, r) and t0 sum C(Q, i),
    T(R)/T(0) beside sum C(Q, i), mean empty buckets (gauges). ``figures``: of
    :meth:`SearchCollector.figures`; bits and t0 from this worker's registry entry."""
    queries = CounterMetricFamily("bucketsearch_radius_queries", "queries that reached the "
                                  "radius", labels=["index", "radius"])
    empty_ball = CounterMetricFamily("bucketsearch_empty_ball_queries", "queries whose ball up "
                                     "to the radius held no item", labels=["index", "radius"])
    times = GaugeMetricFamily("bucketsearch_radius_time_seconds", "measured lookup time: "
                              "scope ring = T(r), cumulative = T(R) = sum_(i<=R) T(i)",
                              labels=["index", "radius", "scope", "quantile"])
    modeled = GaugeMetricFamily("bucketsearch_radius_paper_seconds", "the paper's model: scope "
                                "ring = t0 C(Q, r), cumulative = t0 sum_(i<=R) C(Q, i)",
                                labels=["index", "radius", "scope"])
    ratio = GaugeMetricFamily("bucketsearch_radius_cost_ratio", "T(R)/T(0): source measured "
                              "(p50s) or paper (sum_(i<=R) C(Q, i))",
                              labels=["index", "radius", "source"])
    empty = GaugeMetricFamily("bucketsearch_radius_empty_buckets_mean", "empty buckets probed "
                              "per query at the radius", labels=["index", "radius"])
    entries = dict(registry.entries) if registry is not None else {}
    for name, records in figures.items():
        entry = entries.get(name)
        if entry is None:
            continue
        numeric = {int(label): rec for label, rec in records if label != RADIUS_OVERFLOW_LABEL}
        for row in live_rows(numeric, entry.bits, entry.cost.t0(refit=True)[0]):
            labels = [name, str(row["radius"])]
            queries.add_metric(labels, row["queries"])
            empty_ball.add_metric(labels, row["empty_ball_queries"])
            for scope, summary in (("ring", row["measured"]),
                                   ("cumulative", row["measured_cumulative"])):
                for q, key in COST_QUANTILES:
                    if summary[key] is not None:
                        times.add_metric(labels + [scope, q], summary[key] / 1e9)
            for scope, key in (("ring", "paper_ns"), ("cumulative", "paper_cumulative_ns")):
                if row[key] is not None:
                    modeled.add_metric(labels + [scope], row[key] / 1e9)
            if row["measured_ratio"] is not None:
                ratio.add_metric(labels + ["measured"], row["measured_ratio"])
            ratio.add_metric(labels + ["paper"], float(row["paper_ratio"]))
            if row["mean_empty_buckets"] is not None:
                empty.add_metric(labels, row["mean_empty_buckets"])
    yield from (queries, empty_ball, times, modeled, ratio, empty)


#: Per-index series: (family, name, help, value of (the index handle, its Sizes)).
INDEX_SERIES = (
    (GaugeMetricFamily, "bucketsearch_index_items", "live items", lambda live, sizes: sizes.size),
    (GaugeMetricFamily, "bucketsearch_index_delta_items",
     "items inserted since the last merge (scanned linearly)",
     lambda live, sizes: sizes.delta_size),
    (GaugeMetricFamily, "bucketsearch_index_tombstones",
     "main-table items deleted since the last merge", lambda live, sizes: sizes.tombstoned),
    (GaugeMetricFamily, "bucketsearch_index_merging", "1 while a merge runs",
     lambda live, sizes: int(live.merging)),
    (CounterMetricFamily, "bucketsearch_index_merges",
     "merges of the index (kept in its snapshots: read back on restart)",
     lambda live, sizes: live.merges),
    (GaugeMetricFamily, "bucketsearch_index_last_merge_timestamp_seconds",
     "end of the last merge (Unix time; 0: none yet)", lambda live, sizes: live.last_merge or 0.0),
    (GaugeMetricFamily, "bucketsearch_index_last_merge_failed",
     "1 when the last background merge failed",
     lambda live, sizes: int(live.last_merge_error is not None)),
)


class AppMetrics:
    """The server's series. ``registry`` is what ``/metrics`` exposes: this process's own
    registry with one worker; with several (``PROMETHEUS_MULTIPROC_DIR`` set, see
    :mod:`bucketsearch.app.workermetrics`) a registry summing every worker's files."""

    def __init__(self, app):
        self.directory = multiprocess_dir()
        # with several workers the metric objects write to their files and are exposed only
        # through the MultiProcessCollector (registering them too would expose this worker's
        # values twice)
        own = None if self.directory is not None else CollectorRegistry()
        self.requests = Counter("bucketsearch_http_requests", "HTTP requests",
                                ["method", "route", "status"], registry=own)
        self.latency = Histogram("bucketsearch_http_request_seconds", "HTTP request latency",
                                 ["method", "route"], buckets=REQUEST_BUCKETS, registry=own)
        self.rejections = Counter(
            "bucketsearch_http_rejected", "requests the guard answered before the route ran",
            ["reason"], registry=own)  # auth, concurrency, body_size, body_timeout
        self.dedup = Counter("bucketsearch_dedup_items", "items of dedup inserts, by outcome "
                             "(inserted, or rejected as a near-duplicate)", ["index", "outcome"],
                             registry=own)
        self._series: dict[tuple, tuple] = {}  # (method, route, status): request_series
        self.search = SearchCollector(app, self.directory)
        self.publisher = None
        if self.directory is None:
            self.registry = own
            ProcessCollector(registry=own)
        else:
            self.registry = CollectorRegistry()
            gauges = WorkerGauges()
            self.registry.register(WorkerPruner(self.directory, gauges))
            MultiProcessCollector(self.registry, path=str(self.directory))
            self.publisher = Publisher(self.directory, lambda: search_figures(
                getattr(app.state, "registry", None)), gauges)
        self.registry.register(self.search)
        self.registry.register(AuditCollector(app))
        self.registry.register(JobCollector(app))

    def request_series(self, method: str, route: str, status: int) -> tuple:
        """The request counter and latency histogram of one (method, route, status), looked up
        once (``labels()`` takes a lock and builds its key each time: ~2 us per request)."""
        key = (method, route, status)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = (self.requests.labels(method, route, str(status)),
                                          self.latency.labels(method, route))
        return series

    def count_dedup(self, index: str, inserted: int, rejected: int) -> None:
        """One dedup insert's outcome (``bucketsearch_dedup_items``)."""
        if inserted:
            self.dedup.labels(index, "inserted").inc(inserted)
        if rejected:
            self.dedup.labels(index, "rejected").inc(rejected)

    def close(self) -> None:
        """At shutdown: a worker writes its search figures a last time and removes its live
        gauges (:class:`bucketsearch.app.workermetrics.Publisher`); nothing to do with one
        process."""
        if self.publisher is not None:
            self.publisher.close()


class JobCollector:
    """Near-duplicate jobs (app/jobs.py) at scrape time: jobs by state, and per index the
    running jobs' pairs written and fraction of items done; jobs started (or resumed) and
    finished since the server started."""

    def __init__(self, app):
        self.app = app

    def collect(self):
        jobs = getattr(self.app.state, "jobs", None)
        by_state = GaugeMetricFamily("bucketsearch_jobs", "jobs known to the server, by state",
                                     labels=["state"])
        pairs = GaugeMetricFamily("bucketsearch_job_pairs", "pairs written so far by the "
                                  "running jobs of the index", labels=["index"])
        done = GaugeMetricFamily("bucketsearch_job_items_done_ratio", "running jobs of the "
                                 "index: items whose pairs are all written / items",
                                 labels=["index"])
        started = CounterMetricFamily("bucketsearch_jobs_started", "jobs started or resumed "
                                      "since the server started")
        ended = CounterMetricFamily("bucketsearch_jobs_finished", "jobs that ended since the "
                                    "server started, by state", labels=["state"])
        if jobs is not None:
            counts = {state: 0 for state in ("running", "completed", "failed", "cancelled")}
            per_index: dict[str, list] = {}
            for job in list(jobs.jobs.values()):
                counts[job.state] = counts.get(job.state, 0) + 1
                if job.state == "running":
                    info = jobs.info(job)
                    acc = per_index.setdefault(job.index, [0, 0, 0])
                    acc[0] += info["pairs"]
                    acc[1] += info["items_done"]
                    acc[2] += info["items"]
            for state, n in counts.items():
                by_state.add_metric([state], n)
            for index, (n_pairs, n_done, n_items) in per_index.items():
                pairs.add_metric([index], n_pairs)
                done.add_metric([index], n_done / n_items if n_items else 1.0)
            started.add_metric([], jobs.started)
            for state, n in jobs.finished.items():
                ended.add_metric([state], n)
        yield from (by_state, pairs, done, started, ended)


class WorkerPruner:
    """Registered before the MultiProcessCollector: at each scrape, drops the live gauges of
    killed workers and refreshes this worker's own; exposes nothing itself."""

    def __init__(self, directory: Path, gauges: WorkerGauges):
        self.directory, self.gauges = directory, gauges

    def collect(self):
        prune_dead_workers(self.directory)
        self.gauges.refresh()
        return iter(())


class RequestMetricsMiddleware:
    """Pure ASGI middleware counting requests by route template (not raw path) and status."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = {"code": 500, "pending": True}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                # counted before the last byte leaves: a client that has its answer sees it in
                # the next scrape, whichever worker answers that
                record()
            await send(message)

        def record():
            if status.pop("pending", False):
                metrics = getattr(scope["app"].state, "metrics", None) if "app" in scope \
                    else None
                if metrics is not None:
                    route = scope.get("route")
                    path = getattr(route, "path", None) or "unmatched"
                    method = scope["method"]
                    if method not in HTTP_METHODS:  # a client's made-up method: one series
                        method = "other"
                    count, latency = metrics.request_series(method, path, status["code"])
                    count.inc()
                    latency.observe(time.perf_counter() - start)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            record()  # no response sent (an exception), or a body that never ended
