"""Item table: the single-table engine's lookup over the shared items, positions only.

The items are stored once, sorted by (code, id): ``words`` ``(n, W)`` uint64 and ``ids``
``(n,)`` int64, the arrays an :class:`~bucketsearch.index.planner.AutoIndex` shares with its
multi-index and its scan. A code's bucket is the run of equal rows of ``words`` starting at its
first position ``lo`` (its end found by comparing the next rows: :func:`run_end`). The lookup
structure maps a code to ``lo``:

* **hashed** (the usual case): ``slots`` ``(M,)`` uint32 (uint64 from 2^31 items),
  ``M = ceil(SLOTS_PER_CODE * distinct)``, open addressing with linear probing. A code's hash
  ``h`` (:func:`bucketsearch.index.table.hash_words`) gives the product ``p = (h >> 32) * M``:
  its home slot ``p >> 32`` (Lemire's multiply-shift range reduction, so ``M`` need not be a
  power of two) and its fingerprint, the top ``fp_bits`` bits of
  ``p mod 2^32``. A slot holds ``((lo + 1) << fp_bits) | fingerprint``, 0 when empty; a probe
  compares fingerprints first and reads ``words[lo]`` only on a match, so a miss usually costs
  the slot loads of one cache line and no item load (``2^-fp_bits`` false matches per occupied
  slot passed). Before the slots, ``bitmap``, an occupancy filter of 12 to 32 bits per
  distinct code (:func:`filter_words`: the most while it fits 4 MiB; a blocked Bloom filter,
  three bits of one uint64 word, :func:`filter_word_bits`), answers most misses with one load
  (0.17% false positives at 32 bits, 1.5% at 12): the probes of radius >= 2 are nearly all
  misses, and a walk along the slots costs several times the filter's load. Radius-0 lookups
  of a batch skip it while its hits outnumber its misses (:func:`probe_word`).
* **direct** (``bits <= 16``, or ``bits <= DIRECT_MAX_BITS`` with ``2^bits <= 2 * distinct``):
  ``slots`` ``(2^bits + 1,)`` bucket starts by code value (the same dtype), code ``c``'s items at
  ``starts[c]:starts[c + 1]`` (one load, no comparison).

Bytes per item at 64 bits, every code distinct, from 2.8M codes: 8 (codes) + 8 (ids) +
``4 * SLOTS_PER_CODE`` (slots) + ``FILTER_BITS_PER_CODE / 8`` (filter) = 23.5. Only ``slots`` and ``bitmap`` are the
table's own; ``words`` and ``ids`` are the items.
"""
from __future__ import annotations

import math

import numpy as np

from bucketsearch.index._jit import njit, prefetch
from bucketsearch.index.codes import n_words
from bucketsearch.index.table import HASH_MULTIPLIER, hash_words, sort_items

DIRECT_MAX_BITS = 24
SLOTS_PER_CODE = 1.5      # load factor 2/3: a hit passes ~2 slots (linear probing), a miss ~5
FILTER_BITS_PER_CODE = 12  # the occupancy filter's least size: 1.5 bytes per distinct code
FILTER_MAX_BITS_PER_CODE = 32  # ... and its most, while it fits FILTER_CACHE_BYTES
FILTER_CACHE_BYTES = 4 << 20   # a filter this small stays in the last-level cache
FILTER_HASHES = 3          # bits set per code (filter_word_bits)
FILTER_SCHEME = 2          # the filter's hash (snapshot meta "filter"; 1, or none: 4 bits of a
#                            second multiply, refilled at load)
FP_MAX_BITS = 32          # the fraction of the range reduction has 32 bits


@njit(inline="always")
def home_and_fingerprint(h, n_slots, fp_bits):
    """Home slot ``((h >> 32) * M) >> 32`` and fingerprint (the top ``fp_bits`` bits of the
    product's low 32 bits) of hash ``h``; ``M = n_slots < 2^32``; all uint64 (a signed operand
    turns numba's arithmetic into float64: 5x slower probes)."""
    p = (h >> np.uint64(32)) * n_slots
    fp = (p & np.uint64(0xFFFFFFFF)) >> (np.uint64(32) - fp_bits)
    return p >> np.uint64(32), fp


@njit
def _probe_slots(h, code, words, slots, fp_bits):
    """Linear probing from the home of hash ``h`` for one-word ``code``: its first position
    or -1. Not inlined by numba (LLVM decides): inlined into the probing loops of radius >= 1,
    whose probes the filter nearly always ends first, it measured 4x slower a probe."""
    n_slots = np.uint64(len(slots))
    fpb = np.uint64(fp_bits)
    s, fp = home_and_fingerprint(h, n_slots, fpb)
    fp_mask = (np.uint64(1) << fpb) - np.uint64(1)
    while True:
        e = np.uint64(slots[s])
        if e == np.uint64(0):
            return np.int64(-1)
        if (e & fp_mask) == fp:
            lo = np.int64(e >> fpb) - 1
            if words[lo, 0] == code:
                return lo
        s += np.uint64(1)
        if s == n_slots:
            s = np.uint64(0)


@njit
def _probe_rows(h, cur, W, words, slots, fp_bits):
    """:func:`_probe_slots` for code ``cur`` of ``W`` words."""
    n_slots = np.uint64(len(slots))
    fpb = np.uint64(fp_bits)
    s, fp = home_and_fingerprint(h, n_slots, fpb)
    fp_mask = (np.uint64(1) << fpb) - np.uint64(1)
    while True:
        e = np.uint64(slots[s])
        if e == np.uint64(0):
            return np.int64(-1)
        if (e & fp_mask) == fp:
            lo = np.int64(e >> fpb) - 1
            same = True
            for w in range(W):
                if words[lo, w] != cur[w]:
                    same = False
                    break
            if same:
                return lo
        s += np.uint64(1)
        if s == n_slots:
            s = np.uint64(0)


@njit(inline="always")
def filter_word_bits(h, n_words):
    """Occupancy filter of hash ``h`` (a blocked Bloom filter of ``n_words`` uint64): the word
    ``((h >> 32) * n_words) >> 32`` (the top bits of ``h``) and the :data:`FILTER_HASHES` bits
    it sets there, at positions ``(h >> 20) mod 64``, ``(h >> 26) mod 64``, ``(h >> 32) mod 64``
    (the middle bits, which the word hardly depends on: no second multiply on the miss path,
    where it cost ~0.5 ns of a 4 ns probe)."""
    one = np.uint64(1)
    six = np.uint64(63)
    bits = (one << ((h >> np.uint64(20)) & six)) | (one << ((h >> np.uint64(26)) & six)) | \
        (one << ((h >> np.uint64(32)) & six))
    return ((h >> np.uint64(32)) * np.uint64(n_words)) >> np.uint64(32), bits


def filter_words(distinct: int) -> int:
    """uint64 words of the occupancy filter of ``distinct`` codes: :data:`FILTER_BITS_PER_CODE`
    bits per code, more (up to :data:`FILTER_MAX_BITS_PER_CODE`) while the filter fits
    :data:`FILTER_CACHE_BYTES`. A false positive walks the slots (a cache miss in a table of
    megabytes, ~20x the filter's load), so below 4 MiB the filter's bytes buy fewer of them at
    no cost that counts (4 MiB at most); from 2.8M codes on it keeps 1.5 bytes per code."""
    bits = max(FILTER_BITS_PER_CODE * distinct,
               min(FILTER_MAX_BITS_PER_CODE * distinct, 8 * FILTER_CACHE_BYTES))
    return max(1, math.ceil(bits / 64))


@njit(inline="always")
def passes_filter(h, bitmap):
    """Whether some code with hash ``h`` may be in the table (never a false negative)."""
    f, bits = filter_word_bits(h, len(bitmap))
    return (bitmap[f] & bits) == bits


@njit(inline="always")
def probe_word(code, words, slots, fp_bits):
    """:func:`find_word` of a hashed table without the filter (radius-0 lookups where hits are
    the common case and the filter's load would only add to them)."""
    return _probe_slots(code * HASH_MULTIPLIER, code, words, slots, fp_bits)


@njit(inline="always")
def find_word(code, words, slots, fp_bits, direct, bitmap):
    """First position of one-word ``code`` in ``words`` (its bucket's ``lo``), or -1."""
    if direct:
        lo = np.int64(slots[code])
        return lo if np.int64(slots[code + np.uint64(1)]) > lo else np.int64(-1)
    h = code * HASH_MULTIPLIER
    if not passes_filter(h, bitmap):
        return np.int64(-1)
    return _probe_slots(h, code, words, slots, fp_bits)


@njit(inline="always")
def find_row(cur, W, words, slots, fp_bits, direct, bitmap):
    """:func:`find_word` for a code of ``W`` words ``cur`` (any width)."""
    if W == 1:
        return find_word(cur[0], words, slots, fp_bits, direct, bitmap)
    h = hash_words(cur, W)
    if not passes_filter(h, bitmap):
        return np.int64(-1)
    return _probe_rows(h, cur, W, words, slots, fp_bits)


@njit(inline="always")
def run_end(words, lo):
    """End of the run of rows equal to ``words[lo]`` (items sorted by code): its bucket's
    ``hi``."""
    n, W = words.shape
    hi = lo + 1
    while hi < n:
        for w in range(W):
            if words[hi, w] != words[lo, w]:
                return hi
        hi += 1
    return hi


@njit
def run_starts(words):
    """First position of every run of equal rows of code-sorted ``words`` (int64)."""
    n, W = words.shape
    out = np.empty(n, dtype=np.int64)
    nu = 0
    for i in range(n):
        new = i == 0
        if not new:
            for w in range(W):
                if words[i, w] != words[i - 1, w]:
                    new = True
                    break
        if new:
            out[nu] = i
            nu += 1
    return out[:nu].copy()


#: run starts ahead whose filter word and home slot :func:`_fill_slots` prefetches
FILL_PREFETCH = 16


@njit(inline="always")
def _code_hash(words, lo, W):
    return words[lo, 0] * HASH_MULTIPLIER if W == 1 else hash_words(words[lo], W)


@njit
def bucket_size_counts(words):
    """``counts[s]``: how many runs of equal rows (buckets) of code-sorted ``words`` hold
    ``s`` rows, for ``s = 0..largest`` (so ``len(counts) - 1`` is the largest bucket; one
    element, 0, when empty). One pass; the counts grow by doubling."""
    n, W = words.shape
    counts = np.zeros(64, dtype=np.int64)
    largest = 0
    run = 0
    for i in range(n + 1):
        same = 0 < i < n
        if same:
            for w in range(W):
                if words[i, w] != words[i - 1, w]:
                    same = False
                    break
        if same:
            run += 1
            continue
        if run:
            if run >= len(counts):
                grown = np.zeros(max(2 * len(counts), run + 1), dtype=np.int64)
                grown[:len(counts)] = counts
                counts = grown
            counts[run] += 1
            largest = max(largest, run)
        run = 1
    return counts[:largest + 1].copy()


@njit
def _fill_slots(words, starts, slots, fp_bits, bitmap):
    """Insert every run start into the hashed ``slots`` (linear probing) and its code into the
    filter, runs in order: reads sequential, writes random. The filter word and home slot of
    the run :data:`FILL_PREFETCH` ahead are prefetched, so the random writes' cache misses
    overlap instead of stalling one by one (0.46-0.56 s -> 0.26 s at 10M distinct codes,
    bench/RESULTS.md "Builds"); the order of insertion, and so the table, is unchanged."""
    n_slots = np.uint64(len(slots))
    fpb = np.uint64(fp_bits)
    W = words.shape[1]
    nb = len(starts)
    for b in range(min(FILL_PREFETCH, nb)):
        h = _code_hash(words, starts[b], W)
        prefetch(bitmap, filter_word_bits(h, len(bitmap))[0])
        prefetch(slots, home_and_fingerprint(h, n_slots, fpb)[0])
    for b in range(nb):
        if b + FILL_PREFETCH < nb:
            h = _code_hash(words, starts[b + FILL_PREFETCH], W)
            prefetch(bitmap, filter_word_bits(h, len(bitmap))[0])
            prefetch(slots, home_and_fingerprint(h, n_slots, fpb)[0])
        lo = starts[b]
        h = _code_hash(words, lo, W)
        f, bits = filter_word_bits(h, len(bitmap))
        bitmap[f] |= bits
        s, fp = home_and_fingerprint(h, n_slots, fpb)
        while slots[s] != 0:
            s += np.uint64(1)
            if s == n_slots:
                s = np.uint64(0)
        slots[s] = ((np.uint64(lo) + np.uint64(1)) << fpb) | fp


@njit
def _fill_filter(words, starts, bitmap):
    """The occupancy filter of the codes at run starts ``starts`` (a snapshot's filter of an
    older :data:`FILTER_SCHEME`, filled again at load)."""
    W = words.shape[1]
    for b in range(len(starts)):
        lo = starts[b]
        h = words[lo, 0] * HASH_MULTIPLIER if W == 1 else hash_words(words[lo], W)
        f, bits = filter_word_bits(h, len(bitmap))
        bitmap[f] |= bits


@njit
def _fill_direct(words, starts):
    """Bucket starts by code value (one-word codes, ``starts`` zeroed, ``2^bits + 1``)."""
    n = words.shape[0]
    for i in range(n):
        starts[words[i, 0] + np.uint64(1)] += 1
    for c in range(1, len(starts)):
        starts[c] += starts[c - 1]


def slot_dtype(n: int) -> type:
    """Slots (hashed) and bucket starts (direct) of a table over ``n`` items: uint32 below 2^31
    items, else uint64. One type up to 2^31, whatever the size and the mode: the kernels'
    compiled signatures, which the server's warm-up compiles on small indexes, stay the same."""
    return np.uint32 if n < 2**31 else np.uint64


def slot_layout(n: int) -> tuple[type, int]:
    """``(slot dtype, fingerprint bits)`` of a hashed table over ``n`` items: positions + 1 take
    ``n.bit_length()`` bits, the fingerprint the rest of the slot (at most
    :data:`FP_MAX_BITS`; 8 bits at 10M items, 5 at 100M, 1 just under 2^31)."""
    dtype = slot_dtype(n)
    width = 8 * np.dtype(dtype).itemsize
    return dtype, min(FP_MAX_BITS, width - max(int(n).bit_length(), 1))


def is_direct(bits: int, distinct: int) -> bool:
    return bits <= 16 or (bits <= DIRECT_MAX_BITS and (1 << bits) <= 2 * distinct)


class ItemTable:
    """Lookup of code-sorted items (see the module docstring): ``words``, ``ids`` (shared, not
    copied), ``slots``, and ``fp_bits`` / ``direct`` / ``distinct`` (metadata)."""

    ARRAYS = ("words", "ids", "slots", "bitmap")

    def __init__(self, bits, words, ids, slots, bitmap, fp_bits, direct, distinct,
                 size_counts=None):
        self.bits = int(bits)
        self.words, self.ids, self.slots, self.bitmap = words, ids, slots, bitmap
        self.fp_bits = int(fp_bits)
        self.direct = bool(direct)
        self.distinct_codes = int(distinct)
        # buckets per size (the index's info and its largest bucket, the search budget's
        # bound): one pass at build, kept in the snapshot, so no request after a merge or a
        # restart pays an O(items) pass for them
        self.size_counts = np.asarray(bucket_size_counts(words) if size_counts is None
                                      else size_counts, dtype=np.int64)

    @classmethod
    def build(cls, bits: int, words: np.ndarray, ids: np.ndarray) -> ItemTable:
        """Sort the items by (code, id), then :meth:`from_sorted`."""
        W = n_words(bits)
        words = np.ascontiguousarray(words, dtype=np.uint64).reshape(-1, W)
        return cls.from_sorted(bits, *sort_items(words, ids))

    @classmethod
    def from_sorted(cls, bits: int, words: np.ndarray, ids: np.ndarray,
                    layout: tuple | None = None) -> ItemTable:
        """The table of items already sorted by (code, id)
        (:func:`bucketsearch.index.table.sort_items`), kept as given. ``layout``: a hashed
        table's ``(slot dtype, fingerprint bits)`` instead
        of :func:`slot_layout`'s (tests: 64-bit slots, fingerprints that collide)."""
        W = n_words(bits)
        if words.dtype != np.uint64 or words.ndim != 2 or not words.flags.c_contiguous:
            words = np.ascontiguousarray(words, dtype=np.uint64).reshape(-1, W)
        if ids.dtype != np.int64 or not ids.flags.c_contiguous:
            ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = len(ids)
        starts = run_starts(words)
        distinct = len(starts)
        if layout is None and is_direct(bits, distinct):
            slots = np.zeros((1 << bits) + 1, dtype=slot_dtype(n))
            _fill_direct(words, slots)
            return cls(bits, words, ids, slots, np.zeros(1, np.uint64), 0, True, distinct)
        dtype, fp_bits = layout or slot_layout(n)
        slots = np.zeros(max(2, math.ceil(SLOTS_PER_CODE * distinct)), dtype=dtype)
        bitmap = np.zeros(filter_words(distinct), dtype=np.uint64)
        _fill_slots(words, starts, slots, fp_bits, bitmap)
        return cls(bits, words, ids, slots, bitmap, fp_bits, False, distinct)

    @classmethod
    def from_arrays(cls, bits: int, arrays: dict, meta: dict) -> ItemTable:
        """The table of a snapshot's arrays and :meth:`meta`; a hashed table's filter of an
        older :data:`FILTER_SCHEME` is filled again (one pass over the items)."""
        words, bitmap = arrays["words"], arrays["bitmap"]
        if not meta["direct"] and meta.get("filter", 1) != FILTER_SCHEME:
            bitmap = np.zeros(filter_words(meta["distinct"]), dtype=np.uint64)
            _fill_filter(words, run_starts(words), bitmap)
        counts = None
        if "bucket_sizes" in meta:  # [[size, buckets], ...] of the sizes present
            pairs = np.array(meta["bucket_sizes"], dtype=np.int64).reshape(-1, 2)
            counts = np.zeros(int(pairs[:, 0].max(initial=0)) + 1, dtype=np.int64)
            counts[pairs[:, 0]] = pairs[:, 1]
        return cls(bits, words, arrays["ids"], arrays["slots"], bitmap, meta["fp_bits"],
                   meta["direct"], meta["distinct"], counts)

    def meta(self) -> dict:
        sizes = np.flatnonzero(self.size_counts)
        return {"fp_bits": self.fp_bits, "direct": self.direct, "distinct": self.distinct_codes,
                "filter": FILTER_SCHEME,
                "bucket_sizes": [[int(s), int(self.size_counts[s])] for s in sizes]}

    def arrays(self) -> dict:
        return {name: getattr(self, name) for name in self.ARRAYS}

    @property
    def ntotal(self) -> int:
        return len(self.ids)

    def distinct_words(self) -> np.ndarray:
        """The distinct codes ``(distinct, W)``, sorted (a copy made on demand)."""
        return np.ascontiguousarray(self.words[run_starts(self.words)])

    def bucket_sizes(self) -> np.ndarray:
        """Items per non-empty bucket, in code order."""
        return np.diff(np.append(run_starts(self.words), len(self.ids)))

    def memory_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    def lookup_args(self) -> tuple:
        """The arguments of :func:`find_row` / :func:`find_word` after the code."""
        return self.words, self.slots, self.fp_bits, self.direct, self.bitmap
