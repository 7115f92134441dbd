"""Load-test statistics: pure bookkeeping, no I/O, no clocks.

Every request is described by one :class:`RequestResult` holding four monotonic timestamps (ns):

* ``intended_ns``: when the schedule said the request should be sent. In an open loop this is
  ``t_start + i / rate`` (constant arrivals) or ``t_start + sum_{j<=i} gap_j`` with exponential
  gaps of mean ``1 / rate`` (Poisson arrivals). In a closed loop there is no schedule and
  ``intended_ns == sent_ns``.
* ``dispatch_ns``: when the client's scheduler actually woke up and started the request.
* ``sent_ns``: when the request was handed to the HTTP client (after waiting for a free
  connection slot, if the in-flight cap was reached).
* ``done_ns``: when the whole response body had been read.

Coordinated-omission (CO) correction. A client that waits for a slow answer before sending the
next request silently skips the requests it should have sent meanwhile, and every one of those
would have waited too. The honest latency is therefore measured from the *intended* send time:

    latency_i      = done_ns_i - intended_ns_i        (what a user arriving on schedule sees)
    service_time_i = done_ns_i - sent_ns_i            (what the server + network took)
    queueing_i     = sent_ns_i - intended_ns_i        (time spent waiting to be sent)
    sched_lag_i    = dispatch_ns_i - intended_ns_i    (client event-loop lateness only)

so ``latency_i = queueing_i + service_time_i``. A failed request (HTTP error, timeout,
connection error) still has a latency (time to the failure) and counts in the latency
percentiles; it is counted in ``errors`` and contributes no server statistics.

A stalled server makes the latency of every request scheduled during the stall grow (request i
waits up to ``stall_end - intended_i`` more). If the client held those requests back (all its
connections busy) their service times stay short and only the corrected latency shows the
stall; a closed loop, having no schedule, reports only service times and hides the stall (it
sent one request into it: one slow sample).

Percentiles. Values go into HDR histograms (``hdrh``; 3 significant digits). The p-th percentile
of N recorded values is the value of rank ``k = max(1, floor(p * N / 100 + 0.5))`` in ascending
order (nearest rank, ranks from 1), reported as the highest value the histogram cannot
distinguish from it: exact for values below 2048 units and within 0.1% above. ``max`` is the
exact largest value recorded. Latencies are recorded in microseconds, server lookup times in
nanoseconds.

Throughput. Only requests whose intended send time falls after the warm-up are *measured*.
With ``t_first`` the earliest intended time and ``t_last`` the latest completion among measured
requests, ``achieved_rate = n_measured / (t_last - t_first)`` requests per second and
``send_rate = n_measured / (max sent - t_first)``. Queries per second multiply by the batch size.

Cost samples. Every measured query's per-radius server counters (the ``stats`` records of the
search answer) go into a :class:`QueryReservoir`: a uniform random sample of at most
``capacity`` queries (Vitter's Algorithm R, seeded), so the cost model of a long run is fitted
on a bounded sample in which every measured query had the same chance ``capacity / seen``.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from hdrh.histogram import HdrHistogram

#: Percentiles reported for every latency distribution (99.9 is reported as "p999").
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
#: HDR histogram range: 1 unit .. 1 hour in microseconds; 3 significant digits.
HIGHEST_US = 3_600_000_000
HIGHEST_NS = 3_600_000_000_000
SIGNIFICANT_DIGITS = 3
#: the per-radius counters kept of each query (the server's ``stats`` record fields), in the
#: order of :attr:`QueryStats.rings`; ``candidates`` only for multi-index hashing
RING_FIELDS = ("probes", "nonempty_buckets", "empty_buckets", "items", "lookup_ns", "candidates")
#: queries kept for the cost model of a run (:class:`QueryReservoir`)
RESERVOIR_SIZE = 20_000


def percentile_key(p: float) -> str:
    """50 -> "p50", 99.9 -> "p999"."""
    return "p" + f"{p:g}".replace(".", "")


@dataclass(slots=True)
class QueryStats:
    """Server-reported work of one query, summed over the radii it searched (rings 0..R), and
    per ring r the counters of :data:`RING_FIELDS` (``candidates`` only when reported)."""

    probes: int
    nonempty_buckets: int
    empty_buckets: int
    items: int
    lookup_ns: int
    modeled_ns: float | None = None
    #: per ring r: (probes, nonempty_buckets, empty_buckets, items, lookup_ns[, candidates])
    rings: tuple[tuple[int, ...], ...] = ()
    #: what ran (the answer's per-query ``engine``, ``total_ns``, ``codes_compared``; "" and
    #: None from a server that does not say) and the k of a k-NN query (0: range)
    engine: str = ""
    total_ns: int | None = None
    codes_compared: int = 0
    k: int = 0

    @classmethod
    def from_server(cls, rings: list[dict], info: dict | None = None,
                    k: int | None = None) -> "QueryStats":
        """Sum the server's per-radius entries ``[{"radius", "probes", ...}, ...]`` of one query;
        ``info``: its per-query figures ``{"engine", "total_ns", "codes_compared"}``."""
        modeled = [ring.get("modeled_ns") for ring in rings]
        fields = RING_FIELDS if rings and "candidates" in rings[0] else RING_FIELDS[:-1]
        kept = tuple(tuple(int(ring.get(f) or 0) for f in fields) for ring in rings)
        sums = [sum(col) for col in zip(*kept)] or [0] * len(fields)
        info = info or {}
        return cls(*sums[:5], modeled_ns=None if any(m is None for m in modeled)
                   else float(sum(modeled)), rings=kept, engine=info.get("engine") or "",
                   total_ns=info.get("total_ns"), codes_compared=int(
                       info.get("codes_compared") or 0), k=int(k or 0))

    def query(self) -> dict:
        """The per-query form :meth:`bucketsearch.index.costmodel.engines.QuerySamples.from_queries`
        takes (the measured time: ``total_ns``, else the sum of the rings' lookup times)."""
        cand = sum(r[5] for r in self.rings) if self.rings and len(self.rings[0]) > 5 else 0
        return {"engine": self.engine, "k": self.k, "radius": len(self.rings) - 1,
                "flip_search": float(any(r[0] > 1 for r in self.rings)),
                "flip_radii": float(sum(r[0] > 1 for r in self.rings)),
                "total_ns": self.total_ns if self.total_ns is not None else self.lookup_ns,
                "probes": self.probes, "items": self.items, "candidates": cand,
                "codes_compared": self.codes_compared}

    def records(self) -> list[dict]:
        """The per-radius records again, in the server's form ``{"radius": r, "probes", ...}``
        (what :func:`bucketsearch.index.costmodel.fit_all` takes)."""
        return [{"radius": r, **dict(zip(RING_FIELDS, ring))} for r, ring in
                enumerate(self.rings)]


class QueryReservoir:
    """A uniform random sample of at most ``capacity`` queries' :class:`QueryStats` (Vitter's
    Algorithm R: the n-th query offered replaces a random kept one with probability
    ``capacity / n``; seeded, so a run's sample is reproducible)."""

    __slots__ = ("capacity", "seed", "seen", "kept", "_rng")

    def __init__(self, capacity: int = RESERVOIR_SIZE, seed: int = 0):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity: an integer >= 1 is needed, got {capacity!r}")
        self.capacity = capacity
        self.seed = seed
        self.seen = 0
        self.kept: list[QueryStats] = []
        self._rng = random.Random(seed)

    def add(self, query: QueryStats) -> None:
        self.seen += 1
        if len(self.kept) < self.capacity:
            self.kept.append(query)
            return
        j = self._rng.randrange(self.seen)
        if j < self.capacity:
            self.kept[j] = query

    def merge(self, other: "QueryReservoir") -> None:
        """Make this a uniform sample of both reservoirs' queries: the number taken from
        ``self`` is hypergeometric (``capacity`` draws from ``self.seen + other.seen`` queries),
        each side's share a uniform subset of its sample."""
        if other.capacity != self.capacity:
            raise ValueError(f"capacity: cannot merge a reservoir of {other.capacity} queries "
                             f"into one of {self.capacity}")
        total = self.seen + other.seen
        if total <= self.capacity:
            self.kept = self.kept + other.kept
        else:
            draws = np.random.default_rng(self._rng.getrandbits(64))
            mine = int(draws.hypergeometric(self.seen, other.seen, self.capacity))
            self.kept = (self._rng.sample(self.kept, mine)
                         + self._rng.sample(other.kept, self.capacity - mine))
        self.seen = total

    def records(self) -> list[list[dict]]:
        """Per kept query, its per-radius records (:meth:`QueryStats.records`)."""
        return [q.records() for q in self.kept]

    def describe(self) -> dict:
        return {"queries_seen": self.seen, "queries_kept": len(self.kept),
                "capacity": self.capacity, "seed": self.seed,
                "method": "uniform random sample of the measured queries' per-radius stats "
                          "records (Algorithm R, seeded): each query kept with probability "
                          "capacity / queries_seen when more were seen"}


@dataclass(slots=True)
class RequestResult:
    """One request: what was asked, when (monotonic ns), and what came back."""

    label: str                 # query class: "r0", "r1", ..., "knn10"
    radius: int | None         # max_distance of a radius query, None for k-NN
    k: int | None              # k of a k-NN query, None for radius
    n_queries: int             # batch size
    intended_ns: int
    dispatch_ns: int
    sent_ns: int
    done_ns: int
    status: int                # HTTP status; 0 when no response (connection error, timeout)
    error: str | None = None   # exception class name, or "HTTP 503", ...
    n_results: int = 0         # ids returned, over the batch
    server: list[QueryStats] | None = None

    @property
    def latency_ns(self) -> int:
        """CO-corrected latency: ``done - intended``."""
        return self.done_ns - self.intended_ns

    @property
    def service_ns(self) -> int:
        """Service time: ``done - sent``."""
        return self.done_ns - self.sent_ns

    @property
    def queueing_ns(self) -> int:
        return self.sent_ns - self.intended_ns

    @property
    def sched_lag_ns(self) -> int:
        return self.dispatch_ns - self.intended_ns

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 300


def new_histogram(highest: int = HIGHEST_US) -> HdrHistogram:
    return HdrHistogram(1, highest, SIGNIFICANT_DIGITS)


class Distribution:
    """An HDR histogram plus exact count, sum, min and max (values are ints >= 0)."""

    __slots__ = ("hist", "count", "total", "min", "max", "highest", "clipped")

    def __init__(self, highest: int = HIGHEST_US):
        self.highest = highest
        self.hist = new_histogram(highest)
        self.count = 0
        self.total = 0
        self.min: int | None = None
        self.max: int | None = None
        self.clipped = 0

    def record(self, value: int) -> None:
        value = int(value)
        if value < 0:
            raise ValueError(f"cannot record a negative duration: {value}")
        self.count += 1
        self.total += value
        self.min = value if self.min is None else min(self.min, value)
        self.max = value if self.max is None else max(self.max, value)
        if value > self.highest:
            self.clipped += 1
            value = self.highest
        # hdrh cannot store 0 distinctly from "nothing"; 0 and 1 are the same bucket anyway.
        self.hist.record_value(max(value, 1))

    def merge(self, other: "Distribution") -> None:
        if other.count == 0:
            return
        self.hist.add(other.hist)
        self.count += other.count
        self.total += other.total
        self.clipped += other.clipped
        self.min = other.min if self.min is None else min(self.min, other.min)
        self.max = other.max if self.max is None else max(self.max, other.max)

    def percentile(self, p: float) -> int | None:
        """Nearest-rank percentile (see the module docstring); None when empty."""
        if not 0.0 <= p <= 100.0:
            raise ValueError(f"percentile must be in [0, 100], got {p}")
        if self.count == 0:
            return None
        if p >= 100.0:
            return self.max
        return min(int(self.hist.get_value_at_percentile(p)), self.max)

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def summary(self, scale: float = 1.0, percentiles=PERCENTILES) -> dict:
        """``{p50, p90, p99, p999, max, mean, count}`` with values multiplied by ``scale``."""
        out = {percentile_key(p): _scaled(self.percentile(p), scale) for p in percentiles}
        out["max"] = _scaled(self.max, scale)
        out["mean"] = _scaled(self.mean(), scale)
        out["count"] = self.count
        return out


def _scaled(value, scale):
    return None if value is None else float(value) * scale


@dataclass
class ClassStats:
    """Everything measured for one query class (one radius, or k-NN)."""

    label: str
    radius: int | None
    k: int | None
    latency_us: Distribution = field(default_factory=Distribution)      # CO-corrected
    service_us: Distribution = field(default_factory=Distribution)
    lookup_ns: Distribution = field(default_factory=lambda: Distribution(HIGHEST_NS))
    requests: int = 0
    queries: int = 0
    errors: int = 0
    results: int = 0
    probes: Counter = field(default_factory=Counter)            # total probes -> queries
    server_queries: int = 0
    items_total: int = 0
    empty_total: int = 0
    nonempty_total: int = 0
    modeled_ns_total: float = 0.0
    modeled_count: int = 0
    kernel_ns: Distribution = field(default_factory=lambda: Distribution(HIGHEST_NS))
    engines: Counter = field(default_factory=Counter)          # engine that ran -> queries
    reached: Counter = field(default_factory=Counter)          # radius reached -> queries


class LoadStats:
    """Accumulates :class:`RequestResult` records into per-class and overall statistics.

    Records whose ``intended_ns`` is before ``measure_from_ns`` (the warm-up) are counted in
    ``warmup_requests`` and otherwise ignored. Every measured query with server counters is
    offered to ``reservoir`` (at most ``reservoir_size`` kept, seeded with ``seed``).
    """

    def __init__(self, measure_from_ns: int = 0, reservoir_size: int = RESERVOIR_SIZE,
                 seed: int = 0):
        self.measure_from_ns = measure_from_ns
        self.reservoir = QueryReservoir(reservoir_size, seed)
        self.classes: dict[str, ClassStats] = {}
        self.latency_us = Distribution()
        self.service_us = Distribution()
        self.queueing_us = Distribution()
        self.sched_lag_us = Distribution()
        self.status_codes: Counter = Counter()
        self.errors: Counter = Counter()
        self.requests = 0
        self.queries = 0
        self.warmup_requests = 0
        self.first_intended_ns: int | None = None
        self.last_sent_ns: int | None = None
        self.last_done_ns: int | None = None

    # -- recording ---------------------------------------------------------------------------
    def add(self, res: RequestResult) -> None:
        if res.intended_ns < self.measure_from_ns:
            self.warmup_requests += 1
            return
        self.requests += 1
        self.queries += res.n_queries
        self.first_intended_ns = _min(self.first_intended_ns, res.intended_ns)
        self.last_sent_ns = _max(self.last_sent_ns, res.sent_ns)
        self.last_done_ns = _max(self.last_done_ns, res.done_ns)
        self.status_codes[str(res.status)] += 1
        cls = self.classes.get(res.label)
        if cls is None:
            cls = self.classes[res.label] = ClassStats(res.label, res.radius, res.k)
        cls.requests += 1
        cls.queries += res.n_queries
        latency_us = res.latency_ns // 1000
        service_us = res.service_ns // 1000
        self.latency_us.record(latency_us)
        self.service_us.record(service_us)
        self.queueing_us.record(max(res.queueing_ns, 0) // 1000)
        self.sched_lag_us.record(max(res.sched_lag_ns, 0) // 1000)
        cls.latency_us.record(latency_us)
        cls.service_us.record(service_us)
        if not res.ok:
            cls.errors += 1
            self.errors[res.error or f"HTTP {res.status}"] += 1
            return
        cls.results += res.n_results
        for q in res.server or ():
            cls.server_queries += 1
            cls.lookup_ns.record(q.lookup_ns)
            cls.kernel_ns.record(q.total_ns if q.total_ns is not None else q.lookup_ns)
            cls.engines[q.engine or "unknown"] += 1
            cls.reached[len(q.rings) - 1] += 1
            cls.probes[q.probes] += 1
            cls.items_total += q.items
            cls.empty_total += q.empty_buckets
            cls.nonempty_total += q.nonempty_buckets
            if q.modeled_ns is not None:
                cls.modeled_ns_total += q.modeled_ns
                cls.modeled_count += 1
            if q.rings:
                self.reservoir.add(q)

    def add_all(self, results) -> "LoadStats":
        for res in results:
            self.add(res)
        return self

    # -- derived figures ---------------------------------------------------------------------
    @property
    def n_errors(self) -> int:
        return sum(self.errors.values())

    def window_s(self) -> float | None:
        """Measurement window: earliest intended send to latest completion (seconds)."""
        if self.first_intended_ns is None or self.last_done_ns is None:
            return None
        return max(self.last_done_ns - self.first_intended_ns, 1) / 1e9

    def achieved_rate(self) -> float | None:
        """Completed requests per second over the measurement window."""
        window = self.window_s()
        return None if window is None else self.requests / window

    def send_rate(self) -> float | None:
        """Requests sent per second (earliest intended to latest send)."""
        if self.first_intended_ns is None or self.last_sent_ns is None:
            return None
        return self.requests / (max(self.last_sent_ns - self.first_intended_ns, 1) / 1e9)

    def queries_per_s(self) -> float | None:
        window = self.window_s()
        return None if window is None else self.queries / window

    def ordered_classes(self) -> list[ClassStats]:
        """Radius classes by radius, then k-NN classes by k."""
        return sorted(self.classes.values(),
                      key=lambda c: (c.radius is None, c.radius or 0, c.k or 0, c.label))

    def merge(self, other: "LoadStats") -> None:
        """Add another process's statistics (same measurement start) into this one."""
        for name in ("latency_us", "service_us", "queueing_us", "sched_lag_us"):
            getattr(self, name).merge(getattr(other, name))
        self.status_codes.update(other.status_codes)
        self.errors.update(other.errors)
        self.requests += other.requests
        self.queries += other.queries
        self.warmup_requests += other.warmup_requests
        self.first_intended_ns = _min(self.first_intended_ns, other.first_intended_ns)
        self.last_sent_ns = _max(self.last_sent_ns, other.last_sent_ns)
        self.last_done_ns = _max(self.last_done_ns, other.last_done_ns)
        self.reservoir.merge(other.reservoir)
        for label, theirs in other.classes.items():
            mine = self.classes.get(label)
            if mine is None:
                self.classes[label] = theirs
                continue
            mine.latency_us.merge(theirs.latency_us)
            mine.service_us.merge(theirs.service_us)
            mine.lookup_ns.merge(theirs.lookup_ns)
            mine.kernel_ns.merge(theirs.kernel_ns)
            mine.engines.update(theirs.engines)
            mine.reached.update(theirs.reached)
            for name in ("requests", "queries", "errors", "results", "server_queries",
                         "items_total", "empty_total", "nonempty_total", "modeled_ns_total",
                         "modeled_count"):
                setattr(mine, name, getattr(mine, name) + getattr(theirs, name))
            mine.probes.update(theirs.probes)


def _min(a, b):
    return b if a is None else a if b is None else min(a, b)


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)
