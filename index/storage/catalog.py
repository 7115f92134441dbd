"""The data directory on disk: one folder per index incarnation, and the one-writer lock.

Layout::

    <data_dir>/LOCK                      flock'ed by the one writing process (holder inside)
    <data_dir>/indexes/<name>.<id>/      one index incarnation: index.json + LiveIndex files

A folder is created complete or not at all: ``index.json`` is written into a hidden temporary
folder, fsynced, and the folder is renamed into place. Deleting renames the folder away first.
The incarnation id makes a re-created name a different folder, so a merge still running on a
deleted index can never touch the new one's files. Names are unique regardless of case.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bucketsearch.index.disk import fsio
from bucketsearch.index.storage import layout
from bucketsearch.index.storage.layout import INDEX_META as META
from bucketsearch.index.storage.layout import LOCK
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
_NAME_RE = re.compile(NAME_PATTERN)


def check_name(name) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"name: {name!r} is not a valid index name (allowed: 1-64 characters "
                         "of A-Z, a-z, 0-9, '_' and '-')")
    return name


class DataDirLocked(RuntimeError):
    """Another process writes to this data directory."""


class DataDirLock:
    """An exclusive ``flock`` on ``<data_dir>/LOCK`` for the life of the writing process; the
    file names the holder (pid, host, start time) for the error the next process gets."""

    def __init__(self, data_dir):
        self.path = Path(data_dir) / LOCK
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLocked(
                f"data directory {Path(data_dir).name!r} is locked by another bucketsearch "
                f"process ({holder}); one writer per data directory: stop it, or start this "
                "one read-only (BUCKETSEARCH_READ_ONLY=1)") from None
        info = (f"pid {os.getpid()} on {socket.gethostname()} since "
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


@dataclass
class IndexFolder:
    """One index folder as found on disk; ``error`` when its metadata cannot be read."""

    folder: Path
    name: str
    meta: dict | None
    error: str | None = None


def read_folders(root: Path, clean: bool = True) -> list[IndexFolder]:
    """Every index folder under ``root``. Hidden folders (an unfinished create or delete) are
    skipped, and removed when ``clean`` (the writing process only: a read-only process must
    not remove a folder the writer is still creating)."""
    found = []
    for folder in sorted(root.iterdir()):
        if folder.name.startswith("."):
            if clean:
                shutil.rmtree(folder, ignore_errors=True)
            continue
        if not folder.is_dir():
            continue
        name = folder.name.split(".", 1)[0]
        try:
            meta = json.loads(fsio.read_bytes(folder / META))
            name = check_name(meta["name"])
            int(meta["bits"]), str(meta["mode"])
            found.append(IndexFolder(folder, name, meta))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            found.append(IndexFolder(folder, name, None, f"unreadable {META}: {exc}"))
    return found


def create_folder(root: Path, meta: dict, fill=None) -> Path:
    """Create ``<name>.<id>/index.json`` atomically; returns the folder. ``fill(tmp)`` writes
    the index's files (a restore) into the hidden folder before it is renamed into place."""
    tmp = root / f"{layout.CREATING}{uuid.uuid4().hex}"
    final = root / f"{meta['name']}.{uuid.uuid4().hex[:12]}"
    fsio.mkdir(tmp)
    try:
        fsio.write_file(tmp / META, json.dumps(meta, indent=1).encode())
        if fill is not None:
            fill(tmp)
        fsio.fsync_path(tmp)
        fsio.rename(tmp, final)
        fsio.fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        raise
    return final


def remove_folder(root: Path, folder: Path) -> None:
    """Rename the folder away (durably), then delete it; a crash in between leaves a hidden
    folder that :func:`read_folders` removes."""
    trash = root / f"{layout.DELETING}{uuid.uuid4().hex}"
    fsio.rename(folder, trash)
    fsio.fsync_path(root)
    shutil.rmtree(trash, ignore_errors=True)
