"""The exact answers of one :class:`~bucketsearch.index.storage.live.LiveState`, by a linear scan in
plain numpy: the oracle of the exactness audit (app/audit.py).

Nothing here goes through an engine, a table or a compiled kernel: the live items are the main
index's stored ``(ids, words)`` minus the tombstoned ids, plus the delta's
(:meth:`~bucketsearch.index.storage.state.LiveState.item_parts`, read in place through the view
the request searched: a check of a 100M index copies none of its 1.6 GB), and the distance of
query ``q`` to item ``i`` is ``sum_w popcount(q[w] XOR x_i[w])`` (``numpy.bitwise_count``).
Answers are ordered by (distance, id), the order every engine promises:

* range: every live item with ``d <= R``;
* k-NN: the first k of that order (within ``max_distance`` when given, else every item); only
  the items within the k-th smallest distance (read from the distance histogram) are sorted.
"""
from __future__ import annotations

import numpy as np


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


def exact_answer(parts, query: np.ndarray, *, max_distance: int | None = None,
                 k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, distances)`` of one query over the live items, ordered by (distance, id): the
    range answer (``k`` None) or the k-NN answer (module docstring). ``parts``: segments
    ``(ids, words, dropped)`` (:meth:`~bucketsearch.index.storage.state.LiveState.item_parts`:
    no copy of the items), an item whose id is in ``dropped`` (None: none) not live.

    Dropped ids are looked up only among the items within the cut: for k-NN the cut is the
    k-th smallest distance of the segments' histogram less the dropped items found within it,
    raised until it holds k live items (a few passes at most; none without drops)."""
    parts = [(np.asarray(i), np.asarray(w), g) for i, w, g in parts]
    ds = [distances(w, query) for _, w, _ in parts]
    live = sum(len(i) for i, _, _ in parts) - sum(len(g) for _, _, g in parts if g is not None)
    cut = max_distance
    if k is not None and live > k:
        width = max(int(d.max(initial=0)) for d in ds) + 1
        hist = sum(np.bincount(d, minlength=width).astype(np.int64) for d in ds)
        gone = np.zeros(len(hist), dtype=np.int64)
        while True:
            kth = int(np.searchsorted(np.cumsum(hist - gone), k))
            kth = kth if cut is None else min(cut, kth)
            now = np.zeros(len(hist), dtype=np.int64)
            for (ids, _, dropped), d in zip(parts, ds):
                if dropped is not None and len(dropped):
                    sel = np.flatnonzero(d <= kth)
                    now += np.bincount(d[sel[np.isin(ids[sel], dropped)]], minlength=len(hist))
            if np.array_equal(now, gone):
                break
            gone = now
        cut = kth
    found, dist = [], []
    for (ids, _, dropped), d in zip(parts, ds):
        sel = np.flatnonzero(d <= cut) if cut is not None else np.arange(len(d))
        if dropped is not None and len(dropped):
            sel = sel[~np.isin(ids[sel], dropped)]
        found.append(ids[sel])
        dist.append(d[sel])
    found = np.concatenate(found) if found else np.empty(0, dtype=np.int64)
    d = np.concatenate(dist) if dist else np.empty(0, dtype=np.uint8)
    order = np.lexsort((found, d))
    if k is not None:
        order = order[:k]
    return found[order], d[order].astype(np.int32)
