"""Another checkout's engine (BASE) against this one, interleaved in one process.

    git worktree add /tmp/base_tree a5029b1     # the code to compare with
    BASE=/tmp/base_tree N=1000000 REPS=11 NUMBA_CACHE_DIR=$(mktemp -d) \
        .venv/bin/python bench/bench_ab.py      # CELLS="mih r=3,mih r=4" picks cells


The old tree is imported as package ``oldbs`` (its sources with ``bucketsearch.`` rewritten to
``oldbs.``), so both engines run side by side on the same data, single thread. Per cell:
``reps`` rounds, each timing old then new (order alternating per round), least thread CPU time
of 3 calls per timing; reports median old, median new and the median, min and max of the
per-round ratios new/old. ``OLD_BUILDS=1``: the old engine builds its own tables from the codes
(for a change of the tables' layout, e.g. narrower offsets) instead of loading the new one's;
it also adds the planner's cells (``auto``: each side calibrates and plans on its own, as
bench_mih.py's ``auto`` column). ``DATA=uniform`` (default ``clustered``: N/100 centres, bits
flipped with probability 0.01), ``BITS=32`` (default 64) and ``MIH_RADII=0,1,...,8`` (default
0-4) give the other cells of bench_mih.py. ``MIH_NQ`` sets the batch of the ``mih`` and
``auto`` range cells below radius 5 (default 1,000): 10,000 makes a batch's candidates spill
out of the caches between calls (bench/RESULTS.md section 34). Without ``OLD_BUILDS`` both
engines read the very same arrays; two separate builds of identical code measured 1.06-1.07
apart on uniform codes here, by where their arrays landed (section 34).

``FRESH=1`` times each call on a batch neither engine searched before (one call per timing,
not the least of 3; the old and new engine swap the two batches of a round every round), so a
batch's buckets and candidates come from memory, as in a server's traffic; without it a cell
repeats one batch and, below ~10M codes, its candidates stay in the caches between calls.
"""
import json
import os
import statistics

import oldtree
from cputime import best

BASE = os.environ.get("BASE", "/tmp/base_tree")
oldtree.install(BASE)

import numpy as np  # noqa: E402

from bucketsearch.index.disk.hugepages import wait_for_collapse  # noqa: E402
from bucketsearch.index.synth import clustered_codes, queries_near, uniform_codes  # noqa: E402
from bucketsearch.index.mih import MultiIndex as NewMIH  # noqa: E402
from bucketsearch.index.planner import AutoIndex as NewAuto  # noqa: E402
from bucketsearch.index.probe import HammingIndex as NewSingle  # noqa: E402
from bucketsearch.index.scan import LinearScan as NewScan  # noqa: E402
from oldbs.index.mih import MultiIndex as OldMIH  # noqa: E402
from oldbs.index.planner import AutoIndex as OldAuto  # noqa: E402
from oldbs.index.probe import HammingIndex as OldSingle  # noqa: E402
from oldbs.index.scan import LinearScan as OldScan  # noqa: E402

assert OldSingle is not NewSingle and OldSingle.__module__ == "oldbs.index.probe"


def main():
    n = int(os.environ.get("N", 1_000_000))
    reps = int(os.environ.get("REPS", 7))
    fresh = bool(os.environ.get("FRESH"))
    bits = int(os.environ.get("BITS", 64))
    data = os.environ.get("DATA", "clustered")
    if data not in ("clustered", "uniform"):
        raise SystemExit(f"DATA must be clustered or uniform, got {data!r}")
    mih_radii = [int(r) for r in os.environ.get("MIH_RADII", "0,1,2,3,4").split(",")]
    old_builds = bool(os.environ.get("OLD_BUILDS"))
    print(f"{data} {n:,} codes of {bits} bits{', fresh batches' if fresh else ''}; old engines "
          f"{'built from the codes' if old_builds else 'loaded from the new snapshots'}")
    xb = (uniform_codes(n, bits, seed=1) if data == "uniform"
          else clustered_codes(n, bits, n // 100, 0.01, seed=1))
    ids = np.arange(n, dtype=np.int64)
    mih_nq = int(os.environ.get("MIH_NQ", 1000))
    xq_all = queries_near(xb, max(2000, mih_nq), bits, flips=1, seed=7)
    # both engines over the very same arrays (the old one loaded from the new one's snapshot;
    # the formats did not change), MIH sharing one visit-stamp pool: only the code differs
    idx = {}
    engines = [("single", (OldSingle, NewSingle)), ("mih", (OldMIH, NewMIH)),
               ("scan", (OldScan, NewScan))] + [("auto", (OldAuto, NewAuto))] * old_builds
    for name, cls in engines:
        ix = cls[1](bits)
        ix.add(xb, ids)
        if old_builds:  # layouts differ: each engine builds its own
            old = cls[0](bits)
            old.add(xb, ids)
        else:
            meta, arrays = ix.snapshot()
            old = cls[0].from_snapshot(bits, meta, arrays)
        if name == "mih" and hasattr(old, "_stamps") and hasattr(ix, "_stamps"):
            old._stamps = ix._stamps  # one visit-stamp pool (before the visit bitsets)
        for which, one in (("old", old), ("new", ix)):
            one.threads = 1
            idx[(name, which)] = one
    wait_for_collapse(120)  # the new engines' arrays in huge pages before any timing
    cells = []
    for r, nq in ((0, 2000), (1, 2000), (2, 400), (3, 40), (4, 4)):
        cells.append((f"single r={r}", "single", nq, lambda ix, xq, r=r: ix.range_search(xq, r)))
    for r in mih_radii:
        cells.append((f"mih r={r}", "mih", mih_nq if r < 5 else 100,
                      lambda ix, xq, r=r: ix.range_search(xq, r)))
        if old_builds:
            cells.append((f"auto r={r}", "auto", mih_nq if r < 5 else 100,
                          lambda ix, xq, r=r: ix.range_search(xq, r)))
    for r in (0, 2, 4):
        cells.append((f"scan r={r}", "scan", 10, lambda ix, xq, r=r: ix.range_search(xq, r)))
    for name, nq in (("single", 500), ("mih", 500), ("scan", 10)) + (("auto", 500),) * old_builds:
        cells.append((f"{name} k-NN k=10", name, nq, lambda ix, xq: ix.search(xq, 10)))
    cells.append(("single r=2 stats", "single", 400,
                  lambda ix, xq: ix.range_search(xq, 2, stats=True)))
    cells.append(("mih r=3 stats", "mih", 1000,
                  lambda ix, xq: ix.range_search(xq, 3, stats=True)))
    only = os.environ.get("CELLS")
    if only:
        cells = [c for c in cells if c[0] in only.split(",")]
    # same answers, and compile/warm every cell before timing
    for label, name, nq, fn in cells:
        xq = xq_all[:nq]
        a, b = fn(idx[(name, "old")], xq), fn(idx[(name, "new")], xq)
        for x, y in zip(a[:3], b[:3]):
            assert np.array_equal(x, y), label
    rows = []
    print(f"loadavg before: {open('/proc/loadavg').read().strip()}", flush=True)
    for cell_no, (label, name, nq, fn) in enumerate(cells):
        xq = xq_all[:nq]
        if fresh:  # 2 batches a round, never searched before by either engine
            pool = queries_near(xb, 2 * reps * nq, bits, flips=1, seed=100 + cell_no)
        old_t, new_t, ratios = [], [], []
        for rep in range(reps):
            order = ("old", "new") if rep % 2 == 0 else ("new", "old")
            t = {}
            for which in order:
                ix = idx[(name, which)]
                if fresh:  # the round's two batches, swapped between the engines every round
                    k = 2 * rep + ((which == "new") != (rep % 2 == 1))
                    t[which] = best(lambda: fn(ix, pool[k * nq:(k + 1) * nq]), 1)
                else:
                    t[which] = best(lambda: fn(ix, xq), 3)
            old_t.append(t["old"])
            new_t.append(t["new"])
            ratios.append(t["new"] / t["old"])
        row = {"cell": label, "nq": nq, "old_us_per_q": statistics.median(old_t) / nq * 1e6,
               "new_us_per_q": statistics.median(new_t) / nq * 1e6,
               "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios)}
        rows.append(row)
        print(f"{label:22s} nq={nq:5d} old {row['old_us_per_q']:10.2f} us/q  new "
              f"{row['new_us_per_q']:10.2f} us/q  new/old median {row['ratio_median']:.3f} "
              f"[{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]", flush=True)
    print(f"loadavg after: {open('/proc/loadavg').read().strip()}")
    out = os.environ.get("OUT", "bench/out/bench_ab.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
