"""The exact answers of one :class:`~bucketsearch.index.storage.live.LiveState`, by a linear scan in
plain numpy: the oracle of the exactness audit (app/audit.py).

Nothing here goes through an engine, a table or a compiled kernel: the live items are the main
index's stored ``(ids, words)`` minus the tombstoned ids, plus the delta's, and the distance of
query ``q`` to item ``i`` is ``sum_w popcount(q[w] XOR x_i[w])`` (``numpy.bitwise_count``).
Answers are ordered by (distance, id), the order every engine promises:

* range: every live item with ``d <= R``;
* k-NN: the first k of that order (within ``max_distance`` when given, else every item); only
  the items within the k-th smallest distance (read from the distance histogram) are sorted.
"""
from __future__ import annotations

import numpy as np


def live_arrays(state) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, words)`` of the live items of ``state`` (main minus tombstones, then delta)."""
    ids, words = [], []
    main = state.main
    if main.ntotal:
        mi = np.asarray(main.ids, dtype=np.int64)
        mw = np.asarray(main.words)
        if len(state.tombstones):
            keep = ~np.isin(mi, state.tombstones)
            mi, mw = mi[keep], mw[keep]
        ids.append(mi)
        words.append(mw)
    if len(state.delta_ids):
        ids.append(np.asarray(state.delta_ids, dtype=np.int64))
        words.append(np.asarray(state.delta_words))
    if not ids:
        return np.empty(0, np.int64), np.empty((0, max(1, (state.bits + 63) // 64)), np.uint64)
    return np.concatenate(ids), np.concatenate(words)


#: items per block of :func:`distances` (its temporaries stay in the L2 cache, so a check
#: evicts little of what the serving threads hold)
BLOCK = 1 << 15


def distances(words: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Hamming distance of one query (a row of uint64 words) to every row of ``words``, block
    by block, one word column at a time (uint8 up to 3 words, at most 192; uint16 beyond)."""
    n, n_words = words.shape
    d = np.empty(n, dtype=np.uint8 if n_words <= 3 else np.uint16)
    for a in range(0, n, BLOCK):
        b = min(n, a + BLOCK)
        out = d[a:b]
        np.bitwise_count(words[a:b, 0] ^ query[0], out=out, casting="unsafe")
        for w in range(1, n_words):
            out += np.bitwise_count(words[a:b, w] ^ query[w])
    return d


def exact_answer(ids: np.ndarray, words: np.ndarray, query: np.ndarray, *,
                 max_distance: int | None = None, k: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, distances)`` of one query over the live items ``(ids, words)``, ordered by
    (distance, id): the range answer (``k`` None) or the k-NN answer (module docstring)."""
    d = distances(words, query)
    cut = max_distance
    if k is not None and len(d) > k:
        # the k-th smallest distance from the distance histogram: only items at most that far
        # can be among the k nearest (ties at it are settled by id below)
        kth = int(np.searchsorted(np.cumsum(np.bincount(d, minlength=1)), k))
        cut = kth if cut is None else min(cut, kth)
    if cut is not None:
        sel = np.flatnonzero(d <= cut)
        d, found = d[sel], ids[sel]
    else:
        found = ids
    order = np.lexsort((found, d))
    if k is not None:
        order = order[:k]
    return found[order], d[order].astype(np.int32)
