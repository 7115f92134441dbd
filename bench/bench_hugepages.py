"""Searches over an engine's arrays in 4 KiB pages against the same engine's in huge pages
(index/hugepages.py), interleaved in one process, and what the collapse costs.

Two builds of the same codes per engine: one with the engines' :func:`collapse_later` turned off
(its arrays as the allocators left them: Numba's get 4 KiB pages), one as shipped (collapsed in
the background; waited for). Prints each build's bytes in huge pages (from /proc/self/smaps),
the build times, then per cell the median time per query of each and the median, min and max
of the per-round ratios huge / 4 KiB (least thread CPU time of 3 calls per timing, order
alternating per round). Queries: database codes with one bit flipped (bench_ab's).

    .venv/bin/python bench/bench_hugepages.py                  # 10M uniform, batches of 10,000
    .venv/bin/python bench/bench_hugepages.py --n 1000000 --nq 1000
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from cputime import best

import bucketsearch.index.mih as mih_module
import bucketsearch.index.probe as probe_module
from bucketsearch.index.disk import hugepages
from bucketsearch.index.mih import MultiIndex
from bucketsearch.index.probe import HammingIndex
from bucketsearch.index.synth import queries_near, uniform_codes


def build(engine, xb, ids, collapse: bool):
    saved = mih_module.collapse_later, probe_module.collapse_later
    if not collapse:
        mih_module.collapse_later = probe_module.collapse_later = lambda arrays: 0
    try:
        index = engine(64)
        index.threads = 1
        t = time.perf_counter()
        index.add(xb, ids)
        built = time.perf_counter() - t
        hugepages.wait_for_collapse()
        settled = time.perf_counter() - t
    finally:
        mih_module.collapse_later, probe_module.collapse_later = saved
    return index, built, settled


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--nq", type=int, default=10_000, help="queries of the range cells")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    xb = uniform_codes(args.n, 64, seed=1)
    ids = np.arange(args.n, dtype=np.int64)
    xq = queries_near(xb, args.nq, 64, flips=1, seed=7)
    print(f"uniform {args.n:,} codes of 64 bits; load {open('/proc/loadavg').read().split()[:3]}")
    engines = {}
    for name, engine in (("single", HammingIndex), ("mih", MultiIndex)):
        for collapse in (False, True):
            index, built, settled = build(engine, xb, ids, collapse)
            arrays = [a for a in index.memory_arrays().values() if a.nbytes >= 4 << 20]
            size = sum(a.nbytes for a in arrays)
            huge = hugepages.huge_page_bytes(arrays)
            print(f"{name:6s} {'huge' if collapse else '4 KiB'}: build {built:.2f} s, "
                  f"collapsed {settled - built:.2f} s later; arrays >= 4 MiB "
                  f"{size / 2**20:.0f} MiB, {huge / 2**20:.0f} MiB of it in huge pages",
                  flush=True)
            engines[(name, collapse)] = index
    cells = [("single r=1", "single", args.nq // 5, lambda ix, q: ix.range_search(q, 1)),
             ("single r=2", "single", args.nq // 25, lambda ix, q: ix.range_search(q, 2)),
             ("mih r=1", "mih", args.nq, lambda ix, q: ix.range_search(q, 1)),
             ("mih r=2", "mih", args.nq, lambda ix, q: ix.range_search(q, 2)),
             ("mih r=3", "mih", args.nq // 10, lambda ix, q: ix.range_search(q, 3)),
             ("mih k-NN k=10", "mih", 200, lambda ix, q: ix.search(q, 10))]
    for label, name, nq, fn in cells:
        q = xq[:nq]
        a, b = fn(engines[(name, False)], q), fn(engines[(name, True)], q)
        assert all(np.array_equal(x, y) for x, y in zip(a, b)), label
        small, huge, ratios = [], [], []
        for rnd in range(args.rounds):
            t = {}
            for collapse in ((False, True) if rnd % 2 == 0 else (True, False)):
                index = engines[(name, collapse)]
                t[collapse] = best(lambda: fn(index, q))
            small.append(t[False])
            huge.append(t[True])
            ratios.append(t[True] / t[False])
        print(f"{label:14s} nq={nq:6d}  4 KiB {statistics.median(small) / nq * 1e9:9.1f} ns/q  "
              f"huge {statistics.median(huge) / nq * 1e9:9.1f} ns/q  huge/4 KiB "
              f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]",
              flush=True)
    print(f"load after {open('/proc/loadavg').read().split()[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
