"""The search fast path (``bucketsearch.app.routers.search.SearchFastPath``, issue 13 item 4): a
search the
endpoint would answer 200 is answered without FastAPI's routing and dependencies; every other
request goes on to FastAPI. Checked here: the same status, content type and body as the app
without the fast path, for requests it answers and requests it declines (errors included); plain
requests take it and the others do not; the guard still runs first; the request metrics keep the
route label."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient
from helpers import add_codes, create_index, make_app, wait_ready

from bucketsearch.app.routers import search as search_module
from bucketsearch.index.codes import to_hex

BITS = 20  # codes of 3 bytes, with padding bits in the last one
OCTET = "application/octet-stream"


@contextmanager
def started(data_dir, fast: bool, **overrides):
    app = make_app(data_dir, max_batch=50, **overrides)
    if not fast:
        app.user_middleware = [m for m in app.user_middleware
                               if m.cls is not search_module.SearchFastPath]
    with TestClient(app) as client:
        wait_ready(client)
        yield client


def fill(client, words, headers=None):
    if headers:
        client.headers.update(headers)
    create_index(client, "idx", BITS, mode="single")  # no planner: its timings vary
    for a in range(0, len(words), 50):  # max_batch
        add_codes(client, "idx", np.arange(a, a + 50), words[a:a + 50], BITS)
    assert client.post("/v1/indexes/idx/merge").status_code == 200
    add_codes(client, "idx", [10**6], words[:1] ^ np.uint64(1), BITS)  # a delta too


@pytest.fixture(scope="module")
def words():
    rng = np.random.default_rng(7)
    return rng.integers(0, 2**BITS, size=(300, 1), dtype=np.uint64)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, words):
    """(fast, plain): two apps on equal data, with and without the fast path."""
    with started(tmp_path_factory.mktemp("fast"), True) as fast, \
            started(tmp_path_factory.mktemp("plain"), False) as plain:
        fill(fast, words)
        fill(plain, words)
        yield fast, plain


def packed(words, n):
    from bucketsearch.index.codes import to_packed
    return to_packed(words[:n], BITS).tobytes()


def comparable(resp):
    """Status, content type and body, without the answer's own timings (``took_ms``, the
    measured ``lookup_ns``, ``total_ns`` and the ``modeled_ns`` of the live t0 fit, delta
    ``scan_ns``)."""
    body = resp.content
    if resp.headers.get("content-type", "").startswith("application/json"):
        data = orjson.loads(body)
        if isinstance(data, dict):
            data.pop("took_ms", None)
            for rows in data.get("stats") or ():
                for rec in rows:
                    rec["lookup_ns"] = rec["modeled_ns"] = 0
            if data.get("total_ns") is not None:
                data["total_ns"] = [0] * len(data["total_ns"])
            if isinstance(data.get("delta"), dict):
                data["delta"]["scan_ns"] = 0
        body = data
    return resp.status_code, resp.headers.get("content-type"), body


def requests_of(words):
    """(name, query string, headers, body) of search requests, answered and refused."""
    hexes = to_hex(words[:5], BITS)
    raw = packed(words, 5)
    json_h = {"content-type": "application/json"}
    octet = {"content-type": OCTET}
    both = {"content-type": OCTET, "accept": OCTET}
    return [
        ("json radius", "", json_h, orjson.dumps({"codes": hexes, "max_distance": 2})),
        ("json radius 0", "", json_h, orjson.dumps({"codes": hexes[:1], "max_distance": 0})),
        ("json k", "", json_h, orjson.dumps({"codes": hexes, "k": 3})),
        ("json k within r", "", json_h, orjson.dumps({"codes": hexes, "k": 3, "max_distance": 1})),
        ("json stats", "", json_h, orjson.dumps({"codes": hexes, "max_distance": 1,
                                                 "stats": True})),
        ("json binary answer", "", {**json_h, "accept": OCTET},
         orjson.dumps({"codes": hexes, "max_distance": 2})),
        ("no content type", "", {}, orjson.dumps({"codes": hexes, "max_distance": 1})),
        ("content type params", "", {"content-type": "Application/JSON; charset=utf-8"},
         orjson.dumps({"codes": hexes, "max_distance": 1})),
        ("octet radius", "max_distance=2", octet, raw),
        ("octet both ways", "max_distance=1", both, raw),
        ("octet k", "k=4", both, raw),
        ("octet k within r", "k=4&max_distance=2", both, raw),
        ("octet stats", "max_distance=1&stats=true", octet, raw),
        ("octet stats false", "max_distance=1&stats=0", both, raw),
        # declined by the fast path (FastAPI parses them), valid
        ("leading zero", "max_distance=01", both, raw),
        ("stats yes", "max_distance=1&stats=yes", octet, raw),
        ("unknown parameter", "max_distance=1&x=2", both, raw),
        ("repeated parameter", "max_distance=1&max_distance=2", both, raw),
        # refused
        ("radius too large", "max_distance=1025", both, raw),
        ("negative radius", "max_distance=-1", both, raw),
        ("k zero", "k=0", both, raw),
        ("k above max_k", "k=100000", both, raw),
        ("no radius nor k", "", both, raw),
        ("stats bad", "max_distance=1&stats=maybe", both, raw),
        ("stats in binary", "max_distance=1&stats=true", both, raw),
        ("body not a multiple", "max_distance=1", both, raw[:-1]),
        ("empty body", "max_distance=1", both, b""),
        ("padding bits set", "max_distance=1", both, b"\xff\xff\xff"),
        ("over max_batch", "max_distance=1", both, packed(np.repeat(words, 2, axis=0), 60)),
        ("json over max_batch", "", json_h,
         orjson.dumps({"codes": to_hex(np.repeat(words, 2, axis=0)[:60], BITS),
                       "max_distance": 1})),
        ("json params in query", "max_distance=1", json_h,
         orjson.dumps({"codes": hexes, "max_distance": 1})),
        ("json bad hex", "", json_h, orjson.dumps({"codes": ["zz"], "max_distance": 1})),
        ("json wrong width", "", json_h, orjson.dumps({"codes": ["00"], "max_distance": 1})),
        ("json invalid", "", json_h, b"{"),
        ("json no radius", "", json_h, orjson.dumps({"codes": hexes})),
        ("unsupported media type", "max_distance=1", {"content-type": "text/plain"}, raw),
        ("huge radius", "max_distance=20", both, raw),
    ]


def test_same_answers_with_and_without_the_fast_path(pair, words):
    fast, plain = pair
    for name, query, headers, body in requests_of(words):
        url = "/v1/indexes/idx/search" + (f"?{query}" if query else "")
        a = fast.post(url, content=body, headers=headers)
        b = plain.post(url, content=body, headers=headers)
        assert comparable(a) == comparable(b), name


def test_other_paths_and_methods_go_to_fastapi(pair, words):
    fast, plain = pair
    for method, url in (("POST", "/v1/indexes/nope/search?max_distance=1"),
                        ("GET", "/v1/indexes/idx/search"),
                        ("POST", "/v1/indexes/idx/search/more?max_distance=1"),
                        ("POST", "/v1/indexes/a/b/search?max_distance=1"),
                        ("POST", "/v1/indexes//search?max_distance=1")):
        a = fast.request(method, url, content=packed(words, 1),
                         headers={"content-type": OCTET})
        b = plain.request(method, url, content=packed(words, 1),
                          headers={"content-type": OCTET})
        assert comparable(a) == comparable(b), (method, url)
        assert a.status_code in (404, 405), (method, url, a.status_code)


def count_endpoint_calls(monkeypatch) -> list:
    """Calls of the FastAPI endpoint (it reads the Content-Type with ``content_type``; the
    fast path reads the header itself)."""
    calls = []
    real = search_module.content_type

    def counted(request):
        calls.append(request.url.path)
        return real(request)
    monkeypatch.setattr(search_module, "content_type", counted)
    return calls


def test_plain_requests_take_the_fast_path(pair, words, monkeypatch):
    fast, _ = pair
    calls = count_endpoint_calls(monkeypatch)
    for name, query, headers, body in requests_of(words)[:14]:  # the plain, valid ones
        url = "/v1/indexes/idx/search" + (f"?{query}" if query else "")
        assert fast.post(url, content=body, headers=headers).status_code == 200, name
    assert calls == []
    fast.post("/v1/indexes/idx/search?max_distance=01", content=packed(words, 1),
              headers={"content-type": OCTET})
    assert len(calls) == 1  # declined: FastAPI answered it


def test_refused_requests_are_answered_by_fastapi(pair, words, monkeypatch):
    fast, _ = pair
    calls = count_endpoint_calls(monkeypatch)
    r = fast.post("/v1/indexes/idx/search?max_distance=1", content=b"\x00",
                  headers={"content-type": OCTET})
    assert r.status_code == 400 and "not a positive multiple of 3" in r.json()["detail"]
    assert len(calls) == 1


def test_results_equal_brute_force(pair, words):
    fast, _ = pair
    queries = words[:20]
    r = fast.post("/v1/indexes/idx/search?max_distance=3", content=packed(words, 20),
                  headers={"content-type": OCTET, "accept": OCTET})
    from bucketsearch.loadtest.wire import decode_binary_results
    lims, D, I = decode_binary_results(r.content)
    db = {i: int(x) for i, x in enumerate(words[:, 0])}
    db[10**6] = int(words[0, 0]) ^ 1  # the delta item of fill()
    for q in range(len(queries)):
        d = {i: bin(int(queries[q, 0]) ^ x).count("1") for i, x in db.items()}
        want = sorted((dist, i) for i, dist in d.items() if dist <= 3)
        got = list(zip(D[lims[q]:lims[q + 1]].tolist(), I[lims[q]:lims[q + 1]].tolist()))
        assert got == want


def test_guard_runs_before_the_fast_path(tmp_path, words, monkeypatch):
    with started(tmp_path / "data", True, api_key="w-key", read_key="r-key") as client:
        fill(client, words, headers={"authorization": "Bearer w-key"})
        calls = count_endpoint_calls(monkeypatch)
        url = "/v1/indexes/idx/search?max_distance=1"
        body, headers = packed(words, 2), {"content-type": OCTET}
        assert client.post(url, content=body, headers={**headers, "authorization": ""}) \
            .status_code == 401
        assert client.post(url, content=body, headers={**headers, "authorization": "Bearer x"}) \
            .status_code == 403
        assert client.post(url, content=body, headers={**headers,
                                                       "authorization": "Bearer r-key"}) \
            .status_code == 200
        assert calls == []


def test_metrics_label_the_route(pair, words):
    fast, _ = pair
    for _ in range(3):
        fast.post("/v1/indexes/idx/search?max_distance=1", content=packed(words, 1),
                  headers={"content-type": OCTET})
    text = fast.get("/metrics").text
    line = [row for row in text.splitlines() if row.startswith(
        'bucketsearch_http_requests_total{method="POST",route="/v1/indexes/{name}/search",'
        'status="200"}')]
    assert line and float(line[0].split()[-1]) >= 3
    assert "unmatched" not in text or 'route="unmatched",status="200"' not in text


def test_plain_params():
    plain = search_module.plain_params
    assert plain(b"") == {"max_distance": None, "k": None, "stats": False}
    assert plain(b"max_distance=2&k=5&stats=true") == {"max_distance": 2, "k": 5, "stats": True}
    assert plain(b"max_distance=1024") == {"max_distance": 1024, "k": None, "stats": False}
    for declined in (b"max_distance=1025", b"max_distance=-1", b"max_distance=01", b"k=0",
                     b"max_distance=1&max_distance=1", b"max_distance", b"max_distance=",
                     b"stats=yes", b"x=1", b"max_distance=1&", b"max_distance=%31",
                     b"max_distance=+1", b"k=1234567890"):
        assert plain(declined) is None, declined
