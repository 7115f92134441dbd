"""Load-test bookkeeping on made-up latencies with known answers (no server, no clock)."""
from __future__ import annotations

import json
import math
import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.loadtest import dataset
from bucketsearch.loadtest.report import build_report, plot_report, print_report
from bucketsearch.loadtest.stats import (Distribution, LoadStats, QueryReservoir, QueryStats,
                                         RequestResult)
from bucketsearch.loadtest.workload import QueryClass, Workload, parse_radii

US = 1000  # ns per microsecond


def naive_percentile(values, p):
    """Nearest rank: the value of rank max(1, floor(p N / 100 + 0.5)) in ascending order."""
    ordered = sorted(values)
    rank = max(1, int(math.floor(p * len(ordered) / 100 + 0.5)))
    return ordered[min(rank, len(ordered)) - 1]


def rec(intended_us, sent_us, done_us, label="r1", radius=1, status=200, error=None,
        server=None, n_queries=1, dispatch_us=None):
    return RequestResult(label, radius, None, n_queries, intended_us * US,
                         (sent_us if dispatch_us is None else dispatch_us) * US, sent_us * US,
                         done_us * US, status, error, 0, server)


# -- percentiles ------------------------------------------------------------------------------
def test_percentiles_of_1_to_1000_us_are_exact():
    stats = LoadStats().add_all(rec(0, 0, v) for v in range(1, 1001))
    lat = stats.latency_us
    assert lat.percentile(50) == 500
    assert lat.percentile(90) == 900
    assert lat.percentile(99) == 990
    assert lat.percentile(99.9) == 999
    assert lat.percentile(100) == 1000
    assert lat.max == 1000 and lat.min == 1 and lat.count == 1000
    s = lat.summary(scale=1e-3)
    assert s["p50"] == pytest.approx(0.5) and s["p999"] == pytest.approx(0.999)
    assert s["max"] == pytest.approx(1.0) and s["mean"] == pytest.approx(0.5005)


def test_percentile_small_counts_and_empty():
    d = Distribution()
    assert d.percentile(50) is None and d.summary()["p99"] is None
    for v in (30, 10, 20):
        d.record(v)
    # N = 3: p50 -> rank floor(1.5 + .5) = 2 -> 20; p10 -> rank max(1, 0) = 1 -> 10
    assert d.percentile(50) == 20
    assert d.percentile(10) == 10
    assert d.percentile(99) == 30
    with pytest.raises(ValueError, match="percentile must be in"):
        d.percentile(101)
    with pytest.raises(ValueError, match="negative"):
        d.record(-1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=300),
       st.sampled_from([1.0, 50.0, 90.0, 99.0, 99.9, 100.0]))
def test_percentile_matches_nearest_rank_within_hdr_precision(values, p):
    d = Distribution()
    for v in values:
        d.record(v)
    expected = naive_percentile(values, p)
    got = d.percentile(p)
    # 3 significant digits: exact below 2048, else within 0.1% (and never above the max)
    assert got <= max(values)
    assert abs(got - max(expected, 1)) <= max(1, 1e-3 * expected)


# -- coordinated omission ---------------------------------------------------------------------
def single_connection_queue(intended, service):
    """Obviously-correct twin: one connection, FIFO; send when scheduled and the line is free."""
    sent, done, free_at = [], [], 0
    for t, s in zip(intended, service):
        start = max(t, free_at)
        sent.append(start)
        done.append(start + s)
        free_at = start + s
    return sent, done


def test_coordinated_omission_correction_on_a_stall():
    # 10 requests scheduled every 100 us; the first takes 1000 us (a stall), the rest 10 us.
    intended = [100 * i for i in range(10)]
    service = [1000] + [10] * 9
    sent, done = single_connection_queue(intended, service)
    assert sent[1:] == [1000 + 10 * j for j in range(9)]
    open_loop = LoadStats().add_all(rec(i, s, d) for i, s, d in zip(intended, sent, done))
    expected_latency = [1000, 910, 820, 730, 640, 550, 460, 370, 280, 190]
    assert [d - i for i, d in zip(intended, done)] == expected_latency
    lat, svc = open_loop.latency_us, open_loop.service_us
    assert lat.percentile(50) == 550          # rank 5 of the sorted latencies
    assert lat.percentile(90) == 910          # rank 9
    assert lat.max == 1000
    assert lat.mean() == pytest.approx(sum(expected_latency) / 10)
    assert svc.percentile(50) == 10 and svc.percentile(90) == 10 and svc.max == 1000
    # queueing = sent - intended: 0 for the first, then 900, 810, ... 180
    assert open_loop.queueing_us.max == 900 and open_loop.queueing_us.min == 0
    # the same answers seen by a closed loop (intended = sent) hide the stall: p90 = 10 us
    closed = LoadStats().add_all(rec(s, s, d) for s, d in zip(sent, done))
    assert closed.latency_us.percentile(90) == 10
    assert closed.latency_us.percentile(50) == 10
    assert open_loop.latency_us.percentile(90) / closed.latency_us.percentile(90) == 91


def test_latency_is_queueing_plus_service_and_lag_is_separate():
    r = rec(100, 150, 400, dispatch_us=120)
    assert r.latency_ns == 300 * US
    assert r.service_ns == 250 * US
    assert r.queueing_ns == 50 * US
    assert r.sched_lag_ns == 20 * US
    assert r.latency_ns == r.queueing_ns + r.service_ns
    s = LoadStats().add_all([r])
    assert s.sched_lag_us.max == 20 and s.queueing_us.max == 50


# -- warm-up, throughput, status codes, per radius --------------------------------------------
def test_warmup_is_discarded_and_rates_use_the_window():
    # 50 warm-up requests (intended < 0.5 s), then 100 requests over [0.5 s, 1.5 s)
    records = [rec(10_000 * i, 10_000 * i, 10_000 * i + 500) for i in range(150)]
    s = LoadStats(measure_from_ns=500_000 * US).add_all(records)
    assert s.warmup_requests == 50 and s.requests == 100
    # window: first intended 0.5 s to last done 1.4905 s
    assert s.window_s() == pytest.approx(0.9905)
    assert s.achieved_rate() == pytest.approx(100 / 0.9905)
    assert s.send_rate() == pytest.approx(100 / 0.99)
    assert s.queries_per_s() == pytest.approx(100 / 0.9905)


SERVER_RECORDS = [
    {"radius": 0, "probes": 1, "nonempty_buckets": 1, "empty_buckets": 0, "items": 2,
     "lookup_ns": 100, "modeled_ns": 10.0},
    {"radius": 1, "probes": 64, "nonempty_buckets": 2, "empty_buckets": 62, "items": 3,
     "lookup_ns": 900, "modeled_ns": 640.0}]


def test_status_codes_errors_and_classes():
    ok_server = [QueryStats.from_server(SERVER_RECORDS)]
    records = [rec(0, 0, 100, server=ok_server) for _ in range(3)]
    records += [rec(0, 0, 200, status=503, error="HTTP 503"),
                rec(0, 0, 300, status=0, error="timeout"),
                rec(0, 0, 50, label="r0", radius=0, server=[QueryStats(1, 0, 1, 0, 40)])]
    s = LoadStats().add_all(records)
    assert s.status_codes == {"200": 4, "503": 1, "0": 1}
    assert s.errors == {"HTTP 503": 1, "timeout": 1} and s.n_errors == 2
    r1 = s.classes["r1"]
    assert r1.requests == 5 and r1.errors == 2 and r1.server_queries == 3
    assert r1.latency_us.count == 5              # failed requests still have a latency
    assert r1.lookup_ns.percentile(50) == 1000   # 100 + 900 summed over rings 0..1
    assert dict(r1.probes) == {65: 3}
    assert r1.items_total == 15 and r1.empty_total == 186
    assert r1.modeled_ns_total == pytest.approx(3 * 650.0)
    assert [c.label for c in s.ordered_classes()] == ["r0", "r1"]
    # the cost samples: the 3 measured r1 queries' records as the server sent them (without
    # modeled_ns); the r0 query came without per-radius records and the failures with none
    assert s.reservoir.seen == 3
    want = [{k: v for k, v in rec.items() if k != "modeled_ns"} for rec in SERVER_RECORDS]
    assert s.reservoir.records() == [want] * 3


def test_query_stats_keep_candidates_of_multi_index_hashing():
    recs = [{**rec, "candidates": 7 * rec["radius"] + 1} for rec in SERVER_RECORDS]
    q = QueryStats.from_server(recs)
    assert (q.probes, q.items, q.lookup_ns) == (65, 5, 1000)
    assert [r["candidates"] for r in q.records()] == [1, 8]


def test_reservoir_is_bounded_and_uniform():
    res = QueryReservoir(capacity=10, seed=3)
    queries = [QueryStats(i, 0, 0, 0, 0, rings=((i, 0, 0, 0, 0),)) for i in range(25)]
    for q in queries:
        res.add(q)
    assert res.seen == 25 and len(res.kept) == 10 and len({q.probes for q in res.kept}) == 10
    with pytest.raises(ValueError, match="capacity: an integer >= 1 is needed, got 0"):
        QueryReservoir(capacity=0)
    # uniform: over many seeds every one of 40 queries is kept in about 10/40 of the samples
    kept = Counter()
    for seed in range(2000):
        res = QueryReservoir(capacity=10, seed=seed)
        for i in range(40):
            res.add(QueryStats(i, 0, 0, 0, 0, rings=((i, 0, 0, 0, 0),)))
        kept.update(q.probes for q in res.kept)
    share = np.array([kept[i] for i in range(40)]) / 2000
    assert abs(share - 0.25).max() < 0.05  # binomial sd 0.0097: 5 sd
    # a merge keeps the sample uniform over both sides: 30 + 10 queries, 10 kept
    from_a = []
    for seed in range(2000):
        a, b = QueryReservoir(10, seed), QueryReservoir(10, seed + 10_000)
        for i in range(30):
            a.add(QueryStats(i, 0, 0, 0, 0, rings=((i, 0, 0, 0, 0),)))
        for i in range(30, 40):
            b.add(QueryStats(i, 0, 0, 0, 0, rings=((i, 0, 0, 0, 0),)))
        a.merge(b)
        assert a.seen == 40 and len(a.kept) == 10
        from_a.append(sum(q.probes < 30 for q in a.kept))
    assert np.mean(from_a) == pytest.approx(7.5, abs=0.15)  # 10 x 30/40
    with pytest.raises(ValueError, match="cannot merge a reservoir of 5 queries into one of 10"):
        QueryReservoir(10).merge(QueryReservoir(5))


def test_merge_equals_one_accumulation():
    rng = np.random.default_rng(1)
    records = [rec(int(t), int(t) + 5, int(t) + 5 + int(d), label=f"r{k}", radius=int(k),
                   server=[QueryStats(1, 1, 0, 1, int(d) * 10,
                                      rings=((1, 1, 0, 1, int(d) * 10),))])
               for t, d, k in zip(rng.integers(0, 10**6, 400), rng.integers(1, 5000, 400),
                                  rng.integers(0, 3, 400))]
    whole = LoadStats(1000).add_all(records)
    a, b = LoadStats(1000).add_all(records[:170]), LoadStats(1000).add_all(records[170:])
    a.merge(b)
    for p in (50, 90, 99, 99.9, 100):
        assert a.latency_us.percentile(p) == whole.latency_us.percentile(p)
        for label in whole.classes:
            assert a.classes[label].lookup_ns.percentile(p) == \
                whole.classes[label].lookup_ns.percentile(p)
    assert a.requests == whole.requests and a.warmup_requests == whole.warmup_requests
    assert a.achieved_rate() == pytest.approx(whole.achieved_rate())
    assert a.reservoir.seen == whole.reservoir.seen


# -- the report: the cost model's one answer ---------------------------------------------------
def known_run() -> list[RequestResult]:
    """20 queries of each radius class R = 0..3 whose ring j costs ``300 [j = 0] + 5 C(64, j)
    + 40 items_j`` ns; a class-R query finds its R + 1 items on ring R (none before), so per
    query T = 300 + 5 P + 40 I exactly, and the ball up to r < R is empty."""
    records = []
    for big in range(4):
        rings = []
        for j in range(big + 1):
            probes, items = math.comb(64, j), (big + 1) * (j == big)
            rings.append({"radius": j, "probes": probes, "nonempty_buckets": int(items > 0),
                          "empty_buckets": probes - int(items > 0), "items": items,
                          "lookup_ns": 300 * (j == 0) + 5 * probes + 40 * items})
        server = [QueryStats.from_server(rings)]
        records += [rec(i * 100, i * 100, i * 100 + 50 + 10 * big, label=f"r{big}", radius=big,
                        server=server) for i in range(20)]
    return records


SERVER_CM = {"t0_ns": 4.0, "t0_estimator": "radius_fit", "t0_source": "calibration",
             "estimates": [{"estimator": "radius_fit", "source": "calibration", "t0_ns": 4.0,
                            "ci_ns": [3.9, 4.1]},
                           {"estimator": "microbenchmark", "source": "calibration",
                            "t0_ns": 3.5, "ci_ns": None}]}


def test_build_report_fits_the_cost_model_once_and_plots(tmp_path):
    stats = LoadStats().add_all(known_run())
    report = build_report(stats, {"mode": "open", "rate": 100.0, "index": "x", "batch": 1}, 64,
                          SERVER_CM, ["a warning"])
    json.dumps(report, allow_nan=False)
    for key in ("params", "versions", "achieved_rate", "target_rate", "errors", "status_codes",
                "per_radius", "model"):
        assert key in report
    assert report["target_rate"] == 100.0 and report["versions"]["hdrhistogram"]
    model = report["model"]
    assert model["available"] is True and model["unavailable"] is None
    assert model["sample"]["queries_seen"] == model["sample"]["queries_kept"] == 80
    assert model["sample"]["capacity"] == 20_000 and "uniform" in model["sample"]["method"]
    # per radius, from every query that reached it
    rows = {r["radius"]: r for r in model["radii"]}
    assert [rows[r]["queries"] for r in range(4)] == [80, 60, 40, 20]
    assert [rows[r]["empty_ball_queries"] for r in range(4)] == [60, 40, 20, 0]
    assert [rows[r]["paper_ratio"] for r in range(4)] == [1, 65, 2081, 43745]
    # T(R) p50: queries of the classes > R found nothing up to R, the majority from r = 1 on
    ring = [300 + 5, 5 * 64, 5 * 2016, 5 * 41664]
    assert rows[0]["measured_cumulative"]["p50_ns"] == pytest.approx(ring[0])
    assert rows[1]["measured_cumulative"]["p50_ns"] == pytest.approx(ring[0] + ring[1])
    assert rows[3]["measured_cumulative"]["p50_ns"] == pytest.approx(sum(ring) + 160)
    # every t0 named; the query model recovers 300 + 5 P + 40 I exactly
    assert [e["estimator"] for e in model["t0"]] == ["radius_fit", "query_model.probes"]
    assert model["t0_ns"] == pytest.approx(5.0, rel=0.01)
    terms = model["query_model"]["terms"]
    assert terms["fixed"]["coef_ns"] == pytest.approx(300, rel=1e-6)
    assert terms["probes"]["coef_ns"] == pytest.approx(5.0, rel=1e-6)
    assert terms["items"]["coef_ns"] == pytest.approx(40, rel=1e-6)
    assert "candidates" in model["query_model"]["unidentified"]
    # radius 0: t0 x 1 = 5 ns against 305 ns measured; radius 1: 325 / 625 (just above 1/2)
    assert model["verdicts"]["paper_model"]["holds_at"] == [1, 2, 3]
    assert model["verdicts"]["paper_model"]["fails_at"] == [0]
    # per class: modeled with this run's radius_fit t0; the server's estimates beside
    assert model["modeled_with"]["estimator"] == "radius_fit"
    assert model["modeled_with"]["source"] == "this run (80 sampled queries)"
    e3 = report["per_radius"][3]
    assert e3["probes"] == e3["sum_c"] == 43745
    assert e3["paper_ns"] == pytest.approx(model["t0_ns"] * 43745)
    assert set(e3["latency_ms"]) >= {"p50", "p90", "p99", "p999", "max"}
    assert e3["count"] == 20 and e3["latency_ms"]["p50"] == pytest.approx(0.08)
    assert model["server"]["t0_ns"] == 4.0 and model["server"]["estimates"] == \
        SERVER_CM["estimates"]
    assert "verdict" not in e3 and "rings" not in e3
    out = tmp_path / "plot.png"
    plot_report(report, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_print_report_names_every_t0(capsys):
    from rich.console import Console

    stats = LoadStats().add_all(known_run())
    report = build_report(stats, {"mode": "open", "rate": 100.0, "index": "x", "batch": 1}, 64,
                          SERVER_CM)
    print_report(report, Console(width=200, force_terminal=False))
    text = capsys.readouterr().out
    for named in ("t0 [radius_fit] = ", "t0 [query_model.probes] = ",
                  "t0 [calibration / radius_fit] = 4 ns", "t0 [calibration / microbenchmark]",
                  "paper t0 [radius_fit] = ", "empty balls", "[query_model] per query"):
        assert named in text, named
    # no t0 figure without the name of its estimator
    assert not re.search(r"t0\s*=", text), text


def test_a_run_without_stats_has_no_model_and_says_why(tmp_path):
    records = [rec(i * 100, i * 100, i * 100 + 50, label="r1", radius=1) for i in range(10)]
    report = build_report(LoadStats().add_all(records), {"mode": "closed", "stats": False}, 64,
                          SERVER_CM)
    model = report["model"]
    assert model["available"] is False and "--no-stats" in model["unavailable"]
    assert "radii" not in model and "t0" not in model and model["sample"]["queries_seen"] == 0
    assert model["modeled_with"] == {"t0_ns": 4.0, "estimator": "radius_fit",
                                     "source": "server (calibration)"}
    assert report["per_radius"][0]["paper_ns"] == pytest.approx(4.0 * 65)
    assert report["per_radius"][0]["server_lookup_ns"]["p50"] is None
    nothing = build_report(LoadStats().add_all(records), {"mode": "closed"}, 64, None)
    assert nothing["model"]["modeled_with"] is None
    assert "no measured request returned" in nothing["model"]["unavailable"]
    plot_report(nothing, tmp_path / "empty.png")


# -- workload ---------------------------------------------------------------------------------
def _hamming_to_set(query: bytes, base: np.ndarray) -> int:
    q = np.frombuffer(query, dtype=np.uint8)
    return int(np.unpackbits(base ^ q, axis=1).sum(axis=1).min())


def test_workload_radius_queries_stay_within_radius_and_are_seeded():
    base = dataset.clustered_codes(200, 64, seed=3)
    classes = [QueryClass(radius=r) for r in (0, 1, 3)] + [QueryClass(k=5)]
    w1 = Workload(base, 64, classes, batch=4, seed=11, pool=8)
    w2 = Workload(base, 64, classes, batch=4, seed=11, pool=8)
    assert [w1[i].body for i in range(100)] == [w2[i].body for i in range(100)]
    assert [w1[i].body for i in range(20)] != \
        [Workload(base, 64, classes, batch=4, seed=12, pool=8)[i].body for i in range(20)]
    seen = set()
    for i in range(300):
        req = w1[i]
        body = json.loads(req.body)
        assert len(body["codes"]) == 4 and body["stats"] is True
        seen.add(req.qclass.label)
        limit = body.get("max_distance", 2)
        assert ("k" in body) == (req.qclass.k is not None)
        for code in body["codes"]:
            assert len(code) == 16
            assert _hamming_to_set(bytes.fromhex(code), base) <= limit
    assert seen == {"r0", "r1", "r3", "knn5"}


def test_load_codes_accepts_packed_rows_and_bit_arrays(tmp_path):
    from bucketsearch.loadtest.cli import load_codes

    bits01 = np.random.default_rng(0).integers(0, 2, size=(50, 12), dtype=np.uint8)
    packed = np.packbits(bits01, axis=1)
    np.save(tmp_path / "bits.npy", bits01)
    np.save(tmp_path / "pm.npy", bits01.astype(np.int8) * 2 - 1)
    dirty = packed.copy()
    dirty[:, -1] |= 0x0F                      # padding bits set: cleared on load
    np.save(tmp_path / "packed.npy", dirty)
    for name in ("bits.npy", "pm.npy", "packed.npy"):
        assert np.array_equal(load_codes(str(tmp_path / name), 12, 1, 0), packed)
    np.save(tmp_path / "bad.npy", np.zeros((5, 7), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"--codes .*bad.npy.*\(n, 2\) uint8"):
        load_codes(str(tmp_path / "bad.npy"), 12, 1, 0)
    with pytest.raises(ValueError, match="cannot read"):
        load_codes(str(tmp_path / "missing.npy"), 12, 1, 0)
    assert load_codes(None, 64, 10, 3).shape == (10, 8)


def test_parse_radii_and_errors():
    assert parse_radii("0,1,2") == [0, 1, 2]
    assert parse_radii("3, 0-2") == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"--radii 'a'.*allowed"):
        parse_radii("a")
    with pytest.raises(ValueError, match="--radii"):
        parse_radii("-1")
    with pytest.raises(ValueError, match="--radii"):
        parse_radii("")


def test_dataset_is_deterministic_and_clustered():
    a = dataset.clustered_codes(5000, 64, seed=5)
    assert a.shape == (5000, 8) and a.dtype == np.uint8
    assert np.array_equal(a, dataset.clustered_codes(5000, 64, seed=5))
    assert not np.array_equal(a, dataset.clustered_codes(5000, 64, seed=6))
    odd = dataset.clustered_codes(100, 12, seed=1)
    assert odd.shape == (100, 2) and not (odd[:, 1] & 0x0F).any()   # padding bits are 0
    # clustered: most codes have a neighbour within 8 bits (random 64-bit codes would not)
    w = a[:500].view(">u8")[:, 0]
    others = a.view(">u8")[:, 0]
    near = [np.unpackbits((others ^ x).view(np.uint8)).reshape(-1, 64).sum(1) for x in w]
    frac = np.mean([(np.sort(d)[1] <= 8) for d in near])
    assert frac > 0.8
    assert dataset.to_hex(a[:2]) == [a[0].tobytes().hex(), a[1].tobytes().hex()]
