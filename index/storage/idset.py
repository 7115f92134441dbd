"""The ids of a main index, for the membership tests of deletes and upserts (is this id in the
main index?) and the next free id.

Stored as a bitmap over ``[lo, hi]`` (bit ``id - lo``) when that span is at most
``BITMAP_SPAN_PER_ITEM`` times the item count: at most 1 byte an item, 1/8 for ids given as
0..N-1 (the Client's ``first_id``, auto ids); otherwise as the sorted ids (8 bytes an item), the
layout that was the only one before (``main_ids_sorted``, 8 B per item resident at every size).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index.radix import sort_ids

#: a bitmap when (hi - lo + 1) <= this x n: the bitmap then costs <= 1 byte an item, and the
#: bytes of its one temporary (a bool per id of the span) no more than the sorted copy would
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
            mask = np.zeros(span, dtype=bool)
            mask[ids - lo] = True
            return cls(len(ids), lo, hi, np.packbits(mask, bitorder="little"), None)
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
