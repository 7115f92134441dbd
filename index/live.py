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
live items of that state and write it as snapshot ``snap-s`` (temp directory, fsync, rename,
fsync of the parent); under the lock again, swap in the new main index with the operations that
arrived during the merge (they are in segment ``s + 1`` and in memory) replayed on top; then
delete the older snapshots and the segments ``<= s``.

Recovery (:meth:`LiveIndex.open`): load the newest complete snapshot ``snap-s`` (or start empty),
replay the segments ``> s`` in order up to their last valid record (a torn tail is truncated).
"""
from __future__ import annotations

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

from index.codes import as_words, check_bits, n_words
from index.mih import MultiIndex
from index.planner import AutoIndex, make_index
from index.probe import HammingIndex
from index.scan import LinearScan
from index.wal import Op, WriteAheadLog, fsync_dir, list_segments, replay

log = logging.getLogger(__name__)

MODES = ("single", "mih", "auto")
SNAPSHOT_META = "snapshot.json"
_SNAP_RE = re.compile(r"^snap-(\d{8})$")
_EMPTY_IDS = np.empty(0, dtype=np.int64)


class DuplicateIdError(ValueError):
    """An inserted id is already live in the index (HTTP 409)."""


def check_mode(mode: str, bits: int, substrings: int | None) -> None:
    """Validate ``mode`` and ``substrings`` before anything is written."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if substrings is not None:
        if mode == "single":
            raise ValueError("substrings applies to mode 'mih' or 'auto' only, got mode 'single'")
        if not 1 <= substrings <= bits:
            raise ValueError(f"substrings must be in [1, bits={bits}], got {substrings}")


def make_main_index(mode: str, bits: int, substrings: int | None, max_probes: int):
    """An empty main index for ``mode`` (:func:`index.planner.make_index`)."""
    check_mode(mode, bits, substrings)
    return make_index(bits, mode, substrings=substrings, max_probes=max_probes)


def load_main_index(mode: str, path: Path, mmap: bool, max_probes: int):
    cls = {"single": HammingIndex, "mih": MultiIndex, "auto": AutoIndex}[mode]
    idx = cls.load(path, mmap=mmap)
    idx.max_probes = max_probes
    return idx


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


def merge_sorted(nq: int, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]):
    """Merge per-query result lists ``(query, distance, id)`` into CSR ``lims, D, I`` ordered by
    (distance, id) within each query."""
    q = np.concatenate([p[0] for p in parts]) if parts else _EMPTY_IDS
    d = np.concatenate([p[1] for p in parts]).astype(np.int32) if parts else np.empty(0, np.int32)
    i = np.concatenate([p[2] for p in parts]).astype(np.int64) if parts else _EMPTY_IDS
    order = np.lexsort((i, d, q))
    q, d, i = q[order], d[order], i[order]
    lims = np.zeros(nq + 1, dtype=np.int64)
    np.cumsum(np.bincount(q, minlength=nq), out=lims[1:])
    return lims, d, i


def _csr_parts(lims, D, I, drop: np.ndarray | None):
    q = np.repeat(np.arange(len(lims) - 1, dtype=np.int64), np.diff(lims))
    D, I = np.asarray(D), np.asarray(I)
    if drop is not None and len(drop) and len(I):
        keep = ~np.isin(I, drop)
        q, D, I = q[keep], D[keep], I[keep]
    return q, D, I


def _knn_parts(D, I, drop: np.ndarray | None):
    D, I = np.asarray(D), np.asarray(I)
    nq, k = I.shape
    q = np.repeat(np.arange(nq, dtype=np.int64), k)
    D, I = D.ravel(), I.ravel()
    keep = I >= 0
    if drop is not None and len(drop):
        keep &= ~np.isin(I, drop)
    return q[keep], D[keep], I[keep]


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

    @property
    def ntotal(self) -> int:
        return int(len(self.main_ids_sorted) - len(self.tombstones) + len(self.delta_ids))

    def in_main(self, ids: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self.main_ids_sorted, ids)
        pos = np.minimum(pos, max(len(self.main_ids_sorted) - 1, 0))
        if not len(self.main_ids_sorted):
            return np.zeros(len(ids), dtype=bool)
        return self.main_ids_sorted[pos] == ids

    def live_mask(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` are currently live (present and not deleted)."""
        ids = np.asarray(ids, dtype=np.int64)
        main_live = self.in_main(ids) & ~np.isin(ids, self.tombstones)
        return main_live | np.isin(ids, self.delta_ids)

    def range_search(self, xq: np.ndarray, radius: int, stats: bool = False,
                     max_probes: int | None = None):
        """``lims, D, I, main_stats``: radius search over main minus tombstones plus delta."""
        nq = len(xq)
        parts = []
        st = None
        if self.delta is None and not len(self.tombstones):  # fast path: the main table only
            res = with_probe_limit(self.main, max_probes).range_search(xq, radius, stats=stats)
            return (*res[:3], res[3] if stats else None)
        if stats or self.main.ntotal:
            main = with_probe_limit(self.main, max_probes)
            res = main.range_search(xq, radius, stats=stats)
            lims, D, I = res[:3]
            st = res[3] if stats else None
            parts.append(_csr_parts(lims, D, I, self.tombstones))
        if self.delta is not None:
            t = time.perf_counter_ns()
            lims, D, I = self.delta.range_search(xq, radius)
            self._note_delta(st, time.perf_counter_ns() - t)
            parts.append(_csr_parts(lims, D, I, None))
        lims, D, I = merge_sorted(nq, parts)
        return lims, D, I, st

    def _note_delta(self, st, scan_ns: int) -> None:
        """Record the delta's linear scan on the stats: it has no buckets, so it is not in the
        per-radius counters; ``delta_items`` items were scanned per query in ``delta_ns`` (the
        whole batch, wall clock)."""
        if st is not None:
            st.delta_items, st.delta_ns = len(self.delta_ids), int(scan_ns)

    def search(self, xq: np.ndarray, k: int, stats: bool = False,
               max_probes: int | None = None):
        """``D, I, main_stats``: k nearest by (distance, id), padded with -1 (distance -1).

        The delta is scanned first; when it holds k items within distance ``b`` of a query, the
        main table only needs a radius-``b`` range search for that query (the union's k nearest
        are within ``b``). Other queries run the main table's k-NN search; a query whose k
        nearest in the main table include tombstones is searched again for
        ``k + len(tombstones)`` so that k live items are found.
        """
        nq = len(xq)
        parts, st_parts = [], []
        bound = np.full(nq, -1, dtype=np.int64)
        delta_ns = 0
        if self.delta is not None:
            kd = min(k, len(self.delta_ids))
            t = time.perf_counter_ns()
            Dd, Id = self.delta.search(xq, kd)
            delta_ns = time.perf_counter_ns() - t
            parts.append(_knn_parts(Dd, Id, None))
            if kd == k:
                bound = Dd[:, k - 1].astype(np.int64)
        main = with_probe_limit(self.main, max_probes)
        if main.ntotal:
            usable = bound >= 0
            for b in np.unique(bound[usable]):
                if main.probe_count(int(b)) > main.max_probes:
                    usable[bound == b] = False
                    continue
                sel = np.flatnonzero(bound == b)
                res = main.range_search(xq[sel], int(b), stats=stats)
                q, d, i = _csr_parts(res[0], res[1], res[2], self.tombstones)
                parts.append((sel[q], d, i))
                if stats:
                    st_parts.append((sel, res[3]))
            sel = np.flatnonzero(~usable)
            if len(sel):
                kk = min(k, main.ntotal)
                res = main.search(xq[sel], kk, stats=stats)
                D, I = res[0], res[1]
                redo = np.zeros(len(sel), dtype=bool)
                if len(self.tombstones) and kk < main.ntotal:
                    redo = np.isin(I, self.tombstones).any(axis=1)
                parts.append((sel[~redo][:, None].repeat(kk, 1).ravel(), D[~redo].ravel(),
                              I[~redo].ravel()))
                if stats:
                    st_parts.append((sel[~redo], _rows(res[2], ~redo)))
                if redo.any():
                    k2 = min(k + len(self.tombstones), main.ntotal)
                    res2 = main.search(xq[sel[redo]], k2, stats=stats)
                    parts.append((sel[redo][:, None].repeat(k2, 1).ravel(), res2[0].ravel(),
                                  res2[1].ravel()))
                    if stats:
                        st_parts.append((sel[redo], res2[2]))
        parts = [_drop_padding(p, self.tombstones) for p in parts]
        lims, d, i = merge_sorted(nq, parts)
        D_out = np.full((nq, k), -1, dtype=np.int32)
        I_out = np.full((nq, k), -1, dtype=np.int64)
        rank = np.arange(len(i)) - np.repeat(lims[:-1], np.diff(lims))
        keep = rank < k
        qs = np.repeat(np.arange(nq), np.diff(lims))[keep]
        D_out[qs, rank[keep]] = d[keep]
        I_out[qs, rank[keep]] = i[keep]
        st = _assemble_stats(nq, st_parts) if stats and st_parts else None
        if self.delta is not None:
            self._note_delta(st, delta_ns)
        return D_out, I_out, st


def _drop_padding(part, tombstones):
    q, d, i = part
    keep = i >= 0
    if len(tombstones):
        keep &= ~np.isin(i, tombstones)
    return q[keep], d[keep], i[keep]


def _rows(st, mask):
    return type(st)(**{name: getattr(st, name)[mask] for name in st.__dataclass_fields__})


def _assemble_stats(nq: int, st_parts):
    """Per-query stats from several partial searches, back in query order (missing rows are 0)."""
    sel = np.concatenate([s for s, _ in st_parts])
    st = type(st_parts[0][1]).concat([p for _, p in st_parts])
    out = {}
    for name in st.__dataclass_fields__:
        arr = getattr(st, name)
        full = np.zeros((nq,) + arr.shape[1:], dtype=arr.dtype)
        full[sel] = arr
        out[name] = full
    return type(st)(**out)


@dataclass
class _Pending:
    """Mutable form of the delta and tombstones used while applying ops (under the write lock)."""

    ids_chunks: list = field(default_factory=list)
    words_chunks: list = field(default_factory=list)
    tombstones: set = field(default_factory=set)


class LiveIndex:
    """Durable, concurrently searchable index over one directory (snapshots + WAL segments)."""

    def __init__(self, directory: str | os.PathLike, bits: int, mode: str = "single",
                 substrings: int | None = None, *, max_probes: int = 10_000_000,
                 merge_threshold: int = 50_000, read_only: bool = False, mmap: bool = False,
                 background_merge: bool = True):
        self.directory = Path(directory)
        self.bits = check_bits(bits)
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
        self.merges = 0
        self.last_merge_error: str | None = None
        self.recovered_torn_bytes = 0
        self._wal: WriteAheadLog | None = None
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)
        self._recover()

    # ----------------------------------------------------------------------------- recovery
    def _snapshots(self) -> list[tuple[int, Path]]:
        found = []
        for entry in self.directory.iterdir():
            m = _SNAP_RE.match(entry.name)
            if m and (entry / SNAPSHOT_META).exists():
                found.append((int(m.group(1)), entry))
        return sorted(found)

    def _recover(self) -> None:
        snaps = self._snapshots()
        if snaps:
            through, snap_dir = snaps[-1]
            main = load_main_index(self.mode, snap_dir / "main", self.mmap, self.max_probes)
        else:
            through = -1
            main = make_main_index(self.mode, self.bits, self.substrings, self.max_probes)
        state = self._base_state(main, version=0)
        pending = self._pending(state)
        segments = [(s, p) for s, p in list_segments(self.directory) if s > through]
        for _, path in segments:
            result = replay(path, truncate=not self.read_only)
            if result.torn_bytes:
                log.warning("WAL %s: torn tail of %d bytes after offset %d %s", path,
                            result.torn_bytes, result.valid_bytes,
                            "ignored (read-only)" if self.read_only else "truncated")
                self.recovered_torn_bytes += result.torn_bytes
            for op in result.ops:
                self._apply(state, pending, op)
        self.state = self._freeze(state, pending, version=1)
        if not self.read_only:
            seq = max([s for s, _ in segments] + [through + 1])
            self._wal = WriteAheadLog(self.directory, seq)

    def _base_state(self, main, version: int) -> LiveState:
        ids = np.sort(np.asarray(main.ids, dtype=np.int64)) if main.ntotal else _EMPTY_IDS
        w = n_words(self.bits)
        return LiveState(self.bits, main, ids, None, _EMPTY_IDS,
                         np.empty((0, w), dtype=np.uint64), _EMPTY_IDS, version)

    # -------------------------------------------------------------------------- applying ops
    @staticmethod
    def _pending(state: LiveState) -> _Pending:
        return _Pending([state.delta_ids], [state.delta_words], set())

    def _apply(self, state: LiveState, pending: _Pending, op: Op) -> None:
        """Record ``op`` in ``pending`` (the delta and new tombstones on top of ``state``)."""
        if op.kind == "add":
            pending.ids_chunks.append(op.ids)
            pending.words_chunks.append(op.words)
            return
        ids = np.concatenate(pending.ids_chunks)
        words = np.concatenate(pending.words_chunks)
        keep = ~np.isin(ids, op.ids)
        pending.ids_chunks[:] = [ids[keep]]
        pending.words_chunks[:] = [words[keep]]
        main_hits = op.ids[state.in_main(op.ids)]
        pending.tombstones.update(int(x) for x in main_hits)

    def _freeze(self, state: LiveState, pending: _Pending, version: int) -> LiveState:
        ids = np.concatenate(pending.ids_chunks)
        words = np.concatenate(pending.words_chunks)
        tomb = state.tombstones
        if pending.tombstones:
            tomb = np.union1d(tomb, np.fromiter(pending.tombstones, dtype=np.int64))
        delta = None
        if len(ids):
            delta = LinearScan(self.bits)
            # ids were validated when written (unique, not live); _rebuild only sets the arrays,
            # where add() would re-check uniqueness at O(n log n) on every write
            delta._rebuild(words, ids)
        return LiveState(self.bits, state.main, state.main_ids_sorted, delta, ids, words,
                         tomb, version)

    def _publish(self, op: Op) -> None:
        state = self.state
        pending = self._pending(state)
        self._apply(state, pending, op)
        self.state = self._freeze(state, pending, state.version + 1)

    @property
    def merging(self) -> bool:
        return self._merging

    # ----------------------------------------------------------------------------- writes
    def _check_writable(self) -> None:
        if self._closed:
            raise PermissionError(f"index {self.directory.name!r} is closed (deleted or "
                                  "shutting down)")
        if self.read_only or self._wal is None:
            raise PermissionError("this index is open read-only (several workers share it); "
                                  "writes need a single-worker server")

    def add(self, codes, ids) -> int:
        """Insert codes with ids; returns once the WAL record is fsynced. Duplicate ids (in the
        batch or already live) raise ValueError naming the first one."""
        self._check_writable()
        words = as_words(codes, self.bits)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) != len(words):
            raise ValueError(f"ids has {len(ids)} entries but codes has {len(words)}")
        if len(ids) == 0:
            return 0
        uniq, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"ids: id {int(uniq[counts > 1][0])} appears more than once "
                             "in the batch")
        with self._write_lock:
            live = self.state.live_mask(ids)
            if live.any():
                raise DuplicateIdError(f"ids: id {int(ids[live][0])} already exists in the index "
                               "(delete it first to replace it)")
            op = Op("add", ids.copy(), np.ascontiguousarray(words))
            self._wal.append(op)
            if self._merging:
                self._during_merge.append(op)
            self._publish(op)
        self._maybe_merge()
        return len(ids)

    def delete(self, ids) -> int:
        """Delete ids (unknown ones are ignored); returns the number deleted, once durable."""
        self._check_writable()
        ids = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
        with self._write_lock:
            ids = ids[self.state.live_mask(ids)]
            if len(ids) == 0:
                return 0
            op = Op("delete", ids)
            self._wal.append(op)
            if self._merging:
                self._during_merge.append(op)
            self._publish(op)
        self._maybe_merge()
        return len(ids)

    # ------------------------------------------------------------------------------ merge
    def needs_merge(self) -> bool:
        st = self.state
        return max(len(st.delta_ids), len(st.tombstones)) >= self.merge_threshold

    def _maybe_merge(self) -> None:
        if not self.background_merge or not self.needs_merge() or self._merging:
            return
        with self._write_lock:
            if self._merge_thread is not None and self._merge_thread.is_alive():
                return
            self._merge_thread = threading.Thread(target=self._merge_quietly, daemon=True,
                                                  name=f"merge-{self.directory.name}")
            self._merge_thread.start()

    def _merge_quietly(self) -> None:
        try:
            self.merge()
        except Exception as exc:  # a failed merge leaves the state and the WAL as they were
            log.exception("background merge of %s failed", self.directory)
            self.last_merge_error = f"{type(exc).__name__}: {exc}"

    def merge(self) -> bool:
        """Fold the delta and tombstones into a new main snapshot; False if nothing to do."""
        self._check_writable()
        with self._merge_lock:
            with self._write_lock:
                frozen = self.state
                if not len(frozen.delta_ids) and not len(frozen.tombstones):
                    return False
                through = self._wal.rotate()
                self._merging = True
                self._during_merge = []
            try:
                main = frozen.main
                keep = ~np.isin(np.asarray(main.ids), frozen.tombstones) if main.ntotal \
                    else np.zeros(0, dtype=bool)
                words = np.concatenate([np.asarray(main.words)[keep], frozen.delta_words])
                ids = np.concatenate([np.asarray(main.ids, dtype=np.int64)[keep],
                                      frozen.delta_ids])
                new_main = make_main_index(self.mode, self.bits, self.substrings,
                                           self.max_probes)
                if len(ids):
                    new_main.add(words, ids=ids)
                self._write_snapshot(new_main, through)
                if self.mmap:
                    new_main = load_main_index(self.mode, self.directory
                                               / f"snap-{through:08d}" / "main", True,
                                               self.max_probes)
                with self._write_lock:
                    state = self._base_state(new_main, self.state.version + 1)
                    pending = self._pending(state)
                    for op in self._during_merge:
                        self._apply(state, pending, op)
                    self.state = self._freeze(state, pending, state.version)
                    self._merging = False
                    self._during_merge = []
            finally:
                with self._write_lock:
                    self._merging = False
                    self._during_merge = []
            self._cleanup(through)
            self.merges += 1
            return True

    def _write_snapshot(self, main, through: int) -> None:
        final = self.directory / f"snap-{through:08d}"
        tmp = self.directory / f"snap-{through:08d}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        main.save(tmp / "main")
        meta = {"wal_through": through, "bits": self.bits, "mode": self.mode,
                "ntotal": int(main.ntotal)}
        with open(tmp / SNAPSHOT_META, "w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(self.directory)

    def _cleanup(self, through: int) -> None:
        for seq, path in self._snapshots():
            if seq < through:
                shutil.rmtree(path, ignore_errors=True)
        for seq, path in list_segments(self.directory):
            if seq <= through:
                path.unlink(missing_ok=True)
        for entry in self.directory.glob("snap-*.tmp"):
            shutil.rmtree(entry, ignore_errors=True)
        fsync_dir(self.directory)

    def wait_for_merge(self, timeout: float | None = None) -> None:
        thread = self._merge_thread
        if thread is not None:
            thread.join(timeout)

    def close(self) -> None:
        self._closed = True
        self.wait_for_merge()
        if self._wal is not None:
            self._wal.close()

    # ---------------------------------------------------------------------------- reading
    @property
    def ntotal(self) -> int:
        return self.state.ntotal

    def check_radius(self, radius: int) -> None:
        if not 0 <= radius <= self.bits:
            raise ValueError(f"max_distance must be in [0, bits={self.bits}], got {radius}")

    def range_search(self, xq, radius: int, stats: bool = False,
                     max_probes: int | None = None):
        """Radius search (d <= radius) of one consistent state; ``max_probes`` lowers the
        per-query probe guard for this call only."""
        self.check_radius(radius)
        return self.state.range_search(as_words(xq, self.bits), radius, stats, max_probes)

    def search(self, xq, k: int, stats: bool = False, max_probes: int | None = None):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return self.state.search(as_words(xq, self.bits), k, stats, max_probes)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(dirpath)
