"""The exact answers of one :class:`~bucketsearch.index.storage.live.LiveState`, by a linear scan in
plain numpy: the oracle of the exactness audit (app/audit.py).

Nothing here goes through an engine, a table or a compiled kernel: the live items are the main
index's stored ``(ids, words)`` minus the tombstoned ids, plus the delta's
(:meth:`~bucketsearch.index.storage.state.LiveState.items`, read through the view the request
searched), and the distance of
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
