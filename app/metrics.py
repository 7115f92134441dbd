"""Prometheus metrics: per-app registry (no module globals), request counters and latency
histograms, and the per-index, per-radius search figures read from each index's CostTracker at
scrape time (so a search pays numpy bookkeeping only, no per-observation Python call)."""
from __future__ import annotations

import time

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from app.costfit import SUB_BUCKETS, bucket_upper_ns

#: Prometheus boundaries of bucketsearch_lookup_seconds: powers of two from 128 ns to ~34 s
#: (each is a boundary of the CostTracker's finer histogram, so the counts are exact).
LOOKUP_OCTAVES = range(7, 36)
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                   10, 30)


class SearchCollector:
    """Exposes every index's per-radius counters and lookup-time histogram."""

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
            for radius, rec in sorted(entry.cost.snapshot().items()):
                labels = [entry.name, str(radius)]
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


class AppMetrics:
    def __init__(self, app):
        self.registry = CollectorRegistry()
        self.requests = Counter("bucketsearch_http_requests", "HTTP requests",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("bucketsearch_http_request_seconds", "HTTP request latency",
                                 ["method", "route"], buckets=REQUEST_BUCKETS,
                                 registry=self.registry)
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
                metrics.requests.labels(scope["method"], path, str(status["code"])).inc()
                metrics.latency.labels(scope["method"], path).observe(
                    time.perf_counter() - start)


class BodyLimitMiddleware:
    """413 for a body larger than ``limit`` bytes, by Content-Length or while it streams in."""

    def __init__(self, app, limit_getter):
        self.app = app
        self.limit_getter = limit_getter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit_getter(scope)
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await _reject(send, 400, "Content-Length header is not an integer")
                if declared > limit:
                    return await _reject(send, 413, f"request body of {declared} bytes exceeds "
                                                    f"the limit of {limit} bytes "
                                                    "(BUCKETSEARCH_MAX_BODY_BYTES)")
        received = 0
        started = {"v": False}

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge()
            return message

        async def tracking_send(message):
            if message["type"] == "http.response.start":
                started["v"] = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started["v"]:
                await _reject(send, 413, f"request body exceeds the limit of {limit} bytes "
                                         "(BUCKETSEARCH_MAX_BODY_BYTES)")


class _BodyTooLarge(Exception):
    pass


async def _reject(send, status: int, detail: str) -> None:
    import json
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
