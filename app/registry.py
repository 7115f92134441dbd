"""The index registry: one folder per index under ``<data_dir>/indexes/<name>/``.

Each folder holds ``index.json`` (name, bits, mode, substrings; written atomically) and the
:class:`index.live.LiveIndex` files (snapshots and WAL segments). Names are validated against
``NAME_PATTERN`` before any path is built from them. A folder without ``index.json`` is an
unfinished create and is ignored at startup.
"""
from __future__ import annotations

import logging
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.costfit import CostTracker
from app.schemas import NAME_PATTERN
from index.live import LiveIndex, check_mode
from index.store import fsync_path, write_json_atomic

log = logging.getLogger(__name__)
META = "index.json"
_NAME_RE = re.compile(NAME_PATTERN)


class IndexNotFound(LookupError):
    def __init__(self, name: str):
        super().__init__(f"index {name!r} not found")


class IndexExists(LookupError):
    def __init__(self, name: str):
        super().__init__(f"name: index {name!r} already exists (delete it first or pick "
                         "another name)")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"name: {name!r} is not a valid index name (allowed: 1-64 characters "
                         "of A-Z, a-z, 0-9, '_' and '-')")
    return name


@dataclass
class Entry:
    name: str
    bits: int
    mode: str
    substrings: int | None
    live: LiveIndex
    cost: CostTracker


class Registry:
    def __init__(self, settings):
        self.settings = settings
        self.root = Path(settings.data_dir) / "indexes"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = {}

    def _open(self, name: str, bits: int, mode: str, substrings: int | None) -> Entry:
        s = self.settings
        live = LiveIndex(self.root / name, bits, mode, substrings, max_probes=s.max_probes,
                         merge_threshold=s.merge_threshold, read_only=s.read_only, mmap=s.mmap)
        return Entry(name, bits, mode, substrings, live, CostTracker(bits))

    def load_all(self) -> None:
        import json
        for trash in self.root.parent.glob(".deleted-*"):  # a delete interrupted by a crash
            shutil.rmtree(trash, ignore_errors=True)
        for folder in sorted(self.root.iterdir()):
            if not folder.is_dir() or not _NAME_RE.match(folder.name):
                continue
            meta_path = folder / META
            if not meta_path.is_file():
                log.warning("%s: no %s (an unfinished create); ignored", folder, META)
                continue
            meta = json.loads(meta_path.read_text())
            self.entries[folder.name] = self._open(folder.name, int(meta["bits"]), meta["mode"],
                                                   meta.get("substrings"))

    def create(self, name: str, bits: int, mode: str, substrings: int | None) -> Entry:
        check_name(name)
        check_mode(mode, bits, substrings)
        if self.settings.read_only:
            raise PermissionError("the server is read-only: indexes cannot be created")
        with self._lock:
            if name in self.entries:
                raise IndexExists(name)
            folder = self.root / name
            if folder.exists():  # leftover of an unfinished create
                shutil.rmtree(folder)
            folder.mkdir()
            write_json_atomic(folder / META, {"name": name, "bits": bits, "mode": mode,
                                              "substrings": substrings,
                                              "created_at": time.time()})
            fsync_path(self.root)
            entry = self._open(name, bits, mode, substrings)
            self.entries[name] = entry
            return entry

    def get(self, name: str) -> Entry:
        entry = self.entries.get(name)
        if entry is None:
            raise IndexNotFound(name)
        return entry

    def delete(self, name: str) -> None:
        if self.settings.read_only:
            raise PermissionError("the server is read-only: indexes cannot be deleted")
        with self._lock:
            entry = self.entries.pop(name, None)
            if entry is None:
                raise IndexNotFound(name)
            entry.live.close()
            trash = self.root.parent / f".deleted-{name}-{uuid.uuid4().hex}"
            (self.root / name).rename(trash)
            fsync_path(self.root)
        shutil.rmtree(trash, ignore_errors=True)

    def close(self) -> None:
        for entry in list(self.entries.values()):
            entry.live.close()

    def info(self, entry: Entry) -> dict:
        st = entry.live.state
        sizes = bucket_sizes(st.main)
        values, counts = np.unique(sizes, return_counts=True)
        distinct = int(len(sizes))
        return {
            "name": entry.name, "bits": entry.bits, "mode": entry.mode,
            "substrings": getattr(st.main, "substrings", entry.substrings)
            if entry.mode != "single" else None,
            "size": st.ntotal, "main_size": int(st.main.ntotal),
            "delta_size": int(len(st.delta_ids)), "tombstones": int(len(st.tombstones)),
            "distinct_codes": distinct, "code_space_fraction": distinct / 2.0 ** entry.bits,
            "bucket_size_histogram": [{"size": int(v), "buckets": int(c)}
                                      for v, c in zip(values, counts)],
            "memory_bytes": int(st.main.memory_bytes() + st.delta_words.nbytes
                                + st.delta_ids.nbytes),
            "merges": entry.live.merges, "merging": entry.live.merging,
            "last_merge_error": entry.live.last_merge_error,
        }


def bucket_sizes(main) -> np.ndarray:
    """Items per distinct full code of the main table (its buckets in single mode)."""
    if not main.ntotal:
        return np.empty(0, dtype=np.int64)
    table = getattr(main, "table", None)
    if table is not None:
        return np.asarray(table.bucket_sizes())
    words = np.asarray(main.words)  # sorted by (code, id): equal codes are adjacent
    change = np.flatnonzero(np.any(words[1:] != words[:-1], axis=1)) + 1
    return np.diff(np.concatenate([[0], change, [len(words)]]))
