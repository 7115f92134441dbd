"""Write-ahead log: length-prefixed, CRC32-checked records, fsynced before a write is acknowledged.

File layout (one segment file): an 8-byte magic ``b"BSWAL001"`` then records, each

    u32 little-endian payload length | u32 little-endian CRC32(payload) | payload

A payload is one operation:

    ADD:    b"A" | u32 n | u32 W | n x int64 LE ids | n x W x uint64 LE code words
    DELETE: b"D" | u32 n | n x int64 LE ids

Guarantees (tested in tests/test_wal.py and tests/test_faults.py):

- :meth:`WriteAheadLog.append` writes the record at the log's known end and fsyncs it before it
  returns: only then may the caller acknowledge the write. If the write or the fsync fails, the
  file is truncated back to that end and fsynced, so the log is exactly as it was and the
  record can never reappear; :class:`AppendFailed` says nothing was acknowledged. If even the
  truncate fails, the log fail-stops (PostgreSQL's rule after a failed fsync):
  :class:`LogFailed` until a later append manages the truncate.
- Recovery policy (etcd's): :func:`scan_segment` reads records up to the first one that does
  not parse. If no valid record follows it, the rest is a *torn tail* (a crash in the middle
  of a write); in the newest segment it is repaired by :func:`cut_torn_tail`, which keeps the
  cut bytes in ``<segment>.broken-<offset>``. A bad record followed by valid ones, or any
  damage in an older segment, is *corruption*: :class:`CorruptLogError` names the file and
  the offset, and only an explicit :func:`salvage` (``bucketsearch repair``) goes past it.
- A segment rotation writes the next segment's magic to a temporary file, fsyncs, renames it
  and fsyncs the directory before any record goes there; if any step fails, appends stay on
  the current segment.

Segments are numbered (``wal-00000007.log``); a snapshot records the last segment it contains
and recovery replays the later ones in order (see :mod:`bucketsearch.index.storage.live`).
"""
from __future__ import annotations

import errno
import os
import resource
import struct
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bucketsearch.index.disk import fsio
from bucketsearch.index.errors import AppendFailed, CorruptLogError, LogFailed  # noqa: F401
from bucketsearch.index.storage import layout
from bucketsearch.index.storage.layout import segment_name

MAGIC = b"BSWAL001"
HEADER = struct.Struct("<II")  # payload length, crc32(payload)
OP_ADD = b"A"
OP_DELETE = b"D"
OP_UPSERT = b"U"  # laid out as an add; applied as a delete of the ids, then their add
_WITH_WORDS = {"add": OP_ADD, "upsert": OP_UPSERT}
_KIND_OF = {tag: kind for kind, tag in _WITH_WORDS.items()}
#: Upper bound of one record's payload; a larger length field means a corrupt header.
MAX_RECORD_BYTES = 1 << 31


@dataclass(frozen=True)
class Op:
    """One logged operation: ``kind`` is ``"add"`` (ids + words), ``"delete"`` (ids) or
    ``"upsert"`` (ids + words: the ids deleted if live, then added, in one record)."""

    kind: str
    ids: np.ndarray  # (n,) int64
    words: np.ndarray | None = None  # (n, W) uint64 for "add" and "upsert"


def encode(op: Op) -> bytes:
    ids = np.ascontiguousarray(op.ids, dtype="<i8")
    if op.kind in _WITH_WORDS:
        words = np.ascontiguousarray(op.words, dtype="<u8")
        if words.ndim != 2 or len(words) != len(ids):
            raise ValueError(f"{op.kind}: words shape {words.shape} does not match "
                             f"{len(ids)} ids")
        return (_WITH_WORDS[op.kind] + struct.pack("<II", len(ids), words.shape[1])
                + ids.tobytes() + words.tobytes())
    if op.kind == "delete":
        return OP_DELETE + struct.pack("<I", len(ids)) + ids.tobytes()
    raise ValueError(f"unknown op kind {op.kind!r}, allowed: 'add', 'delete', 'upsert'")


def record(op: Op) -> bytes:
    """The framed record of ``op``: header (length, CRC32) + payload."""
    payload = encode(op)
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _payload_length(data, start: int, length: int) -> bool:
    """Whether a payload of ``length`` bytes at ``start`` has the length its counts imply."""
    kind = data[start:start + 1]
    if kind in _KIND_OF and length >= 9:
        n, w = struct.unpack_from("<II", data, start + 1)
        return length == 9 + 8 * n + 8 * n * w
    if kind == OP_DELETE and length >= 5:
        (n,) = struct.unpack_from("<I", data, start + 1)
        return length == 5 + 8 * n
    return False


def decode(payload: bytes) -> Op:
    if not _payload_length(payload, 0, len(payload)):
        raise ValueError(f"record type {payload[:1]!r} with a length that does not match")
    if payload[:1] in _KIND_OF:
        n, w = struct.unpack_from("<II", payload, 1)
        ids = np.frombuffer(payload, dtype="<i8", count=n, offset=9).astype(np.int64)
        words = np.frombuffer(payload, dtype="<u8", count=n * w, offset=9 + 8 * n)
        return Op(_KIND_OF[payload[:1]], ids, words.astype(np.uint64).reshape(n, w))
    (n,) = struct.unpack_from("<I", payload, 1)
    return Op("delete", np.frombuffer(payload, dtype="<i8", count=n, offset=5).astype(np.int64))


def _record_at(data, pos: int) -> int:
    """End offset of a valid record starting at ``pos``, or -1."""
    if pos + HEADER.size > len(data):
        return -1
    length, crc = HEADER.unpack_from(data, pos)
    start, end = pos + HEADER.size, pos + HEADER.size + length
    if length > MAX_RECORD_BYTES or end > len(data) or not _payload_length(data, start, length):
        return -1
    return end if zlib.crc32(data[start:end]) == crc else -1


def _next_record(data, pos: int) -> int:
    """Offset of the first valid record after a bad one at ``pos``, or -1.

    When the bad record's header is plausible (its extent fits the file), the search starts
    after that extent: its payload is user data and may hold anything, including bytes that
    look like records. Candidates are found by their type byte (``find``), then checked."""
    start = pos + 1
    if pos + HEADER.size <= len(data):
        length, _ = HEADER.unpack_from(data, pos)
        if length <= MAX_RECORD_BYTES and pos + HEADER.size + length <= len(data):
            start = pos + HEADER.size + length
    if not data[start:].strip(b"\x00"):  # zeros: a file extended but never written (a torn tail)
        return -1
    cand = len(data)
    for kind in (OP_ADD, OP_DELETE, OP_UPSERT):
        at = data.find(kind, start + HEADER.size)
        while at != -1:
            if _record_at(data, at - HEADER.size) != -1:
                cand = min(cand, at - HEADER.size)
                break
            at = data.find(kind, at + 1)
    return cand if cand < len(data) else -1


@dataclass
class Damage:
    """Where a segment stops parsing: ``torn`` (nothing valid follows) or ``corrupt`` (valid
    records follow from ``resume``)."""

    offset: int
    kind: str
    detail: str
    resume: int = -1


@dataclass
class SegmentScan:
    path: Path
    ops: list[Op] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # offset just after each record of ops
    valid_bytes: int = 0  # offset just after the last valid record before any damage
    file_bytes: int = 0
    damage: Damage | None = None
    data: bytes = b""

    @property
    def torn_bytes(self) -> int:
        return self.file_bytes - self.valid_bytes if self.damage else 0


def scan_segment(path) -> SegmentScan:
    """Read one segment's valid records and classify what stops them (read-only)."""
    path = Path(path)
    data = fsio.read_bytes(path)
    scan = SegmentScan(path, file_bytes=len(data), data=data)
    if data[:len(MAGIC)] != MAGIC:
        if MAGIC.startswith(data) or not data.strip(b"\x00"):  # created, never fully written
            scan.damage = Damage(0, "torn", "incomplete segment header")
        else:
            scan.damage = Damage(0, "corrupt", "not a bucketsearch WAL segment (bad magic)")
        return scan
    pos = len(MAGIC)
    while pos < len(data):
        end = _record_at(data, pos)
        if end == -1:
            break
        scan.ops.append(decode(data[pos + HEADER.size:end]))
        scan.ends.append(end)
        pos = end
    scan.valid_bytes = pos
    if pos < len(data):
        nxt = _next_record(data, pos)
        if nxt == -1:
            scan.damage = Damage(pos, "torn", f"{len(data) - pos} bytes of an unfinished record")
        else:
            scan.damage = Damage(pos, "corrupt", f"damaged record ({nxt - pos} bytes) followed "
                                 "by valid records", resume=nxt)
    return scan


def replay(path) -> SegmentScan:
    """The valid records of one segment, refusing corruption (a torn tail is reported only)."""
    scan = scan_segment(path)
    if scan.damage is not None and scan.damage.kind == "corrupt":
        raise CorruptLogError(path, scan.damage.offset, scan.damage.detail)
    return scan


def cut_torn_tail(scan: SegmentScan) -> Path | None:
    """Repair a torn tail: keep the cut bytes in ``<segment>.broken-<offset>``, then truncate
    the segment to its last valid record (or rewrite the magic) and fsync."""
    path, cut = scan.path, scan.data[scan.valid_bytes:]
    broken = None
    if cut:
        broken = layout.broken_tail(path, scan.valid_bytes)
        fsio.write_file(broken, cut)
    if scan.valid_bytes < len(MAGIC):
        fsio.replace_file(path, MAGIC)
    else:
        fd = fsio.open_fd(path, os.O_WRONLY)
        try:
            fsio.ftruncate(fd, scan.valid_bytes, path)
            fsio.fsync_fd(fd, path)
        finally:
            fsio.close(fd)
    fsio.fsync_path(path.parent)
    return broken


@dataclass
class Salvage:
    """What :func:`salvage` kept and lost of one segment."""

    ops: list[Op]
    lost: list[tuple[int, int]]  # byte ranges [start, end) skipped


def salvage(data: bytes) -> Salvage:
    """Every intact record of a damaged segment, skipping damaged byte ranges."""
    out = Salvage([], [])
    pos = len(MAGIC) if data[:len(MAGIC)] == MAGIC else 0
    if pos == 0 and data:
        nxt = _next_record(data, 0) if _record_at(data, 0) == -1 else 0
        if nxt != 0:
            out.lost.append((0, len(data) if nxt == -1 else nxt))
            pos = len(data) if nxt == -1 else nxt
    while pos < len(data):
        end = _record_at(data, pos)
        if end != -1:
            out.ops.append(decode(data[pos + HEADER.size:end]))
            pos = end
            continue
        nxt = _next_record(data, pos)
        out.lost.append((pos, len(data) if nxt == -1 else nxt))
        pos = len(data) if nxt == -1 else nxt
    return out


def list_segments(directory) -> list[tuple[int, Path]]:
    """``(sequence, path)`` of every WAL segment in ``directory``, in order."""
    found = []
    for entry in Path(directory).iterdir():
        seq = layout.segment_seq(entry.name)
        if seq is not None:
            found.append((seq, entry))
    return sorted(found)


def create_segment(directory, seq: int) -> Path:
    """Create an empty segment durably: magic to a temp file, fsync, rename, fsync the dir.
    On failure nothing is left but possibly a ``.tmp`` file (ignored by :func:`list_segments`)."""
    directory = Path(directory)
    path = directory / segment_name(seq)
    tmp = directory / layout.segment_tmp(seq)
    try:
        fsio.write_file(tmp, MAGIC)
        fsio.rename(tmp, path)
        fsio.fsync_path(directory)
    except OSError:
        for leftover in (tmp, path):
            try:
                fsio.unlink(leftover)
            except OSError:
                pass  # an empty segment left behind is harmless: it holds no record
        raise
    return path


class _OpenLogs:
    """The write-ahead logs that keep their segment open, least recently used first, at most
    ``limit`` of them (fewer under a low file-descriptor limit: an eighth of RLIMIT_NOFILE):
    a busy index pays no open() per append, and thousands of indexes hold a bounded number of
    descriptors. Eviction closes a log's descriptor only if that log is not appending (its
    lock is free), so no append ever loses its file."""

    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._logs: OrderedDict[int, WriteAheadLog] = OrderedDict()

    def touch(self, log: WriteAheadLog) -> None:
        limit = min(self.limit, max(resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 8, 1))
        with self._lock:
            self._logs[id(log)] = log
            self._logs.move_to_end(id(log))
            victims = [v for v in self._logs.values() if v is not log][:max(
                len(self._logs) - limit, 0)]
        for victim in victims:
            if victim._lock.acquire(blocking=False):
                try:
                    victim._close_fd()
                finally:
                    victim._lock.release()

    def forget(self, log: WriteAheadLog) -> None:
        with self._lock:
            self._logs.pop(id(log), None)


#: Open segment descriptors kept across appends, process-wide.
OPEN_LOGS = _OpenLogs(limit=64)


class WriteAheadLog:
    """Appender of one segment; thread-safe. The segment stays open between appends while the
    log is among the :data:`OPEN_LOGS` most recently used (at most 64), so thousands of indexes
    cost a bounded number of file descriptors. ``failed`` is the reason of a fail-stop, else None."""

    def __init__(self, directory, seq: int, size: int | None = None):
        self.directory = Path(directory)
        self.seq = seq
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.failed: str | None = None
        path = self.path
        if not path.exists():
            create_segment(self.directory, seq)
        self.size = path.stat().st_size if size is None else size

    @property
    def path(self) -> Path:
        return self.directory / segment_name(self.seq)

    def _close_fd(self) -> None:
        """Close the kept descriptor (lock held by the caller)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            OPEN_LOGS.forget(self)
            fsio.close(fd)

    def append(self, op: Op) -> None:
        """Write one record and fsync it; only then may the caller acknowledge the write.
        Raises :class:`AppendFailed` (log unchanged) or :class:`LogFailed` (fail-stop)."""
        data = record(op)
        with self._lock:
            path = self.path
            if self._fd is None:
                try:
                    self._fd = fsio.open_fd(path, os.O_WRONLY)
                except OSError as exc:
                    raise AppendFailed(exc.errno or errno.EIO, f"cannot open the write-ahead "
                                       f"log ({exc.strerror}); nothing was acknowledged") from exc
            fd = self._fd
            try:
                if self.failed is not None:
                    self._restore(fd)  # the fault may have cleared: try the undo again
                    self.failed = None
                fsio.pwrite_all(fd, data, self.size, path)
                fsio.fsync_fd(fd, path)
            except OSError as exc:
                if self.failed is None:
                    try:
                        self._restore(fd)
                    except OSError as undo:
                        self.failed = (f"a write failed ({exc.strerror}) and the log could not "
                                       f"be truncated back ({undo.strerror})")
                self._close_fd()  # after a failed write or fsync, the next append reopens
                if self.failed is not None:
                    raise LogFailed(exc.errno or errno.EIO, f"write-ahead log unusable: "
                                    f"{self.failed}; the index refuses writes until the disk "
                                    "recovers; nothing was acknowledged") from exc
                raise AppendFailed(exc.errno or errno.EIO, f"storage error ({exc.strerror}); "
                                   "the log was restored, nothing was acknowledged") from exc
            except BaseException:  # a simulated crash: the process is gone, so is its fd
                self._close_fd()
                raise
            self.size += len(data)
        OPEN_LOGS.touch(self)

    def _restore(self, fd: int) -> None:
        fsio.ftruncate(fd, self.size, self.path)
        fsio.fsync_fd(fd, self.path)

    def rotate(self) -> int:
        """Start the next segment; returns the closed sequence. On failure (raised) appends stay
        on the current segment."""
        with self._lock:
            if self.failed is not None:
                raise LogFailed(errno.EIO, f"write-ahead log unusable: {self.failed}")
            create_segment(self.directory, self.seq + 1)
            self._close_fd()
            closed, self.seq, self.size = self.seq, self.seq + 1, len(MAGIC)
            return closed

    def close(self) -> None:
        """Close the kept descriptor. A fail-stopped log tries its undo once more, so that the
        write that failed is not replayed by the next open (best effort: if the undo fails
        again, or the process dies first, that record may be found complete)."""
        with self._lock:
            self._close_fd()
            if self.failed is None:
                return
            try:
                fd = fsio.open_fd(self.path, os.O_WRONLY)
                try:
                    self._restore(fd)
                finally:
                    fsio.close(fd)
            except OSError:
                return
            self.failed = None
