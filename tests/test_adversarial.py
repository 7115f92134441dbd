"""Adversarial inputs, found by probing every route: each answer must be a 4xx naming the field,
the value and what is allowed, never a 5xx or a library's message (in process, TestClient);
writes racing a DELETE are refused, not failed (a real server, uvicorn on 127.0.0.1, a temp
data dir: concurrent connections)."""
from __future__ import annotations

import threading

import httpx
import numpy as np
from helpers import add_codes, app_client, create_index


def test_evaluate_ragged_or_empty_multihot_labels_name_the_field(tmp_path):
    """Multi-hot label rows of different lengths, or of no column at all, are a 400 naming the
    field and the row (was numpy's "setting an array element with a sequence..." and
    "query labels must hold integers, got dtype float64")."""
    with app_client(tmp_path / "data") as client:
        create_index(client, "ev", 16)
        add_codes(client, "ev", [1, 2], np.array([[0], [3]], dtype=np.uint64), 16)
        base = {"codes": ["0000"], "db_ids": [1, 2]}
        r = client.post("/v1/indexes/ev/evaluate",
                        json={**base, "query_labels": [[1, 0]], "db_labels": [[1, 0], [0, 1, 1]]})
        assert r.status_code == 400, r.text
        assert r.json()["detail"].startswith("db_labels[1]:"), r.text
        assert "3 columns" in r.json()["detail"] and "2" in r.json()["detail"], r.text
        r = client.post("/v1/indexes/ev/evaluate",
                        json={**base, "query_labels": [[]], "db_labels": [[], []]})
        assert r.status_code == 400, r.text
        assert r.json()["detail"].startswith("query_labels[0]:"), r.text
        assert "at least one column" in r.json()["detail"], r.text
        # the well-formed request still works
        r = client.post("/v1/indexes/ev/evaluate",
                        json={**base, "query_labels": [[1, 0]], "db_labels": [[1, 0], [0, 1]]})
        assert r.status_code == 200, r.text


def test_malformed_json_body_names_the_body(tmp_path):
    """A body that is not JSON, on a route whose body FastAPI parses, names ``body`` and where
    the JSON broke (was ``"[0]: JSON decode error"``: a field ``[0]`` that does not exist)."""
    with app_client(tmp_path / "data") as client:
        r = client.post("/v1/indexes", content=b"not json",
                        headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        detail = r.json()["detail"]
        assert detail.startswith("body: "), detail
        assert "character 0" in detail and "JSON" in detail, detail


def test_writes_racing_a_delete_answer_404_not_a_storage_error(bucketsearch_server_factory):
    """Writes (snapshot, merge, insert, upsert, mode change) on an index that a concurrent
    DELETE removes answer 404 (the index is gone) or 409, never 503 "storage error": nothing
    is wrong with the disk, and a client retrying the 503 would only find the index gone. And
    a deleted index stays deleted: a mode change that was still writing its snapshot once
    recreated the folder the DELETE had renamed away (an index back after a restart)."""
    server = bucketsearch_server_factory()
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**63, size=(2_000, 1), dtype=np.int64).astype(np.uint64)
    seen: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def call(barrier, method, path, **kwargs):
        with httpx.Client(base_url=server.url, timeout=60.0) as c:
            barrier.wait()
            r = c.request(method, path, **kwargs)
            with lock:
                seen.append((f"{method} {path}", r.status_code, r.text[:200]))

    with server.client() as client:
        for round_ in range(15):
            create_index(client, "race", 64, mode="single")
            add_codes(client, "race", np.arange(len(words)), words, 64)
            ops = [("POST", "/v1/indexes/race/snapshots", {}),
                   ("POST", "/v1/indexes/race/snapshots", {}),
                   ("POST", "/v1/indexes/race/merge", {}),
                   ("PATCH", "/v1/indexes/race", {"json": {"mode": "mih"}}),
                   ("POST", "/v1/indexes/race/items",
                    {"json": {"codes": ["00000000000000ff"] * 10}}),
                   ("POST", "/v1/indexes/race/items/upsert",
                    {"json": {"ids": [1], "codes": ["00000000000000fe"]}}),
                   ("DELETE", "/v1/indexes/race", {})]
            barrier = threading.Barrier(len(ops))
            threads = [threading.Thread(target=call, args=(barrier, m, p), kwargs=kw)
                       for m, p, kw in ops]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if client.get("/v1/indexes/race").status_code == 200:  # the DELETE lost the race
                assert client.delete("/v1/indexes/race").status_code == 204
            left = [p.name for p in server.data_dir.rglob("race.*") if p.is_dir()]
            assert not left, f"round {round_}: the deleted index's folder is back: {left}"
    bad = [s for s in seen if s[1] >= 500]
    assert not bad, bad
    assert {status for _, status, _ in seen} <= {200, 201, 204, 404, 409}, seen
