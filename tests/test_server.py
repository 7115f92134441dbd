"""The HTTP API: results vs brute force, stats, errors, limits, metrics, cost model, evaluate,
read-only serving, corrupt files at start-up.

In process (FastAPI's TestClient on the app factory, see ``helpers.app_client``): nothing here
needs a socket. The wire (streamed and slow bodies, keep-alive, concurrency) is tested against
real uvicorn processes in test_http_guards.py, test_errors.py, test_server_concurrency.py,
test_server_crash.py and test_history.py; the auth matrix in test_auth.py."""
from __future__ import annotations

import naive
import numpy as np
import pytest
from helpers import ROOT, add_codes, app_client, create_index

from bucketsearch.index.codes import pack_bits, to_hex

BITS = 64


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with app_client(tmp_path_factory.mktemp("srv") / "data", max_body_bytes=200_000,
                    max_batch=1000, max_results=1000) as c:
        yield c


def _data(seed, n, bits=BITS, centers=6, flips=3):
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, size=(centers, bits), dtype=np.uint8)
    rows = c[rng.integers(0, centers, size=n)].copy()
    for row in rows:
        row[rng.choice(bits, size=int(rng.integers(0, flips + 1)), replace=False)] ^= 1
    return pack_bits(rows)


@pytest.fixture(scope="module")
def filled(client):
    """Index 'main' with 400 clustered codes: 300 by JSON, 100 raw with explicit ids."""
    words = _data(0, 400)
    assert client.post("/v1/indexes", json={"name": "main", "bits": BITS,
                                            "mode": "single"}).status_code == 201
    r = client.post("/v1/indexes/main/items",
                    json={"ids": list(range(300)), "codes": to_hex(words[:300], BITS)})
    assert r.status_code == 200 and r.json() == {"inserted": 300, "deleted": None,
                                                 "replaced": None, "first_id": None,
                                                 "size": 300}
    ids = np.arange(300, 400, dtype="<i8")
    body = ids.tobytes() + words[300:].astype(">u8").tobytes()  # 64-bit code = 8 bytes, BE
    r = client.post("/v1/indexes/main/items", content=body,
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    return words, np.arange(400)


def test_health_ready_and_docs(client):
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/readyz").status_code == 200
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/indexes/{name}/items"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/octet-stream"}


def test_radius_search_matches_brute_force_with_stats(client, filled):
    words, ids = filled
    xq = _data(1, 20)
    r = client.post("/v1/indexes/main/search",
                    json={"codes": to_hex(xq, BITS), "max_distance": 3, "stats": True})
    assert r.status_code == 200, r.text
    out = r.json()
    lims, D, I = naive.range_search(xq, words, ids, BITS, 3)
    for q, res in enumerate(out["results"]):
        assert res["ids"] == I[lims[q]:lims[q + 1]].tolist()
        assert res["distances"] == D[lims[q]:lims[q + 1]].tolist()
    assert len(out["stats"]) == 20
    for per_query in out["stats"]:
        assert [s["radius"] for s in per_query] == [0, 1, 2, 3]
        assert [s["probes"] for s in per_query] == [1, 64, 2016, 41664]
        for s in per_query:
            assert s["nonempty_buckets"] + s["empty_buckets"] == s["probes"]
            assert s["lookup_ns"] >= 0 and s["modeled_ns"] > 0
    assert "search;dur=" in r.headers["server-timing"] and out["took_ms"] > 0
    delta_size = client.get("/v1/indexes/main").json()["delta_size"]
    assert delta_size > 0 and out["delta"]["items"] == delta_size  # not merged yet
    assert out["delta"]["scan_ns"] > 0 and "delta;dur=" in r.headers["server-timing"]


def test_knn_matches_brute_force(client, filled):
    words, ids = filled
    xq = words[[0, 5, 77, 350]] ^ np.uint64(1 << 7)
    r = client.post("/v1/indexes/main/search", json={"codes": to_hex(xq, BITS), "k": 4})
    assert r.status_code == 200, r.text
    D, I = naive.knn(xq, words, ids, BITS, 4)
    for q, res in enumerate(r.json()["results"]):
        assert res["ids"] == I[q].tolist() and res["distances"] == D[q].tolist()
    assert "stats" not in r.json() or r.json()["stats"] is None


def test_raw_insert_with_first_id_and_padding_bits(client):
    assert client.post("/v1/indexes", json={"name": "raw60", "bits": 60}).status_code == 201
    codes = np.array([[0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC, 0xDE, 0xF0],
                      [0, 0, 0, 0, 0, 0, 0, 0x10]], dtype=np.uint8)
    r = client.post("/v1/indexes/raw60/items?first_id=1000", content=codes.tobytes(),
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200 and r.json()["inserted"] == 2
    r = client.post("/v1/indexes/raw60/search", json={"codes": ["123456789abcdef0"],
                                                      "max_distance": 0})
    assert r.json()["results"][0]["ids"] == [1000]
    bad = codes.copy()
    bad[0, -1] = 0xF1  # a padding bit set: the engine's ValueError becomes a 400
    r = client.post("/v1/indexes/raw60/items?first_id=5000", content=bad.tobytes(),
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 400 and "body" in r.json()["detail"] \
        and "padding" in r.json()["detail"]
    r = client.post("/v1/indexes/raw60/items", content=b"\x00" * 17,
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 400 and "multiple of 8 + 8" in r.json()["detail"]
    r = client.post("/v1/indexes/raw60/items", content=b"x", headers={"content-type": "text/csv"})
    assert r.status_code == 415


def test_delete_items_and_merge(client):
    assert client.post("/v1/indexes", json={"name": "del", "bits": 16}).status_code == 201
    r = client.post("/v1/indexes/del/items", json={"ids": [1, 2, 3],
                                                   "codes": ["0001", "0003", "ffff"]})
    assert r.json()["size"] == 3
    assert client.post("/v1/indexes/del/merge").json()["main_size"] == 3
    assert client.post("/v1/indexes/del/items/delete", json={"ids": [2, 99]}).json() == \
        {"inserted": None, "deleted": 1, "replaced": None, "first_id": None, "size": 2}
    info = client.get("/v1/indexes/del").json()
    assert info["tombstones"] == 1 and info["size"] == 2
    r = client.post("/v1/indexes/del/search", json={"codes": ["0001"], "max_distance": 1})
    assert r.json()["results"][0]["ids"] == [1]
    info = client.post("/v1/indexes/del/merge").json()
    assert info["tombstones"] == 0 and info["main_size"] == 2 and info["distinct_codes"] == 2
    assert info["bucket_size_histogram"] == [{"size": 1, "buckets": 2}]
    assert info["code_space_fraction"] == pytest.approx(2 / 2**16)


def test_index_lifecycle(client):
    assert client.post("/v1/indexes", json={"name": "tmp-1", "bits": 8}).status_code == 201
    assert "tmp-1" in [i["name"] for i in client.get("/v1/indexes").json()["indexes"]]
    r = client.post("/v1/indexes", json={"name": "tmp-1", "bits": 8})
    assert r.status_code == 409 and "already exists" in r.json()["detail"]
    assert client.delete("/v1/indexes/tmp-1").status_code == 204
    assert client.get("/v1/indexes/tmp-1").status_code == 404
    assert client.delete("/v1/indexes/tmp-1").status_code == 404


@pytest.mark.parametrize("payload, field", [
    ({"name": "a b", "bits": 8}, "name"),
    ({"name": "x" * 65, "bits": 8}, "name"),
    ({"name": "ok", "bits": 0}, "bits"),
    ({"name": "ok", "bits": 1025}, "bits"),
    ({"name": "ok", "bits": 8, "mode": "lsh"}, "mode"),
])
def test_create_rejects_bad_fields(client, payload, field):
    r = client.post("/v1/indexes", json=payload)
    assert r.status_code == 400 and r.json()["detail"].startswith(field + ":")
    assert field in {str(loc) for e in r.json()["errors"] for loc in e["loc"]}


def test_mih_mode_matches_brute_force(client):
    words = _data(7, 300, bits=128, flips=4)
    ids = np.arange(300)
    create_index(client, "mih128", 128, mode="mih", substrings=4)
    add_codes(client, "mih128", ids[:200], words[:200], 128)
    assert client.post("/v1/indexes/mih128/merge").json()["substrings"] == 4
    add_codes(client, "mih128", ids[200:], words[200:], 128)  # these stay in the delta
    xq = _data(8, 10, bits=128)
    r = client.post("/v1/indexes/mih128/search",
                    json={"codes": to_hex(xq, 128), "max_distance": 9, "stats": True})
    assert r.status_code == 200, r.text
    lims, D, I = naive.range_search(xq, words, ids, 128, 9)
    for q, res in enumerate(r.json()["results"]):
        assert res["ids"] == I[lims[q]:lims[q + 1]].tolist()
    assert len(r.json()["stats"][0]) == 10  # one record per radius step 0..9


def test_auto_mode_matches_brute_force(client):
    words = _data(9, 300)
    ids = np.arange(300)
    create_index(client, "auto64", BITS, mode="auto")
    add_codes(client, "auto64", ids, words, BITS)
    assert client.post("/v1/indexes/auto64/merge").json()["main_size"] == 300
    xq = _data(10, 8)
    r = client.post("/v1/indexes/auto64/search",
                    json={"codes": to_hex(xq, BITS), "max_distance": 6})  # over the guard
    assert r.status_code == 200, r.text  # the planner picks mih or the scan
    lims, D, I = naive.range_search(xq, words, ids, BITS, 6)
    for q, res in enumerate(r.json()["results"]):
        assert res["ids"] == I[lims[q]:lims[q + 1]].tolist()
    r = client.post("/v1/indexes/auto64/search", json={"codes": to_hex(xq, BITS), "k": 3})
    D, I = naive.knn(xq, words, ids, BITS, 3)
    assert [res["distances"] for res in r.json()["results"]] == D.tolist()


def test_search_errors_name_the_field(client, filled):
    url = "/v1/indexes/main/search"
    r = client.post(url, json={"codes": ["abc"], "max_distance": 1})
    assert r.status_code == 400 and "codes" in r.json()["detail"] \
        and "16" in r.json()["detail"]
    r = client.post(url, json={"codes": ["zz" * 8], "max_distance": 1})
    assert r.status_code == 400 and r.json()["errors"][0]["loc"][-2:] == ["codes", 0]
    r = client.post(url, json={"codes": ["00" * 8], "max_distance": 70})
    assert r.status_code == 400 and "max_distance must be in [0, bits=64]" in r.json()["detail"]
    r = client.post(url, json={"codes": ["00" * 8], "max_distance": 70, "k": 3})
    assert r.status_code == 400 and "max_distance must be in [0, bits=64]" in r.json()["detail"]
    r = client.post(url, json={"codes": ["00" * 8]})
    assert r.status_code == 400 and "give max_distance (radius search), k (k-NN) or both" \
        in r.json()["detail"]
    assert client.post("/v1/indexes/nope/search",
                       json={"codes": ["00"], "max_distance": 0}).status_code == 404
    assert client.post("/v1/indexes/b%20ad/search",
                       json={"codes": ["00"], "max_distance": 0}).status_code == 400


def test_probe_guard_reports_count_and_hint(client, filled):
    r = client.post("/v1/indexes/main/search", json={"codes": ["00" * 8], "max_distance": 6})
    assert r.status_code == 400
    body = r.json()
    assert body["probes"] == sum(__import__("math").comb(64, i) for i in range(7))
    assert body["limit"] == 10_000_000 and "mih" in body["detail"] and "auto" in body["hint"]


def test_result_limit(client, filled):
    words, _ = filled
    r = client.post("/v1/indexes/main/search",
                    json={"codes": to_hex(words[:200], BITS), "max_distance": 3})
    assert r.status_code == 400 and "max_results=1000" in r.json()["detail"]


def test_duplicate_ids(client, filled):
    r = client.post("/v1/indexes/main/items", json={"ids": [5], "codes": ["00" * 8]})
    assert r.status_code == 409 and "id 5 already exists" in r.json()["detail"]
    r = client.post("/v1/indexes/main/items", json={"ids": [900, 900],
                                                    "codes": ["00" * 8, "11" * 8]})
    assert r.status_code == 400 and "id 900 appears more than once" in r.json()["detail"]
    r = client.post("/v1/indexes/main/items", json={"ids": [901], "codes": []})
    assert r.status_code == 400 and "ids" in r.json()["detail"]
    r = client.post("/v1/indexes/main/items", json={"ids": [-1], "codes": ["00" * 8]})
    assert r.status_code == 400


def test_body_and_batch_limits(client, filled):
    r = client.post("/v1/indexes/main/items", content=b"\x00" * 200_001,
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 413 and "200000" in r.json()["detail"]

    def chunks():  # no Content-Length: the limit is enforced while the body streams in
        for _ in range(30):
            yield b"\x00" * 10_000

    r = client.post("/v1/indexes/main/items", content=chunks(),
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 413
    r = client.post("/v1/indexes/main/search?max_distance=0", content=chunks(),
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 413
    r = client.post("/v1/indexes/main/search", json={"codes": ["00" * 8] * 1001,
                                                     "max_distance": 0})
    assert r.status_code == 413 and "max_batch=1000" in r.json()["detail"]
    assert client.get("/healthz").status_code == 200


def test_cost_model_and_calibrate(client, filled):
    client.post("/v1/indexes/main/search", json={"codes": ["00" * 8], "max_distance": 2})
    cm = client.get("/v1/indexes/main/cost-model").json()
    assert cm["t0_ns"] > 0 and cm["t0_source"] == "observed searches"  # created after start
    by_r = {r["radius"]: r for r in cm["radii"]}
    assert by_r[2]["probes"] == 2016 and by_r[2]["paper_probes"] == 2016
    assert by_r[2]["cumulative_paper_probes"] == 2081
    assert by_r[2]["measured"]["count"] >= 1 and by_r[2]["measured"]["p50_ns"] > 0
    assert by_r[2]["modeled_ns"] == pytest.approx(cm["t0_ns"] * 2016)
    r = client.post("/v1/indexes/main/cost-model/calibrate",
                    json={"queries": 32, "max_distance": 3, "seed": 1})
    assert r.status_code == 200 and r.json()["t0_ns"] > 0
    assert r.json()["t0_source"] == "calibration"
    assert r.json()["calibration"]["max_distance"] == 3
    ext = r.json()["extended_model"]
    assert ext["samples"] > 0 and "probes" in ext["terms"] and ext["coef"]["probes"] >= 0


def test_metrics_exposition(client, filled):
    client.post("/v1/indexes/main/search", json={"codes": ["00" * 8], "max_distance": 1})
    text = client.get("/metrics").text
    assert 'bucketsearch_lookup_seconds_bucket{index="main",le=' in text
    assert 'bucketsearch_probes_total{index="main",radius="1"}' in text
    assert 'bucketsearch_empty_buckets_total{index="main",radius="1"}' in text
    assert 'bucketsearch_http_requests_total{method="POST",route="/v1/indexes/{name}/search"' \
        in text
    assert "bucketsearch_http_request_seconds_bucket" in text


def test_evaluate_matches_the_toolkit_in_process(client, filled):
    from bucketsearch.index.evaluation import relevance
    from bucketsearch.index.metrics import evaluate

    words, ids = filled
    labels = (ids % 3).tolist()
    xq = words[:10] ^ np.uint64(3)
    qlab = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    r = client.post("/v1/indexes/main/evaluate", json={
        "codes": to_hex(xq, BITS), "query_labels": qlab, "db_ids": ids.tolist(),
        "db_labels": labels, "radius_max": 3, "ks": [5, 10], "measure_queries": 4})
    assert r.status_code == 200, r.text
    out = r.json()
    ref = evaluate(words, xq, relevance.from_labels(np.array(qlab), np.array(labels)),
                   bits=BITS, radius_max=3, ks=(5, 10))
    assert out["radius"]["ramap"] == pytest.approx(ref["radius"]["ramap"])
    assert out["radius"]["precision_macro"] == pytest.approx(ref["radius"]["precision_macro"])
    assert len(out["radius"]["ramap_measured"]) == 4
    assert out["measured_cost"]["queries"] == 4
    r = client.post("/v1/indexes/main/evaluate", json={"codes": to_hex(xq, BITS)})
    assert r.status_code == 400 and "query_labels" in r.json()["detail"]


def test_evaluate_with_relevant_ids_and_request_guards(client, filled):
    words, ids = filled
    xq = words[:3]
    r = client.post("/v1/indexes/main/evaluate", json={
        "codes": to_hex(xq, BITS), "relevant_ids": [[0, 1], [1], [399]], "radius_max": 2,
        "ks": [5]})
    assert r.status_code == 200, r.text
    assert r.json()["n_queries"] == 3 and r.json()["n_db"] == 400
    r = client.post("/v1/indexes/main/evaluate", json={
        "codes": to_hex(xq, BITS), "relevant_ids": [[0], [1], [4000]]})
    assert r.status_code == 400 and "relevant_ids[2]: id 4000" in r.json()["detail"]
    r = client.post("/v1/indexes/main/cost-model/calibrate",
                    json={"queries": 100_000, "max_distance": 5})
    assert r.status_code == 400 and "max_request_probes" in r.json()["detail"]


def test_items_json_validation_error_points_into_the_body(client, filled):
    r = client.post("/v1/indexes/main/items", json={"ids": [1], "codes": ["00" * 8],
                                                    "extra": 1})
    assert r.status_code == 400 and r.json()["errors"][0]["loc"] == ["body", "extra"]
    r = client.post("/v1/indexes/main/items", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400


def test_read_only_mmap_server_shares_a_data_dir(tmp_path):
    """A read-only server with memory-mapped snapshots serves the writer's data directory,
    snapshot and log, and refuses writes (read-only servers beside a live writer process:
    test_datadir_lock.py)."""
    data = tmp_path / "ro"
    with app_client(data) as c:
        c.post("/v1/indexes", json={"name": "s", "bits": 16})
        c.post("/v1/indexes/s/items", json={"ids": [1, 2], "codes": ["0001", "00ff"]})
        c.post("/v1/indexes/s/merge")
        c.post("/v1/indexes/s/items", json={"ids": [3], "codes": ["0f00"]})  # WAL only
    with app_client(data, read_only=True, mmap=True) as c:
        r = c.post("/v1/indexes/s/search", json={"codes": ["0001", "0f00"], "max_distance": 0})
        assert [res["ids"] for res in r.json()["results"]] == [[1], [3]]
        r = c.post("/v1/indexes/s/items", json={"ids": [4], "codes": ["0000"]})
        assert r.status_code == 409 and "read-only" in r.json()["detail"]
        assert c.post("/v1/indexes", json={"name": "t", "bits": 8}).status_code == 409


def test_cli_serve_help():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "bucketsearch", "serve", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--data-dir" in out.stdout and "--workers" in out.stdout
    assert "bucketsearch serve --data-dir data --port 8000" in out.stdout


def test_a_corrupt_snapshot_falls_back_and_a_corrupt_log_isolates_its_index(tmp_path):
    """Trust issue: one corrupt snapshot made every index unavailable. Now a corrupt newest
    snapshot falls back to the previous generation plus the log (nothing lost), and a WAL
    damaged in the middle makes only its own index 'corrupt' while the others serve."""
    data = tmp_path / "corrupt"
    with app_client(data) as c:
        for name in ("c", "d", "e"):
            assert c.post("/v1/indexes", json={"name": name, "bits": 16}).status_code == 201
            c.post(f"/v1/indexes/{name}/items", json={"ids": [1, 2], "codes": ["0001", "00ff"]})
            c.post(f"/v1/indexes/{name}/merge")
            c.post(f"/v1/indexes/{name}/items", json={"ids": [3], "codes": ["0f0f"]})
        c.post("/v1/indexes/e/items", json={"ids": [4], "codes": ["0f0e"]})
    victim = sorted(data.glob("indexes/c.*/snap-*/*.npy"))[0]
    raw = bytearray(victim.read_bytes())
    raw[-1] ^= 0xFF
    victim.write_bytes(bytes(raw))
    segment = sorted(data.glob("indexes/e.*/wal-*.log"))[-1]
    raw = bytearray(segment.read_bytes())
    raw[8 + 8 + 3] ^= 0xFF  # the first of two records: damage followed by a valid record
    segment.write_bytes(bytes(raw))
    with app_client(data) as c:
        ready = c.get("/readyz").json()
        assert ready["index_states"]["c"]["state"] == "ready"
        assert ready["index_states"]["d"]["state"] == "ready"
        assert ready["index_states"]["e"]["state"] == "corrupt"
        assert "bucketsearch repair" in ready["index_states"]["e"]["reason"]
        assert str(tmp_path) not in str(ready)  # no file paths revealed
        for name in ("c", "d"):
            r = c.post(f"/v1/indexes/{name}/search", json={"codes": ["0001", "0f0f"],
                                                          "max_distance": 0})
            assert [x["ids"] for x in r.json()["results"]] == [[1], [3]]
        r = c.post("/v1/indexes/e/search", json={"codes": ["0001"], "max_distance": 0})
        assert r.status_code == 503 and "corrupt" in r.json()["detail"]
        listed = {i["name"]: i for i in c.get("/v1/indexes").json()["indexes"]}
        assert listed["e"]["state"] == "corrupt" and listed["c"]["size"] == 3
        assert c.delete("/v1/indexes/e").status_code == 204  # a corrupt index can go


RAW = {"content-type": "application/octet-stream"}


def test_octet_stream_search_and_binary_answer_equal_json(client, filled):
    """The three wire forms of one search give the same results, equal to brute force."""
    from bucketsearch.loadtest.wire import decode_binary_results as decode_results_binary

    words, ids = filled
    xq = np.concatenate([_data(2, 30), words[[3, 301]]])
    packed = xq.astype(">u8").tobytes()
    url = "/v1/indexes/main/search"
    lims, D, I = naive.range_search(xq, words, ids, BITS, 2)
    expected = [{"ids": I[a:b].tolist(), "distances": D[a:b].tolist()}
                for a, b in zip(lims[:-1], lims[1:])]
    as_json = client.post(url, json={"codes": to_hex(xq, BITS), "max_distance": 2})
    as_raw = client.post(url + "?max_distance=2", content=packed, headers=RAW)
    assert as_json.status_code == as_raw.status_code == 200, as_raw.text
    assert as_json.json()["results"] == as_raw.json()["results"] == expected
    binary = client.post(url + "?max_distance=2", content=packed,
                         headers={**RAW, "accept": "application/octet-stream"})
    assert binary.status_code == 200 and binary.headers["content-type"] == \
        "application/octet-stream" and float(binary.headers["x-took-ms"]) > 0
    got = decode_results_binary(binary.content)
    assert [g.tolist() for g in got] == [lims.tolist(), D.tolist(), I.tolist()]
    # k-NN and stats through the query string
    Dk, Ik = naive.knn(xq, words, ids, BITS, 3)
    r = client.post(url + "?k=3&stats=true", content=packed, headers=RAW)
    assert r.status_code == 200, r.text
    assert [res["ids"] for res in r.json()["results"]] == Ik.tolist()
    assert len(r.json()["stats"]) == len(xq)
    r = client.post(url, json={"codes": to_hex(xq, BITS), "k": 3},
                    headers={"accept": "application/octet-stream, application/json"})
    kl, kd, ki = decode_results_binary(r.content)
    assert ki.reshape(len(xq), 3).tolist() == Ik.tolist() and kd.tolist() == Dk.ravel().tolist()


def test_octet_stream_search_errors_name_the_field(client, filled):
    url = "/v1/indexes/main/search"
    code = b"\x00" * 8
    cases = [
        (url + "?max_distance=1", code + b"\x00", 400, "body: 9 bytes"),
        (url + "?max_distance=1", b"", 400, "body: 0 bytes"),
        (url, code, 400, "max_distance: give the query parameter max_distance"),
        (url + "?max_distance=65&k=2", code, 400, "max_distance must be in [0, bits=64]"),
        (url + "?max_distance=-1", code, 400, "max_distance"),
        (url + "?max_distance=1", code * 1001, 413, "max_batch=1000"),
    ]
    for path, body, status, text in cases:
        r = client.post(path, content=body, headers=RAW)
        assert r.status_code == status and text in r.text, (path, r.status_code, r.text)
    r = client.post(url + "?max_distance=1", json={"codes": ["00" * 8], "max_distance": 1})
    assert r.status_code == 400 and r.json()["detail"].startswith("max_distance: query param")
    r = client.post(url + "?max_distance=1", content=b"x", headers={"content-type": "text/csv"})
    assert r.status_code == 415
    r = client.post(url + "?max_distance=1&stats=true", content=code,
                    headers={**RAW, "accept": "application/octet-stream"})
    assert r.status_code == 400 and r.json()["detail"].startswith("stats:")
    assert client.post("/v1/indexes", json={"name": "raw12", "bits": 12}).status_code == 201
    r = client.post("/v1/indexes/raw12/search?max_distance=0", content=b"\x12\x3f", headers=RAW)
    assert r.status_code == 400 and "padding" in r.json()["detail"] \
        and r.json()["detail"].startswith("body:")
