"""HTTP service vs in-process engine on a 1M x 64-bit index.

1. Batch throughput: a batch of 1,000 radius-2 queries, ``POST /v1/indexes/{name}/search`` over
   HTTP, timed at the client (encode, send, server, receive, decode the answer), vs
   ``HammingIndex.range_search`` in this process on the same codes. Reported as queries per
   second and their ratio (acceptance: HTTP >= 70% of in-process) for five keep-alive clients:
   ``httpx_json`` (httpx, JSON body of hex codes), ``httpx_binary`` (httpx, octet-stream both
   ways), ``stdlib_json`` (http.client, the same JSON body, orjson), ``stdlib_raw``
   (http.client, octet-stream body of packed codes, JSON answer decoded with orjson) and
   ``stdlib_binary`` (http.client, octet-stream both ways: ``Accept:
   application/octet-stream``). Every client's answers are checked equal to the in-process ids.
2. Latency: one radius-1 query per request, p50 over many requests, vs the in-process p50 of
   ``range_search`` on one query (acceptance: HTTP p50 <= in-process p50 + 1 ms), same clients.

Data: uniform random codes (the worst case for probing: almost every probe hits an empty
bucket); queries are database codes with one bit flipped, so every query finds its source.
The server is a real uvicorn subprocess; the items go in as raw octet-stream batches followed
by one merge. Both sides run on the same machine and share its cores with the client.

    .venv/bin/python bench/bench_server.py                 # 1M items (about 1-2 minutes)
    .venv/bin/python bench/bench_server.py --n 100000      # quicker
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bucketsearch.loadtest.wire import decode_binary_results as decode_results_binary  # noqa: E402
from bucketsearch.index.codes import to_hex  # noqa: E402
from bucketsearch.index.probe import HammingIndex  # noqa: E402

BITS = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(data_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "BUCKETSEARCH_DATA_DIR": str(data_dir),
           "BUCKETSEARCH_MERGE_THRESHOLD": str(10**9), "BUCKETSEARCH_MAX_BATCH": "200000",
           "BUCKETSEARCH_MAX_BODY_BYTES": str(256 << 20)}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "bucketsearch.app.main:create_app",
                             "--factory",
                             "--host", "127.0.0.1", "--port", str(port), "--log-level",
                             "warning"], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not become ready")


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--batch-repeats", type=int, default=21)
    ap.add_argument("--single-requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--separate", action="store_true",
                    help="time the in-process batches first and drop that index before the HTTP "
                         "phase (no second 1M index in the client process during HTTP timing)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "bench_server.json"))
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    words = rng.integers(0, 2**64, size=(args.n, 1), dtype=np.uint64)
    ids = np.arange(args.n, dtype=np.int64)
    src = rng.integers(0, args.n, size=args.batch + args.single_requests)
    flips = np.left_shift(np.uint64(1), rng.integers(0, 64, size=len(src)).astype(np.uint64))
    xq = words[src] ^ flips[:, None]
    batch_q, single_q = xq[:args.batch], xq[args.batch:]
    batch_hex, single_hex = to_hex(batch_q, BITS), to_hex(single_q, BITS)

    # ---------------------------------------------------------------- in-process baseline
    t = time.perf_counter()
    idx = HammingIndex(BITS)
    idx.add(words, ids=ids)
    build_s = time.perf_counter() - t
    idx.range_search(batch_q[:32], 2)  # compile / warm
    found = idx.range_search(batch_q, 2)
    hits_inproc = int(found[0][-1])
    expected_ids = [found[2][a:b].tolist() for a, b in zip(found[0][:-1], found[0][1:])]
    inproc_batch = []
    if args.separate:
        inproc_batch = timed(lambda: idx.range_search(batch_q, 2), args.batch_repeats)

    # ---------------------------------------------------------------- HTTP
    tmp = Path(tempfile.mkdtemp(prefix="bench_server_"))
    port = free_port()
    proc = start_server(tmp / "data", port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as c:
            assert c.post("/v1/indexes", json={"name": "bench", "bits": BITS, "mode": "single"}) \
                .status_code == 201  # the mode of the RESULTS.md figures
            t = time.perf_counter()
            step = 200_000
            for a in range(0, args.n, step):
                body = ids[a:a + step].astype("<i8").tobytes() + \
                    words[a:a + step].astype(">u8").tobytes()
                r = c.post("/v1/indexes/bench/items", content=body,
                           headers={"content-type": "application/octet-stream"})
                r.raise_for_status()
            r = c.post("/v1/indexes/bench/merge")
            r.raise_for_status()
            load_s = time.perf_counter() - t
            assert r.json()["main_size"] == args.n
            # four clients on keep-alive connections (see the module docstring); the answer is
            # JSON except for stdlib_binary
            lean = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            lean.connect()
            lean.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            url = "/v1/indexes/bench/search"

            def via_httpx(hexes, packed, radius):
                r = c.post(url, json={"codes": hexes, "max_distance": radius})
                r.raise_for_status()
                return r.json()["results"], r.headers["server-timing"]

            def via_httpx_binary(hexes, packed, radius):
                r = c.post(f"{url}?max_distance={radius}", content=packed.astype(">u8").tobytes(),
                           headers={"content-type": "application/octet-stream",
                                    "accept": "application/octet-stream"})
                r.raise_for_status()
                lims, _, ids = decode_results_binary(r.content)
                return ([{"ids": ids[a:b]} for a, b in zip(lims[:-1], lims[1:])],
                        r.headers["server-timing"])

            def via_stdlib(path, body, ctype, accept="application/json"):
                lean.request("POST", path, body, {"Content-Type": ctype, "Accept": accept})
                r = lean.getresponse()
                raw = r.read()
                assert r.status == 200, raw[:300]
                if accept == "application/octet-stream":
                    lims, _, ids = decode_results_binary(raw)
                    results = [{"ids": ids[a:b]} for a, b in zip(lims[:-1], lims[1:])]
                else:
                    results = orjson.loads(raw)["results"]
                return results, r.getheader("server-timing")

            def via_stdlib_json(hexes, packed, radius):
                return via_stdlib(url, orjson.dumps({"codes": hexes, "max_distance": radius}),
                                  "application/json")

            def via_stdlib_raw(hexes, packed, radius):
                return via_stdlib(f"{url}?max_distance={radius}", packed.astype(">u8").tobytes(),
                                  "application/octet-stream")

            def via_stdlib_binary(hexes, packed, radius):
                return via_stdlib(f"{url}?max_distance={radius}", packed.astype(">u8").tobytes(),
                                  "application/octet-stream", "application/octet-stream")

            clients = {"httpx_json": via_httpx, "httpx_binary": via_httpx_binary,
                       "stdlib_json": via_stdlib_json,
                       "stdlib_raw": via_stdlib_raw, "stdlib_binary": via_stdlib_binary}
            for name, send in clients.items():
                for _ in range(3):  # warm-up, and every client gets the in-process results
                    results, _ = send(batch_hex, batch_q, 2)
                assert [list(res["ids"]) for res in results] == expected_ids, name

            # interleaved A/B timing (in-process, then each client, repeated) so that load from
            # other processes on the machine hits every side alike
            batch_times = {"in_process": inproc_batch, **{name: [] for name in clients}}
            timings = []
            for _ in range(args.batch_repeats):
                if not args.separate:
                    batch_times["in_process"] += timed(lambda: idx.range_search(batch_q, 2), 1)
                for name, send in clients.items():
                    t = time.perf_counter()
                    _, server_timing = send(batch_hex, batch_q, 2)
                    batch_times[name].append(time.perf_counter() - t)
                    if name == "stdlib_raw":
                        timings.append(server_timing)
            single_times = {"in_process": [], **{name: [] for name in clients}}
            for i, h in enumerate(single_hex):
                q = single_q[i:i + 1]
                single_times["in_process"] += timed(lambda: idx.range_search(q, 1), 1)
                for name, send in clients.items():
                    t = time.perf_counter()
                    send([h], q, 1)
                    single_times[name].append(time.perf_counter() - t)
            lean.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    server_parts = {}
    for header in timings:
        for part in header.split(","):
            name, dur = part.strip().split(";dur=")
            server_parts.setdefault(name, []).append(float(dur))
    med_batch = {k: statistics.median(v) for k, v in batch_times.items()}
    p50_single = {k: statistics.median(v) for k, v in single_times.items()}
    result = {
        "params": vars(args), "build_in_process_s": build_s, "load_over_http_s": load_s,
        "load_average": os.getloadavg(), "cpus": os.cpu_count(),
        "batch": {"qps": {k: args.batch / v for k, v in med_batch.items()},
                  "median_ms": {k: v * 1e3 for k, v in med_batch.items()},
                  "ratio_over_in_process": {k: med_batch["in_process"] / v
                                            for k, v in med_batch.items() if k in clients},
                  "server_timing_median_ms_stdlib_raw": {
                      k: statistics.median(v) for k, v in server_parts.items()},
                  "hits": hits_inproc},
        "single_radius1": {"p50_ms": {k: v * 1e3 for k, v in p50_single.items()},
                           "p50_minus_in_process_ms": {
                               k: (v - p50_single["in_process"]) * 1e3
                               for k, v in p50_single.items() if k in clients},
                           "p90_ms": {k: float(np.percentile(v, 90)) * 1e3
                                      for k, v in single_times.items()}},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    b, s = result["batch"], result["single_radius1"]
    print(f"index: {args.n:,} x {BITS}-bit codes (in-process build {build_s:.1f} s, "
          f"HTTP load + merge {load_s:.1f} s); load average {os.getloadavg()[0]:.2f}")
    print(f"batch of {args.batch} radius-2 queries, median of {args.batch_repeats} "
          "(acceptance: HTTP >= 0.70 of in-process q/s):")
    print(f"  {'in_process':13s} {b['median_ms']['in_process']:8.2f} ms "
          f"{b['qps']['in_process']:10,.0f} q/s")
    for name in clients:
        print(f"  {name:13s} {b['median_ms'][name]:8.2f} ms {b['qps'][name]:10,.0f} q/s  "
              f"ratio {b['ratio_over_in_process'][name]:.2f}")
    print(f"  server parts, stdlib_raw (ms, median): {b['server_timing_median_ms_stdlib_raw']}")
    print("single radius-1 query p50 (acceptance: HTTP <= in-process + 1 ms):")
    print(f"  {'in_process':13s} {s['p50_ms']['in_process']:8.3f} ms")
    for name in clients:
        print(f"  {name:13s} {s['p50_ms'][name]:8.3f} ms  "
              f"+{s['p50_minus_in_process_ms'][name]:.3f} ms")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
