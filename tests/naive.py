"""Plain-numpy twins of the engine kernels: slow, obviously correct, used as test oracles.

Distances come from ``np.unpackbits``-style bit arrays, never from the code under test.
"""
from __future__ import annotations

import math

import numpy as np

from bucketsearch.index.codes import unpack_words


def hamming_matrix(xq_words: np.ndarray, xb_words: np.ndarray, bits: int) -> np.ndarray:
    """(nq, nb) Hamming distances by comparing unpacked bit arrays."""
    q = unpack_words(xq_words, bits).astype(bool)
    b = unpack_words(xb_words, bits).astype(bool)
    return (q[:, None, :] != b[None, :, :]).sum(axis=2)


def range_search(xq, xb, ids, bits, max_distance):
    """(lims, D, I), each query's hits ordered by (distance, id)."""
    dist = hamming_matrix(xq, xb, bits)
    lims, D, I = [0], [], []
    for row in dist:
        sel = np.flatnonzero(row <= max_distance)
        order = np.lexsort((ids[sel], row[sel]))
        D.extend(row[sel][order])
        I.extend(ids[sel][order])
        lims.append(len(I))
    return np.array(lims), np.array(D, dtype=np.int64), np.array(I, dtype=np.int64)


def knn(xq, xb, ids, bits, k):
    """(D, I) of shape (nq, k) ordered by (distance, id), padded with -1."""
    dist = hamming_matrix(xq, xb, bits)
    D = np.full((len(xq), k), -1)
    I = np.full((len(xq), k), -1)
    for qi, row in enumerate(dist):
        order = np.lexsort((ids, row))[:k]
        D[qi, :len(order)] = row[order]
        I[qi, :len(order)] = ids[order]
    return D, I


def per_radius_counts(xq, xb, bits, max_radius):
    """Per query and radius r: probes C(Q, r), non-empty buckets (distinct codes at distance
    exactly r) and items at distance exactly r."""
    dist = hamming_matrix(xq, xb, bits)
    uniq, first = np.unique(xb, axis=0, return_index=True)
    udist = hamming_matrix(xq, uniq, bits)
    probes = np.array([[math.comb(bits, r) for r in range(max_radius + 1)]] * len(xq))
    nonempty = np.stack([(udist == r).sum(axis=1) for r in range(max_radius + 1)], axis=1)
    items = np.stack([(dist == r).sum(axis=1) for r in range(max_radius + 1)], axis=1)
    return probes, nonempty, items


def knn_within(xq, xb, ids, bits, k, max_distance):
    """Top-k within a radius: :func:`knn` with every entry farther than ``max_distance``
    replaced by the padding (id -1, distance -1)."""
    D, I = knn(xq, xb, ids, bits, k)
    far = D > max_distance
    D[far], I[far] = -1, -1
    return D, I


def sort_codes_ids(codes: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One-word codes and their ids ordered by (code, id): the twin of
    :func:`bucketsearch.index.radix.sort_codes_ids` (``np.lexsort``, the last key primary)."""
    order = np.lexsort((ids, codes))
    return codes[order], ids[order]


# --- self-join (index/join.py, index/join_kernels.py) ---------------------------------------
def join_pairs(ids, words, bits, radius):
    """Every pair ``(a, b, d)`` of items with ``a < b`` (ids) and ``d <= radius``, sorted by
    (a, b): all ``n^2`` distances from unpacked bits."""
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) == 0:
        return []
    dist = hamming_matrix(words, words, bits)
    out = []
    for i, j in zip(*np.nonzero(dist <= radius)):
        if ids[i] < ids[j]:
            out.append((int(ids[i]), int(ids[j]), int(dist[i, j])))
    return sorted(out)


def cross_pairs(ids_l, words_l, ids_r, words_r, bits, radius):
    """Every pair of one left and one right item within ``radius`` as ``(min id, max id, d)``,
    sorted: all ``n_l x n_r`` distances from unpacked bits."""
    if len(ids_l) == 0 or len(ids_r) == 0:
        return []
    dist = hamming_matrix(words_l, words_r, bits)
    return sorted((min(int(ids_l[i]), int(ids_r[j])), max(int(ids_l[i]), int(ids_r[j])),
                   int(dist[i, j])) for i, j in zip(*np.nonzero(dist <= radius)))


def block_table_pairs(words, bits, radius, masks, t):
    """Pairs of rows ``(x, y, d)``, ``x < y``, that block table ``t`` emits: within ``radius``,
    equal on ``masks[t]``, and on no earlier table's mask (bits compared one by one)."""
    b = unpack_words(words, bits).astype(bool)
    m = unpack_words(np.asarray(masks, dtype=np.uint64), bits).astype(bool)
    out = []
    for x in range(len(b)):
        for y in range(x + 1, len(b)):
            diff = b[x] != b[y]
            agree = [not (diff & m[s]).any() for s in range(len(m))]
            if int(diff.sum()) <= radius and agree[t] and not any(agree[:t]):
                out.append((x, y, int(diff.sum())))
    return sorted(out)


def table_hash(words, mask):
    """:func:`bucketsearch.index.table.hash_words` of ``words & mask`` in numpy's wrapping
    uint64."""
    C = np.uint64(0x9E3779B97F4A7C15)
    masked = np.asarray(words, dtype=np.uint64) & np.asarray(mask, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = masked[:, 0] * C
        for w in range(1, masked.shape[1]):
            h = (h ^ (h >> np.uint64(31)) ^ masked[:, w]) * C
    return h


def components(ids, pairs):
    """Label = smallest id of the connected component (graph search over a dict)."""
    ids = sorted(int(i) for i in ids)
    adj = {i: [] for i in ids}
    for a, b, *_ in pairs:
        adj[int(a)].append(int(b))
        adj[int(b)].append(int(a))
    label = {}
    for i in ids:
        if i in label:
            continue
        stack, comp = [i], []
        label[i] = i
        while stack:
            x = stack.pop()
            comp.append(x)
            for y in adj[x]:
                if y not in label:
                    label[y] = i
                    stack.append(y)
    return np.array(ids, dtype=np.int64), np.array([label[i] for i in ids], dtype=np.int64)


def keep_first(ids, pairs):
    """The greedy rule by its definition: items in id order; an item is kept unless a kept
    item with a lower id lies within the radius (is paired with it)."""
    near = {}
    for a, b, *_ in pairs:
        near.setdefault(int(b), set()).add(int(a))
    kept = []
    for i in sorted(int(x) for x in ids):
        if not near.get(i, set()) & set(kept):
            kept.append(i)
    return np.array(kept, dtype=np.int64)


# --- builds (index/radix.py, index/item_table.py, index/mih_tables.py) ----------------------
def stable_sort_pairs(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Twin of :func:`bucketsearch.index.radix.sort_pairs`: numpy's stable sort."""
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def repeated_id(ids) -> int | None:
    """Twin of :func:`bucketsearch.index.radix.repeated_id`: the smallest id counted twice."""
    uniq, counts = np.unique(np.asarray(ids, dtype=np.int64), return_counts=True)
    return int(uniq[counts > 1][0]) if (counts > 1).any() else None


def positions_by_id(ids: np.ndarray) -> np.ndarray:
    """Twin of :func:`bucketsearch.index.mih_tables.positions_by_id` (the positions in id
    order; the kernel returns an empty array when that is the identity)."""
    return np.argsort(ids, kind="stable")


def fill_slots(codes: list[int], starts: list[int], n_slots: int, fp_bits: int,
               n_filter_words: int) -> tuple[list[int], list[int]]:
    """Twin of :func:`bucketsearch.index.item_table._fill_slots` for one-word codes (Python
    ints): each run start ``lo`` in order, hash ``h = code * 0x9E3779B97F4A7C15 mod 2^64``,
    home ``((h >> 32) * M) >> 32`` and fingerprint the top ``fp_bits`` bits of that product's
    low 32 bits, the first empty slot from home on (wrapping) gets ``(lo + 1) << fp_bits |
    fingerprint``; the filter word ``((h >> 32) * words) >> 32`` gets bits ``(h >> 20) % 64``,
    ``(h >> 26) % 64``, ``(h >> 32) % 64``."""
    slots, bitmap = [0] * n_slots, [0] * n_filter_words
    for lo in starts:
        h = (codes[lo] * 0x9E3779B97F4A7C15) % 2**64
        f = ((h >> 32) * n_filter_words) >> 32
        for shift in (20, 26, 32):
            bitmap[f] |= 1 << ((h >> shift) & 63)
        p = (h >> 32) * n_slots
        s, fp = p >> 32, (p & 0xFFFFFFFF) >> (32 - fp_bits)
        while slots[s]:
            s = (s + 1) % n_slots
        slots[s] = ((lo + 1) << fp_bits) | fp
    return slots, bitmap
