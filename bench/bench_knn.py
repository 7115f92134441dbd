"""k-NN against FAISS ``IndexBinaryFlat``, one thread, one process (issue 28, item 3).

Uniform 64-bit codes (2M by default, ``--n 10000000``); queries: random codes, and near ones
(database codes with ``--flips`` bits flipped); k = 1, 10, 100. Engines: ``auto`` (the planner,
its default substring count; the plan, which engine answered how many queries and the
predicted costs are printed and saved), ``mih`` with the default substring count and with
``m = 4`` (``--m``; 16-bit substrings at these sizes, see bench/RESULTS.md), our scan (the
blocked k-NN scan of index/scan.py), FAISS ``IndexBinaryFlat`` built in the same process.
Every answer is compared with FAISS's: the distances row for row, and the ids where FAISS's
order is the same as ours ((distance, id): FAISS breaks ties by id too for IndexBinaryFlat,
checked here). Time: thread CPU time
(``time.thread_time``) of each batch, the best of ``--reps`` runs, engines interleaved run by
run, so other processes on a shared machine hit them alike; ratios are FAISS time / ours.

    python bench/bench_knn.py                  # 2M
    python bench/bench_knn.py --n 10000000     # 10M
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import faiss
import numpy as np

from bucketsearch.index.codes import to_packed
from bucketsearch.index.synth import queries_near, uniform_codes
from bucketsearch.index.mih import MultiIndex
from bucketsearch.index.planner import AutoIndex
from bucketsearch.index.scan import LinearScan

OUT = Path(__file__).resolve().parent / "out"
KS = (1, 10, 100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--nq", type=int, default=200)
    ap.add_argument("--flips", type=int, default=4)
    ap.add_argument("--m", type=int, default=4, help="substrings of the second mih")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    bits, n = 64, args.n
    faiss.omp_set_num_threads(1)
    xb = uniform_codes(n, bits, seed=0)
    ids = np.arange(n, dtype=np.int64)
    queries = {"random": uniform_codes(args.nq, bits, seed=7),
               "near": queries_near(xb, args.nq, bits, flips=args.flips, seed=8)}
    engines = {}
    t = time.perf_counter()
    engines["auto"] = AutoIndex(bits)
    engines["auto"].build(xb, ids)
    print(f"auto build {time.perf_counter() - t:.1f} s (m = {engines['auto'].substrings})")
    for name, m in (("mih m=default", None),
                    (f"mih m={args.m}", args.m)):
        engines[name] = MultiIndex(bits, substrings=m)
        engines[name].build(xb, ids)
    engines["scan"] = LinearScan(bits)
    engines["scan"].build(xb, ids)
    for e in engines.values():
        e.threads = 1
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    flat = faiss.IndexBinaryFlat(bits)
    flat.add(to_packed(xb, bits))
    default_m = engines["mih m=default"].substrings
    print(f"n = {n:,}, nq = {args.nq}, one thread; default m = {default_m}")
    rows = []
    for qname, xq in queries.items():
        packed = to_packed(xq, bits)
        for k in KS:
            runs = {name: (lambda e=e: e.search(xq, k)) for name, e in engines.items()}
            runs["faiss flat"] = lambda: flat.search(packed, k)
            best = dict.fromkeys(runs, float("inf"))
            out = {}
            for name, fn in runs.items():
                fn() if name != "faiss flat" else None  # warm-up / compile
            for _ in range(args.reps):
                for name, fn in runs.items():
                    t = time.thread_time()
                    out[name] = fn()
                    best[name] = min(best[name], time.thread_time() - t)
            fD, fI = out["faiss flat"]
            row = {"queries": qname, "k": k, "n": n}
            for name in engines:
                D, I = out[name]
                same_d = np.array_equal(D, fD)
                same_i = np.array_equal(I, fI)
                row[name] = {"us_per_query": best[name] / len(xq) * 1e6,
                             "x_faiss": best["faiss flat"] / best[name],
                             "same_distances": bool(same_d), "same_ids": bool(same_i)}
            row["faiss_us_per_query"] = best["faiss flat"] / len(xq) * 1e6
            plan = engines["auto"].last_plan
            row["auto_plan"] = plan["mode"]
            row["auto_ran"] = plan.get("ran")
            row["auto_deferred_to_scan"] = plan.get("deferred_to_scan")
            row["auto_mih_budget_us"] = (None if plan.get("mih_budget_ns") is None
                                         else plan["mih_budget_ns"] / 1e3)
            row["auto_predicted_us"] = {m: None if v is None else v / 1e3
                                        for m, v in plan["predicted_ns"].items()}
            row["auto_radius"] = plan["radius"]
            rows.append(row)
            cells = "  ".join(
                f"{name} {row[name]['us_per_query']:8.0f} us {row[name]['x_faiss']:6.1f}x"
                + ("" if row[name]["same_ids"] else " (ids differ)" if row[name]["same_distances"]
                   else " (WRONG)") for name in engines)
            pred = {m: None if v is None else round(v) for m, v in
                    row["auto_predicted_us"].items()}
            print(f"{qname:6} k={k:<3} faiss {row['faiss_us_per_query']:8.0f} us | {cells} | "
                  f"auto planned {plan['mode']}, ran {plan.get('ran')} (deferred to the scan "
                  f"{plan.get('deferred_to_scan')} of {len(xq)}; R {plan['radius']}, predicted "
                  f"us {pred})", flush=True)
    OUT.mkdir(exist_ok=True)
    path = OUT / f"bench_knn_{n}.json"
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    path.write_text(json.dumps({"args": vars(args), "rows": rows,
                                "scan_calibration": engines["auto"].calibration["scan"]},
                               indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
