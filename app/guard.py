"""The guard in front of every route: API key, concurrency cap, body size and body time, all
decided before the route reads (or FastAPI parses) a byte of the body.

One pure ASGI middleware does the four checks, in this order:

1. **Auth.** Each request needs a permission, ``open``, ``read`` or ``write``
   (:class:`AccessPolicy`: the route's declared ``ReadAuth``/``WriteAuth`` dependency, else
   ``open`` for the paths in :data:`OPEN_PATHS`, else ``read`` for GET/HEAD and ``write`` for
   every other method, so a route that declares nothing, or no route at all, fails closed).
   :func:`authorize` applies the keys: with ``api_key`` set writes need it; with ``read_key``
   set reads need it or the ``api_key``; with only ``read_key`` set nobody may write (there is
   no write key). 401 + ``WWW-Authenticate: Bearer`` for a missing or malformed header, 403 for
   a wrong key or the read key on a write. Keys are compared as SHA-256 digests with
   ``hmac.compare_digest`` (constant time, and the key length does not leak either).
2. **Declared size.** A ``Content-Length`` above ``max_body_bytes`` is 413 at once.
3. **Concurrency cap.** Beyond ``max_concurrent_requests`` requests in flight, 503 with
   ``Retry-After`` at once (nothing queues); ``/healthz``, ``/readyz`` and ``/metrics`` are
   not counted and never refused. A request holds its slot while its body arrives, so the cap
   also bounds the memory of bodies in flight (cap x ``max_body_bytes``), and the body timeout
   bounds how long a slow client holds a slot.
4. **The body.** Read in full before the route runs: a chunked body is counted as it streams
   in and 413 as soon as it passes ``max_body_bytes``; a body still incomplete
   ``body_timeout_s`` seconds after the request arrived gets 408. A watchdog sweeps the readers
   blocked in ``receive`` a few times per timeout period and cancels the late ones, so a
   request pays a dict insert per receive, not a timer (``asyncio.timeout`` costs ~12 us).

The guard reads a request's body itself, in full and within both limits, before the route
runs, and replays it to the route as one message (see :class:`Guard`). Every early answer is
JSON ``{"detail": ...}`` and carries ``Connection: close`` when a body may still be on the wire,
so the server does not drain (or wait for) a body it refused.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from dataclasses import dataclass

import orjson
from starlette._utils import get_route_path

OPEN, READ, WRITE = "open", "read", "write"
RANK = {OPEN: 0, READ: 1, WRITE: 2}

#: Paths anyone may GET whatever keys are set: liveness, readiness, and the API's description.
#: ``/metrics`` is not among them: it names every index, so it needs the read key when one is
#: set (Prometheus: ``authorization: {credentials: <key>}`` in the scrape config).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect",
                        "/redoc", "/ui"})
#: Path prefixes open like OPEN_PATHS: the Swagger UI / ReDoc assets (app.main.DOCS_ASSETS_URL)
#: and the dashboard's files (app.routers.ui: static files only; its data come from /v1/...).
OPEN_PREFIXES = ("/docs/assets/", "/ui/")
#: Paths outside the concurrency cap: probes and the scrape must answer under overload.
UNCAPPED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
READ_METHODS = frozenset({"GET", "HEAD"})

#: The scope key where the guard records the permission it enforced (the route dependencies
#: in app.deps read it and skip their own, identical check).
SCOPE_KEY = "bucketsearch.permission"

API_KEY_VAR = "BUCKETSEARCH_API_KEY"
READ_KEY_VAR = "BUCKETSEARCH_READ_KEY"


# ------------------------------------------------------------------------------------ policy
def default_permission(method: str, path: str) -> str:
    """The permission of a request no route declares one for: fail closed."""
    if (path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)) and method in READ_METHODS:
        return OPEN
    return READ if method in READ_METHODS else WRITE


def flat_routes(routes) -> list:
    """Every route of an app with its effective path, methods, regex and dependencies (FastAPI
    >= 0.16x keeps included routers as lazy groups: ``iter_route_contexts`` flattens them)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # older FastAPI: included routes are plain APIRoutes already
        return list(routes)
    return list(iter_route_contexts(routes))


class AccessPolicy:
    """``permission(method, path)`` for every route of an app, from the routes themselves.

    ``declared(route)`` returns the permission a route declares (``"read"``/``"write"``) or
    None; routes that declare nothing get :func:`default_permission`. Paths are matched with
    the router's own regexes, so the guard and the router agree on which route a path is."""

    CACHE_SIZE = 4096

    def __init__(self, routes, declared):
        # in the router's order: the first route whose path and method match is the one the
        # router runs (a path that matches with another method only is the router's 405)
        self.routes: list[tuple] = []
        for route in flat_routes(routes):
            methods = getattr(route, "methods", None)
            regex = getattr(route, "path_regex", None)
            if not methods or regex is None:
                continue  # websocket routes, mounts: none in this app
            self.routes.append((regex.match, {m: declared(route) or default_permission(
                m, route.path) for m in methods}))
        self._cache: dict[tuple[str, str], str] = {}

    def permission(self, method: str, path: str) -> str:
        key = (method, path)
        perm = self._cache.get(key)
        if perm is None:
            perm = self._lookup(method, path)
            if len(self._cache) >= self.CACHE_SIZE:  # paths carry index names: stay bounded
                self._cache.clear()
            self._cache[key] = perm
        return perm

    def _lookup(self, method: str, path: str) -> str:
        for match, by_method in self.routes:
            if method in by_method and match(path):
                return by_method[method]
        return default_permission(method, path)


# -------------------------------------------------------------------------------------- keys
def _digest(secret: str | bytes) -> bytes:
    return hashlib.sha256(secret.encode() if isinstance(secret, str) else secret).digest()


@dataclass(frozen=True)
class Keys:
    """SHA-256 digests of the configured keys (None: not set)."""

    write: bytes | None
    read: bytes | None

    @classmethod
    def of(cls, settings) -> Keys:
        api, read = settings.api_key, settings.read_key
        return cls(None if api is None else _digest(api.get_secret_value()),
                   None if read is None else _digest(read.get_secret_value()))


@dataclass(frozen=True)
class Denial:
    status: int
    detail: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


_BEARER = re.compile(rb"\s*bearer\s+(\S+)\s*\Z", re.IGNORECASE)
MISSING = Denial(401, "missing or malformed 'Authorization: Bearer <key>' header",
                 ((b"www-authenticate", b"Bearer"),))
INVALID = Denial(403, "invalid API key")
READ_KEY_WRITE = Denial(403, f"the read key cannot write: writes need the write key "
                             f"({API_KEY_VAR})")
NO_WRITE_KEY = Denial(403, f"writes are disabled: only {READ_KEY_VAR} is set, so there is no "
                           f"write key; set {API_KEY_VAR} to allow writes")


def bearer_token(authorization: bytes | str | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    if not authorization:
        return None
    if isinstance(authorization, str):
        authorization = authorization.encode("latin-1")
    m = _BEARER.match(authorization)
    return m.group(1) if m else None


def authorize(permission: str, keys: Keys, authorization: bytes | str | None) -> Denial | None:
    """None if a request needing ``permission`` may pass with this Authorization header."""
    if permission == OPEN:
        return None
    if permission == WRITE:
        if keys.write is None:
            return None if keys.read is None else NO_WRITE_KEY  # fail closed
    elif keys.read is None:
        return None  # reads are open unless a read key is set
    token = bearer_token(authorization)
    if token is None:
        return MISSING
    given = _digest(token)
    ok = keys.write is not None and hmac.compare_digest(given, keys.write)
    if permission == READ:
        ok |= hmac.compare_digest(given, keys.read)  # both compared: no early exit
    if ok:
        return None
    if permission == WRITE and keys.read is not None and hmac.compare_digest(given, keys.read):
        return READ_KEY_WRITE
    return INVALID


# ------------------------------------------------------------------------------ middleware
class _Reader:
    """A request whose body is being read (the watchdog's handle on it)."""

    __slots__ = ("expired",)

    def __init__(self):
        self.expired = False  # set by the watchdog just before it cancels the reader


class BodyWatchdog:
    """Readers blocked in ``receive`` with their deadlines; a timer sweeps them while any are
    waiting and cancels the overdue ones (``expired`` set first, so the reader knows the
    cancellation is the timeout's and not the server's)."""

    def __init__(self):
        self.waiting: dict[_Reader, tuple[float, asyncio.Task]] = {}
        self.handle: asyncio.TimerHandle | None = None

    def add(self, reader: _Reader, deadline: float, task: asyncio.Task, interval: float) -> None:
        self.waiting[reader] = (deadline, task)
        if self.handle is None:
            loop = task.get_loop()
            self.handle = loop.call_later(interval, self._sweep, loop, interval)

    def _sweep(self, loop, interval: float) -> None:
        now = loop.time()
        for reader, (deadline, task) in list(self.waiting.items()):
            if deadline <= now:
                del self.waiting[reader]
                reader.expired = True
                task.cancel()
        self.handle = loop.call_later(interval, self._sweep, loop, interval) \
            if self.waiting else None


async def answer(send, status: int, detail: str, headers=(), close: bool = False) -> None:
    """A JSON ``{"detail": ...}`` answer; ``close``: end the connection after it."""
    body = orjson.dumps({"detail": detail})
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            *headers]
    if close:
        head.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


def too_large(limit: int, declared: int | None = None) -> str:
    size = "request body" if declared is None else f"request body of {declared} bytes"
    return f"{size} exceeds the limit of {limit} bytes (BUCKETSEARCH_MAX_BODY_BYTES)"


class Guard:
    """Pure ASGI middleware: auth, concurrency cap, body size and body time (module doc).

    A request with a body (Content-Length > 0 or chunked) has it read here, in full, before
    the route runs (every route reads its whole body before any work anyway), and replayed to
    the route as one message: so the size and time limits hold on every route, including the
    routes whose body FastAPI parses itself and those that take no body.

    ``app_state`` is the FastAPI app's ``state`` (settings and metrics are read from it per
    request, so a test may swap them); ``make_policy()`` returns the AccessPolicy (called
    when Starlette builds the middleware stack, at the first request: every route is there)."""

    def __init__(self, app, app_state, make_policy):
        self.app = app
        self.app_state = app_state
        self.policy: AccessPolicy = make_policy()
        self.in_flight = 0
        self.watchdog = BodyWatchdog()
        self._settings: tuple | None = None  # (settings, api_key, read_key) of self._keys
        self._keys: Keys | None = None

    def _count(self, reason: str) -> None:
        metrics = getattr(self.app_state, "metrics", None)
        if metrics is not None:
            metrics.rejections.labels(reason).inc()

    def _keys_of(self, settings) -> Keys:
        """The digests of the configured keys, recomputed when the settings or a key change."""
        current = (settings, settings.api_key, settings.read_key)
        if self._settings is None or any(a is not b for a, b in zip(current, self._settings)):
            self._keys, self._settings = Keys.of(settings), current
        return self._keys

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            if scope["type"] == "websocket":  # none today; a new one must not slip through
                keys = self._keys_of(self.app_state.settings)
                auth = dict(scope["headers"]).get(b"authorization")
                if authorize(self.policy.permission("GET", get_route_path(scope)), keys,
                             auth) is not None:
                    self._count("auth")
                    return await send({"type": "websocket.close", "code": 1008})
            return await self.app(scope, receive, send)
        settings = self.app_state.settings
        keys = self._keys_of(settings)
        authorization = length = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
        has_body = chunked or (length is not None and length != b"0")
        path = get_route_path(scope)
        permission = self.policy.permission(scope["method"], path)
        denial = authorize(permission, keys, authorization)
        if denial is not None:
            self._count("auth")
            return await answer(send, denial.status, denial.detail, denial.headers, has_body)
        scope[SCOPE_KEY] = permission
        limit = settings.max_body_bytes
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                self._count("bad_length")
                return await answer(send, 400, "Content-Length header is not an integer",
                                    close=True)
            if declared > limit:
                self._count("body_size")
                return await answer(send, 413, too_large(limit, declared), close=True)
        capped = path not in UNCAPPED_PATHS
        if capped:
            if self.in_flight >= settings.max_concurrent_requests:
                self._count("concurrency")
                return await answer(
                    send, 503, f"too many requests in flight (max_concurrent_requests="
                               f"{settings.max_concurrent_requests}, "
                               "BUCKETSEARCH_MAX_CONCURRENT_REQUESTS); retry shortly",
                    ((b"retry-after", b"1"),), has_body)
            self.in_flight += 1
        try:
            if not has_body:
                return await self.app(scope, receive, send)
            body = await self._read_body(receive, send, limit, settings.body_timeout_s)
            if body is None:
                return  # answered 408/413, or the client left
            replayed = False

            async def replay():
                nonlocal replayed
                if replayed:
                    return await receive()  # http.disconnect, when it comes
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, replay, send)
        finally:
            if capped:
                self.in_flight -= 1

    async def _read_body(self, receive, send, limit: int, timeout: float) -> bytes | None:
        """The whole body, or None after answering 413 (past ``limit`` bytes) or 408 (not
        complete ``timeout`` seconds after the request came in), or if the client left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        reader, task = _Reader(), asyncio.current_task(loop)
        watchdog, interval = self.watchdog, min(0.5, timeout / 8)
        chunks, received = [], 0
        while True:
            watchdog.add(reader, deadline, task, interval)
            try:
                message = await receive()
            except asyncio.CancelledError:
                if not reader.expired:
                    raise
                task.uncancel()
                break
            finally:
                watchdog.waiting.pop(reader, None)
            if message["type"] != "http.request":
                return None  # http.disconnect: nobody to answer
            chunk = message.get("body", b"")
            if chunk:
                received += len(chunk)
                if received > limit:
                    self._count("body_size")
                    await answer(send, 413, too_large(limit), close=True)
                    return None
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if loop.time() > deadline:  # a trickle: every piece prompt, the whole late
                break
        self._count("body_timeout")
        await answer(send, 408, f"the request body did not arrive within body_timeout_s="
                                f"{timeout:g} s (BUCKETSEARCH_BODY_TIMEOUT_S)", close=True)
        return None
