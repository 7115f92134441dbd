"""Dedup on ingest over HTTP (issue 27 item 6): ``POST /v1/indexes/{name}/items/dedup``.

* in process (TestClient): JSON and binary bodies and answers give the literal twin's answer
  (tests/naive.py dedup_insert); every refusal is a 4xx naming the field;
* a real server: the Client (sync and async, both wires, batches split over several requests)
  equals the twin; several clients sending near-duplicates of each other at the same time never
  get two items within the radius in; a SIGKILL keeps exactly what was acknowledged.
"""
from __future__ import annotations

import asyncio
import threading

import httpx
import naive
import naive_dedup
import numpy as np
import pytest
from helpers import app_client, create_index

from bucketsearch.index.codes import n_bytes, pack_bits, to_hex, to_packed
from bucketsearch.loadtest.client import AsyncClient, BadRequest, Client, Conflict, Retry
from bucketsearch.loadtest.wire import decode_dedup

pytestmark = pytest.mark.timeout(600)
BITS, RADIUS = 64, 4


def clustered(rng, n, bits=BITS, centers=6, flips=6):
    """Codes around a few centres: many pairs within RADIUS, many farther."""
    c = rng.integers(0, 2, size=(centers, bits), dtype=np.uint8)
    rows = c[rng.integers(0, centers, size=n)].copy()
    for row in rows:
        row[rng.choice(bits, size=int(rng.integers(0, flips + 1)), replace=False)] ^= 1
    return pack_bits(rows)


def twin_of(live_words, live_ids, words, ids, report=10, first_id=0, radius=RADIUS):
    return naive_dedup.dedup_insert(live_words, live_ids, words, ids, BITS, radius, report, first_id)


def check(got, twin):
    ids, inserted, lims, D, I = got[:5]
    t_ids, t_ins, t_block = twin
    assert (inserted == t_ins).all() and (ids == t_ids).all()
    for j, (bi, bd) in enumerate(t_block):
        assert (I[lims[j]:lims[j + 1]] == bi).all() and (D[lims[j]:lims[j + 1]] == bd).all()


def seed_index(c, name, live):
    create_index(c, name, BITS, mode="auto")
    r = c.post(f"/v1/indexes/{name}/items", json={"ids": list(range(40)),
                                                   "codes": to_hex(live, BITS)})
    assert r.status_code == 200, r.text
    return live, np.arange(40, dtype=np.int64)


def test_json_and_binary_equal_the_twin(tmp_path):
    rng = np.random.default_rng(0)
    batch = clustered(rng, 60)
    ids = np.arange(1000, 1060, dtype=np.int64)
    with app_client(tmp_path) as c:
        live, live_ids = seed_index(c, "j", clustered(rng, 40))
        seed_index(c, "b", live)  # the same items
        twin = twin_of(live, live_ids, batch, ids, report=3)
        r = c.post("/v1/indexes/j/items/dedup", json={"codes": to_hex(batch, BITS),
                                                      "ids": ids.tolist(), "radius": RADIUS,
                                                      "max_reported": 3})
        assert r.status_code == 200, r.text
        body = r.json()
        check(decode_dedup(r), twin)
        assert body["inserted"] == twin[1].sum() and body["rejected"] == (~twin[1]).sum()
        assert body["size"] == 40 + twin[1].sum() and body["first_id"] is None
        raw = ids.astype("<i8").tobytes() + to_packed(batch, BITS).tobytes()
        r = c.post("/v1/indexes/b/items/dedup", content=raw,
                   params={"radius": RADIUS, "max_reported": 3},
                   headers={"content-type": "application/octet-stream",
                            "accept": "application/octet-stream"})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/octet-stream"
        check(decode_dedup(r), twin)
        # the index holds exactly the inserted items, with their codes
        got = c.post("/v1/indexes/b/items/get", json={"ids": ids.tolist()}).json()["codes"]
        assert [g is not None for g in got] == twin[1].tolist()


def test_ids_given_by_the_index_and_a_resend(tmp_path):
    rng = np.random.default_rng(1)
    batch = clustered(rng, 30)
    with app_client(tmp_path) as c:
        live, live_ids = seed_index(c, "a", clustered(rng, 40))
        twin = twin_of(live, live_ids, batch, None, first_id=40)
        raw = to_packed(batch, BITS).tobytes()
        params = {"radius": RADIUS, "auto_ids": "true"}
        headers = {"content-type": "application/octet-stream"}
        r = c.post("/v1/indexes/a/items/dedup", content=raw, params=params, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["first_id"] == 40
        check(decode_dedup(r), twin)
        # sent again: nothing goes in, each item is blocked by its first copy (or by what
        # blocked it the first time)
        again = c.post("/v1/indexes/a/items/dedup", content=raw, params=params, headers=headers)
        assert again.json()["inserted"] == 0
        for item, first in zip(again.json()["items"], r.json()["items"]):
            assert item["id"] is None and not item["inserted"]
            if first["inserted"]:
                assert item["duplicate_of"][0] == first["id"] and item["distances"][0] == 0


@pytest.mark.parametrize("request_args, status, field", [
    (dict(json={"codes": ["00" * 8], "radius": True}), 400, "radius"),
    (dict(json={"codes": ["00" * 8], "radius": 2.5}), 400, "radius"),
    (dict(json={"codes": ["00" * 8], "radius": "2"}), 400, "radius"),
    (dict(json={"codes": ["00" * 8], "radius": 65}), 400, "radius"),
    (dict(json={"codes": ["00" * 8], "radius": -1}), 400, "radius"),
    (dict(json={"codes": ["00" * 8]}), 400, "radius"),
    (dict(json={"codes": ["00" * 8], "radius": 1, "max_reported": 0}), 400, "max_reported"),
    (dict(json={"codes": ["00" * 8], "radius": 1, "max_reported": 10**6}), 400, "max_reported"),
    (dict(json={"codes": ["00" * 8], "ids": [1, 2], "radius": 1}), 400, "ids"),
    (dict(json={"codes": ["00" * 8], "ids": [1], "radius": 1, "k": 3}), 400, "k"),
    (dict(json={"codes": ["zz" * 8], "radius": 1}), 400, "codes"),
    (dict(json={"codes": ["00" * 8], "radius": 1}, params={"radius": 1}), 400, "radius"),
    (dict(content=b"\0" * 16, headers={"content-type": "application/octet-stream"}), 400,
     "radius"),
    (dict(content=b"\0" * 15, params={"radius": 1},
          headers={"content-type": "application/octet-stream"}), 400, "body"),
    (dict(content=b"\0" * 8, params={"radius": 1, "auto_ids": "true", "first_id": 3},
          headers={"content-type": "application/octet-stream"}), 400, "first_id"),
    (dict(content=b"x", headers={"content-type": "text/plain"}), 415, "Content-Type"),
])
def test_refusals_name_the_field(tmp_path, request_args, status, field):
    with app_client(tmp_path, max_k=1000) as c:
        create_index(c, "e", BITS)
        r = c.post("/v1/indexes/e/items/dedup", **request_args)
        assert r.status_code == status, r.text
        assert field in r.json()["detail"], r.text
        assert c.get("/v1/indexes/e").json()["size"] == 0


def test_limits_conflict_and_auth(tmp_path):
    with app_client(tmp_path, max_batch=5, api_key="w" * 8) as c:
        auth = {"authorization": "Bearer " + "w" * 8}
        r = c.post("/v1/indexes", json={"name": "x", "bits": BITS}, headers=auth)
        assert r.status_code == 201
        codes = to_hex(clustered(np.random.default_rng(2), 6, centers=6, flips=0), BITS)
        body = {"codes": codes, "radius": 0}
        assert c.post("/v1/indexes/x/items/dedup", json=body).status_code == 401
        r = c.post("/v1/indexes/x/items/dedup", json=body, headers=auth)
        assert r.status_code == 413 and "max_batch" in r.json()["detail"]
        rows = np.zeros((3, BITS), dtype=np.uint8)
        rows[1], rows[2, :32] = 1, 1  # pairwise 32 or 64 apart
        far = to_hex(pack_bits(rows), BITS)
        assert c.post("/v1/indexes/x/items", json={"ids": [7], "codes": far[:1]},
                      headers=auth).status_code == 200
        # id 7 is live with a code farther than the radius: 409, and nothing written
        r = c.post("/v1/indexes/x/items/dedup", json={"codes": far[1:], "ids": [6, 7],
                                                      "radius": 0}, headers=auth)
        assert r.status_code == 409 and "id 7" in r.json()["detail"]
        assert c.get("/v1/indexes/x", headers=auth).json()["size"] == 1
        metrics = c.get("/metrics").text
        assert "bucketsearch_dedup_items" in metrics


def test_openapi_documents_the_route(tmp_path):
    with app_client(tmp_path) as c:
        spec = c.get("/openapi.json").json()
        op = spec["paths"]["/v1/indexes/{name}/items/dedup"]["post"]
        assert set(op["requestBody"]["content"]) == {"application/json",
                                                      "application/octet-stream"}
        assert "application/octet-stream" in op["responses"]["200"]["content"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert {"codes", "radius"} <= set(schema["required"])


# ------------------------------------------------------------------------ a real server
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from helpers import ServerProcess
    srv = ServerProcess(tmp_path_factory.mktemp("dedup") / "data",
                        {"BUCKETSEARCH_MAX_BATCH": "25", "BUCKETSEARCH_MERGE_THRESHOLD": "60"})
    srv.start(180)
    yield srv
    srv.kill()


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_client_split_batches_equal_one_request(server, wire):
    """60 items over requests of at most 25 (max_batch): the twin's answer for one request."""
    rng = np.random.default_rng(3)
    batch = clustered(rng, 60)
    with Client(server.url, wire=wire) as c:
        name = f"c-{wire}"
        c.create_index(name, BITS)
        live = clustered(rng, 20)
        c.add(name, live, ids=np.arange(20))
        got = c.add_dedup(name, batch, RADIUS, ids=np.arange(100, 160), max_reported=4)
        check((got.ids, got.inserted, got.lims, got.D, got.I),
              twin_of(live, np.arange(20), batch, np.arange(100, 160), report=4))
        auto = c.add_dedup(name, clustered(rng, 30), RADIUS)
        assert auto.first_id == 160 or not auto.inserted.any()
        assert (auto.ids[auto.inserted] == 160 + np.arange(auto.n_inserted)).all()
        assert (auto.ids[~auto.inserted] == -1).all()
        with pytest.raises(ValueError, match="radius"):
            c.add_dedup(name, batch, True)
        with pytest.raises(BadRequest, match="radius"):
            c.add_dedup(name, batch[:2], 65, ids=[900, 901])


def test_async_client_gives_what_the_sync_client_gives(server):
    rng = np.random.default_rng(4)
    live, batch = clustered(rng, 20), clustered(rng, 40)

    async def run():
        async with AsyncClient(server.url) as c:
            await c.create_index("async", BITS)
            await c.add("async", live, ids=np.arange(20))
            return await c.add_dedup("async", batch, RADIUS, ids=np.arange(50, 90))
    got = asyncio.run(run())
    check((got.ids, got.inserted, got.lims, got.D, got.I),
          twin_of(live, np.arange(20), batch, np.arange(50, 90)))


def test_concurrent_clients_never_admit_two_items_within_the_radius(server):
    """Six clients, each on its own connections, send near-duplicates of the same centres at
    once (one item per request, and batches): no two live items end within the radius, every
    item answered inserted is live, and every rejected one was blocked by a live item.
    (Checked to fail when the search runs before the write lock is taken.)"""
    name = "race"
    with Client(server.url) as c:
        c.create_index(name, BITS, mode="single")
    rng = np.random.default_rng(5)
    pool = clustered(rng, 240, centers=4, flips=3)  # near-duplicates of 4 centres, shared
    per_client = [pool[t::6] for t in range(6)]
    answers: list = [None] * 6
    errors: list = []
    barrier = threading.Barrier(6)

    def worker(t):
        try:
            with Client(server.url, retry=Retry(attempts=0)) as c:
                barrier.wait()
                out = []
                for i in range(0, 40, 4 if t % 2 else 1):
                    size = 4 if t % 2 else 1
                    out.append(c.add_dedup(name, per_client[t][i:i + size], RADIUS))
                answers[t] = out
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    with Client(server.url) as c:
        info = c.index(name)
        ids, _, _ = c.sample(name, n=10_000)
        words = c.get(name, ids, format="words")
    d = naive.hamming_matrix(words, words, BITS)
    np.fill_diagonal(d, BITS + 1)
    assert (d > RADIUS).all()
    inserted = np.concatenate([r.ids[r.inserted] for rs in answers for r in rs])
    assert sorted(inserted.tolist()) == sorted(ids.tolist()) == sorted(set(ids.tolist()))
    assert info["size"] == len(ids) < 240
    blockers = np.concatenate([r.I for rs in answers for r in rs])
    assert np.isin(blockers, ids).all()  # nothing was deleted: every blocker stays live


@pytest.mark.slow  # a kill test: make test-long
def test_sigkill_keeps_exactly_what_was_acknowledged(bucketsearch_server_factory, tmp_path):
    """Dedup inserts acknowledged before a SIGKILL are all there after the restart, and nothing
    else: the answered items, with their codes."""
    srv = bucketsearch_server_factory(tmp_path / "crash")
    rng = np.random.default_rng(6)
    acknowledged: dict[int, bytes] = {}
    with Client(srv.url, retry=Retry(attempts=0)) as c:
        c.create_index("k", BITS, mode="single")
        for step in range(15):
            batch = clustered(rng, 8)
            got = c.add_dedup("k", batch, RADIUS)
            for i, row in zip(got.ids[got.inserted], to_packed(batch, BITS)[got.inserted]):
                acknowledged[int(i)] = row.tobytes()
    # one more sent in a thread, killed while it may be in flight: in or out, never half
    late = clustered(rng, 8)
    t = threading.Thread(target=lambda: _send_quietly(srv.url, late))
    t.start()
    srv.kill()
    t.join()
    srv.start()
    with Client(srv.url) as c:
        ids, packed, size = c.sample("k", n=10_000)
    got = {int(i): p.tobytes() for i, p in zip(ids, packed)}
    for i, code in acknowledged.items():
        assert got.get(i) == code
    # the late request is one WAL record: either none of its items is in, or exactly those
    # the twin inserts over the acknowledged items
    known = np.array(sorted(acknowledged), dtype=np.int64)
    known_words = pack_bits(np.unpackbits(np.frombuffer(b"".join(
        acknowledged[int(i)] for i in known), np.uint8).reshape(-1, n_bytes(BITS)), axis=1))
    t_ids, t_ins, _ = twin_of(known_words, known, late, None, first_id=int(known.max()) + 1)
    extra = {i: code for i, code in got.items() if i not in acknowledged}
    if extra:
        assert extra == {int(i): row.tobytes() for i, row in
                         zip(t_ids[t_ins], to_packed(late, BITS)[t_ins])}
    assert size == len(got)


def _send_quietly(url, batch):
    try:
        with Client(url, retry=Retry(attempts=0), timeout=10) as c:
            c.add_dedup("k", batch, RADIUS)
    except Exception:  # noqa: BLE001 -- the server is killed meanwhile
        pass
