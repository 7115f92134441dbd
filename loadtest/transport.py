"""The blocking Client's connections: HTTP/1.1 keep-alive on plain sockets.

On the 2-core development VM a request of the Client cost about 1 ms of CPU through httpx
(``httpx.Client`` 0.23 ms, httpcore and h11 most of the rest), 0.5 ms through ``http.client``
(its file objects and the ``email`` header parser) and 0.14 ms written out on the socket as
here (bench/RESULTS.md section 13, issue 13). Answers come back as ``httpx.Response`` and
failures as ``httpx.TransportError`` subclasses, so the Client's retry rules and error mapping
do not depend on the transport.

What is spoken: one request at a time per connection; the request's head and body in one
``send`` (bodies over ``MAX_JOINED`` bytes follow in a second, uncopied); ``TCP_NODELAY``; an
answer framed by ``Content-Length``, ``Transfer-Encoding: chunked`` or the end of the
connection; 1xx interim answers skipped; ``Connection: close`` (or HTTP/1.0 without
keep-alive) closes the connection after the answer. An idle connection is reused only if its
socket has nothing to read (a readable idle socket is one the server has closed, e.g. after its
keep-alive timeout), as httpcore does, so a write is not sent into a connection already gone.
"""
from __future__ import annotations

import select
import socket
import ssl
import threading
from urllib.parse import urlencode, urlsplit

import httpx

MAX_JOINED = 64 << 10     # head and body joined into one send up to this size
MAX_HEAD = 64 << 10       # an answer's status line and headers
READ_SIZE = 256 << 10
_BODY_METHODS = ("POST", "PUT", "PATCH")


class _Closed(Exception):
    """The server closed the connection (``partial``: after part of an answer)."""

    def __init__(self, partial: bool):
        super().__init__("the server closed the connection " +
                         ("in the middle of an answer" if partial else "without an answer"))
        self.partial = partial


class _Connection:
    """One keep-alive connection: :meth:`exchange` sends a request and reads its answer."""

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None):
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = tls.wrap_socket(sock, server_hostname=host) if tls else sock
        except BaseException:
            sock.close()
            raise
        self.buf = bytearray()

    def close(self) -> None:
        self.sock.close()

    def alive(self) -> bool:
        """Usable while idle: nothing to read (no EOF, no stray bytes) and nothing buffered."""
        if self.buf:
            return False
        try:
            if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
                return False
            return not select.select([self.sock], [], [], 0)[0]
        except (OSError, ValueError):
            return False

    def exchange(self, method: str, head: bytes, body: bytes | None):
        """``(status, headers, content, keep_alive)`` of the answer to ``head`` + ``body``.
        A server may answer before it has read the body (413 from the request's head) and
        close: when sending fails, the answer is still read if there is one (as httpcore
        does), else the send's error is raised."""
        try:
            if body and len(head) + len(body) <= MAX_JOINED:
                self.sock.sendall(head + body)
            else:
                self.sock.sendall(head)
                if body:
                    self.sock.sendall(body)
            send_error = None
        except OSError as exc:
            send_error = exc
        try:
            while True:
                version, status, headers = self._read_head()
                if not 100 <= status < 200:
                    break
        except (OSError, _Closed):
            if send_error is not None:
                raise send_error from None
            raise
        fields = {}
        for name, value in headers:
            fields[name.lower()] = value
        keep = "close" not in fields.get("connection", "").lower() and (
            version != "HTTP/1.0" or "keep-alive" in fields.get("connection", "").lower())
        if method == "HEAD" or status in (204, 304):
            content = b""
        elif "chunked" in fields.get("transfer-encoding", "").lower():
            content = self._read_chunked()
        elif "content-length" in fields:
            try:
                size = int(fields["content-length"])
            except ValueError:
                raise httpx.RemoteProtocolError(
                    f"bad Content-Length {fields['content-length']!r}") from None
            if size < 0:
                raise httpx.RemoteProtocolError(f"bad Content-Length {size}")
            content = self._read_exactly(size)
        else:  # the body ends with the connection
            while self._fill(partial=True, eof_ok=True):
                pass
            content, keep = bytes(self.buf), False
            self.buf.clear()
        return status, headers, content, keep and send_error is None

    def _fill(self, partial: bool, eof_ok: bool = False) -> bool:
        data = self.sock.recv(READ_SIZE)
        if not data:
            if eof_ok:
                return False
            raise _Closed(partial)
        self.buf += data
        return True

    def _read_line(self, limit: int = MAX_HEAD) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            if len(self.buf) > limit:
                raise httpx.RemoteProtocolError("a line of the answer is too long")
            self._fill(partial=True)
        line = bytes(self.buf[:end])
        del self.buf[:end + 2]
        return line

    def _read_head(self):
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > MAX_HEAD:
                raise httpx.RemoteProtocolError(f"the answer's head is over {MAX_HEAD} bytes")
            self._fill(partial=bool(self.buf))
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[:end + 4]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise httpx.RemoteProtocolError(f"not an HTTP status line: {lines[0][:100]!r}")
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise httpx.RemoteProtocolError(f"not a header line: {line[:100]!r}")
            headers.append((name.strip(), value.strip()))
        return parts[0], int(parts[1]), headers

    def _read_exactly(self, size: int) -> bytes:
        while len(self.buf) < size:
            self._fill(partial=True)
        data = bytes(self.buf[:size])
        del self.buf[:size]
        return data

    def _read_chunked(self) -> bytes:
        out = []
        while True:
            line = self._read_line()
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"bad chunk size line {line[:40]!r}") from None
            if size == 0:
                while self._read_line():  # trailer fields, up to the empty line
                    pass
                return b"".join(out)
            out.append(self._read_exactly(size))
            if self._read_exactly(2) != b"\r\n":
                raise httpx.RemoteProtocolError("a chunk does not end with CRLF")


class PooledHTTP:
    """Keep-alive connections to one server (``http`` or ``https`` ``url``), at most
    ``max_idle`` kept between requests; ``timeout`` seconds for the connect and for each
    socket operation; ``headers`` sent with every request; ``verify`` for https
    (:func:`tls_context`). Safe to share between threads."""

    def __init__(self, url: str, headers: dict, timeout: float, max_idle: int = 10,
                 verify=True):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http://host[:port] or https://..., got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = tls_context(verify) if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if parts.port is None else f"{host}:{self.port}"
        self.headers = _checked_headers(headers)
        self.timeout, self.max_idle = timeout, max_idle
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()

    def request(self, method: str, path: str, params: dict | None = None,
                content: bytes | None = None, headers: dict | None = None) -> httpx.Response:
        """One request; ``httpx.ConnectError``/``ConnectTimeout`` when no connection could be
        made (nothing was sent), ``httpx.ReadTimeout``/``ReadError``/``RemoteProtocolError``
        when it failed after that (the request may have arrived)."""
        target = self.prefix + path + ("?" + urlencode(params) if params else "")
        fields = {**self.headers, **_checked_headers(headers or {})}
        fields.pop("content-length", None)  # set here, from the body
        lines = [f"{method} {target} HTTP/1.1", f"host: {fields.pop('host', self.host_header)}"]
        lines += [f"{name}: {value}" for name, value in fields.items()]
        if content is not None:
            lines.append(f"content-length: {len(content)}")
        elif method in _BODY_METHODS:
            lines.append("content-length: 0")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            conn = self._take()
        except OSError as exc:
            raise _error(exc, connecting=True) from exc
        try:
            status, answer, data, keep = conn.exchange(method, head, content)
        except (OSError, _Closed, httpx.TransportError) as exc:
            conn.close()
            if isinstance(exc, httpx.TransportError):
                raise
            raise _error(exc, connecting=False) from exc
        if keep:
            self._give(conn)
        else:
            conn.close()
        return httpx.Response(status, headers=answer, content=data)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self) -> _Connection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.alive():
                    return conn
                conn.close()
        return _Connection(self.host, self.port, self.timeout, self.tls)

    def _give(self, conn: _Connection) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()


def tls_context(verify=True) -> ssl.SSLContext:
    """The TLS context of ``verify``: True checks the server's certificate against the system's
    CAs, a path against the CA file (PEM) there, an ``ssl.SSLContext`` is used as it is, False
    checks nothing (a test server with a self-made certificate)."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if verify is True:
        return ssl.create_default_context()
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return context
    if isinstance(verify, (str, bytes)) or hasattr(verify, "__fspath__"):
        return ssl.create_default_context(cafile=verify)
    raise ValueError(f"verify must be True, False, a CA file path or an ssl.SSLContext, got "
                     f"{verify!r}")


def _checked_headers(headers: dict) -> dict:
    """``headers`` with lower-case names (HTTP's names are case-blind: a later one replaces
    an earlier); ValueError naming a name or value that would break the request's head (a
    line break, or a colon or space in a name)."""
    out = {}
    for name, value in headers.items():
        name, value = str(name), str(value)
        if not name or any(c in name for c in ":\r\n \t") or any(c in value for c in "\r\n"):
            raise ValueError(f"headers: {name!r}: {value!r} is not a valid header")
        out[name.lower()] = value
    return out


def _error(exc: BaseException, connecting: bool) -> httpx.TransportError:
    """The httpx exception class for a failure of the socket."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return (httpx.ConnectTimeout if connecting else httpx.ReadTimeout)(text)
    if connecting:
        return httpx.ConnectError(text)
    if isinstance(exc, _Closed):
        return httpx.RemoteProtocolError(str(exc))
    return httpx.ReadError(text)
