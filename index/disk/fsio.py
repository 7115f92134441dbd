"""Every storage call of the index goes through here, so faults can be injected beneath it.

The functions are thin wrappers of :mod:`os` (open, write, fsync, truncate, rename, unlink,
mkdir, rmtree). Each first calls the installed fault hook (none in production: one attribute
read), which may raise an :class:`OSError` (ENOSPC, EIO, EMFILE, ...), make a write short, or
stop the "process" there with :class:`SimulatedCrash`. :func:`inject` installs a
:class:`FaultPlan` for a test: "the n-th call of these operations fails with this errno".

Writes use ``os.pwrite`` at an explicit offset and loop over short writes; a file is never
written through a Python buffer, so what a crash leaves on disk is exactly what was written.
"""
from __future__ import annotations

import contextlib
import errno as errno_mod
import io
import mmap
import os
import shutil
import signal
import threading
import weakref
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bucketsearch.index.disk.hugepages import collapse


class SimulatedCrash(BaseException):
    """The process "died" at a storage call (raised by a plan with ``crash=True``); tests then
    abandon every object without closing it and recover from what is on disk."""


@dataclass
class FaultPlan:
    """Fail the ``at``-th call (1-based) of ``ops`` (all operations if empty), and every later
    one when ``sticky``. ``short`` makes a failing write put half its bytes on disk first;
    ``crash`` raises :class:`SimulatedCrash` instead of an OSError (after the half write when
    ``short``); ``kill`` sends SIGKILL to this process instead (a real crash)."""

    at: int
    ops: tuple[str, ...] = ()
    errno: int = errno_mod.ENOSPC
    short: bool = False
    crash: bool = False
    kill: bool = False
    sticky: bool = False
    path_contains: str = ""
    calls: int = 0
    fired: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, op: str, path) -> str | None:
        """``None`` to go on, ``"short"`` for a short write that then fails."""
        if (self.ops and op not in self.ops) or self.path_contains not in str(path):
            return None
        with self._lock:
            self.calls += 1
            hit = self.calls == self.at or (self.sticky and self.calls > self.at)
            if hit:
                self.fired.append((op, str(path)))
        if not hit:
            return None
        if op == "write" and self.short:
            return "short"
        self.fail(op, path)
        return None

    def fail(self, op: str, path) -> None:
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.crash:
            raise SimulatedCrash(f"simulated crash at {op} #{self.calls} ({path})")
        raise OSError(self.errno, f"injected fault on {op}: {os.strerror(self.errno)}",
                      str(path))


_hook: FaultPlan | None = None


@contextlib.contextmanager
def inject(plan: FaultPlan):
    """Install ``plan`` beneath every storage call for the duration of the block."""
    global _hook
    previous, _hook = _hook, plan
    try:
        yield plan
    finally:
        _hook = previous


def _check(op: str, path) -> str | None:
    hook = _hook
    return hook(op, path) if hook is not None else None


# ------------------------------------------------------------------------------- file descriptors
def open_fd(path, flags: int, mode: int = 0o644) -> int:
    _check("open", path)
    return os.open(path, flags | getattr(os, "O_CLOEXEC", 0), mode)


def pwrite_all(fd: int, data, offset: int, path="") -> None:
    """Write all of ``data`` at ``offset``, looping over short writes."""
    view = memoryview(data).cast("B")
    if _check("write", path) == "short":
        os.pwrite(fd, view[: len(view) // 2], offset)
        _hook.fail("write", path)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def fsync_fd(fd: int, path="") -> None:
    _check("fsync", path)
    os.fsync(fd)


def ftruncate(fd: int, size: int, path="") -> None:
    _check("truncate", path)
    os.ftruncate(fd, size)


def close(fd: int) -> None:
    os.close(fd)


# ------------------------------------------------------------------------------------ paths
def fsync_path(path) -> None:
    """fsync a file or a directory (a directory: so created, renamed or deleted entries last)."""
    fd = open_fd(path, os.O_RDONLY)
    try:
        fsync_fd(fd, path)
    finally:
        os.close(fd)


def read_bytes(path) -> bytes:
    _check("read", path)
    return Path(path).read_bytes()


def open_read(path):
    """A binary file object for reading ``path`` in chunks (fault point ``"read"``)."""
    _check("read", path)
    return open(path, "rb")


#: files from this size up are read into a mapping of their own (:func:`_anonymous_bytes`)
ANONYMOUS_MIN_BYTES = 1 << 20


def _anonymous_bytes(size: int) -> np.ndarray:
    """``size`` zeroed bytes of a private anonymous mapping whose pages the kernel makes in
    one call (``MAP_POPULATE``), not one fault at a time; the array owns the mapping.

    Not ``np.empty``: numpy asks for transparent huge pages on large arrays
    (``madvise(MADV_HUGEPAGE)``), and on a virtual machine whose free memory goes back to the
    host a fresh 2 MiB page costs the host's faults too. Measured here at 20M items (a 743 MB
    snapshot, bench/RESULTS.md section 38): 1.7-2.0 s into ``np.empty``, 0.46 s into this.
    Searches over 4 KiB pages take more TLB misses: :func:`collapse_to_huge_pages` makes huge
    pages of the mapping later, off the restart's path."""
    if size < ANONYMOUS_MIN_BYTES:
        return np.empty(size, dtype=np.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    mapping = mmap.mmap(-1, size, flags=flags)
    with _UNCOLLAPSED_LOCK:
        _UNCOLLAPSED.add(mapping)
    return np.frombuffer(mapping, dtype=np.uint8)


#: the mappings :func:`_anonymous_bytes` made that :func:`collapse_to_huge_pages` has not
#: reached yet (weak: a mapping freed with its arrays leaves the set)
_UNCOLLAPSED: weakref.WeakSet = weakref.WeakSet()
_UNCOLLAPSED_LOCK = threading.Lock()


def collapse_to_huge_pages(keep_going=lambda: True, step: int = 8 << 20) -> int:
    """Back every mapping :func:`read_with_crc32` made, and that has not been collapsed yet,
    with transparent huge pages now (:func:`bucketsearch.index.disk.hugepages.collapse`,
    ``step`` bytes a call, while ``keep_going()``; searches may read the memory meanwhile).
    Returns the bytes collapsed.

    For a thread started after the index serves: it costs about what numpy's huge-page faults
    cost a load (bench/RESULTS.md section 38), off the restart's path, and gives searches back
    the TLB reach of huge pages. A refused step leaves its pages in 4 KiB pages, quietly;
    each mapping is tried once."""
    done = 0
    while True:
        with _UNCOLLAPSED_LOCK:
            try:
                mapping = _UNCOLLAPSED.pop()  # one at a time: no list keeping the others alive
            except KeyError:
                return done
        done += collapse(np.frombuffer(mapping, dtype=np.uint8).ctypes.data, len(mapping),
                         step, keep_going)
        if not keep_going():
            return done
        del mapping  # its arrays may be freed now (a merge replaced them)


def read_with_crc32(path, chunk: int = 1 << 22) -> tuple[np.ndarray, int]:
    """The bytes of ``path`` as one new ``uint8`` array and their CRC32, in one pass: each
    chunk is checksummed just after it is read, while it is in the cache, so checking a file
    costs no second read of it (fault point ``"read"``). A file that shrinks while it is read
    gives the bytes read."""
    with open_read(path) as f:
        raw = _anonymous_bytes(os.fstat(f.fileno()).st_size)
        view = memoryview(raw)
        crc, size = 0, 0
        while size < len(raw):
            n = f.readinto(view[size:size + chunk])
            if not n:
                break
            crc = zlib.crc32(view[size:size + n], crc)
            size += n
    return raw[:size], crc


def write_file(path, data: bytes) -> None:
    """Create or replace ``path`` with ``data``, fsynced (not atomic: see :func:`replace_file`)."""
    fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        pwrite_all(fd, data, 0, path)
        fsync_fd(fd, path)
    finally:
        os.close(fd)


def replace_file(path, data: bytes) -> None:
    """Atomically replace ``path``: write a temporary sibling, fsync, rename, fsync the dir."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write_file(tmp, data)
        rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)


def rename(src, dst) -> None:
    _check("rename", dst)
    os.replace(src, dst)


def unlink(path, missing_ok: bool = True) -> None:
    _check("unlink", path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


def mkdir(path, exist_ok: bool = False) -> None:
    _check("mkdir", path)
    Path(path).mkdir(exist_ok=exist_ok)


def rmtree(path) -> None:
    """Remove a directory tree (missing is fine)."""
    _check("unlink", path)
    shutil.rmtree(path, ignore_errors=False, onerror=_ignore_missing)


def _ignore_missing(func, path, exc_info):
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


# ------------------------------------------------------------------------------------- arrays
def write_npy(path, array: np.ndarray, chunk: int = 1 << 24) -> int:
    """Write ``array`` as a ``.npy`` file (format 1.0/2.0 header, C order), fsynced; returns the
    CRC32 of the file computed from the bytes written (no read back)."""
    array = np.ascontiguousarray(array)
    meta = np.lib.format.header_data_from_array_1_0(array)
    header = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(header, meta)
    except ValueError:  # a header too long for format 1.0 (very many dimensions or fields)
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, meta)
    head = header.getvalue()
    body = memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")
    fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        pwrite_all(fd, head, 0, path)
        crc = zlib.crc32(head)
        for start in range(0, len(body), chunk):
            part = body[start:start + chunk]
            pwrite_all(fd, part, len(head) + start, path)
            crc = zlib.crc32(part, crc)
        fsync_fd(fd, path)
    finally:
        os.close(fd)
    return crc

