"""A live index: the coordinator of one index folder (locks, the log, the merge thread).

The pieces it coordinates, each in its own module: the immutable state and its transitions
(:mod:`~bucketsearch.index.storage.state`: :class:`LiveState`, :func:`apply_ops`), the
read path of one state (:mod:`~bucketsearch.index.storage.reads`), the folder's file names
(:mod:`~bucketsearch.index.storage.layout`), the write-ahead log
(:mod:`~bucketsearch.index.storage.wal`), the snapshot writer and reader
(:mod:`~bucketsearch.index.storage.snapshot`), recovery
(:mod:`~bucketsearch.index.storage.recovery`), the commit position and catching up with it
(:mod:`~bucketsearch.index.storage.follow`, :mod:`~bucketsearch.index.storage.follower`:
:class:`Follower`), and the reads the service asks of the index, the handle protocol
(:mod:`~bucketsearch.index.storage.view`: :class:`LiveReads`, :class:`LiveView`).

A search reads ``self.state`` once and works on that value only, so it never waits for a
write and never sees half of one. A write takes the write lock, validates, appends its WAL
record (fsynced), then publishes a new state by swapping one reference. Deleting an id of the
delta removes it from the delta; deleting an id of the main index adds a tombstone (filtered
out of every result) until the next merge.

Merge (background thread, or :meth:`LiveIndex.merge`): under the write lock, rotate the WAL to a
new segment ``s + 1`` and remember the state; outside the lock, build a new main index from the
live items of that state, write it as snapshot ``snap-s`` (one atomic directory write) and
verify it by reading it back; under the lock again, swap in the new main index with the
operations that arrived during the merge replayed on top. The previous snapshot generation and
the WAL segments after it stay until the next merge, so a snapshot that is later found corrupt
falls back to the previous one plus the log. Merges repeat while the delta is over the
threshold (also at start-up); a failed background merge is retried after a back-off.

Storage faults on writes: see :mod:`bucketsearch.index.storage.wal` (an error means nothing
was acknowledged; a log that cannot be restored makes the index refuse writes, ``failed``).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import numpy as np

from bucketsearch.index.budget import largest_bucket
from bucketsearch.index.codes import as_words, check_bits
from bucketsearch.index.factory import check_served_mode
from bucketsearch.index.errors import FollowerStopped
from bucketsearch.index.storage import snapshot
from bucketsearch.index.storage.dedup import (DEDUP_RANGE_CAP, DEFAULT_REPORT, DedupResult,
                                              dedup_batch, dedup_neighbours)
from bucketsearch.index.storage.dedup import decide as dedup_decide
from bucketsearch.index.storage.layout import LEGACY_SNAPSHOT_META as SNAPSHOT_META
from bucketsearch.index.storage.merging import build_main
from bucketsearch.index.storage.recovery import (Config, CorruptIndexError, Recovery, load_main,
                                                 new_main, recover)
from bucketsearch.index.storage.state import (MAX_ID, DuplicateIdError, LiveState, apply_one,
                                              apply_ops, base_state, merge_results,
                                              with_probe_limit, write_batch)
from bucketsearch.index.storage.follower import Follower
from bucketsearch.index.storage.view import LiveReads
from bucketsearch.index.storage.wal import Op, WriteAheadLog

log = logging.getLogger(__name__)

#: importable from here as before the storage split (issue 29): app/, tests and bench use them
__all__ = ["DEDUP_RANGE_CAP", "MAX_ID", "SNAPSHOT_META", "CorruptIndexError",
           "DuplicateIdError", "FollowerStopped", "LiveIndex", "LiveState", "Recovery",
           "apply_ops", "dedup_batch", "dedup_neighbours", "merge_results", "with_probe_limit",
           "write_batch"]


class LiveIndex(LiveReads, Follower):
    """Durable, concurrently searchable index over one directory (snapshots + WAL segments).

    ``repair=True`` (``bucketsearch repair``) opens a damaged index by salvaging every intact
    WAL record (``recovery.lost`` lists the byte ranges skipped) and letting an add of a live
    id replace it (a salvaged log may have lost the delete before it). ``failed`` is the
    reason the index refuses writes after a storage fault it could not undo (fail-stop), else
    None; ``recovery`` says what opening it found (:mod:`~bucketsearch.index.storage.recovery`)."""

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
        #: a merge reuses the main index's order where that pays
        #: (:mod:`~bucketsearch.index.storage.merging`; False: always rebuilt, the baseline of
        #: bench/bench_merge.py)
        self.reuse_order = True
        self._write_lock = threading.Lock()
        self._merge_lock = threading.Lock()
        self._merging = False
        self._during_merge: list[Op] = []
        self._merge_thread: threading.Thread | None = None
        self._merge_backoff = 0.0
        self._merge_not_before = 0.0
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
        opened = recover(self._config())
        self.recovery = opened.report
        self.mode, self.substrings, self.merges = opened.mode, opened.substrings, opened.merges
        # snapshots verified by this process: the base, then each merge's (see _cleanup)
        self._previous_snapshot = self._verified_snapshot = opened.through
        self._applied, self._caught_up_at = opened.applied, time.monotonic()
        self.state: LiveState = opened.state
        if not read_only:
            self._wal = WriteAheadLog(self.directory, opened.seq, opened.size)
            self._publish_position()
        self._maybe_merge()  # a delta over the threshold at start-up is merged

    def _config(self) -> Config:
        return Config(self.directory, self.bits, self.mode, self.substrings, self.max_probes,
                      self.mmap, self.read_only, self.repair)

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
        self.state = apply_one(state, op, version=state.version + 1)

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
            self.state.check_absent(ids)
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
            first, ids = self.state.next_id, self.state.new_ids(len(words))
            if len(words) == 0:
                return first, 0
            self._log(Op("add", ids, words))
        self._maybe_merge()
        return first, len(words)

    def add_dedup(self, codes, radius: int, ids=None, *, report: int = DEFAULT_REPORT,
                  max_probes: int | None = None) -> DedupResult:
        """Dedup on ingest (:mod:`~bucketsearch.index.storage.dedup`): insert, in request order,
        each item with no live item and no earlier inserted item of the batch within
        ``radius``; the others are rejected with the (at most ``report``) nearest items that
        blocked them. ``ids`` None: the inserted items get ``next_id, next_id + 1, ...``.

        Atomic: the search, the decision (:func:`~bucketsearch.index.storage.dedup.decide`)
        and the append of the inserted items (one WAL record, fsynced before this returns) run
        under the write lock, so concurrent dedup inserts of near-duplicates never both get
        in; searches do not wait for it. An inserted item whose id is live already raises
        :class:`DuplicateIdError` and nothing is written. ``max_probes``: each item's probe
        budget (its search switches to a scan past it, as k-NN does; never refused)."""
        self._check_writable()
        ids, words = dedup_batch(codes, ids, radius, report, self.bits)
        if not len(words):
            return DedupResult.empty(None if ids is not None else self.state.next_id)
        with self._write_lock:
            result = dedup_decide(self.state, words, ids, int(radius), int(report), max_probes)
            new = result.inserted
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
        main index of the state at that moment; write it as ``snap-s``
        (:func:`~bucketsearch.index.storage.snapshot.write`) and verify it by reading it back;
        publish it with the writes that came during the merge on top; then delete all but the
        previous snapshot generation and the WAL segments the previous generation does not
        need."""
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
                fresh = new_main(self._config(), mode, substrings)
                # the main's order kept, the delta merged; its tables too where that pays
                # (ids checked when written)
                dropped = frozen.main_dropped()
                words, ids = frozen.sorted_items(fresh.build_threads, dropped)
                if len(ids):
                    build_main(fresh, frozen.main, words, ids, dropped, self.reuse_order)
                del dropped
                merges = self.merges + 1  # kept in the snapshot: a restart reads it back
                snap_dir = self._write_snapshot(fresh, through, mode, substrings,
                                                frozen.id_high, merges)
                # read back: checksums of what is on disk; with mmap the mapped copy is
                # published, else only the files are checked (not built into a second index:
                # an auto index would calibrate again)
                if self.mmap:
                    fresh, _ = load_main(self._config(), snap_dir, expected_mode=mode)
                else:
                    snapshot.verify(snap_dir, self.bits, mode, fresh.ntotal)
                largest_bucket(fresh)  # base_state's pass, done before the write lock
                with self._write_lock:
                    self.mode, self.substrings = mode, substrings
                    base = base_state(fresh, self.bits, self.state.version + 1,
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
            # the old state's main index is freed here, not after the cleanup's file deletions
            # (a 100M index: 4.6 GB held while its old snapshot's files are removed)
            del frozen, words, ids, fresh, base
            self._cleanup()
            return True

    def _write_snapshot(self, main, through: int, mode: str, substrings: int | None,
                        id_high: int, merges: int = 0) -> Path:
        return snapshot.write(self.directory, main, snapshot.SnapshotInfo(
            through, self.bits, mode, substrings, id_high, merges))

    def _cleanup(self) -> None:
        """Keep the snapshot just written and the one verified before it (the base recovery
        used, or the previous merge's: what a corrupt newest snapshot falls back to) and the
        segments after the older of them. Any other snapshot goes, also a newer one that was
        never verified (corrupt, skipped by recovery; or a merge's that failed its read-back):
        kept, it would count as the previous generation. Failures only leave files for the
        next cleanup."""
        try:
            snapshot.remove_generations(self.directory,
                                        (self._previous_snapshot, self._verified_snapshot))
        except OSError as exc:
            log.warning("index %s: cleanup after merge incomplete (%s); retried after the next "
                        "merge", self.directory.name, exc)

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
