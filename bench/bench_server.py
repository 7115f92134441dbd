"""HTTP service vs in-process engine vs the HTTP floors, side by side in one run (issue 13 item 4,
issue 12 item 3, issue 11's before/after).

Servers, each a real uvicorn subprocess with the same settings (``--host 127.0.0.1
--log-level warning``, one worker):

* ``raw_asgi`` and ``fastapi_echo``: the floors (``bench/floor_apps.py``): a plain ASGI app, and
  a FastAPI endpoint echoing a small JSON object;
* ``ours``: this tree's server (``bucketsearch.app.main:create_app``);
* ``--compare NAME=TREE`` (repeatable): the server of another checkout, e.g. the tree before a
  change (``git worktree add /tmp/base HEAD``), loaded with the same index.

Measured, every side interleaved with the others request by request, in a seeded random order
per round (so that the load of other processes hits all alike, and no side always follows the
in-process search, which leaves the server's caches cold):

1. **Single radius-1 query** per request, keep-alive ``http.client`` with TCP_NODELAY: p50 and
   p99 for each floor (the JSON body of a one-code search), each server with a JSON body
   (``{"codes": [hex], "max_distance": 1}``) and in binary both ways (octet-stream body,
   ``Accept: application/octet-stream``), ``bucketsearch.Client`` (binary, httpx), and
   ``HammingIndex.range_search`` in process. Target: p50 within 1.25x of ``fastapi_echo``.
2. **Batch** of 1,000 radius-2 queries: ``bucketsearch.Client(...).range_search`` (binary wire,
   the default) and a lean ``http.client`` binary request, vs ``range_search`` in process;
   queries per second and their ratio (target >= 0.85 for the Client). Every answer's ids are
   checked equal to the in-process ids.
3. **Fixed per-query cost** at radius 0 (a lookup of one bucket): per query, the in-kernel
   lookup time (``lookup_ns`` of the per-radius stats) and the handler's ``search`` part
   (Server-Timing: the engine call inside the request), single queries and a batch of 1,000
   (its per-query lookup_ns p50 too), in the server and in process (target: <= 1 us per query
   in the server).

Data: uniform random 64-bit codes (almost every probe hits an empty bucket); radius-1 and
radius-2 queries are database codes with one bit flipped (each finds its source), radius-0
queries are database codes. The items go in as octet-stream batches and one merge.

    .venv/bin/python bench/bench_server.py                                  # 1M items
    .venv/bin/python bench/bench_server.py --compare base=/tmp/base13       # before / after
    .venv/bin/python bench/bench_server.py --n 100000 --single-requests 300  # quicker
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
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

from bucketsearch.index.codes import to_hex  # noqa: E402
from bucketsearch.index.probe import HammingIndex  # noqa: E402
from bucketsearch.loadtest.client import Client  # noqa: E402
from bucketsearch.loadtest.wire import decode_binary_results  # noqa: E402

BITS = 64
SEARCH = "/v1/indexes/bench/search"
OCTET = "application/octet-stream"
UVICORN = ["--host", "127.0.0.1", "--log-level", "warning"]  # the same for every server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_path(tree: Path, scratch: Path) -> Path:
    """A directory whose ``bucketsearch`` package is the checkout ``tree`` (its app/, index/
    and loadtest/ as subpackages, as the editable install maps this tree): the server of
    another checkout runs with it as its working directory."""
    pkg = scratch / f"tree-{tree.name}" / "bucketsearch"
    pkg.mkdir(parents=True)
    for name in ("__init__.py", "__main__.py", "cli.py"):
        if (tree / "bucketsearch" / name).exists():
            (pkg / name).symlink_to(tree / "bucketsearch" / name)
    for sub in ("app", "index", "loadtest"):
        (pkg / sub).symlink_to(tree / sub)
    return pkg.parent


class Server:
    """One uvicorn subprocess: ``app`` (``module:attr``), factory or not, working directory."""

    def __init__(self, name: str, app: str, *, factory: bool, cwd: Path, env: dict,
                 extra: tuple = ()):
        self.name, self.port = name, free_port()
        cmd = [sys.executable, "-m", "uvicorn", app, *(["--factory"] if factory else []),
               *extra, *UVICORN, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **env})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, path: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + path, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: not ready after {timeout} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_index_server(name: str, cwd: Path, data_dir: Path) -> Server:
    env = {"BUCKETSEARCH_DATA_DIR": str(data_dir), "BUCKETSEARCH_MERGE_THRESHOLD": str(10**9),
           "BUCKETSEARCH_MAX_BATCH": "200000", "BUCKETSEARCH_MAX_BODY_BYTES": str(256 << 20),
           "PYTHONPATH": ""}
    return Server(name, "bucketsearch.app.main:create_app", factory=True, cwd=cwd, env=env)


def load_index(server: Server, words: np.ndarray) -> float:
    t = time.perf_counter()
    with httpx.Client(base_url=server.url, timeout=600) as c:
        c.post("/v1/indexes", json={"name": "bench", "bits": BITS, "mode": "single"}) \
            .raise_for_status()
        step = 200_000
        for a in range(0, len(words), step):
            c.post("/v1/indexes/bench/items", params={"first_id": a},
                   content=words[a:a + step].astype(">u8").tobytes(),
                   headers={"content-type": OCTET}).raise_for_status()
        r = c.post("/v1/indexes/bench/merge")
        r.raise_for_status()
        assert r.json()["main_size"] == len(words), r.text
    return time.perf_counter() - t


class Lean:
    """A keep-alive ``http.client`` connection with TCP_NODELAY."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, path: str, body: bytes, ctype: str, accept: str = "application/json"):
        self.conn.request("POST", path, body, {"Content-Type": ctype, "Accept": accept})
        r = self.conn.getresponse()
        raw = r.read()
        assert r.status == 200, raw[:300]
        return raw, r.getheader("server-timing") or ""

    def close(self) -> None:
        self.conn.close()


def server_part(header: str, part: str = "search") -> float:
    """A Server-Timing part in seconds."""
    for item in header.split(","):
        name, _, dur = item.strip().partition(";dur=")
        if name == part:
            return float(dur) * 1e-3
    raise KeyError(part)


def json_body(hexes: list[str], radius: int, stats: bool = False) -> bytes:
    return orjson.dumps({"codes": hexes, "max_distance": radius, **({"stats": True} if stats
                                                                    else {})})


def shuffled(items: list, round_: int) -> list:
    """``items`` in the seeded random order of one round: no path always runs right after
    another (an in-process batch search leaves the server's caches cold for the next request;
    a rotation keeps that neighbour)."""
    return random.Random(round_).sample(items, len(items))


def pct(values, q) -> float:
    return float(np.percentile(values, q))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--batch-repeats", type=int, default=21)
    ap.add_argument("--single-requests", type=int, default=2000)
    ap.add_argument("--radius0-requests", type=int, default=500)
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=TREE",
                    help="also run the server of another checkout (e.g. base=/tmp/base13)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "bench_server.json"))
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    words = rng.integers(0, 2**64, size=(args.n, 1), dtype=np.uint64)
    ids = np.arange(args.n, dtype=np.int64)
    nq = args.batch + args.single_requests
    src = rng.integers(0, args.n, size=nq)
    flips = np.left_shift(np.uint64(1), rng.integers(0, 64, size=nq).astype(np.uint64))
    xq = words[src] ^ flips[:, None]
    batch_q, single_q = xq[:args.batch], xq[args.batch:]
    zero_q = words[rng.integers(0, args.n, size=max(args.batch, args.radius0_requests))]
    single_hex, zero_hex = to_hex(single_q, BITS), to_hex(zero_q, BITS)

    t = time.perf_counter()
    idx = HammingIndex(BITS)
    idx.add(words, ids=ids)
    build_s = time.perf_counter() - t
    for q in (batch_q[:32], single_q[:1], zero_q[:1]):  # compile / warm every shape
        for r in (0, 1, 2):
            idx.range_search(q, r)
            idx.range_search(q, r, stats=True)
    found = idx.range_search(batch_q, 2)
    expected_batch = found[2]

    scratch = Path(tempfile.mkdtemp(prefix="bench_server_"))
    servers = {"raw_asgi": Server("raw_asgi", "floor_apps:raw_asgi", factory=False, cwd=ROOT,
                                  env={}, extra=("--app-dir", str(ROOT / "bench"))),
               "fastapi_echo": Server("fastapi_echo", "floor_apps:fastapi_echo", factory=True,
                                      cwd=ROOT, env={}, extra=("--app-dir", str(ROOT / "bench")))}
    indexed = {"ours": start_index_server("ours", ROOT, scratch / "data-ours")}
    for spec in args.compare:
        name, _, tree = spec.partition("=")
        indexed[name] = start_index_server(name, tree_path(Path(tree).resolve(), scratch),
                                           scratch / f"data-{name}")
    servers.update(indexed)
    leans, clients = {}, {}
    try:
        servers["raw_asgi"].wait("/readyz")
        servers["fastapi_echo"].wait("/readyz")
        load_s = {}
        for name, server in indexed.items():
            server.wait("/readyz")
            load_s[name] = load_index(server, words)
        leans = {name: Lean(s.port) for name, s in servers.items()}
        clients = {name: Client(s.url) for name, s in indexed.items()}

        # ------------------------------------------------------------------ the requests
        def floor(name):
            return lambda i: leans[name].post("/echo", json_body([single_hex[i]], 1),
                                              "application/json")

        def ours_json(name):
            return lambda i: leans[name].post(SEARCH, json_body([single_hex[i]], 1),
                                              "application/json")

        def ours_binary(name):
            def send(i):
                raw, _ = leans[name].post(f"{SEARCH}?max_distance=1",
                                          single_q[i].astype(">u8").tobytes(), OCTET, OCTET)
                assert decode_binary_results(raw)[0][-1] >= 1
            return send

        def ours_client(name):
            return lambda i: clients[name].range_search("bench", single_q[i:i + 1], 1)

        single = {"in_process": lambda i: idx.range_search(single_q[i:i + 1], 1),
                  "raw_asgi": floor("raw_asgi"), "fastapi_echo": floor("fastapi_echo")}
        for name in indexed:
            single[f"{name}_json"] = ours_json(name)
            single[f"{name}_binary"] = ours_binary(name)
            single[f"{name}_client"] = ours_client(name)
        for send in single.values():  # warm-up: connections, the Client's limits and bits
            for i in range(20):
                send(i)
        single_times = {name: [] for name in single}
        order = list(single)
        for i in range(args.single_requests):
            for name in shuffled(order, i):
                t = time.perf_counter()
                single[name](i)
                single_times[name].append(time.perf_counter() - t)

        # ------------------------------------------------------------------ the batch
        def batch_client(name):
            def send():
                lims, D, I = clients[name].range_search("bench", batch_q, 2)
                return I, None
            return send

        def batch_lean(name):
            def send():
                raw, timing = leans[name].post(f"{SEARCH}?max_distance=2",
                                               batch_q.astype(">u8").tobytes(), OCTET, OCTET)
                return decode_binary_results(raw)[2], timing
            return send

        batch = {}
        for name in indexed:
            batch[f"{name}_client"] = batch_client(name)
            batch[f"{name}_lean"] = batch_lean(name)
        for name, send in batch.items():
            for _ in range(3):
                got, _ = send()
            assert np.array_equal(got, expected_batch), name
        batch_times = {"in_process": [], **{name: [] for name in batch}}
        batch_search = {name: [] for name in batch if name.endswith("_lean")}
        sends = [("in_process", lambda: (idx.range_search(batch_q, 2), None)), *batch.items()]
        for i in range(args.batch_repeats):
            for name, send in shuffled(sends, i):
                t = time.perf_counter()
                _, timing = send()
                batch_times[name].append(time.perf_counter() - t)
                if timing:
                    batch_search[name].append(server_part(timing))

        # ------------------------------------------------- radius 0: fixed per-query cost
        zero = {"in_process": {"kernel_ns": [], "call_s": []},
                **{name: {"kernel_ns": [], "search_s": []} for name in indexed}}
        for i in range(args.radius0_requests):
            t = time.perf_counter()
            *_, st = idx.range_search(zero_q[i:i + 1], 0, stats=True)
            zero["in_process"]["call_s"].append(time.perf_counter() - t)
            zero["in_process"]["kernel_ns"].append(int(st.lookup_ns[0, 0]))
            for name in indexed:
                raw, timing = leans[name].post(SEARCH, json_body([zero_hex[i]], 0, True),
                                               "application/json")
                zero[name]["kernel_ns"].append(orjson.loads(raw)["stats"][0][0]["lookup_ns"])
                zero[name]["search_s"].append(server_part(timing))
        zero_batch = {"in_process": [], "in_process_stats": [],
                      **{name: [] for name in indexed}}
        zb = zero_q[:args.batch]
        zb_body = zb.astype(">u8").tobytes()
        zb_json = json_body(zero_hex[:args.batch], 0, True)
        # the kernel's radius-0 lookup of each query of a batch (lookup_ns, p50 over queries)
        zero_batch_kernel = {"in_process": [], **{name: [] for name in indexed}}
        for _ in range(args.batch_repeats):
            t = time.perf_counter()
            idx.range_search(zb, 0)
            zero_batch["in_process"].append((time.perf_counter() - t) / len(zb))
            t = time.perf_counter()
            *_, st = idx.range_search(zb, 0, stats=True)
            zero_batch["in_process_stats"].append((time.perf_counter() - t) / len(zb))
            zero_batch_kernel["in_process"].append(float(np.median(st.lookup_ns[:, 0])))
            for name in indexed:
                _, timing = leans[name].post(f"{SEARCH}?max_distance=0", zb_body, OCTET, OCTET)
                zero_batch[name].append(server_part(timing) / len(zb))
                raw, _ = leans[name].post(SEARCH, zb_json, "application/json")
                zero_batch_kernel[name].append(float(np.median(
                    [q[0]["lookup_ns"] for q in orjson.loads(raw)["stats"]])))
    finally:
        for lean in leans.values():
            lean.close()
        for client in clients.values():
            client.close()
        for server in servers.values():
            server.stop()

    med = statistics.median
    load = os.getloadavg()
    p50 = {k: med(v) for k, v in single_times.items()}
    result = {
        "params": vars(args), "build_in_process_s": build_s, "load_over_http_s": load_s,
        "load_average": load, "cpus": os.cpu_count(),
        "single_radius1": {
            "p50_ms": {k: v * 1e3 for k, v in p50.items()},
            "p99_ms": {k: pct(v, 99) * 1e3 for k, v in single_times.items()},
            "p50_over_fastapi_echo": {k: v / p50["fastapi_echo"] for k, v in p50.items()}},
        "batch_radius2": {
            "median_ms": {k: med(v) * 1e3 for k, v in batch_times.items()},
            "qps": {k: args.batch / med(v) for k, v in batch_times.items()},
            "ratio_over_in_process": {k: med(batch_times["in_process"]) / med(v)
                                      for k, v in batch_times.items()},
            "server_search_part_ms": {k: med(v) * 1e3 for k, v in batch_search.items()}},
        "radius0_per_query_us": {
            "single_kernel_lookup_p50": {k: med(v["kernel_ns"]) / 1e3 for k, v in zero.items()},
            "single_call_or_search_part_p50": {
                k: med(v.get("search_s") or v.get("call_s")) * 1e6 for k, v in zero.items()},
            "batch_of_%d" % args.batch: {k: med(v) * 1e6 for k, v in zero_batch.items()},
            "batch_kernel_lookup_p50": {k: med(v) / 1e3 for k, v in zero_batch_kernel.items()}},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))

    s, b, z = result["single_radius1"], result["batch_radius2"], result["radius0_per_query_us"]
    print(f"index: {args.n:,} x {BITS}-bit codes (in-process build {build_s:.1f} s; HTTP load + "
          f"merge {', '.join(f'{k} {v:.1f} s' for k, v in load_s.items())}); load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"single radius-1 query, {args.single_requests} interleaved requests each "
          "(target: p50 <= 1.25x fastapi_echo):")
    for k in single_times:
        print(f"  {k:18s} p50 {s['p50_ms'][k]:7.3f} ms  p99 {s['p99_ms'][k]:7.3f} ms  "
              f"{s['p50_over_fastapi_echo'][k]:5.2f}x fastapi_echo")
    print(f"batch of {args.batch} radius-2 queries, median of {args.batch_repeats} "
          "(target: Client >= 0.85 of in-process q/s):")
    for k in batch_times:
        part = b["server_search_part_ms"].get(k)
        print(f"  {k:18s} {b['median_ms'][k]:8.2f} ms {b['qps'][k]:10,.0f} q/s  ratio "
              f"{b['ratio_over_in_process'][k]:.2f}"
              + (f"  (server search part {part:.2f} ms)" if part is not None else ""))
    print("radius 0, per query (us; target: <= 1 us in the server):")
    for k in zero:
        print(f"  {k:18s} single: kernel lookup {z['single_kernel_lookup_p50'][k]:6.2f}, "
              f"{'call' if k == 'in_process' else 'handler search part'} "
              f"{z['single_call_or_search_part_p50'][k]:7.1f}")
    for k, v in z["batch_of_%d" % args.batch].items():
        kernel = z["batch_kernel_lookup_p50"].get(k)
        print(f"  {k:18s} batch of {args.batch}: {v:6.3f} per query"
              + (f"  (kernel lookup p50 {kernel:5.3f})" if kernel is not None else ""))
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
