"""One snapshot loaded three ways in one process: the time of each load, and the speed of
searches over each copy (issue 28, item 5; bench/RESULTS.md section 38).

    .venv/bin/python -u bench/bench_snapshot_load.py --n 20000000 --base /tmp/base_tree

Builds a live index of ``--n`` uniform 64-bit codes in ``--mode`` (default ``auto``) in a
temporary directory (``LiveIndex`` add + merge: one snapshot), then, ``--rounds`` times in
alternating order, reads that snapshot's arrays (every checksum verified) with:

- ``base``: ``--base DIR``'s ``store.load_arrays`` (another checkout, through
  ``bench/oldtree.py``): ``np.load`` after a separate CRC32 pass, into numpy's memory, which
  asks for transparent huge pages;
- ``this``: this tree's ``store.load_arrays``: one read per file, its CRC32 computed as it is
  read, into a populated anonymous mapping (4 KiB pages);
- ``collapse``: ``this``, then ``madvise(MADV_COLLAPSE)`` on each mapping (huge pages made
  now, synchronously; Linux 6.1 and later), timed as part of the load;
- ``mmap``: this tree's ``store.load_arrays(mmap=True)``: read for the checksum, then mapped.

Each copy is made into this tree's engine (``factory.index_from_arrays``: the same code for
all three), so the searches differ only in the memory under them: ``--queries`` near queries
(a stored code with 3 bits flipped), one query per call, at radius 1 and 3 and k-NN k = 10,
once untimed (the first touch of the pages they read, mapped or not), then again timed, the
mean per query taken; the best and the median of the rounds, and each
figure's ratio to ``base``'s in the same process. The loads are the first touch of fresh
memory (a new copy each round, the previous one freed).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bucketsearch.index.disk.store import load_arrays  # noqa: E402
from bucketsearch.index.factory import index_from_arrays  # noqa: E402
from bucketsearch.index.storage import snapshot as snapshots  # noqa: E402
from bucketsearch.index.storage.live import LiveIndex  # noqa: E402

BITS = 64


def loaders(base: str) -> dict:
    """``{name: load(path) -> (kind, meta, arrays)}`` of the three ways."""
    out = {"this": lambda path: load_arrays(path),
           "collapse": lambda path: collapsed(load_arrays(path)),
           "mmap": lambda path: load_arrays(path, mmap=True)}
    if base:
        import oldtree
        oldtree.install(base)
        from oldbs.index.disk.store import load_arrays as base_load  # noqa: E402
        out = {"base": lambda path: base_load(path), **out}
    return out


#: madvise(MADV_COLLAPSE) (Linux 6.1): make the range's pages huge pages now, synchronously
MADV_COLLAPSE = 25


def collapsed(loaded):
    """``this``'s arrays, then each anonymous mapping under them collapsed into huge pages
    (what a background thread could do after ready; timed here as part of the load)."""
    import mmap
    for array in loaded[2].values():
        base = array  # array -> its views' bases -> numpy's memoryview -> the mapping
        while base is not None and not isinstance(base, mmap.mmap):
            base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
        if base is not None:
            base.madvise(MADV_COLLAPSE)
    return loaded


def per_query_us(search, xq: np.ndarray) -> float:
    t = time.perf_counter()
    for i in range(len(xq)):
        search(xq[i:i + 1])
    return (time.perf_counter() - t) / len(xq) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--mode", default="auto", choices=("auto", "single", "mih"))
    ap.add_argument("--base", default="", metavar="DIR", help="another checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--dir", help="parent of the index directory (default: the system's tmp)")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**64 - 1, size=(args.n, 1), dtype=np.uint64, endpoint=True)
    xq = words[rng.choice(args.n, args.queries, replace=False)].copy()
    for _ in range(3):
        xq ^= np.uint64(1) << rng.integers(0, BITS, (args.queries, 1)).astype(np.uint64)
    ways = loaders(args.base)
    print(f"n = {args.n:,} uniform {BITS}-bit codes, mode {args.mode}; {args.queries} near "
          f"queries; ways {', '.join(ways)}; loadavg {open('/proc/loadavg').read().split()[0]}",
          flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        live = LiveIndex(Path(tmp) / "ix", BITS, args.mode, merge_threshold=10**12,
                         background_merge=False)
        live.add(words, np.arange(args.n))
        live.merge()
        live.close()
        del words
        gc.collect()
        snap = snapshots.list_snapshots(Path(tmp) / "ix")[-1][1]
        size = sum(f.stat().st_size for f in snap.iterdir())
        print(f"snapshot {snap.name}: {size / 2**20:.0f} MiB", flush=True)
        searches = {"r1": lambda ix, q: ix.range_search(q, 1),
                    "r3": lambda ix, q: ix.range_search(q, 3),
                    "knn10": lambda ix, q: ix.search(q, 10)}
        figures = {name: {"load s": []} | {s: [] for s in searches} for name in ways}
        for r in range(args.rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for name in order:
                gc.collect()
                t = time.perf_counter()
                kind, meta, arrays = ways[name](snap)
                figures[name]["load s"].append(time.perf_counter() - t)
                index = index_from_arrays(snap, kind, meta, arrays)
                for s, fn in searches.items():
                    per_query_us(lambda q: fn(index, q), xq)  # untimed: the pages' first touch
                    figures[name][s].append(per_query_us(lambda q: fn(index, q), xq))
                print(f"round {r} {name:>8}: " + ", ".join(
                    f"{k} {v[-1]:.3f}" if k == "load s" else f"{k} {v[-1]:.1f} us"
                    for k, v in figures[name].items()), flush=True)
                del index, arrays
        print("\nbest / median of the rounds, and the median's ratio to base:")
        for name, figs in figures.items():
            parts = []
            for k, v in figs.items():
                ratio = (f" ({statistics.median(v) / statistics.median(figures['base'][k]):.2f}x)"
                         if "base" in figures and name != "base" else "")
                parts.append(f"{k} {min(v):.3g} / {statistics.median(v):.3g}{ratio}")
            print(f"  {name:>8}: " + ", ".join(parts))
    print(f"loadavg {open('/proc/loadavg').read().split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
