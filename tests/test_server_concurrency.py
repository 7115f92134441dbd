"""Searches during inserts, deletes and merges (real server): every answer must equal brute
force over some prefix of the acknowledged writes, between the writes acknowledged before the
search was sent and those sent before its answer arrived."""
from __future__ import annotations

import threading

import naive
import numpy as np

from bucketsearch.index.codes import pack_bits, to_hex

BITS = 32
RADIUS = 2


def _ops(seed=11, n_ops=36, batch=40):
    """Deterministic write sequence: mostly inserts of clustered codes, some deletes."""
    rng = np.random.default_rng(seed)
    centers = rng.integers(0, 2, size=(4, BITS), dtype=np.uint8)
    ops, live, next_id = [], [], 0
    for j in range(n_ops):
        if j % 6 == 5 and live:
            victims = sorted(rng.choice(live, size=min(15, len(live)), replace=False).tolist())
            live = [i for i in live if i not in set(victims)]
            ops.append(("delete", victims, None))
        else:
            rows = centers[rng.integers(0, 4, size=batch)].copy()
            for row in rows:
                row[rng.choice(BITS, size=int(rng.integers(0, 4)), replace=False)] ^= 1
            ids = list(range(next_id, next_id + batch))
            next_id += batch
            live += ids
            ops.append(("add", ids, pack_bits(rows)))
    queries = pack_bits(centers)
    return ops, queries


def _expected(ops, queries):
    """Expected per-query id lists after each prefix of ops (index 0 = empty)."""
    items: dict[int, int] = {}
    out = [[[] for _ in queries]]
    for kind, ids, words in ops:
        if kind == "add":
            items.update(zip(ids, words[:, 0].tolist()))
        else:
            for i in ids:
                items.pop(i)
        keys = np.array(sorted(items), dtype=np.int64)
        xb = np.array([[items[i]] for i in keys], dtype=np.uint64).reshape(-1, 1)
        lims, _, I = naive.range_search(queries, xb, keys, BITS, RADIUS)
        out.append([I[lims[q]:lims[q + 1]].tolist() for q in range(len(queries))])
    return out


def test_searches_see_a_prefix_of_acknowledged_writes(bucketsearch_server_factory):
    ops, queries = _ops()
    expected = _expected(ops, queries)
    server = bucketsearch_server_factory(BUCKETSEARCH_MERGE_THRESHOLD=100,
                                         BUCKETSEARCH_WARMUP=0)
    with server.client() as c:
        assert c.post("/v1/indexes", json={"name": "cc", "bits": BITS}).status_code == 201
    progress = {"acked": 0, "sent": 0}
    stop = threading.Event()
    failures, checked = [], [0]
    codes = to_hex(queries, BITS)

    def reader():
        with server.client() as c:
            while not stop.is_set():
                lo = progress["acked"]
                r = c.post("/v1/indexes/cc/search", json={"codes": codes,
                                                          "max_distance": RADIUS})
                hi = progress["sent"]
                got = [res["ids"] for res in r.json()["results"]]
                if not any(got == expected[j] for j in range(lo, hi + 1)):
                    failures.append((lo, hi, got))
                checked[0] += 1

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    with server.client() as c:
        for j, (kind, ids, words) in enumerate(ops):
            progress["sent"] = j + 1
            if kind == "add":
                r = c.post("/v1/indexes/cc/items",
                           json={"ids": ids, "codes": to_hex(words, BITS)})
            else:
                r = c.post("/v1/indexes/cc/items/delete", json={"ids": ids})
            assert r.status_code == 200, r.text
            progress["acked"] = j + 1
            if j == len(ops) // 2:
                assert c.post("/v1/indexes/cc/merge").status_code == 200  # explicit merge
        stop.set()
        for t in readers:
            t.join()
        info = c.get("/v1/indexes/cc").json()
    assert not failures, failures[:3]
    assert checked[0] >= 5
    assert info["merges"] >= 2 and info["last_merge_error"] is None  # background + explicit
    with server.client() as c:
        r = c.post("/v1/indexes/cc/search", json={"codes": codes, "max_distance": RADIUS})
        assert [res["ids"] for res in r.json()["results"]] == expected[-1]
