"""Issue 13 item 3: the load tester against a deployment people run, here a real server process
with a write key and a read key.

* ``--api-key`` (and ``BUCKETSEARCH_API_KEY``): a run with the right key works, with a wrong or
  no key stops with one line naming the status and the flag; the key never reaches the report;
* ``--wire binary``: the same queries (same seed) get the same ids as JSON; without stats the
  report says the per-radius part is unavailable instead of showing zeros;
* ``--slo``: the grammar, and an impossible threshold exits 99 naming it;
* ``--csv`` / ``--hdr-log`` / the latency spectrum: exact on made-up requests, and consistent
  with the report on a real run.
"""
from __future__ import annotations

import csv
import json

import httpx
import numpy as np
import pytest
from conftest import ServerProcess
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader

from bucketsearch.loadtest import dataset
from bucketsearch.loadtest.cli import API_KEY_ENV, main
from bucketsearch.loadtest.client import Client
from bucketsearch.loadtest.export import CSV_FIELDS, per_second, write_csv, write_hdr_log
from bucketsearch.loadtest.report import SLO_EXIT, evaluate_slos, parse_slos
from bucketsearch.loadtest.stats import RequestResult
from bucketsearch.loadtest.wire import decode_search
from bucketsearch.loadtest.workload import QueryClass, Workload

pytestmark = pytest.mark.timeout(300)
WRITE_KEY, READ_KEY = "lt-write-key", "lt-read-key"
INDEX, BITS = "keyed", 64


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keyed")
    srv = ServerProcess(tmp / "data", {"BUCKETSEARCH_API_KEY": WRITE_KEY,
                                       "BUCKETSEARCH_READ_KEY": READ_KEY}).start(180)
    codes = dataset.clustered_codes(5_000, BITS, seed=3)
    with Client(srv.url, api_key=WRITE_KEY) as c:
        c.create_index(INDEX, BITS, mode="single")
        c.add(INDEX, codes)
        c.merge(INDEX)
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def no_key_in_env(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)


def run_cli(server, *extra, requests=40):
    return main(["--url", server.url, "--index", INDEX, "--mode", "closed", "--concurrency", "1",
                 "--requests", str(requests), "--warmup", "0", "--duration", "60",
                 "--radii", "0,1,2", "--knn", "3", "--seed", "11", "--no-progress", *extra])


def test_wrong_or_missing_key_stops_with_one_clear_line(server, capsys):
    assert run_cli(server, "--api-key", "not-the-key") == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "403" in err and "--api-key" in err
    assert "not-the-key" not in err
    assert run_cli(server) == 1
    err = capsys.readouterr().err.strip()
    assert "401" in err and "--api-key" in err and API_KEY_ENV in err


def test_key_from_the_environment_and_never_in_the_report(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, READ_KEY)
    out = tmp_path / "r.json"
    assert run_cli(server, "--header", "X-Run: flags-test", "--json", str(out)) == 0
    text = out.read_text()
    assert READ_KEY not in text and "flags-test" not in text
    report = json.loads(text)
    assert report["errors"] == 0 and report["requests"] == 40
    assert report["params"]["api_key"] == "(set)" and report["params"]["headers"] == ["X-Run"]
    assert report["params"]["wire"] == "json" and report["params"]["stats"] is True
    assert report["model"]["available"] is True
    assert all(e["server_lookup_ns"]["p50"] for e in report["per_radius"])
    assert READ_KEY not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--header", "no colon here"])


def test_binary_wire_gets_the_ids_json_gets(server):
    base = dataset.clustered_codes(500, BITS, seed=3)
    classes = [QueryClass(radius=2), QueryClass(k=4)]
    as_json = Workload(base, BITS, classes, batch=8, seed=5, pool=6, stats=False, wire="json")
    as_binary = Workload(base, BITS, classes, batch=8, seed=5, pool=6, wire="binary",
                         stats=False)
    with httpx.Client(base_url=server.url,
                      headers={"authorization": f"Bearer {READ_KEY}"}) as http:
        answers = {}
        for wire, workload in (("json", as_json), ("binary", as_binary)):
            answers[wire] = []
            for i in range(12):
                req = workload[i]
                resp = http.post(f"/v1/indexes/{INDEX}/search", params=req.params,
                                 content=req.body, headers=req.headers)
                assert resp.status_code == 200, resp.text
                answers[wire].append(decode_search(resp))
    assert as_binary[0].headers["content-type"] == "application/octet-stream"
    found = 0
    for (lj, dj, ij, _), (lb, db, ib, _) in zip(answers["json"], answers["binary"]):
        assert np.array_equal(lj, lb) and np.array_equal(ij, ib) and np.array_equal(dj, db)
        found += len(ij)
    assert found > 0


def test_binary_run_reports_what_json_reports_and_no_fake_stats(server, tmp_path, capsys):
    reports = {}
    for wire in ("json", "binary"):
        out = tmp_path / f"{wire}.json"
        assert run_cli(server, "--api-key", READ_KEY, "--wire", wire, "--json", str(out)) == 0
        reports[wire] = json.loads(out.read_text())
    text = capsys.readouterr().out
    assert "measured vs modeled per radius: unavailable" in text
    b, j = reports["binary"], reports["json"]
    assert b["errors"] == 0 and b["params"]["wire"] == "binary" and b["params"]["stats"] is False
    per_class = {e["label"]: e["results_per_query"] for e in j["per_radius"] + j["knn"]}
    assert {e["label"]: e["results_per_query"] for e in b["per_radius"] + b["knn"]} == per_class
    assert b["model"]["available"] is False and "--no-stats" in b["model"]["unavailable"]
    assert "radii" not in b["model"] and "t0" not in b["model"]  # never zeros
    for e in b["per_radius"]:
        assert e["server_lookup_ns"]["p50"] is None and e["empty_fraction"] is None
    out = tmp_path / "bs.json"
    assert run_cli(server, "--api-key", READ_KEY, "--wire", "binary", "--stats",
                   "--json", str(out)) == 0
    assert json.loads(out.read_text())["model"]["available"] is True


def test_an_impossible_threshold_exits_99(server, tmp_path, capsys):
    out = tmp_path / "slo.json"
    rc = run_cli(server, "--api-key", READ_KEY, "--slo", "p99<1ns", "--slo", "error_rate<0.1%",
                 "--json", str(out))
    captured = capsys.readouterr()
    assert rc == SLO_EXIT == 99
    assert "threshold breached: p99<1ns" in captured.err and "error_rate" not in captured.err
    slo = {r["slo"]: r for r in json.loads(out.read_text())["slo"]}
    assert slo["p99<1ns"]["ok"] is False and slo["error_rate<0.1%"]["ok"] is True
    assert run_cli(server, "--api-key", READ_KEY, "--slo", "p99<60s,r1:p50<60s,rps>0",
                   requests=10) == 0


def test_threshold_grammar():
    a, b, c, d = parse_slos("p99<20ms, error_rate<0.1%,r2:p99.9<=5us") + parse_slos("rps>=500")
    assert (a.metric, a.op, a.threshold, a.qclass) == ("p99", "<", 20.0, None)
    assert (b.metric, b.threshold) == ("error_rate", pytest.approx(0.001))
    assert (c.metric, c.op, c.threshold, c.qclass) == ("p99.9", "<=", pytest.approx(0.005), "r2")
    assert (d.metric, d.op, d.threshold) == ("rps", ">=", 500.0)
    assert parse_slos("errors<0.02")[0].metric == "error_rate"
    assert parse_slos("service_p50<2s")[0].threshold == 2000.0
    for bad, says in (("p99<20kg", "unit 'kg'"), ("latency<3ms", "unknown metric"),
                      ("p99=3ms", "not a threshold"), ("r1:rps>3", "not per class"),
                      ("", "no threshold")):
        with pytest.raises(ValueError, match=says):
            parse_slos(bad)
    report = {"latency_ms": {"p99": 12.0}, "service_ms": {"p50": 1.0}, "requests": 200,
              "errors": 1, "achieved_rate": 90.0, "queries_per_s": 90.0,
              "per_radius": [{"label": "r1", "latency_ms": {"p99": None}, "count": 0,
                              "errors": 0}], "knn": []}
    got = {r["slo"]: r["ok"] for r in evaluate_slos(report, parse_slos(
        "p99<20ms,p99<10ms,error_rate<1%,error_rate<=0.4%,rps>100,r1:p99<1s,r9:p99<1s"))}
    assert got == {"p99<20ms": True, "p99<10ms": False, "error_rate<1%": True,
                   "error_rate<=0.4%": False, "rps>100": False, "r1:p99<1s": False,
                   "r9:p99<1s": False}


def made_up(intended_s, latency_ms, status=200, error=None, results=3):
    t = int(intended_s * 1e9)
    return RequestResult("r1", 1, None, 1, t, t, t, t + int(latency_ms * 1e6), status, error,
                         results)


def test_per_second_rows_and_hdr_log_on_made_up_requests(tmp_path):
    results = [made_up(0.5, 100.0),                      # warm-up: left out
               made_up(1.1, 2.0), made_up(1.9, 4.0),      # second 0
               made_up(3.2, 7.0, 503, "HTTP 503"),        # second 2 (second 1 is empty)
               made_up(3.3, 1.0)]
    rows = per_second(results, measure_from_ns=10**9)
    assert [r["second"] for r in rows] == [0, 1, 2]
    assert rows[0] == {"second": 0, "requests": 2, "errors": 0, "latency_p50_ms": 2.0,
                       "latency_p99_ms": 4.0, "latency_max_ms": 4.0, "service_p50_ms": 2.0,
                       "results": 6}
    assert rows[1]["requests"] == 0 and rows[1]["latency_p50_ms"] is None
    assert rows[2]["requests"] == 2 and rows[2]["errors"] == 1 and rows[2]["results"] == 3
    path = tmp_path / "lat.hlog"
    assert write_hdr_log(results, 10**9, path, start_unix_s=1.7e9) == 2
    reader = HistogramLogReader(str(path), HdrHistogram(1, 3_600_000_000, 3))
    counts, maxima = [], []
    while (hist := reader.get_next_interval_histogram()) is not None:
        counts.append(hist.get_total_count())
        maxima.append(hist.get_max_value())
    assert counts == [2, 2] and maxima[0] == pytest.approx(4000, rel=1e-3)
    csv_path = tmp_path / "s.csv"
    write_csv(rows, csv_path)
    lines = csv_path.read_text().splitlines()
    assert lines[0].split(",") == list(CSV_FIELDS) and lines[2] == "1,0,0,,,,,0"


def test_csv_and_hdr_log_of_a_real_run(server, tmp_path, capsys):
    out, csv_path, hlog = tmp_path / "r.json", tmp_path / "s.csv", tmp_path / "l.hlog"
    assert run_cli(server, "--api-key", READ_KEY, "--json", str(out), "--csv", str(csv_path),
                   "--hdr-log", str(hlog)) == 0
    report = json.loads(out.read_text())
    rows = list(csv.DictReader(csv_path.open()))
    assert sum(int(r["requests"]) for r in rows) == report["requests"] == 40
    assert [r["second"] for r in report["per_second"]] == list(range(len(rows)))
    reader = HistogramLogReader(str(hlog), HdrHistogram(1, 3_600_000_000, 3))
    total = 0
    while (hist := reader.get_next_interval_histogram()) is not None:
        total += hist.get_total_count()
    assert total == 40
    spectrum = report["latency_spectrum_ms"]
    assert spectrum["count"] == 40 and spectrum["p0"] <= spectrum["p50"] <= spectrum["p9999"]
    assert "latency spectrum ms: p0" in capsys.readouterr().out
