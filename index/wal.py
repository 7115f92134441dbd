"""Write-ahead log: length-prefixed, CRC32-checked records, fsynced before a write is acknowledged.

File layout (one segment file): an 8-byte magic ``b"BSWAL001"`` then records, each

    u32 little-endian payload length | u32 little-endian CRC32(payload) | payload

A payload is one operation:

    ADD:    b"A" | u32 n | u32 W | n x int64 LE ids | n x W x uint64 LE code words
    DELETE: b"D" | u32 n | n x int64 LE ids

:func:`WriteAheadLog.append` writes the record, flushes and ``fsync``s before it returns, so an
acknowledged write survives a crash of the process or of the machine. :func:`replay` reads
records up to the last complete one whose CRC matches; anything after (a torn tail left by a
crash in the middle of a write, or garbage) is reported and, with ``truncate=True``, cut off so
the next append starts on a record boundary. A torn tail is never fatal.

Segments are numbered (``wal-00000007.log``); a snapshot records the last segment it contains and
recovery replays the later ones in order (see :mod:`index.live`).
"""
from __future__ import annotations

import os
import re
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"BSWAL001"
HEADER = struct.Struct("<II")  # payload length, crc32(payload)
OP_ADD = b"A"
OP_DELETE = b"D"
#: Upper bound of one record's payload; a larger length field means a corrupt header.
MAX_RECORD_BYTES = 1 << 31
_SEGMENT_RE = re.compile(r"^wal-(\d{8})\.log$")


@dataclass(frozen=True)
class Op:
    """One logged operation: ``kind`` is ``"add"`` (ids + words) or ``"delete"`` (ids)."""

    kind: str
    ids: np.ndarray  # (n,) int64
    words: np.ndarray | None = None  # (n, W) uint64 for "add"


def encode(op: Op) -> bytes:
    ids = np.ascontiguousarray(op.ids, dtype="<i8")
    if op.kind == "add":
        words = np.ascontiguousarray(op.words, dtype="<u8")
        if words.ndim != 2 or len(words) != len(ids):
            raise ValueError(f"add: words shape {words.shape} does not match {len(ids)} ids")
        return (OP_ADD + struct.pack("<II", len(ids), words.shape[1]) + ids.tobytes()
                + words.tobytes())
    if op.kind == "delete":
        return OP_DELETE + struct.pack("<I", len(ids)) + ids.tobytes()
    raise ValueError(f"unknown op kind {op.kind!r}, allowed: 'add', 'delete'")


def decode(payload: bytes) -> Op:
    kind = payload[:1]
    if kind == OP_ADD:
        n, w = struct.unpack_from("<II", payload, 1)
        if len(payload) != 9 + 8 * n + 8 * n * w:
            raise ValueError("add record length does not match its counts")
        ids = np.frombuffer(payload, dtype="<i8", count=n, offset=9).astype(np.int64)
        words = np.frombuffer(payload, dtype="<u8", count=n * w, offset=9 + 8 * n)
        return Op("add", ids, words.astype(np.uint64).reshape(n, w))
    if kind == OP_DELETE:
        (n,) = struct.unpack_from("<I", payload, 1)
        if len(payload) != 5 + 8 * n:
            raise ValueError("delete record length does not match its count")
        return Op("delete", np.frombuffer(payload, dtype="<i8", count=n, offset=5).astype(np.int64))
    raise ValueError(f"unknown record type {kind!r}")


@dataclass
class ReplayResult:
    ops: list[Op]
    valid_bytes: int  # offset just after the last valid record
    file_bytes: int  # size of the file as found
    torn_bytes: int  # bytes after the last valid record (0 when the file ended cleanly)


def replay(path: str | os.PathLike, truncate: bool = False) -> ReplayResult:
    """Read every valid record of one segment, stopping at the first torn or corrupt one.

    With ``truncate=True`` the file is cut back to the end of the last valid record (and
    fsynced), so appends continue on a record boundary.
    """
    path = Path(path)
    data = path.read_bytes()
    ops: list[Op] = []
    pos = len(MAGIC) if data[:len(MAGIC)] == MAGIC else 0
    if pos == 0 and data:
        valid = 0  # not even a header: the whole file is garbage
    else:
        valid = pos
        while pos + HEADER.size <= len(data):
            length, crc = HEADER.unpack_from(data, pos)
            start, end = pos + HEADER.size, pos + HEADER.size + length
            if length > MAX_RECORD_BYTES or end > len(data):
                break
            payload = data[start:end]
            if zlib.crc32(payload) != crc:
                break
            try:
                ops.append(decode(payload))
            except (ValueError, struct.error):
                break
            pos = valid = end
    torn = len(data) - valid
    if truncate and (torn or not data):
        with open(path, "r+b") as f:
            if valid < len(MAGIC):
                f.truncate(0)
                f.write(MAGIC)
                valid = len(MAGIC)
            else:
                f.truncate(valid)
            f.flush()
            os.fsync(f.fileno())
    return ReplayResult(ops, valid, len(data), torn)


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory so a created, renamed or deleted entry is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def segment_name(seq: int) -> str:
    return f"wal-{seq:08d}.log"


def list_segments(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(sequence, path)`` of every WAL segment in ``directory``, in order."""
    found = []
    for entry in Path(directory).iterdir():
        m = _SEGMENT_RE.match(entry.name)
        if m:
            found.append((int(m.group(1)), entry))
    return sorted(found)


class WriteAheadLog:
    """Appender of one open segment; thread-safe; every append is fsynced before it returns."""

    def __init__(self, directory: str | os.PathLike, seq: int):
        self.directory = Path(directory)
        self.seq = seq
        self._lock = threading.Lock()
        self._file = self._open(seq)

    def _open(self, seq: int):
        path = self.directory / segment_name(seq)
        new = not path.exists()
        f = open(path, "ab")
        if new or f.tell() == 0:
            f.write(MAGIC)
            f.flush()
            os.fsync(f.fileno())
            fsync_dir(self.directory)
        return f

    def append(self, op: Op) -> None:
        """Write one record and fsync it; only then may the caller acknowledge the write."""
        payload = encode(op)
        record = HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            self._file.write(record)
            self._file.flush()
            os.fsync(self._file.fileno())

    def rotate(self) -> int:
        """Close the current segment and start the next one; returns the closed sequence."""
        with self._lock:
            closed = self.seq
            self._file.close()
            self.seq += 1
            self._file = self._open(self.seq)
            return closed

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()
