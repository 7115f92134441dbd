"""The live per-radius cost model (GET /v1/indexes/{name}/cost-model and /metrics) against a
run whose counts are known: an index of random 32-bit codes searched with codes it holds,
codes one bit away from one it holds, and codes far from all of them; every count is checked
against brute force, every quantile against the search responses' own per-query timings."""
from __future__ import annotations

import math
import re

import naive
import numpy as np
import pytest
from helpers import app_client

from bucketsearch.app.costfit import (CALIBRATION_ESTIMATOR, CALIBRATION_ROUNDS, CALIBRATION_TIGHT,
                                      bucket_of, bucket_upper_ns)
from bucketsearch.index.codes import pack_bits, to_hex

BITS = 32


def _words(rng, n):
    return pack_bits(rng.integers(0, 2, size=(n, BITS), dtype=np.uint8))


@pytest.fixture
def client(tmp_path):
    """The app in process on a fresh data directory (no warm-up, no start-up calibration)."""
    with app_client(tmp_path / "data") as c:
        yield c


@pytest.fixture
def run(client):
    """Index 'ix' (300 random codes, merged) and two searches with stats: batch A (present,
    one-bit-away and far codes) at radius 2, batch B (far and present codes) at radius 0."""
    rng = np.random.default_rng(5)
    xb = np.unique(_words(rng, 300), axis=0)
    assert client.post("/v1/indexes", json={"name": "ix", "bits": BITS,
                                            "mode": "single"}).status_code == 201
    ids = list(range(len(xb)))
    assert client.post("/v1/indexes/ix/items", json={"ids": ids, "codes": to_hex(xb, BITS)}
                       ).status_code == 200
    assert client.post("/v1/indexes/ix/merge").status_code == 200
    cand = _words(rng, 400)
    far = cand[naive.hamming_matrix(cand, xb, BITS).min(axis=1) > 2][:10]
    near = xb[12:30] ^ np.uint64(1 << 7)
    near = near[naive.hamming_matrix(near, xb, BITS).min(axis=1) == 1][:8]
    batch_a = np.concatenate([xb[:12], near, far])
    batch_b = np.concatenate([far, xb[:12]])
    records = []
    for xq, radius in ((batch_a, 2), (batch_b, 0)):
        r = client.post("/v1/indexes/ix/search", json={"codes": to_hex(xq, BITS),
                                                        "max_distance": radius, "stats": True})
        assert r.status_code == 200, r.text
        records.append(r.json()["stats"])
    return client, xb, (batch_a, batch_b), records


def _hist_quantile(values, q):
    """What a histogram quantile of these values is: the upper bound of the bucket of the
    ceil(q n)-th smallest."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    rank = max(math.ceil(q * len(v)), 1)
    return float(bucket_upper_ns(bucket_of(v[rank - 1:rank])[0]))


def test_per_radius_fields_against_a_known_run(run):
    client, xb, (batch_a, batch_b), records = run
    timings = [[[rec["lookup_ns"] for rec in q] for q in batch] for batch in records]
    cm = client.get("/v1/indexes/ix/cost-model").json()
    rows = {r["radius"]: r for r in cm["radii"]}
    assert sorted(rows) == [0, 1, 2]
    assert cm["queries"] == len(batch_a) + len(batch_b)
    dist_a = naive.hamming_matrix(batch_a, xb, BITS)
    dist_b = naive.hamming_matrix(batch_b, xb, BITS)
    assert [rows[r]["queries"] for r in range(3)] == [len(batch_a) + len(batch_b),
                                                        len(batch_a), len(batch_a)]
    # empty balls: the queries with no item within R (radius 0: the far and near codes of A,
    # the far codes of B; radius 1 and 2: the far codes of A only)
    expected = [int((dist_a.min(axis=1) > r).sum()) + (int((dist_b.min(axis=1) > 0).sum())
                                                       if r == 0 else 0) for r in range(3)]
    assert expected == [18 + 10, 10, 10]
    assert [rows[r]["empty_ball_queries"] for r in range(3)] == expected
    # mean empty buckets: C(Q, r) minus the distinct codes at distance exactly r
    for r in range(3):
        hits = [int((d == r).sum()) for d in dist_a] + ([int((d == 0).sum()) for d in dist_b]
                                                         if r == 0 else [])
        want = np.mean([math.comb(BITS, r) - h for h in hits])
        assert rows[r]["mean_empty_buckets"] == pytest.approx(want)
        assert rows[r]["probes"] == math.comb(BITS, r)
    # T(r) and T(R) quantiles: the histogram's reading of the responses' own lookup_ns
    a, b = timings
    for r in range(3):
        ring = [q[r] for q in a] + ([q[0] for q in b] if r == 0 else [])
        cum = [sum(q[:r + 1]) for q in a] + ([q[0] for q in b] if r == 0 else [])
        for key, q in (("p50_ns", 0.5), ("p90_ns", 0.9), ("p99_ns", 0.99)):
            assert rows[r]["measured"][key] == pytest.approx(_hist_quantile(ring, q))
            assert rows[r]["measured_cumulative"][key] == pytest.approx(_hist_quantile(cum, q))
        assert rows[r]["measured_cumulative"]["mean_ns"] == pytest.approx(np.mean(cum))
    # the paper's columns with the t0 the server models with (radius_fit, observed)
    t0 = cm["t0_ns"]
    assert cm["t0_source"] == "observed searches" and cm["t0_estimator"] == "radius_fit"
    assert cm["t0_ci_ns"][0] <= t0 <= cm["t0_ci_ns"][1]
    for r in range(3):
        cum_c = sum(math.comb(BITS, i) for i in range(r + 1))
        assert rows[r]["paper_ns"] == pytest.approx(t0 * math.comb(BITS, r))
        assert rows[r]["paper_cumulative_ns"] == pytest.approx(t0 * cum_c)
        assert rows[r]["paper_ratio"] == rows[r]["cumulative_paper_probes"] == cum_c
        assert rows[r]["measured_ratio"] == pytest.approx(
            rows[r]["measured_cumulative"]["p50_ns"] / rows[0]["measured_cumulative"]["p50_ns"])
        ratio = rows[r]["paper_cumulative_ns"] / rows[r]["measured_cumulative"]["p50_ns"]
        assert rows[r]["paper_over_measured"] == pytest.approx(ratio)
        assert rows[r]["paper_holds"] == (0.5 <= ratio <= 2)
    verdict = cm["verdicts"]["paper_model"]
    assert sorted(verdict["holds_at"] + verdict["fails_at"]) == [0, 1, 2]
    # the same figures in Prometheus (counters exact, gauges equal to the JSON)
    text = client.get("/metrics").text

    def series(name, **labels):
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        pattern = rf'^{name}\{{{re.escape(want)}\}} (\S+)$'
        found = re.search(pattern, text, re.M)
        assert found, f"{name} {labels} not exposed"
        return float(found.group(1))

    for r in range(3):
        assert series("bucketsearch_radius_queries_total", index="ix", radius=r) == \
            rows[r]["queries"]
        assert series("bucketsearch_empty_ball_queries_total", index="ix", radius=r) == \
            expected[r]
        assert series("bucketsearch_radius_cost_ratio", index="ix", radius=r,
                      source="paper") == rows[r]["paper_ratio"]
        assert series("bucketsearch_radius_time_seconds", index="ix", quantile="0.99",
                      radius=r, scope="cumulative") == pytest.approx(
            rows[r]["measured_cumulative"]["p99_ns"] / 1e9)
        assert series("bucketsearch_radius_empty_buckets_mean", index="ix", radius=r) == \
            pytest.approx(rows[r]["mean_empty_buckets"])


def test_observed_radius_zero_leaves_the_probe_term_unidentified(client):
    """Only radius-0 searches: every query makes one probe, so the per-probe cost is the fixed
    cost under another name: the extended model says so and leaves it out."""
    rng = np.random.default_rng(1)
    xb = _words(rng, 100)
    client.post("/v1/indexes", json={"name": "z", "bits": BITS, "mode": "single"})
    client.post("/v1/indexes/z/items", json={"ids": list(range(100)), "codes": to_hex(xb, BITS)})
    client.post("/v1/indexes/z/merge")
    xq = np.concatenate([xb[:20], _words(rng, 20)])
    assert client.post("/v1/indexes/z/search", json={"codes": to_hex(xq, BITS),
                                                      "max_distance": 0}).status_code == 200
    ext = client.get("/v1/indexes/z/cost-model").json()["extended_model"]
    assert ext["estimator"] == "query_model" and ext["source"].startswith("observed searches")
    assert "probes" not in ext["terms"] and "collinear" in ext["unidentified"]["probes"]
    assert list(ext["coef"]) == list(ext["terms"]) and "fixed" in ext["terms"]


def test_calibration_names_every_estimate(run):
    client = run[0]
    r = client.post("/v1/indexes/ix/cost-model/calibrate",
                    json={"queries": 48, "max_distance": 2, "seed": 3})
    assert r.status_code == 200, r.text
    cm = r.json()
    assert cm["t0_source"] == "calibration"
    assert cm["t0_estimator"] == CALIBRATION_ESTIMATOR == "radius_fit, mean over repeated rounds"
    named = {(e["source"], e["estimator"]): e for e in cm["estimates"]}
    assert {("observed searches", "radius_fit"), ("calibration", "radius_fit"),
            ("calibration", CALIBRATION_ESTIMATOR), ("calibration", "microbenchmark"),
            ("calibration", "query_model.probes")} <= set(named)
    cal = cm["calibration"]
    rounds = cal["rounds"]
    # repeated: at least 3 rounds, the t0 their mean and the interval theirs
    assert CALIBRATION_ROUNDS[0] <= len(rounds) <= CALIBRATION_ROUNDS[1]
    assert cm["t0_ns"] == pytest.approx(np.mean(rounds)) == cal["t0_ns"]
    lo, hi = cm["t0_ci_ns"]
    assert lo < cm["t0_ns"] < hi and [lo, hi] == cal["ci_ns"]
    assert cal["stable"] == ((hi - lo) / 2 <= CALIBRATION_TIGHT * cm["t0_ns"])
    assert cal["verdict"].startswith("stable" if cal["stable"] else "unstable")
    assert cal["engine"] == "single"
    micro = named[("calibration", "microbenchmark")]
    assert micro["t0_ns"] > 0 and micro["detail"]["empty_ns"] > 0 and micro["samples"] == 5
    ext = cm["extended_model"]
    assert ext["source"] == "calibration: 48 sampled queries at radii 0..2"
    assert "probes" in ext["terms"] and ext["terms"]["probes"]["coef_ns"] > 0
    assert cm["calibration"]["fits"]["radii"][2]["queries"] == 48 * len(rounds)
    assert cm["verdicts"]["t0_agreement"]["estimators"]
    r = client.post("/v1/indexes/ix/cost-model/calibrate",
                    json={"queries": 4, "max_distance": BITS + 1})
    assert r.status_code == 400 and "max_distance" in r.json()["detail"]


def test_the_responses_stats_give_the_same_counts_offline(run):
    """What a load tester does with the search responses: fit_all on their ``stats`` records
    gives the server's per-radius counts (exact percentiles instead of histogram bounds)."""
    from bucketsearch.index.costmodel import fit_all

    client, _, _, records = run
    offline = {r["radius"]: r for r in fit_all(records[0] + records[1], BITS)["radii"]}
    live = {r["radius"]: r for r in client.get("/v1/indexes/ix/cost-model").json()["radii"]}
    assert sorted(offline) == sorted(live) == [0, 1, 2]
    for r in range(3):
        for key in ("queries", "empty_ball_queries", "paper_ratio", "cumulative_paper_probes"):
            assert offline[r][key] == live[r][key], (r, key)
        assert offline[r]["mean_empty_buckets"] == pytest.approx(live[r]["mean_empty_buckets"])
        for scope in ("measured", "measured_cumulative"):  # means are exact in both
            assert offline[r][scope]["mean_ns"] == pytest.approx(live[r][scope]["mean_ns"])


def test_cost_history_and_merges_are_read_back_after_a_restart(tmp_path):
    """Issue 26: after a restart the dashboard showed "merges 0" and no searches; the
    per-radius figures and the merge count are kept (a read-only worker does not read them:
    with --workers N each would count them again)."""
    rng = np.random.default_rng(5)
    data = tmp_path / "data"
    with app_client(data) as c:
        c.post("/v1/indexes", json={"name": "h", "bits": BITS, "mode": "single"})
        for i in range(3):
            xb = _words(rng, 50)
            c.post("/v1/indexes/h/items", json={"ids": list(range(50 * i, 50 * (i + 1))),
                                                "codes": to_hex(xb, BITS)})
            assert c.post("/v1/indexes/h/merge").status_code == 200
        for r in (0, 1, 2):
            assert c.post("/v1/indexes/h/search", json={"codes": to_hex(xb[:7], BITS),
                                                        "max_distance": r}).status_code == 200
        assert c.post("/v1/indexes/h/search", json={"codes": to_hex(xb[:4], BITS),
                                                    "k": 3}).status_code == 200
        before = c.get("/v1/indexes/h/cost-model").json()
        assert c.get("/v1/indexes/h").json()["merges"] == 3
    with app_client(data) as c:
        assert c.get("/v1/indexes/h").json()["merges"] == 3
        after = c.get("/v1/indexes/h/cost-model").json()
        assert after["queries"] == before["queries"] == 21
        assert [(r["radius"], r["queries"], r["measured"]["p50_ns"]) for r in after["radii"]] \
            == [(r["radius"], r["queries"], r["measured"]["p50_ns"]) for r in before["radii"]]
    with app_client(data, read_only=True) as c:
        assert c.get("/v1/indexes/h/cost-model").json()["queries"] == 0


@pytest.mark.parametrize("damage", ["not json", "wrong version", "other bits", "unwritable"])
def test_a_damaged_or_unwritable_cost_history_never_stops_the_index(tmp_path, caplog, damage):
    """cost-history.json is a record, not data: damaged, it is left out with a warning naming
    the folder and the index serves with fresh figures; unwritable, the save is logged and the
    server stops cleanly."""
    data = tmp_path / "data"
    words = _words(np.random.default_rng(8), 30)
    with app_client(data) as c:
        c.post("/v1/indexes", json={"name": "d", "bits": BITS, "mode": "single"})
        c.post("/v1/indexes/d/items", json={"ids": list(range(30)), "codes": to_hex(words, BITS)})
        assert c.post("/v1/indexes/d/search", json={"codes": to_hex(words[:3], BITS),
                                                    "max_distance": 1}).status_code == 200
    path = next(data.glob("indexes/d.*")) / "cost-history.json"
    assert path.exists()
    if damage == "unwritable":  # a directory in its place: unreadable, and no rename onto it
        path.unlink()
        (path / "x").mkdir(parents=True)
        with caplog.at_level("WARNING"), app_client(data) as c:
            assert c.post("/v1/indexes/d/search", json={
                "codes": to_hex(words[:3], BITS), "max_distance": 1}).status_code == 200
        assert "cost history not read back" in caplog.text
        assert "cost history not saved" in caplog.text
        return
    text = {"not json": "{", "wrong version": '{"version": -1}',
            "other bits": path.read_text().replace(f'"bits": {BITS}', '"bits": 8')}[damage]
    path.write_text(text)
    with caplog.at_level("WARNING"), app_client(data) as c:
        assert c.get("/v1/indexes/d/cost-model").json()["queries"] == 0
        r = c.post("/v1/indexes/d/search", json={"codes": to_hex(words[:3], BITS),
                                                 "max_distance": 1})
        assert r.status_code == 200 and 0 in r.json()["results"][0]["ids"]
    assert "cost history not read back" in caplog.text
