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
:data:`REUSE_MAX_FRACTION` of the merged items (beyond that the counting sort's sequential
reads win: ``bench/bench_merge.py``, bench/RESULTS.md section 34).

``auto``'s single table is filled again from the merged items (its slots are hashed, no order
to reuse) and its scan shares the items, as in :meth:`AutoIndex._rebuild_sorted`; its planner
is calibrated again (the timing runs on the new items).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index.base import trim_heap
from bucketsearch.index.mih import MultiIndex, default_substrings, substring_ranges
from bucketsearch.index.mih_tables import merge_remap, merge_tables
from bucketsearch.index.planner import AutoIndex

#: the tables are merged while (new items + dropped items) <= this fraction of the merged
#: items; else rebuilt (measured: bench/RESULTS.md section 34)
REUSE_MAX_FRACTION = 0.5


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


def build_main(fresh, old_main, words: np.ndarray, ids: np.ndarray, dropped: np.ndarray,
               reuse: bool = True) -> bool:
    """Fill the empty engine ``fresh`` with the merged items ``words`` / ``ids`` ((code, id)
    order, the result of merging ``old_main``'s items, ``dropped`` marking the ones that
    went, with new ones): its tables merged from ``old_main``'s when :func:`reusable` (and
    ``reuse``), else built (:meth:`IndexBase.build`). True when the order was reused."""
    n = len(ids)
    gone = int(np.count_nonzero(dropped))
    changed = n - (old_main.ntotal - gone) + gone  # new items + dropped ones
    mapped = None
    if reuse and reusable(old_main, fresh, n, changed):
        mapped = merge_remap(np.asarray(old_main.ids), dropped, ids)
    if mapped is None:
        fresh.build(words, ids, presorted=True)
        return False
    old, new = _multi_index(old_main), _multi_index(fresh)
    threads = fresh.build_threads
    starts, widths = substring_ranges(new.bits, old.substrings)
    tables = merge_tables(new.bits, words, ids, old.tables, np.asarray(old.words), *mapped,
                          starts, widths, new._word_width, threads)
    del mapped
    new._install(words, ids, starts, widths, tables)
    if isinstance(fresh, AutoIndex):  # as AutoIndex._rebuild_sorted after its multi-index
        fresh.single._rebuild_sorted(words, ids)
        fresh.scan.share(words, ids)
        if fresh.calibrate_on_build:
            fresh.calibrate()
        else:
            fresh._set_default_models()
    trim_heap(n)
    return True
