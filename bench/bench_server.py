"""HTTP service vs in-process engine on a 1M x 64-bit index.

1. Batch throughput: a batch of 1,000 radius-2 queries, ``POST /v1/indexes/{name}/search`` over
   HTTP (keep-alive client, JSON with hex codes, timed at the client: encode, send, server,
   decode) vs ``HammingIndex.range_search`` in this process on the same codes. Reported as
   queries per second and their ratio (acceptance: HTTP >= 70% of in-process).
2. Latency: one radius-1 query per request, p50 over many requests, vs the in-process p50 of
   ``range_search`` on one query (acceptance: HTTP p50 <= in-process p50 + 1 ms).

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from index.codes import to_hex  # noqa: E402
from index.probe import HammingIndex  # noqa: E402

BITS = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(data_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "BUCKETSEARCH_DATA_DIR": str(data_dir),
           "BUCKETSEARCH_MERGE_THRESHOLD": str(10**9), "BUCKETSEARCH_MAX_BATCH": "200000",
           "BUCKETSEARCH_MAX_BODY_BYTES": str(256 << 20)}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory",
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
    inproc_batch = []
    if args.separate:
        inproc_batch = timed(lambda: idx.range_search(batch_q, 2), args.batch_repeats)

    # ---------------------------------------------------------------- HTTP
    tmp = Path(tempfile.mkdtemp(prefix="bench_server_"))
    port = free_port()
    proc = start_server(tmp / "data", port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as c:
            assert c.post("/v1/indexes", json={"name": "bench", "bits": BITS}).status_code == 201
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
            batch_body = {"codes": batch_hex, "max_distance": 2}
            for _ in range(3):  # warm-up
                r = c.post("/v1/indexes/bench/search", json=batch_body)
                r.raise_for_status()
            hits_http = sum(len(res["ids"]) for res in r.json()["results"])
            assert hits_http == hits_inproc, (hits_http, hits_inproc)
            timings = []

            def one_batch():
                resp = c.post("/v1/indexes/bench/search", json=batch_body)
                resp.raise_for_status()
                resp.json()
                timings.append(resp.headers["server-timing"])

            # interleaved A/B timing (in-process, then HTTP, repeated) so that load from other
            # processes on the machine hits both sides alike
            # the same batch with the standard library's keep-alive client: JSON encode, send,
            # receive, JSON decode, without httpx's own per-request work
            lean = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            lean.connect()
            lean.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def one_batch_lean():
                lean.request("POST", "/v1/indexes/bench/search", json.dumps(batch_body),
                             {"Content-Type": "application/json"})
                resp = lean.getresponse()
                assert resp.status == 200
                json.loads(resp.read())

            http_batch, lean_batch = [], []
            for _ in range(args.batch_repeats):
                if not args.separate:
                    inproc_batch += timed(lambda: idx.range_search(batch_q, 2), 1)
                http_batch += timed(one_batch, 1)
                lean_batch += timed(one_batch_lean, 1)
            lean.close()
            inproc_single, http_single = [], []
            for i, h in enumerate(single_hex):
                q = single_q[i:i + 1]
                t = time.perf_counter()
                idx.range_search(q, 1)
                inproc_single.append(time.perf_counter() - t)
                body = {"codes": [h], "max_distance": 1}
                t = time.perf_counter()
                resp = c.post("/v1/indexes/bench/search", json=body)
                resp.json()
                http_single.append(time.perf_counter() - t)
                assert resp.status_code == 200
        # the same single queries with the standard library's keep-alive client (much less
        # client-side overhead than httpx: closer to what the server itself adds)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        raw_single = []
        for h in single_hex:
            payload = json.dumps({"codes": [h], "max_distance": 1})
            t = time.perf_counter()
            conn.request("POST", "/v1/indexes/bench/search", payload,
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            json.loads(resp.read())
            raw_single.append(time.perf_counter() - t)
            assert resp.status == 200
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    med_in, med_http = statistics.median(inproc_batch), statistics.median(http_batch)
    p50_in, p50_http = statistics.median(inproc_single), statistics.median(http_single)
    p50_raw = statistics.median(raw_single)
    server_parts = {}
    for header in timings:
        for part in header.split(","):
            name, dur = part.strip().split(";dur=")
            server_parts.setdefault(name, []).append(float(dur))
    result = {
        "params": vars(args), "build_in_process_s": build_s, "load_over_http_s": load_s,
        "load_average": os.getloadavg(), "cpus": os.cpu_count(),
        "batch": {"in_process_qps": args.batch / med_in, "http_qps": args.batch / med_http,
                  "ratio_http_over_in_process": med_in / med_http,
                  "stdlib_client_qps": args.batch / statistics.median(lean_batch),
                  "ratio_stdlib_client_over_in_process": med_in / statistics.median(lean_batch),
                  "in_process_median_ms": med_in * 1e3, "http_median_ms": med_http * 1e3,
                  "server_timing_median_ms": {k: statistics.median(v)
                                              for k, v in server_parts.items()},
                  "hits": hits_inproc},
        "single_radius1": {"in_process_p50_ms": p50_in * 1e3, "http_p50_ms": p50_http * 1e3,
                           "http_minus_in_process_ms": (p50_http - p50_in) * 1e3,
                           "stdlib_client_p50_ms": p50_raw * 1e3,
                           "stdlib_client_minus_in_process_ms": (p50_raw - p50_in) * 1e3,
                           "http_p90_ms": float(np.percentile(http_single, 90)) * 1e3,
                           "in_process_p90_ms": float(np.percentile(inproc_single, 90)) * 1e3},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    b, s = result["batch"], result["single_radius1"]
    print(f"index: {args.n:,} x {BITS}-bit codes (in-process build {build_s:.1f} s, "
          f"HTTP load + merge {load_s:.1f} s)")
    print(f"batch of {args.batch} radius-2 queries: in-process {b['in_process_qps']:,.0f} q/s, "
          f"HTTP (httpx) {b['http_qps']:,.0f} q/s -> ratio {b['ratio_http_over_in_process']:.2f}, "
          f"HTTP (http.client) {b['stdlib_client_qps']:,.0f} q/s -> ratio "
          f"{b['ratio_stdlib_client_over_in_process']:.2f} (acceptance >= 0.70); "
          f"server parts (ms, median): {b['server_timing_median_ms']}")
    print(f"single radius-1 query p50: in-process {s['in_process_p50_ms']:.3f} ms, HTTP "
          f"(httpx) {s['http_p50_ms']:.3f} ms -> +{s['http_minus_in_process_ms']:.3f} ms, "
          f"HTTP (http.client) {s['stdlib_client_p50_ms']:.3f} ms -> "
          f"+{s['stdlib_client_minus_in_process_ms']:.3f} ms (acceptance <= +1 ms)")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
