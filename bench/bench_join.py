"""All pairs within r (issue 27): our self-join against the FAISS user's loop, one thread, one run.

Data (deterministic, ``--seed``): uniform codes, then 5% of the items overwritten by a copy of
another item with 0..r random bits flipped (planted near-duplicates). Cells:

* 64-bit codes, r = 3, ``--n`` items (default 1M; acceptance ``--n 10000000``);
* 256-bit codes, r = 16 and r = 31, ``--n256`` items (default 100k; acceptance 1M).

Ours: ``bucketsearch.index.join.pairs`` over a :class:`LinearScan` holding the codes (the join reads
the index's codes and ids), every chunk consumed; the cost model's prediction
(``predict_join``) is taken first and compared with the measured time; resident memory is
sampled every 20 ms during the join (``/proc/self/statm``) and its growth over the resident size
before the join reported.

FAISS, the user's loop: build the index (timed), then ``range_search`` of every item against it
with radius r + 1 (FAISS's range search is strict, ``d < radius``), then de-duplicate the pairs
(not timed: in FAISS's favour). Only a random sample of the items is searched, timed, and the
time scaled by ``N / sample`` (stated in the output). Indexes tried, each with
``faiss.omp_set_num_threads(1)``: ``IndexBinaryFlat``; ``IndexBinaryMultiHash`` with ``nhash``
disjoint substrings of ``b`` bits and ``nflip = floor(r / nhash)`` (exact by pigeonhole);
``IndexBinaryHash`` (b-bit prefix, nflip = r) when it probes fewer than 10^5 buckets. Each is
checked exact on the sample: its neighbour count of every sampled item equals ours. The best
exact one is the baseline.

    python bench/bench_join.py                                # quick: 1M and 100k
    python bench/bench_join.py --n 10000000 --n256 1000000    # the acceptance figures
    python bench/bench_join.py --only memory --n 1000000      # many pairs: spilled runs, RSS
    python bench/bench_join.py --no-faiss [--wall-calibration]  # the cost model only

``--wall-calibration`` runs the cost model as it was before it was put in CPU time: the
constants timed in wall-clock seconds (``time.perf_counter``) and no slowdown factor, to compare
the two calibrations' predicted / measured ratios over several processes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import threading
import time

import faiss
import numpy as np

from bucketsearch.index import join
from bucketsearch.index.codes import to_packed
from bucketsearch.index.scan import LinearScan

PAGE = os.sysconf("SC_PAGE_SIZE")


def planted_codes(n: int, bits: int, radius: int, seed: int, share: float = 0.05):
    """Uniform codes with ``share`` of the items a copy of another item, 0..radius bits flipped."""
    rng = np.random.default_rng(seed)
    W = bits // 64
    words = rng.integers(0, 2**64 - 1, size=(n, W), dtype=np.uint64, endpoint=True)
    m = int(n * share)
    dst = rng.choice(n, m, replace=False)
    planted = words[rng.integers(0, n, m)].copy()
    flips = rng.integers(0, radius + 1, m)
    for s in range(radius):
        pos = rng.integers(0, bits, m)
        sel = s < flips
        planted[sel, pos[sel] // 64] ^= np.uint64(1) << (63 - pos[sel] % 64).astype(np.uint64)
    words[dst] = planted
    return words


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRss:
    """Peak resident size over a block, sampled every 20 ms by a thread."""

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth(self) -> int:
        return self.peak - self.base


def run_ours(words, bits, radius):
    n = len(words)
    index = LinearScan(bits)
    index._set_items(words, np.arange(n, dtype=np.int64))  # the codes as an index, by id
    t = time.perf_counter()
    pred = join.predict_join(index, radius)
    predict_s = time.perf_counter() - t
    stats = join.JoinStats()
    counts = np.zeros(n, dtype=np.int32)  # neighbours per item, to check FAISS on its sample
    n_pairs = 0
    with PeakRss() as mem:
        t = time.perf_counter()
        for ch in join.pairs(index, radius, stats=stats):
            n_pairs += len(ch)
            np.add.at(counts, ch.a, 1)
            np.add.at(counts, ch.b, 1)
        join_s = time.perf_counter() - t
    plan_s = stats.phases.get("plan", {}).get("measured_s", 0.0)
    work = [ph for name, ph in stats.phases.items() if name != "plan"]
    return {"seconds": join_s, "seconds_without_plan": join_s - plan_s, "pairs": n_pairs,
            "predict_s": predict_s, "predicted_s": pred.seconds,
            # the model in CPU seconds of the joining thread against the phases' CPU time
            "predicted_cpu_s": pred.cpu_seconds, "slowdown": pred.slowdown,
            "measured_cpu_s": sum(ph["measured_cpu_s"] for ph in work),
            "measured_phases_s": sum(ph["measured_s"] for ph in work),
            "prediction": pred.to_dict(), "stats": stats.to_dict(),
            "rss_growth_mb": mem.growth / 2**20, "rss_before_mb": mem.base / 2**20}, counts


def faiss_candidates(bits, radius, n):
    """Flat; MultiHash with nhash in {2, 3, 4, 8, 16, r + 1} disjoint substrings (b = Q // nhash
    <= 64 bits, nflip = floor(r / nhash): exact by pigeonhole) when a query probes at most 10^5
    buckets and meets at most 2 10^5 uniform candidates; Hash (b ~ log2 N, nflip = r) when a
    query probes at most 10^5 buckets."""
    out = [("IndexBinaryFlat", lambda: faiss.IndexBinaryFlat(bits))]
    for nhash in sorted({2, 3, 4, 8, 16, radius + 1}):
        b = bits // nhash
        if not 1 <= b <= 64:
            continue
        nflip = radius // nhash
        if sum(math.comb(b, i) for i in range(nflip + 1)) * nhash > 10**5 \
                or nhash * n / 2.0**b > 2e5:
            continue

        def make(nhash=nhash, b=b, nflip=nflip):
            ix = faiss.IndexBinaryMultiHash(bits, nhash, b)
            ix.nflip = nflip
            return ix
        out.append((f"IndexBinaryMultiHash(nhash={nhash}, b={b}, nflip={nflip})", make))
    b = min(bits, max(8, int(math.log2(max(n, 2)))))
    if sum(math.comb(b, i) for i in range(radius + 1)) <= 10**5:
        def make_hash(b=b):
            ix = faiss.IndexBinaryHash(bits, b)
            ix.nflip = radius
            return ix
        out.append((f"IndexBinaryHash(b={b}, nflip={radius})", make_hash))
    return out


def run_faiss(words, bits, radius, counts, budget_s, seed, only=None):
    faiss.omp_set_num_threads(1)
    n = len(words)
    packed = to_packed(words, bits)
    rng = np.random.default_rng(seed + 1)
    results = []
    for name, make in faiss_candidates(bits, radius, n):
        if only and not any(o in name for o in only):
            continue
        t = time.perf_counter()
        index = make()
        index.add(packed)
        build_s = time.perf_counter() - t
        sample = 64
        done = 0
        spent = 0.0
        exact = True
        order = rng.permutation(n)
        while spent < budget_s and done < n:
            q = np.sort(order[done:done + sample])
            t = time.perf_counter()
            lims, D, I = index.range_search(packed[q], radius + 1)
            spent += time.perf_counter() - t
            got = np.diff(lims) - 1  # itself excluded
            exact &= bool(np.array_equal(got, counts[q]))
            done += len(q)
            sample = min(2 * sample, 100_000)
        search_s = spent / done * n
        results.append({"index": name, "build_s": build_s, "sample": done,
                        "sample_s": spent, "search_s_scaled": search_s,
                        "total_s_scaled": build_s + search_s, "exact_on_sample": exact})
        print(f"    faiss {name}: build {build_s:.1f} s, {done:,} of {n:,} items searched in "
              f"{spent:.1f} s -> {search_s:.0f} s scaled; exact on the sample: {exact}",
              flush=True)
        del index
    return results


def cell(n, bits, radius, seed, budget_s, only=None):
    print(f"\n== {n:,} {bits}-bit codes, 5% planted near-duplicates, r = {radius}", flush=True)
    words = planted_codes(n, bits, radius, seed)
    ours, counts = run_ours(words, bits, radius)
    p = ours["prediction"]
    print(f"    ours: {ours['pairs']:,} pairs in {ours['seconds']:.2f} s ({p['algorithm']} "
          f"{p['params']}; the plan {ours['stats']['phases'].get('plan', {}).get('measured_s', 0):.2f} s "
          f"of it); predicted {ours['predicted_s']:.2f} s, measured without the plan "
          f"{ours['seconds_without_plan']:.2f} s (ratio "
          f"{ours['seconds_without_plan'] / ours['predicted_s']:.2f}); RSS growth "
          f"{ours['rss_growth_mb']:.0f} MB", flush=True)
    print(f"    CPU time of the joining thread: predicted {ours['predicted_cpu_s']:.2f} s, "
          f"measured {ours['measured_cpu_s']:.2f} s (ratio "
          f"{ours['measured_cpu_s'] / ours['predicted_cpu_s']:.2f}); slowdown at the prediction "
          f"{ours['slowdown']:.2f}, during the join (wall / CPU of the phases) "
          f"{ours['measured_phases_s'] / max(ours['measured_cpu_s'], 1e-9):.2f}", flush=True)
    for name, ph in ours["stats"]["phases"].items():
        mod = ph["modeled_s"]
        mod_cpu = ph.get("modeled_cpu_s")
        print(f"      phase {name}: measured {ph['measured_s']:.2f} s "
              f"(CPU {ph['measured_cpu_s']:.2f}), modeled "
              f"{mod if mod is None else round(mod, 2)} s "
              f"(CPU {mod_cpu if mod_cpu is None else round(mod_cpu, 2)})")
    if budget_s <= 0:  # --no-faiss
        return {"n": n, "bits": bits, "radius": radius, "ours": ours}
    fa = run_faiss(words, bits, radius, counts, budget_s, seed, only)
    exact = [r for r in fa if r["exact_on_sample"]]
    best = min(exact, key=lambda r: r["total_s_scaled"]) if exact else None
    if best:
        print(f"    best FAISS: {best['index']}, {best['total_s_scaled']:.0f} s (build + "
              f"scaled search) -> ours is {best['total_s_scaled'] / ours['seconds']:.1f}x faster "
              f"({best['search_s_scaled'] / ours['seconds']:.1f}x against its search alone)",
              flush=True)
    return {"n": n, "bits": bits, "radius": radius, "ours": ours, "faiss": fa,
            "best_faiss": best, "speedup": best and best["total_s_scaled"] / ours["seconds"]}


def memory_cell(n: int, seed: int):
    """Many pairs: ``n`` codes drawn from n / 50 distinct ones (about 50 copies each), r = 2:
    ~25 pairs an item, more than ``memory_pairs`` (8M), so sorted runs are spilled; the resident
    memory's growth during the join."""
    print(f"\n== many pairs: {n:,} 64-bit codes of {n // 50:,} distinct ones, r = 2", flush=True)
    rng = np.random.default_rng(seed)
    distinct = rng.integers(0, 2**63, size=(n // 50, 1), dtype=np.uint64)
    index = LinearScan(64)
    index._set_items(distinct[rng.integers(0, n // 50, n)], np.arange(n, dtype=np.int64))
    join.join_constants(1)
    stats = join.JoinStats()
    total = 0
    with PeakRss() as mem:
        t = time.perf_counter()
        for ch in join.pairs(index, 2, stats=stats):
            total += len(ch)
        seconds = time.perf_counter() - t
    print(f"    {total:,} pairs in {seconds:.1f} s ({stats.algorithm} {stats.params}), "
          f"{stats.spilled_runs} sorted runs spilled, RSS growth {mem.growth / 2**20:.0f} MB "
          f"(pairs alone, packed: {total * 8 / 2**20:.0f} MB)", flush=True)
    return {"n": n, "pairs": total, "seconds": seconds, "spilled_runs": stats.spilled_runs,
            "rss_growth_mb": mem.growth / 2**20}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="64-bit items (r = 3)")
    ap.add_argument("--n256", type=int, default=100_000, help="256-bit items (r = 16, 31)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--faiss-budget", type=float, default=20.0,
                    help="seconds of FAISS searching per index (the sample grows until then)")
    ap.add_argument("--only", choices=["64", "256", "memory"], default=None)
    ap.add_argument("--faiss-only", action="append", default=None, metavar="TEXT",
                    help="only the FAISS indexes whose name contains TEXT (repeatable), e.g. "
                         "the best of an earlier run")
    ap.add_argument("--no-faiss", action="store_true",
                    help="ours only (the cost model's predicted against measured)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--wall-calibration", action="store_true",
                    help="the earlier cost model: constants in wall-clock seconds, no slowdown")
    args = ap.parse_args()
    if args.no_faiss:
        args.faiss_budget = 0.0
    if args.wall_calibration:  # the constants timed with time.thread_time read as wall time
        import types
        join.time = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time)
                                             if not k.startswith("_")})
        join.time.thread_time = time.perf_counter
        for words in (1, 4):  # cached for the process
            join.join_constants(words)
        join.time = time
        join.slowdown = lambda *a, **k: 1.0
    print(f"bench_join: {platform.processor() or platform.machine()}, numpy {np.__version__}, "
          f"faiss {faiss.__version__}, one thread", flush=True)
    cells = []
    if args.only in (None, "64"):
        cells.append(cell(args.n, 64, 3, args.seed, args.faiss_budget, args.faiss_only))
    if args.only in (None, "256"):
        for r in (16, 31):
            cells.append(cell(args.n256, 256, r, args.seed, args.faiss_budget,
                              args.faiss_only))
    if args.only == "memory":
        cells.append(memory_cell(args.n, args.seed))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "cells": cells}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
