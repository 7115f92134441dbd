"""Benchmark of the hashtable-bucket evaluation: the full (K, L) grid at the CIFAR-10 protocol
size (1,000 queries x 59,000 database codes, Q = 64, LSH on the embedded synthetic data).

Run:  .venv/bin/python bench/bench_buckets.py            # 1,000 x 59,000, Q = 64
      .venv/bin/python bench/bench_buckets.py --quick    # 100 x 5,000, a smoke run

Figures printed: the quality of every (K, L) with K * L <= 64 (280 configurations, every
per-table radius 0..K) from the min-segment histograms, without engine timing; the baseline,
measured in the same run, is one Hamming-histogram pass with P/R at every radius (what
``bucketsearch eval`` does for a single table), so the ratio says what the whole grid costs
in units of one ordinary evaluation. Wall time and process CPU time (all threads) are both
printed: on a shared machine the CPU time is the steadier figure. Best of ``--repeat`` runs
after a warm-up (compilation).
"""
from __future__ import annotations

import argparse
import time

import numba

from bucketsearch.index.evaluation.buckets import evaluate_tables, full_grid
from bucketsearch.index.evaluation.coding import lsh_codes
from bucketsearch.index.evaluation.datasets import synthetic_cifar
from bucketsearch.index.metrics.relevance import from_labels
from bucketsearch.index.metrics import hamming_histograms, radius_metrics


def timed(fn, repeat: int) -> tuple[float, float]:
    """Best (wall, cpu) seconds of ``repeat`` calls."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - w, time.process_time() - c))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--bits", type=int, default=64)
    args = ap.parse_args()
    n_db, nq = (5_000, 100) if args.quick else (59_000, 1_000)
    data = synthetic_cifar(n_db=n_db, n_queries=nq)
    xb, xq = lsh_codes(data.xb, data.xq, args.bits)
    rel = from_labels(data.yq, data.yb)
    grid = full_grid(args.bits)
    # warm-up: compile both paths on a tiny input
    small = from_labels(data.yq[:4], data.yb[:50])
    evaluate_tables(xb[:50], xq[:4], small, grid, measure_radii=())
    radius_metrics(hamming_histograms(xb[:50], xq[:4], small, ks=[1], as_ranked=False,
                                      code_stats=False))
    base = timed(lambda: radius_metrics(hamming_histograms(
        xb, xq, rel, ks=[1], as_ranked=False, code_stats=False)), args.repeat)
    grid_t = timed(lambda: evaluate_tables(xb, xq, rel, grid, measure_radii=()), args.repeat)
    print(f"{nq} queries x {n_db} db codes, Q = {args.bits}, {len(grid)} (K, L) "
          f"configurations, numba threads {numba.get_num_threads()}")
    print(f"  one Hamming-histogram evaluation: wall {base[0]:7.2f} s  cpu {base[1]:7.2f} s")
    print(f"  full (K, L) grid, every radius:   wall {grid_t[0]:7.2f} s  cpu {grid_t[1]:7.2f} s")
    print(f"  ratio grid / one evaluation: wall {grid_t[0] / base[0]:.1f}x, "
          f"cpu {grid_t[1] / base[1]:.1f}x")


if __name__ == "__main__":
    main()
