"""Benchmark of the load-test client against the real server on a 1M x 64-bit index.

Runs, against one server loaded with the embedded data set (1,000,000 clustered codes):

1. open loop, radius-1 single queries, at each ``--rates`` target (the acceptance figure:
   achieved rate >= 300 req/s);
2. closed loop, radius-1 single queries, ``--concurrency`` workers, with the httpx-aiohttp
   transport and, as the baseline measured in the same run, httpx's own transport;
3. ``wrk`` (Debian's, if installed) on the same requests and connection count: a C client
   whose rate is what the server sustains, to cross-check the Python client's closed-loop
   figure (ratio client / wrk close to 1 means the client is not the bottleneck).

Prints a markdown table of ratios and writes the reports to ``bench/out/loadtest/``.
Usage: ``.venv/bin/python bench/bench_loadtest.py [--n 1000000] [--duration 10]``
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bucketsearch.loadtest import dataset  # noqa: E402
from bucketsearch.loadtest.cli import execute, write_outputs  # noqa: E402
from bucketsearch.loadtest.demo import (INDEX, ServerProcess, calibrate, free_port,  # noqa: E402
                                        load_index)
from bucketsearch.loadtest.runner import RunConfig  # noqa: E402
from bucketsearch.loadtest.workload import QueryClass, Workload  # noqa: E402

WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
bodies = {%s}
counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, "/v1/indexes/%s/search", nil, bodies[(counter %% #bodies) + 1])
end
"""


def lua_string(body: bytes) -> str:
    return '"' + body.decode().replace("\\", "\\\\").replace('"', '\\"') + '"'


def run_wrk(url: str, workload: Workload, connections: int, duration: float, out: Path):
    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    bodies = ", ".join(lua_string(workload[i].body) for i in range(256))
    script = out / "search.lua"
    script.write_text(WRK_SCRIPT % (bodies, INDEX))
    cmd = [wrk, "-t1", f"-c{connections}", f"-d{int(duration)}s", "--latency", "-s",
           str(script), url]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60).stdout
    (out / "wrk.txt").write_text(" ".join(cmd) + "\n" + text)
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", text, re.M))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    return {"rate": float(m.group(1)) if m else None, "latency": lat,
            "non2xx": int(non2xx.group(1)) if non2xx else 0, "cmd": " ".join(cmd)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--rates", default="300,400")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "loadtest")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-loadtest-"))
    (tmp / "data").mkdir()
    packed = dataset.clustered_codes(args.n, 64)
    server = ServerProcess(tmp / "data", free_port(), args.out / "server.log")
    rows = []
    try:
        server.wait_ready()
        t0 = time.monotonic()
        load_index(server.url, packed, 64, say=lambda *a: None)
        print(f"loaded {args.n:,} codes in {time.monotonic() - t0:.1f} s; server {server.url}")
        cal = calibrate(server.url)
        print(f"t0 = {cal and cal.get('t0_ns')} ns/probe")
        workload = Workload(packed, 64, [QueryClass(radius=1)], seed=11)

        def record(name, cfg):
            rep = execute(cfg, workload, 64, {"bench": name})
            write_outputs(rep, args.out / f"{name}.json", None)
            rows.append((name, rep))
            lat = rep["latency_ms"]
            print(f"{name:28s} achieved {rep['achieved_rate']:7.1f} req/s  p50 {lat['p50']:.3g} "
                  f"ms  p99 {lat['p99']:.3g} ms  errors {rep['errors']}  cpu "
                  f"{rep['client']['cpu_share_of_core']:.0%}  warnings {rep['warnings']}")
            return rep

        for rate in [float(r) for r in args.rates.split(",")]:
            record(f"open_r1_{rate:g}", RunConfig(url=server.url, index=INDEX, rate=rate,
                                                   duration=args.duration, progress=False))
        closed = {}
        for transport in ("aiohttp", "httpx"):
            closed[transport] = record(f"closed_r1_c{args.concurrency}_{transport}", RunConfig(
                url=server.url, index=INDEX, mode="closed", concurrency=args.concurrency,
                duration=args.duration, transport=transport, progress=False))
        wrk = run_wrk(server.url, workload, args.concurrency, args.duration, args.out)
        print(f"wrk: {wrk}")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n| run | achieved req/s | target | p50 ms | p99 ms | errors | client CPU |")
    print("|---|---|---|---|---|---|---|")
    for name, rep in rows:
        lat = rep["latency_ms"]
        print(f"| {name} | {rep['achieved_rate']:.1f} | {rep['target_rate'] or '-'} | "
              f"{lat['p50']:.3g} | {lat['p99']:.3g} | {rep['errors']} | "
              f"{rep['client']['cpu_share_of_core']:.0%} |")
    a, h = closed["aiohttp"]["achieved_rate"], closed["httpx"]["achieved_rate"]
    print(f"\nclosed loop, aiohttp / httpx transport: {a / h:.2f}x")
    if wrk and wrk["rate"]:
        print(f"wrk ({wrk['cmd']}): {wrk['rate']:.1f} req/s, latency {wrk['latency']}, "
              f"non-2xx {wrk['non2xx']}; client closed loop / wrk: {a / wrk['rate']:.2f}")
    (args.out / "summary.json").write_text(json.dumps(
        {"runs": {n: {"achieved_rate": r["achieved_rate"], "target_rate": r["target_rate"],
                      "latency_ms": r["latency_ms"], "client": r["client"],
                      "warnings": r["warnings"]} for n, r in rows}, "wrk": wrk}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
