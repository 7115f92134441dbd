"""Transparent huge pages for the index's arrays.

A search reads its items, entries and buckets at random; over 4 KiB pages nearly every read of
a large array also misses the TLB (10M items: 76 MiB of codes, 76 of ids, 114 of multi-index
entries). This machine's transparent huge pages are ``madvise`` only: numpy asks for them on the
large arrays it allocates (``madvise(MADV_HUGEPAGE)``), but an array a Numba kernel allocates
(the radix sort's output, a merge's) gets 4 KiB pages. :func:`collapse_arrays` makes the whole
2 MiB pages of an engine's arrays huge pages once they are built (``madvise(MADV_COLLAPSE)``,
Linux >= 6.1; a refusal leaves the pages as they are). Measured at 10M uniform 64-bit codes, the
multi-index's range search over the same arrays with their codes and ids collapsed: 0.81x the
time at radius 1, 0.83x at radius 2; a collapse of 76 MiB took 20-120 ms, of memory already in
huge pages 0.05 ms (bench/RESULTS.md section 40).
"""
from __future__ import annotations

import ctypes
import mmap

import numpy as np

#: a transparent huge page (x86-64, arm64 with 4 KiB pages)
HUGE_PAGE = 2 << 20
#: ``madvise(MADV_COLLAPSE)``, Linux >= 6.1 (Python's ``mmap`` names it from 3.13 on)
MADV_COLLAPSE = getattr(mmap, "MADV_COLLAPSE", 25)
#: arrays below this many bytes are left alone (at most one whole huge page inside)
COLLAPSE_MIN_BYTES = 2 * HUGE_PAGE


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


def collapse(address: int, length: int, step: int = 8 << 20,
             keep_going=lambda: True) -> int:
    """Collapse the whole 2 MiB pages of ``[address, address + length)`` into huge pages,
    ``step`` bytes (a multiple of 2 MiB) a call, while ``keep_going()``; the parts at either
    end stay in 4 KiB pages. Other threads may read the memory meanwhile (the kernel copies
    each 2 MiB range and swaps it in place). Stops at the first refusal (a kernel before 6.1:
    EINVAL; no free huge page: EAGAIN, ENOMEM). Returns the bytes collapsed."""
    first = address + (-address % HUGE_PAGE)
    end = (address + length) - (address + length) % HUGE_PAGE
    done = 0
    for start in range(first, end, step):
        if not keep_going():
            break
        size = min(step, end - start)
        if _MADVISE is None or _MADVISE(start, size, MADV_COLLAPSE) != 0:
            break
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


def collapse_arrays(arrays) -> int:
    """:func:`collapse` each array of at least :data:`COLLAPSE_MIN_BYTES` not over a mapping
    (:func:`over_a_mapping`), synchronously: for a build or a merge, before anything is timed
    or served. Returns the bytes now in huge pages (memory already in them costs the call
    microseconds)."""
    done = 0
    for a in arrays:
        if a.nbytes >= COLLAPSE_MIN_BYTES and not over_a_mapping(a):
            done += collapse(a.ctypes.data, a.nbytes)
    return done
