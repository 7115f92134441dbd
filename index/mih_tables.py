"""The multi-index's substring tables, positions only: layout, lookup and build.

The items are stored once, sorted by (code, id): ``words`` ``(n, W)`` uint64 and ``ids``
``(n,)`` int64 (shared with an :class:`~bucketsearch.index.planner.AutoIndex`'s single table and
scan). Substring table ``j`` (bits ``start_j .. start_j + w_j`` of the code, see
:func:`bucketsearch.index.mih.substring_ranges`) is:

* ``positions[j * n:(j + 1) * n]``: every item's entry, its position (row) in ``words`` /
  ``ids`` and its tag (below), ordered by (substring ``j``, id), so a substring value's
  *bucket* is one run ``lo:hi`` of it, its ids ascending (the exact kernel's results come
  as runs of ascending ids, merged, not sorted). uint32 below 2^32 items, else uint64
  (:func:`position_dtype`);
* a lookup from a substring value to its bucket, one of:

  - **direct** (``w_j <= 16``, or ``w_j <= DIRECT_MAX_BITS`` with
    ``2^w_j <= DIRECT_PER_DISTINCT * distinct``): ``starts[s]:starts[s + 1]`` bounds value
    ``s``'s bucket (``2^w_j + 1`` entries of the position dtype; one load, no comparison);
  - **hashed**: the single table's slot layout (:mod:`bucketsearch.index.item_table`: open
    addressing of ``ceil(SLOTS_PER_CODE * distinct)`` slots ``((lo + 1) << fp_bits) |
    fingerprint``, Lemire's range reduction, a blocked Bloom filter of
    ``FILTER_BITS_PER_CODE`` bits per distinct value before it) keyed by
    ``key * HASH_MULTIPLIER``. A fingerprint match is confirmed by the substring of the item
    at ``lo``; the bucket ends at the next set bit of ``ends`` (one bit per position of a
    hashed table, set at the last position of each bucket: :func:`ends_bit_base`), so a
    lookup knows a bucket's size without reading past it (reading the item after the bucket
    was a random load per lookup).

**Entries and tags.** An entry of a table is the item's row in its low ``T_ROW_BITS = max(1,
bit_length(n))`` bits and, in the spare bits above them, the table's *tag* of the item: the
``T_TAG_BITS`` code bits from bit ``T_TAG_START`` (table ``j < m - 1``: the bits just after
its substring; the last table: the code's first bits), as many as the spare bits hold, at
most :data:`TAG_MAX_BITS` (one-word codes only; uint32 entries: 12 bits at 1M items, 8 at
10M, 5 at 100M). The tag's bits lie outside substring ``j``, so an item met in table ``j``
at substring distance ``s`` from the query is at distance ``>= s + popcount(tag XOR the
query's tag)``: a search discards a candidate whose bound exceeds its radius (or its k-th
distance) from the entry alone, without reading the item's code (:func:`code_tag`; the
exact kernel of :mod:`bucketsearch.index.mih` and :mod:`bucketsearch.index.mih_knn`). A
uniform non-result of a radius-1 search passes a 12-bit tag with probability 13/4096. The
row of an entry is ``entry & row_mask`` (:func:`entry_row`, :meth:`SubstringTables.rows`);
tables saved before the tags (10 columns) are read with none (:func:`with_tag_columns`).

Table 0's substring is the code's leading bits, so its bucket ``lo:hi`` is also the rows
``lo:hi`` of the (code, id)-sorted items (only the order inside the bucket differs): a search
that needs the items in code order reads them there, with no position.

No copy of the distinct substring values, of offsets, or of the codes and ids in table order
is kept: a bucket's items are read through their positions. Bytes per item at 10M uniform
64-bit codes (m = 3 direct tables of 22, 21, 21 bits): 16 (items) + 12 (positions) + 3.4
(bucket starts) = 31.4; a hashed table adds 1 / 8 (its end bits).

Per-table metadata is one ``(m, T_COLUMNS)`` int64 array ``tables`` (columns ``T_*``), the
hashed tables' slots, filters and end bits concatenated in ``slots``, ``bitmap`` and ``ends``,
the direct tables' bucket starts in ``starts``.

Build (:func:`build_tables`; every entry tagged as it is written, from the codes read in
order: :func:`tagged`): the positions in id order (:func:`positions_by_id`: none when
the ids increase with the positions, and then table 0, whose substring is the code's leading
bits, is the items' own order; one scatter when the ids are consecutive integers in any order;
else an LSD radix sort of the ids) and the codes in that order (a build's input when its ids
increase, else gathered once), then per table one counting sort by substring value reading
those codes front to back when ``2^w <= COUNTING_MAX_FACTOR * n`` (a histogram, its prefix
sums, which are a direct table's bucket starts, and one stable scatter of the positions), else
the radix sort of the substrings carrying the positions. Linear passes, no Python per item;
the tables are built on up to ``threads`` threads at once
(:func:`bucketsearch.index.pool.run_lanes`).

Merge (:func:`merge_tables`, a live index's merge of a delta: :mod:`bucketsearch.index.storage
.merging`): the merged items' tables from the old items' tables without sorting these again.
Old position ``p`` goes to merged row ``remap[p]`` (:func:`merge_remap`, one pass over the
merged ids; dropped items marked); a table keeps its (substring, id) order under that map, so
table ``j`` of the merged items is one linear merge of the old run, remapped, with the new
items sorted by (substring ``j``, id) (a radix sort of the delta's substrings); an old direct
table is merged value by value (its bucket ``v`` is ``starts[v]:starts[v + 1]``, no substring
read, the new starts written in order), ids compared only between a bucket's old items and a
new item whose id is below the largest old one (an upsert's: a bulk add reads none). The
lookup is then filled from the merged bucket starts or keys as a build fills it: the same
arrays, bit for bit. An old item's tag is read from its code where the merge reads the code
(hashed tables), else cut from its old tag (its first bits: more items, narrower tags), else
read from its code (fewer items across a power of two, or an old table saved with no tag).
Its random reads are one ``remap`` load per old item and table, against
the counting sort's two random passes, and it is prefetched (:data:`MERGE_PREFETCH`); 10M
items, one thread: 0.48x a build's CPU time with 2M new items, 0.26x with 100k
(bench/RESULTS.md section 35).
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from bucketsearch.index._jit import ctz64, njit, popcount64, prefetch
from bucketsearch.index.item_table import (FILTER_BITS_PER_CODE, SLOTS_PER_CODE,
                                           filter_word_bits, home_and_fingerprint, slot_layout)
from bucketsearch.index.pool import run_lanes
from bucketsearch.index.radix import id_keys, increasing, sort_pairs
from bucketsearch.index.table import HASH_MULTIPLIER

DIRECT_MAX_BITS = 24
#: a direct table is chosen while its ``2^w`` starts are at most this many per distinct value
#: (4 bytes each: at most 32 bytes per distinct value, against 7.5 hashed; a lookup is then one
#: load instead of the filter, a slot and the item's code)
DIRECT_PER_DISTINCT = 8
#: counting sort by value while ``2^w`` is at most this many times ``n`` (the histogram's size)
COUNTING_MAX_FACTOR = 4
#: old table entries ahead whose merged row (``remap``) a merge prefetches
MERGE_PREFETCH = 32
#: at most this many bits of a table's entries hold its tag (module docstring)
TAG_MAX_BITS = 16
#: columns of ``tables``: direct or hashed, the offset of its starts (direct) or slots (hashed)
#: in the concatenated arrays, the slot count, the filter's offset and word count, the
#: fingerprint bits, the one-word substring shift and mask, the substring's first bit and
#: width; the bits of an entry's row, the tag's width, first bit and one-word shift. Tables
#: saved with the first 10 columns (no tag) are read by :func:`with_tag_columns`.
(T_DIRECT, T_BASE, T_SLOTS, T_BITMAP, T_BITMAP_WORDS, T_FP_BITS, T_SHIFT, T_MASK, T_START,
 T_WIDTH, T_ROW_BITS, T_TAG_BITS, T_TAG_START, T_TAG_SHIFT) = range(14)
T_COLUMNS = 14
UNTAGGED_COLUMNS = 10


def position_dtype(n: int) -> type:
    """Positions (and bucket starts) of a table over ``n`` items: uint32 below 2^32."""
    return np.uint32 if n < 2**32 else np.uint64


@njit(inline="always")
def substring_of(words, p, start, width, word_width):
    """Substring ``[start, start + width)`` (bits read most significant first, ``width`` <= 64)
    of row ``p`` of ``words``, whose word ``w`` holds ``word_width[w]`` bits."""
    W = words.shape[1]
    if W == 1:
        ww = word_width[0]
        val = words[p, 0] >> np.uint64(ww - start - width)
        if width < 64:
            val &= (np.uint64(1) << np.uint64(width)) - np.uint64(1)
        return val
    e = start + width
    val = np.uint64(0)
    w = start // 64
    while w * 64 < e and w < W:
        ww = word_width[w]
        a = max(start, w * 64)
        b = min(e, w * 64 + ww)
        if b > a:
            seg = words[p, w] >> np.uint64(ww - (b - w * 64))
            nb = b - a
            if nb < 64:
                seg &= (np.uint64(1) << np.uint64(nb)) - np.uint64(1)
                val = (val << np.uint64(nb)) | seg
            else:
                val = seg
        w += 1
    return val


@njit(inline="always")
def row_mask(tables):
    """The row bits of a table entry (``entry & row_mask``; the tag is ``entry >> row_bits``)."""
    return (np.uint64(1) << np.uint64(tables[0, T_ROW_BITS])) - np.uint64(1)


@njit(inline="always")
def code_tag(code, j, tables):
    """Table ``j``'s tag of the one-word ``code``: its ``T_TAG_BITS`` bits from
    ``T_TAG_START`` (0 when the table has no tag)."""
    tb = np.uint64(tables[j, T_TAG_BITS])
    return (code >> np.uint64(tables[j, T_TAG_SHIFT])) & ((np.uint64(1) << tb) - np.uint64(1))


@njit(inline="always")
def tag_distance(entry, rb, qtag):
    """Bits in which the tag of ``entry`` (above its ``rb`` row bits) differs from the query's
    tag ``qtag``: a lower bound on the item's distance outside the table's substring."""
    return popcount64((np.uint64(entry) >> rb) ^ qtag)


@njit(inline="always")
def tag_fields(j, tables):
    """``(shift, mask, row_bits)`` of table ``j``'s tags, uint64, read once before a loop
    (:func:`tagged` with the table's columns read per item measured 6x slower a counting
    sort at 10M): a tag is ``(code >> shift) & mask``, 0 without tag bits."""
    tb = np.uint64(tables[j, T_TAG_BITS])
    return (np.uint64(tables[j, T_TAG_SHIFT]), (np.uint64(1) << tb) - np.uint64(1),
            np.uint64(tables[j, T_ROW_BITS]))


@njit(inline="always")
def tagged(row, code, fields):
    """The entry of the item at ``row`` whose one-word code is ``code``, in the table of
    :func:`tag_fields` ``fields``: ``row | tag << row_bits``."""
    shift, mask, rb = fields
    return np.uint64(row) | (((np.uint64(code) >> shift) & mask) << rb)


@njit(inline="always")
def item_substring(words, p, j, tables, word_width):
    """Substring ``j`` of item ``p`` (one-word codes: a shift and a mask)."""
    if words.shape[1] == 1:
        return (words[p, 0] >> np.uint64(tables[j, T_SHIFT])) & np.uint64(tables[j, T_MASK])
    return substring_of(words, p, tables[j, T_START], tables[j, T_WIDTH], word_width)


@njit
def next_end(ends, g):
    """The first set bit of ``ends`` at or after bit ``g`` (a table's last position is always
    set, so the search stops within the table). The kernels write it out."""
    wi = g >> 6
    w = ends[wi] >> np.uint64(g & 63)
    if w != np.uint64(0):
        return g + np.int64(ctz64(w))
    wi += 1
    while ends[wi] == np.uint64(0):
        wi += 1
    return (wi << 6) + np.int64(ctz64(ends[wi]))


@njit
def bucket(key, j, tables, starts, slots, bitmap, positions, ends, words, word_width):
    """Bucket of substring value ``key`` in table ``j``: ``(lo, hi)``, positions in the
    table's run of ``positions`` (add ``j * n``); ``lo == hi`` when no item has it. Hashed: a
    fingerprint match is confirmed by the substring of the item at ``lo``, and ``hi`` is one
    past the next end bit (:func:`next_end`; table ``j``'s bits from
    :func:`ends_bit_base`)."""
    n = words.shape[0]
    if tables[j, T_DIRECT]:
        s = tables[j, T_BASE] + np.int64(key)
        return np.int64(starts[s]), np.int64(starts[s + 1])
    h = key * HASH_MULTIPLIER
    f, fbits = filter_word_bits(h, tables[j, T_BITMAP_WORDS])
    if bitmap[tables[j, T_BITMAP] + np.int64(f)] & fbits != fbits:
        return np.int64(0), np.int64(0)
    base = tables[j, T_BASE]
    n_slots = np.uint64(tables[j, T_SLOTS])
    fpb = np.uint64(tables[j, T_FP_BITS])
    sl, fp = home_and_fingerprint(h, n_slots, fpb)
    fp_mask = (np.uint64(1) << fpb) - np.uint64(1)
    pb = j * n
    eb = 0
    for jj in range(j):
        if not tables[jj, T_DIRECT]:
            eb += 64 * ((n + 63) // 64)
    while True:
        e = np.uint64(slots[base + np.int64(sl)])
        if e == np.uint64(0):
            return np.int64(0), np.int64(0)
        if (e & fp_mask) == fp:
            lo = np.int64(e >> fpb) - 1
            p = np.int64(np.uint64(positions[pb + lo]) & row_mask(tables))
            if item_substring(words, p, j, tables, word_width) == key:
                return lo, next_end(ends, eb + lo) - eb + 1
        sl += np.uint64(1)
        if sl == n_slots:
            sl = np.uint64(0)


@njit
def _all_substrings(words, j, tables, word_width):
    """Substring ``j`` of every row of ``words``, in row order."""
    n = words.shape[0]
    out = np.empty(n, dtype=np.uint64)
    for i in range(n):
        out[i] = item_substring(words, i, j, tables, word_width)
    return out


@njit
def _inverse_dense(ids, lo, out):
    """``out[ids[p] - lo] = p`` for every position ``p`` (``out`` filled with ``n`` before):
    the positions in id order when the ids are ``lo .. lo + n - 1`` in some order; False (and
    ``out`` unfinished) on an id out of that range or seen twice."""
    n = len(ids)
    for p in range(n):
        k = ids[p] - lo
        if k < 0 or k >= n or out[k] != n:
            return False
        out[k] = p
    return True


def ids_order_words(words: np.ndarray, ids: np.ndarray) -> np.ndarray | None:
    """``words`` when they are in ascending id order (``ids`` increase: a build's input, before
    its sort), else None: the ``id_words`` of :func:`build_tables`."""
    if len(ids) < 2 or not increasing(np.ascontiguousarray(ids, dtype=np.int64)):
        return None
    return np.ascontiguousarray(words, dtype=np.uint64)


def positions_by_id(ids: np.ndarray, dtype) -> np.ndarray:
    """The positions ``0..n-1`` of ``ids`` in ascending id order (``dtype``), empty when the
    ids already increase with the positions: one scatter when the ids are consecutive
    integers in some order (:func:`_inverse_dense`, a build's usual ids), else the radix
    sort of the ids (:func:`bucketsearch.index.radix.sort_pairs`)."""
    n = len(ids)
    if increasing(ids):
        return np.zeros(0, dtype=dtype)
    lo = int(ids.min())
    if int(ids.max()) - lo == n - 1:
        out = np.full(n, n, dtype=dtype)
        if _inverse_dense(ids, np.int64(lo), out):
            return out
    return sort_pairs(id_keys(ids), np.arange(n, dtype=dtype))[1]


@njit
def _gather_rows(words, order):
    """``words[order]`` (the rows in the order of the positions ``order``)."""
    n, W = len(order), words.shape[1]
    out = np.empty((n, W), dtype=words.dtype)
    for i in range(n):
        p = np.int64(order[i])
        for w in range(W):
            out[i, w] = words[p, w]
    return out


@njit
def _counting_sort(id_words, j, tables, word_width, counts, out, by_id):
    """Entries into ``out`` ordered by (substring ``j``, id): ``id_words`` are the items'
    codes in id order, ``by_id`` their positions (None: the identity, ids increasing with
    positions); read front to back, the scatter stable, each entry tagged (:func:`tagged`).
    ``counts`` (``2^w + 1`` zeros, the position dtype) becomes the bucket starts by value.
    Returns the number of distinct values. (``by_id`` None, not empty: Numba then compiles
    one scatter loop without the other; a row chosen per item, or both loops in one
    function, measured 6-7x slower a scatter at 10M.)"""
    n = id_words.shape[0]
    for i in range(n):
        counts[item_substring(id_words, i, j, tables, word_width) + np.uint64(1)] += 1
    distinct = 0
    for c in range(1, len(counts)):
        if counts[c] != 0:
            distinct += 1
        counts[c] += counts[c - 1]
    fields = tag_fields(j, tables)
    if by_id is None:
        for i in range(n):
            s = item_substring(id_words, i, j, tables, word_width)
            t = counts[s]
            out[t] = tagged(i, id_words[i, 0], fields)
            counts[s] = t + 1
    else:
        for i in range(n):
            s = item_substring(id_words, i, j, tables, word_width)
            t = counts[s]
            out[t] = tagged(by_id[i], id_words[i, 0], fields)
            counts[s] = t + 1
    # counts[s] is now the end of value s's bucket, the start of s + 1's: shift back one
    for c in range(len(counts) - 1, 0, -1):
        counts[c] = counts[c - 1]
    counts[0] = 0
    return distinct


@njit
def _tag_entries(id_words, by_id, j, tables, out):
    """``out[i]``: table ``j``'s entry of the ``i``-th item in id order (row ``by_id[i]``, or
    ``i`` when ``by_id`` is None), whose code is ``id_words[i]`` (:func:`tagged`)."""
    fields = tag_fields(j, tables)
    if by_id is None:
        for i in range(id_words.shape[0]):
            out[i] = tagged(i, id_words[i, 0], fields)
    else:
        for i in range(id_words.shape[0]):
            out[i] = tagged(by_id[i], id_words[i, 0], fields)


@njit
def _run_count(sorted_keys):
    distinct = 0
    for i in range(len(sorted_keys)):
        if i == 0 or sorted_keys[i] != sorted_keys[i - 1]:
            distinct += 1
    return distinct


@njit(inline="always")
def _set_bit(bits, g):
    bits[g >> 6] |= np.uint64(1) << np.uint64(g & 63)


def ends_words(n: int) -> int:
    """uint64 words of one hashed table's end bits (``n`` bits, whole words)."""
    return (n + 63) // 64


def ends_bit_base(tables: np.ndarray, j: int, n: int) -> int:
    """The first bit of table ``j``'s end bits in ``ends``: ``64 * ends_words(n)`` per hashed
    table before it (the kernels keep the same sum as they go through the tables)."""
    return 64 * ends_words(n) * int((tables[:j, T_DIRECT] == 0).sum())


@njit
def _fill_from_sorted(sorted_keys, slots, fp_bits, bitmap, ends):
    """The hashed lookup of a table whose substring values in table order are
    ``sorted_keys``: every run's start into the slots (linear probing), its value into the
    filter and its last position into the table's end bits ``ends``."""
    n_slots = np.uint64(len(slots))
    fpb = np.uint64(fp_bits)
    n = len(sorted_keys)
    for lo in range(n):
        key = sorted_keys[lo]
        if lo + 1 == n or sorted_keys[lo + 1] != key:
            _set_bit(ends, lo)
        if lo > 0 and key == sorted_keys[lo - 1]:
            continue
        h = key * HASH_MULTIPLIER
        f, bits = filter_word_bits(h, len(bitmap))
        bitmap[f] |= bits
        s, fp = home_and_fingerprint(h, n_slots, fpb)
        while slots[s] != 0:
            s += np.uint64(1)
            if s == n_slots:
                s = np.uint64(0)
        slots[s] = ((np.uint64(lo) + np.uint64(1)) << fpb) | fp


@njit
def _fill_from_starts(counts, slots, fp_bits, bitmap, ends):
    """:func:`_fill_from_sorted` from a counting sort's bucket starts by value."""
    n_slots = np.uint64(len(slots))
    fpb = np.uint64(fp_bits)
    for v in range(len(counts) - 1):
        lo = counts[v]
        if counts[v + 1] == lo:
            continue
        _set_bit(ends, np.int64(counts[v + 1]) - 1)
        h = np.uint64(v) * HASH_MULTIPLIER
        f, bits = filter_word_bits(h, len(bitmap))
        bitmap[f] |= bits
        s, fp = home_and_fingerprint(h, n_slots, fpb)
        while slots[s] != 0:
            s += np.uint64(1)
            if s == n_slots:
                s = np.uint64(0)
        slots[s] = ((np.uint64(lo) + np.uint64(1)) << fpb) | fp


def is_direct(width: int, distinct: int) -> bool:
    return width <= 16 or (width <= DIRECT_MAX_BITS
                           and (1 << width) <= DIRECT_PER_DISTINCT * max(distinct, 1))


def row_bits(n: int) -> int:
    """Bits of a row number below ``n`` in a table entry."""
    return max(1, int(n).bit_length())


def table_rows(bits: int, starts: np.ndarray, widths: np.ndarray, n: int) -> np.ndarray:
    """``tables`` of ``n`` items with the substring columns set (one-word shift and mask,
    first bit, width) and the tag columns (module docstring): table ``j`` < ``m - 1`` tags
    the bits after its substring, the last table the code's first bits, as many as its
    entries' spare bits hold (at most :data:`TAG_MAX_BITS`; none for codes over 64 bits)."""
    m = len(widths)
    tables = np.zeros((m, T_COLUMNS), dtype=np.int64)
    word0 = min(bits, 64)
    rb = row_bits(n)
    spare = 8 * np.dtype(position_dtype(n)).itemsize - rb
    for j in range(m):
        w, s = int(widths[j]), int(starts[j])
        tables[j, T_START], tables[j, T_WIDTH] = s, w
        tables[j, T_ROW_BITS] = rb
        if bits <= 64:
            tables[j, T_SHIFT] = word0 - s - w
            tables[j, T_MASK] = np.int64(np.uint64((1 << w) - 1).view(np.int64))
            tag_start, room = (s + w, bits - s - w) if j < m - 1 else (0, s)
            tb = min(spare, TAG_MAX_BITS, room)
            if tb > 0:
                tables[j, T_TAG_BITS], tables[j, T_TAG_START] = tb, tag_start
                tables[j, T_TAG_SHIFT] = word0 - tag_start - tb
    return tables


def with_tag_columns(tables: np.ndarray, n: int) -> np.ndarray:
    """``tables`` saved before the tags (:data:`UNTAGGED_COLUMNS` columns: entries are rows)
    with the tag columns added, no tag; others as they are."""
    if tables.shape[1] != UNTAGGED_COLUMNS:
        return tables
    out = np.zeros((tables.shape[0], T_COLUMNS), dtype=np.int64)
    out[:, :UNTAGGED_COLUMNS] = tables
    out[:, T_ROW_BITS] = row_bits(n)
    return out


class SubstringTables:
    """The tables of one multi-index (module docstring): ``positions``, ``starts``, ``slots``,
    ``bitmap``, ``tables`` and ``ends`` (arrays), ``distinct`` per table (metadata)."""

    ARRAYS = ("positions", "starts", "slots", "bitmap", "tables", "ends")

    def __init__(self, positions, starts, slots, bitmap, tables, ends, distinct):
        self.positions, self.starts, self.slots = positions, starts, slots
        self.bitmap, self.tables, self.ends = bitmap, tables, ends
        self.distinct = [int(d) for d in distinct]

    def arrays(self) -> dict:
        return {name: getattr(self, name) for name in self.ARRAYS}

    def rows(self, j: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Table ``j``'s entries ``lo:hi`` as rows of the items (int64; tags removed)."""
        n = len(self.positions) // max(1, len(self.tables))
        hi = n if hi is None else hi
        rb = int(self.tables[0, T_ROW_BITS])
        part = self.positions[j * n + lo:j * n + hi].astype(np.int64)
        return part & ((1 << rb) - 1)

    @property
    def direct(self) -> list[bool]:
        return [bool(d) for d in self.tables[:, T_DIRECT]]

    def lookup_args(self) -> tuple:
        """``tables, starts, slots, bitmap, positions, ends``: the arguments of :func:`bucket`
        after the key and the table number (then ``words`` and ``word_width``)."""
        return self.tables, self.starts, self.slots, self.bitmap, self.positions, self.ends

    def memory_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())


def _lookup_of(w: int, nd: int, counts, keys, n: int, pdt, slot_dtype, fp_bits) -> tuple:
    """A table's lookup from its ``nd`` distinct values and either the bucket starts by value
    ``counts`` (``2^w + 1``) or the substring values in table order ``keys`` (the other
    None): ``(nd, starts)`` when direct (:func:`is_direct`), else ``(nd, slots, bitmap,
    ends)`` filled in ascending value order (so the same slots from either input)."""
    if is_direct(w, nd):
        if counts is None:
            counts = np.zeros((1 << w) + 1, dtype=pdt)
            _histogram(keys, counts)
            np.cumsum(counts, out=counts)
        return nd, counts
    slots = np.zeros(max(2, math.ceil(SLOTS_PER_CODE * nd)), dtype=slot_dtype)
    bitmap = np.zeros(max(1, math.ceil(FILTER_BITS_PER_CODE * nd / 64)), dtype=np.uint64)
    ends = np.zeros(ends_words(n), dtype=np.uint64)
    if keys is not None:
        _fill_from_sorted(keys, slots, fp_bits, bitmap, ends)
    else:
        _fill_from_starts(counts, slots, fp_bits, bitmap, ends)
    return nd, slots, bitmap, ends


def _counts_fit(w: int, n: int) -> bool:
    """A table of ``w``-bit substrings over ``n`` items is sorted by counting (its bucket
    starts by value kept while it is built): ``2^w <= COUNTING_MAX_FACTOR * n``."""
    return (1 << w) <= COUNTING_MAX_FACTOR * max(n, 1) and w <= 32


def _build_table(j: int, words, id_words, by_id, tables, word_width, out, slot_dtype,
                 fp_bits) -> tuple:
    """Table ``j``: its positions into ``out`` and its lookup, ``(distinct, starts)`` of a
    direct table or ``(distinct, slots, bitmap, ends)`` of a hashed one (module docstring)."""
    n = words.shape[0]
    pdt = out.dtype
    w = int(tables[j, T_WIDTH])
    counts = None
    if j == 0 and len(by_id) == 0:  # the leading bits, ids increasing: the items' order
        _tag_entries(words, None, j, tables, out)
        keys = _all_substrings(words, j, tables, word_width)
        nd = _run_count(keys)
    elif _counts_fit(w, n):
        counts = np.zeros((1 << w) + 1, dtype=pdt)
        nd = _counting_sort(id_words, j, tables, word_width, counts, out,
                            by_id if len(by_id) else None)
        keys = None
    else:
        entries = np.empty(n, dtype=pdt)
        _tag_entries(id_words, by_id if len(by_id) else None, j, tables, entries)
        keys, order = sort_pairs(_all_substrings(id_words, j, tables, word_width), entries)
        del entries
        out[:] = order
        del order
        nd = _run_count(keys)
    return _lookup_of(w, nd, counts, keys, n, pdt, slot_dtype, fp_bits)


def _assemble(built: list, tables: np.ndarray, positions: np.ndarray, pdt, slot_dtype,
              fp_bits) -> SubstringTables:
    """:class:`SubstringTables` of the per-table parts of :func:`_lookup_of`: the direct
    tables' starts, the hashed tables' slots, filters and end bits concatenated in table
    order, their offsets into ``tables``."""
    starts_parts, slot_parts, bitmap_parts, ends_parts, distinct = [], [], [], [], []
    n_starts = n_slots = n_bitmap = 0
    for j, part in enumerate(built):
        distinct.append(part[0])
        if len(part) == 2:
            tables[j, T_DIRECT] = 1
            tables[j, T_BASE] = n_starts
            starts_parts.append(part[1])
            n_starts += len(part[1])
            continue
        slots, bitmap = part[1], part[2]
        ends_parts.append(part[3])
        tables[j, T_BASE], tables[j, T_SLOTS] = n_slots, len(slots)
        tables[j, T_BITMAP], tables[j, T_BITMAP_WORDS] = n_bitmap, len(bitmap)
        tables[j, T_FP_BITS] = fp_bits
        slot_parts.append(slots)
        bitmap_parts.append(bitmap)
        n_slots += len(slots)
        n_bitmap += len(bitmap)
    built.clear()
    starts = (np.concatenate(starts_parts) if len(starts_parts) > 1
              else starts_parts[0] if starts_parts else np.zeros(1, pdt))
    slots = (np.concatenate(slot_parts) if len(slot_parts) > 1
             else slot_parts[0] if slot_parts else np.zeros(1, slot_dtype))
    bitmap = (np.concatenate(bitmap_parts) if len(bitmap_parts) > 1
              else bitmap_parts[0] if bitmap_parts else np.zeros(1, np.uint64))
    ends = (np.concatenate(ends_parts) if len(ends_parts) > 1
            else ends_parts[0] if ends_parts else np.zeros(0, np.uint64))
    if len(ends) == 0:
        ends = np.zeros(1, np.uint64)
    return SubstringTables(positions, starts, slots, bitmap, tables, ends, distinct)


def build_tables(bits: int, words: np.ndarray, ids: np.ndarray, sub_starts: np.ndarray,
                 sub_widths: np.ndarray, word_width: np.ndarray, threads: int = 1,
                 id_words: np.ndarray | None = None) -> SubstringTables:
    """The substring tables of ``words`` sorted by (code, id) (see the module docstring); the
    tables are built on up to ``threads`` threads at once (the same tables on any number).
    ``id_words``: the same codes in ascending id order, if the caller has them (else they are
    gathered)."""
    n = words.shape[0]
    m = len(sub_widths)
    tables = table_rows(bits, sub_starts, sub_widths, n)
    pdt = position_dtype(n)
    positions = np.empty(m * n, dtype=pdt)
    # the positions in id order, unless the ids increase with them, and the codes in that
    # order (one gather): every table's pass then reads its input front to back
    by_id = positions_by_id(ids, pdt)
    if len(by_id) == 0:
        id_words = words
    elif id_words is None:
        id_words = _gather_rows(words, by_id)
    slot_dtype, fp_bits = slot_layout(n)
    built = run_lanes([partial(_build_table, j, words, id_words, by_id, tables, word_width,
                               positions[j * n:(j + 1) * n], slot_dtype, fp_bits)
                       for j in range(m)], threads)
    del id_words, by_id
    return _assemble(built, tables, positions, pdt, slot_dtype, fp_bits)


# ----------------------------------------------------------------------- merge
@njit
def _remap_kernel(old_ids, dropped, ids, remap, delta_rows):
    """One pass over the merged items ``ids`` and the old items ``old_ids`` (both in (code,
    id) order; the old ones kept appear in the merged ones in the same order, the others are
    new): ``remap[p]`` = the merged row of old item ``p`` (``len(ids)`` when ``dropped[p]``),
    ``delta_rows`` = the merged rows of the new items, ascending. False when the merged items
    do not hold the kept old ones in order (nothing to reuse)."""
    n0, n = len(old_ids), len(ids)
    sentinel = n
    p = 0
    k = 0
    for r in range(n):
        while p < n0 and dropped[p]:
            remap[p] = sentinel
            p += 1
        if p < n0 and ids[r] == old_ids[p]:
            remap[p] = r
            p += 1
        else:
            if k == len(delta_rows):
                return False
            delta_rows[k] = r
            k += 1
    while p < n0:
        if not dropped[p]:
            return False
        remap[p] = sentinel
        p += 1
    return k == len(delta_rows)


def merge_remap(old_ids: np.ndarray, dropped: np.ndarray, ids: np.ndarray):
    """``(remap, delta_rows)`` of :func:`_remap_kernel` (the position dtype of the merged
    items: ``len(ids)`` marks a dropped item), or None when ``ids`` do not hold the kept old
    items in their order."""
    n = len(ids)
    d = n - (len(old_ids) - int(np.count_nonzero(dropped)))
    if d < 0:
        return None
    pdt = position_dtype(n + 1)
    remap = np.empty(len(old_ids), dtype=pdt)
    delta_rows = np.empty(d, dtype=pdt)
    if not _remap_kernel(np.ascontiguousarray(old_ids, np.int64), dropped, ids, remap,
                         delta_rows):
        return None
    return remap, delta_rows


@njit(inline="always")
def entry_row(entries, t, mask):
    """The row of ``entries[t]`` (its bits under ``mask``: :func:`row_mask`)."""
    return np.int64(np.uint64(entries[t]) & mask)


@njit
def _merge_table(j, tables, old_positions, old_mask, old_words, remap, delta_entries,
                 delta_keys, low, ids, word_width, out, counts, keys_out):
    """Table ``j`` of the merged items (``tables``) into ``out``: a linear merge of the old
    table's entries ``old_positions`` (in (substring, id) order; their rows ``entry &
    old_mask``, each mapped to its merged row by ``remap``, dropped ones, ``remap ==
    len(ids)``, skipped; its substring and tag read from ``old_words``) with the new items'
    entries ``delta_entries`` sorted by (substring ``delta_keys``, id); ids are read only to
    order an old item against a new item of the same substring whose row is set in the
    bitmap ``low`` (its id is below the largest old id: an upsert's; a bulk add's new ids
    are all above the old ones, so a bucket's new items follow its old ones). Each emitted
    item's substring goes into the histogram ``counts`` (``counts[s + 1] += 1``; when given)
    or ``keys_out`` (table order). Returns the number of items placed."""
    n0, d, n = len(old_positions), len(delta_entries), len(ids)
    by_count = len(counts) > 0
    mask = row_mask(tables)
    fields = tag_fields(j, tables)
    o = 0
    b = 0
    for t in range(n0):
        if t + MERGE_PREFETCH < n0:
            prefetch(remap, entry_row(old_positions, t + MERGE_PREFETCH, old_mask))
        p = entry_row(old_positions, t, old_mask)
        r = np.int64(remap[p])
        if r == n:
            continue
        key = item_substring(old_words, p, j, tables, word_width)
        while b < d:
            dk = delta_keys[b]
            if dk > key:
                break
            if dk == key:
                row = entry_row(delta_entries, b, mask)
                if not (len(low) and _has_bit(low, row) and ids[row] < ids[r]):
                    break
            out[o] = delta_entries[b]
            if by_count:
                counts[dk + np.uint64(1)] += 1
            else:
                keys_out[o] = dk
            o += 1
            b += 1
        out[o] = tagged(r, old_words[p, 0], fields)
        if by_count:
            counts[key + np.uint64(1)] += 1
        else:
            keys_out[o] = key
        o += 1
    while b < d:
        dk = delta_keys[b]
        out[o] = delta_entries[b]
        if by_count:
            counts[dk + np.uint64(1)] += 1
        else:
            keys_out[o] = dk
        o += 1
        b += 1
    return o


@njit
def _merge_direct_table(j, tables, old_tag_bits, old_positions, old_mask, old_words,
                        old_starts, remap, delta_entries, delta_keys, low, ids, out, starts):
    """:func:`_merge_table` of an old table that is direct, value by value: bucket ``v``
    of the merged table is old bucket ``v`` (``old_starts[v]:old_starts[v + 1]``, dropped
    items skipped) merged by id with the new items whose substring is ``v``; ``starts``
    (``2^w + 1``) gets the merged table's bucket starts as it goes (sequential writes, no
    histogram). Ids are read as in :func:`_merge_table` (``low``). An old item's tag is its
    old one's first bits (tags of ``old_tag_bits`` bits, as wide or wider), else read from
    ``old_words``. Returns the number of distinct values."""
    n, d, n0 = len(ids), len(delta_entries), len(old_positions)
    some_low = len(low) > 0
    mask = row_mask(tables)
    tb = tables[j, T_TAG_BITS]
    from_old = old_tag_bits >= tb and (old_tag_bits > 0 or tb == 0)
    cut = np.uint64(old_tag_bits - tb if from_old else 0)
    old_rb = np.uint64(ctz64(~old_mask))
    rb = np.uint64(tables[j, T_ROW_BITS])
    fields = tag_fields(j, tables)
    o = 0
    b = 0
    distinct = 0
    nv = len(old_starts) - 1
    for v in range(nv):
        starts[v] = o
        first = o
        key = np.uint64(v)
        for t in range(np.int64(old_starts[v]), np.int64(old_starts[v + 1])):
            if t + MERGE_PREFETCH < n0:
                prefetch(remap, entry_row(old_positions, t + MERGE_PREFETCH, old_mask))
            e = np.uint64(old_positions[t])
            p = np.int64(e & old_mask)
            r = np.int64(remap[p])
            if r == n:
                continue
            while some_low and b < d and delta_keys[b] == key \
                    and _has_bit(low, entry_row(delta_entries, b, mask)) \
                    and ids[entry_row(delta_entries, b, mask)] < ids[r]:
                out[o] = delta_entries[b]
                o += 1
                b += 1
            if from_old:
                out[o] = np.uint64(r) | (((e >> old_rb) >> cut) << rb)
            else:
                out[o] = tagged(r, old_words[p, 0], fields)
            o += 1
        while b < d and delta_keys[b] == key:
            out[o] = delta_entries[b]
            o += 1
            b += 1
        if o > first:
            distinct += 1
    starts[nv] = o
    return distinct


def _merged_table(j: int, tables, old: SubstringTables, old_words, remap, delta_rows,
                  delta_words, low, ids, word_width, out, slot_dtype, fp_bits) -> tuple:
    """Table ``j`` of the merged items by :func:`_merge_table` (the new items' substrings
    sorted here: ``delta_rows`` are in id order, ``delta_words`` their codes, so a stable
    sort by substring gives (substring, id)), then its lookup (:func:`_lookup_of`): the
    same as :func:`_build_table` of the merged items, bit for bit."""
    n, pdt = len(ids), out.dtype
    w = int(tables[j, T_WIDTH])
    dkeys = _all_substrings(delta_words, j, tables, word_width)
    dent = np.empty(len(delta_rows), dtype=pdt)
    _tag_entries(delta_words, delta_rows if len(delta_rows) else None, j, tables, dent)
    if len(dkeys) > 1:
        dkeys, dent = sort_pairs(dkeys, dent)
    n0 = old_words.shape[0]
    old_positions = old.positions[j * n0:(j + 1) * n0]
    old_mask = np.uint64((1 << int(old.tables[0, T_ROW_BITS])) - 1)
    if old.tables[j, T_DIRECT]:
        base = int(old.tables[j, T_BASE])
        old_starts = old.starts[base:base + (1 << w) + 1]
        starts = np.empty((1 << w) + 1, dtype=pdt)
        nd = _merge_direct_table(j, tables, int(old.tables[j, T_TAG_BITS]), old_positions,
                                 old_mask, old_words, old_starts, remap, dent, dkeys, low,
                                 ids, out, starts)
        if int(starts[-1]) != n:
            raise AssertionError(f"table {j}: the merge placed {int(starts[-1])} of {n} items")
        return _lookup_of(w, nd, starts, None, n, pdt, slot_dtype, fp_bits)
    by_count = _counts_fit(w, n)
    counts = np.zeros((1 << w) + 1 if by_count else 0, dtype=pdt)
    keys = np.empty(0 if by_count else n, dtype=np.uint64)
    filled = _merge_table(j, tables, old_positions, old_mask, old_words, remap, dent, dkeys,
                          low, ids, word_width, out, counts, keys)
    if filled != n:
        raise AssertionError(f"table {j}: the merge placed {filled} of {n} items")
    del dkeys, dent
    if by_count:
        nd = int(np.count_nonzero(counts[1:]))
        np.cumsum(counts, out=counts)
        return _lookup_of(w, nd, counts, None, n, pdt, slot_dtype, fp_bits)
    return _lookup_of(w, _run_count(keys), None, keys, n, pdt, slot_dtype, fp_bits)


@njit(inline="always")
def _has_bit(bits, g):
    return (bits[g >> 6] >> np.uint64(g & 63)) & np.uint64(1) != np.uint64(0)


@njit
def _low_rows(ids, delta_rows, delta_ids, n):
    """A bitmap of the merged rows (``n`` bits) set at the new items whose id is below the
    largest old id (the old items: the rows outside ``delta_rows``); empty when there is
    none (a bulk add of new ids)."""
    low = np.zeros((n + 63) // 64, dtype=np.uint64)
    for k in range(len(delta_rows)):  # mark the new rows, find the old items' largest id
        _set_bit(low, np.int64(delta_rows[k]))
    high = np.iinfo(np.int64).min
    for i in range(n):
        if not _has_bit(low, i) and ids[i] > high:
            high = ids[i]
    low[:] = 0
    some = False
    for k in range(len(delta_rows)):
        if delta_ids[k] < high:
            _set_bit(low, np.int64(delta_rows[k]))
            some = True
    return low if some else low[:0]


def merge_tables(bits: int, words: np.ndarray, ids: np.ndarray, old: SubstringTables,
                 old_words: np.ndarray, remap: np.ndarray, delta_rows: np.ndarray,
                 sub_starts: np.ndarray, sub_widths: np.ndarray, word_width: np.ndarray,
                 threads: int = 1) -> SubstringTables:
    """The tables of the merged items ``words`` / ``ids`` ((code, id) order) from the old
    items' tables ``old`` (over ``old_words``, the same substrings) without sorting them
    again: :func:`merge_remap`'s ``remap`` maps an old position to its merged row and
    ``delta_rows`` are the new items' rows; per table the new items are sorted (a radix
    sort of ``len(delta_rows)`` substrings) and merged with the old table's run in one pass
    (:func:`_merge_table`), then the lookup filled from the merged keys. Bit for bit the
    tables :func:`build_tables` makes of the merged items."""
    n = words.shape[0]
    m = len(sub_widths)
    tables = table_rows(bits, sub_starts, sub_widths, n)
    pdt = position_dtype(n)
    positions = np.empty(m * n, dtype=pdt)
    delta_rows = np.ascontiguousarray(delta_rows, dtype=pdt)
    delta_ids = ids[delta_rows]
    by_id = positions_by_id(delta_ids, pdt)
    if len(by_id):
        delta_rows, delta_ids = delta_rows[by_id], delta_ids[by_id]
    del by_id
    low = _low_rows(ids, delta_rows, delta_ids, n)
    del delta_ids
    delta_words = _gather_rows(words, delta_rows)
    slot_dtype, fp_bits = slot_layout(n)
    built = run_lanes([partial(_merged_table, j, tables, old, old_words, remap, delta_rows,
                               delta_words, low, ids, word_width,
                               positions[j * n:(j + 1) * n], slot_dtype, fp_bits)
                       for j in range(m)], threads)
    del delta_words, delta_rows, low
    return _assemble(built, tables, positions, pdt, slot_dtype, fp_bits)


@njit
def _ends_of(slots, tables, n, ends):
    """The end bits of every hashed table from its slots: each run's start ``lo`` is in one
    slot, so the run before it ends at ``lo - 1``, and the table's last run at ``n - 1``
    (a pass over the slots, no read of the items)."""
    g0 = 0
    for j in range(tables.shape[0]):
        if tables[j, T_DIRECT]:
            continue
        fpb = np.uint64(tables[j, T_FP_BITS])
        base = tables[j, T_BASE]
        for s in range(base, base + tables[j, T_SLOTS]):
            e = np.uint64(slots[s])
            if e == np.uint64(0):
                continue
            lo = np.int64(e >> fpb) - 1
            if lo > 0:
                _set_bit(ends, g0 + lo - 1)
        if n > 0:
            _set_bit(ends, g0 + n - 1)
        g0 += 64 * ((n + 63) // 64)


def bucket_ends(slots: np.ndarray, tables: np.ndarray, n: int) -> np.ndarray:
    """``ends`` of tables built without them (snapshots before the end bits): from the
    hashed tables' slots (:func:`_ends_of`)."""
    hashed = int((tables[:, T_DIRECT] == 0).sum())
    ends = np.zeros(max(1, hashed * ends_words(n)), dtype=np.uint64)
    _ends_of(slots, tables, n, ends)
    return ends


@njit
def _histogram(keys, counts):
    for i in range(len(keys)):
        counts[keys[i] + np.uint64(1)] += 1


@njit
def table_values_at(words, positions, j, tables, word_width, at):
    """Table ``j``'s substring values at its positions ``at`` (a sample of the table)."""
    n = words.shape[0]
    mask = row_mask(tables)
    out = np.empty(len(at), dtype=np.uint64)
    for k in range(len(at)):
        p = np.int64(np.uint64(positions[j * n + at[k]]) & mask)
        out[k] = item_substring(words, p, j, tables, word_width)
    return out


@njit
def _table_values(words, positions, j, tables, word_width):
    n = words.shape[0]
    mask = row_mask(tables)
    out = np.empty(n, dtype=np.uint64)
    for t in range(n):
        out[t] = item_substring(words, np.int64(np.uint64(positions[j * n + t]) & mask), j,
                                tables, word_width)
    return out


@njit
def run_sizes(words, positions, j, tables, word_width, at):
    """Items in the bucket of each table-``j`` position of ``at`` (a table's positions are in
    (substring, id) order, so a bucket is a run of equal substrings): a galloping search each
    way from the position, O(log bucket size) reads, no pass over the items."""
    n = words.shape[0]
    pb = j * n
    mask = row_mask(tables)
    out = np.empty(len(at), dtype=np.int64)
    for k in range(len(at)):
        t = np.int64(at[k])
        key = item_substring(words, entry_row(positions, pb + t, mask), j, tables, word_width)
        inner, outer, step = t, np.int64(-1), np.int64(1)  # run starts in (outer, inner]
        while t - step >= 0:
            c = t - step
            if item_substring(words, entry_row(positions, pb + c, mask), j, tables,
                              word_width) < key:
                outer = c
                break
            inner = c
            step *= 2
        lo, hi = outer + 1, inner
        while lo < hi:
            mid = (lo + hi) >> 1
            if item_substring(words, entry_row(positions, pb + mid, mask), j, tables,
                              word_width) < key:
                lo = mid + 1
            else:
                hi = mid
        first = lo
        inner, outer, step = t, np.int64(n), np.int64(1)  # run ends in [inner + 1, outer]
        while t + step < n:
            c = t + step
            if item_substring(words, entry_row(positions, pb + c, mask), j, tables,
                              word_width) > key:
                outer = c
                break
            inner = c
            step *= 2
        lo, hi = inner + 1, outer
        while lo < hi:
            mid = (lo + hi) >> 1
            if item_substring(words, entry_row(positions, pb + mid, mask), j, tables,
                              word_width) <= key:
                lo = mid + 1
            else:
                hi = mid
        out[k] = lo - first
    return out


def distinct_values(tables: SubstringTables, words: np.ndarray, j: int,
                    word_width: np.ndarray) -> np.ndarray:
    """The distinct substring values of table ``j``, ascending (a copy made on demand): a
    direct table's from its bucket starts (``2^w`` reads, no pass over the items)."""
    if tables.tables[j, T_DIRECT]:
        base, width = int(tables.tables[j, T_BASE]), int(tables.tables[j, T_WIDTH])
        starts = np.asarray(tables.starts[base:base + (1 << width) + 1])
        return np.flatnonzero(starts[1:] > starts[:-1]).astype(np.uint64)
    values = _table_values(words, tables.positions, j, tables.tables, word_width)
    if len(values) == 0:
        return values
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]
