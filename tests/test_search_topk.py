"""POST /v1/indexes/{name}/search with both ``k`` and ``max_distance``: the k nearest within the
radius, in modes single, mih and auto, JSON and octet-stream, against brute force; the stats
answer carries every field the engine records (candidates, scanned_from, plan); the OpenAPI
text documents the combination.

In process (FastAPI's TestClient, ``helpers.app_client``): nothing here needs a socket."""
from __future__ import annotations

import naive
import numpy as np
import pytest
import test_search_limits as search_limits
from helpers import add_codes, app_client, create_index

from bucketsearch.loadtest.wire import decode_binary_results as decode_results_binary
from bucketsearch.index.codes import to_hex, to_packed

BITS = 64
MODES = ("single", "mih", "auto")
RAW = {"content-type": "application/octet-stream"}


def clustered(seed: int, n: int, flips: int = 6) -> np.ndarray:
    """64-bit codes near five centers (test_search_limits.clustered)."""
    return search_limits.clustered(seed, n, BITS, centers=5, flips=flips)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One index per mode, 300 items merged into the main table plus 60 in the delta, 43 of
    the main ones deleted (tombstones)."""
    words = clustered(1, 360)
    ids = np.arange(360, dtype=np.int64)
    with app_client(tmp_path_factory.mktemp("topk") / "data", max_batch=1000,
                    max_results=100_000) as client:
        for mode in MODES:
            create_index(client, mode, BITS, mode=mode)
            add_codes(client, mode, ids[:300], words[:300], BITS)
            r = client.post(f"/v1/indexes/{mode}/merge")
            assert r.status_code == 200 and r.json()["main_size"] == 300, r.text
            add_codes(client, mode, ids[300:], words[300:], BITS)
            r = client.post(f"/v1/indexes/{mode}/items/delete",
                            json={"ids": list(range(0, 300, 7))})
            assert r.status_code == 200 and r.json()["deleted"] == 43, r.text
        live = np.setdiff1d(ids, np.arange(0, 300, 7))
        yield client, words[live], live


def expected_csr(xq, words, ids, k, R):
    D, I = naive.knn_within(xq, words, ids, BITS, k, R)
    keep = I >= 0
    return [(I[q][keep[q]].tolist(), D[q][keep[q]].tolist()) for q in range(len(xq))]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k, R", [(1, 0), (5, 3), (20, 8), (400, 12), (3, 64)])
def test_json_and_octet_stream_equal_brute_force(served, mode, k, R):
    client, words, ids = served
    xq = np.concatenate([words[:5], clustered(9, 4, flips=20)])
    want = expected_csr(xq, words, ids, k, R)
    url = f"/v1/indexes/{mode}/search"
    r = client.post(url, json={"codes": to_hex(xq, BITS), "k": k, "max_distance": R})
    assert r.status_code == 200, r.text
    assert [(res["ids"], res["distances"]) for res in r.json()["results"]] == want
    r = client.post(f"{url}?k={k}&max_distance={R}", content=to_packed(xq, BITS).tobytes(),
                    headers={**RAW, "accept": "application/octet-stream"})
    assert r.status_code == 200, r.text
    lims, D, I = decode_results_binary(r.content)
    assert [(I[a:b].tolist(), D[a:b].tolist()) for a, b in zip(lims[:-1], lims[1:])] == want


@pytest.mark.parametrize("mode", MODES)
def test_stats_carry_every_engine_field(served, mode):
    client, words, ids = served
    xq = words[:4]
    r = client.post(f"/v1/indexes/{mode}/search",
                    json={"codes": to_hex(xq, BITS), "k": 5, "max_distance": 4, "stats": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["stats"]) == len(xq) and len(out["scanned_from"]) == len(xq)
    for rows in out["stats"]:
        assert 1 <= len(rows) <= 5 and [row["radius"] for row in rows] == list(range(len(rows)))
        if mode == "mih":
            assert {"candidates", "unique_candidates"} <= set(rows[0])
        if mode == "single":
            assert "candidates" not in rows[0]
    assert (out["plan"] is not None) == (mode == "auto")
    if mode == "auto":  # one plan per group of queries with the same bound from the delta
        plans = out["plan"]["plans"] if out["plan"]["mode"] == "mixed" else [out["plan"]]
        assert all(p["k"] == 5 and p["radius"] <= 4 for p in plans), plans
    assert out["delta"]["items"] == 60


def test_bad_combinations_name_the_field(served):
    client, words, _ = served
    url = "/v1/indexes/single/search"
    code = to_hex(words[:1], BITS)
    r = client.post(url, json={"codes": code, "k": 3, "max_distance": 65})
    assert r.status_code == 400 and "max_distance must be in [0, bits=64], got 65" in \
        r.json()["detail"]
    r = client.post(url, json={"codes": code, "k": 0, "max_distance": 2})
    assert r.status_code == 400 and "k" in r.json()["detail"]
    r = client.post(url, json={"codes": code})
    assert r.status_code == 400 and "give max_distance (radius search), k (k-NN) or both" in \
        r.json()["detail"]
    r = client.post(url, content=to_packed(words[:1], BITS).tobytes(), headers=RAW)
    assert r.status_code == 400 and r.json()["detail"].startswith(
        "max_distance: give the query parameter max_distance")


def test_openapi_documents_top_k_within_a_radius(served):
    client, _, _ = served
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/v1/indexes/{name}/search"]["post"]
    assert "top-k within a radius" in op["description"]
    body = op["requestBody"]["content"]["application/json"]["schema"]
    props = body.get("properties") or spec["components"]["schemas"]["SearchRequest"][
        "properties"]
    assert "with k, top-k within the radius" in props["max_distance"]["description"]
    assert "the k nearest with d <= max_distance" in props["k"]["description"]
    params = {p["name"]: p for p in op["parameters"]}
    assert "with k: the k nearest within r" in params["max_distance"]["description"]
