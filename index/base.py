"""What every engine shares: the base class, the per-radius statistics, the search errors and
limits, the chunked parallel driver and the (nq, k) result layout.

The engines (:mod:`.probe`, :mod:`.mih`, :mod:`.scan`, :mod:`.planner`) build on this module;
it imports no engine.
"""
from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from bucketsearch.index._jit import default_threads
from bucketsearch.index.codes import as_words, check_bits
from bucketsearch.index.storage.store import load_arrays, save_arrays

DEFAULT_MAX_PROBES = 10_000_000
PROBE_CAP = 1 << 62          # per-radius probe counts are clipped here inside the kernel
PARALLEL_MIN_QUERIES = 16    # smaller batches run on the calling thread
STAT_FIELDS = ("probes", "nonempty_buckets", "empty_buckets", "items", "lookup_ns")


class ProbeLimitError(ValueError):
    """A search would probe more buckets than ``max_probes`` allows."""

    def __init__(self, probes: int, limit: int, radius: int, bits: int):
        self.probes, self.limit, self.radius = probes, limit, radius
        super().__init__(
            f"a radius-{radius} search of {bits}-bit codes probes {probes:,} buckets, more than "
            f"the limit max_probes={limit:,}; use a smaller radius, raise the limit, or use "
            "multi-index hashing (mode 'mih') or the planner (mode 'auto')")


class ResultLimitError(ValueError):
    """A radius search would return more than ``max_results`` results (all queries together).

    The kernels stop as soon as the count passes the limit, so ``reached`` is a lower bound of
    the true count (the results counted before the search stopped), not the count itself.
    """

    def __init__(self, limit: int, reached: int):
        self.limit, self.reached = int(limit), int(reached)
        super().__init__(
            f"the search returns at least {self.reached:,} results (counted before it stopped), "
            f"more than the limit max_results={self.limit}; use a smaller radius, fewer queries "
            "per request, or k-NN")


#: ``max_results`` of a search without a result cap (k-NN: bounded by nq x k instead)
NO_RESULT_CAP = np.iinfo(np.int64).max


def check_max_results(max_results) -> int:
    """The kernels' cap argument for ``max_results`` (None: no cap)."""
    if max_results is None:
        return NO_RESULT_CAP
    if isinstance(max_results, bool) or not isinstance(max_results, (int, np.integer)) \
            or max_results < 0:
        raise ValueError(f"max_results must be None or an int >= 0, got {max_results!r}")
    return int(max_results)


def raise_if_over(max_results, stop: np.ndarray, reached: list[int], lims: np.ndarray) -> None:
    """Raise :class:`ResultLimitError` when a chunk stopped at the cap (``stop[0]`` set) or the
    chunks together passed it; ``reached`` holds each chunk's count at its return."""
    if max_results is None:
        return
    total = max(sum(int(x) for x in reached), int(lims[-1]))
    if stop[0] or total > max_results:
        raise ResultLimitError(max_results, total)


def probe_counts(bits: int, max_radius: int) -> list[int]:
    """Exact ``C(Q, r)`` for ``r = 0..max_radius`` (Python ints, no overflow)."""
    return [math.comb(bits, r) for r in range(max_radius + 1)]


@dataclass
class SearchStats:
    """Per-query, per-radius accounting of a search; every array is ``(nq, R + 1)`` int64."""

    probes: np.ndarray
    nonempty_buckets: np.ndarray
    empty_buckets: np.ndarray
    items: np.ndarray
    lookup_ns: np.ndarray
    radii: np.ndarray      # (nq,) number of radii searched (0..radii-1)
    total_ns: np.ndarray   # (nq,) whole query time

    # Optional extras, None unless the index sets them. They are plain attributes, not dataclass
    # fields, so code that rebuilds a SearchStats from its fields keeps working unchanged.
    #: multi-index hashing: (nq, R + 1) substring-bucket entries examined / first visits
    candidates = None
    unique_candidates = None
    #: planner (mode "auto"): which path ran and the predicted costs that chose it
    plan = None
    #: k-NN: (nq,) the radius from which a query ranked the codes by a scan instead (-1: none)
    scanned_from = None
    #: live index: items of the delta segment scanned linearly per query, and the wall-clock ns
    #: of that scan for the whole batch (the delta has no buckets, so no per-radius counters)
    delta_items = 0
    delta_ns = 0
    OPTIONAL_FIELDS = ("candidates", "unique_candidates")

    def per_query(self, i: int) -> list[dict]:
        """Records ``{"radius", "probes", "nonempty_buckets", ...}`` of query ``i`` (plus
        ``candidates`` and ``unique_candidates`` when the index records them)."""
        names = STAT_FIELDS + tuple(f for f in self.OPTIONAL_FIELDS
                                    if getattr(self, f) is not None)
        return [{"radius": r, **{f: int(getattr(self, f)[i, r]) for f in names}}
                for r in range(int(self.radii[i]))]

    @classmethod
    def concat(cls, parts: list[SearchStats]) -> SearchStats:
        width = max(p.probes.shape[1] for p in parts)

        def stack(name):
            arrays = [getattr(p, name) for p in parts]
            if arrays[0].ndim == 1:
                return np.concatenate(arrays)
            out = np.zeros((sum(len(a) for a in arrays), width), dtype=arrays[0].dtype)
            row = 0
            for a in arrays:  # zero-padded to the widest (np.pad is ~20x slower per part)
                out[row:row + len(a), :a.shape[1]] = a
                row += len(a)
            return out

        out = cls(**{name: stack(name) for name in cls.__dataclass_fields__})
        for name in cls.OPTIONAL_FIELDS:
            if all(getattr(p, name) is not None for p in parts):
                setattr(out, name, stack(name))
        return out


def csr_to_knn(lims: np.ndarray, D: np.ndarray, I: np.ndarray, k: int):
    """CSR results (at most k per query, already ordered) -> (nq, k) arrays padded with -1."""
    nq = len(lims) - 1
    out_d = np.full((nq, k), -1, dtype=np.int32)
    out_i = np.full((nq, k), -1, dtype=np.int64)
    counts = np.diff(lims)
    rows = np.repeat(np.arange(nq), counts)
    cols = np.arange(len(I)) - np.repeat(lims[:-1], counts)
    out_d[rows, cols] = D
    out_i[rows, cols] = I
    return out_d, out_i


_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def _chunk_pool() -> ThreadPoolExecutor:
    """One process-wide pool for query chunks (threads are reused, not created per search)."""
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(max(default_threads(), 2),
                                            thread_name_prefix="bucketsearch-chunk"))
        return _POOL[0]


def run_chunked(kernel, xq: np.ndarray, threads: int | None = None):
    """Run ``kernel(xq_chunk) -> (counts, D, I, *rest)`` over query chunks on a thread pool.

    Kernels release the GIL, so chunks run in parallel. Returns ``lims, D, I`` and the list of
    the chunks' remaining outputs.
    """
    nq = len(xq)
    threads = 1 if nq < PARALLEL_MIN_QUERIES else threads or default_threads()
    if threads <= 1:
        parts = [kernel(xq)]
    else:
        bounds = np.linspace(0, nq, min(threads, nq) + 1).astype(int)
        chunks = [xq[a:b] for a, b in zip(bounds, bounds[1:])]
        # the first chunk runs on the calling thread, the others on the shared pool
        futures = [_chunk_pool().submit(kernel, chunk) for chunk in chunks[1:]]
        parts = [kernel(chunks[0])] + [f.result() for f in futures]
    counts = np.concatenate([p[0] for p in parts])
    lims = np.zeros(nq + 1, dtype=np.int64)
    np.cumsum(counts, out=lims[1:])
    D = np.concatenate([p[1] for p in parts])
    I = np.concatenate([p[2] for p in parts])
    return lims, D, I, [p[3:] for p in parts]


class IndexBase:
    """What every index shares: ids, codes, validation, add/remove, the result layouts."""

    kind = ""
    legacy_kinds: tuple[str, ...] = ()

    def __init__(self, bits: int):
        self.bits = check_bits(bits)
        self.threads: int | None = None

    def __len__(self) -> int:
        return self.ntotal

    def _check_queries(self, queries) -> np.ndarray:
        try:
            return as_words(queries, self.bits)
        except ValueError as exc:
            raise ValueError(f"queries: {exc}") from None

    @staticmethod
    def _check_radius(max_distance, bits):
        if isinstance(max_distance, bool) or not isinstance(max_distance, (int, np.integer)):
            raise TypeError(f"max_distance must be an int in [0, {bits}], got {max_distance!r}")
        if not 0 <= max_distance <= bits:
            raise ValueError(f"max_distance must be in [0, {bits}], got {max_distance}")
        return int(max_distance)

    @staticmethod
    def _check_k(k):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        return int(k)

    def _merge_ids(self, words: np.ndarray, ids) -> tuple[np.ndarray, np.ndarray]:
        """Validated new ids (default ntotal..) merged with the present (words, ids)."""
        n = len(words)
        if ids is None:
            start = int(self.ids.max()) + 1 if self.ntotal else 0
            ids = np.arange(start, start + n, dtype=np.int64)
        else:
            ids = np.asarray(ids)
            if ids.ndim != 1 or len(ids) != n or not np.issubdtype(ids.dtype, np.integer):
                raise ValueError(f"ids must be a 1-D int array of length {n} (one per code), "
                                 f"got shape {ids.shape} and dtype {ids.dtype}")
            ids = ids.astype(np.int64)
            uniq, cnt = np.unique(ids, return_counts=True)
            if (cnt > 1).any():
                raise ValueError(f"ids: id {int(uniq[cnt > 1][0])} appears more than once in "
                                 "the batch")
            clash = np.isin(ids, self.ids)
            if clash.any():
                raise ValueError(f"ids: id {int(ids[clash][0])} is already in the index")
        return (np.concatenate([self.words, words]), np.concatenate([self.ids, ids]))

    def add(self, codes, ids=None) -> None:
        """Add codes (any format of :func:`index.codes.as_words`) with optional unique ids."""
        words = as_words(codes, self.bits)
        self._rebuild(*self._merge_ids(words, ids))

    def remove(self, ids) -> int:
        """Remove items by id; unknown ids are ignored. Returns the number removed."""
        keep = ~np.isin(self.ids, np.asarray(ids, dtype=np.int64))
        removed = int((~keep).sum())
        if removed:
            self._rebuild(self.words[keep], self.ids[keep])
        return removed

    def _knn_csr(self, xq, k, stats):
        return self._run(xq, self.bits, k, stats)

    def planned_probe_count(self, max_distance: int, nq: int = 1) -> int:
        """Bucket lookups per query of the radius search this index would run for a batch of
        ``nq`` queries (what a probe budget is charged): :meth:`probe_count` of the engine that
        runs it (the planner: of the plan it chooses; a linear scan: 0)."""
        return self.probe_count(max_distance)

    def save(self, path) -> None:
        """Write a checksummed snapshot directory (see :mod:`index.storage.store`): the manifest's
        kind is :attr:`kind`, its meta and arrays those of :meth:`snapshot`."""
        meta, arrays = self.snapshot()
        save_arrays(path, self.kind, {"bits": self.bits, "ntotal": self.ntotal, **meta}, arrays)

    @classmethod
    def load(cls, path, mmap: bool = False):
        """Read a snapshot written by :meth:`save` (``mmap=True`` maps the arrays read-only)."""
        kind, meta, arrays = load_arrays(path, mmap=mmap)
        return cls.from_checked_snapshot(path, kind, meta, arrays)

    @classmethod
    def from_checked_snapshot(cls, path, kind: str, meta: dict, arrays: dict):
        """:meth:`from_snapshot` after checking the kind; the item count must match the meta."""
        if kind not in (cls.kind, *cls.legacy_kinds):
            raise ValueError(f"{path}: holds a {kind!r} index, not {cls.kind!r}")
        try:
            index = cls.from_snapshot(int(meta["bits"]), meta, arrays)
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{path}: snapshot meta or arrays incomplete ({exc!r})") from None
        if index.ntotal != meta.get("ntotal"):
            raise ValueError(f"{path}: holds {index.ntotal} items, the manifest says "
                             f"{meta.get('ntotal')}")
        return index

    def search(self, queries, k: int, stats: bool = False):
        """Exact k-NN: ``(D, I)`` of shape ``(nq, k)``, ordered by (distance, id), padded -1."""
        k = self._check_k(k)
        lims, D, I, *rest = self._knn_csr(self._check_queries(queries), k, stats)
        out_d, out_i = csr_to_knn(lims, D, I, k)
        return (out_d, out_i, *rest)
