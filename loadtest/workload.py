"""Seeded query mix: which requests the load test sends, encoded once before the run.

A *query class* is a radius search (``max_distance: r``) or a k-NN search (``k``). Each request
carries ``batch`` queries of one class (so per-class statistics stay clean), encoded by
:func:`bucketsearch.loadtest.wire.encode_search` in the wire form of the run: ``json``
(``{"codes": [hex...], "max_distance": r, "stats": true}``) or ``binary`` (packed codes as
``application/octet-stream``, parameters in the query string, a binary answer; a JSON answer
when the per-radius ``stats`` are asked for, the only form that carries them). The class of
request ``i`` is drawn from the classes with the given weights (uniform by default) by a
``numpy`` generator seeded with ``seed``; so is every query.

A query is a code of the index (a row of ``base_codes``, uniform) with ``f`` bits flipped at
distinct uniform positions, ``f`` uniform in ``0 .. r`` for a radius-r query (so the source code
is always within the radius and every radius query finds at least one item) and in
``0 .. knn_flips`` for k-NN (``flips="upto"``, the default); with ``flips="exact"`` a radius-r
query has exactly ``min(r, bits)`` bits flipped (its source code lies on the outermost ring it
probes) and a k-NN query is the code itself. The same seed gives the same requests in the same
order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from bucketsearch.loadtest.wire import WIRES, check_wire, encode_search

#: distinct request bodies generated per class; requests cycle through them
DEFAULT_POOL = 512
KNN_FLIPS = 2
FLIPS = ("upto", "exact")


@dataclass(frozen=True, slots=True)
class QueryClass:
    """One kind of query: radius ``radius`` or k-NN with ``k`` neighbours."""

    radius: int | None = None
    k: int | None = None

    def __post_init__(self):
        if (self.radius is None) == (self.k is None):
            raise ValueError("a query class is either a radius or a k-NN search, not both")
        if self.radius is not None and self.radius < 0:
            raise ValueError(f"radius must be >= 0, got {self.radius}")
        if self.k is not None and self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")

    @property
    def label(self) -> str:
        return f"r{self.radius}" if self.radius is not None else f"knn{self.k}"


@dataclass(slots=True)
class Request:
    """A pre-encoded search request: body, query-string parameters and headers."""

    qclass: QueryClass
    body: bytes
    n_queries: int
    params: dict = field(default_factory=dict)
    headers: dict = field(default_factory=lambda: {"content-type": "application/json"})


def parse_radii(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-3"`` -> ``[0, 1, 2]`` / ``[0, 1, 2, 3]`` (sorted, unique)."""
    radii: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                radii.update(range(lo, hi + 1))
            else:
                radii.add(int(part))
        except ValueError:
            raise ValueError(f"--radii {text!r}: {part!r} is not an integer or a range a-b "
                             "(allowed: comma-separated radii >= 0, e.g. 0,1,2 or 0-3)") from None
    if not radii:
        raise ValueError(f"--radii {text!r}: no radius given (e.g. 0,1,2)")
    if min(radii) < 0:
        raise ValueError(f"--radii {text!r}: radii must be >= 0")
    return sorted(radii)


def flip_bits(packed: np.ndarray, n_flips: np.ndarray, bits: int,
              rng: np.random.Generator) -> np.ndarray:
    """Copy of ``packed`` rows with ``n_flips[i]`` distinct uniform bits of row i flipped."""
    out = np.array(packed, dtype=np.uint8, copy=True)
    for i, f in enumerate(np.asarray(n_flips, dtype=np.int64)):
        if f <= 0:
            continue
        pos = rng.choice(bits, size=min(int(f), bits), replace=False)
        np.bitwise_xor.at(out[i], pos // 8, (np.uint8(0x80) >> (pos % 8).astype(np.uint8)))
    return out


def make_queries(base_codes: np.ndarray, bits: int, qclass: QueryClass, n: int,
                 rng: np.random.Generator, flips: str = "upto") -> np.ndarray:
    """``n`` packed queries of ``qclass`` drawn from ``base_codes`` with bit flips (``flips``:
    "upto", uniform in 0..r, or "exact", r for a radius-r query and none for k-NN)."""
    if flips not in FLIPS:
        raise ValueError(f"flips {flips!r} is not allowed: one of {', '.join(FLIPS)}")
    base_codes = np.asarray(base_codes, dtype=np.uint8)
    if base_codes.ndim != 2 or base_codes.shape[1] != (bits + 7) // 8 or not len(base_codes):
        raise ValueError(f"base codes of {bits} bits must be a non-empty (n, {(bits + 7) // 8}) "
                         f"uint8 array, got shape {base_codes.shape}")
    rows = base_codes[rng.integers(0, len(base_codes), size=n)]
    if flips == "exact":
        n_flips = np.full(n, min(qclass.radius or 0, bits), dtype=np.int64)
    else:
        max_flips = qclass.radius if qclass.radius is not None else KNN_FLIPS
        n_flips = rng.integers(0, min(max_flips, bits) + 1, size=n)
    return flip_bits(rows, n_flips, bits, rng)


def encode_request(qclass: QueryClass, packed: np.ndarray, stats: bool = True,
                   wire: str = "json") -> Request:
    """One search request of ``qclass`` over the packed query rows, in ``wire`` form."""
    params, headers, body = encode_search(packed, k=qclass.k, max_distance=qclass.radius,
                                          stats=stats, wire=wire)
    return Request(qclass, body, len(packed), params, headers)


def encode_body(qclass: QueryClass, packed: np.ndarray, stats: bool = True) -> bytes:
    """JSON body of one search request over the packed query rows."""
    return encode_request(qclass, packed, stats, "json").body


class Workload:
    """The request sequence of a run: ``workload[i]`` is the i-th request (cycling a pool).

    ``classes`` and ``weights`` define the mix; request i's class is drawn once per position in
    a schedule of ``schedule_len`` draws (repeated), the bodies of a class cycle through
    ``pool`` pre-encoded bodies, in ``wire`` form (``json`` or ``binary``), asking for the
    server's per-radius counters when ``stats``. The queries depend on the seed only, not on
    the wire form.
    """

    def __init__(self, base_codes: np.ndarray, bits: int, classes: list[QueryClass],
                 batch: int = 1, seed: int = 0, weights: list[float] | None = None,
                 pool: int = DEFAULT_POOL, schedule_len: int = 4096, stats: bool = True,
                 flips: str = "upto", wire: str = "json"):
        try:
            check_wire(wire)
        except ValueError:
            raise ValueError(f"--wire {wire!r} is not allowed: one of {', '.join(WIRES)}") \
                from None
        if not classes:
            raise ValueError("the workload needs at least one query class")
        if batch < 1:
            raise ValueError(f"--batch must be >= 1, got {batch}")
        if weights is None:
            weights = [1.0] * len(classes)
        if len(weights) != len(classes) or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"weights {weights} must be {len(classes)} non-negative numbers "
                             "with a positive sum")
        self.classes = list(classes)
        self.bits = bits
        self.batch = batch
        self.seed = seed
        self.flips = flips
        self.wire = wire
        self.stats = bool(stats)
        self.weights = [w / sum(weights) for w in weights]
        rng = np.random.default_rng(seed)
        self.schedule = rng.choice(len(classes), size=schedule_len, p=self.weights)
        self.pools: list[list[Request]] = []
        for qclass in self.classes:
            bodies = []
            for _ in range(pool):
                packed = make_queries(base_codes, bits, qclass, batch, rng, flips)
                bodies.append(encode_request(qclass, packed, stats, wire))
            self.pools.append(bodies)

    def __getitem__(self, i: int) -> Request:
        c = int(self.schedule[i % len(self.schedule)])
        pool = self.pools[c]
        return pool[(i // len(self.schedule) * 7919 + i) % len(pool)]

    def describe(self) -> dict:
        return {"classes": [q.label for q in self.classes], "weights": self.weights,
                "batch": self.batch, "seed": self.seed, "bits": self.bits,
                "pool_per_class": len(self.pools[0]), "flips": self.flips, "wire": self.wire,
                "stats": self.stats}


def probes_upto(bits: int, radius: int) -> int:
    """Exact ``sum_{r <= radius} C(bits, r)`` (the paper's probe count of a radius search)."""
    return sum(math.comb(bits, r) for r in range(radius + 1))
