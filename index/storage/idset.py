"""The ids of a main index, for the membership tests of deletes and upserts (is this id in the
main index?) and the next free id.

Stored as a bitmap over ``[lo, hi]`` (bit ``id - lo``) when that span is at most
``BITMAP_SPAN_PER_ITEM`` times the item count: at most 1 byte an item, 1/8 for ids given as
0..N-1 (the Client's ``first_id``, auto ids); otherwise as the sorted ids (8 bytes an item), the
layout that was the only one before (``main_ids_sorted``, 8 B per item resident at every size).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index._jit import njit
from bucketsearch.index.radix import id_keys, sort_ids, sort_pairs


@njit
def _set_bits(ids, lo, bitmap):
    """Bit ``id - lo`` of ``bitmap`` (bytes, least significant bit first: ``np.packbits(...,
    bitorder="little")``'s layout) set for every id: one pass, no temporary (a bool per id of
    the span and a copy of the offsets took twice as long at 4M ids)."""
    for i in range(len(ids)):
        k = ids[i] - lo
        bitmap[k >> 3] |= np.uint8(1 << (k & 7))


#: a bitmap when (hi - lo + 1) <= this x n: the bitmap then costs <= 1 byte an item
BITMAP_SPAN_PER_ITEM = 8


class IdSet:
    """An immutable set of distinct int64 ids: ``contains(ids)``, ``len``, ``max``, ``nbytes``."""

    __slots__ = ("n", "lo", "hi", "bitmap", "sorted")

    def __init__(self, n: int, lo: int, hi: int, bitmap: np.ndarray | None,
                 sorted_ids: np.ndarray | None):
        self.n, self.lo, self.hi = n, lo, hi
        self.bitmap, self.sorted = bitmap, sorted_ids

    @classmethod
    def of(cls, ids) -> IdSet:
        """The set of ``ids`` (distinct, any order)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if not len(ids):
            return cls(0, 0, -1, None, np.empty(0, np.int64))
        lo, hi = int(ids.min()), int(ids.max())
        span = hi - lo + 1
        if span <= BITMAP_SPAN_PER_ITEM * len(ids):
            bitmap = np.zeros((span + 7) // 8, dtype=np.uint8)
            _set_bits(np.ascontiguousarray(ids), np.int64(lo), bitmap)
            return cls(len(ids), lo, hi, bitmap, None)
        return cls(len(ids), lo, hi, None, sort_ids(ids))

    def __len__(self) -> int:
        return self.n

    @property
    def max(self) -> int:
        """The largest id, -1 when empty."""
        return self.hi if self.n else -1

    @property
    def nbytes(self) -> int:
        return int((self.bitmap if self.bitmap is not None else self.sorted).nbytes)

    def contains(self, ids) -> np.ndarray:
        """A bool per id of ``ids``: is it in the set."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if not self.n:
            return np.zeros(len(ids), dtype=bool)
        if self.bitmap is not None:
            inside = (ids >= self.lo) & (ids <= self.hi)
            off = np.where(inside, ids - self.lo, 0)
            bit = (self.bitmap[off >> 3] >> (off & 7).astype(np.uint8)) & 1
            return inside & bit.astype(bool)
        pos = np.minimum(np.searchsorted(self.sorted, ids), self.n - 1)
        return self.sorted[pos] == ids


#: an inverse table (a row per id of the span) when the span is at most this x n: <= 8 bytes
#: an item as uint32, 4 for ids given as 0..N-1; otherwise the ids' order (4 bytes an item)
ROWS_SPAN_PER_ITEM = 2


class IdRows:
    """Where each id of a main index sits in its arrays (which hold the items in code order):
    ``rows(ids)``, -1 for an id not there. Built once per main index, in O(n) for ids of a
    narrow span (a scatter into an inverse table), else by sorting them; uint32 rows."""

    __slots__ = ("ids", "lo", "inverse", "order")

    def __init__(self, ids):
        self.ids = ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = len(ids)
        self.lo, self.inverse, self.order = 0, None, None
        if not n:
            return
        lo, hi = int(ids.min()), int(ids.max())
        dtype = np.uint32 if n < 2**32 else np.int64
        if hi - lo + 1 <= ROWS_SPAN_PER_ITEM * n:
            self.lo = lo
            self.inverse = np.full(hi - lo + 1, np.iinfo(dtype).max, dtype=dtype)
            self.inverse[ids - lo] = np.arange(n, dtype=dtype)
        else:
            self.order = sort_pairs(id_keys(ids), np.arange(n))[1].astype(dtype)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.inverse, self.order) if a is not None))

    def rows(self, ids) -> np.ndarray:
        """The row of each of ``ids`` (int64), -1 where the id is not there."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = len(self.ids)
        if not n:
            return np.full(len(ids), -1, dtype=np.int64)
        if self.inverse is not None:
            off = ids - self.lo
            inside = (off >= 0) & (off < len(self.inverse))
            rows = self.inverse[np.where(inside, off, 0)].astype(np.int64)
            ok = inside & (rows < n)
        else:
            at = np.minimum(np.searchsorted(self.ids, ids, sorter=self.order), n - 1)
            rows = self.order[at].astype(np.int64)
            ok = self.ids[rows] == ids
        return np.where(ok, rows, -1)
