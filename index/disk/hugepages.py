"""Transparent huge pages for the index's arrays.

A search reads its items, entries and buckets at random; over 4 KiB pages nearly every read of
a large array also misses the TLB (10M items: 76 MiB of codes, 76 of ids, 114 of multi-index
entries). This machine's transparent huge pages are ``madvise`` only: numpy asks for them on the
large arrays it allocates (``madvise(MADV_HUGEPAGE)``), but an array a Numba kernel allocates
(the radix sort's output, a merge's) gets 4 KiB pages. An engine hands the arrays of each build
and merge to :func:`collapse_later`: one background thread makes their whole 2 MiB pages huge
pages (``madvise(MADV_COLLAPSE)``, Linux >= 6.1; a refusal leaves the pages as they are) while
the engine already serves. Measured at 10M uniform 64-bit codes (bench/RESULTS.md section 40):
the multi-index's range search over the same arrays with their codes and ids collapsed took
0.81x the time at radius 1, 0.83x at radius 2; on this virtual machine a collapse costs 2-4 ms
per MiB of fresh memory (a single table's 223 MiB: 0.5-0.9 s, against its 1.0 s build, hence
off the build's path), 0.05 ms for memory already in huge pages.
"""
from __future__ import annotations

import collections
import ctypes
import mmap
import os
import threading
import weakref
from pathlib import Path

import numpy as np

#: a transparent huge page (x86-64, arm64 with 4 KiB pages)
HUGE_PAGE = 2 << 20
#: ``madvise(MADV_COLLAPSE)``, Linux >= 6.1 (Python's ``mmap`` names it from 3.13 on)
MADV_COLLAPSE = getattr(mmap, "MADV_COLLAPSE", 25)
#: arrays below this many bytes are left alone (at most one whole huge page inside)
COLLAPSE_MIN_BYTES = 2 * HUGE_PAGE


def mappings() -> list[tuple[int, int, int]]:
    """``(start, end, bytes in huge pages)`` of each mapping of this process, from
    ``/proc/self/smaps`` (its ``AnonHugePages``); empty where it cannot be read."""
    out = []
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            start, end = (int(x, 16) for x in head[0].split("-"))
            out.append([start, end, 0])
        elif head and head[0] == "AnonHugePages:" and out:
            out[-1][2] = int(head[1]) << 10
    return [tuple(m) for m in out]


def huge_page_bytes(arrays) -> int:
    """Bytes of ``arrays`` the process holds in huge pages, by :func:`mappings` (which counts
    them per mapping: each mapping's count is capped at the arrays' bytes in it, so this is an
    upper bound where other memory shares a mapping); 0 where it cannot be read."""
    spans = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays]
    return sum(min(huge, sum(max(0, min(hi, e) - max(lo, s)) for s, e in spans))
               for lo, hi, huge in mappings())


def _madvise_without_the_gil():
    """libc's ``madvise(addr, length, advice)`` through ctypes, which lets go of the GIL for
    the call (``mmap.madvise`` holds it: a 64 MiB collapse held every other thread, the
    server's included, for its whole length; at 100M the first search after ready waited
    2.6 s). None where libc has no ``madvise``."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.madvise
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    call.restype = ctypes.c_int
    return call


_MADVISE = _madvise_without_the_gil()


def _page_bounds(address: int, length: int) -> tuple[int, int]:
    """``(first, end)`` of the whole 2 MiB pages inside ``[address, address + length)``
    (``end <= first`` when there is none)."""
    return address + (-address % HUGE_PAGE), (address + length) - (address + length) % HUGE_PAGE


def whole_pages(address: int, length: int) -> int:
    """Bytes of the whole 2 MiB pages inside ``[address, address + length)``."""
    first, end = _page_bounds(address, length)
    return max(0, end - first)


def collapse(address: int, length: int, step: int = 8 << 20,
             keep_going=lambda: True) -> int:
    """Collapse the whole 2 MiB pages of ``[address, address + length)`` into huge pages,
    ``step`` bytes (a multiple of 2 MiB) a call, while ``keep_going()``; the parts at either
    end stay in 4 KiB pages. Other threads may read the memory meanwhile (the kernel copies
    each 2 MiB range and swaps it in place). A refused step (no free huge page: EAGAIN,
    ENOMEM; a page across two mappings, as in the heap: EINVAL) leaves its pages as they are
    and the next is tried; a kernel before 6.1 refuses all. Returns the bytes of the steps
    that succeeded."""
    if _MADVISE is None:
        return 0
    first, end = _page_bounds(address, length)
    done = 0
    for start in range(first, end, step):
        if not keep_going():
            break
        size = min(step, end - start)
        if _MADVISE(start, size, MADV_COLLAPSE) == 0:
            done += size
    return done


def over_a_mapping(array: np.ndarray) -> bool:
    """Whether ``array``'s memory belongs to an ``mmap`` (a snapshot file mapped, or the
    memory a snapshot was read into, which :func:`bucketsearch.index.disk.fsio.
    collapse_to_huge_pages` collapses after ready, off the restart's path)."""
    base = array
    while base is not None:
        if isinstance(base, (mmap.mmap, np.memmap)):
            return True
        base = getattr(base, "base", None) if isinstance(base, np.ndarray) else (
            base.obj if isinstance(base, memoryview) else None)
    return False


def collapsible(array: np.ndarray) -> bool:
    """An array worth collapsing here: at least :data:`COLLAPSE_MIN_BYTES`, not over a
    mapping (:func:`over_a_mapping`)."""
    return array.nbytes >= COLLAPSE_MIN_BYTES and not over_a_mapping(array)


def collapse_arrays(arrays) -> int:
    """:func:`collapse` each :func:`collapsible` array now, on this thread (the engines use
    :func:`collapse_later`). Returns the bytes now in huge pages (memory already in them
    costs the call microseconds)."""
    return sum(collapse(a.ctypes.data, a.nbytes) for a in arrays if collapsible(a))


class _Collapser:
    """The background thread of :func:`collapse_later`: a queue of weak references (an array
    freed before its turn is skipped; one is held only while it is collapsed)."""

    def __init__(self):
        self.pending: collections.deque = collections.deque()
        self.busy = False
        self.collapsed = 0  # bytes made huge pages, and arrays the kernel refused (in part)
        self.refused = 0
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def put(self, arrays) -> int:
        refs = [weakref.ref(a) for a in arrays if collapsible(a)]
        if refs:
            with self.cond:
                self.pending.extend(refs)
                if self.thread is None:
                    self.thread = threading.Thread(target=self._run, daemon=True,
                                                   name="bucketsearch-hugepages")
                    self.thread.start()
                self.cond.notify_all()
        return len(refs)

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.pending:
                    self.busy = False
                    self.cond.notify_all()
                    self.cond.wait()
                ref = self.pending.popleft()
                self.busy = True
            array = ref()
            if array is not None:
                done = collapse(array.ctypes.data, array.nbytes)
                self.collapsed += done
                self.refused += done < whole_pages(array.ctypes.data, array.nbytes)
            del array

    def wait(self, timeout: float | None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: not self.pending and not self.busy, timeout)


_COLLAPSER = _Collapser()


def _reset_after_fork() -> None:
    """A forked child has no collapse thread: start afresh (it would wait forever)."""
    global _COLLAPSER
    _COLLAPSER = _Collapser()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def collapse_later(arrays) -> int:
    """Queue the :func:`collapsible` arrays for the background thread, which collapses them
    one at a time (:func:`collapse`); returns how many were queued. For a build or a merge:
    the engine serves at once, on huge pages a moment later."""
    return _COLLAPSER.put(arrays)


def collapse_counts() -> tuple[int, int]:
    """``(bytes collapsed, arrays refused at least in part)`` by the background thread so far
    (a refusal: no free huge page at that moment, or a kernel without MADV_COLLAPSE)."""
    return _COLLAPSER.collapsed, _COLLAPSER.refused


def wait_for_collapse(timeout: float | None = None) -> bool:
    """Wait until every array queued by :func:`collapse_later` has been collapsed (or freed);
    False if ``timeout`` seconds passed first. The planner waits before it calibrates, so its
    timings are those of the memory it will serve from."""
    return _COLLAPSER.wait(timeout)
