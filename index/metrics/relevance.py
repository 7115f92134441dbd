"""Ground-truth relevance between queries and database items, never materialized as nq x nb.

A :class:`Relevance` is one of three compact forms the histogram kernel reads on the fly:

* ``"class"``: 1-D class ids; item ``i`` is relevant to query ``q`` when the ids are equal
  (gain 1).
* ``"multihot"``: 2-D multi-hot label rows packed as uint64 bitsets; relevant when the rows
  share at least one label; the graded gain is the number of shared labels
  (``popcount(a & b)``).
* ``"csr"``: explicit relevant pairs per query in CSR form (``indptr``, sorted ``indices``,
  positive ``data`` gains). This is what a user-supplied graded matrix, a relevant-pairs list or
  an epsilon-ball ground truth become; they are explicit by nature.

Builders: :func:`from_labels`, :func:`from_graded_matrix`, :func:`from_pairs`,
:func:`from_features` (epsilon ball, with :func:`epsilon_from_features`). :func:`dense` expands
a small relevance to an ``(nq, nb)`` gain matrix (tests and tiny inputs only).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("class", "multihot", "csr")
MODE_CLASS, MODE_MULTIHOT, MODE_CSR = 0, 1, 2


@dataclass(frozen=True)
class Relevance:
    """Relevance of ``n_db`` database items to ``n_queries`` queries (see the module docstring)."""

    mode: str
    n_queries: int
    n_db: int
    query_labels: np.ndarray  # class: (nq,) int64; multihot: (nq, LW) uint64; csr: empty
    db_labels: np.ndarray     # class: (nb,) int64; multihot: (nb, LW) uint64; csr: empty
    indptr: np.ndarray        # csr: (nq + 1,) int64
    indices: np.ndarray       # csr: (nnz,) int64, sorted within each row
    data: np.ndarray          # csr: (nnz,) float64 gains > 0
    max_level: int            # largest integer graded gain (0 when gains are not integers)

    @property
    def mode_id(self) -> int:
        return MODES.index(self.mode)

    def subset_queries(self, rows: np.ndarray) -> "Relevance":
        """Relevance restricted to the queries ``rows`` (in that order)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.mode == "csr":
            starts, ends = self.indptr[rows], self.indptr[rows + 1]
            lengths = ends - starts
            indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            take = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]
                                  or [np.empty(0, np.int64)]).astype(np.int64)
            return Relevance("csr", len(rows), self.n_db, _EMPTY_I, _EMPTY_I, indptr,
                             self.indices[take], self.data[take], self.max_level)
        return Relevance(self.mode, len(rows), self.n_db, self.query_labels[rows],
                         self.db_labels, self.indptr, self.indices, self.data, self.max_level)


_EMPTY_I = np.empty(0, dtype=np.int64)
_EMPTY_F = np.empty(0, dtype=np.float64)
_EMPTY_PTR = np.zeros(1, dtype=np.int64)


def _labels_array(labels, name: str) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D class ids or a 2-D multi-hot matrix, "
                         f"got shape {arr.shape}")
    if not (arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer)):
        if np.issubdtype(arr.dtype, np.floating) and arr.size and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr


def _pack_multihot(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.size and not np.isin(arr, (0, 1)).all():
        bad = np.argwhere(~np.isin(arr, (0, 1)))[0]
        raise ValueError(f"{name} row {bad[0]} column {bad[1]}: value {arr[tuple(bad)]} is not "
                         "0 or 1 (a 2-D label matrix must be multi-hot)")
    n, n_labels = arr.shape
    lw = max(1, (n_labels + 63) // 64)
    padded = np.zeros((n, lw * 64), dtype=np.uint8)
    padded[:, :n_labels] = arr
    return np.ascontiguousarray(np.packbits(padded, axis=1).view(">u8").astype(np.uint64))


def from_labels(query_labels, db_labels) -> Relevance:
    """Relevance from class labels.

    1-D integer arrays: same class is relevant (gain 1). 2-D multi-hot ``{0,1}`` matrices with the
    same number of columns: sharing at least one label is relevant, graded gain = number of shared
    labels. Both arguments must have the same dimensionality.
    """
    ql = _labels_array(query_labels, "query labels")
    dl = _labels_array(db_labels, "db labels")
    if ql.ndim != dl.ndim:
        raise ValueError(f"query labels are {ql.ndim}-D but db labels are {dl.ndim}-D "
                         "(both must be 1-D class ids or both 2-D multi-hot)")
    if ql.ndim == 1:
        return Relevance("class", len(ql), len(dl), ql.astype(np.int64), dl.astype(np.int64),
                         _EMPTY_PTR, _EMPTY_I, _EMPTY_F, 1)
    if ql.shape[1] != dl.shape[1]:
        raise ValueError(f"multi-hot labels: queries have {ql.shape[1]} columns but the "
                         f"database has {dl.shape[1]}")
    qb = _pack_multihot(ql, "query labels")
    db = _pack_multihot(dl, "db labels")
    return Relevance("multihot", len(ql), len(dl), qb, db, _EMPTY_PTR, _EMPTY_I, _EMPTY_F,
                     int(ql.shape[1]))


def from_csr(indptr, indices, data, n_queries: int, n_db: int) -> Relevance:
    """Relevance from CSR rows (one per query); indices are sorted, data are positive gains."""
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    data = np.asarray(data, dtype=np.float64)
    if len(indptr) != n_queries + 1:
        raise ValueError(f"indptr has length {len(indptr)}, expected n_queries + 1 = "
                         f"{n_queries + 1}")
    if len(indices) and (indices.min() < 0 or indices.max() >= n_db):
        raise ValueError(f"relevant db index out of range [0, {n_db}): "
                         f"min {indices.min()}, max {indices.max()}")
    if len(data) and not np.all(data > 0):
        raise ValueError(f"relevance gains must be > 0 in the sparse form, got {data.min()}")
    if len(indices) != len(data) or indptr[0] != 0 or indptr[-1] != len(indices) \
            or np.any(np.diff(indptr) < 0):
        raise ValueError(f"CSR arrays disagree: indptr must rise from 0 to len(indices) = "
                         f"{len(indices)}, and data must have the same length "
                         f"(got {len(data)})")
    # sort each row by db index (the kernel walks a row as it scans the database in order)
    rows = np.repeat(np.arange(n_queries), np.diff(indptr))
    order = np.lexsort((indices, rows))
    indices, data = indices[order], data[order]
    if len(indices) > 1 and np.any((np.diff(indices) == 0) & (np.diff(rows[order]) == 0)):
        raise ValueError("CSR rows hold a db index twice (merge duplicate pairs first)")
    ints = bool(len(data) == 0 or np.all(data == np.round(data)))
    level = int(data.max()) if ints and len(data) else (0 if not ints else 1)
    return Relevance("csr", int(n_queries), int(n_db), _EMPTY_I, _EMPTY_I, indptr, indices, data,
                     level)


def from_graded_matrix(matrix) -> Relevance:
    """Relevance from an explicit ``(nq, nb)`` graded matrix: gain = value, relevant when > 0."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"graded relevance matrix must be 2-D (nq, nb), got shape {m.shape}")
    if m.size and (not np.isfinite(m).all() or m.min() < 0):
        raise ValueError("graded relevance matrix must hold finite values >= 0")
    rows, cols = np.nonzero(m > 0)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=m.shape[0]))])
    return from_csr(indptr, cols, m[rows, cols], m.shape[0], m.shape[1])


def from_pairs(pairs, n_queries: int, n_db: int, gains=None) -> Relevance:
    """Relevance from an explicit list of ``(query, db item)`` relevant pairs (gain 1, or
    ``gains``). Duplicate pairs are merged (their gains added)."""
    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    g = np.ones(len(p)) if gains is None else np.asarray(gains, dtype=np.float64)
    if len(g) != len(p):
        raise ValueError(f"gains has length {len(g)} but there are {len(p)} pairs")
    if len(p) and (p[:, 0].min() < 0 or p[:, 0].max() >= n_queries):
        raise ValueError(f"pair query index out of range [0, {n_queries})")
    if len(p) and (p[:, 1].min() < 0 or p[:, 1].max() >= n_db):
        raise ValueError(f"pair db index out of range [0, {n_db})")
    key = p[:, 0] * n_db + p[:, 1]
    uniq, inv = np.unique(key, return_inverse=True)
    data = np.bincount(inv, weights=g, minlength=len(uniq)) if len(uniq) else _EMPTY_F
    rows, cols = uniq // max(n_db, 1), uniq % max(n_db, 1)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_queries))])
    return from_csr(indptr, cols, data, n_queries, n_db)


def epsilon_from_features(xb, n_neighbors: int = 50, n_samples: int = 100, seed: int = 0) -> float:
    """Epsilon of the epsilon-ball ground truth: the mean Euclidean distance from
    ``n_samples`` database points (sampled without replacement, seeded) to their
    ``n_neighbors``-th nearest neighbour in the database (the point itself excluded), as in the
    learning-to-hash literature (e.g. Weiss et al., Spectral Hashing; 50 and 100 by default)."""
    xb = np.asarray(xb, dtype=np.float64)
    if xb.ndim != 2 or len(xb) <= n_neighbors:
        raise ValueError(f"features must be 2-D with more than n_neighbors={n_neighbors} rows, "
                         f"got shape {xb.shape}")
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(xb), size=min(n_samples, len(xb)), replace=False)
    sq = (xb ** 2).sum(1)
    d2 = sq[pick, None] + sq[None, :] - 2.0 * xb[pick] @ xb.T
    np.maximum(d2, 0, out=d2)
    d2[np.arange(len(pick)), pick] = np.inf  # exclude the point itself
    kth = np.partition(d2, n_neighbors - 1, axis=1)[:, n_neighbors - 1]
    return float(np.sqrt(kth).mean())


def from_features(xq, xb, epsilon: float | None = None, n_neighbors: int = 50,
                  n_samples: int = 100, seed: int = 0, chunk: int = 256) -> tuple[Relevance, float]:
    """Epsilon-ball ground truth: ``xb[i]`` is relevant to ``xq[q]`` when
    ``||xq[q] - xb[i]||_2 <= epsilon``. ``epsilon`` defaults to :func:`epsilon_from_features`.
    Computed ``chunk`` queries at a time (memory ``O(chunk * nb)``). Returns (relevance, epsilon).
    """
    xq = np.asarray(xq, dtype=np.float64)
    xb = np.asarray(xb, dtype=np.float64)
    if xq.ndim != 2 or xb.ndim != 2 or xq.shape[1] != xb.shape[1]:
        raise ValueError(f"features must be 2-D with the same width, got query {xq.shape} "
                         f"and db {xb.shape}")
    if epsilon is None:
        epsilon = epsilon_from_features(xb, n_neighbors, n_samples, seed)
    sqb = (xb ** 2).sum(1)
    counts, cols = [], []
    for s in range(0, len(xq), chunk):
        part = xq[s:s + chunk]
        d2 = (part ** 2).sum(1)[:, None] + sqb[None, :] - 2.0 * part @ xb.T
        r, c = np.nonzero(d2 <= epsilon * epsilon)
        counts.append(np.bincount(r, minlength=len(part)))
        cols.append(c)
    indptr = np.concatenate([[0], np.cumsum(np.concatenate(counts or [_EMPTY_I]))])
    indices = np.concatenate(cols or [_EMPTY_I])
    return from_csr(indptr, indices, np.ones(len(indices)), len(xq), len(xb)), float(epsilon)


def dense(rel: Relevance, graded: bool = True) -> np.ndarray:
    """``(nq, nb)`` gain matrix (0 = not relevant). For tests and tiny inputs only."""
    if rel.mode == "class":
        out = (rel.query_labels[:, None] == rel.db_labels[None, :]).astype(np.float64)
    elif rel.mode == "multihot":
        q = np.unpackbits(rel.query_labels.astype(">u8").view(np.uint8), axis=1).astype(np.int64)
        b = np.unpackbits(rel.db_labels.astype(">u8").view(np.uint8), axis=1).astype(np.int64)
        out = (q @ b.T).astype(np.float64)
    else:
        out = np.zeros((rel.n_queries, rel.n_db))
        for qi in range(rel.n_queries):
            s, e = rel.indptr[qi], rel.indptr[qi + 1]
            out[qi, rel.indices[s:e]] = rel.data[s:e]
    return out if graded else (out > 0).astype(np.float64)
