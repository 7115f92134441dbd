"""Limits before work (issue 10): body size (Content-Length and chunked), slow bodies,
concurrency cap, on every route; unknown BUCKETSEARCH_* variables; no file paths in /metrics
or error details.

The guard's logic is driven directly with fake ASGI ``receive``/``send`` (fast, exact); the
wire behaviour (chunked framing, 408 and connection close, 503 under load) against a real
uvicorn server with raw HTTP over sockets."""
from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import ROOT, ServerProcess, app_client, create_index

from bucketsearch.app.guard import AccessPolicy, Guard, flat_routes
from bucketsearch.app.main import create_app
from bucketsearch.app.redact import redact
from bucketsearch.app.settings import (Settings, known_env_vars, unknown_env_vars,
                                       unknown_env_warning)

LIMIT = 4096
CODE8 = "00" * 8


def every_operation() -> list[tuple[str, str]]:
    """(method, concrete path) of every route of the app; index routes point at 'ix'."""
    app = create_app(Settings(data_dir="unused", warmup=False))
    ops = {(m, r.path.replace("{name}", "ix")) for r in flat_routes(app.routes)
           for m in (r.methods or ()) if m != "HEAD"}  # the /docs assets mount has none
    assert len(ops) >= 18
    return sorted(ops)


# ------------------------------------------------------------------ the guard, in-process
def guard_for(app, **settings):
    state = SimpleNamespace(settings=Settings(data_dir="unused", **settings), metrics=None)
    return Guard(app, state, lambda: AccessPolicy([], lambda route: None))


def scope(path="/v1/indexes/ix/search", method="POST", headers=()):
    return {"type": "http", "method": method, "path": path, "root_path": "",
            "headers": [(k.encode(), v.encode()) for k, v in headers]}


class Sent:
    def __init__(self):
        self.messages = []

    async def __call__(self, message):
        self.messages.append(message)

    @property
    def status(self):
        return self.messages[0]["status"] if self.messages else None

    @property
    def headers(self):
        return dict(self.messages[0]["headers"])


def test_guard_reads_the_body_once_and_replays_it():
    got = []

    async def app(scope, receive, send):
        got.append(await receive())
        got.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    parts = [{"type": "http.request", "body": b"ab", "more_body": True},
             {"type": "http.request", "body": b"", "more_body": True},
             {"type": "http.request", "body": b"cd", "more_body": False},
             {"type": "http.disconnect"}]

    async def receive():
        return parts.pop(0)

    sent = Sent()
    asyncio.run(guard_for(app)(scope(headers=[("transfer-encoding", "chunked")]), receive, sent))
    assert sent.status == 200
    assert got == [{"type": "http.request", "body": b"abcd", "more_body": False},
                   {"type": "http.disconnect"}]


def test_guard_chunked_body_past_the_limit_is_413_and_the_app_never_runs():
    async def app(scope, receive, send):
        raise AssertionError("the route ran")

    chunks = iter([b"x" * 2000] * 3)

    async def receive():
        return {"type": "http.request", "body": next(chunks), "more_body": True}

    sent = Sent()
    asyncio.run(guard_for(app, max_body_bytes=LIMIT)(
        scope(headers=[("transfer-encoding", "chunked")]), receive, sent))
    assert sent.status == 413 and sent.headers[b"connection"] == b"close"
    assert b"BUCKETSEARCH_MAX_BODY_BYTES" in sent.messages[1]["body"]


@pytest.mark.parametrize("trickle", [False, True])
def test_guard_slow_body_is_408_at_the_deadline(trickle):
    """A body that stalls, or trickles in forever, is cut at body_timeout_s in total."""
    async def app(scope, receive, send):
        raise AssertionError("the route ran")

    async def receive():
        if trickle:
            await asyncio.sleep(0.01)
            return {"type": "http.request", "body": b"x", "more_body": True}
        await asyncio.sleep(3600)

    async def run():
        guard = guard_for(app, body_timeout_s=0.3)
        sent = Sent()
        t = time.perf_counter()
        await guard(scope(headers=[("content-length", "1000")]), receive, sent)
        return sent, time.perf_counter() - t, guard

    sent, took, guard = asyncio.run(run())
    assert sent.status == 408 and sent.headers[b"connection"] == b"close"
    assert b"BUCKETSEARCH_BODY_TIMEOUT_S" in sent.messages[1]["body"]
    assert 0.3 <= took < 1.5
    assert guard.in_flight == 0 and not guard.watchdog.waiting


def test_guard_passes_on_a_cancellation_that_is_not_its_own():
    async def app(scope, receive, send):
        raise AssertionError("the route ran")

    async def receive():
        await asyncio.sleep(3600)

    async def run():
        guard = guard_for(app, body_timeout_s=30)
        task = asyncio.create_task(guard(scope(headers=[("content-length", "10")]), receive,
                                         Sent()))
        await asyncio.sleep(0.05)
        task.cancel()  # the server shutting down, say
        with pytest.raises(asyncio.CancelledError):
            await task
        return guard

    guard = asyncio.run(run())
    assert guard.in_flight == 0 and not guard.watchdog.waiting


def test_guard_concurrency_cap_answers_503_at_once_and_exempts_probes():
    release = None

    async def app(scope, receive, send):
        if scope["path"].startswith("/v1/"):
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def run():
        nonlocal release
        release = asyncio.Event()
        guard = guard_for(app, max_concurrent_requests=2)
        held = [Sent(), Sent()]
        tasks = [asyncio.create_task(guard(scope("/v1/indexes", "GET"), receive, s))
                 for s in held]
        await asyncio.sleep(0.01)
        assert guard.in_flight == 2
        statuses = {}
        for path in ["/v1/indexes", "/v1/indexes/ix/search", "/docs", "/healthz", "/readyz",
                     "/metrics"]:
            sent = Sent()
            await asyncio.wait_for(guard(scope(path, "GET"), receive, sent), 1)
            statuses[path] = sent.status
            if sent.status == 503:
                assert sent.headers[b"retry-after"] == b"1"
        release.set()
        await asyncio.gather(*tasks)
        assert [s.status for s in held] == [200, 200] and guard.in_flight == 0
        sent = Sent()
        await guard(scope("/v1/indexes", "GET"), receive, sent)
        return statuses, sent.status

    statuses, after = asyncio.run(run())
    assert statuses == {"/v1/indexes": 503, "/v1/indexes/ix/search": 503, "/docs": 503,
                        "/healthz": 200, "/readyz": 200, "/metrics": 200}
    assert after == 200


# ------------------------------------------------------------------- real server, raw HTTP
def send_request(port, method, path, body=b"", ctype="application/json", chunked=False,
                 declared=None, complete=True) -> socket.socket:
    """Open a connection and send a request; ``complete=False`` sends only part of the body
    (and, chunked, no final chunk): a stalled client."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: {ctype}"]
    if chunked:
        head.append("Transfer-Encoding: chunked")
    else:
        head.append(f"Content-Length: {len(body) if declared is None else declared}")
    data = ("\r\n".join(head) + "\r\n\r\n").encode()
    if not complete:
        body = body[: max(1, len(body) // 4)]
    if chunked:
        for i in range(0, len(body), 1000):
            part = body[i:i + 1000]
            data += f"{len(part):x}\r\n".encode() + part + b"\r\n"
        if complete:
            data += b"0\r\n\r\n"
    else:
        data += body
    sock.sendall(data)
    return sock


def read_response(sock, timeout=10.0):
    """(status, headers, json-or-bytes body, closed): ``closed`` if the server said
    ``Connection: close`` and did end the connection right after the response."""
    sock.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {buf!r}")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        rest += sock.recv(65536)
    closed = False
    if headers.get("connection") == "close":  # then the server must really close it
        sock.settimeout(3.0)
        try:
            closed = sock.recv(1) == b""
        except (TimeoutError, socket.timeout):
            closed = False
        except ConnectionResetError:
            closed = True
    sock.close()
    body = rest[:length]
    if headers.get("content-type", "").startswith("application/json"):
        import json
        body = json.loads(body)
    return status, headers, body, closed


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``bucketsearch serve`` (the CLI) with small body limits, and an unknown variable
    (test_serve_prints_unknown_env_vars_once reads its log)."""
    s = ServerProcess(tmp_path_factory.mktemp("guards") / "data", {
        "BUCKETSEARCH_MAX_BODY_BYTES": str(LIMIT), "BUCKETSEARCH_BODY_TIMEOUT_S": "1",
        "BUCKETSEARCH_MAX_CONCURRENT_REQUESTS": "500", "BUCKETSEARCH_WARMUP": "0",
        "BUCKETSEARCH_CALIBRATION_QUERIES": "0", "BUCKETSEARCH_TYPO_SERVE": "value-abc"},
        command="serve").start()
    with s.client() as c:
        create_index(c, "ix", 64)
    yield s
    s.kill()


BODIES = {"application/json": b'{"codes": ["' + b"0" * 16 + b'"], "pad": "' + b"x" * 6000
          + b'"}', "application/octet-stream": b"\x00" * 6000}


def test_oversize_body_is_413_on_every_route(server):
    """Every route, JSON and octet-stream, by Content-Length and chunked."""
    failures = []
    for method, path in every_operation():
        for ctype, body in BODIES.items():
            for chunked in (False, True):
                sock = send_request(server.port, method, path, body, ctype, chunked)
                status, headers, out, closed = read_response(sock)
                case = (method, path, ctype, "chunked" if chunked else "length")
                if status != 413 or "BUCKETSEARCH_MAX_BODY_BYTES" not in out["detail"] \
                        or headers.get("connection") != "close" or not closed:
                    failures.append((*case, status, out, closed))
    assert not failures, "\n".join(map(str, failures))


def test_bodies_within_the_limit_pass_chunked_or_not(server):
    for chunked in (False, True):
        sock = send_request(server.port, "POST", "/v1/indexes/ix/items",
                            b'{"ids": [%d], "codes": ["%s"]}' % (int(chunked), CODE8.encode()),
                            chunked=chunked)
        status, _, out, closed = read_response(sock)
        assert status == 200 and not closed, out
        body = (b"\x00" * 8) * 400  # 400 octet-stream codes, 3200 bytes, chunked in 4 parts
        sock = send_request(server.port, "POST", "/v1/indexes/ix/search?max_distance=0", body,
                            "application/octet-stream", chunked)
        status, _, out, _ = read_response(sock)
        assert status == 200 and len(out["results"]) == 400
        assert out["results"][0]["ids"] == list(range(int(chunked) + 1))


def test_slow_body_is_408_on_every_route(server):
    """Every route, JSON and octet-stream, by Content-Length and chunked: the client sends a
    quarter of the body and stalls; all at once, so this takes about one body_timeout_s."""
    cases = [(m, p, ctype, chunked) for m, p in every_operation() for ctype in BODIES
             for chunked in (False, True)]
    t = time.perf_counter()
    socks = [send_request(server.port, m, p, b"x" * 400, ctype, chunked, complete=False)
             for m, p, ctype, chunked in cases]
    failures = []
    for case, sock in zip(cases, socks):
        status, headers, out, closed = read_response(sock, timeout=15)
        if status != 408 or "BUCKETSEARCH_BODY_TIMEOUT_S" not in out["detail"] or not closed:
            failures.append((*case, status, out, closed))
    took = time.perf_counter() - t
    assert not failures, "\n".join(map(str, failures))
    assert 1.0 <= took < 10, took


def test_trickling_body_is_cut_at_the_deadline(server):
    """One byte every 0.1 s keeps each read short but the whole body late: 408 after ~1 s."""
    sock = send_request(server.port, "POST", "/v1/indexes/ix/search", b"", declared=1000,
                        complete=False)
    t = time.perf_counter()
    sock.setblocking(True)
    try:
        for _ in range(100):
            sock.sendall(b" ")
            time.sleep(0.1)
            if time.perf_counter() - t > 5:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed
    status, _, out, closed = read_response(sock)
    assert status == 408 and closed
    assert time.perf_counter() - t < 5


def test_concurrency_cap_is_503_on_every_route(bucketsearch_server_factory):
    s = bucketsearch_server_factory(BUCKETSEARCH_MAX_CONCURRENT_REQUESTS="2",
                                    BUCKETSEARCH_BODY_TIMEOUT_S="20", BUCKETSEARCH_WARMUP="0",
                                    BUCKETSEARCH_CALIBRATION_QUERIES="0")
    with s.client() as c:
        create_index(c, "ix", 64)
    body = b'{"codes": ["%s"], "max_distance": 0}' % CODE8.encode()
    held = []
    for _ in range(2):  # two searches whose bodies are late: they hold both slots
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(b"POST /v1/indexes/ix/search HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:5])
        held.append(sock)
    time.sleep(0.3)
    failures, refused = [], 0
    for method, path in every_operation():
        sock = send_request(s.port, method, path, b"{}" if method == "POST" else b"")
        status, headers, out, _ = read_response(sock)
        exempt = path in ("/healthz", "/readyz", "/metrics")
        refused += not exempt
        if exempt and status != 200 or not exempt and (
                status != 503 or headers.get("retry-after") != "1"
                or "BUCKETSEARCH_MAX_CONCURRENT_REQUESTS" not in out["detail"]):
            failures.append((method, path, status, out))
    assert not failures, "\n".join(map(str, failures))
    for sock in held:  # the held requests finish normally, and free their slots
        sock.sendall(body[5:])
        status, _, out, _ = read_response(sock)
        assert status == 200, out
    with s.client() as c:
        assert c.get("/v1/indexes").status_code == 200
        metrics = c.get("/metrics").text
    assert f'bucketsearch_http_rejected_total{{reason="concurrency"}} {refused}.0' in metrics, \
        (refused, metrics)


# ------------------------------------------------------------- environment and paths
def test_unknown_env_vars_are_named_not_their_values():
    env = {"BUCKETSEARCH_API_KEY": "k", "BUCKETSEARCH_THREADS": "2", "bucketsearch_max_k": "9",
           "BUCKETSEARCH_APIKEY": "hunter2", "BUCKETSEARCH_MAX_BODY": "1", "OTHER": "x"}
    assert unknown_env_vars(env) == ["BUCKETSEARCH_APIKEY", "BUCKETSEARCH_MAX_BODY"]
    warning = unknown_env_warning(env)
    assert "BUCKETSEARCH_APIKEY" in warning and "BUCKETSEARCH_API_KEY" in warning
    assert "hunter2" not in warning
    for name in known_env_vars():
        assert name in warning
    assert unknown_env_warning({"BUCKETSEARCH_DATA_DIR": "d"}) is None
    assert "BUCKETSEARCH_BODY_TIMEOUT_S" in known_env_vars()


def test_create_app_warns_about_unknown_env_vars(monkeypatch, caplog):
    monkeypatch.setenv("BUCKETSEARCH_TYPO_FOR_TEST_1", "value-xyz")
    with caplog.at_level(logging.WARNING, logger="bucketsearch.app"):
        create_app(Settings(data_dir="unused"))
    text = caplog.text
    assert "BUCKETSEARCH_TYPO_FOR_TEST_1" in text and "value-xyz" not in text


def test_serve_prints_unknown_env_vars_once(server):
    text = server.log_text()
    assert text.count("BUCKETSEARCH_TYPO_SERVE") == 1, text
    assert "value-abc" not in text and "BUCKETSEARCH_API_KEY" in text


def test_redact():
    s = SimpleNamespace(data_dir=Path("/srv/bs/data"))
    cases = {
        "startup failed: OSError: [Errno 13] Permission denied: '/srv/bs/data/ix/wal/1.log'":
            "startup failed: OSError: [Errno 13] Permission denied: '<data_dir>/ix/wal/1.log'",
        "corrupt: /srv/bs/data": "corrupt: <data_dir>",
        "FileNotFoundError: /opt/other/place/x.npy": "FileNotFoundError: <path>",
        "/srv/bs/database/x": "<path>",  # a longer name is not the data dir
        "poll /readyz": "poll /readyz",
        "see http://host:8000/v1/indexes": "see http://host:8000/v1/indexes",
        "loading indexes": "loading indexes",
    }
    for text, want in cases.items():
        assert redact(text, s) == want
    assert redact(None, s) is None
    rel = SimpleNamespace(data_dir=Path("data"))
    here = str(Path("data").resolve())
    assert redact(f"no data in data/ix and {here}/ix; metadata/x", rel) == \
        "no data in <data_dir>/ix and <data_dir>/ix; metadata/x"


def test_metrics_and_errors_reveal_no_paths(tmp_path):
    data_dir = tmp_path / "secret-place" / "data"
    with app_client(data_dir) as c:
        app = c.app
        create_index(c, "ix", 64)
        for method, path in [("GET", "/etc/passwd"), ("GET", "/v1/indexes/nope"),
                             ("POST", "/v1/indexes/ix/search"), ("GET", str(data_dir)),
                             ("FOO", "/v1/indexes"), ("GET", "/v1/indexes/ix/../../x")]:
            r = c.request(method, path, content=b"{")
            assert str(tmp_path) not in r.text
        c.post("/v1/indexes/ix/search", json={"codes": [CODE8], "max_distance": 1})
        text = c.get("/metrics").text
        ready = c.get("/readyz").text
    assert str(tmp_path) not in text and "secret-place" not in text and "/etc" not in text
    assert "secret-place" not in ready
    templates = {r.path for r in flat_routes(app.routes)} | {"unmatched"}
    for label in re.findall(r'route="([^"]*)"', text):
        assert label in templates, label
    assert set(re.findall(r'method="([^"]*)"', text)) <= {"GET", "POST", "other"}
    assert 'bucketsearch_probes_total{index="ix",radius="1"}' in text


def test_not_ready_detail_is_redacted(tmp_path):
    """The 503 'not ready' answer of the API routes quotes the startup detail without paths."""
    from fastapi import HTTPException

    from bucketsearch.app.deps import registry_of

    data_dir = tmp_path / "secret-place" / "data"
    app = create_app(Settings(data_dir=data_dir, warmup=False))
    app.state.ready = False
    app.state.startup_detail = f"startup failed: OSError: bad file {data_dir}/ix/wal"
    with pytest.raises(HTTPException) as err:
        registry_of(SimpleNamespace(app=app))
    assert err.value.status_code == 503
    assert "secret-place" not in err.value.detail and "<data_dir>/ix/wal" in err.value.detail


def test_readme_limits_lists_every_limit():
    text = (ROOT / "README.md").read_text().split("## Limits", 1)[1].split("\n## ", 1)[0]
    fields = Settings.model_fields
    limits = [name for name in fields if name.startswith("max_")] + ["body_timeout_s"]
    for name in limits:
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| `{name}` |")), None)
        assert row is not None, f"{name} is missing from README's Limits table"
        cells = [c.strip().strip("`") for c in row.strip("|").split("|")]
        assert cells[1] == f"BUCKETSEARCH_{name.upper()}"
        default = fields[name].default
        assert cells[2].split()[0] == (f"{default:g}" if isinstance(default, float)
                                       else str(default)), (name, cells[2])


def test_guard_websockets_need_the_key_too():
    """No websocket route today; one added later must not bypass the key."""
    calls = []

    async def app(scope, receive, send):
        calls.append(scope["type"])

    async def receive():
        return {"type": "websocket.connect"}

    for headers, want in [((), "closed"), ((("authorization", "Bearer r-key"),), "passed")]:
        sent = Sent()
        guard = guard_for(app, read_key="r-key")
        ws = {**scope("/v1/stream", "GET", headers), "type": "websocket"}
        del ws["method"]
        calls.clear()
        asyncio.run(guard(ws, receive, sent))
        got = "passed" if calls == ["websocket"] else "closed"
        assert got == want
        if want == "closed":
            assert sent.messages == [{"type": "websocket.close", "code": 1008}]
