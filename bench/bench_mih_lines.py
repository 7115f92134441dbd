"""Cache lines (64 bytes) that one batch of multi-index range queries reads, in the layout before
positions (428bbce: per-table copies of (code, id), 16 bytes an entry) and in the layout by
position (uint32 positions into the shared codes and ids), counted from the tables, not timed.

Per query and radius step ``j <= R`` (the exact path, ``R < m``): both read the line of the
bucket's start (direct tables); the old layout then reads the lines of its bucket's entries
``j * n + lo .. j * n + hi``; the new one, for a query of at most ``mih.SMALL_QUERY``
candidates, the lines of table 0's bucket as rows (codes; ids of results) and of the other
buckets' entries; for one of at most ``mih.TAG_QUERY``, the line of a candidate's code only
when its tag differs from the query's in at most ``R`` bits (the tag filter,
:mod:`bucketsearch.index.mih_tables`); for a larger query the lines of every entry and code; and the line of an id when it is a result
(or, in a query of more than ``mih.SMALL_QUERY`` candidates, its bucket holds more than
``mih.PREFETCH_ITEMS``: the kernel prefetches those ids). Queries as
bench_small_radii.py's (0-3 bits flipped from a stored code, a quarter each). Prints lines per
query and the batch's working set (distinct lines) for each layout:

    .venv/bin/python bench/bench_mih_lines.py              # 1M uniform 64-bit, batch of 1,000
    .venv/bin/python bench/bench_mih_lines.py --n 100000 --nq 200
"""
import argparse

import numpy as np

from bench_small_radii import make_queries
from bucketsearch.index.mih import PREFETCH_ITEMS, SMALL_QUERY, TAG_QUERY, MultiIndex
from bucketsearch.index.mih_tables import (T_BASE, T_DIRECT, T_MASK, T_ROW_BITS, T_SHIFT,
                                           T_TAG_BITS, T_TAG_SHIFT)
from bucketsearch.index.synth import uniform_codes

LINE = 64


def count_lines(index: MultiIndex, xq: np.ndarray, R: int) -> tuple[float, float, int, int]:
    """``(old lines per query, new lines per query, old working set, new working set)``."""
    n = index.ntotal
    tables = index.tables.tables
    if not tables[:R + 1, T_DIRECT].all():
        raise SystemExit("the count covers direct tables only (uniform codes of 1M and more)")
    starts = index.tables.starts.astype(np.int64)
    positions = index.tables.positions.astype(np.int64)
    rb = int(tables[0, T_ROW_BITS])
    words = index.words[:, 0]
    old_all, new_all = set(), set()
    old_sum = new_sum = 0
    for q in (int(v) for v in xq[:, 0]):
        old, new = set(), set()
        buckets = []
        for j in range(R + 1):
            key = (q >> int(tables[j, T_SHIFT])) & int(np.uint64(tables[j, T_MASK]))
            s = int(tables[j, T_BASE]) + key
            old.add(("starts", s * 4 // LINE))
            new.add(("starts", s * 4 // LINE))
            buckets.append((starts[s], starts[s + 1]))
        size = sum(hi - lo for lo, hi in buckets)
        small, tagged = size <= SMALL_QUERY, size <= TAG_QUERY
        for j, (lo, hi) in enumerate(buckets):
            tb = int(tables[j, T_TAG_BITS])
            qtag = (q >> int(tables[j, T_TAG_SHIFT])) & ((1 << tb) - 1)
            for e in range(j * n + lo, j * n + hi):
                old.add(("entries", e * 16 // LINE))
                if j == 0 and small:  # table 0: rows
                    new.add(("words", e * 8 // LINE))
                    if bin(q ^ int(words[e])).count("1") <= R:
                        new.add(("ids", e * 8 // LINE))
                    continue
                p = positions[e] & ((1 << rb) - 1)
                new.add(("positions", e * 4 // LINE))
                if tagged and bin((positions[e] >> rb) ^ qtag).count("1") > R:
                    continue  # the tag filter: neither code nor id read
                new.add(("words", p * 8 // LINE))
                if bin(q ^ int(words[p])).count("1") <= R or (not small
                                                               and hi - lo > PREFETCH_ITEMS):
                    new.add(("ids", p * 8 // LINE))
        old_sum += len(old)
        new_sum += len(new)
        old_all |= old
        new_all |= new
    return old_sum / len(xq), new_sum / len(xq), len(old_all), len(new_all)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--nq", type=int, default=1000)
    parser.add_argument("--radii", default="1,2")
    args = parser.parse_args()
    xb = uniform_codes(args.n, 64, 1)
    xq = make_queries(xb, args.nq, None)
    index = MultiIndex(64)
    index.add(xb)
    print(f"uniform {args.n:,} 64-bit codes, m = {index.substrings}, batch of {args.nq:,}")
    for R in (int(r) for r in args.radii.split(",")):
        old, new, old_set, new_set = count_lines(index, xq, R)
        print(f"R={R}: lines per query old {old:.2f} new {new:.2f} (new/old {new / old:.2f}); "
              f"batch working set old {old_set * LINE / 1024:.0f} KiB, new "
              f"{new_set * LINE / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
