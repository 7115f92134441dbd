"""The single table at 10M uniform 64-bit codes, this checkout against another (BASE), one
process, interleaved: range search r = 0-3 of near queries (up to 2 bits flipped), thread CPU
time, least of 3 calls per timing, median of the per-round new/old ratios.

    git worktree add --detach /tmp/base_i28mem 8c5cfab
    BASE=/tmp/base_i28mem NUMBA_CACHE_DIR=$(mktemp -d) .venv/bin/python bench/ab_single_10m.py
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oldtree  # noqa: E402

oldtree.install(os.environ.get("BASE", "/tmp/base_tree"))

import numpy as np  # noqa: E402

from bucketsearch.index.evaluation.synth import queries_near, uniform_codes  # noqa: E402
from bucketsearch.index.probe import HammingIndex as New  # noqa: E402
from oldbs.index.probe import HammingIndex as Old  # noqa: E402


def best(fn):
    b = float("inf")
    for _ in range(3):
        t = time.thread_time()
        fn()
        b = min(b, time.thread_time() - t)
    return b


def main():
    n = int(os.environ.get("N", 10_000_000))
    reps = int(os.environ.get("REPS", 5))
    xb = uniform_codes(n, 64, seed=1)
    xq = queries_near(xb, 2000, 64, flips=2, seed=7)
    engines = {}
    for name, cls in (("old", Old), ("new", New)):
        index = cls(64)
        index.add(xb, np.arange(n, dtype=np.int64))
        index.threads = 1
        engines[name] = index
        print(f"{name}: {index.memory_bytes() / n:.1f} bytes per item", flush=True)
    cells = [(f"r={r}", nq, lambda ix, q, r=r: ix.range_search(q, r))
             for r, nq in ((0, 2000), (1, 2000), (2, 200), (3, 20))]
    print(f"loadavg {open('/proc/loadavg').read().strip()}")
    for label, nq, fn in cells:
        q = xq[:nq]
        a, b = fn(engines["old"], q), fn(engines["new"], q)
        assert all(np.array_equal(x, y) for x, y in zip(a[:3], b[:3])), label
        old_t, new_t, ratios = [], [], []
        for rep in range(reps):
            order = ("old", "new") if rep % 2 == 0 else ("new", "old")
            t = {w: best(lambda w=w: fn(engines[w], q)) for w in order}
            old_t.append(t["old"])
            new_t.append(t["new"])
            ratios.append(t["new"] / t["old"])
        print(f"{label:10s} old {statistics.median(old_t) / nq * 1e6:9.2f} us/q  new "
              f"{statistics.median(new_t) / nq * 1e6:9.2f} us/q  new/old median "
              f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]",
              flush=True)
    print(f"loadavg {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
