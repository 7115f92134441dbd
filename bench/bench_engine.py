"""Engine benchmark: bucket probing and linear scan against FAISS, single thread, one process.

For each data set (64-bit uniform and clustered at 1M and 10M, 32-bit uniform at 1M):
build time and bytes per item; per-probe cost t0 at r = 2, 3; queries/s of radius search at
r = 0..3 against FAISS IndexBinaryHash (b = Q, nflip = r, strict range_search given r + 1);
k-NN (k = 10) against IndexBinaryFlat; our linear scan against IndexBinaryFlat; and the cost of
the per-radius accounting (stats=True vs stats=False, same kernel). Every result set is checked
identical to FAISS's. Prints ratios measured in this run; ``--json`` saves the figures.

    python bench/bench_engine.py                 # everything (10M cells take a few minutes)
    python bench/bench_engine.py --sizes 1000000 # 1M only
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import faiss
import numpy as np

from bucketsearch.index.codes import to_packed
from bucketsearch.index.factory import make_index
from bucketsearch.index.probe import HammingIndex
from bucketsearch.index.scan import LinearScan
from bucketsearch.index.synth import clustered_codes, queries_near, uniform_codes


def timed(fn, repeat=3):
    """Best wall time of ``repeat`` runs (and the last result)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def interleaved(fns: dict, rounds=5):
    """Best wall time of each function over ``rounds`` interleaved rounds (noise hits all alike),
    and each function's last result."""
    best, out = {name: float("inf") for name in fns}, {}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            out[name] = fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best, out


def same_sets(lims_a, I_a, lims_b, I_b):
    return all(sorted(I_a[lims_a[q]:lims_a[q + 1]]) == sorted(I_b[lims_b[q]:lims_b[q + 1]])
               for q in range(len(lims_a) - 1))


def bench_dataset(name, xb, bits, nq_by_radius, knn_queries):
    n = len(xb)
    row = {"data": name, "n": n, "bits": bits}
    t, index = timed(lambda: _build(bits, xb), repeat=1)
    index.threads = 1
    row["build_s"] = t
    row["bytes_per_item"] = index.memory_bytes() / n
    xb8 = to_packed(xb, bits)
    fh = faiss.IndexBinaryHash(bits, bits)
    t = time.perf_counter()
    fh.add(xb8)
    row["faiss_hash_build_s"] = time.perf_counter() - t
    xq_all = queries_near(xb, max(nq_by_radius.values()), bits, flips=1, seed=7)
    for r, nq in nq_by_radius.items():
        xq = xq_all[:nq]
        xq8 = to_packed(xq, bits)
        index.range_search(xq[:2], r)
        best, out = interleaved({"plain": lambda: index.range_search(xq, r),
                                 "stats": lambda: index.range_search(xq, r, stats=True)})
        t_ours, t_stats = best["plain"], best["stats"]
        lims, D, I = out["plain"]
        fh.nflip = r
        nq_f = max(5, nq // 20) if r >= 2 else nq
        t_f, (fl, fD, fI) = timed(lambda: fh.range_search(xq8[:nq_f], r + 1), repeat=1)
        assert same_sets(lims[:nq_f + 1], I, fl, fI), f"{name} r={r}: results differ from FAISS"
        probes = index.probe_count(r)
        row[f"r{r}"] = {"qps": nq / t_ours, "faiss_hash_qps": nq_f / t_f,
                        "speedup_vs_faiss_hash": (nq / t_ours) / (nq_f / t_f),
                        "ns_per_probe": t_ours / nq / probes * 1e9,
                        "faiss_ns_per_probe": t_f / nq_f / probes * 1e9,
                        "stats_overhead": t_stats / t_ours - 1}
    return row, index


def _build(bits, xb):
    index = HammingIndex(bits)
    index.add(xb)
    return index


def bench_knn_and_scan(name, xb, bits, index, nq, k=10):
    xq = queries_near(xb, nq, bits, flips=1, seed=8)
    xb8, xq8 = to_packed(xb, bits), to_packed(xq, bits)
    flat = faiss.IndexBinaryFlat(bits)
    flat.add(xb8)
    scan = LinearScan(bits)
    scan.add(xb)
    scan.threads = 1
    index.search(xq[:2], k)
    scan.search(xq[:2], k)
    best, out = interleaved({"probe": lambda: index.search(xq, k),
                             "scan": lambda: scan.search(xq, k),
                             "flat": lambda: flat.search(xq8, k),
                             "scan_range": lambda: scan.range_search(xq, 2),
                             "flat_range": lambda: flat.range_search(xq8, 3)})
    t_probe, t_scan, t_flat = best["probe"], best["scan"], best["flat"]
    (D, I), (sD, sI), (fD, fI) = out["probe"], out["scan"], out["flat"]
    assert (D == fD).all() and (sD == fD).all(), f"{name}: k-NN distances differ from FAISS"
    _, _, st = index.search(xq, k, stats=True)
    auto = make_index(bits, "auto")
    auto.add(xb)
    auto.threads = 1
    auto.search(xq[:2], k)
    t_auto, (aD, aI) = timed(lambda: auto.search(xq, k))
    assert (aD == D).all() and (aI == I).all(), f"{name}: auto k-NN differs"
    assert (D == sD).all() and (I == sI).all()
    t_srange, (sl, _, sI2) = best["scan_range"], out["scan_range"]
    t_frange, (fl, _, fI2) = best["flat_range"], out["flat_range"]
    assert same_sets(sl, sI2, fl, fI2), f"{name}: scan range results differ from FAISS"
    return {"knn_probe_qps": nq / t_probe, "knn_flat_qps": nq / t_flat,
            "knn_speedup_vs_flat": t_flat / t_probe,
            "knn_median_speedup_vs_flat": t_flat / nq / (np.median(st.total_ns) * 1e-9),
            "knn_radii": np.bincount(st.radii).tolist(),
            "knn_auto_speedup_vs_flat": t_flat / t_auto,
            "scan_knn_vs_flat": t_flat / t_scan, "scan_range_vs_flat": t_frange / t_srange}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    faiss.omp_set_num_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    cells = []
    for n in sizes:
        cells += [(f"uniform64-{n}", lambda n=n: uniform_codes(n, 64, 1), 64),
                  (f"clustered64-{n}", lambda n=n: clustered_codes(n, 64, n // 100, 0.01, 2), 64)]
        if n <= 1_000_000:
            cells.append((f"uniform32-{n}", lambda n=n: uniform_codes(n, 32, 3), 32))
    results = []
    print(f"machine: {platform.processor() or platform.machine()}, single thread")
    for name, make, bits in cells:
        xb = make()
        row, index = bench_dataset(name, xb, bits, {0: 2000, 1: 2000, 2: 1000, 3: 100}, 200)
        if name.startswith("clustered") or bits == 32:
            row.update(bench_knn_and_scan(name, xb, bits, index, 200))
        results.append(row)
        print(f"\n{name}: build {row['build_s']:.2f} s, {row['bytes_per_item']:.1f} B/item "
              f"(FAISS hash build {row['faiss_hash_build_s']:.2f} s)")
        print(f"  {'r':>2} {'q/s':>10} {'FAISS q/s':>10} {'x FAISS':>8} {'ns/probe':>9} "
              f"{'FAISS ns/probe':>14} {'stats cost':>10}")
        for r in range(4):
            c = row[f"r{r}"]
            print(f"  {r:>2} {c['qps']:>10.0f} {c['faiss_hash_qps']:>10.0f} "
                  f"{c['speedup_vs_faiss_hash']:>8.1f} {c['ns_per_probe']:>9.1f} "
                  f"{c['faiss_ns_per_probe']:>14.1f} {c['stats_overhead']:>+10.1%}")
        if "knn_probe_qps" in row:
            print(f"  k-NN k=10: probing {row['knn_probe_qps']:.0f} q/s, IndexBinaryFlat "
                  f"{row['knn_flat_qps']:.0f} q/s: x{row['knn_speedup_vs_flat']:.1f} (median "
                  f"query x{row['knn_median_speedup_vs_flat']:.0f}; queries per number of radii "
                  f"searched {row['knn_radii']}); auto mode x{row['knn_auto_speedup_vs_flat']:.1f}")
            print(f"  "
                  f"our scan vs IndexBinaryFlat: k-NN x{row['scan_knn_vs_flat']:.2f}, "
                  f"range x{row['scan_range_vs_flat']:.2f}")
        del index, xb
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
