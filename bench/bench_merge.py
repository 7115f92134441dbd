"""Merges of a delta into a live index's main index (issue 28, items 2 and 4): a delta of D
codes merged into a main index of N, per mode, through :meth:`LiveIndex.merge` on a real
directory (snapshot written, fsynced and verified), one process, one thread.

Per mode it builds a main index of N uniform 64-bit codes (ids 0..N-1), then per round adds D
new codes (ids above), deletes ``--deletes`` of the main's items and replaces ``--upserts``
more, and times the merge by each path, then restores a main index of N (a second merge, not
timed):

* ``old``: the main index rebuilt from the merged items (``LiveIndex.reuse_order = False``:
  every MIH table by a counting sort, auto calibrated again);
* ``new``: the merge that reuses the main index's order
  (:mod:`bucketsearch.index.storage.merging`);

against ``build``: the first merge, the build of N from scratch (its items/s scaled to N + D).
Printed: CPU s and wall s (best of ``--rounds``, the two paths interleaved after a round that
compiles), items/s of the merged index (N + D per CPU
second), and the ratio old / new. ``--profile`` itemises one merge per path instead: the item
merge, the remap, the MIH tables, the single table's slots, the bucket-size counts, the
snapshot's write, CRC32s, fsyncs, its read-back and the calibration (inclusive CPU s: the
single slots include the size counts, the snapshot write its CRC32s and fsyncs, the read-back
its CRC32s).

    NUMBA_NUM_THREADS=1 .venv/bin/python bench/bench_merge.py --n 10000000 --d 2000000
    NUMBA_NUM_THREADS=1 .venv/bin/python bench/bench_merge.py --n 10000000 --d 100000
    NUMBA_NUM_THREADS=1 .venv/bin/python bench/bench_merge.py --n 2000000 --d 2000000 --profile

``--tables`` times the substring tables alone, in process (no live index, no disk):
:func:`mih_tables.merge_remap` + :func:`mih_tables.merge_tables` against
:func:`mih_tables.build_tables` of the same merged items (best of 3 each, checked equal), for
each ``N:D`` pair given (``--upserts`` of the new items reuse dropped ids):

    NUMBA_NUM_THREADS=1 .venv/bin/python bench/bench_merge.py --tables \
        10000000:100000,10000000:2000000,10000000:5000000,2000000:600000,2000000:2000000
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from bucketsearch.index import item_table, mih, mih_tables, planner
from bucketsearch.index.disk import fsio, store
from bucketsearch.index.storage import live, merging, snapshot
from bucketsearch.index.storage.state import LiveState
from bucketsearch.index.table import merge_items, sort_items

BITS = 64


class Timers:
    """Inclusive CPU and wall seconds of named functions, patched in place while active."""

    def __init__(self):
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self._undo: list = []

    def wrap(self, owner, attr: str, name: str, static: bool = False, cls: bool = False):
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        func = original.__func__ if cls else original

        def timed(*args, **kwargs):
            c, w = time.process_time(), time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c
                self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w

        setattr(owner, attr, classmethod(timed) if cls else timed)
        self._undo.append((owner, attr, original))

    def undo(self):
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo = []


class _TimedZlib:
    """``zlib`` for :mod:`fsio` with ``crc32`` timed (the CRC computed while writing)."""

    def __init__(self, timers: Timers):
        self.timers = timers

    def crc32(self, *args):
        c, w = time.process_time(), time.perf_counter()
        try:
            return zlib.crc32(*args)
        finally:
            t = self.timers
            t.cpu["crc32 while writing"] = t.cpu.get("crc32 while writing", 0.0) + \
                time.process_time() - c
            t.wall["crc32 while writing"] = t.wall.get("crc32 while writing", 0.0) + \
                time.perf_counter() - w


@contextlib.contextmanager
def profiled():
    """Timers over the merge's parts (see the module docstring)."""
    t = Timers()
    t.wrap(LiveState, "sorted_items", "item merge")
    t.wrap(mih, "build_tables", "MIH tables: rebuild")
    t.wrap(merging, "merge_remap", "remap (old position -> merged row)")
    t.wrap(merging, "merge_tables", "MIH tables: merge")
    t.wrap(item_table.ItemTable, "from_sorted", "single slots (incl. size counts)", cls=True)
    t.wrap(item_table, "bucket_size_counts", "bucket-size counts")
    t.wrap(live, "largest_bucket", "largest bucket (state)")
    t.wrap(snapshot, "write", "snapshot write (total)")
    t.wrap(fsio, "fsync_fd", "fsync")
    t.wrap(snapshot, "verify", "read-back (total)")
    t.wrap(store, "file_crc32", "read-back crc32")
    t.wrap(planner.AutoIndex, "calibrate", "calibration")
    t.wrap(merging, "carry_calibration", "calibration carried over (profile of the new items)")
    fsio.zlib = _TimedZlib(t)
    try:
        yield t
    finally:
        fsio.zlib = zlib
        t.undo()


def codes(rng, n: int) -> np.ndarray:
    return rng.integers(0, 2**64, size=n, dtype=np.uint64)


def add_in_batches(index, words: np.ndarray, ids: np.ndarray, batch: int = 1 << 20) -> None:
    for s in range(0, len(ids), batch):
        index.add(words[s:s + batch], ids[s:s + batch])


def one_round(index, rng, n: int, d: int, deletes: int, upserts: int, reuse: bool,
              round_no: int, timers=None) -> tuple[float, float]:
    """Add ``d`` new items, delete and upsert some of the main's, merge by one path (timed),
    then delete the added items and merge again (untimed) so the main holds N again."""
    first = n + round_no * d
    new_ids = np.arange(first, first + d, dtype=np.int64)
    add_in_batches(index, codes(rng, d), new_ids)
    main_ids = np.asarray(index.state.main.ids)
    gone = rng.choice(main_ids, size=deletes + upserts, replace=False)
    if deletes:
        index.delete(gone[:deletes])
    if upserts:
        index.upsert(codes(rng, upserts), gone[deletes:])
    index.reuse_order = reuse
    with profiled() if timers is not None else contextlib.nullcontext() as t:
        c, w = time.process_time(), time.perf_counter()
        index.merge()
        cpu, wall = time.process_time() - c, time.perf_counter() - w
    if timers is not None:
        timers.append(t)
    # back to N items: the added ones go, the deleted ones come back (not timed)
    index.reuse_order = True
    index.delete(new_ids)
    if deletes:
        index.add(codes(rng, deletes), gone[:deletes])
    index.merge()
    return cpu, wall


def _best_cpu(call, repeats: int = 3):
    best, out = float("inf"), None
    for _ in range(repeats):
        c = time.process_time()
        out = call()
        best = min(best, time.process_time() - c)
    return best, out


def tables_only(n0: int, d: int, deletes: int, upserts: int) -> None:
    """One ``N:D`` row of ``--tables`` (the module docstring)."""
    rng = np.random.default_rng(0)
    upserts = min(upserts, d)
    ww = np.array([BITS])
    old_words, old_ids = sort_items(codes(rng, n0).reshape(-1, 1), np.arange(n0))
    m = mih.default_substrings(BITS, n0 + d)
    starts, widths = mih.substring_ranges(BITS, m)
    old = mih_tables.build_tables(BITS, old_words, old_ids, starts, widths, ww)
    dropped = np.zeros(n0, dtype=bool)
    dropped[rng.choice(n0, deletes + upserts, replace=False)] = True
    new_ids = np.arange(n0, n0 + d, dtype=np.int64)
    new_ids[:upserts] = old_ids[dropped][:upserts]
    words, ids = merge_items(old_words[~dropped], old_ids[~dropped],
                             codes(rng, d).reshape(-1, 1), new_ids)
    t_build, want = _best_cpu(lambda: mih_tables.build_tables(BITS, words, ids, starts, widths,
                                                               ww))
    t_remap, mapped = _best_cpu(lambda: mih_tables.merge_remap(old_ids, dropped, ids))
    t_merge, got = _best_cpu(lambda: mih_tables.merge_tables(BITS, words, ids, old, old_words,
                                                              *mapped, starts, widths, ww))
    same = all((a == got.arrays()[k]).all() for k, a in want.arrays().items())
    changed = (d + deletes + upserts) / len(ids)
    print(f"| {n0:,} | {d:,} | {changed:.2f} | {m} | {t_build:.3f} | {t_remap:.3f} | "
          f"{t_merge:.3f} | {(t_remap + t_merge) / t_build:.2f}x | {same} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000_000, help="items of the main index")
    ap.add_argument("--d", type=int, default=2_000_000, help="items of the delta")
    ap.add_argument("--modes", default="single,mih,auto")
    ap.add_argument("--deletes", type=int, default=1000, help="main items deleted per round")
    ap.add_argument("--upserts", type=int, default=1000, help="main items replaced per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="itemise one merge per path")
    ap.add_argument("--paths", default="old,new", help="old, new or both")
    ap.add_argument("--tables", default=None, help="N:D,N:D,...: the tables alone")
    ap.add_argument("--dir", default=None, help="parent of the index folder (default: a "
                    "temporary one under /var/tmp, a real disk)")
    args = ap.parse_args(argv)
    print(f"# bench_merge: N={args.n:,} D={args.d:,} deletes={args.deletes} "
          f"upserts={args.upserts} rounds={args.rounds} threads="
          f"{os.environ.get('NUMBA_NUM_THREADS', 'default')}")
    print("# " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    if args.tables:
        print("| N | D | (new + dropped) / merged | m | build_tables CPU s | merge_remap | "
              "merge_tables | merged / built | same |\n|---|---|---|---|---|---|---|---|---|")
        for pair in args.tables.split(","):
            n0, d = (int(x) for x in pair.split(":"))
            tables_only(n0, d, args.deletes, args.upserts)
        print("# " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        return 0
    parent = Path(args.dir or tempfile.mkdtemp(prefix="bench_merge_", dir="/var/tmp"))
    try:
        for mode in args.modes.split(","):
            run_mode(mode, parent / mode, args)
    finally:
        if args.dir is None:
            shutil.rmtree(parent, ignore_errors=True)
    print("# " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return 0


def run_mode(mode: str, folder: Path, args) -> None:
    rng = np.random.default_rng(7)
    n, d = args.n, args.d
    index = live.LiveIndex(folder, BITS, mode, merge_threshold=2**62, background_merge=False)
    index.threads = 1
    add_in_batches(index, codes(rng, n), np.arange(n, dtype=np.int64))
    c, w = time.process_time(), time.perf_counter()
    index.merge()
    build_cpu, build_wall = time.process_time() - c, time.perf_counter() - w
    if args.profile:
        for k, reuse in enumerate(p == "new" for p in args.paths.split(",")):
            one_round(index, rng, n, d, args.deletes, args.upserts, reuse, 2 * k)  # compiles
            found: list = []
            cpu, wall = one_round(index, rng, n, d, args.deletes, args.upserts, reuse,
                                  2 * k + 1, found)
            t = found[0]
            print(f"\n## {mode}: merge of {d:,} into {n:,}, "
                  f"{'new (order reused)' if reuse else 'old (rebuild)'}: "
                  f"{cpu:.2f} CPU s, {wall:.2f} wall s")
            print("| part | CPU s | wall s |\n|---|---|---|")
            for name in t.cpu:
                print(f"| {name} | {t.cpu[name]:.3f} | {t.wall[name]:.3f} |")
        index.close()
        return
    runs: dict[bool, list] = {False: [], True: []}
    for r in range(args.rounds + 1):  # old and new interleaved; round 0 compiles
        for reuse in (False, True):
            got = one_round(index, rng, n, d, args.deletes, args.upserts, reuse,
                            2 * r + reuse + 1)
            if r:
                runs[reuse].append(got)
    best = {reuse: min(found) for reuse, found in runs.items()}
    index.close()
    total = n + d
    print(f"\n## {mode}: merge of D={d:,} into N={n:,} (best of {args.rounds})")
    print("| path | CPU s | wall s | items/s (N+D per CPU s) | vs old |\n|---|---|---|---|---|")
    old_cpu = best[False][0]
    for name, (cpu, wall) in (("old: rebuild", best[False]), ("new: order reused", best[True])):
        print(f"| {name} | {cpu:.2f} | {wall:.2f} | {total / cpu / 1e6:.2f}M | "
              f"{old_cpu / cpu:.2f}x |")
    scaled = build_cpu * total / n
    print(f"| build of N from scratch (x (N+D)/N) | {scaled:.2f} | "
          f"{build_wall * total / n:.2f} | {n / build_cpu / 1e6:.2f}M | "
          f"{old_cpu / scaled:.2f}x |")


if __name__ == "__main__":
    raise SystemExit(main())
