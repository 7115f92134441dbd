"""Issue 13: ``bucketsearch.Client`` / ``AsyncClient`` against a real server process (keys set,
small limits), results checked against the plain-numpy twins of tests/naive.py.

* every code form in, every format out, both wire forms;
* batches above the server's max_batch, max_results and body limits: split, and equal to brute
  force (CSR offsets and k-NN rows put back together);
* every error class from a real answer (and the status table from made-up answers);
* retries: a read survives a dropped connection (a proxy that drops the first connection), a
  write is never resent; 503 waits Retry-After, a longer one is raised.
"""
from __future__ import annotations

import asyncio
import io
import math
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from conftest import ServerProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from naive import knn as naive_knn
from naive import range_search as naive_range

from bucketsearch.index.codes import pack_bits, to_hex, to_ints, to_packed, unpack_words
from bucketsearch.loadtest import client as cl
from bucketsearch.loadtest.client import (AsyncClient, BadRequest, BucketsearchError, Client,
                                          Conflict, Forbidden, Limits, MissingItems, NotFound,
                                          PayloadTooLarge, Retry, TransportError, Unauthorized,
                                          Unavailable)
from bucketsearch.loadtest.wire import decode_search, search_summary

pytestmark = pytest.mark.timeout(300)
WRITE_KEY, READ_KEY = "write-key-13", "read-key-13"
MAX_BATCH, MAX_RESULTS, MAX_BODY = 300, 4000, 65536
WIRES = ("binary", "json")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("client")
    srv = ServerProcess(tmp / "data", {"BUCKETSEARCH_API_KEY": WRITE_KEY,
                                       "BUCKETSEARCH_READ_KEY": READ_KEY,
                                       "BUCKETSEARCH_MAX_BATCH": str(MAX_BATCH),
                                       "BUCKETSEARCH_MAX_RESULTS": str(MAX_RESULTS),
                                       "BUCKETSEARCH_MAX_BODY_BYTES": str(MAX_BODY)})
    srv.start(180)
    yield srv
    srv.stop()


@pytest.fixture(params=WIRES)
def wire(request):
    return request.param


@pytest.fixture
def client(server, wire):
    with Client(server.url, api_key=WRITE_KEY, wire=wire, timeout=60) as c:
        yield c


def random_words(n, bits, seed):
    return pack_bits(np.random.default_rng(seed).integers(0, 2, (n, bits), dtype=np.uint8))


def fresh(c, name, bits, **kw):
    try:
        c.delete_index(name)
    except NotFound:
        pass
    return c.create_index(name, bits, **kw)


def test_exported_lazily_and_imports_no_server_code():
    code = ("import sys, bucketsearch\n"
            "from bucketsearch.loadtest import client\n"
            "assert bucketsearch.Client is client.Client\n"
            "assert bucketsearch.AsyncClient is client.AsyncClient\n"
            "bad = [m for m in sys.modules if m.startswith(('bucketsearch.app', 'fastapi'))]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("bits", [64, 12, 100])
def test_every_code_form_in_and_out(client, bits):
    name = f"forms{bits}{client.wire}"
    fresh(client, name, bits)
    words = random_words(50, bits, seed=bits)
    forms = [unpack_words(words[:10], bits),                          # (n, Q) bits {0, 1}
             unpack_words(words[10:20], bits).astype(np.int8) * 2 - 1,  # {-1, +1}
             to_packed(words[20:30], bits),                           # packed uint8 rows
             words[30:40],                                            # uint64 words
             to_hex(words[40:45], bits),                              # hex strings
             to_ints(words[45:50], bits)]                             # Python ints
    starts = [0, 10, 20, 30, 40, 45]
    for form, start in zip(forms, starts):
        n = len(form)
        assert client.add(name, form, np.arange(start, start + n)).tolist() == \
            list(range(start, start + n))
    ids = np.arange(50)
    assert np.array_equal(client.get(name, ids, format="words"), words)
    assert np.array_equal(client.get(name, ids), to_packed(words, bits))
    assert np.array_equal(client.get(name, ids, format="bits"), unpack_words(words, bits))
    assert client.get(name, ids, format="hex") == to_hex(words, bits)
    assert client.get(name, ids, format="int") == to_ints(words, bits)
    with pytest.raises(MissingItems) as err:
        client.get(name, [3, 77, 4, 78])
    assert err.value.ids == [77, 78] and "77" in str(err.value)
    codes, found = client.get(name, [3, 77], format="words", missing="mask")
    assert found.tolist() == [True, False] and np.array_equal(codes[0], words[3])
    assert not codes[1].any()
    # the default ids: first_id, first_id + 1, ... (octet-stream ?first_id= on the binary wire)
    assert client.add(name, words[:3], first_id=1000).tolist() == [1000, 1001, 1002]
    assert np.array_equal(client.get(name, [1000, 1001, 1002], format="words"), words[:3])
    with pytest.raises(ValueError, match="ids must be a 1-D int array of length 2"):
        client.add(name, words[:2], [1, 2, 3])
    with pytest.raises(ValueError):
        client.add(name, ["zz"], [5000])  # not hex: refused before any request


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_ids_given_by_the_index_are_never_given_twice(server, wire):
    """``add`` without ids: the index gives one more than the largest id it ever held, per
    request of a split batch too; deleted ids are not given again; an upsert needs ids."""
    name = f"auto-{wire}"
    words = random_words(700, 64, seed=8)
    with Client(server.url, api_key=WRITE_KEY, wire=wire) as c:
        fresh(c, name, 64)
        assert c.add(name, words[:5]).tolist() == [0, 1, 2, 3, 4]
        c.add(name, words[5:6], [100])
        c.remove(name, [100, 4])
        ids = c.add(name, words[6:])  # 694 codes > max_batch: several requests
        assert ids.tolist() == list(range(101, 101 + 694))
        assert np.array_equal(c.get(name, ids, format="words"), words[6:])
        with pytest.raises(ValueError, match="upsert needs ids"):
            c.upsert(name, words[:1], None)
    raw = httpx.post(f"{server.url}/v1/indexes/{name}/items/upsert",
                     json={"codes": [to_hex(words[:1], 64)[0]]},
                     headers={"Authorization": f"Bearer {WRITE_KEY}"})
    assert raw.status_code == 400 and "an upsert needs one id per code" in raw.text
    raw = httpx.post(f"{server.url}/v1/indexes/{name}/items?auto_ids=true&first_id=5",
                     content=to_packed(words[:1], 64).tobytes(),
                     headers={"Authorization": f"Bearer {WRITE_KEY}",
                              "content-type": "application/octet-stream"})
    assert raw.status_code == 400 and "give first_id or auto_ids=true" in raw.text


@pytest.fixture(scope="module")
def big(server):
    """2,000 random 16-bit codes, ids 10, 13, 16, ... (not positions), merged; queries."""
    bits = 16
    xb = random_words(2_000, bits, seed=1)
    ids = 10 + 3 * np.arange(len(xb), dtype=np.int64)
    xq = np.concatenate([xb[:400], random_words(300, bits, seed=2)])
    with Client(server.url, api_key=WRITE_KEY) as c:
        fresh(c, "big", bits, mode="single")
        assert np.array_equal(c.add("big", xb, ids), ids)  # 2,000 > max_batch: split
        # the server's limits, read from GET /v1/limits (max_results is named in no 413)
        assert c.limits == Limits(MAX_BATCH, MAX_RESULTS, MAX_BODY)
        c.merge("big")
    return bits, xb, ids, xq


def test_batches_above_the_limits_equal_brute_force(client, big):
    bits, xb, ids, xq = big
    R = 3
    lims, D, I = client.range_search("big", xq, R)
    assert lims[-1] > MAX_RESULTS  # more than one request may return
    want = naive_range(xq, xb, ids, bits, R)
    assert np.array_equal(lims, want[0]) and np.array_equal(D, want[1])
    assert np.array_equal(I, want[2])
    D, I = client.search("big", xq, 10)                # 700 x 10 > max_results
    wd, wi = naive_knn(xq, xb, ids, bits, 10)
    assert np.array_equal(D, wd) and np.array_equal(I, wi)
    assert D.shape == (len(xq), 10) and D.dtype == np.int32 and I.dtype == np.int64


def test_top_k_within_radius(client, big):
    bits, xb, ids, xq = big
    k, R = 5, 2
    D, I = client.search("big", xq, k, max_distance=R)
    wd, wi = naive_knn(xq, xb, ids, bits, k)
    far = wd > R
    wd[far], wi[far] = -1, -1
    assert np.array_equal(D, wd) and np.array_equal(I, wi)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nq=st.integers(1, 40), radius=st.integers(0, 4), k=st.integers(1, 30),
       seed=st.integers(0, 2**32 - 1))
def test_property_radius_and_knn_equal_brute_force(server, big, nq, radius, k, seed):
    bits, xb, ids, _ = big
    xq = random_words(nq, bits, seed)
    with Client(server.url, api_key=READ_KEY) as c:
        lims, D, I = c.range_search("big", xq, radius)
        want = naive_range(xq, xb, ids, bits, radius)
        assert np.array_equal(lims, want[0]) and np.array_equal(I, want[2])
        assert np.array_equal(D, want[1])
        D, I = c.search("big", xq, k)
        wd, wi = naive_knn(xq, xb, ids, bits, k)
        assert np.array_equal(D, wd) and np.array_equal(I, wi)


def test_stats_in_the_engine_layout(client, big):
    bits, xb, ids, xq = big
    R = 2
    lims, D, I, stats = client.range_search("big", xq[:5], R, stats=True)
    assert stats.radii.tolist() == [R + 1] * 5
    assert stats.probes.tolist() == [[math.comb(bits, r) for r in range(R + 1)]] * 5
    assert (stats.nonempty_buckets + stats.empty_buckets == stats.probes).all()
    assert stats.items.sum(axis=1).tolist() == np.diff(lims).tolist()  # merged: no delta
    assert stats.delta_items.tolist() == [0] * 5 and stats.requests == 1
    assert stats.per_query(0)[0]["probes"] == 1 and (stats.lookup_ns >= 0).all()
    D2, I2, st2 = client.search("big", xq[:5], 3, stats=True)
    assert st2.radii.shape == (5,) and (st2.radii >= 1).all()


def test_upsert_remove_merge_set_mode(client):
    bits, name = 64, f"writes{client.wire}"
    fresh(client, name, bits, mode="single")
    words = random_words(20, bits, seed=3)
    client.add(name, words[:10], np.arange(10))
    assert client.upsert(name, words[10:15], [0, 1, 2, 100, 101]) == (2, 3)
    assert np.array_equal(client.get(name, [0, 1, 2, 100], format="words"),
                          words[[10, 11, 12, 13]])
    assert client.remove(name, [0, 1, 555]) == 2
    info = client.merge(name)
    assert info["size"] == 10 and info["delta_size"] == 0
    info = client.set_mode(name, "mih")
    assert info["mode"] == "mih"
    lims, D, I = client.range_search(name, words[12:13], 0)
    assert I.tolist() == [2]
    assert [i["name"] for i in client.indexes()].count(name) == 1
    assert client.cost_model(name)["bits"] == bits
    with pytest.raises(ValueError, match="upsert needs ids"):
        client.upsert(name, words[:1], None)


def test_backup_and_restore(client, tmp_path):
    bits, name = 32, f"bk{client.wire}"
    fresh(client, name, bits)
    words = random_words(300, bits, seed=4)
    client.add(name, words, np.arange(300) * 7)
    path = tmp_path / "ix.backup"
    size = client.backup(name, path)
    assert size == path.stat().st_size > 0
    buf = io.BytesIO()
    assert client.backup(name, buf) > 0
    for target, src in ((f"{name}_a", path), (f"{name}_b", io.BytesIO(buf.getvalue()))):
        try:
            client.delete_index(target)
        except NotFound:
            pass
        info = client.restore(target, src)
        assert info["name"] == target and info["size"] == 300 and info["bits"] == bits
        assert np.array_equal(client.get(target, np.arange(300) * 7, format="words"), words)
    with pytest.raises(Conflict):
        client.restore(f"{name}_a", path)
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(BadRequest) as err:
        client.restore(f"{name}_c", io.BytesIO(bytes(damaged)))
    assert err.value.status == 400 and err.value.detail
    with pytest.raises(NotFound):
        client.index(f"{name}_c")  # nothing left behind
    # a snapshot kept on the server: made, listed, downloaded, restored, deleted
    snap = client.snapshot(name)
    assert snap["items"] == 300 and snap["index"] == name
    assert [s["snapshot"] for s in client.snapshots(name)] == [snap["snapshot"]]
    tar = tmp_path / "ix.tar"
    assert client.download_snapshot(name, snap["snapshot"], tar) == snap["bytes"]
    import hashlib
    assert hashlib.sha256(tar.read_bytes()).hexdigest() == snap["sha256"]
    target = f"{name}_t"
    try:
        client.delete_index(target)
    except NotFound:
        pass
    assert client.restore(target, tar)["size"] == 300
    assert np.array_equal(client.get(target, np.arange(300) * 7, format="words"), words)
    client.delete_snapshot(name, snap["snapshot"])
    assert client.snapshots(name) == []
    with pytest.raises(NotFound, match="no snapshot"):
        client.download_snapshot(name, snap["snapshot"], io.BytesIO())


def test_error_classes_from_a_real_server(server):
    with Client(server.url) as anon, Client(server.url, api_key="wrong") as wrong, \
            Client(server.url, api_key=READ_KEY) as reader, \
            Client(server.url, api_key=WRITE_KEY) as writer:
        with pytest.raises(Unauthorized) as err:
            anon.indexes()
        assert err.value.status == 401 and "Bearer" in str(err.value)
        with pytest.raises(Forbidden):
            wrong.indexes()
        with pytest.raises(Forbidden):
            reader.create_index("never", 64)
        with pytest.raises(NotFound) as err:
            reader.index("no-such-index")
        assert "no-such-index" in err.value.detail
        fresh(writer, "errs", 64)
        with pytest.raises(Conflict):
            writer.create_index("errs", 64)
        with pytest.raises(BadRequest) as err:
            writer.create_index("bad", 0)
        assert isinstance(err.value, ValueError) and err.value.errors
        assert err.value.errors[0]["loc"][-1] == "bits"
        with pytest.raises(BadRequest, match="max_distance"):
            writer.range_search("errs", random_words(1, 64, 0), 65)
        writer.add("errs", random_words(1, 64, 0), [1])
        with pytest.raises(Conflict, match="id 1"):
            writer.add("errs", random_words(1, 64, 1), [1])
        big = 10 + 3 * np.arange(8000)
        fresh(writer, "huge", 16)
        writer.add("huge", random_words(8000, 16, 5), big)
        buf = io.BytesIO()
        writer.backup("huge", buf)
        assert len(buf.getvalue()) > MAX_BODY
        with pytest.raises(PayloadTooLarge):
            writer.restore("huge2", io.BytesIO(buf.getvalue()))


def test_status_table():
    for status, cls in [(400, BadRequest), (401, Unauthorized), (403, Forbidden),
                        (404, NotFound), (409, Conflict), (413, PayloadTooLarge),
                        (415, cl.UnsupportedMediaType), (408, cl.RequestTimeout),
                        (503, Unavailable), (418, cl.ClientError), (500, cl.ServerError)]:
        resp = httpx.Response(status, json={"detail": f"says {status}", "errors": []},
                              headers={"retry-after": "2"})
        err = cl.error_for(resp, "GET", "/x")
        assert type(err) is cls and err.status == status and err.detail == f"says {status}"
        assert isinstance(err, BucketsearchError)
        assert str(err) == f"GET /x -> {status}: says {status}"
    err = cl.error_for(httpx.Response(502, text="<html>bad gateway</html>"), "GET", "/x")
    assert isinstance(err, cl.ServerError) and "bad gateway" in err.detail


# ------------------------------------------------------------------------------- retries
def scripted(answers, seen):
    """A mock transport answering from ``answers`` in turn (recording each request)."""
    def handle(request):
        seen.append((request.method, request.url.path))
        answer = answers[min(len(seen) - 1, len(answers) - 1)]
        return answer() if callable(answer) else answer
    return httpx.MockTransport(handle)


def info_answer():
    return httpx.Response(200, json={"name": "x", "bits": 64})


def test_503_waits_retry_after_then_succeeds(monkeypatch):
    slept, seen = [], []
    monkeypatch.setattr(cl.time, "sleep", slept.append)
    busy = httpx.Response(503, json={"detail": "busy"}, headers={"retry-after": "1.5"})
    with Client("http://t", limits=Limits(), transport=scripted([busy, busy, info_answer], seen)) as c:
        assert c.index("x")["bits"] == 64
    assert slept == [1.5, 1.5] and len(seen) == 3


def test_503_with_a_long_retry_after_is_raised(monkeypatch):
    slept, seen = [], []
    monkeypatch.setattr(cl.time, "sleep", slept.append)
    busy = httpx.Response(503, json={"detail": "index unavailable"}, headers={"retry-after": "300"})
    with Client("http://t", limits=Limits(), transport=scripted([busy], seen), retry=Retry(max_retry_after=30)) as c:
        with pytest.raises(Unavailable) as err:
            c.index("x")
    assert err.value.retry_after == 300 and slept == [] and len(seen) == 1


def test_writes_are_never_resent_and_upsert_is(monkeypatch):
    monkeypatch.setattr(cl.time, "sleep", lambda s: None)
    busy = httpx.Response(503, json={"detail": "busy"}, headers={"retry-after": "0"})
    ok = httpx.Response(200, json={"inserted": 1, "replaced": 0, "size": 1})
    seen = []

    def always_busy(request):
        seen.append((request.method, request.url.path))
        return info_answer() if request.method == "GET" else busy
    with Client("http://t", limits=Limits(), transport=httpx.MockTransport(always_busy)) as c:
        with pytest.raises(Unavailable):
            c.add("x", random_words(1, 64, 0), [1])
        with pytest.raises(Unavailable):
            c.remove("x", [1])
        with pytest.raises(Unavailable):
            c.create_index("y", 64)
        with pytest.raises(Unavailable):
            c.restore("y", io.BytesIO(b"backup"))
        with pytest.raises(Unavailable):
            c.delete_index("y")
    assert [m for m, _ in seen] == ["GET", "POST", "POST", "POST", "POST", "DELETE"]
    seen.clear()
    with Client("http://t", limits=Limits(), transport=scripted([info_answer(), busy, busy, ok], seen)) as c:
        assert c.upsert("x", random_words(1, 64, 0), [1]) == (1, 0)
    assert len(seen) == 4
    seen.clear()
    bad = httpx.Response(400, json={"detail": "k: bad"})
    with Client("http://t", limits=Limits(), transport=scripted([info_answer(), bad], seen)) as c:
        with pytest.raises(BadRequest):
            c.search("x", random_words(1, 64, 0), 3)
    assert len(seen) == 2  # a 400 is an answer, not a failure: never retried


class DroppingProxy:
    """A TCP proxy to ``port`` that reads the request of its first ``drop`` connections and
    closes them unanswered (the server never sees those requests)."""

    def __init__(self, port: int, drop: int):
        self.port, self.drop, self.connections = port, drop, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            if self.drop > 0:
                self.drop -= 1
                conn.recv(65536)
                conn.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.port))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def test_dropped_connection_read_retried_write_not(server):
    with Client(server.url, api_key=WRITE_KEY) as direct:
        fresh(direct, "drops", 64)
        words = random_words(5, 64, seed=9)
        direct.add("drops", words, np.arange(5))
        proxy = DroppingProxy(server.port, drop=0)
        try:  # "connection: close": one connection per request, so each drop hits one request
            with Client(proxy.url, api_key=WRITE_KEY, retry=Retry(backoff=0.01),
                        headers={"connection": "close"}, limits=Limits()) as c:
                c.index("drops")          # caches the bits (a connection of its own)
                proxy.drop = 1
                lims, D, I = c.range_search("drops", words, 0)
                assert I.tolist() == [0, 1, 2, 3, 4] and proxy.connections == 3
                proxy.drop = 1
                with pytest.raises(TransportError):
                    c.add("drops", random_words(1, 64, seed=10), [99])
                assert proxy.connections == 4  # one attempt only
        finally:
            proxy.close()
        assert direct.index("drops")["size"] == 5
        with pytest.raises(MissingItems):
            direct.get("drops", [99])


def test_async_client_gives_what_the_sync_client_gives(server, big):
    bits, xb, ids, xq = big

    async def main():
        async with AsyncClient(server.url, api_key=READ_KEY) as c:
            lims, D, I = await c.range_search("big", xq[:50], 2)
            Dk, Ik = await c.search("big", xq[:50], 4)
            codes = await c.get("big", ids[:7], format="words")
            names = [i["name"] for i in await c.indexes()]
            return lims, D, I, Dk, Ik, codes, names
    lims, D, I, Dk, Ik, codes, names = asyncio.run(main())
    with Client(server.url, api_key=READ_KEY) as c:
        want = c.range_search("big", xq[:50], 2)
        assert all(np.array_equal(a, b) for a, b in zip((lims, D, I), want))
        wd, wi = c.search("big", xq[:50], 4)
    assert np.array_equal(Dk, wd) and np.array_equal(Ik, wi)
    assert np.array_equal(codes, xb[:7]) and "big" in names


def test_client_arguments_are_checked():
    with pytest.raises(ValueError, match="wire"):
        Client(wire="xml")
    with pytest.raises(ValueError, match="api_key"):
        Client(api_key="two words")
    with pytest.raises(ValueError, match="max_batch"):
        Limits(max_batch=0)
    with pytest.raises(ValueError, match="attempts"):
        Retry(attempts=-1)


@st.composite
def csr_results(draw):
    """Random CSR search results ``(lims, D, I)`` as a server holds them."""
    counts = draw(st.lists(st.integers(0, 6), min_size=0, max_size=8))
    n = sum(counts)
    lims = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=lims[1:])
    D = np.array(draw(st.lists(st.integers(0, 256), min_size=n, max_size=n)), dtype=np.int32)
    I = np.array(draw(st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n)),
                 dtype=np.int64)
    return lims, D, I


@settings(max_examples=60, deadline=None)
@given(csr_results())
def test_wire_decoders_invert_the_servers_encoders(res):
    """The client's decoders against the server's own encoders (app/encode.py)."""
    from bucketsearch.app.encode import results_binary, results_json

    lims, D, I = res
    answers = [httpx.Response(200, content=results_binary(lims, D, I),
                              headers={"content-type": "application/octet-stream"}),
               httpx.Response(200, content=b'{"results":' + results_json(lims, D, I)
                              + b',"took_ms":0.1}', headers={"content-type": "application/json"})]
    for resp in answers:
        got_lims, got_D, got_I, stats = decode_search(resp)
        assert np.array_equal(got_lims, lims) and np.array_equal(got_D, D)
        assert np.array_equal(got_I, I) and stats is None
        assert search_summary(resp.content, resp.headers["content-type"])[0] == len(I)
    with pytest.raises(ValueError):
        decode_search(httpx.Response(200, content=answers[0].content[:-1],
                                     headers={"content-type": "application/octet-stream"}))


def test_async_client_waits_retry_after(monkeypatch):
    slept, seen = [], []

    async def fake_sleep(seconds):
        slept.append(seconds)
    monkeypatch.setattr(cl.asyncio, "sleep", fake_sleep)
    busy = httpx.Response(503, json={"detail": "busy"}, headers={"retry-after": "0.7"})

    async def main():
        async with AsyncClient("http://t", limits=Limits(), transport=scripted([busy, info_answer], seen)) as c:
            return await c.index("x")
    assert asyncio.run(main())["bits"] == 64 and slept == [0.7] and len(seen) == 2


def test_ready_and_sample(server, big):
    bits, xb, ids, _ = big
    with Client(server.url, api_key=READ_KEY) as c:
        assert c.ready()["status"] == "ready"
        got_ids, packed, size = c.sample("big", 50, seed=3)
        assert size == len(xb) and len(got_ids) == 50 and packed.shape == (50, 2)
        pos = (got_ids - 10) // 3
        assert np.array_equal(packed, to_packed(xb[pos], bits))


def test_a_split_write_that_fails_says_what_was_written(server, wire):
    with Client(server.url, api_key=WRITE_KEY, wire=wire) as c:
        name = f"partial{wire}"
        fresh(c, name, 64)
        c.add(name, random_words(1, 64, seed=1), [650])
        words = random_words(700, 64, seed=2)
        with pytest.raises(Conflict) as err:
            c.add(name, words, np.arange(700))     # 3 requests of <= 300; the third clashes
        assert err.value.acknowledged == 600 and "600 items were written" in str(err.value)
        assert c.index(name)["size"] == 601
        assert np.array_equal(c.get(name, np.arange(600), format="words"), words[:600])


def test_limits_given_are_lowered_by_a_413(server):
    """A client told larger limits than the server's is not corrected by /v1/limits but by
    the 413 that names max_batch; nothing of the refused request was written."""
    with Client(server.url, api_key=WRITE_KEY, limits=Limits(max_batch=10_000)) as c:
        fresh(c, "given", 64)
        assert len(c.add("given", random_words(700, 64, seed=4), np.arange(700))) == 700
        assert c.limits.max_batch == MAX_BATCH and c.limits.max_results == 5_000_000
        assert c.index("given")["size"] == 700


def test_backup_and_restore_commands(server, tmp_path):
    """``bucketsearch backup`` / ``restore``: the file round trip through a real server, and
    the errors as one line naming what went wrong."""
    with Client(server.url, api_key=WRITE_KEY) as c:
        fresh(c, "cmd", 32)
        words = random_words(50, 32, seed=7)
        c.add("cmd", words, np.arange(50))
    for name in ("cmd2", "cmd3"):
        with Client(server.url, api_key=WRITE_KEY) as c:
            try:
                c.delete_index(name)
            except NotFound:
                pass

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "bucketsearch", *argv, "--url", server.url,
                               "--api-key", WRITE_KEY], capture_output=True, text=True,
                              timeout=120)

    out = tmp_path / "cmd.bsbackup"
    done = run("backup", "cmd", str(out))
    assert done.returncode == 0 and f"written to {out}" in done.stdout, done.stderr
    done = run("restore", "cmd2", str(out))
    assert done.returncode == 0 and "restored 'cmd2': 50 items, 32 bits" in done.stdout
    with Client(server.url, api_key=WRITE_KEY) as c:
        assert np.array_equal(c.get("cmd2", np.arange(50), format="words"), words)
    done = run("restore", "cmd2", str(out))  # the name exists
    assert done.returncode == 2 and "already exists" in done.stderr
    out.write_bytes(out.read_bytes()[:-3])
    done = run("restore", "cmd3", str(out))
    assert done.returncode == 2 and "checksum" in done.stderr
    done = run("backup", "nope", str(tmp_path / "x"))
    assert done.returncode == 2 and "not found" in done.stderr and not (tmp_path / "x").exists()
    # the file's folder missing, or a folder given: named before any request, one line
    done = run("backup", "cmd", str(tmp_path / "no" / "x.bs"))
    assert done.returncode == 2 and "folder of" in done.stderr and "does not exist" in \
        done.stderr and "Traceback" not in done.stderr, done.stderr
    done = run("backup", "cmd", str(tmp_path))
    assert done.returncode == 2 and "is a folder" in done.stderr, done.stderr
    done = run("restore", "cmd3", str(tmp_path))
    assert done.returncode == 2 and "is a folder, not a backup file" in done.stderr, done.stderr


# ------------------------------------------------------------ the blocking Client's connections
def test_pooled_connections_are_kept_alive_and_a_closed_idle_one_is_replaced():
    """Requests reuse one keep-alive connection; when the server closes an idle connection
    without saying so (as uvicorn does after its keep-alive timeout), the next request, a
    write here, goes on a new connection instead of failing."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bucketsearch.loadtest.transport import PooledHTTP

    seen, closing = [], [False]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            seen.append((self.client_address[1], self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            self.close_connection = closing[0]

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    pool = PooledHTTP(f"http://127.0.0.1:{httpd.server_address[1]}", {}, 5.0)
    try:
        for i in range(5):
            assert pool.request("POST", "/x", {"i": i}, b"read").json() == {}
        assert len({port for port, _ in seen}) == 1
        closing[0] = True
        pool.request("POST", "/x", None, b"last on this connection")
        closing[0] = False
        time.sleep(0.2)  # the server has closed it by now
        answer = pool.request("POST", "/x", None, b"write")
        assert answer.status_code == 200 and seen[-1][1] == b"write"
        assert len({port for port, _ in seen}) == 2
    finally:
        pool.close()
        httpd.shutdown()


class _ScriptedSocket:
    """Beneath a real :class:`bucketsearch.loadtest.transport._Connection`: records what is sent and
    answers ``recv`` from ``chunks`` in turn (then EOF)."""

    def __init__(self, chunks):
        self.chunks, self.sent = list(chunks), []

    def sendall(self, data):
        self.sent.append(bytes(data))

    def recv(self, size):
        return self.chunks.pop(0) if self.chunks else b""

    def close(self):
        pass


def _connection(chunks):
    from bucketsearch.loadtest import transport
    conn = transport._Connection.__new__(transport._Connection)
    conn.sock, conn.buf = _ScriptedSocket(chunks), bytearray()
    return conn


def test_the_connection_speaks_http_1_1():
    """One send for a head and a small body, two (no copy) past MAX_JOINED; answers framed by
    Content-Length (split anywhere), chunked (with extensions and trailers), or the end of the
    connection; 1xx skipped; keep-alive and close; malformed answers are protocol errors."""
    from bucketsearch.loadtest import transport

    ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\n{\"a\":1}"
    for split in range(1, len(ok)):
        conn = _connection([ok[:split], ok[split:]])
        assert conn.exchange("POST", b"HEAD\r\n\r\n", b"body") == \
            (200, [("content-type", "application/json"), ("content-length", "7")], b'{"a":1}', True)
        assert conn.sock.sent == [b"HEAD\r\n\r\nbody"]
    big = b"x" * (transport.MAX_JOINED + 1)
    conn = _connection([ok])
    conn.exchange("POST", b"HEAD\r\n\r\n", big)
    assert [len(x) for x in conn.sock.sent] == [8, len(big)]

    chunked = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\n")
    status, _, body, keep = _connection([chunked[i:i + 5] for i in range(0, len(chunked), 5)]) \
        .exchange("GET", b"H\r\n\r\n", None)
    assert (status, body, keep) == (200, b"abc0123456789", True)
    eof = b"HTTP/1.0 200 OK\r\nx: y\r\n\r\nall of it"
    assert _connection([eof]).exchange("GET", b"H", None)[2:] == (b"all of it", False)
    close = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
    assert _connection([close]).exchange("DELETE", b"H", None)[2:] == (b"", False)

    class Refusing(_ScriptedSocket):  # answers 413 from the head, then stops reading
        def sendall(self, data):
            raise BrokenPipeError(32, "Broken pipe")

    early = b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 2\r\n\r\n{}"
    conn = _connection([])
    conn.sock = Refusing([early])
    assert conn.exchange("POST", b"H", b"x" * 10)[0::2] == (413, b"{}")
    conn.sock = Refusing([])
    with pytest.raises(BrokenPipeError):  # no answer: the send's own error
        conn.exchange("POST", b"H", b"x")

    for broken, message in ((b"", "without an answer"), (ok[:30], "in the middle"),
                            (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP status line"),
                            (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "not a header line"),
                            (b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", "Content-Length"),
                            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
                             "chunk size")):
        with pytest.raises((transport._Closed, httpx.RemoteProtocolError), match=message):
            _connection([broken]).exchange("GET", b"H", None)


def test_request_heads_and_bad_headers():
    """The head PooledHTTP writes (host, one content-length from the body, header names
    case-blind, the caller's over the defaults), and headers that would break it refused
    naming them."""
    from bucketsearch.loadtest.transport import PooledHTTP

    pool = PooledHTTP("http://example.invalid:8123/base/", {"User-Agent": "a", "x-k": "1"}, 1.0)
    sent = []

    class Conn:
        def exchange(self, method, head, body):
            sent.append(head + (body or b""))
            return 200, [], b"{}", True

        def alive(self):
            return True

    pool._idle = [Conn()]
    pool.request("POST", "/v1/x", {"a": 1, "b": "c d"}, b"12345",
                 {"Content-Type": "t", "X-K": "2", "content-length": "99"})
    head = sent[0].decode()
    assert head.startswith("POST /base/v1/x?a=1&b=c+d HTTP/1.1\r\nhost: example.invalid:8123\r\n")
    assert "user-agent: a\r\n" in head and "x-k: 2\r\n" in head and "x-k: 1" not in head
    assert head.count("content-length") == 1 and head.endswith("content-length: 5\r\n\r\n12345")
    pool.request("POST", "/m")
    assert sent[1].endswith(b"content-length: 0\r\n\r\n")
    for bad in ({"x": "a\r\nevil: 1"}, {"a b": "1"}, {"": "1"}):
        with pytest.raises(ValueError, match="not a valid header"):
            pool.request("GET", "/", headers=bad)
    with pytest.raises(ValueError, match="url must be"):
        PooledHTTP("ftp://x", {}, 1.0)


def test_an_early_413_is_read_though_the_body_was_not(server):
    """A body far over the server's max_body_bytes: the server answers 413 from the head and
    closes without reading the body; the transport reads that answer instead of raising the
    failed send, and the next request opens a new connection."""
    from bucketsearch.loadtest.transport import PooledHTTP

    pool = PooledHTTP(server.url, {"authorization": f"Bearer {WRITE_KEY}"}, 30.0)
    try:
        answer = pool.request("POST", "/v1/indexes/nope/items", content=b"\0" * (64 * MAX_BODY),
                              headers={"content-type": "application/octet-stream"})
        assert answer.status_code == 413, answer.text
        assert pool.request("GET", "/v1/limits").json()["max_body_bytes"] == MAX_BODY
    finally:
        pool.close()


def test_https_with_a_ca_file_and_without(tmp_path):
    """The Client over TLS: a server with a self-made certificate (openssl) is reached with
    ``verify=<its certificate>`` (sync and async), refused with the default (system CAs: a
    ConnectError naming the verification), reached with ``verify=False``."""
    import json
    import shutil
    import ssl
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            body = json.dumps({"ready": True, "path": self.path}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    httpd.socket = server_tls.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{httpd.server_address[1]}"
    try:
        with Client(url, verify=str(cert)) as c:
            assert c.ready() == {"ready": True, "path": "/readyz"}
            assert c.ready()["ready"]  # the same connection, kept alive
        with Client(url, verify=False) as c:
            assert c.ready()["ready"]
        with Client(url, retry=Retry(attempts=0)) as c:
            with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
                c.ready()

        async def main():
            async with AsyncClient(url, verify=str(cert)) as ac:
                return await ac.ready()
        assert asyncio.run(main())["ready"]
        with pytest.raises(ValueError, match="verify must be"):
            Client(url, verify=3)
    finally:
        httpd.shutdown()


def test_dot_segments_are_refused_before_any_request():
    """An index or snapshot named '', '.' or '..' would be resolved away by URL normalization
    (``snapshots/..`` is the index itself: a DELETE would delete it), so the Client refuses it
    with a ValueError naming the field before sending anything (no server listens here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens
    with Client(f"http://127.0.0.1:{port}") as c:
        with pytest.raises(ValueError, match=r"snapshot: '\.\.' is not a name"):
            c.delete_snapshot("a", "..")
        with pytest.raises(ValueError, match=r"snapshot: '\.' is not a name"):
            c.download_snapshot("a", ".", io.BytesIO())
        with pytest.raises(ValueError, match=r"name: '\.\.' is not a name"):
            c.delete_index("..")
        with pytest.raises(ValueError, match=r"name: '' is not a name"):
            c.snapshots("")

    async def run_async():
        async with AsyncClient(f"http://127.0.0.1:{port}") as ac:
            with pytest.raises(ValueError, match=r"snapshot: '\.\.' is not a name"):
                await ac.delete_snapshot("a", "..")

    asyncio.run(run_async())


def test_a_bulk_add_reports_its_progress(server, wire, capfd):
    """``add(progress=...)``: a callable hears (done, total) after each acknowledged request,
    growing to the total; True draws a bar on stderr; anything else is a ValueError."""
    name = f"progress-{wire}"
    words = random_words(700, 64, seed=11)
    seen = []
    with Client(server.url, api_key=WRITE_KEY, wire=wire) as c:
        fresh(c, name, 64)
        c.add(name, words[:500], first_id=0, progress=lambda done, total: seen.append((done, total)))
        assert len(seen) >= 500 // MAX_BATCH and seen[-1] == (500, 500)
        assert [d for d, _ in seen] == sorted({d for d, _ in seen}) and {t for _, t in seen} == {500}
        c.add(name, words[500:], first_id=500, progress=True)
        assert "add to " + name in capfd.readouterr().err
        with pytest.raises(ValueError, match="progress must be True, False or a callable"):
            c.add(name, words[:1], [9999], progress="yes")
        assert c.index(name)["size"] == 700
