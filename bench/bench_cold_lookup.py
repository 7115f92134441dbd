"""A lone radius-0 lookup after other work has flushed the caches (issue 12 item 3).

Under a mixed load a radius-0 query arrives after larger searches have pushed the table out of
the CPU caches, so its cost is the cache misses on its path, not the ~50 ns it takes warm. This
builds one single-table index (``HammingIndex``) of ``--n`` 64-bit codes
(``bucketsearch.loadtest.dataset``,
the demo's clustered codes) and, ``--queries`` times, writes one byte in every cache line of a
``--flush-mib`` buffer (flushing L2 and L3), then searches one database code at radius 0 with
statistics and keeps the kernel's ``lookup_ns``. Variants, interleaved query by query:

* ``cold``: as above;
* ``slot warm`` (new engine only): the query's home slot read from Python after the flush,
  so the rest of the path (the item, code, buffers) stays cold;
* ``warm``: no flush;
* ``old cold``: with ``--base DIR``, the engine of another checkout (``bench/oldtree.py``) on
  the same codes and queries.

Prints p10/p50/p90 per variant and new/old ratios from this run.

    python bench/bench_cold_lookup.py                      # 1M codes, 3000 queries
    python bench/bench_cold_lookup.py --base /tmp/base17   # beside the previous commit
"""
import argparse
import json
import os
import sys

import numpy as np

from bucketsearch.index.probe import HammingIndex
from bucketsearch.index.table import HASH_MULTIPLIER
from bucketsearch.loadtest import dataset


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=3000)
    parser.add_argument("--flush-mib", type=int, default=64)
    parser.add_argument("--base", help="another checkout, run beside this one")
    parser.add_argument("--json", help="save the figures here")
    args = parser.parse_args()

    xb = dataset.clustered_codes(args.n, 64, dataset.DEFAULT_SEED)
    engines = {"new": HammingIndex(64)}
    if args.base:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import oldtree
        oldtree.install(args.base)
        from oldbs.index.probe import HammingIndex as OldIndex
        engines["old"] = OldIndex(64)
    for index in engines.values():
        index.add(xb)
    new = engines["new"]
    words = new.words
    mult, slots = int(HASH_MULTIPLIER), new.table.slots
    flush = np.zeros((args.flush_mib << 20) // 64, dtype=(np.uint8, 64))

    def slot_warm(q):  # the query's home slot (index.item_table.home_and_fingerprint)
        s = ((((q * mult) % 2**64) >> 32) * len(slots)) >> 32
        return int(slots[s])

    variants = {"cold": ("new", True, None), "slot warm": ("new", True, slot_warm),
                "warm": ("new", False, None)}
    if "old" in engines:
        variants["old cold"] = ("old", True, None)
    for index in engines.values():
        index.range_search(words[:3], 0, stats=True)
    rng = np.random.default_rng(1)
    lookup = {name: [] for name in variants}
    for i in range(args.queries):
        q = words[rng.integers(len(words))][None, :]
        names = list(variants)
        rng.shuffle(names)
        for name in names:
            engine, cold, touch = variants[name]
            if cold:
                flush[:, 0] += 1
            if touch:
                touch(int(q[0, 0]))
            st = engines[engine].range_search(q, 0, stats=True)[3]
            lookup[name].append(int(st.lookup_ns[0, 0]))
    load = os.getloadavg()
    print(f"{args.n:,} clustered 64-bit codes, {args.queries} queries, flush {args.flush_mib} "
          f"MiB; loadavg {load[0]:.2f}")
    figures = {}
    for name, values in lookup.items():
        p10, p50, p90 = np.percentile(values, [10, 50, 90])
        figures[name] = {"p10": p10, "p50": p50, "p90": p90}
        print(f"  {name:11s} radius-0 lookup_ns p10 {p10:6.0f}  p50 {p50:6.0f}  p90 {p90:6.0f}")
    if "old cold" in figures:
        print(f"  cold new/old p50 {figures['cold']['p50'] / figures['old cold']['p50']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "queries": args.queries, "loadavg": load, **figures}, f,
                      indent=1)


if __name__ == "__main__":
    main()
