"""Prometheus metrics: per-app registry (no module globals), request counters and latency
histograms, counts of the requests the guard (app.guard) refused, and the per-index,
per-radius search figures read from each index's CostTracker at scrape time (so a search pays
numpy bookkeeping only, no per-observation Python call).

Labels hold route templates, methods, statuses, index names and radii 0..16 (larger radii
share the label ``gt16``), never a raw URL path or a file path (tests/test_http_guards.py
checks the exposition; tests/test_docs.py the bound on radius series)."""
from __future__ import annotations

import time

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from bucketsearch.app.costfit import SUB_BUCKETS, bucket_upper_ns

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


def fold_radii(records: dict) -> list[tuple[str, object]]:
    """``{radius: RadiusRecord}`` -> ``[(label, record)]`` in radius order, the records of the
    radii above MAX_RADIUS_LABEL summed into one (a copy: the input is not modified)."""
    out, overflow = [], None
    for radius, rec in sorted(records.items()):
        if radius <= MAX_RADIUS_LABEL:
            out.append((str(radius), rec))
        elif overflow is None:
            overflow = type(rec)(rec.counts.copy(), rec.n, rec.sum_ns, rec.probes_total,
                                 rec.empty_total)
        else:
            overflow.counts += rec.counts
            overflow.n += rec.n
            overflow.sum_ns += rec.sum_ns
            overflow.probes_total += rec.probes_total
            overflow.empty_total += rec.empty_total
    if overflow is not None:
        out.append((RADIUS_OVERFLOW_LABEL, overflow))
    return out


class SearchCollector:
    """Exposes every index's per-radius counters and lookup-time histogram (radius label
    bounded: see :data:`MAX_RADIUS_LABEL`)."""

    def __init__(self, app):
        self.app = app

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
        registry = getattr(self.app.state, "registry", None)
        entries = list(registry.entries.values()) if registry is not None else []
        for entry in entries:
            for radius, rec in fold_radii(entry.cost.snapshot()):
                labels = [entry.name, radius]
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
        yield from self.index_gauges(registry)

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
                live, st = entry.live, entry.live.state
                for family, value in families:
                    family.add_metric([entry.name], value(live, st))
            for name, info in registry.states().items():
                state.add_metric([name, info["state"]], 1)
        yield from (family for family, _ in families)
        yield state


#: Per-index series: (family, name, help, value of (LiveIndex, LiveState)).
INDEX_SERIES = (
    (GaugeMetricFamily, "bucketsearch_index_items", "live items", lambda live, st: st.ntotal),
    (GaugeMetricFamily, "bucketsearch_index_delta_items",
     "items inserted since the last merge (scanned linearly)",
     lambda live, st: len(st.delta_ids)),
    (GaugeMetricFamily, "bucketsearch_index_tombstones",
     "main-table items deleted since the last merge", lambda live, st: len(st.tombstones)),
    (GaugeMetricFamily, "bucketsearch_index_merging", "1 while a merge runs",
     lambda live, st: int(live.merging)),
    (CounterMetricFamily, "bucketsearch_index_merges", "merges since the server started",
     lambda live, st: live.merges),
    (GaugeMetricFamily, "bucketsearch_index_last_merge_timestamp_seconds",
     "end of the last merge (Unix time; 0: none yet)", lambda live, st: live.last_merge or 0.0),
    (GaugeMetricFamily, "bucketsearch_index_last_merge_failed",
     "1 when the last background merge failed",
     lambda live, st: int(live.last_merge_error is not None)),
)


class AppMetrics:
    def __init__(self, app):
        self.registry = CollectorRegistry()
        self.requests = Counter("bucketsearch_http_requests", "HTTP requests",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("bucketsearch_http_request_seconds", "HTTP request latency",
                                 ["method", "route"], buckets=REQUEST_BUCKETS,
                                 registry=self.registry)
        self.rejections = Counter(
            "bucketsearch_http_rejected", "requests the guard answered before the route ran",
            ["reason"], registry=self.registry)  # auth, concurrency, body_size, body_timeout
        self.registry.register(SearchCollector(app))


class RequestMetricsMiddleware:
    """Pure ASGI middleware counting requests by route template (not raw path) and status."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            metrics = getattr(scope["app"].state, "metrics", None) if "app" in scope else None
            if metrics is not None:
                route = scope.get("route")
                path = getattr(route, "path", None) or "unmatched"
                method = scope["method"]
                if method not in HTTP_METHODS:  # a client's made-up method: one series
                    method = "other"
                metrics.requests.labels(method, path, str(status["code"])).inc()
                metrics.latency.labels(method, path).observe(
                    time.perf_counter() - start)
