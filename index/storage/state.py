"""The live state of an index and its transitions: pure values, no I/O.

:class:`LiveState` is one consistent, immutable view of an index: the main index (built once
per merge), the delta segment (a :class:`~bucketsearch.index.scan.LinearScan` over the items
inserted since) and the tombstones (ids of the main index deleted since). It answers every
read (radius search, k-NN, get, items) over main minus tombstones plus delta. A write never
changes a state: :func:`apply_ops` (and :func:`apply_one` for one validated op) make the next
state from the previous one, :func:`base_state` the state of a freshly built main index. The
coordinator (:mod:`bucketsearch.index.storage.live`) logs each op durably, then publishes the
state these functions return by swapping one reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bucketsearch.index import join
from bucketsearch.index.budget import bucket_sizes  # noqa: F401 -- importable here
from bucketsearch.index.budget import largest_bucket
from bucketsearch.index.codes import as_words, n_words
from bucketsearch.index.errors import DuplicateIdError  # noqa: F401 -- raised here, importable here
from bucketsearch.index.radix import repeated_id
from bucketsearch.index.scan import LinearScan
from bucketsearch.index.storage import reads
from bucketsearch.index.storage.idset import IdRows, IdSet
from bucketsearch.index.storage.reads import merge_results, with_probe_limit  # noqa: F401
from bucketsearch.index.storage.wal import Op
from bucketsearch.index.table import merge_items, sort_items

_EMPTY_IDS = np.empty(0, dtype=np.int64)
MAX_ID = 2**63 - 1  # ids are int64 >= 0

def write_batch(codes, ids, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, words)`` of a write batch: as many ids as codes, each in 0..:data:`MAX_ID`
    (-1 is the padding of k-NN results), no id twice."""
    words = np.ascontiguousarray(as_words(codes, bits))
    ids = np.array(ids, dtype=np.int64).reshape(-1)
    if len(ids) != len(words):
        raise ValueError(f"ids has {len(ids)} entries but codes has {len(words)}")
    if len(ids) and ids.min() < 0:
        raise ValueError(f"ids: id {int(ids.min())} is negative; ids are integers from 0 to "
                         f"{MAX_ID}")
    twice = repeated_id(ids)
    if twice is not None:
        raise ValueError(f"ids: id {twice} appears more than once in the batch")
    return ids, words


@dataclass(frozen=True)
class LiveState:
    """One consistent, immutable view: main index + delta segment + tombstones."""

    bits: int
    main: object  # HammingIndex, MultiIndex or AutoIndex
    main_ids: IdSet  # the main index's ids (deleted ones included until a merge)
    delta: object | None  # LinearScan over delta_ids/delta_words, None when empty
    delta_ids: np.ndarray
    delta_words: np.ndarray
    tombstones: np.ndarray  # sorted int64 ids of the main index deleted since the last merge
    version: int = 0
    id_high: int = -1  # the largest id ever written (kept in snapshots): see next_id

    @property
    def ntotal(self) -> int:
        return int(len(self.main_ids) - len(self.tombstones) + len(self.delta_ids))

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
        return LiveState(self.bits, self.main, self.main_ids, delta, ids, words,
                         tombstones, self.version if version is None else version, id_high)

    def in_main(self, ids: np.ndarray) -> np.ndarray:
        return self.main_ids.contains(ids)

    def item_parts(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The live items in place, as ``(ids, words, dropped)`` segments: the main index's
        arrays with the tombstones as ``dropped``, then the delta's (nothing dropped)."""
        main = self.main
        parts = []
        if main.ntotal:
            parts.append((np.asarray(main.ids, dtype=np.int64), np.asarray(main.words),
                          self.tombstones))
        if len(self.delta_ids):
            parts.append((self.delta_ids, self.delta_words, _EMPTY_IDS))
        return parts

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, words)`` of every live item: the main index's minus tombstones, then the
        delta's; the main index's own arrays (read-only, no copy) when that is all."""
        parts = []
        for ids, words, gone in self.item_parts():
            keep = ~np.isin(ids, gone) if len(gone) else slice(None)
            parts.append((ids[keep], words[keep]))
        if len(parts) == 1:
            return tuple(_read_only(a) for a in parts[0])
        if not parts:
            return _EMPTY_IDS, np.empty((0, n_words(self.bits)), dtype=np.uint64)
        return (np.concatenate([i for i, _ in parts]),
                np.concatenate([w for _, w in parts]))

    def main_dropped(self) -> np.ndarray:
        """Which of the main index's rows are tombstoned (bool, one per row)."""
        main = self.main
        if not main.ntotal or not len(self.tombstones):
            return np.zeros(main.ntotal, dtype=bool)
        return np.isin(np.asarray(main.ids, dtype=np.int64), self.tombstones)

    def sorted_items(self, threads: int = 1,
                     dropped: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(words, ids)`` of every live item sorted by (code, id). A main index that keeps
        that order (:attr:`IndexBase.sorted_by_code`) of one-word codes is not sorted again:
        its items (tombstones dropped, order kept) and the sorted delta are merged in one
        pass (:func:`bucketsearch.index.table.merge_items`). ``dropped``:
        :meth:`main_dropped`, if the caller has it."""
        main = self.main
        if not main.ntotal or not main.sorted_by_code or n_words(self.bits) != 1:
            ids, words = self.items()
            return sort_items(words, ids, threads)
        main_words = np.asarray(main.words).reshape(-1)
        main_ids = np.asarray(main.ids, dtype=np.int64)
        if len(self.tombstones):
            keep = ~(self.main_dropped() if dropped is None else dropped)
            main_words, main_ids = main_words[keep], main_ids[keep]
        return merge_items(main_words.reshape(-1, 1), main_ids, self.delta_words,
                           self.delta_ids, threads)

    def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, words)`` of ``ids``: a delta copy wins over the main one (a re-insert)."""
        words = np.zeros((len(ids), n_words(self.bits)), dtype=np.uint64)
        found = np.zeros(len(ids), dtype=bool)
        if self.main.ntotal:
            rows = id_rows(self.main).rows(ids)
            hit = (rows >= 0) & ~np.isin(ids, self.tombstones)
            words[hit] = np.asarray(self.main.words)[rows[hit]]
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
        return max(self.main_ids.max, self.id_high) + 1

    def range_search(self, xq: np.ndarray, radius: int, stats: bool = False,
                     max_probes: int | None = None, max_results: int | None = None):
        """``lims, D, I, main_stats``: radius search over main minus tombstones plus delta
        (:func:`bucketsearch.index.storage.reads.range_search`)."""
        return reads.range_search(self, xq, radius, stats, max_probes, max_results)

    def search(self, xq: np.ndarray, k: int, max_distance: int | None = None,
               stats: bool = False, max_probes: int | None = None):
        """``D, I, main_stats``: the k nearest by (distance, id) (within ``max_distance`` when
        given), padded with id -1 and distance -1
        (:func:`bucketsearch.index.storage.reads.knn`)."""
        return reads.knn(self, xq, k, max_distance, stats, max_probes)

    def pairs(self, radius: int, chunk_size: int = 65_536, min_id: int | None = None, **options):
        """Every unordered pair of live items (main minus tombstones, plus the delta) within
        ``radius``, once, in chunks ordered by (a, b): :func:`bucketsearch.index.join.pairs` over this
        state (``options``: its keyword arguments)."""
        return join.pairs(self, radius, chunk_size=chunk_size, min_id=min_id, **options)

    def new_ids(self, n: int) -> np.ndarray:
        """The ids an insert of ``n`` items without ids gets: ``next_id, next_id + 1, ...``;
        ValueError when they would pass :data:`MAX_ID`."""
        first = self.next_id
        if first + max(n, 1) - 1 > MAX_ID:
            raise ValueError(
                f"ids: the index gives ids after the largest ever written ({first - 1}); "
                f"{n} more would pass the largest id {MAX_ID}: insert with ids instead")
        return np.arange(first, first + n, dtype=np.int64)

    def check_absent(self, ids: np.ndarray) -> None:
        """:class:`DuplicateIdError` naming the first of ``ids`` that is live."""
        live = self.live_mask(ids)
        if live.any():
            raise DuplicateIdError(f"ids: id {int(ids[live][0])} already exists in the "
                                   "index (delete it first, or upsert to replace it)")

    def live_mask(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` are currently live (present and not deleted)."""
        ids = np.asarray(ids, dtype=np.int64)
        main_live = self.in_main(ids) & ~np.isin(ids, self.tombstones)
        return main_live | np.isin(ids, self.delta_ids)

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
        return apply_one(state, ops[0])
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


def apply_one(state: LiveState, op: Op, version: int | None = None) -> LiveState:
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


def id_rows(main) -> IdRows:
    """The :class:`IdRows` of ``main``, built at its first lookup by id (kept with it: a main
    index never changes; counted by the live index's memory_bytes once built)."""
    rows = getattr(main, "_id_rows", None)
    if rows is None:
        rows = main._id_rows = IdRows(main.ids)
    return rows


def _read_only(a: np.ndarray) -> np.ndarray:
    """A view of ``a`` that refuses writes (an index's own arrays, handed out uncopied)."""
    view = a.view()
    view.flags.writeable = False
    return view


def base_state(main, bits: int, version: int, id_high: int = -1) -> LiveState:
    """The state of a freshly built or loaded ``main`` index: no delta, no tombstones. Its
    largest bucket (the search budget's bound) is found here, before the state serves."""
    ids = IdSet.of(main.ids if main.ntotal else _EMPTY_IDS)
    largest_bucket(main)
    return LiveState(bits, main, ids, None, _EMPTY_IDS,
                     np.empty((0, n_words(bits)), dtype=np.uint64), _EMPTY_IDS, version, id_high)

