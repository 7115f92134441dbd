"""Bucket table: the inverted index from code to items (CSR buckets + open-addressing lookup).

Layout (all flat arrays, so a snapshot is a handful of ``.npy`` files that ``mmap`` shares):

* ``codes``   ``(nu, W)`` uint64, the distinct codes, sorted lexicographically by words;
* ``offsets`` ``(nu + 1,)`` int32 (int64 from 2^31 items), bucket ``b`` holds ``ids[offsets[b]:offsets[b + 1]]``;
* ``ids``     ``(n,)`` int64, item ids sorted by (code, id);
* ``slots``   ``(2^t,)`` int32 open-addressing table (linear probing, load <= 2/3) of bucket
  numbers, -1 for empty, keyed by a multiplicative hash of the code's words;
* ``bitmap``  ``(2^f / 64,)`` uint64 occupancy filter checked before the table, so an empty probe
  (the common case at radius >= 2) costs one load: a blocked Bloom filter that sets two bits of
  one 64-bit word per code (word chosen by the top hash bits, bits by middle ones); about 0.4%
  false positives at 32 bits per distinct code (1.4% at 16, where it is twice as slow).

For ``Q <= DIRECT_MAX_BITS`` (and codes dense enough) the table is direct-addressed instead:
``slots`` has ``2^Q`` entries indexed by the code value itself, and there is no bitmap.

The multi-index's substring tables and the join's tables are bucket tables; the single-table
engine indexes its items by position instead (:mod:`bucketsearch.index.item_table`).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index._jit import njit
from bucketsearch.index.codes import n_words
from bucketsearch.index.radix import merge_sorted, sort_codes_ids

EMPTY = np.int32(-1)
HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio (Fibonacci hashing)
DIRECT_MAX_BITS = 24      # direct addressing only up to 2^24 slots (64 MiB of int32)
BITMAP_BITS_PER_CODE = 32  # filter size, rounded up to a power of two
TABLE_SLOTS_PER_CODE = 1.5  # rounded up to a power of two: load factor 0.375..0.67


@njit(inline="always")
def hash_words(words, W):
    """Multiplicative (Fibonacci) hash of a code's W words; the top bits are the mixed ones.

    For one word it is ``code * HASH_MULTIPLIER mod 2^64``, the same as :func:`hash_word`.
    """
    h = words[0] * HASH_MULTIPLIER
    for w in range(1, W):
        h = (h ^ (h >> np.uint64(31)) ^ words[w]) * HASH_MULTIPLIER
    return h


@njit(inline="always")
def filter_word_mask(h, filter_shift):
    """Blocked Bloom filter: the word of hash ``h`` and the two bits it sets there."""
    mask = (np.uint64(1) << ((h >> np.uint64(24)) & np.uint64(63))) | \
        (np.uint64(1) << ((h >> np.uint64(30)) & np.uint64(63)))
    return h >> filter_shift, mask


@njit(inline="always")
def find_bucket(cur, W, codes, slots, bitmap, table_shift, filter_shift, direct):
    """Bucket number of code ``cur`` (W words), or -1 when no item has that code."""
    if direct:
        return slots[cur[0]]
    h = hash_words(cur, W)
    f, bits = filter_word_mask(h, filter_shift)
    if bitmap[f] & bits != bits:
        return -1
    mask = np.uint64(len(slots) - 1)
    s = h >> table_shift
    while True:
        b = slots[s]
        if b < 0:
            return -1
        same = True
        for w in range(W):
            if codes[b, w] != cur[w]:
                same = False
                break
        if same:
            return b
        s = (s + np.uint64(1)) & mask


@njit
def _fill_hash(codes, slots, bitmap, table_shift, filter_shift):
    """The slots and the occupancy filter of a hashed table (linear probing), buckets in
    order. The reads are sequential, the writes random: inserting in home-slot order instead
    (sorted homes, sequential writes, random reads of the buckets) measured 3-5x slower on 10M
    codes, the reads stalling where writes do not."""
    mask = np.uint64(len(slots) - 1)
    W = codes.shape[1]
    for b in range(codes.shape[0]):
        h = codes[b, 0] * HASH_MULTIPLIER if W == 1 else hash_words(codes[b], W)
        f, bits = filter_word_mask(h, filter_shift)
        bitmap[f] |= bits
        s = h >> table_shift
        while slots[s] >= 0:
            s = (s + np.uint64(1)) & mask
        slots[s] = b


@njit
def _fill_direct(codes, slots):
    for b in range(codes.shape[0]):
        slots[codes[b, 0]] = b


@njit
def _bucket_bounds(sorted_codes):
    """Start of every run of equal rows in lexicographically sorted codes, plus n at the end."""
    n, W = sorted_codes.shape
    starts = np.empty(n + 1, dtype=np.int64)
    nu = 0
    for i in range(n):
        new = i == 0
        if not new:
            for w in range(W):
                if sorted_codes[i, w] != sorted_codes[i - 1, w]:
                    new = True
                    break
        if new:
            starts[nu] = i
            nu += 1
    starts[nu] = n
    return starts[:nu + 1].copy()


def _sort_order(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Permutation sorting items by (code words, id) (several-word codes; one-word codes go
    through :func:`index.radix.sort_codes_ids`)."""
    if words.shape[1] == 1 and len(ids) > 1 and np.all(ids[1:] > ids[:-1]):
        return np.argsort(words[:, 0], kind="stable")  # ids already increasing: stable by code
    keys = [ids] + [words[:, w] for w in range(words.shape[1] - 1, -1, -1)]
    return np.lexsort(keys)


def sort_items(words: np.ndarray, ids: np.ndarray,
               threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(words, ids)`` sorted by (code, id): a radix sort for one-word codes (a few linear
    passes on ``threads`` threads, :mod:`index.radix`), ``np.lexsort`` for longer ones."""
    words = np.ascontiguousarray(words, dtype=np.uint64)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if words.shape[1] == 1:
        sorted_codes, sorted_ids = sort_codes_ids(words.reshape(-1), ids, threads)
        return sorted_codes.reshape(-1, 1), sorted_ids
    order = _sort_order(words, ids)
    return np.ascontiguousarray(words[order]), ids[order]


def merge_items(words: np.ndarray, ids: np.ndarray, new_words: np.ndarray,
                new_ids: np.ndarray, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Items ``(words, ids)`` already in (code, id) order and new items in any order (ids
    disjoint), all of them in (code, id) order: one-word codes sort the new items only and
    merge the two runs in one pass (:func:`bucketsearch.index.radix.merge_sorted`); longer
    codes sort the union (:func:`sort_items`)."""
    words = np.ascontiguousarray(words, dtype=np.uint64)
    new_words = np.ascontiguousarray(new_words, dtype=np.uint64).reshape(-1, words.shape[1])
    if words.shape[1] != 1 or not len(ids):
        return sort_items(np.concatenate([words, new_words]), np.concatenate([ids, new_ids]),
                          threads)
    new_words, new_ids = sort_items(new_words, new_ids, threads)
    merged, merged_ids = merge_sorted(words.reshape(-1), np.ascontiguousarray(ids, np.int64),
                                      new_words.reshape(-1), new_ids)
    return merged.reshape(-1, 1), merged_ids


def position_dtype(n: int):
    """The narrowest signed type holding positions ``0..n``: int32 below 2^31, else int64."""
    return np.int32 if n < 2**31 - 1 else np.int64


def _pow2_at_least(x: float) -> int:
    return 1 << max(4, (int(np.ceil(x)) - 1).bit_length())


class BucketTable:
    """Immutable bucket table over ``(n, W)`` uint64 codes and int64 ids (see module docstring)."""

    ARRAYS = ("codes", "offsets", "ids", "slots", "bitmap")

    def __init__(self, bits, codes, offsets, ids, slots, bitmap, direct):
        self.bits = bits
        self.codes, self.offsets, self.ids = codes, offsets, ids
        self.slots, self.bitmap, self.direct = slots, bitmap, bool(direct)
        self.table_shift = np.uint64(64 - (len(slots).bit_length() - 1))
        self.filter_shift = np.uint64(64 - len(bitmap).bit_length() + 1)

    @classmethod
    def build(cls, bits: int, words: np.ndarray, ids: np.ndarray) -> BucketTable:
        """Sort items by (code, id), cut into buckets, and fill the lookup structure."""
        W = n_words(bits)
        words = np.ascontiguousarray(words, dtype=np.uint64).reshape(-1, W)
        return cls.from_sorted(bits, *sort_items(words, ids))

    @classmethod
    def from_sorted(cls, bits: int, sorted_words: np.ndarray,
                    sorted_ids: np.ndarray) -> BucketTable:
        """The table of items already sorted by (code, id) (:func:`sort_items`): ``sorted_ids``
        becomes its ``ids`` as given (not copied: a caller's shared array). Offsets are
        :func:`position_dtype` wide."""
        offsets = _bucket_bounds(sorted_words)
        codes = np.ascontiguousarray(sorted_words[offsets[:-1]])
        offsets = offsets.astype(position_dtype(len(sorted_ids)), copy=False)
        nu = len(codes)
        direct = bits <= DIRECT_MAX_BITS and (bits <= 16 or (1 << bits) <= 8 * max(nu, 1))
        if direct:
            slots = np.full(1 << bits, EMPTY, dtype=np.int32)
            bitmap = np.zeros(2, dtype=np.uint64)  # unused; two words keep the shift < 64
            table = cls(bits, codes, offsets, sorted_ids, slots, bitmap, True)
            _fill_direct(codes, slots)
            return table
        slots = np.full(_pow2_at_least(TABLE_SLOTS_PER_CODE * nu), EMPTY, dtype=np.int32)
        bitmap = np.zeros(max(128, _pow2_at_least(BITMAP_BITS_PER_CODE * nu)) // 64,
                          dtype=np.uint64)
        table = cls(bits, codes, offsets, sorted_ids, slots, bitmap, False)
        _fill_hash(codes, slots, bitmap, table.table_shift, table.filter_shift)
        return table

    def arrays(self) -> dict:
        return {name: getattr(self, name) for name in self.ARRAYS}

    @property
    def ntotal(self) -> int:
        return len(self.ids)

    @property
    def distinct_codes(self) -> int:
        return len(self.codes)

    def bucket_sizes(self) -> np.ndarray:
        """Items per non-empty bucket, in bucket order."""
        return np.diff(self.offsets)

    def memory_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    def lookup_args(self):
        """The arguments of :func:`find_bucket` after the code."""
        return (self.codes, self.slots, self.bitmap, self.table_shift, self.filter_shift,
                self.direct)
