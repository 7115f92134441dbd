"""The load-test client against the real server on 127.0.0.1 (subprocesses, short runs).

* a real ``bucketsearch serve`` loaded with 20,000 clustered codes: the CLI's JSON report has
  every field, the exact probe counts, radius queries that find their source code, no errors;
  closed loop stops by itself at ``--requests``; several client processes; CLI errors;
* the real server deliberately slowed (an ASGI wrapper around ``bucketsearch.app.main:create_app``
that holds
  every request arriving during a 250 ms window of each second; toggled at run time): open-loop
  latencies grow, closed-loop ones do not, and with one connection the open loop's latency
  (from the intended send) grows while its service time does not;
* the demo cleans up its server when it receives SIGTERM.

The only wall-clock comparisons are the slowed-server ratios, with wide margins.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import helpers
import httpx
import pytest

from bucketsearch.loadtest import dataset
from bucketsearch.loadtest.cli import execute, main
from bucketsearch.loadtest.demo import INDEX, ServerProcess, free_port, load_index
from bucketsearch.loadtest.runner import RunConfig
from bucketsearch.loadtest.workload import QueryClass, Workload

ROOT = helpers.ROOT
N_CODES = 20_000
BITS = 64

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: make test-long


@pytest.fixture(scope="module")
def codes():
    return dataset.clustered_codes(N_CODES, BITS, seed=7)


@pytest.fixture(scope="module")
def server(tmp_path_factory, codes):
    tmp = tmp_path_factory.mktemp("server")
    (tmp / "data").mkdir()
    srv = ServerProcess(tmp / "data", free_port(), tmp / "server.log")
    try:
        srv.wait_ready()
        load_index(srv.url, codes, BITS, say=lambda *a: None)
        yield srv
    finally:
        srv.stop()


def test_cli_report_against_real_server(server, tmp_path, capsys):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["--url", server.url, "--index", INDEX, "--mode", "open", "--rate", "60",
               "--duration", "2", "--warmup", "0.5", "--radii", "0,1,2", "--knn", "1",
               "--seed", "5", "--no-progress",
               "--json", str(out_json), "--plot", str(out_png)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "measured vs modeled" in text and str(out_json) in text
    report = json.loads(out_json.read_text())
    for key in ("params", "versions", "achieved_rate", "target_rate", "errors", "status_codes",
                "per_radius", "model"):
        assert key in report
    assert report["errors"] == 0 and set(report["status_codes"]) == {"200"}
    assert report["target_rate"] == 60 and report["achieved_rate"] > 0
    assert report["params"]["rate"] == 60 and report["params"]["seed"] == 5
    assert report["versions"]["httpx-aiohttp"] and report["versions"]["hdrhistogram"]
    assert report["requests"] > 0 and report["warmup_requests"] > 0
    per = {e["radius"]: e for e in report["per_radius"]}
    assert sorted(per) == [0, 1, 2]
    for r, e in per.items():
        # the server's probe count is exactly sum_{i<=r} C(64, i) for every query
        assert e["probes"] == sum(math.comb(BITS, i) for i in range(r + 1))
        assert e["count"] > 0 and e["server_lookup_ns"]["p50"] > 0
        assert set(e["latency_ms"]) >= {"p50", "p90", "p99", "p999", "max"}
        assert e["latency_ms"]["p50"] <= e["latency_ms"]["p99"] <= e["latency_ms"]["max"]
        # queries are index codes (sampled from the server) with exactly r flipped bits: each
        # finds at least its source
        assert e["results_per_query"] >= 1
        assert e["paper_ns"] == pytest.approx(report["model"]["modeled_with"]["t0_ns"]
                                              * e["sum_c"]) and e["sum_c"] == e["probes"]
        assert e["engines"] == {"single": e["queries"]}
    # 1M-sparse codes: almost every probed bucket at radius 2 is empty
    assert per[2]["empty_fraction"] > 0.9
    assert report["knn"][0]["label"] == "knn1" and report["knn"][0]["results_per_query"] == 1
    model = report["model"]
    assert model["t0_ns"] > 0 and model["modeled_with"]["estimator"] == "radius_fit"
    # the paper's model of the measured range queries (all single-table here; k-NN ones are
    # their own class): the rings 0..2 exactly as the radius classes searched them
    assert [r["radius"] for r in model["radii"]] == [0, 1, 2]
    assert model["radii"][0]["queries"] == model["paper_scope"]["queries"] == \
        sum(e["queries"] for e in report["per_radius"])
    assert model["sample"]["queries_seen"] == \
        sum(e["queries"] for e in report["per_radius"] + report["knn"])
    assert [r["paper_ratio"] for r in model["radii"]] == [1, 65, 2081]
    assert {e["estimator"] for e in model["t0"]} == {"radius_fit", "query_model.probes"}
    assert all({"source", "estimator"} <= set(e) for e in model["server"]["estimates"])
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def _check_engines(engines: dict, largest_radius: int, knn_label: str) -> list[str]:
    """The acceptance checks of one cost model of what ran (load tester or /cost-model): every
    product column is its product, measured/modeled within 1/2..2 wherever the verdict says
    "holds", a verdict for every engine that ran, no row above the largest radius searched,
    k-NN rows with work and time. Returns the verdict sentences."""
    t0 = engines["paper_t0_ns"]  # None for an mih index: no single table, no paper t0
    rows = engines["rows"]
    for r in rows:
        if r["k"] == 0:
            assert r["sum_c"] == sum(math.comb(BITS, i) for i in range(r["radius"] + 1))
            assert r["paper_ns"] == (None if t0 is None else
                                     pytest.approx(t0 * r["sum_c"], rel=1e-12))
        ratio = r["measured_over_modeled"]
        assert r["holds"] == (0.5 <= ratio <= 2), r
    assert max(r["radius"] for r in rows if r["k"] == 0) == largest_radius
    knn = [r for r in rows if r["k"]]
    assert knn and {r["class"] for r in knn} == {knn_label}
    for r in knn:
        assert r["measured_p50_ns"] > 0 and r["modeled_p50_ns"] > 0
        assert r["mean_probes"] + r["mean_codes_compared"] > 0 and r["mean_items"] > 0
    verdicts = engines["verdicts"]
    for engine in {r["engine"] for r in rows}:
        assert engine in verdicts["engines"] and engines["models"][engine]["terms"]
        for cls, v in verdicts["engines"][engine].items():
            assert any(s.startswith(f"{cls}: ") and f"ran {engine}" in s
                       for s in verdicts["summary"])
    return verdicts["summary"]


@pytest.mark.parametrize("mode", ["auto", "mih", "single"])
def test_measured_against_modeled_for_every_mode(server, codes, tmp_path, mode):
    """Issue 26's acceptance: range classes r = 0..4 and a k-NN class against an auto, an mih
    and a single index, the load tester's report and the server's /cost-model."""
    name = f"accept_{mode}"
    with httpx.Client(base_url=server.url, timeout=300) as c:
        assert c.post("/v1/indexes", json={"name": name, "bits": BITS,
                                           "mode": mode}).status_code == 201
        for start in range(0, len(codes), 5000):
            r = c.post(f"/v1/indexes/{name}/items", params={"first_id": start},
                       content=codes[start:start + 5000].tobytes(),
                       headers={"content-type": "application/octet-stream"})
            assert r.status_code == 200, r.text
        assert c.post(f"/v1/indexes/{name}/merge").status_code == 200
    out = tmp_path / "r.json"
    assert main(["--url", server.url, "--index", name, "--mode", "closed", "--concurrency", "2",
                 "--requests", "400", "--duration", "60", "--warmup", "0.5", "--radii", "0-4",
                 "--knn", "10", "--stats", "--seed", "5", "--no-progress",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["errors"] == 0
    summary = _check_engines(report["model"]["engines"], 4, "knn10")
    ran = {r["engine"] for r in report["model"]["engines"]["rows"] if r["k"] == 0}
    if mode != "auto":
        assert ran == {mode}
    if "single" not in ran:
        assert report["model"]["paper_scope"]["queries"] == 0 and "radii" not in report["model"]
        assert any("outside the paper's model" in s for s in summary)
    else:
        assert max(r["radius"] for r in report["model"]["radii"]) <= 4
    cm = httpx.get(f"{server.url}/v1/indexes/{name}/cost-model", timeout=60).json()
    _check_engines(cm["engines"], 4, "knn10")
    assert all(r["radius"] <= 4 for r in cm["radii"])


def test_closed_loop_stops_at_request_count(server, codes):
    cfg = RunConfig(url=server.url, index=INDEX, mode="closed", concurrency=3, duration=60,
                    requests=150, warmup=0, progress=False)
    workload = Workload(codes, BITS, [QueryClass(radius=1)], batch=4, seed=1, pool=16)
    t0 = time.monotonic()
    report = execute(cfg, workload, BITS)
    assert time.monotonic() - t0 < 50          # stopped by the count, not the 60 s duration
    # each worker checks the count before sending: at most concurrency - 1 extra in flight
    assert 150 <= report["requests"] <= 152
    assert report["queries_per_s"] == pytest.approx(4 * report["achieved_rate"])
    assert report["errors"] == 0 and report["target_rate"] is None
    assert report["per_radius"][0]["queries"] == 4 * report["per_radius"][0]["count"]


def test_two_client_processes_share_the_rate(server, codes):
    cfg = RunConfig(url=server.url, index=INDEX, mode="open", rate=80, duration=1.5, warmup=0.3,
                    processes=2, progress=False)
    workload = Workload(codes, BITS, [QueryClass(radius=0), QueryClass(radius=1)], seed=2,
                        pool=16)
    report = execute(cfg, workload, BITS)
    assert report["errors"] == 0
    assert len(report["client"]["cpu_s"]) == 2
    # 80/s for 1.5 s from two interleaved schedules: 120 measured requests (+-2 at the edges)
    assert abs(report["requests"] - 120) <= 2
    assert {e["radius"] for e in report["per_radius"]} == {0, 1}


def test_cli_errors_are_one_line(server, capsys):
    port = free_port()
    rc = main(["--url", f"http://127.0.0.1:{port}", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "\n" not in err and "cannot reach the server" in err
    rc = main(["--url", server.url, "--index", "nope", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "'nope' does not exist" in err
    for argv, flag in ((["--rate", "-5"], "--rate"), (["--radii", "1,x"], "--radii"),
                       (["--mode", "half"], "--mode"), (["--batch", "0"], "--batch")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert flag in capsys.readouterr().err


# -- the deliberately slowed server -----------------------------------------------------------
SLOWED_APP = textwrap.dedent('''
    """The real app behind a wrapper holding requests that arrive in a stall window."""
    import asyncio, json, time
    from bucketsearch.app.main import create_app

    def create():
        inner = create_app()
        state = {"stall": 0.0, "period": 1.0, "t0": time.monotonic()}

        async def app(scope, receive, send):
            if scope["type"] == "http" and scope["path"] == "/__stall__":
                q = dict(p.split("=") for p in scope["query_string"].decode().split("&") if p)
                state["stall"] = float(q.get("ms", 0)) / 1000
                state["period"] = float(q.get("period_ms", 1000)) / 1000
                state["t0"] = time.monotonic()
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": json.dumps(state).encode()})
                return
            if scope["type"] == "http" and state["stall"] > 0:
                phase = (time.monotonic() - state["t0"]) % state["period"]
                if phase < state["stall"]:
                    await asyncio.sleep(state["stall"] - phase)
            await inner(scope, receive, send)
        return app
''')


@pytest.fixture(scope="module")
def slowed_server(tmp_path_factory, codes):
    tmp = tmp_path_factory.mktemp("slowed")
    (tmp / "slowed.py").write_text(SLOWED_APP)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)])}  # slowed.py and the package
    srv = helpers.ServerProcess(tmp / "data", env, log_path=tmp / "server.log",
                                app="slowed:create")
    try:
        srv.start()
        load_index(srv.url, codes[:5000], BITS, say=lambda *a: None)
        yield srv.url
    finally:
        srv.stop()


def _p90(url, codes, mode, stall_ms, max_inflight=64):
    httpx.get(f"{url}/__stall__?ms={stall_ms}&period_ms=1000").raise_for_status()
    cfg = RunConfig(url=url, index=INDEX, mode=mode, rate=40, concurrency=1,
                    max_inflight=max_inflight, duration=3.0, warmup=0.5, progress=False)
    workload = Workload(codes[:5000], BITS, [QueryClass(radius=1)], seed=3, pool=16)
    report = execute(cfg, workload, BITS, fetch_cost_model=False)
    assert report["errors"] == 0
    return report["latency_ms"]["p90"], report["service_ms"]["p90"]


def test_slowed_server_open_loop_latency_grows_closed_loop_does_not(slowed_server, codes):
    url = slowed_server
    open_fast, _ = _p90(url, codes, "open", 0)
    closed_fast, _ = _p90(url, codes, "closed", 0)
    open_slow, _ = _p90(url, codes, "open", 250)
    closed_slow, _ = _p90(url, codes, "closed", 250)
    print(f"p90 ms: open {open_fast:.3g} -> {open_slow:.3g}, closed {closed_fast:.3g} -> "
          f"{closed_slow:.3g}")
    # a quarter of the open loop's requests arrive in a stall and wait ~0-250 ms: p90 >= ~150
    # ms; the closed loop sends one request per stall among hundreds: its p90 barely moves
    assert open_slow > 50, (open_fast, open_slow, closed_fast, closed_slow)
    assert open_slow / open_fast > 5, (open_fast, open_slow, closed_fast, closed_slow)
    assert closed_slow / closed_fast < 3 or closed_slow < 20, \
        (open_fast, open_slow, closed_fast, closed_slow)
    assert open_slow / closed_slow > 3, (open_fast, open_slow, closed_fast, closed_slow)


def test_slowed_server_correction_with_one_connection(slowed_server, codes):
    # one connection: requests scheduled during a stall wait in the client, not the server,
    # so their service time stays short and only the corrected latency shows the stall
    latency_p90, service_p90 = _p90(slowed_server, codes, "open", 250, max_inflight=1)
    print(f"one connection, p90 ms: latency {latency_p90:.3g}, service {service_p90:.3g}")
    assert latency_p90 > 50 and latency_p90 / service_p90 > 3, (latency_p90, service_p90)


# -- the demo cleans up -----------------------------------------------------------------------
def test_demo_stops_its_server_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "bucketsearch.loadtest.demo", "--n", "20000",
                             "--duration", "60", "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True, text=True)
    url = None
    lines = []
    try:
        deadline = time.monotonic() + 200
        for line in proc.stdout:
            lines.append(line)
            m = re.search(r"(http://127\.0\.0\.1:\d+) ready", line)
            if m:
                url = m.group(1)
            if "load test 'mixed'" in line:
                break
            assert time.monotonic() < deadline, "".join(lines)
        assert url, "".join(lines)
        time.sleep(1.0)
        assert httpx.get(url + "/readyz", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        lines.append(rest)
        assert proc.returncode == 130, "".join(lines)
        assert "interrupted" in rest
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/readyz", timeout=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
