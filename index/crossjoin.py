"""Cross join: every pair of one item of one set and one item of another within Hamming radius R,
exactly once, streamed in (a, b) order like :func:`index.join.pairs` (the join of two shards of
one index: ``index/cluster/shardjobs.py``).

Two methods (``method="auto"`` picks ``union`` unless one side has more than
:data:`UNION_RATIO` times the items of the other):

* ``union``: the self-join of both sides together (:func:`index.join.pairs`, its algorithm chosen
  by its cost model), each pair found kept only when its items are on different sides (filtered
  before the pairs are sorted or spilled). The pairs within a side are verified but not kept:
  about the cost of one join of both sides (1M 64-bit codes in two halves, r = 3: 0.5 s against
  3.3 s for ``search``, bench/RESULTS.md section 19c).
* ``search``: the larger side indexed (an :class:`~index.planner.AutoIndex`), the smaller side's
  codes its range queries: a few queries against a large side cost less than its join.

A module of its own because it indexes one side with an engine (:func:`index.factory.
make_index`), and the engines' base imports :mod:`index.join` (``IndexBase.pairs``): in
:mod:`index.join` it would close an import cycle. It shares the self-join's sorted runs and
chunking (:class:`index.join._SortedRuns`, :func:`index.join._chunked`).
"""
from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from bucketsearch.index.factory import make_index
from bucketsearch.index.join import (DEFAULT_CHUNK_SIZE, DEFAULT_MEMORY_PAIRS, JoinPrediction,
                                     JoinStats, PairChunk, _check_positive, _check_radius,
                                     _chunked, _emit_sorted, _pairs, _predict, _SortedRuns, clock,
                                     live_items)

#: queries per range search of a cross join (bounds the answers held at once)
CROSS_BATCH = 4_096
#: ``method="auto"``: ``search`` when one side has more than this many times the other's items
UNION_RATIO = 16
METHODS = ("auto", "union", "search")


def cross_pairs(left, right, radius: int, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                stats: JoinStats | None = None, memory_pairs: int = DEFAULT_MEMORY_PAIRS,
                spill_dir=None, batch: int = CROSS_BATCH, method: str = "auto",
                prediction: JoinPrediction | None = None) -> Iterator[PairChunk]:
    """Every pair of one live item of ``left`` and one of ``right`` within ``radius``, once, as
    :class:`PairChunk` s with ``a < b`` (ids, whichever side each comes from), ordered by (a, b)
    with the chunk contract of :func:`pairs`. The two sides must have the same bits and no id in
    common (the join of two shards of one index); pairs within one side are not reported.

    ``method``: module docstring. ``search``: the smaller side's codes are range queries,
    ``batch`` at a time, against an index of the larger side; the pairs go to sorted runs
    (:class:`_SortedRuns`, spilled past ``memory_pairs``) keyed by the rows of both sides' ids
    merged, so they come out ordered; ``stats.algorithm`` is ``"cross"``, ``progress`` the
    fraction of queries done, the phases ``tables`` (building the index), ``verify`` (the
    searches), ``emit``. ``union``: ``stats`` as the self-join's (``params["cross"]`` is
    ``"union"``, its prediction that of the union: ``prediction``, one :func:`predict_cross`
    already made)."""
    bits, ids_l, words_l = live_items(left)
    bits_r, ids_r, words_r = live_items(right)
    if bits_r != bits:
        raise ValueError(f"right: {bits_r}-bit codes, left has {bits}")
    R = _check_radius(radius, bits)
    chunk_size = _check_positive("chunk_size", chunk_size)
    memory_pairs = _check_positive("memory_pairs", memory_pairs)
    batch = _check_positive("batch", batch)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if len(ids_r):  # both sorted by id (live_items): a binary search each
        pos = np.minimum(np.searchsorted(ids_r, ids_l), len(ids_r) - 1)
        common = ids_l[ids_r[pos] == ids_l]
        if len(common):
            raise ValueError(f"right: id {int(common[0])} is on both sides (a cross join needs "
                             "disjoint ids)")
    stats = stats if stats is not None else JoinStats()
    if _method(method, len(ids_l), len(ids_r)) == "union":
        return _union(bits, ids_l, words_l, ids_r, words_r, R, chunk_size, stats, memory_pairs,
                      spill_dir, prediction)
    return _cross(bits, ids_l, words_l, ids_r, words_r, R, chunk_size, stats, memory_pairs,
                  spill_dir, batch)


def _method(method: str, n_l: int, n_r: int) -> str:
    small, large = sorted((n_l, n_r))
    if method == "union" or (method == "auto" and small * UNION_RATIO >= large):
        return "union"
    return "search"


def _merged(ids_l, words_l, ids_r, words_r):
    """Both sides' items ordered by id, and per row whether it is from the right side."""
    ids = np.concatenate([ids_l, ids_r])
    order = np.argsort(ids, kind="stable")
    words = np.ascontiguousarray(np.concatenate([words_l, words_r])[order])
    return ids[order], words, order >= len(ids_l)


def predict_cross(left, right, radius: int, method: str = "auto") -> JoinPrediction | None:
    """The cost model's prediction of :func:`cross_pairs` by ``union``: the self-join's of both
    sides together (:func:`index.join.predict_join`; its ``pairs`` count the pairs within the
    sides too). None for ``search`` (not modeled) or fewer than two items."""
    bits, ids_l, words_l = live_items(left)
    _, ids_r, words_r = live_items(right)
    R = _check_radius(radius, bits)
    if _method(method, len(ids_l), len(ids_r)) != "union" or len(ids_l) + len(ids_r) < 2:
        return None
    ids, words, _ = _merged(ids_l, words_l, ids_r, words_r)
    return _predict(bits, ids, words, R)


def _union(bits, ids_l, words_l, ids_r, words_r, R, chunk_size, stats, memory_pairs, spill_dir,
           prediction):
    ids, words, side = _merged(ids_l, words_l, ids_r, words_r)
    if prediction is not None and (prediction.items, prediction.radius, prediction.bits) != (
            len(ids), R, bits):
        raise ValueError(f"prediction: made for {prediction.items} items, radius "
                         f"{prediction.radius}, {prediction.bits} bits; this cross join has "
                         f"{len(ids)} items, radius {R}, {bits} bits")
    chunks = _pairs(bits, ids, words, R, chunk_size, stats, None, None, memory_pairs,
                    spill_dir, prediction, (None, 0.0, None), side=side)
    for chunk in chunks:
        stats.params["cross"] = "union"
        yield chunk
    stats.params["cross"] = "union"


def _cross(bits, ids_l, words_l, ids_r, words_r, R, chunk_size, stats, memory_pairs, spill_dir,
           batch):
    stats.items, stats.radius = len(ids_l) + len(ids_r), R
    stats.algorithm, stats.params = "cross", {"batch": batch}
    stats.started = time.monotonic()
    ids = np.concatenate([ids_l, ids_r])
    order = np.argsort(ids, kind="stable")
    rank = np.empty(len(ids), dtype=np.int64)
    rank[order] = np.arange(len(ids), dtype=np.int64)
    rows_l, rows_r = rank[:len(ids_l)], rank[len(ids_l):]
    ids = ids[order]
    if len(ids_l) > len(ids_r):  # index the larger side, query with the smaller
        words_l, words_r, rows_l, rows_r = words_r, words_l, rows_r, rows_l
    try:
        blocks = _cross_blocks(words_l, rows_l, words_r, rows_r, bits, R, stats, memory_pairs,
                               spill_dir, chunk_size, batch)
        yield from _chunked(blocks, chunk_size, ids, stats)
    finally:
        stats.finished = time.monotonic()


def _cross_blocks(words_q, rows_q, words_t, rows_t, bits, R, stats, memory_pairs, spill_dir,
                  chunk_size, batch):
    sink = _SortedRuns(len(rows_q) + len(rows_t), R, memory_pairs, spill_dir, stats)
    try:
        if len(rows_q) and len(rows_t):
            t0 = clock()
            target = make_index(bits, "auto", max_probes=2**62, calibrate_on_build=False)
            target.add(words_t, rows_t)  # the rows of the merged ids are the target's ids
            stats.phase("tables", t0)
            for s in range(0, len(rows_q), batch):
                stats._check()
                t0 = clock()
                lims, D, I = target.range_search(words_q[s:s + batch], R)[:3]
                stats.phase("verify", t0)
                t0 = clock()
                q = np.repeat(rows_q[s:s + batch], np.diff(lims))
                I = np.asarray(I, dtype=np.int64)
                sink.add(np.minimum(q, I), np.maximum(q, I), np.asarray(D, dtype=np.int32))
                stats.phase("emit", t0)
                stats.pairs += len(I)
                stats.candidates = stats.pairs
                stats.progress = min(s + batch, len(rows_q)) / len(rows_q)
        stats.progress = 1.0
        yield from _emit_sorted(sink, stats, chunk_size)
    finally:
        sink.close()


__all__ = ["CROSS_BATCH", "METHODS", "UNION_RATIO", "cross_pairs", "predict_cross"]
