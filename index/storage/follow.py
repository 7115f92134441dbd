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

from bucketsearch.index.disk import fsio
from bucketsearch.index.storage.layout import COMMIT_FILE, segment_name
from bucketsearch.index.storage.wal import MAGIC, CorruptLogError, Op, scan_segment

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

    Never skips: every byte the writer committed in that range must read back as whole
    records. A segment before ``end``'s was closed by a rotation, so it must parse to its
    last byte (the writer cuts a torn tail only in its newest segment, before appending
    again); ``end``'s segment must parse up to ``end.offset``. Any damage there raises
    :class:`~bucketsearch.index.storage.wal.CorruptLogError` (file and offset): the follower stops,
    as the
    writer refuses to open such a log (its records after the damage were acknowledged; applying
    them without the damaged one would show a later write without an earlier one). Raises
    FileNotFoundError when a segment in between is gone (the writer cleaned it up after a
    merge: the follower reloads from the snapshot)."""
    ops: list[Op] = []
    seq, offset = start.segment, start.offset
    while (seq, offset) < (end.segment, end.offset):
        scan = scan_segment(Path(directory) / segment_name(seq))
        last = seq == end.segment
        stop = end.offset if last else scan.file_bytes
        if scan.damage is not None and scan.damage.offset < stop:
            where = "before the commit position" if last else \
                "in a segment closed by a rotation"
            raise CorruptLogError(scan.path, scan.damage.offset,
                                  f"{scan.damage.detail} ({where}: committed records would be "
                                  "skipped)")
        if last and scan.valid_bytes < stop:
            raise CorruptLogError(scan.path, scan.valid_bytes,
                                  f"committed up to byte {stop}, the file ends at byte "
                                  f"{scan.file_bytes}")
        ops.extend(op for op, last_byte in zip(scan.ops, scan.ends) if offset < last_byte <= stop)
        if last:
            break
        seq, offset = seq + 1, len(MAGIC)
    return ops
