"""Dedup on ingest (issue 27 item 6): per-item cost of ``LiveIndex.add_dedup`` against a
radius-r search plus an insert, in one process, same data, rounds interleaved.

Three live indexes over the same ``N`` items (merged into the main table), one stream of ``M``
arriving items (half near-duplicates of indexed items within the radius, half fresh), sent one
item per call and in batches of ``BATCH``:

* ``dedup``: ``live.add_dedup(x, r)`` (search, decision and one WAL record under the lock);
* ``loop``: what a user writes without it, ``live.range_search(x, r)`` then ``live.add`` of the
  items with no hit (same decisions, same final state; not atomic);
* ``search+insert``: ``live.range_search(x, r)`` then ``live.add`` of every item (the
  acceptance's baseline: a radius-r search plus an insert, per item).

Printed: microseconds per item (median over rounds), wall clock and process CPU time, and the
ratios dedup / loop and dedup / (search+insert). Run once on the data directory's disk and once on /dev/shm, where an
fsync is cheap and the search is most of the cost.

    .venv/bin/python bench/bench_dedup.py [--n 1000000] [--m 2000] [--radius 3]
        [--mode single] [--dir /dev/shm] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from bucketsearch.index.storage.live import LiveIndex


def near(rng, words, radius):
    """Copies of ``words`` (one-word 64-bit codes) with 1..radius bits flipped."""
    out = words.copy()
    for row in out:
        for b in rng.choice(64, size=int(rng.integers(1, radius + 1)), replace=False):
            row[0] ^= np.uint64(1) << np.uint64(int(b))
    return out


def stream(rng, base, m, radius):
    dup = near(rng, base[rng.integers(0, len(base), m // 2)], radius)
    fresh = rng.integers(0, 2**63, size=(m - m // 2, 1), dtype=np.int64).astype(np.uint64)
    words = np.concatenate([dup, fresh])
    return words[rng.permutation(m)]


def run(kind, live, words, radius, batch, first_id):
    """``(wall us, CPU us)`` per item (CPU: the process's, every thread: steadier than the
    wall clock on a shared machine; it leaves out the fsync's wait)."""
    t, c = time.perf_counter(), time.process_time()
    for s in range(0, len(words), batch):
        x = words[s:s + batch]
        ids = np.arange(first_id + s, first_id + s + len(x), dtype=np.int64)
        if kind == "dedup":
            live.add_dedup(x, radius, ids)
            continue
        lims = live.range_search(x, radius)[0]
        new = np.ones(len(x), dtype=bool) if kind == "search+insert" else lims[1:] == lims[:-1]
        if new.any():
            live.add(x[new], ids[new])
    return ((time.perf_counter() - t) / len(words) * 1e6,
            (time.process_time() - c) / len(words) * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--m", type=int, default=2_000)
    ap.add_argument("--radius", type=int, default=3)
    ap.add_argument("--mode", default="single")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--dir", default=None, help="where the indexes live (default: the temp dir)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**63, size=(args.n, 1), dtype=np.int64).astype(np.uint64)
    kinds = ("dedup", "loop", "search+insert")
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        lives = {}
        for kind in kinds:
            live = LiveIndex(f"{root}/{kind.replace('+', '_')}", 64, args.mode,
                             merge_threshold=10**9, background_merge=False)
            live.add(base, np.arange(args.n))
            live.merge()
            lives[kind] = live
        times = {(kind, b): [] for kind in kinds for b in (1, args.batch)}
        first = args.n
        for rnd in range(args.rounds):
            words = stream(rng, base, args.m, args.radius)
            for b in (1, args.batch):
                order = kinds if rnd % 2 == 0 else kinds[::-1]
                for kind in order:
                    times[kind, b].append(run(kind, lives[kind], words, args.radius, b, first))
                first += len(words)
        for live in lives.values():
            live.close()
    print(f"N={args.n:,} 64-bit uniform, M={args.m:,} arrivals per round (half within r of an "
          f"indexed item), r={args.radius}, mode {args.mode}, dir {args.dir or 'tmp'}, "
          f"{args.rounds} rounds (median)")
    for b in (1, args.batch):
        for clock, col in (("wall", 0), ("cpu", 1)):
            med = {kind: statistics.median(t[col] for t in times[kind, b]) for kind in kinds}
            print(f"batch {b:>4} {clock}: " + ", ".join(f"{k} {v:.1f} us/item"
                                                       for k, v in med.items())
                  + f"; dedup/loop {med['dedup'] / med['loop']:.2f}, dedup/(search+insert) "
                  f"{med['dedup'] / med['search+insert']:.2f}")


if __name__ == "__main__":
    main()
