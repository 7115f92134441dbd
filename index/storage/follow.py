"""Read replicas that follow the writer: the commit position, and reading the log up to it.

The writer keeps ``wal.committed`` in each index folder: three little-endian int64, the WAL
segment and byte offset just after the last record whose fsync succeeded, and the newest
snapshot it wrote (-1: none). It is rewritten in place (``pwrite``, no fsync: readers on the
same machine share the page cache) after every acknowledged write, after a merge and when the
writer opens the index. A record past that position may still be rolled back (a failed fsync
truncates it), so a follower applies records only up to it, and never shows a write that was
not acknowledged. Updating the file is best effort: if it fails, followers lag until the next
write updates it; the write itself is unaffected.
"""
from __future__ import annotations

import errno
import os
import struct
from pathlib import Path
from typing import NamedTuple

from bucketsearch.index.storage import fsio
from bucketsearch.index.storage.wal import MAGIC, Op, scan_segment, segment_name

COMMIT_FILE = "wal.committed"
_POSITION = struct.Struct("<qqq")


class Position(NamedTuple):
    """A point of the log: ``(segment, offset)``; ``snapshot``: the newest snapshot then."""

    segment: int
    offset: int
    snapshot: int = -1

    @property
    def lsn(self) -> str:
        """``segment/offset`` in hex, as PostgreSQL prints its LSNs."""
        return f"{self.segment:X}/{self.offset:X}"


def write_position(directory, pos: Position) -> None:
    """Publish the commit position (best effort: an OSError is swallowed, see above)."""
    path = Path(directory) / COMMIT_FILE
    try:
        fd = fsio.open_fd(path, os.O_WRONLY | os.O_CREAT)
        try:
            fsio.pwrite_all(fd, _POSITION.pack(*pos), 0, path)
        finally:
            fsio.close(fd)
    except OSError:
        pass


def read_position(directory) -> Position | None:
    """The writer's commit position, or None when no writer has published one."""
    try:
        data = fsio.read_bytes(Path(directory) / COMMIT_FILE)
    except FileNotFoundError:
        return None
    if len(data) != _POSITION.size:
        raise OSError(errno.EIO, f"{COMMIT_FILE}: {len(data)} bytes, expected {_POSITION.size}")
    return Position(*_POSITION.unpack(data))


def read_committed(directory, start: Position, end: Position) -> list[Op]:
    """The records from ``start`` (exclusive of what came before) up to ``end``, in order.
    Raises FileNotFoundError when a segment in between is gone (the writer cleaned it up after
    a merge: the follower reloads from the snapshot) and OSError when a record the writer
    committed does not read back whole."""
    ops: list[Op] = []
    seq, offset = start.segment, start.offset
    while (seq, offset) < (end.segment, end.offset):
        scan = scan_segment(Path(directory) / segment_name(seq))
        stop = end.offset if seq == end.segment else scan.valid_bytes
        ops.extend(op for op, last in zip(scan.ops, scan.ends) if offset < last <= stop)
        if seq == end.segment:
            if scan.valid_bytes < stop:
                raise OSError(errno.EIO, f"{segment_name(seq)}: committed up to byte {stop}, "
                              f"{scan.valid_bytes} bytes read back whole")
            break
        seq, offset = seq + 1, len(MAGIC)
    return ops
