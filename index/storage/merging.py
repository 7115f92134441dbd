"""A live index's merge: the new main index of a frozen state's live items, reusing the old
main index's order where that is cheaper than sorting again (issue 28, items 2 and 4).

The live items come in (code, id) order from :meth:`LiveState.sorted_items` (the main's
items, tombstones dropped, merged with the sorted delta in one pass). A ``mih`` or ``auto``
main index then needs its substring tables, each the positions sorted by (substring, id):
rebuilt, that is one counting sort per table over every item
(:func:`bucketsearch.index.mih_tables.build_tables`). Reused
(:func:`bucketsearch.index.mih_tables.merge_tables`), an old position maps to its merged row
(:func:`~bucketsearch.index.mih_tables.merge_remap`, one pass), the delta's items are sorted
per table (a radix sort of D substrings) and each table is one linear merge of the two
sorted runs: the same tables, bit for bit. It is used when the old main index is of the same
engine with the same substrings and the delta plus the dropped items are at most
:data:`REUSE_MAX_FRACTION` of the merged items (at half of them the two cost the same:
``bench/bench_merge.py --tables``, bench/RESULTS.md section 35).

The merged tables go to the engine's ``_rebuild_sorted`` (``tables=``): ``auto``'s single
table is filled again from the merged items (its slots are hashed, no order to reuse) and
its scan shares the items, as in a build. Its
planner keeps the old main index's calibration (:func:`carry_calibration`) while the item
count stays within :data:`CALIBRATION_KEEP_FRACTION` of the count the timings were taken at,
and profiles the new items again. Sound because every timed quantity is a unit cost of this
machine and engine: ns per probe, per scanned item, per candidate, per call, and the
correction ``measured / modeled`` of each calibrated radius; the counts they multiply (items
and distinct codes and substrings per distance, N) come from the profile and N, both of the
new items. What a unit cost does not capture is the caches: a probe into a larger table
misses more. Beyond 2^20 items or so every table is far past the last-level cache and a
probe costs about the same; the fraction bounds the drift elsewhere, and the planner only
ever chooses among exact engines (a stale cost makes a search slower, never wrong). Past
the fraction the planner is calibrated again (the timing runs on the new items).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index.base import trim_heap
from bucketsearch.index.mih import MultiIndex, default_substrings, substring_ranges
from bucketsearch.index.mih_tables import merge_remap, merge_tables
from bucketsearch.index.planner import AutoIndex, calibration_queries

#: the tables are merged while (new items + dropped items) <= this fraction of the merged
#: items, else rebuilt. The tables' CPU time, merged / rebuilt, one thread (uniform 64-bit
#: codes, 1,000 deletes and 1,000 upserts; `bench_merge.py --tables`): 0.26x at 0.01 (100k
#: into 10M), 0.35x at 0.09, 0.48x at 0.17 (2M into 10M), 0.81x at 0.33 (5M into 10M),
#: 0.86-1.05x at 0.5 (2M into 2M); 0.47-0.69x at 0.05 from 500k to 2M items, 0.91x at 100k
#: (bench/RESULTS.md section 35)
REUSE_MAX_FRACTION = 1 / 3
#: auto's calibration is kept over merges while the item count is within this fraction of
#: the count it was timed at (the module docstring)
CALIBRATION_KEEP_FRACTION = 0.25


def _multi_index(main):
    """The multi-index of a ``mih`` or ``auto`` main index, else None."""
    if isinstance(main, AutoIndex):
        return main.mih
    if isinstance(main, MultiIndex):
        return main
    return None


def reusable(old_main, fresh, n: int, changed: int) -> bool:
    """Whether ``fresh`` (an empty engine) over ``n`` merged items can take its substring
    tables from ``old_main``'s by merge: the same engine, the same substrings (``fresh``'s
    fixed ones or the default for ``n``), and ``changed`` (new plus dropped items) at most
    :data:`REUSE_MAX_FRACTION` of ``n``."""
    old, new = _multi_index(old_main), _multi_index(fresh)
    if old is None or new is None or type(old_main) is not type(fresh) or not old.ntotal:
        return False
    m = new.fixed_substrings or default_substrings(new.bits, n)
    return (old.bits == new.bits and old.substrings == m
            and changed <= REUSE_MAX_FRACTION * n)


def carry_calibration(fresh: AutoIndex, old_main) -> bool:
    """Give ``fresh`` (built over the merged items, not calibrated) ``old_main``'s
    calibration and profile the new items (the module docstring), when ``old_main`` was
    calibrated on this machine, has the same substrings, and ``fresh``'s item count is within
    :data:`CALIBRATION_KEEP_FRACTION` of the count its timings were taken at (kept as
    ``timed_ntotal`` in the calibration summary, so merges after merges do not drift). False
    and nothing changed otherwise."""
    state = old_main.calibration_state() if isinstance(old_main, AutoIndex) else None
    if not state or not fresh.ntotal or old_main.substrings != fresh.substrings:
        return False  # (a mode change to other substrings: timed again)
    timed = int(state["summary"].get("timed_ntotal", state["ntotal"]))
    n = fresh.ntotal
    if abs(n - timed) > CALIBRATION_KEEP_FRACTION * timed:
        return False
    summary = {k: v for k, v in state["summary"].items() if k != "restored"}
    if not fresh.restore_calibration({**state, "ntotal": n,
                                      "summary": {**summary, "timed_ntotal": timed}}):
        return False
    fresh.profile(calibration_queries(fresh.mih.words, fresh.bits, fresh.calibration_queries,
                                      seed=fresh.seed))
    fresh.calibration = {**summary, "timed_ntotal": timed, "carried_over": True}
    return True


def build_main(fresh, old_main, words: np.ndarray, ids: np.ndarray, dropped: np.ndarray,
               reuse: bool = True) -> bool:
    """Fill the empty engine ``fresh`` with the merged items ``words`` / ``ids`` ((code, id)
    order, the result of merging ``old_main``'s items, ``dropped`` marking the ones that
    went, with new ones): its tables merged from ``old_main``'s when :func:`reusable` (and
    ``reuse``), else built (:meth:`IndexBase.build`); with ``reuse``, an ``auto`` planner's
    calibration carried over when :func:`carry_calibration` allows. True when the tables'
    order was reused."""
    n = len(ids)
    gone = int(np.count_nonzero(dropped))
    changed = n - (old_main.ntotal - gone) + gone  # new items + dropped ones
    mapped = None
    if reuse and reusable(old_main, fresh, n, changed):
        mapped = merge_remap(np.asarray(old_main.ids), dropped, ids)
    merged = mapped is not None
    auto = isinstance(fresh, AutoIndex) and fresh.calibrate_on_build
    if auto:
        fresh.calibrate_on_build = False  # calibrated below, or the old calibration kept
    try:
        if not merged:
            fresh.build(words, ids, presorted=True)
        else:
            old, new = _multi_index(old_main), _multi_index(fresh)
            starts, widths = substring_ranges(new.bits, old.substrings)
            tables = merge_tables(new.bits, words, ids, old.tables, np.asarray(old.words),
                                  *mapped, starts, widths, new._word_width,
                                  fresh.build_threads)
            del mapped
            fresh._rebuild_sorted(words, ids, tables=tables)
            trim_heap(n)
    finally:
        if auto:
            fresh.calibrate_on_build = True
    if auto and not (reuse and carry_calibration(fresh, old_main)):
        fresh.calibrate()
    return merged
