"""Wire forms of the HTTP API on the client side: search requests encoded, answers decoded.

Shared by :mod:`bucketsearch.loadtest.client` and the load tester (which pre-encodes its
requests with :func:`encode_search` and counts results with :func:`search_summary`). Imports
nothing from the server package; the layouts are those of ``app/routers/search.py``:

* request, ``binary``: the query codes packed (``B = ceil(bits/8)`` bytes each, np.packbits
  layout) as ``application/octet-stream``, ``max_distance`` / ``k`` / ``stats`` in the query
  string; ``json``: ``{"codes": [hex...], "max_distance"?, "k"?, "stats"?}``;
* answer, binary (``Accept: application/octet-stream``): ``u64 nq | i64 lims[nq+1] |
  i64 ids[n] | i32 distances[n]``, little-endian, ``n = lims[nq]`` (faiss's range_search
  layout); JSON: ``{"results": [{"ids", "distances"}...], "stats"?, "delta"?, "took_ms"}``.
  Only the JSON answer carries the per-radius stats.
* dedup insert (``POST .../items/dedup``, ``app/routers/indexes.py``): binary ``u64 n |
  i64 item_ids[n] |`` then the search layout without its ``nq``; JSON ``{"inserted",
  "rejected", "first_id", "size", "items": [{"id", "inserted", "duplicate_of",
  "distances"}...]}``: :func:`decode_dedup`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import httpx
import numpy as np
import orjson

from bucketsearch.index.codes import to_hex, to_ints, to_packed, unpack_words

OCTET = "application/octet-stream"
JSON = "application/json"
WIRES = ("binary", "json")
#: what a client's ``get`` can return (see :func:`convert_words`)
CODE_FORMATS = ("packed", "bits", "words", "hex", "int")


def check_wire(wire: str) -> str:
    if wire not in WIRES:
        raise ValueError(f"wire must be one of {', '.join(WIRES)}, got {wire!r}")
    return wire


def convert_words(words: np.ndarray, bits: int, form: str):
    """Words -> ``form``: "packed" (uint8 rows, np.packbits layout), "bits" ((n, Q) 0/1 uint8),
    "words" (uint64), "hex" (list of str), "int" (list of int)."""
    if form == "packed":
        return to_packed(words, bits)
    if form == "bits":
        return unpack_words(words, bits)
    if form == "words":
        return words
    if form == "hex":
        return to_hex(words, bits)
    if form == "int":
        return to_ints(words, bits)
    raise ValueError(f"format must be one of {', '.join(CODE_FORMATS)}, got {form!r}")


def encode_search(packed: np.ndarray, *, k: int | None = None, max_distance: int | None = None,
                  stats: bool = False, wire: str = "binary") -> tuple[dict, dict, bytes]:
    """``(params, headers, body)`` of ``POST /v1/indexes/{name}/search`` over packed query rows:
    binary, the rows as octet-stream and the parameters in the query string (answer binary,
    JSON with stats); json, ``{"codes": [hex...], "max_distance"?, "k"?, "stats"?}``."""
    if check_wire(wire) == "binary":
        params = {key: value for key, value in (("max_distance", max_distance), ("k", k))
                  if value is not None}
        if stats:
            params["stats"] = "true"
        headers = {"content-type": OCTET, "accept": JSON if stats else OCTET}
        return params, headers, np.ascontiguousarray(packed, dtype=np.uint8).tobytes()
    body: dict = {"codes": [row.tobytes().hex() for row in packed]}
    if max_distance is not None:
        body["max_distance"] = int(max_distance)
    if k is not None:
        body["k"] = int(k)
    if stats:
        body["stats"] = True
    return {}, {"content-type": JSON, "accept": JSON}, orjson.dumps(body)


def decode_binary_results(buf: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lims, D, I)`` of a binary search answer ``u64 nq | i64 lims[nq+1] | i64 ids[n] |
    i32 distances[n]``; ValueError when the sizes do not add up."""
    if len(buf) < 16:
        raise ValueError(f"binary results: {len(buf)} bytes, fewer than the 16 of an empty answer")
    nq = int(np.frombuffer(buf, dtype="<u8", count=1)[0])
    start = 8 + 8 * (nq + 1)
    if start > len(buf):
        raise ValueError(f"binary results: nq={nq} does not fit in {len(buf)} bytes")
    lims = np.frombuffer(buf, dtype="<i8", count=nq + 1, offset=8).astype(np.int64)
    n = int(lims[-1])
    if n < 0 or len(buf) != start + 12 * n:
        raise ValueError(f"binary results: {len(buf)} bytes, expected {start + 12 * max(n, 0)} "
                         f"for nq={nq} and n={n}")
    I = np.frombuffer(buf, dtype="<i8", count=n, offset=start).astype(np.int64)
    D = np.frombuffer(buf, dtype="<i4", count=n, offset=start + 8 * n).astype(np.int32)
    return lims, D, I


#: the per-query figures of a search answer with stats (one list entry per query each)
QUERY_INFO = ("engine", "total_ns", "codes_compared")


def search_summary(content: bytes, content_type: str) -> tuple[int, list | None, list | None]:
    """``(ids returned, per-query stats records or None, per-query info or None)`` of a search
    answer, cheaply (the load tester's per-request bookkeeping); info: per query the
    :data:`QUERY_INFO` the server gave (``{"engine": "mih", "total_ns": ..., ...}``)."""
    if content_type.startswith(OCTET):
        if len(content) < 16:
            raise ValueError(f"binary results: {len(content)} bytes")
        nq = int(np.frombuffer(content, dtype="<u8", count=1)[0])
        return (int(np.frombuffer(content, dtype="<i8", count=1, offset=8 + 8 * nq)[0]), None,
                None)
    data = orjson.loads(content)
    stats = data.get("stats")
    info = None
    if stats is not None:
        cols = {f: data.get(f) for f in QUERY_INFO if data.get(f) is not None}
        info = [{f: v[i] for f, v in cols.items()} for i in range(len(stats))]
    return sum(len(r["ids"]) for r in data["results"]), stats, info


STAT_FIELDS = ("probes", "nonempty_buckets", "empty_buckets", "items", "lookup_ns")


@dataclass
class RemoteSearchStats:
    """Per-query, per-radius counters a search answered with (``stats=True``), in the engine's
    layout (``bucketsearch.index.base.SearchStats``): ``probes, nonempty_buckets,
    empty_buckets, items, lookup_ns`` are ``(nq, R + 1)`` int64, zero past ``radii[q]``;
    ``modeled_ns = t0 * probes`` (NaN before the server calibrated t0). The delta segment
    (items inserted since the last merge) is scanned, not probed: ``delta_items[q]`` items per
    query, ``delta_ns`` the scans' wall-clock ns summed over the requests. ``took_ms``: server
    time summed over the ``requests`` the batch took."""

    probes: np.ndarray
    nonempty_buckets: np.ndarray
    empty_buckets: np.ndarray
    items: np.ndarray
    lookup_ns: np.ndarray
    modeled_ns: np.ndarray
    radii: np.ndarray
    delta_items: np.ndarray
    delta_ns: int
    took_ms: float
    requests: int

    @classmethod
    def from_answer(cls, records: list[list[dict]], delta: dict | None,
                    took_ms: float) -> "RemoteSearchStats":
        nq = len(records)
        width = max((len(rows) for rows in records), default=0)
        arrays = {f: np.zeros((nq, width), dtype=np.int64) for f in STAT_FIELDS}
        modeled = np.full((nq, width), np.nan)
        for q, rows in enumerate(records):
            for r, rec in enumerate(rows):
                for f in STAT_FIELDS:
                    arrays[f][q, r] = rec[f]
                if rec.get("modeled_ns") is not None:
                    modeled[q, r] = rec["modeled_ns"]
        delta = delta or {}
        return cls(**arrays, modeled_ns=modeled,
                   radii=np.array([len(rows) for rows in records], dtype=np.int64),
                   delta_items=np.full(nq, int(delta.get("items", 0)), dtype=np.int64),
                   delta_ns=int(delta.get("scan_ns", 0)), took_ms=float(took_ms), requests=1)

    @classmethod
    def concat(cls, parts: list["RemoteSearchStats"]) -> "RemoteSearchStats":
        width = max(p.radii_width for p in parts)

        def stack(name, fill):
            return np.concatenate([np.pad(getattr(p, name), ((0, 0), (0, width - p.radii_width)),
                                          constant_values=fill) for p in parts])
        return cls(**{f: stack(f, 0) for f in STAT_FIELDS}, modeled_ns=stack("modeled_ns", np.nan),
                   radii=np.concatenate([p.radii for p in parts]),
                   delta_items=np.concatenate([p.delta_items for p in parts]),
                   delta_ns=sum(p.delta_ns for p in parts), took_ms=sum(p.took_ms for p in parts),
                   requests=sum(p.requests for p in parts))

    @property
    def radii_width(self) -> int:
        """``R + 1``: the columns of the per-radius arrays."""
        return self.probes.shape[1]

    def per_query(self, i: int) -> list[dict]:
        """Records ``{"radius", "probes", ..., "modeled_ns"}`` of query ``i`` (as answered)."""
        out = []
        for r in range(int(self.radii[i])):
            rec = {"radius": r, **{f: int(getattr(self, f)[i, r]) for f in STAT_FIELDS}}
            m = self.modeled_ns[i, r]
            rec["modeled_ns"] = None if np.isnan(m) else float(m)
            out.append(rec)
        return out


def decode_search(resp: httpx.Response):
    """``(lims, D, I, stats or None)`` of a search answer (binary or JSON); ValueError when it
    cannot be read."""
    ctype = resp.headers.get("content-type", "")
    try:
        if ctype.startswith(OCTET):
            return (*decode_binary_results(resp.content), None)
        data = orjson.loads(resp.content)
        results = data["results"]
        counts = np.fromiter((len(r["ids"]) for r in results), dtype=np.int64, count=len(results))
        lims = np.zeros(len(results) + 1, dtype=np.int64)
        np.cumsum(counts, out=lims[1:])
        n = int(lims[-1])
        I = np.fromiter(itertools.chain.from_iterable(r["ids"] for r in results), np.int64, n)
        D = np.fromiter(itertools.chain.from_iterable(r["distances"] for r in results),
                        np.int32, n)
        stats = None
        if data.get("stats") is not None:
            stats = RemoteSearchStats.from_answer(data["stats"], data.get("delta"),
                                                  data.get("took_ms", 0.0))
        return lims, D, I, stats
    except (KeyError, TypeError) as exc:
        raise ValueError(f"unreadable search answer ({ctype or 'no content-type'}): "
                         f"{type(exc).__name__} {exc}") from None


def concat_csr(parts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR parts ``(lims, D, I)`` of consecutive query chunks -> one CSR result (one part is
    returned as it is when its offsets start at 0 and its dtypes are the result's: no copies,
    ~45 us of a 1,000-query answer)."""
    if len(parts) == 1:
        lims, D, I = parts[0][:3]
        if len(lims) and lims[0] == 0 and lims.dtype == np.int64 and D.dtype == np.int32 \
                and I.dtype == np.int64:
            return lims, D, I
    counts = np.concatenate([np.diff(p[0]) for p in parts])
    lims = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=lims[1:])
    return (lims, np.concatenate([p[1] for p in parts]).astype(np.int32),
            np.concatenate([p[2] for p in parts]).astype(np.int64))


def knn_rows(lims, D, I, k: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR k-NN answer -> ``(D, I)`` of shape ``(nq, k)`` padded with -1 (the engine's
    ``csr_to_knn``)."""
    from bucketsearch.index.base import csr_to_knn  # on first use: it loads numba


    return csr_to_knn(lims, D, I, k)


def decode_dedup(resp: httpx.Response):
    """``(item_ids, inserted, lims, D, I, first_id)`` of a dedup insert's answer (binary or
    JSON): per item its id (-1: rejected, no id given), whether it was inserted, and in CSR the
    items that blocked it; ``first_id`` None in the binary form. ValueError when it cannot be
    read."""
    ctype = resp.headers.get("content-type", "")
    buf = resp.content
    try:
        if ctype.startswith(OCTET):
            if len(buf) < 8:
                raise ValueError(f"{len(buf)} bytes")
            n = int(np.frombuffer(buf, dtype="<u8", count=1)[0])
            if 16 + 8 * n > len(buf):
                raise ValueError(f"n={n} does not fit in {len(buf)} bytes")
            ids = np.frombuffer(buf, dtype="<i8", count=n, offset=8).astype(np.int64)
            lims, D, I = decode_binary_results(buf[:8] + buf[8 + 8 * n:])
            return ids, lims[1:] == lims[:-1], lims, D, I, None
        data = orjson.loads(buf)
        items = data["items"]
        ids = np.array([-1 if it["id"] is None else it["id"] for it in items], dtype=np.int64)
        inserted = np.array([bool(it["inserted"]) for it in items], dtype=bool)
        counts = np.array([len(it["duplicate_of"]) for it in items], dtype=np.int64)
        lims = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(counts, out=lims[1:])
        I = np.fromiter(itertools.chain.from_iterable(it["duplicate_of"] for it in items),
                        np.int64, int(lims[-1]))
        D = np.fromiter(itertools.chain.from_iterable(it["distances"] for it in items),
                        np.int32, int(lims[-1]))
        return ids, inserted, lims, D, I, data.get("first_id")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"unreadable dedup answer ({ctype or 'no content-type'}): "
                         f"{type(exc).__name__} {exc}") from None


#: records of a job's result (``GET /v1/jobs/{id}/result?format=binary``), little-endian
JOB_RECORDS = {"pairs": np.dtype([("a", "<i8"), ("b", "<i8"), ("d", "<i4")]),
               "clusters": np.dtype([("id", "<i8"), ("cluster", "<i8")]),
               "keep": np.dtype([("id", "<i8")])}


def decode_job_records(buf: bytes, output: str) -> np.ndarray:
    """A binary page of a job's result -> structured array of :data:`JOB_RECORDS`
    ``[output]`` (a copy, native byte order); ValueError when the size does not fit."""
    rec = JOB_RECORDS[output]
    if len(buf) % rec.itemsize:
        raise ValueError(f"job result: {len(buf)} bytes is not a multiple of the "
                         f"{rec.itemsize}-byte {output} record")
    return np.frombuffer(buf, dtype=rec).copy()
