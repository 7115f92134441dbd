"""Lookups by id of a main index (``LiveState.get``): the rows of its ids, built at the first
lookup after each merge or restart. The previous way (an int64 ``np.argsort`` of every id)
against :class:`~bucketsearch.index.storage.idset.IdRows` (an inverse table of uint32 rows for a
narrow id span, else the ids' order by the radix sort), in one process, best of ``--rounds``.

    .venv/bin/python bench/bench_id_rows.py              # 10M ids
    .venv/bin/python bench/bench_id_rows.py --n 2000000
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from bucketsearch.index.storage.idset import IdRows


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    dense = rng.permutation(args.n).astype(np.int64)  # ids 0..n-1 in code order
    sparse = dense * 3 + 7                              # a span of 3n: the sorted layout
    IdRows(dense[:1000] * 3)  # compile
    print(f"n = {args.n:,}; loadavg {open('/proc/loadavg').read().split()[0]}")
    for name, ids in (("dense", dense), ("sparse", sparse)):
        old = best(lambda: np.argsort(ids, kind="stable"), args.rounds)
        new = best(lambda: IdRows(ids), args.rounds)
        rows = IdRows(ids)
        q = ids[rng.integers(0, args.n, 1000)]
        assert np.array_equal(ids[rows.rows(q)], q)
        print(f"{name:6s} argsort {old:6.2f} s (8 B/id)   IdRows {new:6.2f} s "
              f"({rows.nbytes / args.n:.0f} B/id)   ratio {new / old:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
