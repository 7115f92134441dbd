"""One server holding N codes (issue 28, item 5): a bulk load over the binary wire, the resident
memory of the server process, a restart to ready from its snapshot, and answers checked exact
on a sample against a popcount scan of the codes.

    .venv/bin/python bench/bench_serve_scale.py                     # 10M uniform 64-bit, auto
    .venv/bin/python bench/bench_serve_scale.py --n 100000000       # 100M on request
    .venv/bin/python bench/bench_serve_scale.py --n 2000000 --mode single   # quicker

Steps, each printed with its time: a real server (``bucketsearch.app.main:create_app`` under
uvicorn, default settings but a 256 MiB body limit and the batch size given) in a fresh data
directory; ``Client.add`` of N uniform codes (ids 0..N-1) with its progress bar; waiting until
the index state's ``merge`` is ``none`` and ``/readyz`` counts no pending merge; the server's
resident memory (``VmRSS`` and ``VmHWM``, the peak, of its process) and the index's
``memory_bytes``; ``--queries`` radius-R searches and k-NN searches (k = 10) of near queries (a
stored code with 3 bits flipped), each compared with a popcount scan (numpy) of the codes; a
graceful stop (SIGTERM), a start on the same data directory and the time until ``/readyz``
answers 200; the resident memory again and the same queries again. The acceptance line of
issue 28 for N = 100M in mode ``auto``: resident <= 6 GB, restart to ready <= 30 s, answers
exact.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_server import Server  # noqa: E402

from bucketsearch.index.codes import to_hex  # noqa: E402
from bucketsearch.loadtest.client import Client  # noqa: E402

BITS = 64


def rss_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` (resident now) and ``VmHWM`` (the peak) of process ``pid``, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def scan_answers(words: np.ndarray, q: int, radius: int, k: int) -> tuple[set, list]:
    """Brute force: the ids within ``radius`` of ``q`` and the k nearest (distance, id),
    ties by id (ids are positions here)."""
    d = np.bitwise_count(words ^ np.uint64(q))
    within = set(np.flatnonzero(d <= radius).tolist())
    cut = np.partition(d, k - 1)[k - 1]
    near = np.flatnonzero(d <= cut)
    order = np.lexsort((near, d[near]))[:k]
    return within, [(int(d[near[i]]), int(near[i])) for i in order]


def check(client: Client, name: str, words: np.ndarray, queries: np.ndarray, radius: int,
          k: int) -> tuple[int, str, str]:
    """Queries answered by the server against the scan: (mismatches, and the round trips of
    the range and the k-NN searches: the first one's ms, then the median and the largest of
    the others'; a first search after a load or a restart may touch what no other does)."""
    bad, range_ms, knn_ms = 0, [], []
    for q in queries:
        within, nearest = scan_answers(words, int(q), radius, k)
        t = time.perf_counter()
        _, _, ids = client.range_search(name, q.reshape(1, 1), max_distance=radius)
        range_ms.append(1e3 * (time.perf_counter() - t))
        t = time.perf_counter()
        dist, knn_ids = client.search(name, q.reshape(1, 1), k=k)
        knn_ms.append(1e3 * (time.perf_counter() - t))
        got_knn = list(zip(dist[0].tolist(), knn_ids[0].tolist()))
        if set(ids.tolist()) != within:
            bad += 1
            print(f"  query {int(q):016x} radius {radius}: {len(ids)} ids, the scan "
                  f"{len(within)}; missing {sorted(within - set(ids.tolist()))[:5]}, extra "
                  f"{sorted(set(ids.tolist()) - within)[:5]}", flush=True)
        if got_knn != nearest:
            bad += 1
            print(f"  query {int(q):016x} k={k}: {got_knn[:5]}..., the scan {nearest[:5]}...",
                  flush=True)
    return bad, _times(range_ms), _times(knn_ms)


def _times(ms: list[float]) -> str:
    rest = ms[1:] or ms
    return f"first {ms[0]:.2f} ms, then median {np.median(rest):.2f} max {max(rest):.2f}"


def start(data: Path, cwd: Path, batch: int) -> Server:
    env = {"BUCKETSEARCH_DATA_DIR": str(data), "BUCKETSEARCH_MAX_BODY_BYTES": str(256 << 20),
           "BUCKETSEARCH_MAX_BATCH": str(batch), "PYTHONPATH": ""}
    return Server("scale", "bucketsearch.app.main:create_app", factory=True, cwd=cwd, env=env)


def wait_merged(url: str, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=600) as c:
        while time.monotonic() < deadline:
            merge = c.get(f"/v1/indexes/{name}").json().get("merge")
            if merge == "none" and c.get("/readyz").json().get("merges_pending", 0) == 0:
                return
            time.sleep(0.5)
    raise RuntimeError(f"the merges did not finish within {timeout} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000_000, help="codes loaded")
    ap.add_argument("--mode", default="auto", choices=("auto", "single", "mih", "scan"))
    ap.add_argument("--batch", type=int, default=1_000_000, help="codes per request")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--radius", type=int, default=3)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", help="parent of the data directory (default: the system's tmp)")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    words = rng.integers(0, 2**64 - 1, size=args.n, dtype=np.uint64, endpoint=True)
    queries = words[rng.choice(args.n, args.queries, replace=False)].copy()
    for _ in range(3):
        queries ^= np.uint64(1) << rng.integers(0, BITS, args.queries).astype(np.uint64)
    name, gib = "scale", 1 << 20
    print(f"n = {args.n:,} uniform {BITS}-bit codes, mode {args.mode}; data "
          f"{args.n * 16 / 2**30:.2f} GiB as (code, id); loadavg "
          f"{open('/proc/loadavg').read().split()[0]}", flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        data = Path(tmp) / "data"
        server = start(data, Path(tmp), args.batch)
        try:
            server.wait("/readyz")
            with Client(server.url, timeout=3600) as client:
                client.create_index(name, BITS, mode=args.mode)
                t = time.perf_counter()
                client.add(name, words.reshape(-1, 1), first_id=0, progress=True)
                acked = time.perf_counter() - t
                print(f"load acknowledged in {acked:.1f} s ({args.n / acked / 1e6:.2f}M codes/s)",
                      flush=True)
                wait_merged(server.url, name, args.timeout)
                merged = time.perf_counter() - t
                info = client.index(name)
                mem = rss_kib(server.proc.pid)
                print(f"merged (searchable at full speed) {merged:.1f} s after the load began; "
                      f"memory_bytes {info['memory_bytes'] / args.n:.1f} B/item; server RSS "
                      f"{mem['VmRSS'] / gib:.2f} GiB (peak {mem['VmHWM'] / gib:.2f} GiB)",
                      flush=True)
                bad, range_ms, knn_ms = check(client, name, words, queries, args.radius, args.k)
                print(f"{args.queries} near queries, round trips: radius {args.radius} "
                      f"{range_ms}; k-NN k={args.k} {knn_ms}; answers differing from the "
                      f"scan: {bad}", flush=True)
        finally:
            server.stop()
        t = time.perf_counter()
        server = start(data, Path(tmp), args.batch)
        try:
            server.wait("/readyz", timeout=args.timeout)
            ready = time.perf_counter() - t
            mem = rss_kib(server.proc.pid)
            print(f"restart to /readyz 200: {ready:.1f} s; server RSS {mem['VmRSS'] / gib:.2f} GiB "
                  f"(peak {mem['VmHWM'] / gib:.2f} GiB)", flush=True)
            with Client(server.url, timeout=3600) as client:
                bad2, range_ms, knn_ms = check(client, name, words, queries, args.radius,
                                               args.k)
            print(f"after the restart: radius {args.radius} {range_ms}; k-NN {knn_ms}; "
                  f"answers differing from the scan: {bad2}", flush=True)
        finally:
            server.stop()
    return int(bad + bad2 > 0)


if __name__ == "__main__":
    raise SystemExit(main())
