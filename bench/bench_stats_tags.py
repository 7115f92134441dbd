"""What tagging each query with what ran costs (issue 26): a one-query and a 1,000-query range
search with statistics, with ``IndexBase._tagged`` (engine, k, codes_compared per query) and
with it replaced by the identity, interleaved in one process; prints the median ns per call of
each and their ratio.

    .venv/bin/python bench/bench_stats_tags.py
"""
from __future__ import annotations

import time

import numpy as np

from bucketsearch.index.base import IndexBase
from bucketsearch.index.factory import make_index

ROUNDS = 15


def timed(fn, reps: int) -> float:
    t = time.perf_counter_ns()
    for _ in range(reps):
        fn()
    return (time.perf_counter_ns() - t) / reps


def main() -> None:
    codes = np.random.default_rng(0).integers(0, 2, (200_000, 64), dtype=np.uint8)
    tagged = IndexBase._tagged
    for mode in ("single", "mih"):
        index = make_index(64, mode=mode)
        index.add(codes)
        for nq, R, reps in ((1, 1, 2000), (1000, 2, 5)):
            xq = np.ascontiguousarray(index._check_queries(codes[:nq]))
            index.range_search(xq, R, stats=True)
            with_t, without = [], []
            for _ in range(ROUNDS):
                IndexBase._tagged = tagged
                with_t.append(timed(lambda: index.range_search(xq, R, stats=True), reps))
                IndexBase._tagged = lambda self, st, k: st
                without.append(timed(lambda: index.range_search(xq, R, stats=True), reps))
            IndexBase._tagged = tagged
            a, b = np.median(with_t), np.median(without)
            print(f"{mode:6s} nq={nq:5d} R={R}: with tags {a / 1e3:9.2f} us, without "
                  f"{b / 1e3:9.2f} us, ratio {a / b:.3f} (+{(a - b) / 1e3:.2f} us per call)")


if __name__ == "__main__":
    main()
