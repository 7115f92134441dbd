"""The blocking Client's connections: HTTP/1.1 keep-alive over the standard ``http.client``.

On the 2-core development VM httpx spends about 1 ms of CPU on a request (``httpx.Client``
0.23 ms, httpcore and h11 most of the rest), ``http.client`` 0.25 ms: on a batch of 1,000
radius-2 queries that was the gap between the Client and a bare request (bench/RESULTS.md,
issue 13). Answers come back as ``httpx.Response`` and failures as ``httpx.TransportError``
subclasses, so the Client's retry rules and error mapping do not depend on the transport.

A request goes out in one ``send`` (head and body joined, :class:`_OneSend`), on a socket
with ``TCP_NODELAY``. An idle connection is reused only if its socket is not readable
(a readable idle socket is one the server has closed, e.g. after its keep-alive timeout), as
httpcore does, so a write is not sent into a connection that is already gone.
"""
from __future__ import annotations

import http.client
import select
import socket
import threading
from urllib.parse import urlencode, urlsplit

import httpx


class _OneSend:
    """A request's writes held and sent together: ``http.client`` sends the head and the body
    apart, two segments and two wake-ups of the server's event loop (about 0.1 ms a request
    on a loaded 2-core machine). Up to ``MAX_HELD`` bytes are joined; a larger body goes as
    it comes (no copy of a big upload)."""

    MAX_HELD = 64 << 10

    def hold(self) -> None:
        self._held, self._held_size = [], 0

    def send(self, data) -> None:
        held = getattr(self, "_held", None)
        if held is not None and self._held_size + len(data) <= self.MAX_HELD:
            held.append(bytes(data))
            self._held_size += len(data)
            return
        self.flush()
        super().send(data)

    def flush(self) -> None:
        held, self._held = getattr(self, "_held", None), None
        if held:
            super().send(held[0] if len(held) == 1 else b"".join(held))


class _HTTP(_OneSend, http.client.HTTPConnection):
    pass


class _HTTPS(_OneSend, http.client.HTTPSConnection):
    pass


class PooledHTTP:
    """Keep-alive connections to one server (``http`` or ``https`` ``url``), at most
    ``max_idle`` kept between requests; ``timeout`` seconds for the connect and for each read;
    ``headers`` sent with every request. Safe to share between threads."""

    def __init__(self, url: str, headers: dict, timeout: float, max_idle: int = 10):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http://host[:port] or https://..., got {url!r}")
        self._cls = _HTTPS if parts.scheme == "https" else _HTTP
        self.host, self.port = parts.hostname, parts.port
        self.prefix = parts.path.rstrip("/")
        self.headers, self.timeout, self.max_idle = dict(headers), timeout, max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(self, method: str, path: str, params: dict | None = None,
                content: bytes | None = None, headers: dict | None = None) -> httpx.Response:
        """One request; ``httpx.ConnectError``/``ConnectTimeout`` when no connection could be
        made (nothing was sent), ``httpx.ReadTimeout``/``ReadError``/``RemoteProtocolError``
        when it failed after that (the request may have arrived)."""
        target = self.prefix + path + ("?" + urlencode(params) if params else "")
        try:
            conn = self._take()
        except OSError as exc:
            raise _error(exc, connecting=True) from exc
        try:
            conn.hold()
            conn.request(method, target, body=content, headers={**self.headers, **(headers or {})})
            conn.flush()
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise _error(exc, connecting=False) from exc
        if resp.will_close:
            conn.close()
        else:
            self._give(conn)
        return httpx.Response(resp.status, headers=resp.getheaders(), content=data)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self) -> http.client.HTTPConnection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if _alive(conn):
                    return conn
                conn.close()
        conn = self._cls(self.host, self.port, timeout=self.timeout)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()


def _alive(conn: http.client.HTTPConnection) -> bool:
    """An idle connection is usable while its socket has nothing to read (no EOF, no stray
    bytes)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        return not select.select([sock], [], [], 0)[0]
    except (OSError, ValueError):
        return False


def _error(exc: BaseException, connecting: bool) -> httpx.TransportError:
    """The httpx exception class for a failure of ``http.client`` or the socket."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return (httpx.ConnectTimeout if connecting else httpx.ReadTimeout)(text)
    if connecting:
        return httpx.ConnectError(text)
    if isinstance(exc, http.client.HTTPException):  # e.g. closed without an answer
        return httpx.RemoteProtocolError(text)
    return httpx.ReadError(text)
