"""A live index: immutable main snapshot + small delta segment + tombstones, durable through a WAL.

State (:class:`LiveState`) is an immutable value: the main index (a :class:`HammingIndex`, built
once per merge), the delta segment (a :class:`LinearScan` over the items inserted since), and the
tombstones (ids of the main index deleted since). A search reads ``self.state`` once and works on
that value only, so it never waits for a write and never sees half of one. A write takes the
write lock, validates, appends its WAL record (fsynced), then publishes a new state by swapping
one reference. Deleting an id of the delta removes it from the delta; deleting an id of the main
index adds a tombstone (filtered out of every result) until the next merge.

Merge (background thread, or :meth:`LiveIndex.merge`): under the write lock, rotate the WAL to a
new segment ``s + 1`` and remember the state; outside the lock, build a new main index from the
live items of that state, write it as snapshot ``snap-s`` (temp directory, fsync, rename, fsync
of the parent) and verify it by reading it back; under the lock again, swap in the new main
index with the operations that arrived during the merge replayed on top. The previous snapshot
generation and the WAL segments after it stay until the next merge, so a snapshot that is later
found corrupt falls back to the previous one plus the log. Merges repeat while the delta is over
the threshold (also at start-up); a failed background merge is retried after a back-off.

Recovery (in the constructor): the newest snapshot that verifies and has every later WAL
segment (or the empty index when the log starts at segment 0), then those segments in order.
A torn tail of the newest segment is cut (the bytes kept in ``.broken-<offset>``); any other
damage raises :class:`~index.storage.wal.CorruptLogError` or :class:`CorruptIndexError` and changes
nothing. Storage faults on writes: see :mod:`index.storage.wal` (an error means nothing was
acknowledged; a log that cannot be restored makes the index refuse writes, ``failed``).
"""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bucketsearch.index.base import ProbeLimitError, knn_to_csr
from bucketsearch.index.codes import as_words, check_bits, n_words
from bucketsearch.index import join
from bucketsearch.index.factory import check_served_mode, load_index, make_index
from bucketsearch.index.kernels import merge_rows, rows_done
from bucketsearch.index.probe import ResultLimitError
from bucketsearch.index.scan import LinearScan
from bucketsearch.index.table import sort_items
from bucketsearch.index.radix import merge_sorted, sort_ids
from bucketsearch.index.storage import follow, fsio
from bucketsearch.index.storage.dedup import DEFAULT_REPORT, DedupResult, screen
from bucketsearch.index.storage.store import load_arrays
from bucketsearch.index.storage.wal import (MAGIC, CorruptLogError, Op, WriteAheadLog,
                                            cut_torn_tail, list_segments, record, salvage,
                                            scan_segment)

log = logging.getLogger(__name__)

SNAPSHOT_META = "snapshot.json"
_SNAP_RE = re.compile(r"^snap-(\d{8})$")
_EMPTY_IDS = np.empty(0, dtype=np.int64)
MAX_ID = 2**63 - 1  # ids are int64 >= 0


class DuplicateIdError(ValueError):
    """An inserted id is already live in the index (HTTP 409)."""


def with_probe_limit(main, limit: int | None):
    """``main`` itself, or a shallow copy sharing its arrays with a lower ``max_probes``."""
    if limit is None or limit >= main.max_probes:
        return main
    view = copy.copy(main)
    for child in ("single", "mih"):  # the planner's engines: copy them too, never mutate shared
        if hasattr(view, child):
            setattr(view, child, copy.copy(getattr(view, child)))
    view.max_probes = max(int(limit), 1)
    return view


def _lims(counts: np.ndarray) -> np.ndarray:
    lims = np.zeros(len(counts) + 1, dtype=np.int64)
    np.add.accumulate(counts, out=lims[1:])  # (np.cumsum: ~1 us more a call)
    return lims


def _row_lims(nq: int, width: int) -> np.ndarray:
    """CSR ``lims`` of ``(nq, width)`` rows read as flat arrays."""
    return np.arange(nq + 1, dtype=np.int64) * width


def merge_results(nq: int, main: tuple, delta: tuple, tombstones: np.ndarray, k: int = -1):
    """Main-table results minus the tombstoned ids, merged with the delta's, both already
    ordered by (distance, id) per query (CSR ``(lims, D, I)``, padding id -1 skipped) by
    :func:`index.kernels.merge_rows`: nothing is sorted again. ``k < 0``: CSR ``(lims, D,
    I)``; ``k >= 1``: ``(D, I)`` of shape ``(nq, k)`` padded with -1."""
    counts, D, I = merge_rows(*main, *delta, tombstones, k)
    if k < 0:
        return _lims(counts), D, I
    return D.reshape(nq, k), I.reshape(nq, k)


def write_batch(codes, ids, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, words)`` of a write batch: as many ids as codes, no id twice."""
    words = np.ascontiguousarray(as_words(codes, bits))
    ids = np.array(ids, dtype=np.int64).reshape(-1)
    if len(ids) != len(words):
        raise ValueError(f"ids has {len(ids)} entries but codes has {len(words)}")
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"ids: id {int(uniq[counts > 1][0])} appears more than once "
                         "in the batch")
    return ids, words


def _empty_csr(nq: int) -> tuple:
    return np.zeros(nq + 1, dtype=np.int64), np.empty(0, np.int32), _EMPTY_IDS


@dataclass(frozen=True)
class LiveState:
    """One consistent, immutable view: main index + delta segment + tombstones."""

    bits: int
    main: object  # HammingIndex, MultiIndex or AutoIndex
    main_ids_sorted: np.ndarray
    delta: object | None  # LinearScan over delta_ids/delta_words, None when empty
    delta_ids: np.ndarray
    delta_words: np.ndarray
    tombstones: np.ndarray  # sorted int64 ids of the main index deleted since the last merge
    version: int = 0
    id_high: int = -1  # the largest id ever written (kept in snapshots): see next_id

    @property
    def ntotal(self) -> int:
        return int(len(self.main_ids_sorted) - len(self.tombstones) + len(self.delta_ids))

    def with_delta(self, ids: np.ndarray, words: np.ndarray, tombstones: np.ndarray,
                   version: int | None = None, id_high: int = -1) -> LiveState:
        """The same main index with another delta and tombstones (and version, if given);
        ``id_high`` raised to the largest id in the delta or ``id_high``."""
        delta = None
        if len(ids):
            delta = LinearScan(self.bits)
            # ids were validated when written (unique, not live); _rebuild only sets the arrays,
            # where add() would re-check uniqueness at O(n log n) on every write
            delta._rebuild(words, ids)
        id_high = max(self.id_high, id_high, int(ids.max()) if len(ids) else -1)
        return LiveState(self.bits, self.main, self.main_ids_sorted, delta, ids, words,
                         tombstones, self.version if version is None else version, id_high)

    def in_main(self, ids: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self.main_ids_sorted, ids)
        pos = np.minimum(pos, max(len(self.main_ids_sorted) - 1, 0))
        if not len(self.main_ids_sorted):
            return np.zeros(len(ids), dtype=bool)
        return self.main_ids_sorted[pos] == ids

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, words)`` of every live item: the main index's minus tombstones, then the
        delta's."""
        main = self.main
        keep = ~np.isin(np.asarray(main.ids), self.tombstones) if main.ntotal \
            else np.zeros(0, dtype=bool)
        words = np.concatenate([np.asarray(main.words)[keep], self.delta_words])
        ids = np.concatenate([np.asarray(main.ids, dtype=np.int64)[keep], self.delta_ids])
        return ids, words

    def sorted_items(self) -> tuple[np.ndarray, np.ndarray]:
        """``(words, ids)`` of every live item sorted by (code, id). A main index that keeps
        that order (:attr:`IndexBase.sorted_by_code`) of one-word codes is not sorted again:
        its items (tombstones dropped, order kept) and the sorted delta are merged in one
        pass (:func:`index.radix.merge_sorted`)."""
        main = self.main
        if not main.ntotal or not main.sorted_by_code or n_words(self.bits) != 1:
            ids, words = self.items()
            return sort_items(words, ids)
        main_words = np.asarray(main.words).reshape(-1)
        main_ids = np.asarray(main.ids, dtype=np.int64)
        if len(self.tombstones):
            keep = ~np.isin(main_ids, self.tombstones)
            main_words, main_ids = main_words[keep], main_ids[keep]
        delta_words, delta_ids = sort_items(self.delta_words, self.delta_ids)
        words, ids = merge_sorted(main_words, main_ids, delta_words.reshape(-1), delta_ids)
        return words.reshape(-1, 1), ids

    def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, words)`` of ``ids``: a delta copy wins over the main one (a re-insert)."""
        words = np.zeros((len(ids), n_words(self.bits)), dtype=np.uint64)
        found = np.zeros(len(ids), dtype=bool)
        if self.main.ntotal:
            main_ids = np.asarray(self.main.ids, dtype=np.int64)
            order = getattr(self.main, "_id_order", None)
            if order is None:  # computed once per main index (immutable between merges)
                order = self.main._id_order = np.argsort(main_ids, kind="stable")
            pos = np.minimum(np.searchsorted(main_ids, ids, sorter=order), len(order) - 1)
            hit = (main_ids[order[pos]] == ids) & ~np.isin(ids, self.tombstones)
            words[hit] = np.asarray(self.main.words)[order[pos[hit]]]
            found |= hit
        if len(self.delta_ids):
            if len(ids) <= 16:  # a few vectorized O(delta) compares beat a sort of the delta
                rows = np.array([(np.flatnonzero(self.delta_ids == i)[:1].tolist() or [-1])[0]
                                 for i in ids], dtype=np.int64)
            else:
                order = np.argsort(self.delta_ids, kind="stable")
                at = np.minimum(np.searchsorted(self.delta_ids, ids, sorter=order),
                                len(order) - 1)
                rows = np.where(self.delta_ids[order[at]] == ids, order[at], -1)
            hit = rows >= 0
            words[hit] = self.delta_words[rows[hit]]
            found |= hit
        return found, words

    @property
    def next_id(self) -> int:
        """The first id an insert without ids gets: one more than the largest id ever written
        to this index (deleted ones included: an id is never given twice; snapshots keep the
        mark, a restore starts from the largest id it holds)."""
        top = int(self.main_ids_sorted[-1]) if len(self.main_ids_sorted) else -1
        return max(top, self.id_high) + 1

    def pairs(self, radius: int, chunk_size: int = 65_536, min_id: int | None = None, **options):
        """Every unordered pair of live items (main minus tombstones, plus the delta) within
        ``radius``, once, in chunks ordered by (a, b): :func:`index.join.pairs` over this
        state (``options``: its keyword arguments)."""
        return join.pairs(self, radius, chunk_size=chunk_size, min_id=min_id, **options)

    def live_mask(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` are currently live (present and not deleted)."""
        ids = np.asarray(ids, dtype=np.int64)
        main_live = self.in_main(ids) & ~np.isin(ids, self.tombstones)
        return main_live | np.isin(ids, self.delta_ids)

    def range_search(self, xq: np.ndarray, radius: int, stats: bool = False,
                     max_probes: int | None = None, max_results: int | None = None):
        """``lims, D, I, main_stats``: radius search over main minus tombstones plus delta.

        ``max_results`` caps the live results of the batch (``ResultLimitError``, raised while
        searching): the main index is capped at ``max_results + len(tombstones)`` (at most that
        many of its results are dropped), the delta scan at what the main index left."""
        nq = len(xq)
        main = with_probe_limit(self.main, max_probes)
        if self.delta is None and not len(self.tombstones):  # fast path: the main table only
            res = main.range_search(xq, radius, stats=stats, max_results=max_results)
            return (*res[:3], res[3] if stats else None)
        st = None
        main_res = _empty_csr(nq)
        if stats or self.main.ntotal:
            try:
                res = main.range_search(xq, radius, stats=stats, max_results=None
                                        if max_results is None
                                        else max_results + len(self.tombstones))
            except ResultLimitError as exc:
                raise ResultLimitError(max_results, exc.reached - len(self.tombstones)) \
                    from None
            main_res = res[:3]
            st = res[3] if stats else None
        else:  # nothing to probe, but the same refusal as when there is (no queries: cheap)
            main.range_search(xq[:0], radius)
        found = len(main_res[2])  # live results of the main index
        if max_results is not None and len(self.tombstones) and found:
            found -= int(np.isin(main_res[2], self.tombstones).sum())
            if found > max_results:
                raise ResultLimitError(max_results, found)
        delta_res = _empty_csr(nq)
        if self.delta is not None:
            t = time.perf_counter_ns()
            try:
                delta_res = self.delta.range_search(
                    xq, radius, max_results=None if max_results is None else max_results - found)
            except ResultLimitError as exc:
                raise ResultLimitError(max_results, found + exc.reached) from None
            self._note_delta(st, time.perf_counter_ns() - t)
        return (*merge_results(nq, main_res, delta_res, self.tombstones), st)

    def _note_delta(self, st, scan_ns: int) -> None:
        """Record the delta's linear scan on the stats: it has no buckets, so it is not in the
        per-radius counters; ``delta_items`` items were scanned per query in ``delta_ns`` (the
        whole batch, wall clock)."""
        if st is not None:
            st.delta_items, st.delta_ns = len(self.delta_ids), int(scan_ns)

    def search(self, xq: np.ndarray, k: int, max_distance: int | None = None,
               stats: bool = False, max_probes: int | None = None):
        """``D, I, main_stats``: the k nearest by (distance, id) (within ``max_distance`` when
        given), padded with id -1 and distance -1.

        Tombstones hide main-index items only: an id deleted and inserted again lives in the
        delta. The delta is scanned first; when it holds k items within distance ``b`` of a
        query, the main table only needs its k nearest within ``b`` for that query (the union's
        k nearest are within ``b``). A query whose k nearest in the main table include
        tombstones is searched again with twice the k until k live items are found (or every
        item within the radius was returned). Main and delta rows, each ordered by (distance,
        id) by its kernel, are merged without sorting again (:func:`merge_results`).
        """
        nq = len(xq)
        main = with_probe_limit(self.main, max_probes)
        if self.delta is None and not len(self.tombstones) and main.ntotal >= k:
            # fast path: the main index only (~30 us less a one-query search)
            res = main.search(xq, k, max_distance=max_distance, stats=stats)
            return res[0], res[1], res[2] if stats else None
        R = self.bits if max_distance is None else int(max_distance)
        delta_rows = (_row_lims(nq, 0), np.empty(0, np.int32), _EMPTY_IDS)
        groups = [(None, R)]  # (queries or None: all, the radius their main search needs)
        delta_ns = 0
        if self.delta is not None:
            kd = min(k, len(self.delta_ids))
            t = time.perf_counter_ns()
            Dd, Id = self.delta.search(xq, kd, max_distance=R)
            delta_ns = time.perf_counter_ns() - t
            delta_rows = (_row_lims(nq, kd), Dd.ravel(), Id.ravel())
            if kd == k and nq == 1:  # (np.where and np.unique: ~5 us of a one-query search)
                b = int(Dd[0, k - 1])
                groups = [(None, b if b >= 0 else R)]
            elif kd == k:  # a row padded with -1 (fewer than k within R) keeps the bound R
                bound = np.where(Dd[:, k - 1] >= 0, Dd[:, k - 1], R)
                groups = [(np.flatnonzero(bound == b), int(b)) for b in np.unique(bound)]
        parts = []  # (queries or None: all, D, I, stats)
        if main.ntotal:
            for todo, b in groups:
                kk = min(k, main.ntotal)
                while todo is None or len(todo):
                    res = main.search(xq if todo is None else xq[todo], kk, max_distance=b,
                                      stats=stats)
                    D, I = res[0], res[1]
                    done = rows_done(I, self.tombstones, k, kk >= main.ntotal)
                    if done.all():
                        parts.append((todo, D, I, res[2] if stats else None))
                        break
                    sel = np.flatnonzero(done) if todo is None else todo[done]
                    parts.append((sel, D[done], I[done], res[2].rows(done) if stats else None))
                    todo = np.flatnonzero(~done) if todo is None else todo[~done]
                    kk = min(2 * kk, main.ntotal)
        if len(parts) == 1 and parts[0][0] is None:  # every query done in one search
            Dm, Im = parts[0][1], parts[0][2]
        else:
            width = max((p[1].shape[1] for p in parts), default=0)
            Dm = np.full((nq, width), -1, dtype=np.int32)
            Im = np.full((nq, width), -1, dtype=np.int64)
            for sel, D, I, _ in parts:
                Dm[sel, :D.shape[1]] = D
                Im[sel, :I.shape[1]] = I
        D_out, I_out = merge_results(nq, (_row_lims(nq, Dm.shape[1]), Dm.ravel(), Im.ravel()),
                                     delta_rows, self.tombstones, k)
        st = None
        if stats and parts:
            st = parts[0][3] if parts[0][0] is None else _assemble_stats(
                nq, [(sel, part_st) for sel, _, _, part_st in parts])
        if self.delta is not None:
            self._note_delta(st, delta_ns)
        return D_out, I_out, st


#: results of a dedup insert's range search: beyond ``max(DEDUP_RANGE_CAP, n x report x 4)``
#: (items with many near-duplicates) it takes the k-NN search instead
DEDUP_RANGE_CAP = 4096


def dedup_neighbours(state, words: np.ndarray, radius: int, report: int,
                      max_probes: int | None) -> tuple:
    """CSR ``(lims, D, I)`` of the live items within ``radius`` of each of ``words`` in
    ``state`` (a :class:`LiveState`, or anything with its ``range_search`` and ``search``: a
    sharded index's state): every one
    (a range search: the cheaper search, 10-20% less than k-NN within the radius here), or the
    ``report`` nearest (k-NN within the radius) when the range search would pass its result cap
    or its probe limit (k-NN switches to a scan instead of refusing)."""
    cap = max(DEDUP_RANGE_CAP, len(words) * report * 4)
    try:
        return state.range_search(words, radius, max_probes=max_probes, max_results=cap)[:3]
    except (ResultLimitError, ProbeLimitError):
        D, I, _ = state.search(words, report, max_distance=radius, max_probes=max_probes)
        return knn_to_csr(D, I)


def dedup_batch(codes, ids, radius, report, bits: int):
    """``(ids or None, words)`` of a dedup insert, its radius and report checked."""
    if isinstance(radius, bool) or not isinstance(radius, (int, np.integer)) \
            or not 0 <= radius <= bits:
        raise ValueError(f"radius must be in [0, bits={bits}], got {radius!r}")
    if isinstance(report, bool) or not isinstance(report, (int, np.integer)) or report < 1:
        raise ValueError(f"report must be an int >= 1, got {report!r}")
    if ids is None:
        return None, np.ascontiguousarray(as_words(codes, bits))
    return write_batch(codes, ids, bits)


def _assemble_stats(nq: int, st_parts):
    """Per-query stats from several partial searches, back in query order (missing rows are 0):
    every field of :class:`~index.base.SearchStats` is kept."""
    sel = np.concatenate([s for s, _ in st_parts])
    return type(st_parts[0][1]).concat([p for _, p in st_parts]).scatter(nq, sel)


def apply_ops(state: LiveState, ops: list[Op], check: bool = True,
              replace_live: bool = False) -> LiveState:
    """The state after ``ops`` (adds and deletes, in order) on top of ``state``.

    An add puts its items in the delta; a delete drops the id from the delta, and tombstones it
    when the main index holds it (the main copy stays dead even if the id is added again: the
    new item lives in the delta). With ``check``, an add of an id that is live at that point
    raises ValueError (a log that contradicts itself); with ``replace_live`` (repair: a salvaged
    log that lost a delete) such an add replaces the live item instead. Deletes of absent ids
    are no-ops.
    Vectorized over all ops: events sorted by (id, sequence). One validated op (a live write,
    ``check=False``) takes a direct path: concatenate, or filter the delta.
    """
    if len(ops) == 1 and not check and not replace_live:
        return _apply_one(state, ops[0])
    ops = [part for op in ops for part in _expand_upsert(op)]
    adds = [(state.delta_ids, state.delta_words)] + [(op.ids, op.words) for op in ops
                                                     if op.kind == "add"]
    add_seq = [np.full(len(state.delta_ids), -1)] + [np.full(len(op.ids), j) for j, op
                                                      in enumerate(ops) if op.kind == "add"]
    dels = [op.ids for op in ops if op.kind == "delete"]
    del_seq = [np.full(len(op.ids), j) for j, op in enumerate(ops) if op.kind == "delete"]
    a_ids = np.concatenate([a[0] for a in adds]).astype(np.int64, copy=False)
    a_words = np.concatenate([a[1] for a in adds]) if len(adds) > 1 else state.delta_words
    d_ids = np.concatenate(dels).astype(np.int64, copy=False) if dels else _EMPTY_IDS
    n_add = len(a_ids)
    ev_id = np.concatenate([a_ids, d_ids])
    ev_seq = np.concatenate(add_seq + del_seq) if len(ev_id) else _EMPTY_IDS
    order = np.lexsort((ev_seq, ev_id))
    ev_id, is_add = ev_id[order], order < n_add
    same_next = np.zeros(len(order), dtype=bool)
    same_next[:-1] = ev_id[1:] == ev_id[:-1]
    if (check or replace_live) and n_add:
        # an add must follow a delete of the same id, or be its id's first event with the id
        # not live in the main index
        prev_add = np.zeros(len(order), dtype=bool)
        prev_add[1:] = same_next[:-1] & is_add[:-1]
        first = np.ones(len(order), dtype=bool)
        first[1:] = ~same_next[:-1]
        main_live = state.in_main(ev_id) & ~np.isin(ev_id, state.tombstones)
        bad = is_add & (prev_add | (first & main_live))
        if bad.any() and not replace_live:
            raise ValueError(f"id {int(ev_id[bad][0])} is added while it is live")
        replaced = ev_id[bad & main_live]  # the main copy of a replaced id is dead
    last = is_add & ~same_next  # an add that no later event of its id undoes
    rows = np.sort(order[last])
    tomb = state.tombstones
    if replace_live and n_add and len(replaced):
        tomb = np.union1d(tomb, replaced)
    if len(d_ids):
        hit = d_ids[state.in_main(d_ids)]
        if len(hit):
            tomb = np.union1d(tomb, hit)
    return state.with_delta(a_ids[rows], a_words[rows], tomb,
                            id_high=int(a_ids.max()) if n_add else -1)


def _expand_upsert(op: Op) -> list[Op]:
    """An upsert is a delete of its ids (a no-op for ids not live) followed by their add."""
    if op.kind != "upsert":
        return [op]
    return [Op("delete", op.ids), Op("add", op.ids, op.words)]


def _apply_one(state: LiveState, op: Op, version: int | None = None) -> LiveState:
    """:func:`apply_ops` of one op already validated against ``state`` (adds of ids that are
    not live, deletes of live ids, any upsert): O(delta) with no sort."""
    ids, words, tomb = state.delta_ids, state.delta_words, state.tombstones
    if op.kind in ("delete", "upsert"):
        keep = ~np.isin(ids, op.ids)
        ids, words = ids[keep], words[keep]
        hit = op.ids[state.in_main(op.ids)]
        tomb = np.union1d(tomb, hit) if len(hit) else tomb
    if op.kind in ("add", "upsert"):
        ids, words = np.concatenate([ids, op.ids]), np.concatenate([words, op.words])
    return state.with_delta(ids, words, tomb, version)  # id_high: the delta holds op.ids


def _snapshot_dirs(directory: Path) -> list[tuple[int, Path]]:
    """``(wal_through, path)`` of every complete snapshot directory, oldest first."""
    found = []
    for entry in directory.iterdir():
        m = _SNAP_RE.match(entry.name)
        if m and (entry / SNAPSHOT_META).exists():
            found.append((int(m.group(1)), entry))
    return sorted(found)


@dataclass
class Recovery:
    """What opening an index found and did (shown in the index's status)."""

    snapshot: int | None = None  # wal_through of the snapshot used (None: started empty)
    segments: list[int] = field(default_factory=list)
    records: int = 0
    torn_bytes: int = 0
    broken_files: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # snapshots skipped, and why
    lost: list[dict] = field(default_factory=list)  # repair: byte ranges of salvaged segments


class CorruptIndexError(ValueError):
    """The index's files are damaged beyond what recovery repairs by itself (a torn tail of
    the newest WAL segment); nothing was changed. ``bucketsearch repair`` salvages."""


class FollowerStopped(CorruptIndexError):
    """A follower found damage in the log the writer committed and stopped following (the
    message says where); it applies nothing more."""


class LiveIndex:
    """Durable, concurrently searchable index over one directory (snapshots + WAL segments).

    ``repair=True`` (``bucketsearch repair``) opens a damaged index by salvaging every intact
    WAL record (``recovery.lost`` lists the byte ranges skipped) and letting an add of a live
    id replace it (a salvaged log may have lost the delete before it). ``failed`` is the
    reason the index refuses writes after a storage fault it could not undo (fail-stop), else
    None; ``recovery`` says what opening it found."""

    def __init__(self, directory: str | os.PathLike, bits: int, mode: str = "single",
                 substrings: int | None = None, *, max_probes: int = 10_000_000,
                 merge_threshold: int = 50_000, read_only: bool = False, mmap: bool = False,
                 background_merge: bool = True, repair: bool = False):
        self.directory = Path(directory)
        self.repair = repair and not read_only
        self.bits = check_bits(bits)
        check_served_mode(mode, self.bits, substrings, max_probes)
        self.mode = mode
        self.substrings = substrings
        self.max_probes = max_probes
        self.merge_threshold = merge_threshold
        self.read_only = read_only
        self.background_merge = background_merge
        self.mmap = mmap
        self._write_lock = threading.Lock()
        self._merge_lock = threading.Lock()
        self._merging = False
        self._during_merge: list[Op] = []
        self._merge_thread: threading.Thread | None = None
        self._merge_backoff = 0.0
        self._merge_not_before = 0.0
        self._snapshot_id_high = -1  # the id_high of the snapshot loaded last (_load_main)
        self.merges = 0
        self.last_merge: float | None = None
        self.last_merge_error: str | None = None
        self._wal: WriteAheadLog | None = None
        self._closed = False
        #: follower: why it stopped applying the writer's log (damage it must not skip), else None
        self.follow_stopped: str | None = None
        if not read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
        elif not self.directory.is_dir():
            raise FileNotFoundError(f"index directory {self.directory.name!r} does not exist")
        self.recovery = Recovery()
        self._recover()
        self._maybe_merge()  # a delta over the threshold at start-up is merged

    # ----------------------------------------------------------------------------- recovery
    def _new_main(self, mode: str | None = None, substrings: int | None = None):
        if mode is None:
            mode, substrings = self.mode, self.substrings
        return make_index(self.bits, mode, substrings=substrings, max_probes=self.max_probes)

    def _load_main(self, snap_dir: Path, expected_mode: str | None = None):
        """The main index of a snapshot. Its mode is the index's current mode (a mode change
        writes a snapshot in the new mode), so recovery adopts it; ``expected_mode`` checks
        a snapshot just written."""
        meta = json.loads(fsio.read_bytes(snap_dir / SNAPSHOT_META))
        mode = meta.get("mode")
        if meta.get("bits") != self.bits or (expected_mode is not None and mode != expected_mode):
            raise ValueError(f"{snap_dir.name}: holds bits={meta.get('bits')} mode={mode!r}, "
                             f"expected bits={self.bits} mode={expected_mode or self.mode!r}")
        main = load_index(snap_dir / "main", mmap=self.mmap, expected_kind=mode)
        main.max_probes = self.max_probes
        self._snapshot_id_high = int(meta.get("id_high", -1))  # absent before it was kept
        # the merges of this index so far (absent before they were kept: 0)
        self.merges = max(self.merges, int(meta.get("merges", 0)))
        if expected_mode is None:  # recovery: the snapshot's mode is the index's
            self.mode, self.substrings = mode, meta.get("substrings", self.substrings)
        return main

    def _verify_snapshot(self, snap_dir: Path, mode: str, ntotal: int) -> None:
        """Check a snapshot just written as :meth:`_load_main` would, without building an
        index of it: its meta (bits, mode), every array's checksum, dtype and shape, its kind
        and item count."""
        meta = json.loads(fsio.read_bytes(snap_dir / SNAPSHOT_META))
        if meta.get("bits") != self.bits or meta.get("mode") != mode:
            raise ValueError(f"{snap_dir.name}: holds bits={meta.get('bits')} "
                             f"mode={meta.get('mode')!r}, expected bits={self.bits} "
                             f"mode={mode!r}")
        kind, main_meta, _ = load_arrays(snap_dir / "main", mmap=True)
        if kind != mode or main_meta.get("ntotal") != ntotal:
            raise ValueError(f"{snap_dir.name}: holds a {kind!r} index of "
                             f"{main_meta.get('ntotal')} items, expected {mode!r} of {ntotal}")

    def _choose_base(self):
        """The newest snapshot that loads and verifies and whose later WAL segments are all
        there (or the empty index, when the log starts at segment 0): ``(through, main)``."""
        segs = [s for s, _ in list_segments(self.directory)]
        bases = [(t, d) for t, d in reversed(_snapshot_dirs(self.directory))] + [(-1, None)]
        io_error = None  # an I/O error (EIO, EMFILE, ...) says nothing about the snapshot
        for through, snap_dir in bases:
            later = [s for s in segs if s > through]
            if later != list(range(through + 1, through + 1 + len(later))):
                self.recovery.fallbacks.append(
                    f"snapshot {through}: WAL segments after it missing (found {later})")
                continue
            if snap_dir is None:
                if len(bases) > 1 and (not later or later[0] != 0):
                    break  # there were snapshots, and the log no longer starts at 0
                return through, self._new_main()
            try:
                return through, self._load_main(snap_dir)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.recovery.fallbacks.append(f"{snap_dir.name}: {exc}")
                log.warning("index %s: snapshot %s unusable (%s); trying the previous one",
                            self.directory.name, snap_dir.name, exc)
                if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
                    io_error = io_error or exc  # not damage: never quarantine, maybe transient
                elif not self.read_only:
                    with contextlib.suppress(OSError):
                        fsio.rename(snap_dir, snap_dir.with_name(
                            f"{snap_dir.name}.corrupt-{int(time.time())}"))
        if io_error is not None:  # retryable: report the I/O error, not corruption
            raise OSError(io_error.errno, f"cannot open the index: {io_error}") from io_error
        raise CorruptIndexError(
            f"no usable snapshot with a complete log after it: {'; '.join(self.recovery.fallbacks)}"
            " (run 'bucketsearch repair')")

    def _recover(self) -> None:
        through, main = self._choose_base()
        self.recovery.snapshot = None if through < 0 else through
        # snapshots verified by this process: the base, then each merge's (see _cleanup)
        self._previous_snapshot = self._verified_snapshot = through
        # a follower replays only what the writer committed (follow.py); None: all valid records
        limit = follow.read_position(self.directory) if self.read_only else None
        segments = [(s, p) for s, p in list_segments(self.directory) if s > through
                    and (limit is None or s <= limit.segment)]
        self._applied = follow.Position(through + 1, len(MAGIC), through)
        ops: list[Op] = []
        size = None
        for k, (seq, path) in enumerate(segments):
            scan = scan_segment(path)
            if limit is not None and seq == limit.segment:  # what follows was not acknowledged
                keep = sum(end <= limit.offset for end in scan.ends)
                scan.ops, scan.ends = scan.ops[:keep], scan.ends[:keep]
                if scan.damage is not None and scan.damage.offset >= limit.offset:
                    scan.damage = None
                elif scan.damage is not None or scan.valid_bytes < limit.offset:
                    # committed records are damaged or missing: never a torn tail to ignore
                    raise CorruptLogError(path, min(scan.valid_bytes, limit.offset),
                                          "committed records do not read back whole (the "
                                          f"writer committed up to byte {limit.offset})")
            newest = k == len(segments) - 1
            if scan.damage is not None and self.repair and (scan.damage.kind == "corrupt"
                                                            or not newest):
                ops.extend(self._salvage(scan))
                self.recovery.segments.append(seq)
                size = None
                continue
            if scan.damage is not None:
                if scan.damage.kind == "corrupt" or not newest:
                    raise CorruptLogError(path, scan.damage.offset,
                                          scan.damage.detail if newest else
                                          f"{scan.damage.detail} in a segment that is not the "
                                          "newest")
                log.warning("index %s: WAL %s: torn tail of %d bytes after offset %d %s",
                            self.directory.name, path.name, scan.torn_bytes,
                            scan.valid_bytes, "ignored (read-only)" if self.read_only
                            else "cut (kept in a .broken file)")
                self.recovery.torn_bytes += scan.torn_bytes
                if not self.read_only:
                    broken = cut_torn_tail(scan)
                    if broken is not None:
                        self.recovery.broken_files.append(broken.name)
                    size = max(scan.valid_bytes, len(MAGIC))
            ops.extend(scan.ops)
            self.recovery.segments.append(seq)
            self._applied = follow.Position(seq, scan.ends[-1] if scan.ends else len(MAGIC),
                                            through)
        self.recovery.records = len(ops)
        self._caught_up_at = time.monotonic()
        state = self._base_state(main, version=0,
                                 id_high=self._snapshot_id_high if through >= 0 else -1)
        try:
            self.state = apply_ops(state, ops, replace_live=self.repair)
        except ValueError as exc:
            raise CorruptIndexError(f"the write-ahead log contradicts itself: {exc}") from None
        if not self.read_only:
            for leftover in self.directory.glob(".snap-*.tmp"):
                shutil.rmtree(leftover, ignore_errors=True)
            seq = segments[-1][0] if segments else through + 1
            self._wal = WriteAheadLog(self.directory, seq, size)
            self._publish_position()

    def _salvage(self, scan) -> list[Op]:
        """Repair: keep every intact record of a damaged segment; the original bytes are kept
        in ``<segment>.corrupt-<time>``, the segment is rewritten atomically."""
        kept = salvage(scan.data)
        path = scan.path
        for start, end in kept.lost:
            self.recovery.lost.append({"segment": path.name, "start": start, "end": end})
        fsio.write_file(path.with_name(f"{path.name}.corrupt-{int(time.time())}"), scan.data)
        fsio.replace_file(path, MAGIC + b"".join(record(op) for op in kept.ops))
        log.warning("index %s: WAL %s salvaged: %d records kept, lost byte ranges %s",
                    self.directory.name, path.name, len(kept.ops), kept.lost)
        return kept.ops

    def _base_state(self, main, version: int, id_high: int = -1) -> LiveState:
        ids = sort_ids(np.asarray(main.ids, dtype=np.int64)) if main.ntotal else _EMPTY_IDS
        w = n_words(self.bits)
        return LiveState(self.bits, main, ids, None, _EMPTY_IDS,
                         np.empty((0, w), dtype=np.uint64), _EMPTY_IDS, version, id_high)

    @property
    def merging(self) -> bool:
        return self._merging

    @property
    def merge_status(self) -> str:
        """``"running"`` while a merge runs, ``"pending"`` while the delta or the tombstones are
        at the merge threshold and no merge runs yet (searches still answer, exact, but scan the
        delta: slower until the merge), else ``"none"``."""
        if self._merging:
            return "running"
        return "pending" if self.needs_merge() else "none"

    # ----------------------------------------------------------------------------- writes
    def _check_writable(self) -> None:
        if self._closed:
            raise PermissionError(f"index {self.directory.name!r} is closed (deleted or "
                                  "shutting down)")
        if self.read_only or self._wal is None:
            raise PermissionError("this index is open read-only (several workers share it); "
                                  "writes need a single-worker server")

    @property
    def failed(self) -> str | None:
        return self._wal.failed if self._wal is not None else None

    def _log(self, op: Op) -> None:
        """Append ``op`` durably, then publish the state that includes it (write lock held).
        A write that waited for the lock while the index was closed (a DELETE or shutdown) is
        refused here, never appended to a log that is closed or being removed."""
        self._check_writable()
        self._wal.append(op)  # AppendFailed / LogFailed: nothing changed, nothing acknowledged
        self._publish_position()
        if self._merging:
            self._during_merge.append(op)
        state = self.state
        self.state = _apply_one(state, op, version=state.version + 1)

    def _batch(self, codes, ids) -> tuple[np.ndarray, np.ndarray]:
        self._check_writable()
        return write_batch(codes, ids, self.bits)

    def add(self, codes, ids) -> int:
        """Insert codes with ids; returns once the WAL record is fsynced. Duplicate ids (in the
        batch or already live) raise ValueError naming the first one."""
        ids, words = self._batch(codes, ids)
        if len(ids) == 0:
            return 0
        with self._write_lock:
            live = self.state.live_mask(ids)
            if live.any():
                raise DuplicateIdError(f"ids: id {int(ids[live][0])} already exists in the "
                                       "index (delete it first, or upsert to replace it)")
            self._log(Op("add", ids, words))
        self._maybe_merge()
        return len(ids)

    def add_next(self, codes) -> tuple[int, int]:
        """Insert codes with the ids ``next_id, next_id + 1, ...`` (:attr:`LiveState.next_id`,
        taken under the write lock: two concurrent calls never get the same ids); returns
        ``(first_id, count)`` once the WAL record is fsynced."""
        self._check_writable()
        words = np.ascontiguousarray(as_words(codes, self.bits))
        with self._write_lock:
            first = self.state.next_id
            if first + max(len(words), 1) - 1 > MAX_ID:
                raise ValueError(
                    f"ids: the index gives ids after the largest ever written ({first - 1}); "
                    f"{len(words)} more would pass the largest id {MAX_ID}: insert with ids "
                    "instead")
            if len(words) == 0:
                return first, 0
            self._log(Op("add", np.arange(first, first + len(words), dtype=np.int64), words))
        self._maybe_merge()
        return first, len(words)

    def add_dedup(self, codes, radius: int, ids=None, *, report: int = DEFAULT_REPORT,
                  max_probes: int | None = None) -> DedupResult:
        """Dedup on ingest (:mod:`index.storage.dedup`): insert, in request order, each item
        with no live item and no earlier inserted item of the batch within ``radius``; the
        others are rejected with the (at most ``report``) nearest items that blocked them.
        ``ids`` None: the inserted items get ``next_id, next_id + 1, ...``.

        Atomic: the search, the decision and the append of the inserted items (one WAL record,
        fsynced before this returns) run under the write lock, so concurrent dedup inserts of
        near-duplicates never both get in; searches do not wait for it. An inserted item whose
        id is live already raises :class:`DuplicateIdError` and nothing is written (a rejected
        item's id is not checked: a request applied and sent again is answered with every item
        blocked by its own first copy, at distance 0). ``max_probes``: each item's probe budget
        (its search switches to a scan past it, as k-NN does; never refused)."""
        self._check_writable()
        ids, words = dedup_batch(codes, ids, radius, report, self.bits)
        if not len(words):
            return DedupResult.empty(None if ids is not None else self.state.next_id)
        with self._write_lock:
            state = self.state
            found = dedup_neighbours(state, words, int(radius), int(report), max_probes)
            first = state.next_id
            result = screen(words, int(radius), self.bits, found, ids, first, int(report))
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
            if new.any():
                self._log(Op("add", result.ids[new], words[new]))
        self._maybe_merge()
        return result

    def upsert(self, codes, ids) -> tuple[int, int]:
        """Insert or replace: each id gets its new code, in one durable WAL record (all of the
        batch or none of it). Returns ``(inserted, replaced)``. Idempotent: the same upsert
        applied twice leaves the same state."""
        ids, words = self._batch(codes, ids)
        if len(ids) == 0:
            return 0, 0
        with self._write_lock:
            replaced = int(self.state.live_mask(ids).sum())
            self._log(Op("upsert", ids, words))
        self._maybe_merge()
        return len(ids) - replaced, replaced

    def get(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """The codes of live ``ids`` (one consistent state): ``(found, words)``, ``found`` a
        bool per id and ``words`` its (n, W) uint64 code (zeros where not found)."""
        return self.state.get(np.asarray(ids, dtype=np.int64).reshape(-1))

    def delete(self, ids) -> int:
        """Delete ids (unknown ones are ignored); returns the number deleted, once durable."""
        self._check_writable()
        ids = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
        with self._write_lock:
            ids = ids[self.state.live_mask(ids)]
            if len(ids) == 0:
                return 0
            self._log(Op("delete", ids))
        self._maybe_merge()
        return len(ids)

    # ------------------------------------------------------------------------------ merge
    def needs_merge(self) -> bool:
        st = self.state
        return max(len(st.delta_ids), len(st.tombstones)) >= self.merge_threshold

    def _maybe_merge(self) -> None:
        """Start a background merge when the delta or the tombstones reach the threshold (not
        again within the back-off after a failed one)."""
        if not self.background_merge or self.read_only or self._closed \
                or not self.needs_merge() or time.monotonic() < self._merge_not_before:
            return
        with self._write_lock:
            if self._closed or (self._merge_thread is not None
                                and self._merge_thread.is_alive()):
                return
            self._merge_thread = threading.Thread(target=self._merge_until_small, daemon=True,
                                                  name=f"merge-{self.directory.name}")
            self._merge_thread.start()

    def _merge_until_small(self) -> None:
        """Merge until the delta is under the threshold: writes that arrived during a merge
        are folded by the next one, so merging always converges."""
        while not self._closed and self.needs_merge():
            try:
                self.merge()
            except Exception as exc:  # a failed merge leaves the state and the WAL as they were
                log.exception("background merge of %s failed", self.directory.name)
                self._merge_backoff = min(max(2 * self._merge_backoff, 1.0), 60.0)
                self._merge_not_before = time.monotonic() + self._merge_backoff
                self.last_merge_error = f"{type(exc).__name__}: {exc}"
                return

    def merge(self) -> bool:
        """Fold the delta and tombstones into a new main snapshot; False if nothing to do."""
        return self._rebuild(self.mode, self.substrings, force=False)

    def set_mode(self, mode: str, substrings: int | None = None) -> bool:
        """Rebuild the index in another mode, in place: a merge whose new snapshot is built in
        ``mode``. Reads go on against the old main index until the new one is published;
        writes go on too (logged, replayed on top). A crash before the snapshot's rename keeps
        the old mode; after it, recovery adopts the new one. False if the mode is unchanged."""
        check_served_mode(mode, self.bits, substrings, self.max_probes)
        if mode == self.mode and substrings == self.substrings:
            return False
        return self._rebuild(mode, substrings, force=True)

    def _rebuild(self, mode: str, substrings: int | None, force: bool) -> bool:
        """Build a new main index of the live items in ``mode`` and publish it (merge).

        Steps (a crash at any of them loses nothing: recovery uses the newest snapshot that
        verifies, plus the log after it): rotate the WAL to segment ``s + 1``; build the new
        main index of the state at that moment; write it as ``snap-s`` (temp dir, fsync,
        rename, fsync) and verify it by loading it back; publish it with the writes that came
        during the merge on top; then delete all but the previous snapshot generation and the
        WAL segments the previous generation does not need."""
        self._check_writable()
        with self._merge_lock:
            with self._write_lock:
                frozen = self.state
                if not force and not len(frozen.delta_ids) and not len(frozen.tombstones):
                    return False
                self._check_writable()  # closed while this merge waited for the lock
                through = self._wal.rotate()
                self._merging = True
                self._during_merge = []
            try:
                t = time.perf_counter()
                words, ids = frozen.sorted_items()  # the main's order kept, the delta merged
                new_main = self._new_main(mode, substrings)
                if len(ids):
                    new_main.build(words, ids, presorted=True)  # ids checked when written
                merges = self.merges + 1  # kept in the snapshot: a restart reads it back
                snap_dir = self._write_snapshot(new_main, through, mode, substrings,
                                                frozen.id_high, merges)
                # read back: checksums of what is on disk; with mmap the mapped copy is
                # published, else only the files are checked (not built into a second index:
                # an auto index would calibrate again)
                if self.mmap:
                    new_main = self._load_main(snap_dir, expected_mode=mode)
                else:
                    self._verify_snapshot(snap_dir, mode, new_main.ntotal)
                with self._write_lock:
                    self.mode, self.substrings = mode, substrings
                    base = self._base_state(new_main, self.state.version + 1,
                                            self.state.id_high)
                    self.state = apply_ops(base, self._during_merge, check=False)
            finally:
                with self._write_lock:
                    self._merging = False
                    self._during_merge = []
            self._previous_snapshot, self._verified_snapshot = self._verified_snapshot, through
            self._publish_position()
            self.merges = merges
            self.last_merge = time.time()
            self.last_merge_error = None
            self._merge_backoff = 0.0
            log.info("index %s: merged %d items into snapshot %d (mode %s) in %.2f s",
                     self.directory.name, len(ids), through, mode, time.perf_counter() - t)
            self._cleanup()
            return True

    def _write_snapshot(self, main, through: int, mode: str, substrings: int | None,
                        id_high: int, merges: int = 0) -> Path:
        final = self.directory / f"snap-{through:08d}"
        tmp = self.directory / f".snap-{through:08d}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        fsio.mkdir(tmp)
        try:
            main.save(tmp / "main")
            meta = {"wal_through": through, "bits": self.bits, "mode": mode,
                    "substrings": substrings, "ntotal": int(main.ntotal), "id_high": id_high,
                    "merges": merges}
            fsio.write_file(tmp / SNAPSHOT_META, json.dumps(meta).encode())
            fsio.fsync_path(tmp)
            if final.exists():  # an earlier attempt that was renamed but not verified
                fsio.rmtree(final)
            fsio.rename(tmp, final)
            fsio.fsync_path(self.directory)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def _cleanup(self) -> None:
        """Keep the snapshot just written and the one verified before it (the base recovery
        used, or the previous merge's: what a corrupt newest snapshot falls back to) and the
        segments after the older of them. Any other snapshot goes, also a newer one that was
        never verified (corrupt, skipped by recovery; or a merge's that failed its read-back):
        kept, it would count as the previous generation. Failures only leave files for the
        next cleanup."""
        keep = (self._previous_snapshot, self._verified_snapshot)
        try:
            for seq, path in _snapshot_dirs(self.directory):
                if seq not in keep:
                    fsio.rmtree(path)
            for seq, path in list_segments(self.directory):
                if seq <= keep[0]:
                    fsio.unlink(path)
            fsio.fsync_path(self.directory)
        except OSError as exc:
            log.warning("index %s: cleanup after merge incomplete (%s); retried after the next "
                        "merge", self.directory.name, exc)

    # ---------------------------------------------------------------------------- following
    def _publish_position(self) -> None:
        """Writer: the commit position for followers (:mod:`index.storage.follow`)."""
        follow.write_position(self.directory, follow.Position(
            self._wal.seq, self._wal.size, self._verified_snapshot))

    @property
    def applied(self) -> follow.Position:
        """The log position this index has applied (a writer: all it acknowledged)."""
        if self._wal is not None:
            return follow.Position(self._wal.seq, self._wal.size, self._verified_snapshot)
        return self._applied

    @property
    def lag_ms(self) -> float:
        """A follower's staleness bound: ms since a catch-up last found nothing newer (0 for
        the writer)."""
        if self._wal is not None:
            return 0.0
        return (time.monotonic() - self._caught_up_at) * 1e3

    def catch_up(self) -> bool:
        """Follower (read-only): apply the records the writer committed since the last call,
        or reload from the newest snapshot after a merge (or when the log went back: a repair
        or a restored folder). Returns whether the state changed. A failure (raised) leaves the
        state as it was, to be retried; damage in what the writer committed
        (:class:`~index.storage.wal.CorruptLogError`, :class:`CorruptIndexError`) stops the
        follower for good (``follow_stopped`` says why; every later call raises
        :class:`FollowerStopped`): it never applies a record past a damaged one. Opening the
        folder afresh (after ``bucketsearch repair`` on the writer's side) follows again."""
        if not self.read_only:
            return False
        if self.follow_stopped is not None:
            raise FollowerStopped(self.follow_stopped)
        checked = time.monotonic()
        pos = follow.read_position(self.directory)
        if pos is None or pos == self._applied:
            self._caught_up_at = checked
            return False
        try:
            if pos.snapshot != self._applied.snapshot or pos[:2] < self._applied[:2]:
                self._reload()
            else:
                try:
                    ops = follow.read_committed(self.directory, self._applied, pos)
                except FileNotFoundError:  # cleaned up after a merge we have not loaded yet
                    self._reload()
                else:
                    state = self.state
                    self.state = apply_ops(state, ops, check=False) if ops else state
                    self._applied = pos
        except (CorruptLogError, CorruptIndexError) as exc:
            self.follow_stopped = f"following the writer stopped: {exc}"  # never skip past it
            raise FollowerStopped(self.follow_stopped) from exc
        self._caught_up_at = checked
        return True

    def _reload(self) -> None:
        """Follower: open the directory afresh (newest snapshot + committed log) and adopt it."""
        fresh = LiveIndex(self.directory, self.bits, self.mode, self.substrings,
                          max_probes=self.max_probes, read_only=True, mmap=self.mmap,
                          background_merge=False)
        self.mode, self.substrings = fresh.mode, fresh.substrings
        self.recovery = fresh.recovery
        self.state, self._applied = fresh.state, fresh._applied

    def wait_for_merge(self, timeout: float | None = None) -> None:
        thread = self._merge_thread
        if thread is not None:
            thread.join(timeout)

    def close(self) -> None:
        """Refuse writes from now on, let a running merge or mode change finish (a background
        merge, or one in a request's thread: both hold the merge lock), then close the log
        under the write lock. A write is either appended before this or refused
        (``PermissionError``), and nothing writes into the folder once this returns (a DELETE
        renames it away next: a snapshot written after that recreated the deleted index's
        folder)."""
        self._closed = True
        self.wait_for_merge()
        with self._merge_lock, self._write_lock:
            if self._wal is not None:
                self._wal.close()  # a fail-stopped log tries its undo once more

    # ---------------------------------------------------------------------------- reading
    @property
    def ntotal(self) -> int:
        return self.state.ntotal

    def check_radius(self, radius: int) -> None:
        if not 0 <= radius <= self.bits:
            raise ValueError(f"max_distance must be in [0, bits={self.bits}], got {radius}")

    def range_search(self, xq, radius: int, stats: bool = False,
                     max_probes: int | None = None, max_results: int | None = None):
        """Radius search (d <= radius) of one consistent state; ``max_probes`` lowers the
        per-query probe guard for this call only, ``max_results`` caps the batch's results
        (``index.probe.ResultLimitError``)."""
        self.check_radius(radius)
        return self.state.range_search(as_words(xq, self.bits), radius, stats, max_probes,
                                       max_results)

    def search(self, xq, k: int, max_distance: int | None = None, stats: bool = False,
               max_probes: int | None = None):
        """The k nearest live items (within ``max_distance`` when given) of one consistent
        state: ``(D, I, stats or None)``, ``(nq, k)`` padded with -1."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        if max_distance is not None:
            self.check_radius(max_distance)
        return self.state.search(as_words(xq, self.bits), int(k), max_distance, stats,
                                 max_probes)
