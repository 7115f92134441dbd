"""Sharded indexes on Ray (issue 14, app/shards.py): answers identical to one unsharded index,
a shard actor killed during writes, and ``bucketsearch serve --shards 2`` end to end.

One local Ray for the module (``num_cpus=2``); the shard actors of the property test are made
once per (partitioning, mode) and emptied after every example."""
from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketsearch.app import partitioning
from bucketsearch.index.codes import n_words
from bucketsearch.index.storage import fsio
from bucketsearch.index.storage.live import LiveIndex
from helpers import ServerProcess, add_codes, create_index, make_app

ray = pytest.importorskip("ray")
shards = pytest.importorskip("bucketsearch.app.shards")

BITS = 16  # small codes: every radius finds items, k-NN meets ties


@pytest.fixture(scope="module")
def ray_local():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    if started:
        ray.shutdown()


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


class ShardedServer(ServerProcess):
    """``bucketsearch serve --shards 2`` (the CLI, a real process with its own local Ray)."""

    def argv(self):
        return [*super().argv(), "--shards", "2"]


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


# ------------------------------------------------------------- code_prefix moves under faults
A, B, C = 0x0001, 0x8001, 0x0002  # 16 bits, 2 shards: the top bit is the shard (A, C: 0; B: 1)


class _ShardDownAtDelete:
    """An actor handle whose ``delete`` finds the shard down (the call raises ShardUnavailable,
    as `_get` does for a dead or restarting actor); every other method is the real one."""

    def __init__(self, actor):
        self.actor = actor

    def __getattr__(self, name):
        return getattr(self.actor, name)

    @property
    def delete(self):
        class Down:
            @staticmethod
            def remote(*args):
                raise shards.ShardUnavailable("shard 0 is down (injected)")
        return Down


def _open_prefix(folder):
    return shards.ShardedLive(folder, BITS, "single", None, 2, "code_prefix",
                              max_probes=10**6, merge_threshold=1000)


def _live_copies(live, ids):
    """How many times each id is answered by a search that reaches every item."""
    I = live.range_search(np.zeros((1, 1), np.uint64), BITS)[2].tolist()
    return [I.count(i) for i in ids]


def test_a_move_left_half_way_is_finished_before_the_next_upsert(ray_local, tmp_path):
    """A code_prefix upsert moving id 5 from shard 0 to shard 1 fails after the new shard
    wrote (the old shard is down for the delete): 503, the pending record stays and id 5 is
    live twice. The next upsert (moving another id, which writes a new record) finishes the
    pending move first: no record is overwritten, every id is live once with its last code."""
    live = _open_prefix(tmp_path / "idx")
    try:
        live.add(np.array([[A], [C]], np.uint64), np.array([5, 6]))
        real = live.actors[0]
        live.actors[0] = _ShardDownAtDelete(real)
        with pytest.raises(shards.ShardUnavailable, match="injected"):
            live.upsert(np.array([[B]], np.uint64), np.array([5]))
        live.actors[0] = real
        assert (live.folder / shards.MOVES_FILE).exists()
        assert _live_copies(live, [5, 6]) == [2, 1]  # the half-done move
        assert live.upsert(np.array([[B]], np.uint64), np.array([6])) == (0, 1)
        assert not (live.folder / shards.MOVES_FILE).exists()
        assert _live_copies(live, [5, 6]) == [1, 1]
        found, words = live.get(np.array([5, 6]))
        assert found.all() and words[:, 0].tolist() == [B, B]
    finally:
        live.close()


def test_a_crash_at_every_storage_call_of_a_move_then_reopen(ray_local, tmp_path):
    """The ingress "dies" (SimulatedCrash) at each storage call of a moving upsert in turn (the
    pending record's temp write, fsync, rename, directory fsync, and its removal at the end);
    reopened, the index holds id 5 exactly once, with its old or its new code (the upsert was
    not acknowledged), id 6 untouched, and no pending record."""
    points = []
    for at in range(1, 20):
        folder = tmp_path / f"idx{at}"
        live = _open_prefix(folder)
        live.add(np.array([[A], [C]], np.uint64), np.array([5, 6]))
        plan = fsio.FaultPlan(at=at, crash=True)
        try:
            with fsio.inject(plan):
                live.upsert(np.array([[B]], np.uint64), np.array([5]))
        except fsio.SimulatedCrash:
            pass
        if not plan.fired:
            live.close()
            break
        points.append(plan.fired[0][0])
        for actor in live.actors:  # abandoned as a dead process leaves it: nothing closed
            ray.kill(actor, no_restart=True)
        live = _open_prefix(folder)
        try:
            assert not (folder / shards.MOVES_FILE).exists()
            assert _live_copies(live, [5, 6]) == [1, 1], f"crash at {plan.fired[0]}"
            found, words = live.get(np.array([5, 6]))
            assert found.all() and words[0, 0] in (A, B) and words[1, 0] == C
        finally:
            live.close()
    assert points[:3] == ["open", "write", "fsync"] and "rename" in points \
        and points[-1] == "unlink", points


def test_an_unreadable_pending_move_record_names_the_file(ray_local, tmp_path):
    """A damaged ``moves.pending.json`` keeps the index closed with an error naming the file
    and what was expected (the registry lists the index as unavailable with that reason)."""
    folder = tmp_path / "idx"
    _open_prefix(folder).close()
    for text, match in (('{"ids": [5]', "unreadable pending shard moves"),
                        ('{"ids": [5], "old": [0], "new": [7]}', r"'new' must be a list of 1"),
                        ('{"ids": [5, 6], "old": [0], "new": [1]}', r"'old' must be a list"),
                        ('[1, 2]', "unreadable pending shard moves")):
        (folder / shards.MOVES_FILE).write_text(text)
        with pytest.raises(ValueError, match=match) as info:
            _open_prefix(folder)
        assert shards.MOVES_FILE in str(info.value)
