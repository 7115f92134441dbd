"""What every engine shares: the base class, the per-radius statistics, the search errors and
limits, the chunked parallel driver and the (nq, k) result layout.

The engines (:mod:`.probe`, :mod:`.mih`, :mod:`.scan`, :mod:`.planner`) build on this module;
it imports no engine.
"""
from __future__ import annotations

import ctypes
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from bucketsearch.index._jit import compiled_entry, default_threads
from bucketsearch.index.codes import as_words, check_bits
from bucketsearch.index.disk.store import load_arrays, save_arrays
from bucketsearch.index.pool import build_threads, pool
from bucketsearch.index.radix import repeated_id
from bucketsearch.index.table import merge_items

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


def raise_if_reached(max_results, reached: int, lims: np.ndarray) -> None:
    """:func:`raise_if_over` of the resumable kernels: ``reached >= 0`` when a chunk stopped at
    the cap (its count, summed over the chunks), else the batch's total is checked."""
    if max_results is None:
        return
    total = max(int(reached), int(lims[-1]))
    if reached >= 0 or total > max_results:
        raise ResultLimitError(max_results, total)


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


#: Distinct plans kept by :meth:`SearchStats.concat` when its parts ran different plans.
MAX_PLANS = 16
#: Per-radius arrays of :class:`SearchStats` beyond :data:`STAT_FIELDS` (multi-index hashing).
CANDIDATE_FIELDS = ("candidates", "unique_candidates")
#: Per-query fields some engines leave None, and the value of a query that lacks them when
#: :meth:`SearchStats.concat` joins batches of different engines (an ``auto`` index's plans)
OPTIONAL_PER_QUERY = {"candidates": 0, "unique_candidates": 0, "scanned_from": -1,
                      "engine": 0, "k": 0, "codes_compared": 0}
#: Per-query ``SearchStats.engine`` codes: the engine that ran the query (0: not recorded).
ENGINES = ("", "single", "mih", "scan")
_ENGINE_CODE = {name: i for i, name in enumerate(ENGINES)} | {"auto": 0}


def stack_padded(arrays, width: int):
    """The rows of ``arrays`` one after the other: 1-D arrays concatenated, 2-D ones
    zero-padded to ``width`` columns; None when any part is None."""
    if any(a is None for a in arrays):
        return None
    if arrays[0].ndim == 1:
        return np.concatenate(arrays)
    out = np.zeros((sum(len(a) for a in arrays), width), dtype=arrays[0].dtype)
    row = 0
    for a in arrays:  # zero-padded to the widest (np.pad is ~20x slower per part)
        out[row:row + len(a), :a.shape[1]] = a
        row += len(a)
    return out

@dataclass
class SearchStats:
    """Per-query, per-radius accounting of a search (the same fields through every layer:
    engine, planner, live index, HTTP ``stats``).

    Per radius ``r`` (arrays ``(nq, R + 1)`` int64, row ``r`` valid for ``r < radii[q]``):
    ``probes`` (bucket lookups of that radius: ``C(Q, r)`` for a single table, the substring
    probes of radius step ``r`` for multi-index hashing, 0 for a scan or a radius a k-NN query
    answered by scanning), ``nonempty_buckets``, ``empty_buckets = probes - nonempty_buckets``,
    ``items`` (results at distance exactly ``r``) and ``lookup_ns`` (in-kernel clock).

    Per query: ``radii`` (``(nq,)``: the radii searched are ``0 .. radii[q] - 1``, so the list
    of radii searched is ``range(radii[q])``), ``total_ns`` (whole query), ``scanned_from``
    (k-NN: the radius from which the query ranked codes by a scan instead of probing, -1: none).
    Multi-index hashing adds ``candidates`` and ``unique_candidates`` ``(nq, R + 1)`` (substring
    bucket entries examined / first visits); the planner adds ``plan`` (the path that ran and the
    predicted costs that chose it); the live index adds ``delta_items`` (items of the delta
    segment scanned linearly per query) and ``delta_ns`` (wall-clock ns of that scan, batch).

    What each query ran, per query ``(nq,)`` (set by every engine, :meth:`IndexBase._tagged`):
    ``engine`` (an index into :data:`ENGINES`: the engine that ran it, so a batch of an
    ``auto`` index or the concatenation of several batches keeps it per query), ``k`` (the k of
    a k-NN query, 0 for a range query; a k-NN query's radius reached is ``radii[q] - 1``) and
    ``codes_compared`` (codes whose full distance a linear pass computed: ``ntotal`` for a scan,
    and for a k-NN query that switched to a scan at ``scanned_from``; 0 otherwise).
    """

    probes: np.ndarray
    nonempty_buckets: np.ndarray
    empty_buckets: np.ndarray
    items: np.ndarray
    lookup_ns: np.ndarray
    radii: np.ndarray
    total_ns: np.ndarray
    candidates: np.ndarray | None = None
    unique_candidates: np.ndarray | None = None
    scanned_from: np.ndarray | None = None
    engine: np.ndarray | None = None
    k: np.ndarray | None = None
    codes_compared: np.ndarray | None = None
    plan: dict | None = None
    delta_items: int = 0
    delta_ns: int = 0

    #: fields holding one row per query (what :meth:`rows`, :meth:`concat`, :meth:`scatter` move)
    PER_QUERY = STAT_FIELDS + ("radii", "total_ns") + CANDIDATE_FIELDS + (
        "scanned_from", "engine", "k", "codes_compared")

    def engine_names(self) -> list[str]:
        """Per query, the name of the engine that ran it ("" when not recorded)."""
        if self.engine is None:
            return [""] * len(self.radii)
        return [ENGINES[int(e)] for e in self.engine]

    def radius_fields(self) -> tuple[str, ...]:
        """Per-radius fields this search recorded: :data:`STAT_FIELDS` plus the candidate
        counts when the engine is multi-index hashing."""
        return STAT_FIELDS + tuple(f for f in CANDIDATE_FIELDS if getattr(self, f) is not None)

    def per_query(self, i: int) -> list[dict]:
        """Records ``{"radius", "probes", "nonempty_buckets", ...}`` of query ``i``, one per
        radius searched (plus ``candidates`` and ``unique_candidates`` when recorded)."""
        names = self.radius_fields()
        return [{"radius": r, **{f: int(getattr(self, f)[i, r]) for f in names}}
                for r in range(int(self.radii[i]))]

    def _with_rows(self, rows: dict) -> SearchStats:
        return SearchStats(**rows, plan=self.plan, delta_items=self.delta_items,
                           delta_ns=self.delta_ns)

    def rows(self, mask) -> SearchStats:
        """The statistics of the queries selected by ``mask`` (boolean or index array)."""
        return self._with_rows({name: None if getattr(self, name) is None
                                else getattr(self, name)[mask] for name in self.PER_QUERY})

    def scatter(self, nq: int, sel: np.ndarray) -> SearchStats:
        """The statistics of ``nq`` queries, these rows at positions ``sel`` (the others 0, and
        -1 for ``scanned_from``)."""
        out = {}
        for name in self.PER_QUERY:
            arr = getattr(self, name)
            if arr is not None:
                full = np.full((nq,) + arr.shape[1:], -1 if name == "scanned_from" else 0,
                               dtype=arr.dtype)
                full[sel] = arr
                arr = full
            out[name] = arr
        return self._with_rows(out)

    @classmethod
    def concat(cls, parts: list[SearchStats]) -> SearchStats:
        """The queries of ``parts`` one after the other; per-radius arrays zero-padded to the
        widest. A field is kept when every part has it; ``plan`` is the parts' common plan, or
        ``{"mode": "mixed", "modes": [...], "plans": [...]}`` (the first :data:`MAX_PLANS`
        distinct ones) when they ran different plans; the delta figures are summed. A field of
        :data:`OPTIONAL_PER_QUERY` that only some parts have is kept, the others' rows blank
        (so the candidates of the multi-index batches survive beside single-table ones)."""
        width = max(p.probes.shape[1] for p in parts)

        def stack(name):
            arrays = [getattr(p, name) for p in parts]
            have = next((a for a in arrays if a is not None), None)
            if have is not None and name in OPTIONAL_PER_QUERY:
                # a part of another engine lacks the field: its rows hold the blank value
                arrays = [a if a is not None else np.full(
                    (len(p.radii),) + have.shape[1:], OPTIONAL_PER_QUERY[name], have.dtype)
                    for a, p in zip(arrays, parts)]
            return stack_padded(arrays, width)

        plans = []  # the distinct plans, at most MAX_PLANS kept
        for p in parts:
            if p.plan is not None and len(plans) < MAX_PLANS and \
                    not any(p.plan is pl or p.plan == pl for pl in plans):
                plans.append(p.plan)
        plan = None if not plans else plans[0] if len(plans) == 1 else {
            "mode": "mixed", "modes": sorted({pl["mode"] for pl in plans}), "plans": plans}
        return cls(**{name: stack(name) for name in cls.PER_QUERY}, plan=plan,
                   delta_items=sum(p.delta_items for p in parts),
                   delta_ns=sum(p.delta_ns for p in parts))


def stats_from_chunks(rest: list[tuple]) -> SearchStats:
    """One :class:`SearchStats` from the kernels' chunk outputs ``(stats, radii, total_ns,
    scanned_from, ...)``, ``stats`` of shape ``(5 or 7, nq_chunk, R + 1)`` (rows
    :data:`STAT_FIELDS`, then :data:`CANDIDATE_FIELDS`), cut to the widest radius reached."""
    radii = np.concatenate([r[1] for r in rest])
    width = max(int(radii.max(initial=0)), 1)
    st = np.concatenate([r[0] for r in rest], axis=1)[:, :, :width]
    extra = dict(zip(CANDIDATE_FIELDS, st[len(STAT_FIELDS):]))
    return SearchStats(*st[:len(STAT_FIELDS)], radii=radii,
                       total_ns=np.concatenate([r[2] for r in rest]),
                       scanned_from=np.concatenate([r[3] for r in rest]), **extra)


def csr_to_knn(lims: np.ndarray, D: np.ndarray, I: np.ndarray, k: int):
    """CSR results (at most k per query, already ordered) -> (nq, k) arrays padded with -1.

    When every query has k results (a k-NN search of an index holding k items or more, the
    common case) the arrays are ``D`` and ``I`` themselves, reshaped (no copy: ~0.3 us instead
    of ~6 us for one query)."""
    nq = len(lims) - 1
    if len(I) == nq * k:
        return D.reshape(nq, k), I.reshape(nq, k)
    out_d = np.full((nq, k), -1, dtype=np.int32)
    out_i = np.full((nq, k), -1, dtype=np.int64)
    filled = np.arange(k) < np.diff(lims)[:, None]  # row-major, as the CSR order
    out_d[filled] = D
    out_i[filled] = I
    return out_d, out_i


def knn_to_csr(D: np.ndarray, I: np.ndarray):
    """k-NN rows padded with id -1 -> CSR ``(lims, D, I)`` without the padding (the inverse of
    :func:`csr_to_knn`)."""
    keep = I >= 0
    lims = np.zeros(len(I) + 1, dtype=np.int64)
    np.cumsum(keep.sum(axis=1), out=lims[1:])
    return lims, D[keep], I[keep]


def splice_rows(lims: np.ndarray, D: np.ndarray, I: np.ndarray, rows: np.ndarray,
                lims_b: np.ndarray, D_b: np.ndarray, I_b: np.ndarray):
    """CSR results ``(lims, D, I)`` with the (empty) rows ``rows`` (increasing) replaced by the
    rows of ``(lims_b, D_b, I_b)`` in turn: e.g. queries a multi-index k-NN search gave up,
    answered by a scan. Returns the new ``(lims, D, I)``."""
    nq = len(lims) - 1
    counts = np.diff(lims)
    counts[rows] = np.diff(lims_b)
    out_lims = np.zeros(nq + 1, dtype=np.int64)
    np.cumsum(counts, out=out_lims[1:])
    out_d = np.empty(out_lims[-1], dtype=D.dtype)
    out_i = np.empty(out_lims[-1], dtype=I.dtype)
    for lm, d, i, query in ((lims, D, I, np.arange(nq)), (lims_b, D_b, I_b, rows)):
        row = np.repeat(np.arange(len(lm) - 1), np.diff(lm))  # each entry's row (lims[0] = 0)
        dest = out_lims[query[row]] + np.arange(len(row)) - lm[row]
        out_d[dest] = d[:len(row)]
        out_i[dest] = i[:len(row)]
    return out_lims, out_d, out_i


def _chunk_pool() -> ThreadPoolExecutor:
    """One process-wide pool for query chunks (threads are reused, not created per search)."""
    return pool("chunk")


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
    lims = np.zeros(nq + 1, dtype=np.int64)
    if len(parts) == 1:  # (three concatenations of one part: ~2 us of a one-query search)
        counts, D, I = parts[0][:3]
    else:
        counts = np.concatenate([p[0] for p in parts])
        D = np.concatenate([p[1] for p in parts])
        I = np.concatenate([p[2] for p in parts])
    np.add.accumulate(counts, out=lims[1:])  # (np.cumsum: ~1 us more a call)
    return lims, D, I, [p[3:] for p in parts]


class _OutputBuffers(threading.local):
    """Per-thread result buffers of the resumable kernels, reused from call to call (a search
    copies out what it returns), so a small search allocates only its results."""

    def __init__(self):
        self.d = np.empty(OUTPUT_BUFFER_START, dtype=np.int32)
        self.i = np.empty(OUTPUT_BUFFER_START, dtype=np.int64)
        self.hits = np.empty(OUTPUT_BUFFER_START, dtype=np.int64)
        self.all = (self.d, self.i, self.hits)  # one thread-local load for all three

    def grow(self, n_out: int) -> None:
        """Twice the room, the first ``n_out`` entries kept."""
        size = 2 * len(self.i)
        d, i = np.empty(size, dtype=np.int32), np.empty(size, dtype=np.int64)
        d[:n_out], i[:n_out] = self.d[:n_out], self.i[:n_out]
        self.d, self.i = d, i
        self.all = (d, i, self.hits)

    def grow_hits(self, need: int) -> None:
        """Room for ``need`` hits (twice that)."""
        self.hits = np.empty(2 * need, dtype=np.int64)
        self.all = (self.d, self.i, self.hits)

    def shrink(self) -> None:
        """Give back a buffer a large search grew past :data:`OUTPUT_BUFFER_KEEP` entries."""
        if len(self.i) > OUTPUT_BUFFER_KEEP or len(self.hits) > OUTPUT_BUFFER_KEEP:
            self.__init__()


OUTPUT_BUFFER_START = 4096
OUTPUT_BUFFER_KEEP = 1 << 20
#: this thread's result buffers (a search copies out what it returns)
OUTPUT_BUFFERS = _BUFFERS = _OutputBuffers()
#: the dtype of code words (native byte order)
WORD_DTYPE = _WORD = np.dtype(np.uint64)
_NO_STATS = np.zeros((0, 0, 0), dtype=np.int64)
_NO_NS = np.zeros(0, dtype=np.int64)


def run_resumable(kernel, xq: np.ndarray, width: int, with_stats: bool, rows: int,
                  args: tuple = (), entries: dict | None = None, stats_none: bool = False):
    """Run a resumable kernel over all of ``xq`` on the calling thread.

    ``kernel(xq, *args, q_start, n_out, lims, out_d, out_i, hits, stats, total_ns) -> (q_end,
    n_out, reached, need)`` writes into this thread's reusable output buffers and stops when
    they are full, or its ``hits`` scratch needs ``need`` entries (then they are grown and the
    kernel resumes at ``q_end``), or when the result cap is passed (``reached >= 0``). Returns
    ``(lims, D, I, stats, total_ns, reached)``; ``stats`` ``(rows, nq, width)`` and
    ``total_ns`` are allocated only ``with_stats``; without, the kernel gets empty arrays for
    both, or None with ``stats_none`` (for a kernel compiled without statistics then).

    ``entries`` (a dict kept with the arguments, whose types must not change while it lives):
    without statistics and with C-contiguous writable queries, the kernel is called through
    its compiled entry for these argument types (:func:`bucketsearch.index._jit.compiled_entry`),
    kept there by kernel.
    """
    nq = len(xq)
    buf = _BUFFERS
    out_d, out_i, hits = buf.d, buf.i, buf.hits
    lims = np.zeros(nq + 1, dtype=np.int64)  # (np.zeros: 70 ns less than np.empty and a store)
    if with_stats:
        stats = np.zeros((rows, nq, width), dtype=np.int64)
        total_ns = np.zeros(nq, dtype=np.int64)
    else:
        stats, total_ns = (None, None) if stats_none else (_NO_STATS, _NO_NS)
    if entries is not None and not with_stats and xq.flags.c_contiguous and xq.flags.writeable:
        call = entries.get(kernel)
        if call is None:
            call = entries[kernel] = compiled_entry(kernel, (xq, *args, 0, 0, lims, out_d,
                                                             out_i, hits, stats, total_ns))
    else:
        call = kernel
    q, n_out, reached, need = call(xq, *args, 0, 0, lims, out_d, out_i, hits, stats, total_ns)
    # a buffer is full: grow it and resume (a loop that a small search does not enter: its
    # Python here was ~1 us of a ~3 us one-query call)
    grown = q < nq and reached < 0
    while q < nq and reached < 0:
        if need:
            buf.grow_hits(need)
        else:
            buf.grow(n_out)
        out_d, out_i, hits = buf.d, buf.i, buf.hits
        q, n_out, reached, need = call(xq, *args, q, n_out, lims, out_d, out_i, hits, stats,
                                       total_ns)
    if reached >= 0:
        lims[q + 1:] = n_out
    D, I = out_d[:n_out].copy(), out_i[:n_out].copy()
    if grown:
        buf.shrink()
    return lims, D, I, stats, total_ns, reached


def run_resumable_chunked(kernel, xq: np.ndarray, width: int, with_stats: bool, rows: int,
                          threads: int | None, args: tuple = (), entries: dict | None = None,
                          stats_none: bool = False):
    """:func:`run_resumable` over query chunks on the shared pool (batches of at least
    :data:`PARALLEL_MIN_QUERIES` with ``threads > 1``), on the calling thread otherwise.

    Returns ``lims, D, I`` and, when ``with_stats``, a :class:`SearchStats` (radii: every
    radius ``0..width - 1`` searched); ``reached`` is the sum of the chunks' counts at a stop
    by the result cap (-1: none).
    """
    nq = len(xq)
    if nq < PARALLEL_MIN_QUERIES or threads == 1 or (threads is None
                                                     and default_threads() <= 1):
        lims, D, I, stats, total_ns, reached = run_resumable(kernel, xq, width, with_stats,
                                                             rows, args, entries, stats_none)
        if not with_stats:  # the single-query path: nothing more to assemble
            return lims, D, I, None, reached
        parts = [(lims, D, I, stats, total_ns, reached)]
    else:
        threads = threads or default_threads()
        bounds = np.linspace(0, nq, min(threads, nq) + 1).astype(int)
        chunks = [xq[a:b] for a, b in zip(bounds, bounds[1:])]
        futures = [_chunk_pool().submit(run_resumable, kernel, c, width, with_stats, rows,
                                        args, entries, stats_none) for c in chunks[1:]]
        parts = [run_resumable(kernel, chunks[0], width, with_stats, rows, args, entries,
                               stats_none)]
        parts += [f.result() for f in futures]
    if len(parts) == 1:
        lims, D, I = parts[0][:3]
    else:
        lims = np.zeros(nq + 1, dtype=np.int64)
        np.cumsum(np.concatenate([np.diff(p[0]) for p in parts]), out=lims[1:])
        D = np.concatenate([p[1] for p in parts])
        I = np.concatenate([p[2] for p in parts])
    reached = -1
    if any(p[5] >= 0 for p in parts):
        reached = sum(p[5] if p[5] >= 0 else int(p[0][-1]) for p in parts)
    st = None
    if with_stats:
        s = np.concatenate([p[3] for p in parts], axis=1) if len(parts) > 1 else parts[0][3]
        total_ns = np.concatenate([p[4] for p in parts]) if len(parts) > 1 else parts[0][4]
        rows = (*s,)  # one view per field (np.full and a dict per call cost ~1.5 us of one query)
        radii, scanned_from = np.empty(nq, dtype=np.int64), np.empty(nq, dtype=np.int64)
        radii.fill(width)
        scanned_from.fill(-1)
        st = SearchStats(*rows[:len(STAT_FIELDS)], radii=radii, total_ns=total_ns,
                         scanned_from=scanned_from,
                         **dict(zip(CANDIDATE_FIELDS, rows[len(STAT_FIELDS):])))
    return lims, D, I, st, reached


#: Builds of at least this many items give the heap's free pages back (:func:`trim_heap`).
TRIM_MIN_ITEMS = 1 << 20


def trim_heap(n_items: int) -> None:
    """After a build of ``n_items`` >= :data:`TRIM_MIN_ITEMS`: return the C heap's free pages
    to the system (glibc ``malloc_trim(0)``; elsewhere nothing). A build's temporaries below
    glibc's mmap threshold are freed into the heap, which keeps them resident: about 1 byte per
    item at 10M (bench/RESULTS.md, "The single table by position"), counted by no
    ``memory_bytes``."""
    if n_items < TRIM_MIN_ITEMS:
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class IndexBase:
    """What every index shares: ids, codes, validation, add/remove, the result layouts.

    Result layouts, produced by the kernels already ordered by (distance, id) and never sorted
    again: ``range_search`` gives faiss's CSR ``(lims, D, I)`` (query ``q`` owns
    ``lims[q]:lims[q+1]``), ``search`` gives ``(D, I)`` of shape ``(nq, k)`` padded with -1.

    ``probe_count(max_distance, nq=1)`` has one meaning in every engine: the bucket lookups one
    query of a radius-``max_distance`` search makes in that engine (Python int, exact):

    * single table (:class:`~bucketsearch.index.probe.HammingIndex`): ``sum_{r<=R} C(Q, r)``;
    * multi-index hashing (:class:`~bucketsearch.index.mih.MultiIndex`): the substring probes of its
    radius
      steps, ``sum_j sum_{s <= floor((R - j)/m)} C(w_j, s)``;
    * linear scan (:class:`~bucketsearch.index.scan.LinearScan`): 0 (it reads all ``ntotal`` items
    instead);
    * planner (:class:`~bucketsearch.index.planner.AutoIndex`): the count of the engine its plan for
    a batch
      of ``nq`` queries runs (so at most ``max_probes``: over-limit plans are never chosen).

    It is what a probe budget is charged and what ``stats.probes`` sums to over the radii of a
    range search.
    """

    kind = ""
    legacy_kinds: tuple[str, ...] = ()
    #: whether :attr:`words` / :attr:`ids` are in (code, id) order, the order of the tables: a
    #: live index's merge then merges the delta into them instead of sorting everything again
    sorted_by_code = False

    def __init__(self, bits: int):
        self.bits = check_bits(bits)
        self.threads: int | None = None

    def __len__(self) -> int:
        return self.ntotal

    @property
    def build_threads(self) -> int:
        """Threads a build (add, remove, a merge) runs on: :attr:`threads`, or the default
        (:func:`bucketsearch.index.pool.build_threads`); the index built is the same, bit for
        bit, on any number."""
        return build_threads(self.threads)

    def _check_queries(self, queries) -> np.ndarray:
        if (type(queries) is np.ndarray and queries.dtype == _WORD and queries.ndim == 2
                and self.bits % 64 == 0 and queries.shape[1] == self.bits // 64
                and queries.flags.c_contiguous):
            return queries  # whole words, no bit above the code to check (~0.5 us less a call)
        try:
            return as_words(queries, self.bits)
        except ValueError as exc:
            raise ValueError(f"queries: {exc}") from None

    @staticmethod
    def _check_radius(max_distance, bits):
        if type(max_distance) is int and 0 <= max_distance <= bits:
            return max_distance
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

    def _new_ids(self, n: int, ids) -> np.ndarray:
        """Validated int64 ids of ``n`` new items (default ntotal..): one per item, none twice
        in the batch nor already in the index (:func:`bucketsearch.index.radix.repeated_id`:
        one pass when they increase, a radix sort otherwise; no pass over the index's ids when
        they all lie above its largest)."""
        if ids is None:
            start = int(self.ids.max()) + 1 if self.ntotal else 0
            return np.arange(start, start + n, dtype=np.int64)
        ids = np.asarray(ids)
        if ids.ndim != 1 or len(ids) != n or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids must be a 1-D int array of length {n} (one per code), "
                             f"got shape {ids.shape} and dtype {ids.dtype}")
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        twice = repeated_id(ids)
        if twice is not None:
            raise ValueError(f"ids: id {twice} appears more than once in the batch")
        if self.ntotal and n and int(ids.min()) <= int(self.ids.max()):
            clash = repeated_id(np.concatenate([self.ids, ids]))
            if clash is not None:
                raise ValueError(f"ids: id {clash} is already in the index")
        return ids

    def _merge_ids(self, words: np.ndarray, ids) -> tuple[np.ndarray, np.ndarray]:
        """Validated new ids (:meth:`_new_ids`) merged with the present (words, ids)."""
        ids = self._new_ids(len(words), ids)
        return (np.concatenate([self.words, words]), np.concatenate([self.ids, ids]))

    def build(self, words: np.ndarray, ids: np.ndarray, presorted: bool = False) -> None:
        """Replace the items by ``(n, W)`` uint64 ``words`` and int64 ``ids`` checked by the
        caller (unique; a live index's merge, whose ids were checked when written): no
        validation pass. ``presorted``: already in (code, id) order (no sort, for an engine
        that keeps that order; :attr:`sorted_by_code`)."""
        if presorted and self.sorted_by_code:
            self._rebuild_sorted(words, ids)
        else:
            self._rebuild(words, ids)
        trim_heap(len(ids))

    def add(self, codes, ids=None) -> None:
        """Add codes (any format of :func:`bucketsearch.index.codes.as_words`) with optional unique
        ids. An engine keeping its items in (code, id) order (:attr:`sorted_by_code`) sorts
        only the new items and merges them into its own in one pass
        (:func:`bucketsearch.index.table.merge_items`)."""
        words = as_words(codes, self.bits)
        if self.sorted_by_code and self.ntotal:
            ids = self._new_ids(len(words), ids)
            self._rebuild_sorted(*merge_items(self.words, self.ids, words, ids,
                                              self.build_threads))
        else:
            self._rebuild(*self._merge_ids(words, ids))
        trim_heap(self.ntotal)

    def remove(self, ids) -> int:
        """Remove items by id; unknown ids are ignored. Returns the number removed. An engine
        keeping (code, id) order keeps the remaining items' order (no sort)."""
        keep = ~np.isin(self.ids, np.asarray(ids, dtype=np.int64))
        removed = int((~keep).sum())
        if removed:
            rebuild = self._rebuild_sorted if self.sorted_by_code else self._rebuild
            rebuild(self.words[keep], self.ids[keep])
            trim_heap(self.ntotal)
        return removed

    def range_search(self, queries, max_distance: int, stats: bool = False,
                     max_results: int | None = None):
        """All items with ``d <= max_distance``: ``(lims, D, I)`` in faiss's CSR layout, each
        query's results ordered by (distance, id); with ``stats``, a fourth item
        :class:`SearchStats`.

        ``max_results`` caps the total number of results of the batch: the kernels stop once
        it is passed and :class:`ResultLimitError` is raised (memory stays within about
        threads x ``max_results`` results). A probing engine whose radius-``max_distance``
        probe count passes its ``max_probes`` raises :class:`ProbeLimitError` before any work.
        """
        R, xq = self._check_range(queries, max_distance, max_results)
        return self._run(xq, R, -1, stats, max_results)

    def _check_range(self, queries, max_distance, max_results) -> tuple[int, np.ndarray]:
        """Validated ``(R, xq)`` of a range search (radius, queries, result cap, probe limit)."""
        R = self._check_radius(max_distance, self.bits)
        xq = self._check_queries(queries)
        check_max_results(max_results)
        self._check_probe_limit(R)
        return R, xq

    def _check_probe_limit(self, R: int) -> None:
        """Raise :class:`ProbeLimitError` when a radius-R search passes ``max_probes`` (an
        engine without a probe limit: nothing)."""

    def _knn_csr(self, xq, k, stats, max_radius):
        return self._run(xq, max_radius, k, stats)

    def _tagged(self, st: SearchStats, k: int) -> SearchStats:
        """``st`` with what each query ran (``engine``, ``k``, ``codes_compared``; see
        :class:`SearchStats`): three small arrays, made only when statistics were asked."""
        nq = len(st.radii)
        engine = np.empty(nq, dtype=np.int8)
        engine.fill(_ENGINE_CODE[self.kind])
        st.engine = engine
        st.k = np.zeros(nq, dtype=np.int32)
        if k > 0:
            st.k.fill(k)
        codes = np.zeros(nq, dtype=np.int64)
        if self.kind == "scan":
            codes.fill(self.ntotal)
        elif k > 0 and st.scanned_from is not None:  # a range search never switches to a scan
            codes[st.scanned_from >= 0] = self.ntotal
        st.codes_compared = codes
        return st

    def pairs(self, radius: int, chunk_size: int = 65_536, min_id: int | None = None, **options):
        """Every unordered pair of items within ``radius``, once, in chunks ordered by (a, b):
        :func:`bucketsearch.index.join.pairs` over this index (``options``: its keyword
        arguments)."""
        from bucketsearch.index.join import pairs
        return pairs(self, radius, chunk_size=chunk_size, min_id=min_id, **options)

    def save(self, path, extra_meta: dict | None = None) -> None:
        """Write a checksummed snapshot directory (see :mod:`bucketsearch.index.storage.store`): the
        manifest's kind is :attr:`kind`, its meta and arrays those of :meth:`snapshot` (and
        ``extra_meta``'s fields: a live index's snapshot fields)."""
        meta, arrays = self.snapshot()
        save_arrays(path, self.kind, {"bits": self.bits, "ntotal": self.ntotal, **meta,
                                      **(extra_meta or {})}, arrays)

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

    def search(self, queries, k: int, max_distance: int | None = None, stats: bool = False):
        """Exact k-NN: ``(D, I)`` of shape ``(nq, k)``, ordered by (distance, id), padded with
        id -1 and distance -1; with ``max_distance``, the k nearest with ``d <= max_distance``
        (top-k within a radius: a row holds fewer than k items when fewer lie that close).

        The kernels stop at ``max_distance``: probing never goes past that radius, a scan keeps
        nothing farther. With ``stats``, a third item :class:`SearchStats`."""
        k = self._check_k(k)
        R = self.bits if max_distance is None else self._check_radius(max_distance, self.bits)
        lims, D, I, *rest = self._knn_csr(self._check_queries(queries), k, stats, R)
        out_d, out_i = csr_to_knn(lims, D, I, k)
        return (out_d, out_i, *rest)
