"""HTTP client of a bucketsearch server: :class:`Client` (blocking) and :class:`AsyncClient`
(asyncio): the blocking one on keep-alive sockets of its own
(:mod:`bucketsearch.loadtest.transport`),
the asyncio one on httpx; both import nothing from the server package.

They mirror the engine (``bucketsearch.index``): ``range_search(name, queries, r)`` returns
faiss's CSR layout ``(lims, D, I)``, query ``q``'s results at ``lims[q]:lims[q+1]`` ordered by
(distance, id); ``search(name, queries, k)`` returns ``(D, I)`` of shape ``(nq, k)`` padded with
-1, as ``HammingIndex.search`` does. Codes go in every form the engine accepts
(:func:`bucketsearch.index.codes.as_words`: bit arrays, packed uint8 rows, uint64 words, hex
strings, Python ints).

Wire forms (:mod:`bucketsearch.loadtest.wire`). ``wire="binary"`` (default): packed codes as
``application/octet-stream`` and the binary search answer ``u64 nq | i64 lims[nq+1] |
i64 ids[n] | i32 distances[n]`` (little-endian); with ``stats=True`` the answer is JSON, the
only form carrying the per-radius counters. ``wire="json"``: hex codes in JSON both ways.

Batches. A batch larger than the server's limits is sent in several requests whose answers are
put back together exactly as one request would give them (CSR offsets and k-NN rows shifted by
query). The limits are the server's own (``GET /v1/limits``, asked once; its defaults,
:class:`Limits`, from a server without that route) unless given; a 413 naming
``max_batch=N`` lowers the client's limit to N and resends the refused part (a 413 is answered
before any work, so nothing was written), and a radius search refused for ``max_results`` or
``max_request_probes`` is resent in halves. A write split over several requests is not atomic:
each part is acknowledged on its own, and an error raised after some parts carries
``acknowledged``, the items written before it.

Retries. Only where a repeat cannot change the outcome: reads (GET, search, get), ``upsert``
(replace semantics), ``merge`` and ``set_mode``; never ``add``, ``remove``, ``create_index``,
``delete_index`` or ``restore``. Retried: a transport error (connection dropped or refused,
timeout), 502, 504, 408, and 503 after its ``Retry-After`` (a longer wait than
``Retry.max_retry_after`` is not waited for: the 503 is raised). Waits between attempts grow as
``backoff * 2^attempt`` (capped at ``max_backoff``, jittered in [0.5, 1] of that).

Errors. Every 4xx is a :class:`ClientError` subclass named for its status (:class:`BadRequest`,
also a ``ValueError``; :class:`Unauthorized`, :class:`Forbidden`, :class:`NotFound`,
:class:`Conflict`, :class:`PayloadTooLarge`, ...), every 5xx a :class:`ServerError`
(:class:`Unavailable` for 503), all :class:`BucketsearchError`, carrying the server's
``detail`` message, its per-field ``errors`` and the status. Invalid arguments found before any
request (codes of the wrong width, ids of the wrong length) raise ``ValueError``/``TypeError``
like the engine.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import random
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import orjson

from bucketsearch.index.codes import as_words, n_bytes, pack_hex, to_hex, to_packed
from bucketsearch.loadtest.transport import PooledHTTP, tls_context
from bucketsearch.index.storage.dedup import DedupResult
from bucketsearch.loadtest.wire import (CODE_FORMATS, JSON, OCTET, RemoteSearchStats, check_wire,
                                        concat_csr, convert_words, decode_dedup,
                                        decode_job_records, decode_search, encode_search,
                                        knn_rows)

DEFAULT_URL = "http://127.0.0.1:8000"
MISSING = ("raise", "mask")
#: bytes of a request besides its items (headers, JSON keys), for the body-size budget
BODY_OVERHEAD = 1024


# ---------------------------------------------------------------------------------- errors
class BucketsearchError(Exception):
    """A request failed. ``status`` (None without an HTTP answer), ``detail`` (the server's
    message), ``errors`` (its per-field list), ``method`` and ``path`` of the request;
    ``acknowledged``: items written by earlier parts of a split write (None otherwise)."""

    status: int | None = None

    def __init__(self, detail: str, *, status: int | None = None, errors=(), method: str = "",
                 path: str = "", payload: dict | None = None, retry_after: float | None = None):
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status
        self.errors = list(errors or ())
        self.method, self.path = method, path
        self.payload = payload or {}
        self.retry_after = retry_after
        self.acknowledged: int | None = None

    def __str__(self) -> str:
        where = f"{self.method} {self.path}".strip()
        status = f" -> {self.status}" if self.status is not None else ""
        done = "" if self.acknowledged is None else \
            f" ({self.acknowledged} items were written by the earlier requests of this call)"
        return f"{where}{status}: {self.detail}{done}" if where else f"{self.detail}{done}"


class ClientError(BucketsearchError):
    """A 4xx answer: the request was refused, nothing was done."""


class BadRequest(ClientError, ValueError):
    """400: a value of the request is invalid (the message names the field)."""
    status = 400


class Unauthorized(ClientError):
    """401: no API key, or a malformed Authorization header."""
    status = 401


class Forbidden(ClientError):
    """403: a wrong API key, or the read key on a write."""
    status = 403


class NotFound(ClientError):
    """404: no such index (or route)."""
    status = 404


class MethodNotAllowed(ClientError):
    """405: the server has no such operation (an older server?)."""
    status = 405


class RequestTimeout(ClientError):
    """408: the body did not arrive within the server's body timeout."""
    status = 408


class Conflict(ClientError):
    """409: duplicate id or index name, read-only server, too many indexes."""
    status = 409


class PayloadTooLarge(ClientError):
    """413: body or batch above the server's limit."""
    status = 413


class UnsupportedMediaType(ClientError):
    """415: Content-Type not accepted."""
    status = 415


class ServerError(BucketsearchError):
    """A 5xx answer."""


class Unavailable(ServerError):
    """503: starting, overloaded, index unavailable or storage refusing writes
    (``retry_after``: the server's Retry-After in seconds, if any)."""
    status = 503


class TransportError(BucketsearchError):
    """No HTTP answer: connection refused or dropped, timeout (after the allowed retries)."""


class ProtocolError(BucketsearchError):
    """The server answered something this client cannot read."""


class MissingItems(BucketsearchError, KeyError):
    """``get`` of ids that are not live items of the index (``ids``: those ids)."""

    def __init__(self, detail: str, ids, **kw):
        super().__init__(detail, **kw)
        self.ids = list(ids)


ERROR_CLASSES = {cls.status: cls for cls in (
    BadRequest, Unauthorized, Forbidden, NotFound, MethodNotAllowed, RequestTimeout, Conflict,
    PayloadTooLarge, UnsupportedMediaType, Unavailable)}


def error_for(resp: httpx.Response, method: str, path: str) -> BucketsearchError:
    """The typed error of a non-2xx answer (``{"detail": str, "errors": [...]}`` bodies)."""
    status = resp.status_code
    try:
        payload = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        payload = None
    if not isinstance(payload, dict):
        payload = {"detail": resp.text[:500] or resp.reason_phrase}
    detail = payload.get("detail")
    if not isinstance(detail, str):
        detail = orjson.dumps(detail).decode()
    cls = ERROR_CLASSES.get(status) or (ClientError if status < 500 else ServerError)
    return cls(detail, status=status, errors=payload.get("errors") or (), method=method,
               path=path, payload=payload, retry_after=retry_after_s(resp))


def retry_after_s(resp: httpx.Response) -> float | None:
    """The Retry-After header in seconds (the delta-seconds form), or None."""
    value = resp.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


# ------------------------------------------------------------------ settings of the client
@dataclass(frozen=True)
class Limits:
    """The server limits batches are split under (defaults: the server's defaults,
    README "Limits"): codes or ids per request, ids one search may return, body bytes."""

    max_batch: int = 100_000
    max_results: int = 5_000_000
    max_body_bytes: int = 64 << 20

    def __post_init__(self):
        for name in ("max_batch", "max_results", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class Retry:
    """When and how long to wait before another attempt (module docstring: what is retried).
    ``attempts``: retries after the first try (0: never retry)."""

    attempts: int = 3
    backoff: float = 0.1
    max_backoff: float = 5.0
    max_retry_after: float = 30.0

    def __post_init__(self):
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) \
                or self.attempts < 0:
            raise ValueError(f"Retry.attempts must be an int >= 0, got {self.attempts!r}")
        for name in ("backoff", "max_backoff", "max_retry_after"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"Retry.{name} must be >= 0 seconds, got {getattr(self, name)!r}")

    def delay(self, attempt: int) -> float:
        """Jittered exponential backoff before retry ``attempt`` (0-based)."""
        return min(self.max_backoff, self.backoff * 2 ** attempt) * (0.5 + random.random() / 2)

    def wait(self, call: "Call", outcome, attempt: int) -> float | None:
        """Seconds to wait before retrying ``call`` after ``outcome`` (an httpx.Response or
        httpx.TransportError), or None: do not retry."""
        if not call.idempotent or attempt >= self.attempts:
            return None
        if isinstance(outcome, httpx.TransportError):
            return self.delay(attempt)
        status = outcome.status_code
        if status == 503:
            after = retry_after_s(outcome)
            if after is None:
                return self.delay(attempt)
            return after if after <= self.max_retry_after else None
        if status in (408, 502, 504):
            return self.delay(attempt)
        return None


@dataclass
class Call:
    """One HTTP request of an operation (the sans-I/O step the two clients send)."""

    method: str
    path: str
    params: dict | None = None
    content: bytes | None = None
    headers: dict = field(default_factory=dict)
    idempotent: bool = False


# ---------------------------------------------------------------------------------- requests
def path_segment(value, field_name: str) -> str:
    """``value`` as one URL path segment, percent-encoded; ``''``, ``'.'`` and ``'..'`` are
    refused (ValueError naming the field): an HTTP library resolves dot segments away, so
    ``snapshots/..`` would address the index itself (a DELETE would delete it)."""
    text = str(value)
    if text in ("", ".", ".."):
        raise ValueError(f"{field_name}: {text!r} is not a name (a path segment that URL "
                         "normalization would remove)")
    return quote(text, safe="")


def index_path(name: str, *rest: str) -> str:
    return "/".join(["/v1/indexes", path_segment(name, "name"), *rest])


def checked_words(codes, bits: int, field_name: str) -> np.ndarray:
    """Words of ``codes`` (any form :func:`~bucketsearch.index.codes.as_words` takes); errors
    name the argument, as the engine's do."""
    try:
        return as_words(codes, bits)
    except ValueError as exc:
        raise ValueError(f"{field_name}: {exc}") from None


def as_ids(ids, n: int | None = None) -> np.ndarray:
    """``ids`` as a 1-D int64 array (of length ``n`` when given: one per code); ValueError
    naming the shape and dtype otherwise."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or (n is not None and len(arr) != n) \
            or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        want = "a 1-D int array" + (f" of length {n} (one per code)" if n is not None else "")
        raise ValueError(f"ids must be {want}, got shape {arr.shape} and dtype {arr.dtype}")
    return arr.astype(np.int64)


def auto_ids(ids, first_id) -> bool:
    """Whether a write leaves the ids to the index (neither ``ids`` nor ``first_id``)."""
    return ids is None and first_id is None


_LIMIT_IN_DETAIL = re.compile(r"max_batch=(\d+)")


def read_source(src) -> bytes:
    """Bytes of a path or a binary file object."""
    if hasattr(src, "read"):
        data = src.read()
        if not isinstance(data, bytes):
            raise TypeError("restore needs a binary file object (open(path, 'rb'))")
        return data
    return Path(src).read_bytes()


def write_sink(dest, data: bytes) -> None:
    """Write ``data`` to a binary file object, or to a path atomically (temp file, fsync,
    rename)."""
    if hasattr(dest, "write"):
        dest.write(data)
        return
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


# ------------------------------------------------------------ the operations (sans I/O)
class ProgressBar:
    """``progress(done, total)`` of a bulk write: ``of(True, label)`` draws a rich bar on
    stderr, ``of(callable)`` calls it, ``of(False)`` does nothing; a context manager."""

    def __init__(self, label: str = "", call=None):
        self.label, self.call, self._bar, self._task = label, call, None, None

    @classmethod
    def of(cls, progress, label: str = "") -> "ProgressBar":
        if progress is True:
            return cls(label)
        if callable(progress):
            return cls(label, progress)
        if progress is False or progress is None:
            return cls(label, lambda done, total: None)
        raise ValueError(f"progress must be True, False or a callable (done, total), "
                         f"got {progress!r}")

    def __call__(self, done: int, total: int) -> None:
        if self.call is not None:
            self.call(done, total)
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            self._bar = Progress(TextColumn(f"[bold]{self.label}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 TimeRemainingColumn(), console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=total)
        self._bar.update(self._task, completed=done)

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()


class _Base:
    """Operations as generators yielding :class:`Call` and receiving httpx responses (a
    refused call is thrown into the generator as its typed error); :class:`Client` and
    :class:`AsyncClient` drive them. The public methods are written once here: on the
    AsyncClient they return awaitables."""

    def __init__(self, url: str = DEFAULT_URL, *, api_key: str | None = None,
                 timeout: float = 30.0, wire: str = "binary", retry: Retry | None = None,
                 limits: Limits | None = None, headers: dict | None = None, verify=True):
        self.url = str(url).rstrip("/")
        # https: the server's certificate is checked as ``verify`` says (transport.tls_context)
        self.tls = tls_context(verify) if self.url.lower().startswith("https:") else None
        if self.tls is None and not isinstance(verify, bool):
            tls_context(verify)  # a wrong value is an error whatever the scheme
        self.wire = check_wire(wire)
        self.retry = retry or Retry()
        self.limits = limits or Limits()
        self._limits_asked = limits is not None  # given: the server is not asked
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self.headers = {"user-agent": "bucketsearch-client", **(headers or {})}
        if api_key is not None:
            if not isinstance(api_key, str) or not api_key or any(c.isspace() for c in api_key):
                raise ValueError("api_key must be a non-empty string without whitespace")
            self.headers["authorization"] = f"Bearer {api_key}"
        self._bits: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, wire={self.wire!r})"

    # -- helpers -------------------------------------------------------------------------
    def _settle(self, call: Call, outcome):
        """:func:`_settle`; a 400 or 404 also forgets the cached code widths (an index
        deleted and made again with other bits is asked for them again)."""
        resp, err = _settle(call, outcome)
        if isinstance(err, (BadRequest, NotFound)):
            self._bits.clear()
        return resp, err

    @staticmethod
    def _json(method, path, body=None, idempotent=True) -> Call:
        return Call(method, path, content=None if body is None else orjson.dumps(body),
                    headers={"content-type": JSON} if body is not None else {},
                    idempotent=idempotent)

    def _remember(self, info: dict) -> dict:
        if isinstance(info, dict) and info.get("name") and info.get("bits"):
            self._bits[info["name"]] = int(info["bits"])
        return info

    def _index_bits(self, name):
        bits = self._bits.get(name)
        if bits is None:
            resp = yield self._json("GET", index_path(name))
            self._remember(resp.json())
            bits = self._bits.get(name)
            if bits is None:
                raise ProtocolError(f"index {name!r} reports no bits ({resp.text[:200]})")
        return bits

    def _chunked(self, n: int, item_bytes: int, make_call, cap: int | None = None,
                 halve_on_limits: bool = False, write: bool = False, progress=None):
        """Send items ``0..n`` in consecutive chunks under the limits; ``make_call(a, b)``
        builds the request of items ``a:b``. Returns ``[(a, b, response)]``. An error of a
        ``write`` after some chunks carries ``acknowledged``, the items they wrote.
        ``progress(done, n)`` is called after each chunk."""
        out, start = [], 0
        cap = cap or n
        if not self._limits_asked:
            yield from self._ask_limits()
        while start < n:
            size = min(n - start, cap, self.limits.max_batch,
                       max(1, (self.limits.max_body_bytes - BODY_OVERHEAD) // max(item_bytes, 1)))
            try:
                resp = yield make_call(start, start + size)
            except PayloadTooLarge as exc:
                found = _LIMIT_IN_DETAIL.search(exc.detail)
                if found and int(found.group(1)) < size:
                    self.limits = replace(self.limits, max_batch=int(found.group(1)))
                elif size > 1:
                    cap = size // 2
                else:
                    raise self._partial(exc, out, write)
                continue
            except BadRequest as exc:
                if halve_on_limits and size > 1 and ("max_results=" in exc.detail
                                                     or "max_request_probes=" in exc.detail):
                    cap = size // 2
                    continue
                raise self._partial(exc, out, write)
            except BucketsearchError as exc:
                raise self._partial(exc, out, write)
            out.append((start, start + size, resp))
            start += size
            if progress is not None:
                progress(start, n)
        return out

    def _ask_limits(self):
        """The server's limits (``GET /v1/limits``), once; a server without that route keeps
        the defaults."""
        self._limits_asked = True
        try:
            resp = yield self._json("GET", "/v1/limits")
        except (NotFound, MethodNotAllowed):
            return
        given = resp.json()
        self.limits = replace(self.limits, **{k: int(given[k]) for k in
                                              ("max_batch", "max_results", "max_body_bytes")
                                              if isinstance(given.get(k), int)})

    @staticmethod
    def _partial(exc: BucketsearchError, done: list, write: bool) -> BucketsearchError:
        if done and write:
            exc.acknowledged = sum(b - a for a, b, _ in done)
        return exc

    def _write_parts(self, name, route, codes, ids, first_id, idempotent, extra=None,
                     cap=None, accept=None, progress=None):
        """Send an insert-shaped write (codes with ids, ``first_id``, or ids given by the index)
        in chunks; ``extra`` goes in the query string (binary) or the JSON body. Returns
        ``(parts, ids, auto)``: ``[(a, b, response)]``, the ids sent (None: the index gives
        them)."""
        bits = yield from self._index_bits(name)
        words = checked_words(codes, bits, "codes")
        n = len(words)
        auto = auto_ids(ids, first_id)  # the index gives the ids (insert only)
        if auto:
            sequential = False
        elif ids is None:
            ids = np.arange(int(first_id), int(first_id) + n, dtype=np.int64)
            sequential = True
        else:
            if first_id is not None:
                raise ValueError("give ids or first_id, not both")
            ids = as_ids(ids, n)
            sequential = False
        if n == 0:
            return [], np.zeros(0, dtype=np.int64), auto
        packed = to_packed(words, bits)
        nb = n_bytes(bits)
        path = index_path(name, *route)
        extra = extra or {}
        answer = {"accept": accept} if accept else {}

        def call(a, b):
            if self.wire == "json":
                body = {"codes": [r.tobytes().hex() for r in packed[a:b]], **extra}
                if not auto:
                    body["ids"] = ids[a:b].tolist()
                call = self._json("POST", path, body, idempotent)
                call.headers.update(answer)
                return call
            headers = {"content-type": OCTET, **answer}
            if auto:
                return Call("POST", path, params={"auto_ids": "true", **extra},
                            content=packed[a:b].tobytes(), headers=headers,
                            idempotent=idempotent)
            if sequential:
                return Call("POST", path, params={"first_id": int(ids[a]), **extra},
                            content=packed[a:b].tobytes(), headers=headers,
                            idempotent=idempotent)
            return Call("POST", path, params=extra or None,
                        content=ids[a:b].astype("<i8").tobytes() + packed[a:b].tobytes(),
                        headers=headers, idempotent=idempotent)
        item_bytes = (2 * nb + 24) if self.wire == "json" else (nb + 8)
        parts = yield from self._chunked(n, item_bytes, call, cap=cap, write=True,
                                         progress=progress)
        return parts, (None if auto else ids), auto

    def _write_items(self, name, route, codes, ids, first_id, idempotent, progress=None):
        parts, ids, auto = yield from self._write_parts(name, route, codes, ids, first_id,
                                                        idempotent, progress=progress)
        if not parts:
            return 0, 0, np.zeros(0, dtype=np.int64)
        answers = [resp.json() for _, _, resp in parts]
        if auto:  # each request's ids: first_id, first_id + 1, ...
            ids = np.concatenate([np.arange(a["first_id"], a["first_id"] + a["inserted"],
                                            dtype=np.int64) for a in answers])
        return (sum(int(a.get("inserted") or 0) for a in answers),
                sum(int(a.get("replaced") or 0) for a in answers), ids)

    def _search(self, name, queries, k, max_distance, stats):
        bits = yield from self._index_bits(name)
        words = checked_words(queries, bits, "queries")
        nq = len(words)
        if nq == 0:  # no request: the engine's answer to no queries
            st = RemoteSearchStats.from_answer([], None, 0.0) if stats else None
            if st is not None:
                st.requests = 0
            return np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64), st
        packed = to_packed(words, bits)
        path = index_path(name, "search")

        def call(a, b):
            params, headers, body = encode_search(packed[a:b], k=k, max_distance=max_distance,
                                                  stats=stats, wire=self.wire)
            return Call("POST", path, params=params or None, content=body, headers=headers,
                        idempotent=True)
        nb = n_bytes(bits)
        cap = max(1, self.limits.max_results // k) if k is not None else None
        parts = yield from self._chunked(nq, (2 * nb + 3) if self.wire == "json" else nb, call,
                                         cap=cap, halve_on_limits=True)
        decoded = [_decoded(resp) for _, _, resp in parts]
        for (a, b, _), d in zip(parts, decoded):
            if len(d[0]) != b - a + 1:
                raise ProtocolError(f"search answer holds {len(d[0]) - 1} queries, {b - a} sent")
        lims, D, I = concat_csr(decoded)
        if stats and any(d[3] is None for d in decoded):
            raise ProtocolError("stats were asked for but the answer holds none")
        st = RemoteSearchStats.concat([d[3] for d in decoded]) if stats else None
        return lims, D, I, st

    # -- the operations ------------------------------------------------------------------
    def _g_create_index(self, name, bits, mode, substrings):
        body = {"name": name, "bits": bits, "mode": mode}
        if substrings is not None:
            body["substrings"] = substrings
        resp = yield self._json("POST", "/v1/indexes", body, idempotent=False)
        return self._remember(resp.json())

    def _g_delete_index(self, name):
        self._bits.pop(name, None)
        yield self._json("DELETE", index_path(name), idempotent=False)

    def _g_indexes(self):
        resp = yield self._json("GET", "/v1/indexes")
        return [self._remember(info) for info in resp.json()["indexes"]]

    def _g_ready(self):
        resp = yield self._json("GET", "/readyz")
        return resp.json()

    def _g_sample(self, name, n, seed):
        bits = yield from self._index_bits(name)
        resp = yield Call("GET", index_path(name, "sample"), params={"n": n, "seed": seed},
                          headers={"accept": OCTET}, idempotent=True)
        nb = n_bytes(bits)
        m, rest = divmod(len(resp.content), 8 + nb)
        if rest or int(resp.headers.get("x-bits", bits)) != bits:
            raise ProtocolError(f"sample of index {name!r}: {len(resp.content)} bytes (X-Bits "
                                f"{resp.headers.get('x-bits')!r}), not {8 + nb} bytes per "
                                f"{bits}-bit item", status=resp.status_code)
        ids = np.frombuffer(resp.content, dtype="<i8", count=m).astype(np.int64)
        packed = np.frombuffer(resp.content, dtype=np.uint8, offset=8 * m).reshape(m, nb).copy()
        return ids, packed, int(resp.headers.get("x-index-size", m))

    def _g_index(self, name):
        resp = yield self._json("GET", index_path(name))
        return self._remember(resp.json())

    def _g_advise(self, name, queries, options):
        body = {k: _plain(v) for k, v in options.items() if v is not None}
        if queries is not None:
            bits = yield from self._index_bits(name)
            body["codes"] = to_hex(checked_words(queries, bits, "queries"), bits)
        resp = yield self._json("POST", index_path(name, "advise"), body)
        return resp.json()

    def _g_audit(self):
        resp = yield self._json("GET", "/v1/audit")
        return resp.json()

    def _g_cost_model(self, name):
        resp = yield self._json("GET", index_path(name, "cost-model"))
        return resp.json()

    def _g_merge(self, name):
        resp = yield self._json("POST", index_path(name, "merge"))
        return self._remember(resp.json())

    def _g_set_mode(self, name, mode, substrings):
        body = {"mode": mode} if substrings is None else {"mode": mode, "substrings": substrings}
        resp = yield self._json("PATCH", index_path(name), body)
        return self._remember(resp.json())

    def _g_add(self, name, codes, ids, first_id, progress=False):
        with ProgressBar.of(progress, f"add to {name}") as bar:
            _, _, ids = yield from self._write_items(name, ("items",), codes, ids, first_id,
                                                     False, progress=bar)
        return ids

    def _g_add_dedup(self, name, codes, radius, ids, first_id, max_reported):
        for field_name, value, low in (("radius", radius, 0), ("max_reported", max_reported, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < low:
                raise ValueError(f"{field_name} must be an int >= {low}, got {value!r}")
        extra = {"radius": int(radius), "max_reported": int(max_reported)}
        parts, _, auto = yield from self._write_parts(
            name, ("items", "dedup"), codes, ids, first_id, idempotent=not auto_ids(ids, first_id),
            extra=extra, cap=max(1, self.limits.max_results // int(max_reported)),
            accept=OCTET if self.wire == "binary" else JSON)
        if not parts:
            return DedupResult.empty()
        decoded = []
        for a, b, resp in parts:
            try:
                got = decode_dedup(resp)
            except ValueError as exc:
                raise ProtocolError(str(exc), status=resp.status_code) from None
            if len(got[0]) != b - a:
                raise ProtocolError(f"dedup answer holds {len(got[0])} items, {b - a} sent")
            decoded.append(got)
        lims, D, I = concat_csr([(d[2], d[3], d[4]) for d in decoded])
        first = None
        if auto:  # the first request's first_id (binary answers: the first id inserted)
            first = decoded[0][5]
            if first is None:
                given = np.concatenate([d[0] for d in decoded])
                first = int(given[given >= 0][0]) if (given >= 0).any() else None
        return DedupResult(np.concatenate([d[0] for d in decoded]),
                           np.concatenate([d[1] for d in decoded]), lims, D, I, first)

    def _g_upsert(self, name, codes, ids):
        if ids is None:
            raise ValueError("upsert needs ids (one per code): it replaces the code of each id")
        inserted, replaced, _ = yield from self._write_items(name, ("items", "upsert"), codes,
                                                             ids, None, True)
        return inserted, replaced

    def _g_remove(self, name, ids):
        ids = as_ids(ids)
        path = index_path(name, "items", "delete")
        parts = yield from self._chunked(len(ids), 21, lambda a, b: self._json(
            "POST", path, {"ids": ids[a:b].tolist()}, idempotent=False), write=True)
        return sum(int(resp.json().get("deleted") or 0) for _, _, resp in parts)

    def _g_get(self, name, ids, form, missing):
        if form not in CODE_FORMATS:
            raise ValueError(f"format must be one of {', '.join(CODE_FORMATS)}, got {form!r}")
        if missing not in MISSING:
            raise ValueError(f"missing must be one of {', '.join(MISSING)}, got {missing!r}")
        bits = yield from self._index_bits(name)
        ids = as_ids(ids)
        path = index_path(name, "items", "get")
        parts = yield from self._chunked(len(ids), 21, lambda a, b: self._json(
            "POST", path, {"ids": ids[a:b].tolist()}))
        hexes = [code for _, _, resp in parts for code in resp.json()["codes"]]
        if len(hexes) != len(ids):
            raise ProtocolError(f"items/get answered {len(hexes)} codes for {len(ids)} ids")
        found = np.array([h is not None for h in hexes], dtype=bool)
        words = np.zeros((len(ids), (bits + 63) // 64), dtype=np.uint64)
        if found.any():
            words[found] = pack_hex([h for h in hexes if h is not None], bits)
        if missing == "raise" and not found.all():
            gone = ids[~found]
            raise MissingItems(f"{len(gone)} of {len(ids)} ids are not live items of index "
                               f"{name!r}: {gone[:20].tolist()}"
                               + (" ..." if len(gone) > 20 else ""), gone.tolist(),
                               method="POST", path=path)
        codes = convert_words(words, bits, form)
        return (codes, found) if missing == "mask" else codes

    def _g_range_search(self, name, queries, max_distance, stats):
        lims, D, I, st = yield from self._search(name, queries, None, max_distance, stats)
        return (lims, D, I, st) if stats else (lims, D, I)

    def _g_search(self, name, queries, k, max_distance, stats):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        lims, D, I, st = yield from self._search(name, queries, int(k), max_distance, stats)
        D, I = knn_rows(lims, D, I, int(k))
        return (D, I, st) if stats else (D, I)

    def _g_backup(self, name, dest):
        resp = yield Call("GET", index_path(name, "backup"), headers={"accept": OCTET},
                          idempotent=True)
        write_sink(dest, resp.content)
        return len(resp.content)

    def _g_restore(self, name, src):
        data = read_source(src)
        resp = yield Call("POST", index_path(name, "restore"), content=data,
                          headers={"content-type": OCTET}, idempotent=False)
        return self._remember(resp.json())

    def _g_snapshot(self, name):
        resp = yield Call("POST", index_path(name, "snapshots"), idempotent=False)
        return resp.json()

    def _g_snapshots(self, name):
        resp = yield self._json("GET", index_path(name, "snapshots"))
        return resp.json()

    def _g_download_snapshot(self, name, snapshot, dest):
        resp = yield Call("GET", index_path(name, "snapshots", path_segment(snapshot,
                                                                           "snapshot")),
                          idempotent=True)
        write_sink(dest, resp.content)
        return len(resp.content)

    def _g_delete_snapshot(self, name, snapshot):
        yield Call("DELETE", index_path(name, "snapshots", path_segment(snapshot, "snapshot")),
                   idempotent=False)

    def _g_start_job(self, index, radius, output):
        resp = yield self._json("POST", "/v1/jobs", {"index": index, "radius": radius,
                                                     "output": output}, idempotent=False)
        return resp.json()

    def _g_job(self, job_id):
        resp = yield self._json("GET", "/v1/jobs/" + path_segment(job_id, "job_id"))
        return resp.json()

    def _g_jobs(self, index):
        resp = yield Call("GET", "/v1/jobs", params=None if index is None else {"index": index},
                          idempotent=True)
        return resp.json()["jobs"]

    def _g_cancel_job(self, job_id):
        resp = yield self._json("POST", "/v1/jobs/" + path_segment(job_id, "job_id") +
                                "/cancel")  # idempotent: a finished job is left as it is
        return resp.json()

    def _g_delete_job(self, job_id):
        yield self._json("DELETE", "/v1/jobs/" + path_segment(job_id, "job_id"),
                         idempotent=False)

    def _g_job_page(self, job_id, output, offset, rows):
        """Records ``offset .. offset + rows`` of a completed job's result (binary)."""
        resp = yield Call("GET", "/v1/jobs/" + path_segment(job_id, "job_id") + "/result",
                          params={"format": "binary", "offset": int(offset), "limit": int(rows)},
                          idempotent=True)
        try:
            return decode_job_records(resp.content, output)
        except ValueError as exc:
            raise ProtocolError(str(exc), status=resp.status_code) from None

    @staticmethod
    def _check_page_rows(rows) -> int:
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
            raise ValueError(f"page_rows must be an int >= 1, got {rows!r}")
        return int(rows)

    # -- the public API (returns awaitables on AsyncClient) --------------------------------
    def create_index(self, name: str, bits: int, mode: str = "auto",
                     substrings: int | None = None):
        """Create an empty index; returns its info (``mode``: auto, single or mih)."""
        return self._run(self._g_create_index(name, bits, mode, substrings))

    def delete_index(self, name: str):
        """Delete an index and its files."""
        return self._run(self._g_delete_index(name))

    def indexes(self) -> list[dict]:
        """Every index's info (name, bits, mode, state, size, ...)."""
        return self._run(self._g_indexes())

    def ready(self) -> dict:
        """``GET /readyz``: the server's readiness and index states (:class:`Unavailable`
        while it starts)."""
        return self._run(self._g_ready())

    def sample(self, name: str, n: int = 100, seed: int = 0):
        """Up to ``n`` live items drawn uniformly (seeded): ``(ids, packed codes, live
        size)``."""
        return self._run(self._g_sample(name, n, seed))

    def index(self, name: str) -> dict:
        """One index's info."""
        return self._run(self._g_index(name))

    def cost_model(self, name: str) -> dict:
        """t0, the extended model and per radius modeled vs measured cost."""
        return self._run(self._g_cost_model(name))

    def advise(self, name: str, *, sample: int | None = None, query_ids=None, queries=None,
               radius_max: int | None = None, db_ids=None, db_labels=None, query_labels=None,
               pairs=None, **options) -> dict:
        """The radius advisor (``POST /v1/indexes/{name}/advise``): per radius 0..radius_max
        the answers per query, the empty-ball share, the modeled and measured cost and, with
        relevance (``db_ids`` + ``db_labels``, ``query_labels`` for ``queries``, or ``pairs``
        ``[(query position, item id, duplicate), ...]``), precision / recall / F1 / RAMAP with
        their intervals; ``recommendation`` (radius, reason, rule). Queries: a ``sample`` of
        the index's items, ``query_ids``, or ``queries`` (codes in any form ``add`` takes).
        ``options``: ``holdout``, ``seed``, ``objective``, ``min_gain``, ``min_precision``,
        ``budget_us``, ``resamples``, ``repeats``, ``conventions`` (the route's fields)."""
        return self._run(self._g_advise(name, queries, {
            "sample": sample, "query_ids": query_ids, "radius_max": radius_max,
            "db_ids": db_ids, "db_labels": db_labels, "query_labels": query_labels,
            "pairs": pairs, **options}))

    def audit(self) -> dict:
        """The exactness audit's counters and last mismatches (``GET /v1/audit``)."""
        return self._run(self._g_audit())

    def merge(self, name: str) -> dict:
        """Fold the delta and tombstones into a new snapshot now; returns the info."""
        return self._run(self._g_merge(name))

    def set_mode(self, name: str, mode: str, substrings: int | None = None) -> dict:
        """Rebuild the index in ``mode`` (single, mih, scan or auto; ``substrings`` of mih);
        returns the info once the new mode serves."""
        return self._run(self._g_set_mode(name, mode, substrings))

    def add(self, name: str, codes, ids=None, *, first_id: int | None = None,
            progress=False) -> np.ndarray:
        """Insert codes with ``ids``, or ``first_id, first_id + 1, ...``; with neither, the
        index gives the ids (one more than the largest id it ever held, never given twice).
        An id already present is a 409 Conflict. Returns the ids inserted (int64, in the
        order of ``codes``). Never retried. A bulk add goes in requests of at most the
        server's ``max_batch``; ``progress=True`` draws a bar on stderr as they are
        acknowledged (or give a callable ``progress(done, total)``)."""
        return self._run(self._g_add(name, codes, ids, first_id, progress))

    def add_dedup(self, name: str, codes, radius: int, ids=None, *,
                  first_id: int | None = None, max_reported: int = 10) -> DedupResult:
        """Dedup on ingest (``POST .../items/dedup``): insert, in order, each code with no live
        item and no earlier inserted code within ``radius``; returns the engine's
        :class:`~bucketsearch.index.storage.dedup.DedupResult` (per code its id, whether it
        was inserted, and the nearest ``max_reported`` items that blocked it). A batch split
        over several requests gets the same answer as one (each sees the earlier parts'
        items as live). Retried only with ``ids`` or ``first_id`` (a retry whose first attempt
        was applied answers each item as blocked by its own id at distance 0)."""
        return self._run(self._g_add_dedup(name, codes, radius, ids, first_id, max_reported))

    def upsert(self, name: str, codes, ids) -> tuple[int, int]:
        """Insert or replace the code of each id (one WAL record per request; idempotent, so
        retried). Returns ``(inserted, replaced)``: new ids, and live ids given a new code."""
        return self._run(self._g_upsert(name, codes, ids))

    def remove(self, name: str, ids) -> int:
        """Delete items by id (unknown ids are ignored); returns the number removed."""
        return self._run(self._g_remove(name, ids))

    def get(self, name: str, ids, format: str = "packed", missing: str = "raise"):
        """Codes of ``ids``, one row per id, in ``format`` (see :data:`CODE_FORMATS`; packed
        uint8 rows by default). An id that is no live item raises :class:`MissingItems`, or with
        ``missing="mask"`` the answer is ``(codes, found)`` with zero codes where ``found`` is
        False."""
        return self._run(self._g_get(name, ids, format, missing))

    def range_search(self, name: str, queries, max_distance: int, stats: bool = False):
        """Every item with ``d <= max_distance``: ``(lims, D, I[, stats])`` in faiss's CSR
        layout, each query's results ordered by (distance, id); ``stats`` a
        :class:`RemoteSearchStats`."""
        return self._run(self._g_range_search(name, queries, max_distance, stats))

    def search(self, name: str, queries, k: int, max_distance: int | None = None,
               stats: bool = False):
        """The ``k`` nearest items (with ``max_distance``: only those with ``d <=
        max_distance``): ``(D, I[, stats])`` of shape ``(nq, k)``, ordered by (distance, id),
        padded with -1."""
        return self._run(self._g_search(name, queries, k, max_distance, stats))

    def backup(self, name: str, dest) -> int:
        """Download a self-checking backup of the index to ``dest`` (a path, written
        atomically, or a binary file object); returns its size in bytes."""
        return self._run(self._g_backup(name, dest))

    def restore(self, name: str, src) -> dict:
        """Create index ``name`` from a backup file or a snapshot tar (a path or a binary file
        object); the server verifies it first (409 if the name exists). Returns the new
        index's info."""
        return self._run(self._g_restore(name, src))

    def snapshot(self, name: str) -> dict:
        """Make a snapshot of the index on the server (a tar with checksums, kept there until
        deleted); returns its listing entry: ``snapshot`` (its name), ``bytes``, ``sha256``,
        ``items``, ... (``POST /v1/indexes/{name}/snapshots``)."""
        return self._run(self._g_snapshot(name))

    def snapshots(self, name: str) -> list[dict]:
        """The index's snapshots on the server, oldest first."""
        return self._run(self._g_snapshots(name))

    def download_snapshot(self, name: str, snapshot: str, dest) -> int:
        """Write snapshot ``snapshot`` (a tar) to ``dest`` (a path, written atomically, or a
        binary file object); returns its size in bytes. ``restore`` reads it back."""
        return self._run(self._g_download_snapshot(name, snapshot, dest))

    def delete_snapshot(self, name: str, snapshot: str) -> None:
        """Remove a snapshot from the server."""
        return self._run(self._g_delete_snapshot(name, snapshot))

    def start_job(self, index: str, radius: int, output: str = "pairs") -> dict:
        """Start a near-duplicate job on the server (``POST /v1/jobs``): every pair of the
        index's items within ``radius`` (``output="pairs"``), their clusters (``"clusters"``)
        or the keep-list (``"keep"``), over the index's state now. Returns its status (``id``,
        ``state``, progress); never retried."""
        return self._run(self._g_start_job(index, radius, output))

    def job(self, job_id: str) -> dict:
        """A job's status: state, items done, pairs so far, elapsed and remaining seconds,
        the join's measured against modeled phases, the result's size once completed."""
        return self._run(self._g_job(job_id))

    def jobs(self, index: str | None = None) -> list[dict]:
        """Every job's status (only those of ``index`` when given)."""
        return self._run(self._g_jobs(index))

    def cancel_job(self, job_id: str) -> dict:
        """Stop a running job; returns its status."""
        return self._run(self._g_cancel_job(job_id))

    def delete_job(self, job_id: str) -> None:
        """Remove a finished job and its files from the server."""
        return self._run(self._g_delete_job(job_id))


def _plain(value):
    """Arrays (and rows of arrays) as JSON lists of plain ints, floats and bools."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decoded(resp: httpx.Response):
    try:
        return decode_search(resp)
    except ValueError as exc:
        raise ProtocolError(str(exc), status=resp.status_code) from None


def _step(gen, value, exc):
    """Advance an operation: ``(True, result)`` when it returned, else ``(False, next call)``."""
    try:
        return False, (gen.throw(exc) if exc is not None else gen.send(value))
    except StopIteration as stop:
        return True, stop.value


def _settle(call: Call, outcome):
    """``(response, None)`` for a 2xx, else ``(None, typed error)``."""
    if isinstance(outcome, httpx.TransportError):
        err = TransportError(f"{type(outcome).__name__}: {outcome or 'no answer'}",
                             method=call.method, path=call.path)
        err.__cause__ = outcome
        return None, err
    if outcome.status_code >= 300:
        return None, error_for(outcome, call.method, call.path)
    return outcome, None


def _limits(max_connections: int) -> httpx.Limits:
    return httpx.Limits(max_connections=max_connections,
                        max_keepalive_connections=max_connections)


class Client(_Base):
    """Blocking client (``with Client(url) as c: ...``); see the module docstring. Parameters:
    ``url``; ``api_key`` (sent as ``Authorization: Bearer``); ``timeout`` seconds per request;
    ``wire`` "binary" or "json"; ``retry`` (:class:`Retry`); ``limits`` (:class:`Limits`);
    extra ``headers``; ``verify`` for https (True: the system's CAs; a CA file path; an
    ``ssl.SSLContext``; False: none); ``max_connections`` kept alive; ``transport``: an httpx
    transport, sent through ``httpx.Client`` (default: keep-alive HTTP/1.1 sockets,
    :class:`~bucketsearch.loadtest.transport.PooledHTTP`, about a third of httpx's CPU per
    request)."""

    def __init__(self, url: str = DEFAULT_URL, *, max_connections: int = 10,
                 transport: httpx.BaseTransport | None = None, **kw):
        super().__init__(url, **kw)
        self._http = None if transport is None else httpx.Client(
            base_url=self.url, headers=self.headers, timeout=httpx.Timeout(self.timeout),
            verify=self.tls or True,
            limits=_limits(max_connections), transport=transport)
        self._pool = PooledHTTP(self.url, self.headers, self.timeout, max_connections,
                                self.tls) if transport is None else None

    def _transmit(self, call: Call):
        try:
            send = self._pool.request if self._http is None else self._http.request
            return send(call.method, call.path, params=call.params, content=call.content,
                        headers=call.headers)
        except httpx.TransportError as exc:
            return exc

    def _attempt(self, call: Call):
        for attempt in itertools.count():
            outcome = self._transmit(call)
            wait = self.retry.wait(call, outcome, attempt)
            if wait is None:
                return self._settle(call, outcome)
            time.sleep(wait)

    def _run(self, gen):
        value = exc = None
        while True:
            done, call = _step(gen, value, exc)
            if done:
                return call
            value, exc = self._attempt(call)

    def wait_job(self, job_id: str, timeout: float = 3600.0, poll: float = 0.2) -> dict:
        """Poll a job until it is no longer running; its status (``TimeoutError`` after
        ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while (info := self.job(job_id))["state"] == "running":
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still running after {timeout} s")
            time.sleep(poll)
        return info

    def job_result(self, job_id: str, page_rows: int = 1 << 20):
        """Iterate over a completed job's result, ``page_rows`` records per request (each a
        structured array of :data:`~bucketsearch.loadtest.wire.JOB_RECORDS`: ``a, b, d``
        pairs, ``id, cluster``, or ``id``), never the whole result in memory; pages are
        retried. :class:`Conflict` when the job has not completed."""
        rows = self._check_page_rows(page_rows)
        info = self.job(job_id)
        total = (info.get("result") or {}).get("rows", 0)
        offset = 0
        while offset < total or offset == 0:
            page = self._run(self._g_job_page(job_id, info["output"], offset, rows))
            if not len(page):
                return
            yield page
            offset += len(page)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        else:
            self._pool.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(_Base):
    """asyncio client (``async with AsyncClient(url) as c: await c.search(...)``); the same
    parameters and methods as :class:`Client`, every method awaitable. ``transport``: an
    httpx async transport, e.g. ``httpx_aiohttp.AiohttpTransport()`` (several times httpx's
    own throughput on 2 cores)."""

    def __init__(self, url: str = DEFAULT_URL, *, max_connections: int = 100,
                 transport: httpx.AsyncBaseTransport | None = None, **kw):
        super().__init__(url, **kw)
        self._http = httpx.AsyncClient(base_url=self.url, headers=self.headers,
                                       timeout=httpx.Timeout(self.timeout), verify=self.tls or True,
                                       limits=_limits(max_connections), transport=transport)

    async def _transmit(self, call: Call):
        try:
            return await self._http.request(call.method, call.path, params=call.params,
                                            content=call.content, headers=call.headers)
        except httpx.TransportError as exc:
            return exc

    async def _attempt(self, call: Call):
        for attempt in itertools.count():
            outcome = await self._transmit(call)
            wait = self.retry.wait(call, outcome, attempt)
            if wait is None:
                return self._settle(call, outcome)
            await asyncio.sleep(wait)

    async def _run(self, gen):
        value = exc = None
        while True:
            done, call = _step(gen, value, exc)
            if done:
                return call
            value, exc = await self._attempt(call)

    async def wait_job(self, job_id: str, timeout: float = 3600.0, poll: float = 0.2) -> dict:
        """Poll a job until it is no longer running; its status."""
        deadline = time.monotonic() + timeout
        while (info := await self.job(job_id))["state"] == "running":
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still running after {timeout} s")
            await asyncio.sleep(poll)
        return info

    async def job_result(self, job_id: str, page_rows: int = 1 << 20):
        """``async for page in client.job_result(id)``: as :meth:`Client.job_result`."""
        rows = self._check_page_rows(page_rows)
        info = await self.job(job_id)
        total = (info.get("result") or {}).get("rows", 0)
        offset = 0
        while offset < total or offset == 0:
            page = await self._run(self._g_job_page(job_id, info["output"], offset, rows))
            if not len(page):
                return
            yield page
            offset += len(page)

    async def aclose(self) -> None:
        await self._http.aclose()

    close = aclose

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


__all__ = ["Client", "AsyncClient", "Limits", "Retry", "RemoteSearchStats", "BucketsearchError",
           "ClientError", "BadRequest", "Unauthorized", "Forbidden", "NotFound",
           "MethodNotAllowed", "RequestTimeout", "Conflict", "PayloadTooLarge",
           "UnsupportedMediaType", "ServerError", "Unavailable", "TransportError",
           "ProtocolError", "MissingItems", "DedupResult"]
