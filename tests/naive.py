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
    :func:`index.radix.sort_codes_ids` (``np.lexsort``, the last key primary)."""
    order = np.lexsort((ids, codes))
    return codes[order], ids[order]
