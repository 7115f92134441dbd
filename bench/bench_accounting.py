"""Cost of the per-radius accounting: the same kernel with ``stats=True`` vs ``stats=False``.

Single thread, 1M 64-bit codes (uniform and clustered), radius search r = 0..3 on queries one
bit away from database codes. The two variants run in interleaved rounds; printed per radius:
best time of each, their ratio, and the median of the per-round ratios, plus the absolute extra
nanoseconds per query (the clock is read once per radius boundary, ``R + 2`` reads a query).

    python bench/bench_accounting.py [--rounds 21] [--n 1000000]
"""
from __future__ import annotations

import argparse
import statistics
import time

from bucketsearch.index.probe import HammingIndex
from bucketsearch.index.synth import clustered_codes, queries_near, uniform_codes

QUERIES = {0: 20000, 1: 20000, 2: 2000, 3: 200}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--n", type=int, default=1_000_000)
    args = parser.parse_args()
    for name, xb in [("uniform64", uniform_codes(args.n, 64, 1)),
                     ("clustered64", clustered_codes(args.n, 64, args.n // 100, 0.01, 2))]:
        index = HammingIndex(64)
        index.add(xb)
        index.threads = 1
        xq_all = queries_near(xb, max(QUERIES.values()), 64, flips=1, seed=7)
        print(f"{name}: r, plain ns/query, stats ns/query, best-time ratio, median ratio, "
              "extra ns/query")
        for r, nq in QUERIES.items():
            xq = xq_all[:nq]
            index.range_search(xq[:10], r, stats=True)
            plain, stats, ratios = [], [], []
            for _ in range(args.rounds):
                t = time.perf_counter()
                index.range_search(xq, r)
                plain.append(time.perf_counter() - t)
                t = time.perf_counter()
                index.range_search(xq, r, stats=True)
                stats.append(time.perf_counter() - t)
                ratios.append(stats[-1] / plain[-1])
            p, s = min(plain) / nq * 1e9, min(stats) / nq * 1e9
            print(f"  r={r} {p:10.1f} {s:10.1f} {s / p - 1:+8.1%} "
                  f"{statistics.median(ratios) - 1:+8.1%} {s - p:+8.1f}")


if __name__ == "__main__":
    main()
