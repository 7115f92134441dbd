"""The index registry: the indexes this server holds, by name, over
:mod:`bucketsearch.index.storage.catalog`.

Every index folder found at start-up is opened on its own: one that fails (corrupt files,
unreadable metadata, no file descriptors left) is listed under ``unavailable`` with its state
and reason, and every other index serves. Create is atomic: the configuration is validated by
the engine's own constructor before anything is written, the folder appears complete (rename)
and is removed again if the index cannot be opened; a restore fills the folder before that
rename. Names are unique regardless of case, and the number of indexes is capped
(``max_indexes``).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path


from bucketsearch import __version__
from bucketsearch.app.audit import ExactnessAudit
from bucketsearch.app.costfit import CostTracker
from bucketsearch.app.indexerrors import (IndexExists, IndexLimit, IndexNotFound,  # noqa: F401
                                         IndexUnavailable, NotOnShards, SnapshotNotFound,
                                         require_in_process)
from bucketsearch.app.redact import redact
from bucketsearch.index.factory import check_served_mode
from bucketsearch.index.disk import fsio
from bucketsearch.index.storage import backup, catalog, exports, layout
from bucketsearch.index.handle import (CorruptIndexError, CorruptLogError, FollowerStopped,
                                       IndexHandle)
from bucketsearch.index.storage.live import LiveIndex

log = logging.getLogger("bucketsearch.app")
RETRY_UNAVAILABLE_S = 10.0  # a read-only server tries an index it could not open again after
RESTORE_CHUNK = 1 << 20  # items per WAL record of a restore (a record is at most 2 GiB)


#: per index folder: the cost figures of its searches so far (CostTracker.history), written
#: every cost_history_interval_s while they change and when the server stops, and read back
#: when it starts, so a restart (or a kill, up to the interval) keeps them
COST_HISTORY = layout.COST_HISTORY


def read_cost_history(folder: Path, tracker: CostTracker) -> None:
    """Add the folder's saved cost history to ``tracker`` (none: nothing; unreadable: logged
    and left out, the index serves)."""
    path = folder / COST_HISTORY
    if not path.exists():
        return
    try:
        tracker.restore(json.loads(fsio.read_bytes(path)))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("index folder %s: cost history not read back (%s)", folder.name, exc)


def write_cost_history(folder: Path, history: dict) -> None:
    """Save a cost history (:meth:`CostTracker.history`) into the folder atomically (a failure
    is logged: the figures are a record, not data)."""
    if not folder.is_dir():  # the index was deleted
        return
    try:
        fsio.replace_file(folder / COST_HISTORY, json.dumps(history).encode())
    except OSError as exc:
        log.warning("index folder %s: cost history not saved (%s)", folder.name, exc)


@dataclass
class Entry:
    name: str
    bits: int
    live: IndexHandle  # a LiveIndex, or a sharded index
    cost: CostTracker
    folder: Path
    follow_error: str | None = None  # read-only server: why the last catch-up failed
    audit: ExactnessAudit | None = None  # the server's exactness audit (None: not audited)

    @property
    def mode(self) -> str:
        """The current mode (the newest snapshot's: a mode change writes one)."""
        return self.live.mode

    @property
    def substrings(self) -> int | None:
        return self.live.substrings

    @property
    def status(self) -> str:
        """``read_only`` after a storage fault the index could not undo, else ``ready``."""
        return "read_only" if self.live.failed else "ready"


@dataclass
class Unavailable:
    """An index folder that could not be opened: ``status`` is ``corrupt`` or ``unavailable``."""

    name: str
    folder: Path
    meta: dict | None
    status: str
    reason: str
    retry_at: float = 0.0  # read-only server: when following may try to open it again


class Registry:
    def __init__(self, settings):
        self.settings = settings
        self.root = Path(settings.data_dir) / layout.INDEXES
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.unavailable: dict[str, Unavailable] = {}
        self.data_lock = None if settings.read_only else catalog.DataDirLock(settings.data_dir)
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        self._history_saver: threading.Thread | None = None
        self._saved_counts: dict[str, tuple] = {}  # index name: its counts at its last save
        self.audit = ExactnessAudit.from_settings(settings)

    def redact(self, text: str | None) -> str | None:
        """``text`` without file paths (reasons are shown to clients)."""
        return redact(text, self.settings)

    def _open(self, folder: Path, meta: dict) -> Entry:
        """The entry of an index folder; in-process indexes are audited (app/audit.py)."""
        entry = self._open_live(folder, meta)
        if not entry.live.shards:
            entry.audit = self.audit
        return entry

    def _open_live(self, folder: Path, meta: dict) -> Entry:
        s = self.settings
        if meta.get("shards"):  # a sharded index (issue 14): shard actors on Ray
            from bucketsearch.index.cluster import shards
            if not s.shards or s.read_only:
                raise IndexUnavailable(f"index {meta['name']!r} is split over {meta['shards']} "
                                       "shards: serve it with 'bucketsearch serve --shards N' "
                                       "(one writable worker; read replicas: "
                                       "BUCKETSEARCH_SHARD_REPLICAS)")
            shards.ensure_ray(s.ray_address)
            live = shards.ShardedLive(folder, int(meta["bits"]), meta["mode"],
                                      meta.get("substrings"), int(meta["shards"]),
                                      meta.get("partitioning", "id_hash"),
                                      max_probes=s.max_probes, merge_threshold=s.merge_threshold,
                                      replicas=s.shard_replicas,
                                      follow_interval_s=s.follow_interval_s)
            return Entry(meta["name"], int(meta["bits"]), live, CostTracker(int(meta["bits"])),
                         folder)
        live = LiveIndex(folder, int(meta["bits"]), meta["mode"], meta.get("substrings"),
                         max_probes=s.max_probes, merge_threshold=s.merge_threshold,
                         read_only=s.read_only, mmap=s.mmap)
        tracker = CostTracker(int(meta["bits"]))
        if not s.read_only:  # read-only workers (--workers N) would each count it again
            read_cost_history(folder, tracker)
        return Entry(meta["name"], int(meta["bits"]), live, tracker, folder)

    def load_all(self) -> None:
        """Open every index folder; a failure is isolated to its index. A read-only server
        then follows the writer (:meth:`follow`)."""
        for found in catalog.read_folders(self.root, clean=not self.settings.read_only):
            self._load(found)
        if self.settings.read_only and self._follower is None:
            self._follower = threading.Thread(target=self._follow_loop, daemon=True,
                                              name="follow-writer")
            self._follower.start()
        if not self.settings.read_only and self._history_saver is None:
            self._history_saver = threading.Thread(target=self._save_history_loop, daemon=True,
                                                   name="save-cost-history")
            self._history_saver.start()

    def _save_history_loop(self) -> None:
        while not self._stop.wait(self.settings.cost_history_interval_s):
            self.save_cost_histories(changed_only=True)

    def save_cost_histories(self, changed_only: bool = False) -> None:
        """Write every in-process index's cost history (``changed_only``: of those searched
        since their last save)."""
        for entry in list(self.entries.values()):
            if entry.live.shards:
                continue
            history = entry.cost.history()
            counts = (history["queries"], history["knn_queries"], history["samples"])
            if changed_only and self._saved_counts.get(entry.name) == counts:
                continue
            write_cost_history(entry.folder, history)
            self._saved_counts[entry.name] = counts

    def _load(self, found: catalog.IndexFolder) -> None:
        """Open one folder found on disk, or list it as unavailable with the reason."""
        t = time.perf_counter()
        if self._taken(found.name) is not None:
            self.unavailable[found.name + f"@{found.folder.name}"] = Unavailable(
                found.name, found.folder, found.meta, "unavailable",
                f"another folder holds an index named {found.name!r}")
            return
        if found.meta is None:
            self._fail(found.name, found.folder, None, "unavailable", found.error)
            return
        try:
            entry = self._open(found.folder, found.meta)
        except (CorruptIndexError, CorruptLogError) as exc:
            self._fail(found.name, found.folder, found.meta, "corrupt",
                       f"{exc}; run 'bucketsearch repair --data-dir DIR --index "
                       f"{found.name}'")
            return
        except Exception as exc:  # noqa: BLE001 -- any failure stays with its index
            self._fail(found.name, found.folder, found.meta, "unavailable",
                       f"{type(exc).__name__}: {exc}")
            return
        self.entries[found.name] = entry
        log.info("index %s: loaded %d items (%s, %d bits) in %.2f s", found.name,
                 entry.live.ntotal, entry.mode, entry.bits, time.perf_counter() - t)

    def _follow_loop(self) -> None:
        interval = self.settings.follow_interval_s
        while not self._stop.wait(interval):
            try:
                self.follow()
            except Exception:  # noqa: BLE001 -- the next round tries again
                log.exception("following the writer failed")

    def follow(self) -> None:
        """Read-only server: catch up with the writer. Every open index applies the records
        committed since (or reloads after a merge); folders created since are opened, indexes
        whose folder is gone (deleted) are dropped, unavailable ones are tried again."""
        on_disk = {f.name: f for f in self.root.iterdir() if not f.name.startswith(".")}
        with self._lock:
            for name, entry in list(self.entries.items()):
                if entry.folder.name not in on_disk:
                    self.entries.pop(name).live.close()
                    continue
                try:
                    entry.live.catch_up()
                    entry.follow_error = None
                except FollowerStopped as exc:  # damage it must not skip: stop, as the writer
                    self.entries.pop(name).live.close()
                    self._fail(name, entry.folder, {"name": name, "bits": entry.bits,
                                                     "mode": entry.mode,
                                                     "substrings": entry.substrings}, "corrupt",
                               f"{exc}; run 'bucketsearch repair --data-dir DIR --index "
                               f"{name}' on the writer's data")
                    continue
                except (OSError, ValueError) as exc:
                    entry.follow_error = self.redact(f"{type(exc).__name__}: {exc}")
                    log.warning("index %s: catching up with the writer failed: %s", name,
                                entry.follow_error)
            now = time.monotonic()
            for key, bad in list(self.unavailable.items()):
                if bad.folder.name not in on_disk or now >= bad.retry_at:
                    del self.unavailable[key]  # gone, or tried again below
            known = {e.folder.name for e in self.entries.values()} | \
                {u.folder.name for u in self.unavailable.values()}
            for found in catalog.read_folders(self.root, clean=False):
                if found.folder.name not in known:
                    self._load(found)

    def _fail(self, name, folder, meta, state: str, reason: str) -> None:
        reason = self.redact(reason)
        log.error("index %s: %s: %s", name, state, reason)
        self.unavailable[name] = Unavailable(name, folder, meta, state, reason,
                                             retry_at=time.monotonic() + RETRY_UNAVAILABLE_S)

    def _taken(self, name: str) -> str | None:
        """The existing name equal to ``name`` regardless of case, or None."""
        low = name.lower()
        for other in (*self.entries, *(u.name for u in self.unavailable.values())):
            if other.lower() == low:
                return other
        return None

    def create(self, name: str, bits: int, mode: str, substrings: int | None,
               fill=None, partitioning: str = "id_hash") -> Entry:
        """Create an index, atomically; ``fill(folder)`` writes its files first (restore).
        A sharded server (``shards`` > 0) splits it over that many shards by
        ``partitioning`` (index/cluster/shards.py)."""
        catalog.check_name(name)
        sharding = {}
        if self.settings.shards and fill is None:
            from bucketsearch.index.cluster.partitioning import PARTITIONINGS, prefix_bits
            if partitioning not in PARTITIONINGS:
                raise ValueError(f"partitioning must be one of {PARTITIONINGS}, got "
                                 f"{partitioning!r}")
            p = prefix_bits(self.settings.shards) if partitioning == "code_prefix" else 0
            check_served_mode(mode, bits - p, substrings, self.settings.max_probes)
            sharding = {"shards": self.settings.shards, "partitioning": partitioning}
        else:
            check_served_mode(mode, bits, substrings, self.settings.max_probes)
        if self.settings.read_only:
            raise PermissionError("the server is read-only: indexes cannot be created")
        with self._lock:
            existing = self._taken(name)
            if existing is not None:
                raise IndexExists(name, existing)
            limit = self.settings.max_indexes
            if len(self.entries) + len(self.unavailable) >= limit:
                raise IndexLimit(f"name: the server holds {limit} indexes, the limit "
                                 "max_indexes (BUCKETSEARCH_MAX_INDEXES); delete one first")
            meta = {"name": name, "bits": bits, "mode": mode, "substrings": substrings,
                    **sharding}
            folder = catalog.create_folder(self.root, {**meta, "created_at": time.time()}, fill)
            try:
                entry = self._open(folder, meta)
            except Exception as exc:
                try:
                    catalog.remove_folder(self.root, folder)
                except OSError:  # the folder stays: show it, so that it can be deleted
                    self._fail(name, folder, meta, "unavailable",
                               f"created, but could not be opened: {type(exc).__name__}: {exc}")
                raise
            self.entries[name] = entry
            return entry

    def restore(self, name: str, data: bytes) -> Entry:
        """Create index ``name`` from a backup (:mod:`bucketsearch.index.storage.backup`),
        atomically: its
        items are logged and merged into a snapshot inside the hidden new folder, which is
        renamed into place only when complete."""
        meta, ids, words = exports.load(data)
        bits, mode, substrings = meta["bits"], meta["mode"], meta.get("substrings")
        s = self.settings

        def fill(folder: Path) -> None:
            live = LiveIndex(folder, bits, mode, substrings, max_probes=s.max_probes,
                             merge_threshold=s.merge_threshold, background_merge=False)
            try:
                for start in range(0, len(ids), RESTORE_CHUNK):
                    live.add(words[start:start + RESTORE_CHUNK], ids[start:start + RESTORE_CHUNK])
                live.merge()
            finally:
                live.close()

        return self.create(name, bits, mode, substrings, fill=fill)

    def backup(self, entry: Entry) -> bytes:
        """The backup file of ``entry``'s live items at one consistent state."""
        ids, words = entry.live.items()
        return backup.dump({**self._backup_meta(entry), "created_at": time.time()}, ids, words)

    def _backup_meta(self, entry: Entry) -> dict:
        return {"name": entry.name, "index": entry.name, "bits": entry.bits,
                "mode": entry.mode, "substrings": entry.substrings, "bucketsearch": __version__}

    def snapshot(self, entry: Entry) -> dict:
        """Write a snapshot tar of ``entry``'s live items at one state (every write acknowledged
        before the call is in it) into the index folder
        (:mod:`bucketsearch.index.storage.exports`)."""
        if self.settings.read_only:
            raise PermissionError("the server is read-only: snapshots are written by the "
                                  "writer (GET /v1/indexes/{name}/backup works here)")
        ids, words = entry.live.items()
        return exports.create(entry.folder, self._backup_meta(entry), ids, words)

    def snapshot_path(self, entry: Entry, snapshot: str) -> Path:
        """The file of one of ``entry``'s snapshots (:class:`SnapshotNotFound` if none)."""
        try:
            return exports.path_of(entry.folder, snapshot)
        except FileNotFoundError:
            raise self._no_snapshot(entry, snapshot) from None

    def open_snapshot(self, entry: Entry, snapshot: str):
        """One of ``entry``'s snapshots opened for reading (a delete after this does not cut
        the stream short); :class:`SnapshotNotFound` if none."""
        try:
            return fsio.open_read(self.snapshot_path(entry, snapshot))
        except FileNotFoundError:  # deleted since the check
            raise self._no_snapshot(entry, snapshot) from None

    @staticmethod
    def _no_snapshot(entry: Entry, snapshot: str) -> SnapshotNotFound:
        return SnapshotNotFound(f"index {entry.name!r} has no snapshot {snapshot!r} (GET "
                                f"/v1/indexes/{entry.name}/snapshots lists them)")

    def delete_snapshot(self, entry: Entry, snapshot: str) -> None:
        if self.settings.read_only:
            raise PermissionError("the server is read-only: snapshots cannot be deleted")
        self.snapshot_path(entry, snapshot)  # 404 when there is none
        exports.delete(entry.folder, snapshot)

    def set_mode(self, entry: Entry, mode: str, substrings: int | None) -> bool:
        """Rebuild ``entry`` in another mode in place (:meth:`LiveIndex.set_mode`)."""
        check_served_mode(mode, entry.bits, substrings, self.settings.max_probes)
        return entry.live.set_mode(mode, substrings)

    def get(self, name: str) -> Entry:
        entry = self.entries.get(name)
        if entry is None:
            bad = self.unavailable.get(name)
            if bad is not None:
                raise IndexUnavailable(f"index {name!r} is {bad.status}: {bad.reason}")
            raise IndexNotFound(name)
        return entry

    def delete(self, name: str) -> None:
        if self.settings.read_only:
            raise PermissionError("the server is read-only: indexes cannot be deleted")
        with self._lock:
            entry = self.entries.get(name) or self.unavailable.get(name)
            if entry is None:
                raise IndexNotFound(name)
            if isinstance(entry, Entry):
                entry.live.close()
            try:
                catalog.remove_folder(self.root, entry.folder)
            except OSError:
                if isinstance(entry, Entry) and entry.folder.exists():
                    self._reopen(entry)  # not renamed away: the index stays, writable again
                else:
                    self.entries.pop(name, None)
                raise
            self.entries.pop(name, None)
            self.unavailable.pop(name, None)

    def _reopen(self, entry: Entry) -> None:
        """Open ``entry``'s folder again after a delete that failed before its rename."""
        meta = {"name": entry.name, "bits": entry.bits, "mode": entry.mode,
                "substrings": entry.substrings}
        if entry.live.shards:
            meta.update(shards=entry.live.shards, partitioning=entry.live.partitioning)
        try:
            self.entries[entry.name] = self._open(entry.folder, meta)
        except Exception as exc:  # noqa: BLE001 -- it stays listed, with the reason
            self.entries.pop(entry.name, None)
            self._fail(entry.name, entry.folder, meta, "unavailable",
                       f"a delete failed and the index could not be opened again: "
                       f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._stop.set()
        for thread in (self._follower, self._history_saver):
            if thread is not None:
                thread.join()
        self.audit.close()
        for entry in list(self.entries.values()):
            entry.live.close()
        if not self.settings.read_only:
            self.save_cost_histories()
        if self.data_lock is not None:
            self.data_lock.release()

    def states(self) -> dict[str, dict]:
        """Every index's ``{"state", "reason", "merge"}`` (merge: none, pending or running;
        absent for an index that is unavailable)."""
        out = {name: {"state": e.status, "reason": self.redact(e.live.failed),
                      "merge": e.live.merge_status}
               for name, e in list(self.entries.items())}
        out.update({u.name: {"state": u.status, "reason": u.reason}
                    for u in list(self.unavailable.values())})
        return out

    def info_all(self) -> list[dict]:
        return [self.info(e) for e in list(self.entries.values())] + \
            [self.info_unavailable(u) for u in list(self.unavailable.values())]

    @staticmethod
    def info_unavailable(bad: Unavailable) -> dict:
        meta = bad.meta or {}
        return {"name": bad.name, "bits": meta.get("bits"), "mode": meta.get("mode"),
                "substrings": meta.get("substrings"), "state": bad.status, "reason": bad.reason}

    def info(self, entry: Entry) -> dict:
        """The IndexInfo of ``entry``: its handle's info with the name, bits, state and
        reasons (paths redacted)."""
        live = entry.live
        info = live.info()
        return {"name": entry.name, "bits": entry.bits, **info, "state": entry.status,
                "reason": self.redact(live.failed),
                "last_merge_error": self.redact(info.get("last_merge_error")),
                "follow_error": entry.follow_error}
