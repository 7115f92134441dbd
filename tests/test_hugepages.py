"""Huge pages for the engines' arrays (index/hugepages.py): values kept, whole pages only,
mappings left to the restart's thread, the background thread's queue (freed arrays skipped, a
fork's child starts afresh), and an engine's arrays in huge pages after its build."""
from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pytest

from bucketsearch.index.disk import hugepages
from bucketsearch.index._jit import njit
from bucketsearch.index.disk.hugepages import (HUGE_PAGE, collapse, collapse_arrays,
                                              collapse_counts, collapse_later, over_a_mapping,
                                              wait_for_collapse)
from bucketsearch.index.mih import MultiIndex
from bucketsearch.index.probe import HammingIndex
from bucketsearch.index.synth import uniform_codes


def whole_page_span(array: np.ndarray) -> tuple[int, int]:
    address = array.ctypes.data
    first = address + (-address % HUGE_PAGE)
    end = (address + array.nbytes) - (address + array.nbytes) % HUGE_PAGE
    return first, max(first, end)


def whole_pages(array: np.ndarray) -> int:
    return hugepages.whole_pages(array.ctypes.data, array.nbytes)


def collapses_here() -> bool:
    """MADV_COLLAPSE works on this kernel (Linux >= 6.1, huge pages not 'never')."""
    a = np.arange((3 * HUGE_PAGE) // 8, dtype=np.int64)
    return collapse(a.ctypes.data, a.nbytes) > 0


def test_collapse_keeps_the_values_and_counts_whole_pages_only():
    a = np.arange((5 * HUGE_PAGE) // 8 + 3, dtype=np.int64)[1:]  # unaligned both ends
    want = a.copy()
    done = collapse(a.ctypes.data, a.nbytes, step=HUGE_PAGE)
    assert done % HUGE_PAGE == 0 and done <= whole_pages(a)
    assert np.array_equal(a, want)
    assert collapse(a.ctypes.data, HUGE_PAGE - 8) == 0  # no whole page inside
    assert collapse(a.ctypes.data, a.nbytes, keep_going=lambda: False) == 0


def test_a_refused_step_is_not_counted_and_the_next_is_tried(monkeypatch):
    calls = []

    def refuse_the_second(address, length, advice):
        calls.append((address, length, advice))
        return -1 if len(calls) == 2 else 0

    monkeypatch.setattr(hugepages, "_MADVISE", refuse_the_second)
    a = np.zeros((6 * HUGE_PAGE) // 8, dtype=np.int64)
    pages = whole_pages(a) // HUGE_PAGE
    assert collapse(a.ctypes.data, a.nbytes, step=HUGE_PAGE) == (pages - 1) * HUGE_PAGE
    assert len(calls) == pages and {c[2] for c in calls} == {hugepages.MADV_COLLAPSE}
    assert [c[0] for c in calls] == list(range(calls[0][0], calls[0][0] + pages * HUGE_PAGE,
                                               HUGE_PAGE))


def test_arrays_over_a_mapping_are_left_alone(tmp_path, monkeypatch):
    anonymous = mmap.mmap(-1, 4 * HUGE_PAGE)
    on_anonymous = np.frombuffer(anonymous, dtype=np.int64)
    path = tmp_path / "a.bin"
    path.write_bytes(bytes(4 * HUGE_PAGE))
    on_file = np.memmap(path, dtype=np.int64, mode="r")
    plain = np.zeros((4 * HUGE_PAGE) // 8, dtype=np.int64)
    assert over_a_mapping(on_anonymous) and over_a_mapping(on_anonymous[8:].reshape(-1, 2))
    assert over_a_mapping(on_file) and over_a_mapping(on_file[1:])
    assert not over_a_mapping(plain) and not over_a_mapping(plain[3:])
    seen = []
    monkeypatch.setattr(hugepages, "collapse", lambda address, length: seen.append(address) or 0)
    small = np.zeros(100, dtype=np.int64)
    collapse_arrays([on_anonymous, on_file, plain, small])
    assert seen == [plain.ctypes.data]
    del on_anonymous, on_file
    anonymous.close()


def assert_in_huge_pages(arrays) -> None:
    """Each mapping holds in huge pages at least the 2 MiB pages of the large arrays that lie
    wholly in it (smaps counts huge pages per mapping, not per range; a page across two
    mappings, as in the heap where numpy's madvise splits them, cannot be a huge page)."""
    spans = [whole_page_span(a) for a in arrays if a.nbytes >= hugepages.COLLAPSE_MIN_BYTES]
    assert spans
    for lo, hi, huge in hugepages.mappings():
        need = 0
        for f, e in spans:
            a, b = max(lo, f), min(hi, e)
            a, b = a + (-a % HUGE_PAGE), b - b % HUGE_PAGE
            need += max(0, b - a)
        assert huge >= need, (hex(lo), hex(hi), huge, need)


@njit
def _filled_by_numba(n):
    out = np.empty(n, dtype=np.int64)  # Numba's allocator: no madvise(MADV_HUGEPAGE)
    for i in range(n):
        out[i] = i
    return out


needs_collapse = pytest.mark.skipif(
    not collapses_here(), reason="no MADV_COLLAPSE here (Linux < 6.1, or transparent huge "
    "pages 'never')")


@needs_collapse
def test_an_array_numba_allocated_is_in_huge_pages_after_collapse_arrays():
    a = _filled_by_numba((16 << 20) // 8 + 1)
    done = collapse_arrays([a])
    if done < whole_pages(a):
        pytest.skip("the kernel refused a huge page just now (no free one: EAGAIN, ENOMEM)")
    assert done == whole_pages(a)
    assert_in_huge_pages([a])
    assert np.array_equal(a[:: 1 << 16], np.arange(0, len(a), 1 << 16))


@needs_collapse
def test_the_background_thread_collapses_what_is_queued_and_skips_what_was_freed():
    kept = _filled_by_numba((8 << 20) // 8)
    freed = _filled_by_numba((8 << 20) // 8)
    small = np.zeros(10, dtype=np.int64)
    assert collapse_later([kept, freed, small]) == 2  # the small one is not queued
    refused = collapse_counts()[1]
    del freed
    assert wait_for_collapse(timeout=60)
    if collapse_counts()[1] > refused:
        pytest.skip("the kernel refused a huge page just now (no free one: EAGAIN, ENOMEM)")
    assert_in_huge_pages([kept])
    assert np.array_equal(kept[:: 1 << 15], np.arange(0, len(kept), 1 << 15))
    assert collapse_later([]) == 0 and wait_for_collapse(timeout=0)


def test_a_forked_child_collapses_without_the_parents_thread():
    collapse_later([np.zeros((8 << 20) // 8, dtype=np.int64)])  # the parent's thread runs
    pid = os.fork()
    if pid == 0:  # the child: its own thread, started by its first queue
        ok = False
        try:
            a = np.ones((8 << 20) // 8, dtype=np.int64)
            collapse_later([a])
            ok = wait_for_collapse(timeout=60)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert wait_for_collapse(timeout=60)


@needs_collapse
@pytest.mark.parametrize("engine", [HammingIndex, MultiIndex])
def test_an_engine_holds_its_large_arrays_in_huge_pages_after_a_build(engine, monkeypatch):
    """Every array of at least COLLAPSE_MIN_BYTES that the built engine holds was queued
    (through the real collapse_later), and is in huge pages once the queue is done."""
    module = sys.modules[engine.__module__]
    given = set()

    def spy(arrays):
        arrays = list(arrays)
        given.update(id(a) for a in arrays)
        return collapse_later(arrays)

    monkeypatch.setattr(module, "collapse_later", spy)
    refused = collapse_counts()[1]
    n = 1 << 20  # codes and ids: 8 MiB each
    index = engine(64)
    index.add(uniform_codes(n, 64, seed=3), np.arange(n, dtype=np.int64))
    large = [a for a in index.memory_arrays().values()
             if a.nbytes >= hugepages.COLLAPSE_MIN_BYTES]
    assert len(large) >= 2 and {id(a) for a in large} <= given
    assert wait_for_collapse(timeout=60)
    if collapse_counts()[1] > refused:
        pytest.skip("the kernel refused a huge page just now (no free one: EAGAIN, ENOMEM)")
    assert_in_huge_pages(large)
    lims, D, I = index.range_search(index.words[:50], 0)
    assert np.array_equal(I[lims[:-1]], index.ids[:50])
