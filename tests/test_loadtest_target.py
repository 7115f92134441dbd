"""Issue 18 item 3: the load tester measures the index it targets, and says so when it cannot.

* ``GET /v1/indexes/{name}/sample`` (in-process, TestClient): a uniform sample of the live items
  (main index + delta - tombstones), hex JSON or packed bytes, seeded, ``n`` limited to 10,000;
* the CLI against a real server: without ``--codes`` its queries are the index's own codes
  (non-empty buckets, results found; before, it drew from its synthetic set and found nothing),
  with ``--codes`` of other codes every probed bucket is empty and the run warns, an empty
  index stops with an error;
* ``--codes`` reads every format an insert takes (bit arrays, packed rows, uint64 words, hex
  text), with errors naming the file, what it holds and what is allowed.
"""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
from helpers import ServerProcess, app_client

from bucketsearch.index.codes import pack_bits, to_hex, to_packed, unpack_words
from bucketsearch.loadtest.cli import load_codes, main
from bucketsearch.loadtest.workload import QueryClass, make_queries

pytestmark = pytest.mark.timeout(300)
BITS = 64


def random_words(n: int, bits: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return pack_bits(rng.integers(0, 2, size=(n, bits), dtype=np.uint8))


# ------------------------------------------------------------------ the sample endpoint
@pytest.fixture
def client(tmp_path):
    with app_client(tmp_path / "d") as c:
        yield c


@pytest.mark.parametrize("bits", [64, 12, 100])
def test_sample_returns_exactly_the_live_items(client, bits):
    words = random_words(300, bits, seed=bits)
    hexes = to_hex(words, bits)
    assert client.post("/v1/indexes", json={"name": "ix", "bits": bits}).status_code == 201
    r = client.post("/v1/indexes/ix/items", json={"ids": list(range(200)), "codes": hexes[:200]})
    assert r.status_code == 200, r.text
    assert client.post("/v1/indexes/ix/merge").status_code == 200            # ids 0..199: main
    r = client.post("/v1/indexes/ix/items", json={"ids": list(range(200, 300)),
                                                  "codes": hexes[200:]})  # 200..299: delta
    assert r.status_code == 200, r.text
    gone = [3, 50, 199, 210, 299]                            # tombstones and delta deletes
    assert client.post("/v1/indexes/ix/items/delete", json={"ids": gone}).status_code == 200
    live = {i: hexes[i] for i in range(300) if i not in gone}

    r = client.get("/v1/indexes/ix/sample", params={"n": 10_000})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["bits"] == bits and body["size"] == len(live) == len(body["ids"])
    assert dict(zip(body["ids"], body["codes"])) == live

    r = client.get("/v1/indexes/ix/sample", params={"n": 10_000},
                   headers={"accept": "application/octet-stream"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    assert r.headers["x-bits"] == str(bits) and r.headers["x-count"] == str(len(live))
    m, nb = len(live), (bits + 7) // 8
    assert len(r.content) == m * (8 + nb)
    ids = np.frombuffer(r.content, dtype="<i8", count=m)
    packed = np.frombuffer(r.content, dtype=np.uint8, offset=8 * m).reshape(m, nb)
    assert {int(i): row.tobytes().hex() for i, row in zip(ids, packed)} == live


def test_sample_is_seeded_uniform_and_limited(client):
    words = random_words(1000, BITS, seed=1)
    client.post("/v1/indexes", json={"name": "ix", "bits": BITS})
    client.post("/v1/indexes/ix/items", json={"ids": list(range(1000)),
                                              "codes": to_hex(words, BITS)})
    a = client.get("/v1/indexes/ix/sample?n=50&seed=7").json()
    assert len(a["ids"]) == 50 == len(set(a["ids"]))
    assert client.get("/v1/indexes/ix/sample?n=50&seed=7").json() == a
    assert client.get("/v1/indexes/ix/sample?n=50&seed=8").json()["ids"] != a["ids"]
    # uniform: 400 draws of 50 from 1000 items cover (nearly) every item
    seen = set()
    for seed in range(400):
        seen.update(client.get(f"/v1/indexes/ix/sample?n=50&seed={seed}").json()["ids"])
    assert len(seen) > 990
    for n in (10_001, 0):
        r = client.get(f"/v1/indexes/ix/sample?n={n}")
        assert r.status_code == 400, r.text
        detail = r.json()["detail"]
        assert "n" in detail and str(n) in detail
        assert ("10000" in detail) if n else ("1" in detail)
    assert client.get("/v1/indexes/nope/sample").status_code == 404
    client.post("/v1/indexes", json={"name": "empty", "bits": BITS})
    assert client.get("/v1/indexes/empty/sample").json() == {"bits": BITS, "size": 0, "ids": [],
                                                             "codes": []}


# --------------------------------------------------------------- the CLI, real server
N_ITEMS = 3000


@pytest.fixture(scope="module")
def user_codes():
    """The user's codes: uniform random, nothing like the load tester's synthetic set."""
    return random_words(N_ITEMS, BITS, seed=42)


@pytest.fixture(scope="module")
def server(tmp_path_factory, user_codes):
    srv = ServerProcess(tmp_path_factory.mktemp("target") / "data").start()
    try:
        with srv.client() as c:
            for name in ("mine", "empty"):
                # single-table bucket search (auto would scan an index this small: no buckets)
                r = c.post("/v1/indexes", json={"name": name, "bits": BITS, "mode": "single"})
                assert r.status_code == 201, r.text
            r = c.post("/v1/indexes/mine/items", json={"ids": list(range(N_ITEMS)),
                                                       "codes": to_hex(user_codes, BITS)})
            assert r.status_code == 200, r.text
            assert c.post("/v1/indexes/mine/merge").status_code == 200
        yield srv
    finally:
        srv.kill()


def run_cli(server, tmp_path, capsys, *extra, index="mine"):
    out = tmp_path / f"r{time.monotonic_ns()}.json"
    rc = main(["--url", server.url, "--index", index, "--mode", "closed", "--concurrency", "2",
               "--requests", "80", "--warmup", "0", "--duration", "30", "--radii", "0,1",
               "--knn", "1", "--seed", "3", "--no-progress", "--json", str(out), *extra])
    captured = capsys.readouterr()
    report = json.loads(out.read_text()) if out.exists() else None
    return rc, captured.out, captured.err, report


def test_default_queries_hit_the_users_items(server, tmp_path, capsys):
    """The acceptance test: before, the default queries came from the synthetic set and every
    probed bucket of the user's index was empty (with no warning)."""
    rc, out, err, report = run_cli(server, tmp_path, capsys)
    assert rc == 0, out + err
    assert "sampled from index 'mine'" in out and f"{N_ITEMS:,} live items" in out
    assert report["errors"] == 0
    per = {e["radius"]: e for e in report["per_radius"]}
    for r in (0, 1):
        # each query is an item's code with exactly r bits flipped: its source's bucket is hit
        assert per[r]["nonempty_buckets_per_query"] >= 1, per[r]
        assert per[r]["empty_fraction"] < 1
        assert per[r]["results_per_query"] >= 1
    assert report["knn"][0]["results_per_query"] == 1
    assert not [w for w in report["warnings"] if "empty" in w], report["warnings"]


def test_model_counts_match_the_servers_cost_model(server, tmp_path, capsys, user_codes):
    """Issue 12: per radius the load test's cost model (its sampled queries' records) counts
    the same ``queries`` and ``empty_ball_queries`` as the server's own cost-model endpoint,
    on a fresh index that served exactly those searches; and the counts are the known ones:
    a radius-R query is an item's code with R bits flipped (uniform 64-bit codes: no other
    item within 10 bits), so its ball up to r is empty exactly for r < R."""
    with server.client() as c:
        r = c.post("/v1/indexes", json={"name": "counted", "bits": BITS, "mode": "single"})
        assert r.status_code == 201, r.text
        r = c.post("/v1/indexes/counted/items", json={"ids": list(range(N_ITEMS)),
                                                      "codes": to_hex(user_codes, BITS)})
        assert r.status_code == 200, r.text
        assert c.post("/v1/indexes/counted/merge").status_code == 200
    rc, out, err, report = run_cli(server, tmp_path, capsys, "--radii", "0,1,2",
                                   index="counted")
    assert rc == 0, out + err
    assert report["errors"] == 0 and report["model"]["available"] is True
    with server.client() as c:
        served = c.get("/v1/indexes/counted/cost-model").json()
    mine = [(r["radius"], r["queries"], r["empty_ball_queries"]) for r in report["model"]["radii"]]
    assert mine == [(r["radius"], r["queries"], r["empty_ball_queries"])
                    for r in served["radii"]]
    per = {e["radius"]: e["queries"] for e in report["per_radius"]}
    # k-NN queries are a class of their own (issue 26): they add to no radius's row
    assert report["knn"][0]["queries"] > 0
    assert mine[0] == (0, per[0] + per[1] + per[2], per[1] + per[2])
    assert mine[1][2] == per[2] and mine[2][2] == 0
    # the model of what ran samples every measured query, k-NN ones included
    assert report["model"]["sample"]["queries_seen"] == mine[0][1] + report["knn"][0]["queries"]


def test_warns_when_every_probed_bucket_is_empty(server, tmp_path, capsys):
    other = tmp_path / "other.npy"
    np.save(other, to_packed(random_words(500, BITS, seed=99), BITS))   # not the index's codes
    rc, out, err, report = run_cli(server, tmp_path, capsys, "--codes", str(other))
    assert rc == 0, out + err
    assert f"500 codes of {other}" in out
    per = {e["radius"]: e for e in report["per_radius"]}
    assert all(per[r]["empty_fraction"] == 1 for r in (0, 1))
    warning = [w for w in report["warnings"] if "every one of the" in w]
    assert len(warning) == 1 and "--codes" in warning[0] and "never reached" in warning[0]
    assert "warning:" in out and "never reached" in out


def test_codes_file_of_the_users_codes_hits(server, tmp_path, capsys, user_codes):
    text = tmp_path / "mine.txt"
    text.write_text("\n".join(to_hex(user_codes[:400], BITS)) + "\n")
    rc, out, err, report = run_cli(server, tmp_path, capsys, "--codes", str(text))
    assert rc == 0, out + err
    assert all(e["empty_fraction"] < 1 for e in report["per_radius"])
    assert not [w for w in report["warnings"] if "every one of the" in w]


def test_empty_index_stops_with_a_clear_error(server, tmp_path, capsys):
    rc, out, err, report = run_cli(server, tmp_path, capsys, index="empty")
    assert rc == 1 and report is None
    assert "'empty' holds no items" in err and "--codes" in err and "\n" not in err.strip()


def test_data_flags_need_the_synthetic_set(server, tmp_path, capsys):
    rc, out, err, _ = run_cli(server, tmp_path, capsys, "--data-n", "100")
    assert rc == 2 and "--codes synthetic" in err


# ------------------------------------------------------------------- --codes formats
@pytest.mark.parametrize("bits", [64, 12, 100])
def test_codes_accepts_every_insert_format(tmp_path, bits):
    words = random_words(40, bits, seed=bits + 1)
    want = to_packed(words, bits)
    bit01 = unpack_words(words, bits)
    files = {
        "bits01.npy": bit01,
        "bool.npy": bit01.astype(bool),
        "pm1.npy": bit01.astype(np.int8) * 2 - 1,
        "packed.npy": want,
        "words.npy": words,
    }
    for name, arr in files.items():
        np.save(tmp_path / name, arr)
    (tmp_path / "hex.txt").write_text("# my codes\n" + "\n".join(to_hex(words, bits)) + "\n\n")
    for name in [*files, "hex.txt"]:
        got = load_codes(str(tmp_path / name), bits)
        assert got.dtype == np.uint8 and np.array_equal(got, want), name


def test_codes_errors_name_the_file_the_content_and_the_rule(tmp_path):
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((5, 3), dtype=np.uint64))
    with pytest.raises(ValueError) as exc:
        load_codes(str(bad), 64)
    msg = str(exc.value)
    assert str(bad) in msg and "(5, 3)" in msg and "uint64" in msg
    assert "(n, 8) uint8" in msg and "hex" in msg and "(n, 64)" in msg
    np.save(bad, np.full((2, 64), 3, dtype=np.int64))
    with pytest.raises(ValueError, match="outside the alphabet"):
        load_codes(str(bad), 64)
    text = tmp_path / "codes.txt"
    text.write_text("00ff00ff00ff00ff\n\n00ff00ff00ff00fx\n")
    with pytest.raises(ValueError, match=r"codes.txt.*line 3.*not a hex"):
        load_codes(str(text), 64)
    text.write_text("00ff\n")
    with pytest.raises(ValueError, match=r"line 1.*16"):
        load_codes(str(text), 64)
    with pytest.raises(ValueError, match="cannot read"):
        load_codes(str(tmp_path / "missing.npy"), 64)


def test_exact_flips_put_the_source_on_the_outer_ring():
    rng = np.random.default_rng(0)
    base = to_packed(random_words(20, BITS, seed=5), BITS)
    for r in (0, 1, 3):
        q = make_queries(base[:1].repeat(50, axis=0), BITS, QueryClass(radius=r), 50, rng,
                         flips="exact")
        dist = np.unpackbits(q ^ base[0], axis=1).sum(axis=1)
        assert (dist == r).all()
    q = make_queries(base, BITS, QueryClass(k=3), 30, rng, flips="exact")
    assert all((row == base).all(axis=1).any() for row in q)


def test_empty_bucket_warning_rules():
    from bucketsearch.loadtest.runner import RunOutcome, empty_bucket_warning
    from bucketsearch.loadtest.stats import QueryStats, RequestResult

    def result(empty, probes=65, n_results=0, intended=10, error=None):
        res = RequestResult("r1", 1, None, 1, intended, intended, intended, intended + 5,
                            200, error, n_results)
        res.server = [QueryStats(probes, probes - empty, empty, 0, 100)]
        return res

    def warn(*results):
        return empty_bucket_warning(RunOutcome(list(results), 0, 5, 1.0, [0.1], 1, None))

    assert "never reached" in warn(result(65), result(65))
    assert warn(result(65), result(64)) is None                  # one bucket held items
    assert "never reached" in warn(result(65), result(64, intended=1))  # warm-up: not measured
    assert "delta" in warn(result(65, n_results=2))              # found in the delta only
    assert warn(result(0, probes=0)) is None                     # a scan probes no bucket
    assert warn(result(65, error="HTTP 500")) is None            # no stats, no verdict
