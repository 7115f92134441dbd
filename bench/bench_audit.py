"""What the exactness audit (app/audit.py) costs: the hook on the search path, and the
throughput of a served index with the audit off and at its default rate, in the same run.

1. **In process** (no server): ``run_search`` of one-query near-duplicate lookups on the same
   index (``bucketsearch.app.routers.search.run_search``, the function both the fast path and
   FastAPI call) with ``entry.audit = None``, with an audit at rate 0 (the hook's count and compare,
   never sampled) and with the audit at the default rate; the three interleaved block by
   block. Wall ns a call (median of the blocks) and CPU ns a call of the calling thread
   (``time.thread_time_ns``), the default's plus its checker thread's CPU spread over its
   calls of all three (it runs beside every block, throttled by all the serving CPU), and its
   CPU over the serving CPU of the whole run: the CPU cost of the audit, which scheduling noise
   of a shared machine disturbs far less than wall time. Plus the hook's expression alone (``next(counter) >= next_pick``) in a
   tight loop.
2. **Throughput** (HTTP): two uvicorn servers of this tree with the same index (N uniform
   random 64-bit codes, one merge), ``BUCKETSEARCH_AUDIT_RATE=0`` (off) and the default
   settings (audit on, rate 0.01, 4 queries a sample, CPU share 0.01); ``--threads`` keep-alive
   ``http.client`` connections send one-query JSON searches (near-duplicate lookups: radius 1, and the 10 nearest within
   radius 2 every third) for
   ``--seconds`` per round, the rounds in ABBA order so drift hits both alike; the ratio of
   completed searches per second (on / off) per pair of rounds and its median. The audit's own
   report (sampled, checked, dropped, mismatched, CPU seconds) is printed after.

    .venv/bin/python bench/bench_audit.py                       # 1M items, 8 rounds of 4 s
    .venv/bin/python bench/bench_audit.py --n 100000 --rounds 4 --seconds 2   # quicker
"""
from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_server import BITS, Server, load_index  # noqa: E402

from bucketsearch.index.codes import to_hex  # noqa: E402


def hook_bench(n: int, calls: int, blocks: int) -> dict:
    """Part 1: per ``run_search`` call, wall ns and CPU ns of the calling thread with no audit,
    an audit at rate 0 and the default audit; the default audit's checker CPU (its own
    thread's, ``busy_seconds``) is added to the calls of the default blocks."""
    from bucketsearch.app.audit import ExactnessAudit
    from bucketsearch.app.costfit import CostTracker
    from bucketsearch.app.parsing import parse_search
    from bucketsearch.app.registry import Entry
    from bucketsearch.app.routers.search import run_search
    from bucketsearch.app.settings import Settings
    from bucketsearch.index.storage.live import LiveIndex

    settings = Settings()
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**63, size=(n, 1), dtype=np.uint64)
    folder = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    live = LiveIndex(folder, BITS, "single")
    live.add(words, np.arange(n))
    live.merge()
    entry = Entry("bench", BITS, live, CostTracker(BITS), folder)
    jobs = []
    for i in range(64):  # near-duplicate lookups: radius 1, and the 10 nearest within 2
        code = to_hex(words[i:i + 1] ^ np.uint64(1 << (i % 63)), BITS)
        body = {"codes": code, "max_distance": 1} if i % 3 else \
            {"codes": code, "k": 10, "max_distance": 2}
        jobs.append(parse_search(json.dumps(body).encode(), "application/json", BITS,
                                 settings, {}, False))
    audits = {"none": None, "rate 0": ExactnessAudit(0.0),
              "default": ExactnessAudit.from_settings(settings)}
    for i in range(2000):  # warm-up: compile, caches
        run_search(entry, jobs[i % 64], settings, time.perf_counter())
    wall = {name: [] for name in audits}
    cpu = {name: 0.0 for name in audits}
    for b in range(blocks):
        names = list(audits)
        if b % 2:
            names.reverse()
        for name in names:
            entry.audit = audits[name]
            c = time.thread_time_ns()
            t = time.perf_counter_ns()
            for i in range(calls):
                run_search(entry, jobs[i % 64], settings, t)
            wall[name].append((time.perf_counter_ns() - t) / calls)
            cpu[name] += time.thread_time_ns() - c
    audits["default"].drain(60)
    checker_ns = audits["default"].busy_s * 1e9
    total = calls * blocks
    out = {"wall_ns": {name: statistics.median(v) for name, v in wall.items()},
           "cpu_ns": {name: cpu[name] / total for name in audits},
           # the checker runs beside every block, throttled by all the serving CPU
           "checker_ns": checker_ns / (total * len(audits)),
           "checker_share": checker_ns / sum(cpu.values())}
    audit = audits["rate 0"]
    counter, pick = audit.counter, audit.next_pick
    loops = 2_000_000
    t = time.perf_counter_ns()
    for _ in range(loops):
        if audit is not None and next(counter) >= pick:
            pass
    hook = (time.perf_counter_ns() - t) / loops
    t = time.perf_counter_ns()
    for _ in range(loops):
        if audit is not None:
            pass
    empty = (time.perf_counter_ns() - t) / loops
    rep = audits["default"].report()
    for a in audits.values():
        if a is not None:
            a.close()
    live.close()
    out.update(hook_ns=hook - empty, sampled=rep["sampled"], dropped=rep["dropped"],
               checked=rep["checked"])
    return out


def worker(port: int, bodies: list[bytes], stop: threading.Event, done: list, slot: int):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    n = 0
    for body in itertools.cycle(bodies):
        if stop.is_set():
            break
        conn.request("POST", "/v1/indexes/bench/search", body,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"search answered {r.status}")
        n += 1
    conn.close()
    done[slot] = n


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_round(server: Server, bodies: list[bytes], threads: int,
               seconds: float) -> tuple[float, float]:
    """``(searches a second, server CPU us a search)`` of one round."""
    stop = threading.Event()
    done = [0] * threads
    pool = [threading.Thread(target=worker, args=(server.port, bodies[i::threads], stop, done,
                                                  i)) for i in range(threads)]
    c0 = cpu_seconds(server.proc.pid)
    t = time.perf_counter()
    for th in pool:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in pool:
        th.join()
    wall = time.perf_counter() - t
    n = max(sum(done), 1)
    return n / wall, (cpu_seconds(server.proc.pid) - c0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="items (default 1M)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per side, ABBA (default 8; "
                    "0: the in-process part only)")
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds per round")
    ap.add_argument("--threads", type=int, default=4, help="client connections")
    ap.add_argument("--hook-calls", type=int, default=5000)
    ap.add_argument("--hook-blocks", type=int, default=20)
    args = ap.parse_args()

    hook = hook_bench(args.n, args.hook_calls, args.hook_blocks)
    base_wall, base_cpu = hook["wall_ns"]["none"], hook["cpu_ns"]["none"]
    print(f"1. run_search of one near-duplicate lookup (in process, {args.n:,} items), "
          f"{args.hook_blocks} blocks of {args.hook_calls} calls per variant:")
    for name in hook["wall_ns"]:
        ns, cpu = hook["wall_ns"][name], hook["cpu_ns"][name]
        extra = hook["checker_ns"] if name == "default" else 0.0  # per call of any block
        print(f"   audit {name:8s} wall {ns:8.0f} ns (x{ns / base_wall:.3f})   CPU {cpu:8.0f} ns "
              f"+ checker {extra:6.0f} ns = x{(cpu + extra) / base_cpu:.3f}")
    print(f"   the checker's CPU over the serving CPU of the whole run: "
          f"{100 * hook['checker_share']:.2f}% (its bound: audit_cpu_share / (1 - share))")
    print(f"   the hook alone (count + compare, not sampled): {hook['hook_ns']:.1f} ns; "
          f"default-rate audit sampled {hook['sampled']}, checked {hook['checked']}, "
          f"dropped {hook['dropped']}")

    if not args.rounds:
        return 0
    rng = np.random.default_rng(1)
    words = rng.integers(0, 2**63, size=(args.n, 1), dtype=np.uint64)
    picks = rng.integers(0, args.n, 3000)
    bodies = []
    for i, p in enumerate(picks):
        code = to_hex(words[p:p + 1] ^ np.uint64(1 << int(rng.integers(0, 63))), BITS)
        query = {"max_distance": 1} if i % 3 else {"k": 10, "max_distance": 2}
        bodies.append(json.dumps({"codes": code, **query}).encode())
    scratch = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    servers = {}
    for name, env in (("off", {"BUCKETSEARCH_AUDIT_RATE": "0"}), ("on", {})):
        srv = Server(name, "bucketsearch.app.main:create_app", factory=True, cwd=ROOT, env={
            "BUCKETSEARCH_DATA_DIR": str(scratch / name), "BUCKETSEARCH_MAX_BATCH": "200000",
            "BUCKETSEARCH_MAX_BODY_BYTES": str(256 << 20),
            "BUCKETSEARCH_MERGE_THRESHOLD": str(10**9), **env})
        servers[name] = srv
    try:
        for srv in servers.values():
            srv.wait("/readyz")
            load_index(srv, words)
            load_round(srv, bodies, args.threads, 1.0)  # warm-up
        qps = {"off": [], "on": []}
        cpu = {"off": [], "on": []}
        order = ["off", "on", "on", "off"]
        for r in range(args.rounds):
            name = order[(2 * r) % 4], order[(2 * r + 1) % 4]
            for side in name:
                rate, us = load_round(servers[side], bodies, args.threads, args.seconds)
                qps[side].append(rate)
                cpu[side].append(us)
        ratios = [b / a for a, b in zip(qps["off"], qps["on"])]
        cpu_ratios = [b / a for a, b in zip(cpu["off"], cpu["on"])]
        print(f"\n2. throughput, {args.n:,} items, {args.threads} connections, {args.rounds} "
              f"rounds of {args.seconds} s per side (ABBA):")
        print("   off qps: " + " ".join(f"{v:.0f}" for v in qps["off"]))
        print("   on  qps: " + " ".join(f"{v:.0f}" for v in qps["on"]))
        print("   ratio on/off per round: " + " ".join(f"{v:.3f}" for v in ratios))
        print(f"   median ratio {statistics.median(ratios):.3f}  (mean qps off "
              f"{statistics.mean(qps['off']):.0f}, on {statistics.mean(qps['on']):.0f})")
        print("   server CPU us a search, off: " + " ".join(f"{v:.0f}" for v in cpu["off"]))
        print("   server CPU us a search, on:  " + " ".join(f"{v:.0f}" for v in cpu["on"]))
        print(f"   median CPU ratio on/off {statistics.median(cpu_ratios):.3f} (the throughput "
              "cost when the server is CPU-bound, less sensitive to other load on the machine)")
        rep = httpx.get(servers["on"].url + "/v1/audit", timeout=30).json()
        print(f"   audit of 'on': sampled {rep['sampled']}, checked {rep['checked']} "
              f"({rep['checked_queries']} queries), dropped {rep['dropped']}, mismatched "
              f"{rep['mismatched']}, checker CPU {rep['busy_seconds']:.2f} s")
    finally:
        for srv in servers.values():
            srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
