"""Multi-index k-NN of another checkout (BASE: the layout before positions, 428bbce) against this
one, interleaved in one process: every k-NN cell, not only bench_ab.py's clustered k = 10.

    BASE=/tmp/base428 N=1000000 REPS=7 NUMBA_CACHE_DIR=/tmp/knn_ab_numba \\
        .venv/bin/python bench/bench_mih_knn_ab.py      # DATA=clustered KS=10 pick cells

Cells: data (uniform 64-bit codes, seed 1; clustered: N/100 centres, bit-flip probability
0.01, seed 1, bench_ab.py's) x queries (near: database codes with one bit flipped, 500 of them,
bench_ab.py's; random: uniform codes, 20 of them, far from every item) x k = 1, 10, 100. Both
engines are :class:`MultiIndex` built from the same codes and ids (each its own layout),
``threads = 1``, ``search(xq, k)`` (no budget, no scan). Per cell: ``REPS`` rounds, each timing
old then new (order alternating per round), least thread CPU time of 3 calls per timing;
reports the median us per query of each and the median, min and max of the per-round ratios
new/old. Every answer (distances and ids, tie order) is checked identical first.
"""
import json
import os
import statistics

import oldtree
from cputime import best

BASE = os.environ.get("BASE", "/tmp/base428")
oldtree.install(BASE)

import numpy as np  # noqa: E402

from bucketsearch.index.mih import MultiIndex as NewMIH  # noqa: E402
from bucketsearch.index.synth import clustered_codes, queries_near, uniform_codes  # noqa: E402
from oldbs.index.mih import MultiIndex as OldMIH  # noqa: E402

QUERIES = {"near": 500, "random": 20}


def main():
    n = int(os.environ.get("N", 1_000_000))
    reps = int(os.environ.get("REPS", 7))
    ks = [int(k) for k in os.environ.get("KS", "1,10,100").split(",")]
    bits = 64
    rows = []
    print(f"loadavg before: {open('/proc/loadavg').read().strip()}", flush=True)
    for data in os.environ.get("DATA", "clustered,uniform").split(","):
        xb = (clustered_codes(n, bits, n // 100, 0.01, seed=1) if data == "clustered"
              else uniform_codes(n, bits, 1))
        ids = np.arange(n, dtype=np.int64)
        engines = {}
        for which, cls in (("old", OldMIH), ("new", NewMIH)):
            ix = cls(bits)
            ix.add(xb, ids)
            ix.threads = 1
            engines[which] = ix
        qsets = {"near": queries_near(xb, QUERIES["near"], bits, flips=1, seed=7),
                 "random": uniform_codes(QUERIES["random"], bits, 5)}
        for qname, xq in qsets.items():
            for k in ks:
                label = f"{data} {qname} k={k}"
                a = engines["old"].search(xq, k)
                b = engines["new"].search(xq, k)
                assert all(np.array_equal(x, y) for x, y in zip(a, b)), label
                old_t, new_t, ratios = [], [], []
                for rep in range(reps):
                    order = ("old", "new") if rep % 2 == 0 else ("new", "old")
                    t = {}
                    for which in order:
                        ix = engines[which]
                        t[which] = best(lambda: ix.search(xq, k), 3)
                    old_t.append(t["old"])
                    new_t.append(t["new"])
                    ratios.append(t["new"] / t["old"])
                nq = len(xq)
                row = {"cell": label, "n": n, "nq": nq,
                       "old_us_per_q": statistics.median(old_t) / nq * 1e6,
                       "new_us_per_q": statistics.median(new_t) / nq * 1e6,
                       "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                       "ratio_max": max(ratios)}
                rows.append(row)
                print(f"{label:24s} nq={nq:4d} old {row['old_us_per_q']:10.2f} us/q  new "
                      f"{row['new_us_per_q']:10.2f} us/q  new/old median "
                      f"{row['ratio_median']:.3f} [{row['ratio_min']:.3f}, "
                      f"{row['ratio_max']:.3f}]", flush=True)
        del engines, xb
    print(f"loadavg after: {open('/proc/loadavg').read().strip()}")
    out = os.environ.get("OUT", "bench/out/bench_mih_knn_ab.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
