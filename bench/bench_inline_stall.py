"""How long a small search with a huge answer stalls the event loop (issue 31).

One server (uvicorn in a thread of this process, on 127.0.0.1), one 16-bit index whose code
``abcd`` is held by 39,000 items (plus 1,000 others). A client thread sends radius-0 searches
of ``--queries`` copies of ``abcd`` (one probe per query: ``nq`` probes, ``nq x 39,000`` ids)
while another pings ``GET /healthz`` every 2 ms and records each answer's latency: a search
built and encoded on the event loop delays every ping queued behind it.

Two rules in the same run, interleaved: ``probes only`` (the rule before issue 31: runs inline
when ``nq x probes <= INLINE_MAX_PROBES``; reproduced by lifting ``INLINE_MAX_RESULTS``) and
``answer size`` (the current rule: the answer bound is over ``INLINE_MAX_RESULTS``, so the
search runs in the thread pool). Prints the /healthz latency p50 / p99 / max per rule and the
ratio of the maxima.

    .venv/bin/python bench/bench_inline_stall.py --queries 128 --rounds 3
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

import httpx
import uvicorn

from bucketsearch.app.main import create_app
from bucketsearch.app.routers import search as search_router
from bucketsearch.app.settings import Settings


def serve(data_dir: str, port: int) -> uvicorn.Server:
    app = create_app(Settings(data_dir=data_dir, warmup=False, calibration_queries=0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not start")


def measure(url: str, body: dict, searches: int) -> list[float]:
    """/healthz latencies (ms) while ``searches`` searches run one after the other."""
    done = threading.Event()
    latencies: list[float] = []

    def ping():
        with httpx.Client(base_url=url) as c:
            while not done.is_set():
                t = time.perf_counter()
                c.get("/healthz")
                latencies.append((time.perf_counter() - t) * 1e3)
                time.sleep(0.002)

    pinger = threading.Thread(target=ping)
    pinger.start()
    with httpx.Client(base_url=url, timeout=120) as c:
        for _ in range(searches):
            res = c.post("/v1/indexes/ix/search", json=body)
            assert res.status_code == 200, res.text[:200]
    done.set()
    pinger.join()
    return latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--searches", type=int, default=5, help="searches per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=18431)
    args = ap.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as data:
        server = serve(data, args.port)
        with httpx.Client(base_url=url, timeout=120) as c:
            c.post("/v1/indexes", json={"name": "ix", "bits": 16, "mode": "single"})
            ids = list(range(40_000))
            codes = ["abcd"] * 39_000 + [f"{i:04x}" for i in range(1000)]
            assert c.post("/v1/indexes/ix/items", json={"ids": ids, "codes": codes}
                          ).status_code == 200
            c.post("/v1/indexes/ix/merge")
            c.post("/v1/indexes/ix/search", json={"codes": ["abcd"], "max_distance": 0})
        body = {"codes": ["abcd"] * args.queries, "max_distance": 0}
        current = search_router.INLINE_MAX_RESULTS
        rules = {"probes only": 10**15, "answer size": current}
        found: dict[str, list[float]] = {rule: [] for rule in rules}
        for _ in range(args.rounds):
            for rule, limit in rules.items():  # interleaved
                search_router.INLINE_MAX_RESULTS = limit
                found[rule] += measure(url, body, args.searches)
        search_router.INLINE_MAX_RESULTS = current
        server.should_exit = True
    print(f"radius 0, {args.queries} queries x 39,000 ids = {args.queries * 39_000:,} ids per "
          f"search; /healthz latency (ms) while {args.searches} searches x {args.rounds} "
          "rounds run")
    print("| rule | pings | p50 | p99 | max |")
    print("|---|---|---|---|---|")
    for rule, lat in found.items():
        lat.sort()
        print(f"| {rule} | {len(lat)} | {statistics.median(lat):.2f} | "
              f"{lat[int(0.99 * (len(lat) - 1))]:.2f} | {lat[-1]:.2f} |")
    print(f"max ratio probes-only / answer-size: "
          f"{max(found['probes only']) / max(found['answer size']):.1f}x")


if __name__ == "__main__":
    main()
