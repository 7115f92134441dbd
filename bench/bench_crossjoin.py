"""The join of a sharded index's two shards (issue 27, index/cluster/): the self-join of each
half plus their cross join (index/crossjoin.py, ``union`` and ``search``) against one self-join of
all the items, in one process, one thread, the same codes.

Data: bench_join's planted codes (uniform, 5% near-duplicates with 0..r flips, ``--seed``),
split in two by the ``id_hash`` rule of a 2-shard index. Figures: wall and thread CPU seconds of
each join, every chunk consumed (CPU time: the machine is shared, bench/RESULTS.md 19b);
``ratio`` = (shard 0 + shard 1 + cross) / one join, i.e. the work a 2-shard job does for the
work of an unsharded one (the shards' tasks run on two actors, so its wall time is about half
of that on two free cores). Every cell checks that the three parts hold exactly the one join's
pairs.

    NUMBA_NUM_THREADS=1 python bench/bench_crossjoin.py [--n 1000000] [--n256 200000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from bench_join import planted_codes

from bucketsearch.index.cluster.partitioning import id_shard
from bucketsearch.index import join
from bucketsearch.index.crossjoin import cross_pairs
from bucketsearch.index.scan import LinearScan


def timed(chunks):
    w, c = time.perf_counter(), time.thread_time()
    pairs = sorted((int(a), int(b)) for ch in chunks for a, b in zip(ch.a, ch.b))
    return pairs, time.perf_counter() - w, time.thread_time() - c


def cell(n: int, bits: int, radius: int, seed: int) -> dict:
    words = planted_codes(n, bits, radius, seed)
    ids = np.arange(n, dtype=np.int64)

    def engine(sel):
        index = LinearScan(bits)
        index._set_items(np.ascontiguousarray(words[sel]), ids[sel])
        return index

    join.join_constants(words.shape[1])
    side = id_shard(ids, 2) == 0
    a, b = engine(side), engine(~side)
    one, one_w, one_c = timed(join.pairs(engine(slice(None)), radius))
    s0, s0_w, s0_c = timed(join.pairs(a, radius))
    s1, s1_w, s1_c = timed(join.pairs(b, radius))
    out = {"n": n, "bits": bits, "radius": radius, "pairs": len(one), "one": [one_w, one_c],
           "shards": [s0_w + s1_w, s0_c + s1_c]}
    print(f"\n== {n:,} {bits}-bit codes, r = {radius}: one join {one_w:.2f} s (CPU {one_c:.2f}), "
          f"{len(one):,} pairs; the two shards' self-joins {s0_w + s1_w:.2f} s "
          f"(CPU {s0_c + s1_c:.2f})", flush=True)
    for method in ("union", "search"):
        cross, cw, cc = timed(cross_pairs(a, b, radius, method=method))
        assert sorted(s0 + s1 + cross) == one, method
        ratio = (s0_c + s1_c + cc) / one_c
        out[method] = [cw, cc, ratio]
        print(f"    cross join, {method}: {cw:.2f} s (CPU {cc:.2f}), {len(cross):,} pairs; "
              f"2-shard work / one join (CPU): {ratio:.2f}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="64-bit items (r = 3)")
    ap.add_argument("--n256", type=int, default=200_000, help="256-bit items (r = 16)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cell(args.n, 64, 3, args.seed)
    cell(args.n256, 256, 16, args.seed)


if __name__ == "__main__":
    main()
