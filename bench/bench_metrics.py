"""Benchmark of the evaluation toolkit against the argsort-based evaluation common in hashing code.

Run:  .venv/bin/python bench/bench_metrics.py            # CIFAR-10 protocol size (1,000 x 59,000)
      .venv/bin/python bench/bench_metrics.py --big      # also 10,000 x 1,000,000
      .venv/bin/python bench/bench_metrics.py --quick    # small sizes, a smoke run

Figures printed:
* "all metrics": :func:`bucketsearch.index.metrics.evaluate` end to end (histogram pass with the
as-ranked
  sums and the distinct-code pass, P/R/F macro+micro, RAMAP, mLGAP, AUPRC, empty balls,
  tie-aware/best/worst/as-ranked MAP at k = 10, 100, 1000 and over the whole ranking, NDCG...).
* "MAP@all + P/R@radius": only what the baseline computes (histogram pass without the as-ranked
  and code extras, then the metrics), for the like-for-like ratio.
* the baseline: per query, the Hamming distances by the {-1,+1} inner product
  ``0.5 * (Q - B q)``, ``np.argsort`` of the distances, the relevance vector reordered, MAP as
  ``mean(count / tindex)`` (DeepHash-pytorch ``CalcMap``/``CalcTopMap``, the ITQ/SDH MATLAB
  scripts do the same with ``sort``), and precision/recall at every radius from the sorted
  distances (cumulative relevant counts at each radius boundary).
Both give the same MAP@all (as-ranked with a stable sort = ties broken by db index) and the same
P/R; the script checks it. Times are the best of ``--repeat`` runs after a warm-up (compile).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numba  # noqa: E402

from bucketsearch.index.metrics import (evaluate, hamming_histograms, radius_metrics,  # noqa: E402
                                        ranking_metrics)
from bucketsearch.index.metrics.relevance import from_labels  # noqa: E402


def argsort_baseline(q_pm: np.ndarray, b_pm: np.ndarray, yq: np.ndarray, yb: np.ndarray,
                     radius_max: int):
    """MAP@all and macro P/R at radius 0..radius_max, the way common scripts do it."""
    bits = b_pm.shape[1]
    nq = len(q_pm)
    maps = np.zeros(nq)
    prec = np.zeros((nq, radius_max + 1))
    rec = np.zeros((nq, radius_max + 1))
    for i in range(nq):
        gnd = (yq[i] == yb).astype(np.float32)
        tsum = int(gnd.sum())
        hamm = 0.5 * (bits - b_pm @ q_pm[i])
        ind = np.argsort(hamm, kind="stable")
        gnd = gnd[ind]
        hs = hamm[ind]
        if tsum:
            count = np.linspace(1, tsum, tsum)
            tindex = np.asarray(np.where(gnd == 1)).ravel() + 1.0
            maps[i] = np.mean(count / tindex)
        cum = np.cumsum(gnd)
        ends = np.searchsorted(hs, np.arange(radius_max + 1), side="right")
        tp = np.where(ends > 0, cum[np.maximum(ends - 1, 0)], 0.0)
        prec[i] = np.where(ends > 0, tp / np.maximum(ends, 1), 0.0)
        rec[i] = tp / tsum if tsum else 0.0
    return maps.mean(), prec.mean(0), rec.mean(0)


def clustered_codes(nb: int, nq: int, bits: int, n_classes: int = 10, flip: float = 0.2,
                    seed: int = 0):
    """Codes with class structure: a prototype per class (and sub-prototypes), bits flipped
    with probability ``flip``; labels are the classes (a stand-in for learned hash codes)."""
    rng = np.random.default_rng(seed)
    protos = rng.integers(0, 2, (n_classes * 4, bits), dtype=np.uint8)
    n = nb + nq
    y = rng.integers(0, n_classes, n)
    sub = y * 4 + rng.integers(0, 4, n)
    codes = protos[sub] ^ (rng.random((n, bits), dtype=np.float32) < flip).astype(np.uint8)
    return codes[:nb], y[:nb], codes[nb:], y[nb:]


def best_of(fn, repeat: int):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def run_size(label, xb, yb, xq, yq, bits, repeat, baseline_queries=None, radius_max=10):
    rel = from_labels(yq, yb)
    nq, nb = len(xq), len(xb)
    print(f"\n== {label}: {nq} queries x {nb} db items, Q = {bits}, "
          f"{numba.get_num_threads()} numba threads ==")
    t0 = time.perf_counter()
    evaluate(xb[:50], xq[:5], from_labels(yq[:5], yb[:50]), ks=(10, 100, 1000))  # warm-up
    print(f"warm-up (compile or cache load): {time.perf_counter() - t0:.2f} s")

    t_all, res = best_of(lambda: evaluate(xb, xq, rel, ks=(10, 100, 1000)), repeat)
    print(f"all metrics (evaluate):               {t_all:8.3f} s")

    def light():
        h = hamming_histograms(xb, xq, rel, ks=[10], as_ranked=False, code_stats=False)
        return ranking_metrics(h)["mean"]["map_all_tie_aware"], radius_metrics(h)

    def light_ranked():
        h = hamming_histograms(xb, xq, rel, ks=[10], as_ranked=True, code_stats=False)
        return ranking_metrics(h)["mean"]["map_all_ranked"], radius_metrics(h)

    t_light, (map_ta, rm) = best_of(light, repeat)
    t_ranked, (map_ranked, _) = best_of(light_ranked, repeat)
    print(f"MAP@all (tie-aware) + P/R@radius:     {t_light:8.3f} s")
    print(f"MAP@all (as-ranked) + P/R@radius:     {t_ranked:8.3f} s")
    out = {"t_all": t_all, "t_light": t_light, "t_ranked": t_ranked}

    bq = nq if baseline_queries is None else min(baseline_queries, nq)
    b_pm = np.where(xb > 0, 1.0, -1.0).astype(np.float32)
    q_pm = np.where(xq[:bq] > 0, 1.0, -1.0).astype(np.float32)
    t_base, (bmap, bprec, brec) = best_of(
        lambda: argsort_baseline(q_pm, b_pm, yq[:bq], yb, radius_max), 1 if bq < nq else repeat)
    scale = nq / bq
    if bq == nq:
        ok_map = abs(bmap - map_ranked) < 1e-9
        ok_pr = np.allclose(bprec, rm.precision_macro[:radius_max + 1]) and \
            np.allclose(brec, rm.recall_macro[:radius_max + 1])
        print(f"argsort baseline (MAP@all + P/R):     {t_base:8.3f} s   "
              f"(same MAP: {ok_map}, same P/R: {ok_pr})")
    else:
        print(f"argsort baseline on {bq} queries:     {t_base:8.3f} s   "
              f"-> {t_base * scale:.1f} s extrapolated to {nq} queries")
    out["t_base"] = t_base * scale
    print(f"speedup vs argsort (as-ranked MAP + P/R, like for like): "
          f"{t_base * scale / t_ranked:6.1f}x")
    print(f"speedup vs argsort (tie-aware MAP + P/R):                "
          f"{t_base * scale / t_light:6.1f}x")
    print(f"speedup vs argsort (all metrics vs MAP + P/R only):      "
          f"{t_base * scale / t_all:6.1f}x")
    print(f"MAP@all tie-aware {res['map_all']['tie_aware']:.4f}  as-ranked "
          f"{res['map_all']['ranked']:.4f}  best {res['map_all']['best']:.4f}  worst "
          f"{res['map_all']['worst']:.4f}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes only (smoke run)")
    p.add_argument("--big", action="store_true", help="also run 10,000 x 1,000,000")
    p.add_argument("--big-nq", type=int, default=10_000)
    p.add_argument("--big-nb", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="numba threads (default: all)")
    args = p.parse_args(argv)
    if args.threads:
        numba.set_num_threads(args.threads)
    print(f"machine: {os.cpu_count()} cores; numpy {np.__version__}, numba {numba.__version__}")
    if args.quick:
        xb, yb, xq, yq = clustered_codes(5_000, 100, 64)
        run_size("quick", xb, yb, xq, yq, 64, 1)
        return 0
    from bucketsearch.index.evaluation.coding import lsh_codes
    from bucketsearch.index.evaluation.datasets import synthetic_cifar
    data = synthetic_cifar()
    xb, xq = lsh_codes(data.xb, data.xq, 64)
    run_size("CIFAR-10 protocol, LSH codes on the embedded data", xb, data.yb, xq, data.yq, 64,
             args.repeat)
    if args.big:
        xb, yb, xq, yq = clustered_codes(args.big_nb, args.big_nq, 64)
        run_size("large", xb, yb, xq, yq, 64, 1, baseline_queries=50)
    return 0


if __name__ == "__main__":
    sys.exit(main())
