"""Sharded indexes on Ray (issue 14, index/cluster/): answers identical to one unsharded index,
a shard actor killed during writes, and ``bucketsearch serve --shards 2`` end to end.

One local Ray for the module (``num_cpus=2``); the shard actors of the property test are made
once per (partitioning, mode) and emptied after every example."""
from __future__ import annotations

import dataclasses
import json
import threading
import time

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketsearch.index.cluster import partitioning, shardwrites
from bucketsearch.index.codes import n_words
from bucketsearch.index.storage import fsio
from bucketsearch.index.storage.live import LiveIndex
from helpers import ShardedServer, add_codes, create_index, make_app
from helpers import kill_left as _kill_left
from helpers import ray_processes as _ray_processes

pytestmark = pytest.mark.slow  # slow: make test-long

ray = pytest.importorskip("ray")
shards = pytest.importorskip("bucketsearch.index.cluster.shards")

BITS = 16  # small codes: every radius finds items, k-NN meets ties


@pytest.fixture(scope="module")
def sharded_pool(ray_local, tmp_path_factory):
    """One ShardedLive per (partitioning, mode), 2 shards each, opened in parallel."""
    root = tmp_path_factory.mktemp("pool")
    keys = [(p, m) for p in shards.PARTITIONINGS for m in ("single", "mih", "auto")]
    out, errors = {}, []

    def open_one(key):
        try:
            out[key] = shards.ShardedLive(root / f"{key[0]}-{key[1]}", BITS, key[1], None, 2,
                                          key[0], max_probes=10**7, merge_threshold=40)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=open_one, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    yield out
    for live in out.values():
        live.close()


def _codes(rng, n, clustered):
    if clustered:  # a few centres: skewed prefixes, many equal codes
        centres = rng.integers(0, 1 << BITS, size=3)
        base = centres[rng.integers(0, 3, size=n)]
        flips = rng.integers(0, 1 << BITS, size=n) & rng.integers(0, 1 << BITS, size=n) \
            & rng.integers(0, 1 << BITS, size=n)
        return (base ^ flips).astype(np.uint64).reshape(-1, 1)
    return rng.integers(0, 1 << BITS, size=(n, 1)).astype(np.uint64)


def _assert_same(a, b, what):
    for x, y, name in zip(a, b, ("lims/D", "D/I", "I")):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=f"{what}: {name}")


@pytest.mark.parametrize("partitioning", shards.PARTITIONINGS)
@pytest.mark.parametrize("mode", ["single", "mih", "auto"])
@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), clustered=st.booleans(), radius=st.integers(0, 4),
       k=st.integers(1, 12))
def test_sharded_answers_equal_one_index(sharded_pool, tmp_path_factory, partitioning, mode,
                                         seed, clustered, radius, k):
    """Writes (add, upsert that moves codes across prefixes, delete, merge) to a sharded index
    and to one LiveIndex; radius, k-NN and top-k-within-radius answers and get() are equal, and
    the merged per-radius probes are the partitioning's (code_prefix: exactly the single
    index's; id_hash: N times)."""
    live = sharded_pool[(partitioning, mode)]
    rng = np.random.default_rng(seed)
    ref = LiveIndex(tmp_path_factory.mktemp("ref"), BITS, mode, max_probes=10**7,
                    merge_threshold=40)
    try:
        n = int(rng.integers(1, 120))
        ids = rng.choice(10**6, size=n, replace=False).astype(np.int64)
        words = _codes(rng, n, clustered)
        half = n // 2
        for target in (live, ref):
            target.add(words[:half], ids[:half])
        if rng.random() < 0.5:
            live.merge()
            ref.merge()
        for target in (live, ref):
            target.add(words[half:], ids[half:])
        up = ids[rng.random(n) < 0.3]
        new = _codes(rng, len(up), clustered)
        assert live.upsert(new, up) == ref.upsert(new, up)
        gone = ids[rng.random(n) < 0.2]
        assert live.delete(gone) == ref.delete(gone)
        assert live.ntotal == ref.ntotal
        xq = np.concatenate([words[:5], _codes(rng, 5, clustered)])
        a = live.range_search(xq, radius, stats=True)
        b = ref.range_search(xq, radius, stats=True)
        _assert_same(a[:3], b[:3], "range")
        # what ran crosses the shards: the engine of each query, k, codes compared
        assert set(a[3].engine_names()) <= {"single", "mih", "scan"}
        np.testing.assert_array_equal(a[3].k, 0)
        if mode != "auto":
            assert set(a[3].engine_names()) == {mode}
        if mode == "single":
            factor = 2 if partitioning == "id_hash" else 1
            np.testing.assert_array_equal(a[3].probes.sum(axis=0),
                                          factor * b[3].probes.sum(axis=0))
            assert a[3].plan["partitioning"] == partitioning
        _assert_same(live.search(xq, k)[:2], ref.search(xq, k)[:2], "knn")
        _assert_same(live.search(xq, k, max_distance=radius, stats=True)[:2],
                     ref.search(xq, k, max_distance=radius)[:2], "knn within radius")
        probe_ids = np.concatenate([ids, [10**7]])
        _assert_same(live.get(probe_ids), ref.get(probe_ids), "get")
    finally:
        ref.close()
        live.delete(live.items()[0])  # empty again for the next example
        assert live.ntotal == 0


@pytest.mark.parametrize("partitioning", shards.PARTITIONINGS)
def test_engine_errors_cross_the_shards(sharded_pool, partitioning):
    """The engine's refusals raised in a shard reach the ingress as themselves (the search
    router answers them 400): probe guard, result cap, duplicate id."""
    from bucketsearch.index.base import ProbeLimitError, ResultLimitError
    from bucketsearch.index.storage.live import DuplicateIdError
    live = sharded_pool[(partitioning, "single")]
    words = np.arange(20, dtype=np.uint64).reshape(-1, 1)
    live.add(words, np.arange(20))
    try:
        with pytest.raises(ProbeLimitError):
            live.range_search(words[:1], 3, max_probes=2)
        with pytest.raises(ResultLimitError):
            live.range_search(words[:4], BITS, max_results=5)
        with pytest.raises(DuplicateIdError):
            live.add(words[:2] + np.uint64(1 << 15), [19, 100])
        assert live.ntotal == 20  # the refused add left nothing behind
    finally:
        live.delete(np.arange(200))


@pytest.mark.parametrize("partitioning", ["id_hash", "code_prefix"])
def test_ids_given_by_a_sharded_index_are_never_given_twice(sharded_pool, partitioning):
    """add_next: one more than the largest id any shard has seen, deleted ids included."""
    live = sharded_pool[(partitioning, "single")]
    words = np.random.default_rng(3).integers(0, 2**BITS, (8, 1), dtype=np.uint64)
    try:
        live.add(words[:3], [5, 50, 7])
        first, n = live.add_next(words[3:7])
        assert first > 50 and n == 4
        live.delete([first + 3])
        assert live.add_next(words[7:]) == (first + 4, 1)
        found, got = live.get(np.arange(first, first + 5))
        assert found.tolist() == [True, True, True, False, True]
        assert np.array_equal(got[[0, 1, 2, 4]], words[[3, 4, 5, 7]])
    finally:
        live.delete(np.arange(1000))


def test_code_prefix_split_roundtrip():
    """split_prefix / join_prefix are inverse, for one word and several."""
    rng = np.random.default_rng(1)
    for bits, p in ((16, 1), (64, 3), (100, 2), (256, 4)):
        words = rng.integers(0, 2**63, size=(50, n_words(bits)), dtype=np.uint64)
        if bits % 64:
            words[:, -1] &= np.uint64((1 << (bits % 64)) - 1)
        prefix, suffix = partitioning.split_prefix(words, bits, p)
        for s in np.unique(prefix):
            np.testing.assert_array_equal(
                partitioning.join_prefix(int(s), suffix[prefix == s], bits, p), words[prefix == s])
    with pytest.raises(ValueError, match="power-of-two"):
        partitioning.prefix_bits(3)


def test_killed_shard_keeps_acknowledged_writes(ray_local, tmp_path):
    """A shard actor killed (and restarted by Ray) while writes go on: every write that was
    acknowledged is present after recovery; requests meanwhile fail whole with
    ShardUnavailable (HTTP 503) or succeed; a search never returns a partial answer."""
    # auto: a radius-32 search is a scan (single mode refuses its 2^32 probes)
    live = shards.ShardedLive(tmp_path / "idx", 32, "auto", None, 2, "id_hash",
                              max_probes=10**7, merge_threshold=200)
    try:
        rng = np.random.default_rng(7)
        pid_before = live.refresh()[1]["pid"]
        acked, refused = [], 0
        searches = {"ok": 0, "503": 0}
        stop = threading.Event()

        def search_loop():
            while not stop.is_set():
                try:
                    lims = live.range_search(rng.integers(0, 2**32, (4, 1), dtype=np.uint64),
                                             32)[0]
                    # radius = bits: every live item of both shards, never one shard's share
                    assert lims[1] >= len(acked_before) if acked_before else True
                    searches["ok"] += 1
                except shards.ShardUnavailable:
                    searches["503"] += 1
                time.sleep(0.005)
        acked_before = []
        for batch in range(40):
            ids = np.arange(batch * 10, batch * 10 + 10)
            words = rng.integers(0, 2**32, (10, 1), dtype=np.uint64)
            if batch == 10:
                acked_before = list(np.concatenate(acked)) if acked else []
                searcher = threading.Thread(target=search_loop)
                searcher.start()
            if batch == 15:
                ray.kill(live.actors[1], no_restart=False)
            try:
                live.add(words, ids)
                acked.append(ids)
            except shards.ShardUnavailable:
                refused += 1
                time.sleep(0.3)
        stop.set()
        searcher.join()
        deadline = time.monotonic() + 60
        while True:
            try:
                live.refresh()
                break
            except shards.ShardUnavailable:
                assert time.monotonic() < deadline, "the shard did not come back"
                time.sleep(0.5)
        acked_ids = np.concatenate(acked)
        found, _ = live.get(acked_ids)
        assert found.all(), f"acknowledged ids lost: {acked_ids[~found][:10]}"
        assert live.refresh()[1]["pid"] != pid_before, "the killed shard was not restarted"
        lims, _, I = live.range_search(np.zeros((1, 1), np.uint64), 32)[:3]
        assert set(acked_acked := acked_ids.tolist()) <= set(I.tolist())
        assert len(I) == live.ntotal == len(set(I.tolist())), "an id twice or a lost shard"
        del acked_acked
    finally:
        live.close()


def test_replicas_converge_within_their_lag(ray_local, tmp_path):
    """Read replicas per shard (followers of the shard's log): after a write, each replica's
    applied position reaches its primary's within a few follow intervals, and from then on
    every reader (primary or replica, in turn) answers with the write."""
    live = shards.ShardedLive(tmp_path / "idx", 32, "single", None, 2, "id_hash",
                              max_probes=10**7, merge_threshold=10**6, replicas=1,
                              follow_interval_s=0.05)
    try:
        rng = np.random.default_rng(5)
        words = rng.integers(0, 2**32, (40, 1), dtype=np.uint64)
        live.add(words, np.arange(40))
        t = time.monotonic()
        primary = [s["applied_lsn"] for s in live.refresh(full=True)]
        while True:
            lags = live.replica_lag()
            if all(r["applied_lsn"] == primary[i] for i, rs in enumerate(lags) for r in rs):
                break
            assert time.monotonic() - t < 20, f"replicas did not converge: {lags} {primary}"
            time.sleep(0.05)
        assert all(r["lag_ms"] < 20_000 and r["follow_error"] is None
                   for rs in lags for r in rs)
        for _ in range(4):  # primary and replica in turn: the same answer
            lims, D, I = live.range_search(words[:5], 0)[:3]
            assert [I[lims[q]:lims[q + 1]].tolist()[:1] for q in range(5)] == \
                [[0], [1], [2], [3], [4]]
        info = live.info()
        assert all(len(d["replicas"]) == 1 for d in info["shard_detail"])
    finally:
        live.close()


def test_serve_shards_end_to_end(tmp_path):
    """create (both partitionings) / add / search / get / delete over HTTP against the CLI
    with --shards 2; the OpenAPI equals an unsharded server's; a shard's stats detail shows."""
    server = ShardedServer(tmp_path / "data", {"BUCKETSEARCH_CALIBRATION_QUERIES": "0"},
                           command="serve")
    server.start(timeout=240)
    try:
        with server.client() as c:
            rng = np.random.default_rng(3)
            words = rng.integers(0, 2**63, (300, 1), dtype=np.uint64)
            for part in ("id_hash", "code_prefix"):
                info = create_index(c, f"s-{part}", 64, mode="single", partitioning=part)
                assert info["partitioning"] == part and len(info["shard_detail"]) == 2
                add_codes(c, f"s-{part}", range(300), words, 64)
                r = c.post(f"/v1/indexes/s-{part}/items",  # an id another shard may hold
                           json={"ids": [299, 1000], "codes": ["00" * 8, "ff" * 8]})
                assert r.status_code == 409, r.text
                from bucketsearch.index.codes import to_hex
                r = c.post(f"/v1/indexes/s-{part}/search",
                           json={"codes": to_hex(words[:3], 64), "max_distance": 2,
                                 "stats": True})
                assert r.status_code == 200, r.text
                body = r.json()
                assert [res["ids"][:1] for res in body["results"]] == [[0], [1], [2]]
                assert body["plan"]["partitioning"] == part
                r = c.post(f"/v1/indexes/s-{part}/search",
                           json={"codes": to_hex(words[:2], 64), "k": 3})
                assert r.status_code == 200 and r.json()["results"][0]["ids"][0] == 0
                r = c.post(f"/v1/indexes/s-{part}/items/delete", json={"ids": [0, 1, 2]})
                assert (r.json()["deleted"], r.json()["size"]) == (3, 297)
                r = c.post(f"/v1/indexes/s-{part}/items/get", json={"ids": [0, 5]})
                assert r.json()["codes"][0] is None
                assert r.json()["codes"][1] == to_hex(words[5:6], 64)[0]
                assert c.get(f"/v1/indexes/s-{part}").json()["size"] == 297
                # a snapshot of a sharded index holds every shard's items; it restores
                snap = c.post(f"/v1/indexes/s-{part}/snapshots")
                assert snap.status_code == 201 and snap.json()["items"] == 297, snap.text
                tar = c.get(f"/v1/indexes/s-{part}/snapshots/{snap.json()['snapshot']}")
                r = c.post(f"/v1/indexes/r-{part}/restore", content=tar.content,
                           headers={"Content-Type": "application/x-tar"})
                assert r.status_code == 201 and r.json()["size"] == 297, r.text
                r = c.post(f"/v1/indexes/r-{part}/items/get", json={"ids": [0, 5]})
                assert r.json()["codes"] == [None, to_hex(words[5:6], 64)[0]]
                assert c.delete(f"/v1/indexes/r-{part}").status_code == 204
                r = c.get(f"/v1/indexes/s-{part}/sample", params={"n": 5, "seed": 1})
                assert r.status_code == 200 and len(set(r.json()["ids"]) - set(range(3, 300))) \
                    == 0 and len(r.json()["ids"]) == 5
                r = c.post(f"/v1/indexes/s-{part}/items", json={"codes": ["00" * 8]})
                # one more than the largest id ever written: 299, or 1000 if the refused
                # add wrote it on its shard before it was undone
                assert r.json()["first_id"] in (300, 1001), r.text
                for method, path, body in (
                        ("GET", "radius-profile", None), ("POST", "evaluate",
                                                          {"codes": ["00" * 8],
                                                           "relevant_ids": [[5]]}),
                        ("POST", "cost-model/calibrate", {"max_distance": 1})):
                    r = c.request(method, f"/v1/indexes/s-{part}/{path}", json=body)
                    assert r.status_code == 409 and "split over 2 shards" in r.text, r.text
                assert c.delete(f"/v1/indexes/s-{part}").status_code == 204
            r = c.post("/v1/indexes", json={"name": "bad", "bits": 8, "partitioning": "nope"})
            assert r.status_code == 400
            sharded_openapi = c.get("/openapi.json").json()
        plain_openapi = make_app(tmp_path / "plain").openapi()
        assert json.dumps(sharded_openapi, sort_keys=True) == \
            json.dumps(plain_openapi, sort_keys=True)
    finally:
        server.stop()
    _ = httpx  # the client library the helpers use


def _exact(c, name: str, written: dict, queries: np.ndarray, radius: int) -> None:
    """The server's radius search equals brute force over every code written, in
    (distance, id) order."""
    from bucketsearch.index.codes import to_hex
    r = c.post(f"/v1/indexes/{name}/search",
               json={"codes": to_hex(queries.reshape(-1, 1), 32), "max_distance": radius})
    assert r.status_code == 200, r.text
    ids = np.array(list(written), dtype=np.int64)
    codes = np.array(list(written.values()), dtype=np.uint64)
    for q, res in zip(queries, r.json()["results"]):
        d = np.array([bin(int(x)).count("1") for x in codes ^ np.uint64(q)])
        want = sorted((int(dd), int(i)) for dd, i in zip(d, ids) if dd <= radius)
        assert list(zip(res["distances"], res["ids"])) == want, name


def test_a_sharded_server_restarted_on_its_data_serves(tmp_path):
    """``serve --shards 2`` on one data directory: started, restarted three times (SIGTERM),
    killed (SIGKILL) and started again. Each time it serves exact answers (brute force over
    every code written so far, both partitionings) and its Ray processes (GCS, raylet) still
    run after start-up has finished (they were started by the start-up thread and killed when
    it ended: the server then exited a minute later, "Failed to connect to GCS"); after each
    SIGTERM none of the processes it started is left (two Ray agents were, every time)."""
    server = ShardedServer(tmp_path / "data", {"BUCKETSEARCH_CALIBRATION_QUERIES": "0"},
                           command="serve")
    rng = np.random.default_rng(11)
    centres = rng.integers(0, 2**32, size=4, dtype=np.uint64)
    written: dict = {"h": {}, "p": {}}
    try:
        for start in range(5):
            server.start(timeout=300)
            with server.client() as c:
                for name, part in (("h", "id_hash"), ("p", "code_prefix")):
                    if start == 0:
                        create_index(c, name, 32, mode="single", partitioning=part)
                    ids = np.arange(40 * start, 40 * start + 40)
                    flips = (rng.integers(0, 2**32, size=40, dtype=np.uint64)
                             & rng.integers(0, 2**32, size=40, dtype=np.uint64)
                             & rng.integers(0, 2**32, size=40, dtype=np.uint64))
                    words = centres[rng.integers(0, 4, size=40)] ^ flips
                    add_codes(c, name, ids, words.reshape(-1, 1), 32)
                    written[name].update(zip(ids.tolist(), words.tolist()))
                    queries = np.concatenate([words[:3], centres])
                    for radius in (0, 3, 6):
                        _exact(c, name, written[name], queries, radius)
            ray_procs = _ray_processes(server.pid)
            names = " ".join(ray_procs.values())
            assert "gcs_server" in names and "raylet" in names, \
                f"start {start}: Ray's processes died after start-up: {ray_procs}"
            if start == 3:
                server.kill()  # SIGKILL: nothing runs; the next start recovers
                _kill_left(ray_procs)  # Ray's agents, orphaned, would exit a minute later
                continue
            server.stop()  # uvicorn shuts down, then exits by the signal again (-15)
            time.sleep(1.0)
            assert not _kill_left(ray_procs), f"start {start}: left running after SIGTERM"
    finally:
        left = _ray_processes(server.pid) if server.proc and server.proc.poll() is None else {}
        server.stop()
        _kill_left(left)


def test_a_down_shard_answers_503_with_a_truthful_retry_after(ray_local, tmp_path):
    """A search, a get and a write that need a dead shard answer 503 with ``Retry-After``
    the shard module's own figure (5 s: a shard comes back in 1-3 s), not the 30 s of an
    index that failed to open."""
    from bucketsearch.index.codes import to_hex
    from helpers import app_client
    with app_client(tmp_path / "data", shards=2) as c:
        create_index(c, "r", 16, mode="single")
        add_codes(c, "r", range(10), np.arange(10, dtype=np.uint64).reshape(-1, 1), 16)
        live = c.app.state.registry.entries["r"].live
        ray.kill(live.actors[0], no_restart=True)  # down for good: every call fails
        for method, path, body in (
                ("POST", "search", {"codes": to_hex(np.zeros((1, 1), np.uint64), 16),
                                    "max_distance": 1}),
                ("POST", "items/get", {"ids": list(range(10))}),
                ("POST", "items", {"ids": [20, 21, 22, 23], "codes": ["0001"] * 4})):
            r = c.request(method, f"/v1/indexes/r/{path}", json=body)
            assert r.status_code == 503, (path, r.text)
            assert r.headers["Retry-After"] == str(shards.RETRY_AFTER_S) == "5", path
            assert "shard is unavailable" in r.json()["detail"], r.text


def test_cost_model_of_the_partitionings():
    """index/costmodel/shards.py on worked examples: code_prefix splits the ball exactly,
    id_hash multiplies it by N; the shards contacted; the cheaper partitioning."""
    from math import comb

    from bucketsearch.index.costmodel import shards as model
    assert model.ball(64, 3) == 43_745
    for n in (2, 4, 8, 64):
        for r in range(5):
            assert model.probes(64, r, n, "code_prefix") == model.ball(64, r)
            assert model.probes(64, r, n, "id_hash") == n * model.ball(64, r)
    assert model.code_prefix_split(64, 3, 2) == [
        {"d": 0, "shards": 1, "probes_each": model.ball(63, 3)},
        {"d": 1, "shards": 1, "probes_each": model.ball(63, 2)}]
    assert model.contacted(64, 2, 16, "code_prefix") == 1 + 4 + comb(4, 2)
    costs = model.ShardCosts(t0_ns=20.0, hop_ns=1e6, fanout_ns=4e5, t_item_ns=20.0)
    assert model.choose(64, 3, 8, costs, nq=1000)["choice"] == "code_prefix"
    # every code on one prefix and many items per query: id_hash spreads the items
    assert model.choose(64, 1, 8, costs, nq=1000, items=10_000, skew=1.0)["choice"] == "id_hash"
    assert model.choose(64, 3, 6, costs)["code_prefix_ns"] is None  # not a power of two
    even = model.id_hash_break_even_items(64, 3, 8, costs, skew=0.9, t_item_ns=20.0)
    at = model.choose(64, 3, 8, costs, nq=1, items=even * 1.01, skew=0.9)
    assert at["choice"] == "id_hash"
    assert model.fanout_crossover(64, 3, costs, "id_hash") == 3


# ---------------------------------------------- all-or-nothing writes (cluster/shardwrites)
A, B, C = 0x0001, 0x8001, 0x0002  # 16 bits, 2 shards: the top bit is the shard (A, C: 0; B: 1)


@ray.remote(num_cpus=0)
def _down():
    raise shards.ShardUnavailable("shard 0 is down (injected)")


class _ShardDown:
    """An actor handle whose shard is down for writes: the result of ``write`` raises
    ShardUnavailable (as `_get` does for a dead or restarting actor), after the other shards'
    parts were sent; every other method is the real one."""

    def __init__(self, actor):
        self.actor = actor

    def __getattr__(self, name):
        return getattr(self.actor, name)

    @property
    def write(self):
        class Down:
            @staticmethod
            def remote(*args):
                return _down.remote()
        return Down


def _open_prefix(folder):
    return shards.ShardedLive(folder, BITS, "single", None, 2, "code_prefix",
                              max_probes=10**6, merge_threshold=1000)


def _live_copies(live, ids):
    """How many times each id is answered by a search that reaches every item."""
    I = live.range_search(np.zeros((1, 1), np.uint64), BITS)[2].tolist()
    return [I.count(i) for i in ids]


def _abandon(live):
    """The ingress "died": its actors go as a dead process leaves them (nothing closed)."""
    for actor in live.actors:
        ray.kill(actor, no_restart=True)


def test_a_move_whose_old_shard_is_down_is_undone_before_anything_is_read(ray_local, tmp_path):
    """A code_prefix upsert moving id 5 from shard 0 to shard 1 while shard 0 is down: 503;
    shard 1's part (id 5 with its new code) is undone at once, shard 0's cannot be: the
    write stays pending, and every read and write answers 503 until shard 0 is back. Then
    the first read finishes the undo: id 5 live once, with its old code; no intent left."""
    live = _open_prefix(tmp_path / "idx")
    try:
        live.add(np.array([[A], [C]], np.uint64), np.array([5, 6]))
        real = live.actors[0]
        live.actors[0] = _ShardDown(real)
        with pytest.raises(shards.ShardUnavailable, match="injected"):
            live.upsert(np.array([[B]], np.uint64), np.array([5]))
        assert shardwrites.path_of(live.folder).exists()
        for read in (lambda: _live_copies(live, [5]), lambda: live.get([5]),
                     lambda: live.upsert(np.array([[B]], np.uint64), np.array([6]))):
            with pytest.raises(shards.ShardUnavailable, match="injected"):
                read()
        live.actors[0] = real  # back
        assert _live_copies(live, [5, 6]) == [1, 1]
        assert not shardwrites.path_of(live.folder).exists()
        found, words = live.get(np.array([5, 6]))
        assert found.all() and words[:, 0].tolist() == [A, C]
        assert live.upsert(np.array([[B]], np.uint64), np.array([5])) == (0, 1)  # it moves
        assert _live_copies(live, [5, 6]) == [1, 1] and live.get([5])[1][0, 0] == B
    finally:
        live.close()


def test_replicas_never_serve_an_undone_write(ray_local, tmp_path):
    """With a read replica per shard: an add whose shard 0 is down is undone on shard 1, and
    the undo waits until shard 1's replica has applied it too; once shard 0 is back, every
    reader in turn (primaries and replicas) answers without the write."""
    live = shards.ShardedLive(tmp_path / "idx", BITS, "single", None, 2, "code_prefix",
                              max_probes=10**6, merge_threshold=10**6, replicas=1,
                              follow_interval_s=0.05)
    try:
        live.add(np.array([[A], [B]], np.uint64), np.array([1, 2]))
        real = live.actors[0]
        live.actors[0] = _ShardDown(real)
        with pytest.raises(shards.ShardUnavailable, match="injected"):
            live.add(np.array([[C], [B ^ 2]], np.uint64), np.array([3, 4]))  # both shards
        live.actors[0] = real
        for _ in range(4):  # primary, replica, primary, replica
            assert sorted(_live_copies(live, [1, 2, 3, 4])) == [0, 0, 1, 1]
            assert _live_copies(live, [3, 4]) == [0, 0]
        primary = live.actors[1].position.remote()
        assert [r["applied"] for r in live.replica_lag()[1]] == [ray.get(primary)]
    finally:
        live.close()


@pytest.mark.parametrize("crash", [True, False], ids=["crash", "error"])
def test_a_fault_at_every_storage_call_of_the_ingress(ray_local, tmp_path, crash):
    """The ingress fails at each of its storage calls of a moving upsert in turn (the intent's
    temp write, fsync, rename, directory fsync; its removal): ``crash``, the process "dies"
    there and the index is reopened; else the call raises ENOSPC and the write answers it.
    Either way id 5 is then live exactly once, with its old code unless the write was
    committed (its intent removed), id 6 untouched, and no intent left."""
    points = []
    live = _open_prefix(tmp_path / "idx")
    for at in range(1, 20):
        live.add(np.array([[A], [C]], np.uint64), np.array([5, 6]))
        plan = fsio.FaultPlan(at=at, crash=crash)
        answer = None
        try:
            with fsio.inject(plan):
                live.upsert(np.array([[B]], np.uint64), np.array([5]))
            answer = "ok"
        except fsio.SimulatedCrash:
            _abandon(live)
            live = _open_prefix(tmp_path / "idx")
        except OSError as exc:
            assert "injected fault" in str(exc)
            answer = "error"
        try:
            assert not shardwrites.path_of(live.folder).exists()
            assert _live_copies(live, [5, 6]) == [1, 1], f"fault at {plan.fired}"
            found, words = live.get(np.array([5, 6]))
            # a crash after the intent's removal (calls 8, 9: its directory fsync): committed
            committed = answer == "ok" or (answer is None and at >= 8)
            assert found.all() and words[1, 0] == C
            assert words[0, 0] == (B if committed else A), f"fault at {plan.fired}"
        finally:
            live.delete([5, 6])
        if not plan.fired:
            break
        points.append(plan.fired[0][0])
    live.close()
    assert points == ["open", "write", "fsync", "rename", "open", "fsync",  # the intent
                      "unlink", "open", "fsync"], points  # the commit


def test_an_unreadable_intent_names_the_file(ray_local, tmp_path):
    """A damaged ``write.pending`` keeps the index closed with an error naming the file and
    the field (the registry lists the index as unavailable with that reason)."""
    folder = tmp_path / "idx"
    _open_prefix(folder).close()
    good = shardwrites.Intent("upsert", 1, (0, 1), np.array([5, 6]), np.array([True, False]),
                              np.array([[A]], np.uint64))
    assert shardwrites.decode(shardwrites.encode(good), "f", 2, BITS).ids.tolist() == [5, 6]
    for data, match in (
            (b"PK\x03\x04 torn", "unreadable pending sharded write"),
            (shardwrites.encode(good)[:-10], "unreadable pending sharded write"),
            (shardwrites.encode(dataclasses.replace(good, op="merge")), "op must be one of"),
            (shardwrites.encode(dataclasses.replace(good, shards=(0, 7))), r"shards must be a list"),
            (shardwrites.encode(dataclasses.replace(good, found=np.array([True]))), "found must be 2"),
            (shardwrites.encode(dataclasses.replace(good, words=np.zeros((2, 1), np.uint64))),
             "words must be 1 codes of 16 bits")):
        shardwrites.path_of(folder).write_bytes(data)
        with pytest.raises(ValueError, match=match) as info:
            _open_prefix(folder)
        assert shardwrites.INTENT_FILE in str(info.value)


# ----------------------------------------------- a shard killed at every step of a sharded write
def _first_read(live, deadline_s: float = 120.0):
    """The ingress's answer to the first read that is not refused (503 while a shard is down
    or a failed write is being undone): ``{id: code}`` of a search reaching every item, and
    the pending intent seen at that moment (must be none)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            lims, _, I = live.range_search(np.zeros((1, 1), np.uint64), BITS)[:3]
            found, words = live.get(I)
            assert found.all()
            return dict(zip(I.tolist(), words[:, 0].tolist()))
        except shards.ShardUnavailable:
            assert time.monotonic() < deadline, "the shards did not come back"
            time.sleep(0.2)


def _per_shard(live) -> dict[int, dict]:
    """Each shard's own items ``{id: full code}``, read from its actor (not through the
    ingress)."""
    out = {}
    for s, (ids, words) in enumerate(ray.get([a.items.remote() for a in live.actors])):
        if live.partitioning == "code_prefix":
            words = partitioning.join_prefix(s, words, BITS, live.p)
        out[s] = dict(zip(np.asarray(ids).tolist(), np.asarray(words)[:, 0].tolist()))
    return out


def _check_agrees(live, model: dict, what: str) -> None:
    """The first read served after the write equals ``model`` (the acknowledged state), and
    so does every shard: each id on its owner shard only, with its code."""
    assert _first_read(live) == model, what
    assert not shardwrites.path_of(live.folder).exists(), what
    held = _per_shard(live)
    for s, items in held.items():
        owner = (partitioning.id_shard(np.array(list(items), np.int64), live.n)
                 if live.partitioning == "id_hash" else
                 np.array([code >> (BITS - live.p) for code in items.values()]))
        assert (np.asarray(owner) == s).all(), f"{what}: an id on a shard not its own"
    merged = {i: c for items in held.values() for i, c in items.items()}
    assert sum(map(len, held.values())) == len(merged) and merged == model, \
        f"{what}: shards {held} vs acknowledged {model}"


def _pid(actor, deadline_s: float = 120.0) -> int:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return ray.get(actor.ping.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                ray.exceptions.GetTimeoutError):
            assert time.monotonic() < deadline, "the shard did not come back"
            time.sleep(0.3)


def _a_write(live, model: dict, op: str, rng, next_id: int):
    """``(apply, call)`` of one write spanning both shards: ``call()`` sends it to the index,
    ``apply(model)`` is what it does when acknowledged."""
    top = np.uint64(1 << (BITS - 1))

    def codes(n):  # half on each code_prefix shard
        c = rng.integers(0, 1 << (BITS - 1), size=(n, 1)).astype(np.uint64)
        c[::2] |= top
        return c
    if op == "add":  # ids on both id_hash shards too
        ids = np.arange(next_id, next_id + 6, dtype=np.int64)
        words = codes(6)
        return (lambda m: m.update(zip(ids.tolist(), words[:, 0].tolist())),
                lambda: live.add(words, ids))
    live_ids = np.array(sorted(model), dtype=np.int64)
    if op == "upsert":  # two replaced with a code of the other prefix (moves), two new
        old = live_ids[:2]
        ids = np.concatenate([old, [next_id, next_id + 1]]).astype(np.int64)
        words = codes(4)
        words[:2, 0] = [np.uint64(model[int(i)]) ^ top for i in old]
        return (lambda m: m.update(zip(ids.tolist(), words[:, 0].tolist())),
                lambda: live.upsert(words, ids))
    if live.partitioning == "id_hash":
        home = partitioning.id_shard(live_ids, 2)
    else:
        home = np.array([model[int(i)] >> (BITS - 1) for i in live_ids])
    gone = np.array([live_ids[home == 0][0], live_ids[home == 1][-1]])  # one on each shard
    return (lambda m: [m.pop(int(i)) for i in gone], lambda: live.delete(gone))


@pytest.mark.parametrize("partitioning_,both_killed", [("id_hash", "add"),
                                                       ("code_prefix", "upsert")])
def test_a_kill_at_every_step_of_a_sharded_write(ray_local, tmp_path, partitioning_,
                                                 both_killed):
    """Shard 1's process is SIGKILLed at each step of its part of a write in turn (each
    storage call of its log append and of its commit position, then the reply: before its
    record, after its write but before its fsync, fsynced but not answered), for an add, an
    upsert that moves ids between code_prefix shards, and a delete, each spanning both
    shards; then shard 0 at its first step and shard 1 at each step of the undo of its part
    (``both_killed``: the write). After each, the first read the index serves, and every
    shard read directly, hold exactly the writes acknowledged: a write answered 503 is absent
    everywhere (the issue's case: a shard that fsynced its part and died before answering),
    one answered 200 present everywhere. About 2-3 minutes each: a kill costs a Ray restart
    of the shard."""
    live = shards.ShardedLive(tmp_path / "idx", BITS, "single", None, 2, partitioning_,
                              max_probes=10**6, merge_threshold=10**6)
    rng = np.random.default_rng(31)
    model: dict = {}
    next_id = 0

    def run(op: str, arms: dict) -> bool:
        """One write with ``arms`` (shard: the step it is killed at); checks the index after
        it. Returns whether shard 1 was killed (False: its steps are exhausted)."""
        nonlocal next_id
        apply, call = _a_write(live, model, op, rng, next_id)
        next_id += 6
        pids = {s: _pid(live.actors[s]) for s in arms}
        for s, at in arms.items():
            ray.get(live.actors[s].inject_kill.remote(at))
        try:
            call()
            answer = "ok"
        except shards.ShardUnavailable:
            answer = "error"
        killed = {s for s in arms if _pid(live.actors[s]) != pids[s]}
        for s in set(arms) - killed:
            ray.get(live.actors[s].clear_fault.remote())
        if answer == "ok":
            apply(model)
        _check_agrees(live, model, f"{op} with kills {arms} (killed {killed}): {answer}")
        assert answer == ("error" if killed else "ok"), f"{op} {arms}: {answer}"
        return 1 in killed

    try:
        run("add", {})
        steps = {}  # op: shard 1's steps in its part of the write
        for op in ("add", "upsert", "delete"):
            at = 1
            while run(op, {1: at}):
                at += 1
            steps[op] = at - 1
        # shard 0 dies before its record: shard 1's part is undone; killed at each undo step
        at = steps[both_killed] + 1
        while run(both_killed, {0: 1, 1: at}):
            at += 1
        assert min(steps.values()) >= 4 and at - steps[both_killed] >= 4, (steps, at)
    finally:
        live.close()
