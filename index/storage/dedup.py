"""Dedup on ingest: which items of a write batch go in, and what blocked the others.

The rule (issue 27 item 6), applied in request order: item ``j`` is inserted when no live item
of the index lies within the radius ``r`` (``d <= r``) and no item of the same batch that was
inserted before it does; otherwise it is rejected, and the answer names the items that blocked
it, nearest first by (distance, id), at most ``report`` of them: live items and earlier
inserted items of the batch alike. This is the data pipelines' "keep the first item, drop every
later item within r of a kept one", with the index's live items kept first. So a batch sent in
several requests gets the same answer as in one (each request sees the earlier ones' items as
live), and a request sent twice inserts nothing the second time: every item is then blocked by
its own first copy, at distance 0.

:func:`screen` is the decision over one batch given its live neighbours (the k nearest within
``r`` of each item, from :meth:`bucketsearch.index.storage.live.LiveState.search`). The batch is
taken in
blocks of :data:`BLOCK` items: each block is searched against the items kept from the earlier
blocks and against itself, then :func:`bucketsearch.index.kernels.keep_first_rows` keeps greedily in
order. Kept items are pairwise farther apart than ``r``, so a query's hits among them stay few, and
a block holds at most ``BLOCK**2`` pairs: memory is bounded whatever the batch (even one code
sent many times). The kept items of earlier blocks are scanned
(:class:`bucketsearch.index.scan.LinearScan`)
while they are fewer than :data:`INDEX_FROM`, then indexed (``make_index(bits, "auto")``).

:meth:`bucketsearch.index.storage.live.LiveIndex.add_dedup` runs the search and this decision under
the index's write lock and appends the inserted items as one WAL record, so two near-duplicates
sent at the same time by two clients never both get in; searches do not take that lock.

This module imports only numpy at import time (the engine's kernels on first use), so the
client (:mod:`bucketsearch.loadtest.client`) returns the same :class:`DedupResult`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: items per block of the within-batch check (a block's self-search holds <= BLOCK**2 pairs)
BLOCK = 2048
#: kept items of earlier blocks are scanned below this count, indexed from it
INDEX_FROM = 16_384
#: blocking items reported per rejected item unless asked otherwise
DEFAULT_REPORT = 10


@dataclass(frozen=True)
class DedupResult:
    """The answer of a dedup insert of ``n`` items, in request order.

    ``ids`` (n,) int64: each item's id (given, or given by the index to an inserted item; -1 for
    a rejected item when the index was to give the ids); ``inserted`` (n,) bool; ``lims, D, I``:
    per item, in faiss's CSR layout, the items that blocked it (ids ``I`` and distances ``D``
    of ``lims[j]:lims[j+1]``, ordered by (distance, id), at most ``report`` of them; empty for
    an inserted item); ``first_id``: the first id the index gave (ids given by the index only;
    the inserted items got ``first_id, first_id + 1, ...`` in request order), else None."""

    ids: np.ndarray
    inserted: np.ndarray
    lims: np.ndarray
    D: np.ndarray
    I: np.ndarray
    first_id: int | None = None

    @property
    def n_inserted(self) -> int:
        return int(self.inserted.sum())

    @property
    def n_rejected(self) -> int:
        return int(len(self.inserted) - self.inserted.sum())

    def blockers(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, distances)`` of the items that blocked item ``j`` (empty if inserted)."""
        a, b = int(self.lims[j]), int(self.lims[j + 1])
        return self.I[a:b], self.D[a:b]

    @classmethod
    def empty(cls, first_id: int | None = None) -> DedupResult:
        return cls(np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(1, np.int64),
                   np.zeros(0, np.int32), np.zeros(0, np.int64), first_id)


def _index_of(words: np.ndarray, ids: np.ndarray, bits: int, index_from: int):
    """A searchable index of the kept items: a scan while few, else the planner's engines."""
    from bucketsearch.index.factory import make_index
    from bucketsearch.index.scan import LinearScan
    if len(ids) < index_from:
        index = LinearScan(bits)
        index._rebuild(words, ids)  # ids are unique (kept items): no re-check
        return index
    index = make_index(bits, "auto", calibrate_on_build=False)
    index.add(words, ids=ids)
    return index


def _csr_of_triples(n: int, rows: np.ndarray, D: np.ndarray, I: np.ndarray):
    """CSR over ``n`` rows of ``(row, distance, id)`` triples, each row ordered by
    (distance, id)."""
    order = np.lexsort((I, D, rows))
    lims = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=lims[1:])
    return lims, D[order].astype(np.int32), I[order].astype(np.int64)


def screen(words: np.ndarray, radius: int, bits: int, live: tuple,
           ids: np.ndarray | None = None, first_id: int = 0,
           report: int = DEFAULT_REPORT, block: int = BLOCK,
           index_from: int = INDEX_FROM) -> DedupResult:
    """The dedup decision over one batch (module docstring): ``words`` (n, W) uint64 in request
    order; ``live`` CSR ``(lims, D, I)``: per item, live items within ``radius`` by (distance,
    id), all of them or at least its ``report`` nearest (an item with any is rejected; rows
    are cut to ``report``); ``ids`` the batch's
    ids, or None: the inserted items get ``first_id, first_id + 1, ...`` in order. ``block``,
    ``index_from``: :data:`BLOCK`, :data:`INDEX_FROM`."""
    from bucketsearch.index.base import knn_to_csr
    from bucketsearch.index.kernels import keep_first_rows, merge_rows
    from bucketsearch.index.scan import LinearScan

    n = len(words)
    auto = ids is None
    item_ids = np.full(n, -1, dtype=np.int64) if auto else np.asarray(ids, dtype=np.int64)
    live_lims, lD, lI = (np.asarray(live[0], np.int64), np.asarray(live[1], np.int32),
                         np.asarray(live[2], np.int64))
    live_blocked = np.diff(live_lims) > 0
    if n == 1:  # one item (a check on arrival): its live neighbours decide alone
        kept = ~live_blocked
        if auto and kept[0]:
            item_ids[0] = first_id
        m = min(int(live_lims[1] - live_lims[0]), int(report))
        a = int(live_lims[0])
        return DedupResult(item_ids, kept, np.array([0, m], dtype=np.int64), lD[a:a + m],
                           lI[a:a + m], int(first_id) if auto else None)
    kept = np.zeros(n, dtype=bool)
    next_id = int(first_id)
    kept_index = None  # the kept items of the earlier blocks
    kept_words, kept_ids = [], []
    parts = []  # per block: (rows, D, I) of the batch items that block its items
    for s in range(0, n, block):
        e = min(n, s + block)
        q = words[s:e]
        m = e - s
        if kept_index is not None:
            lk, Dk, Ik = kept_index.range_search(q, radius)
        else:
            lk, Dk, Ik = np.zeros(m + 1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64)
        here = LinearScan(bits)
        here._rebuild(q, np.arange(s, e, dtype=np.int64))
        lb, Db, Pb = here.range_search(q, radius)
        blocked = live_blocked[s:e] | (np.diff(lk) > 0)
        keep = keep_first_rows(blocked, lb, Pb, s)
        kept[s:e] = keep
        n_keep = int(keep.sum())
        if auto and n_keep:
            item_ids[s:e][keep] = np.arange(next_id, next_id + n_keep, dtype=np.int64)
            next_id += n_keep
        # the batch items blocking each item of the block: every kept item of the earlier
        # blocks within the radius, and the kept items before it in the block
        rows_b = np.repeat(np.arange(m, dtype=np.int64), np.diff(lb))
        earlier = (Pb < rows_b + s) & kept[Pb]
        rows_k = np.repeat(np.arange(m, dtype=np.int64), np.diff(lk))
        parts.append((np.concatenate([rows_k, rows_b[earlier]]) + s,
                      np.concatenate([Dk, Db[earlier]]),
                      np.concatenate([Ik, item_ids[Pb[earlier]]])))
        if n_keep:
            kept_words.append(q[keep])
            kept_ids.append(item_ids[s:e][keep])
            if e < n:
                kept_index = _index_of(np.concatenate(kept_words), np.concatenate(kept_ids), bits,
                                        index_from)
    rows = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    batch = _csr_of_triples(n, rows, np.concatenate([p[1] for p in parts]) if parts else
                            np.zeros(0, np.int32),
                            np.concatenate([p[2] for p in parts]) if parts else
                            np.zeros(0, np.int64))
    counts, D, I = merge_rows(live_lims, lD, lI, *batch, np.zeros(0, np.int64), int(report))
    D, I = D.reshape(n, report), I.reshape(n, report)
    lims, D, I = knn_to_csr(D, I)
    return DedupResult(item_ids, kept, lims, D, I, int(first_id) if auto else None)


#: results of a dedup insert's range search: beyond ``max(DEDUP_RANGE_CAP, n x report x 4)``
#: (items with many near-duplicates) it takes the k-NN search instead
DEDUP_RANGE_CAP = 4096


def dedup_neighbours(state, words: np.ndarray, radius: int, report: int,
                     max_probes: int | None) -> tuple:
    """CSR ``(lims, D, I)`` of the live items within ``radius`` of each of ``words`` in
    ``state`` (a :class:`~bucketsearch.index.storage.state.LiveState`, or anything with its
    ``range_search`` and ``search``: a sharded index's state): every one (a range search: the
    cheaper search, 10-20% less than k-NN within the radius here), or the ``report`` nearest
    (k-NN within the radius) when the range search would pass its result cap or its probe
    limit (k-NN switches to a scan instead of refusing)."""
    from bucketsearch.index.base import ProbeLimitError, knn_to_csr
    from bucketsearch.index.probe import ResultLimitError

    cap = max(DEDUP_RANGE_CAP, len(words) * report * 4)
    try:
        return state.range_search(words, radius, max_probes=max_probes, max_results=cap)[:3]
    except (ResultLimitError, ProbeLimitError):
        D, I, _ = state.search(words, report, max_distance=radius, max_probes=max_probes)
        return knn_to_csr(D, I)


def dedup_batch(codes, ids, radius, report, bits: int):
    """``(ids or None, words)`` of a dedup insert, its radius and report checked."""
    from bucketsearch.index.codes import as_words
    from bucketsearch.index.storage.state import write_batch

    if isinstance(radius, bool) or not isinstance(radius, (int, np.integer)) \
            or not 0 <= radius <= bits:
        raise ValueError(f"radius must be in [0, bits={bits}], got {radius!r}")
    if isinstance(report, bool) or not isinstance(report, (int, np.integer)) or report < 1:
        raise ValueError(f"report must be an int >= 1, got {report!r}")
    if ids is None:
        return None, np.ascontiguousarray(as_words(codes, bits))
    return write_batch(codes, ids, bits)


def decide(state, words: np.ndarray, ids: np.ndarray | None, radius: int, report: int,
           max_probes: int | None) -> DedupResult:
    """The dedup insert of ``words`` (ids ``ids``, or None: the state's next ids) into
    ``state`` (a :class:`~bucketsearch.index.storage.state.LiveState`): its live neighbours
    (:func:`dedup_neighbours`), then :func:`screen`. Raises ValueError when the ids the index
    would give pass the largest id, :class:`~bucketsearch.index.storage.state.DuplicateIdError`
    when an inserted item's id is live already (a rejected item's id is not checked)."""
    from bucketsearch.index.storage.state import MAX_ID, DuplicateIdError

    found = dedup_neighbours(state, words, radius, report, max_probes)
    first = state.next_id
    result = screen(words, radius, state.bits, found, ids, first, report)
    new = result.inserted
    if ids is None and first + result.n_inserted - 1 > MAX_ID:
        raise ValueError(f"ids: the index gives ids after the largest ever written "
                         f"({first - 1}); {result.n_inserted} more would pass the "
                         f"largest id {MAX_ID}: insert with ids instead")
    if ids is not None and new.any():
        live = state.live_mask(ids[new])
        if live.any():
            raise DuplicateIdError(f"ids: id {int(ids[new][live][0])} already exists "
                                   "in the index with a code farther than the radius "
                                   "(delete it first, or upsert to replace it)")
    return result
