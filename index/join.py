"""Self-join: every unordered pair of live items within Hamming radius R, exactly once, streamed.

``pairs(index, R)`` yields :class:`PairChunk` s of int64 ``a``, ``b`` and int32 ``d`` with
``a < b`` (ids) and ``d = d(x_a, x_b) <= R``; each unordered pair of live items exactly once.

Order and chunks: pairs are ordered by ``a`` ascending, then ``b`` ascending. A chunk holds at
most ``chunk_size`` pairs, except that the pairs of one ``a`` are never split over two chunks
(a chunk exceeds ``chunk_size`` only when one item alone has more partners). So a consumer that
has written every chunk up to one whose last ``a`` is ``A`` resumes with ``min_id = A + 1``:
``min_id`` keeps the pairs with ``a >= min_id``, and since ``b > a`` the join then runs over the
items with ids ``>= min_id`` only.

Live items: an engine's items (:class:`~index.probe.HammingIndex`, :class:`~index.mih.
MultiIndex`, :class:`~index.scan.LinearScan`, :class:`~index.planner.AutoIndex`), or a
:class:`~index.storage.live.LiveState`'s (main minus tombstones, plus the delta), read through
their public ``ids`` / ``words`` (or ``LiveState.items()``).

Algorithms (:mod:`index.join_kernels`), chosen by predicted cost (:func:`predict_join`):

* ``scan``: all ``n (n - 1) / 2`` pairs compared by popcount; pairs come out in order (small n,
  or a radius close to Q).
* ``probe``: a bucket table of the items; every distinct code probes its ball of radius R
  (``sum_{r<=R} C(Q, r)`` lookups) and a pair of buckets is emitted from the smaller code only
  (few distinct codes: short codes, many duplicates).
* ``blocks`` ``(b, k)``: the code is cut into ``b >= R + k`` contiguous blocks; a pair within R
  differs on at most R blocks, so it agrees on at least ``k`` whole blocks (pigeonhole), i.e. on
  one of the ``C(b, k)`` tables of k blocks. ``k = 1``, ``b = R + 1`` is the multi-index
  hashing join of substring buckets (Norouzi et al.); ``k >= 2`` are the permuted tables of
  Manku, Jain & Das Sarma (WWW 2007). Per table the items are counting-sorted by a hash of the
  chosen blocks and the pairs of each bucket verified; a pair is emitted by the first table it
  agrees on only, so once.

``probe`` and ``blocks`` find pairs out of order: they go to sorted runs (:class:`_SortedRuns`:
in memory up to ``memory_pairs``, then spilled to temporary files and merged), so memory is
bounded whatever the pair count.

Checkpoints of the pair search (``on_checkpoint``): ``probe`` and ``blocks`` emit nothing until
every table is done, so ``min_id`` cannot resume them. With ``on_checkpoint`` the join makes its
runs durable (the pairs held spilled, every run fsynced, in ``spill_dir``) after a table
(``blocks``) or a step of codes (``probe``), at most every ``checkpoint_s``, and hands the
position (:func:`pairs`: ``resume``) to the callback; ``pairs(..., resume=position)`` over the
same items continues from there: the runs listed are taken as found, the tables or codes before
the position are not searched again. The join then leaves its runs for the caller to remove
(``spill_dir``).

Cost model (:func:`predict_join`): ``scan``: ``c_scan * n(n-1)/2``; ``probe``: ``c_probe *
probes`` with ``probes = nu * sum_{r<=R} C(Q, r)`` (``nu`` distinct codes); ``blocks``: ``C(b,
k) * n * (c_table + c_row) + c_candidate * candidates``; all plus ``c_pair * pairs`` (sorting and
emitting). Candidates and pairs are estimated from a sample of the index's own codes
(sample pairs scaled by ``n(n-1) / s(s-1)``); the constants are measured once per process on
this machine (:func:`join_constants`), in CPU seconds of the calling thread (the kernels run on
it): on a shared machine a thread's wall time per unit of work varies 2-5x with the load from
one process to the next, its CPU time by 1.0-1.5x (bench/RESULTS.md section 19). The predicted
wall time is the CPU time times the machine's slowdown measured just before (:func:`slowdown`:
wall over CPU time of a short fixed computation). :class:`JoinStats` reports measured against
modeled per phase, both in wall and in CPU seconds.
"""
from __future__ import annotations

import heapq
import itertools
import math
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

from bucketsearch.index.codes import as_words, check_bits, n_words, word_widths
from bucketsearch.index.join_kernels import (T_CANDIDATES, T_PAIRS, T_PROBES, block_pairs,
                                             drop_later, hash_blocks, probe_pairs, roots,
                                             rows_below, scan_pairs, union_pairs)
from bucketsearch.index.table import BucketTable

ALGORITHMS = ("scan", "probe", "blocks")
DEFAULT_CHUNK_SIZE = 65_536
#: pairs kept in memory before a sorted run is spilled to disk (20 bytes a pair)
DEFAULT_MEMORY_PAIRS = 8 << 20
#: output buffer of the kernels (pairs), at least the largest bucket when larger
KERNEL_BUFFER = 1 << 18
#: most tables a block scheme may have
MAX_TABLES = 1024
#: items of the sample the prediction reads
PREDICT_SAMPLE = 4_096
#: items per table of the hash-range sample that estimates a block join's pairs and candidates
RANGE_SAMPLE = 1 << 16
_EMPTY_I64 = np.empty(0, dtype=np.int64)
_EMPTY_I32 = np.empty(0, dtype=np.int32)


class JoinCancelled(RuntimeError):
    """The join was cancelled (:meth:`JoinStats.cancel`) before it finished."""


@dataclass(frozen=True)
class PairChunk:
    """Pairs ``a[i] < b[i]`` (int64 ids) at distance ``d[i]`` (int32), ordered by (a, b)."""

    a: np.ndarray
    b: np.ndarray
    d: np.ndarray

    def __len__(self) -> int:
        return len(self.a)

    @property
    def last_a(self) -> int:
        """The largest ``a`` of the chunk (-1 when empty): resume with ``min_id = last_a + 1``."""
        return int(self.a[-1]) if len(self.a) else -1


@dataclass
class JoinPrediction:
    """The cost model's view of a join before it runs.

    ``probes`` (bucket lookups: probe algorithm), ``candidates`` (pairs verified by their full
    distance), ``pairs`` (pairs within R) are expected counts; ``phases`` the predicted seconds
    of each phase (``tables``: building/probing the tables, ``verify``: candidates, ``emit``:
    ordering and emitting the pairs); ``alternatives`` the predicted seconds of every algorithm
    considered (None: not applicable). ``sample``: items the estimates were read from.
    ``cpu_phases``/``cpu_seconds``: the model's CPU seconds (of the joining thread); ``phases``
    and ``seconds`` are those times ``slowdown`` (wall over CPU time on this machine when the
    prediction was made, >= 1)."""

    algorithm: str
    params: dict
    items: int
    radius: int
    bits: int
    probes: float
    candidates: float
    pairs: float
    seconds: float
    phases: dict
    alternatives: dict
    sample: int
    cpu_seconds: float = 0.0
    cpu_phases: dict = field(default_factory=dict)
    slowdown: float = 1.0

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class JoinStats:
    """What a running join reports (filled in by :func:`pairs` as it goes; safe to read from
    another thread). ``phases[name] = {"measured_s", "modeled_s"}``; ``progress`` is the
    fraction of the pair search done (tables or rows), ``pairs`` the pairs found so far,
    ``pairs_emitted`` those yielded, ``items_done`` the live items whose pairs have all been
    yielded (ids up to the last ``a``)."""

    algorithm: str = ""
    params: dict = field(default_factory=dict)
    items: int = 0
    radius: int = 0
    prediction: JoinPrediction | None = None
    probes: int = 0
    candidates: int = 0
    pairs: int = 0
    pairs_emitted: int = 0
    items_done: int = 0
    progress: float = 0.0
    spilled_runs: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    phases: dict = field(default_factory=dict)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        """Ask the join to stop: it raises :class:`JoinCancelled` at its next step."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def elapsed_s(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def remaining_s(self) -> float | None:
        """The model's estimate of the time left: predicted seconds times the fraction left."""
        if self.prediction is None:
            return None
        if self.finished is not None:
            return 0.0
        done = min(max(self.progress, 0.0), 1.0)
        return max(self.prediction.seconds * (1.0 - done), 0.0)

    def phase(self, name: str, since: tuple[float, float]) -> None:
        """Add the wall and CPU time since ``since`` (a :func:`clock`) to phase ``name``."""
        wall, cpu = clock()
        pred = self.prediction
        entry = self.phases.get(name)
        if entry is None:
            entry = self.phases[name] = {
                "measured_s": 0.0, "modeled_s": pred.phases.get(name) if pred else None,
                "measured_cpu_s": 0.0,
                "modeled_cpu_s": pred.cpu_phases.get(name) if pred else None}
        entry["measured_s"] += wall - since[0]
        entry["measured_cpu_s"] += cpu - since[1]

    def _check(self) -> None:
        if self._cancel.is_set():
            raise JoinCancelled("the join was cancelled")

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "params": self.params, "items": self.items,
                "radius": self.radius, "probes": self.probes, "candidates": self.candidates,
                "pairs": self.pairs, "pairs_emitted": self.pairs_emitted,
                "items_done": self.items_done, "progress": self.progress,
                "spilled_runs": self.spilled_runs, "elapsed_s": self.elapsed_s,
                "remaining_s": self.remaining_s(), "phases": self.phases,
                "prediction": self.prediction.to_dict() if self.prediction else None}


def clock() -> tuple[float, float]:
    """``(wall, CPU of this thread)`` now, in seconds: a phase's start
    (:meth:`JoinStats.phase`)."""
    return time.perf_counter(), time.thread_time()


# ---------------------------------------------------------------------------------- items
def _is_live_state(index) -> bool:
    return hasattr(index, "tombstones") and hasattr(index, "delta_ids") and \
        callable(getattr(index, "items", None))


def live_items(index, min_id: int | None = None) -> tuple[int, np.ndarray, np.ndarray]:
    """``(bits, ids, words)`` of the live items of an engine or a live state, ordered by id,
    those with ``id >= min_id`` only when given."""
    if _is_live_state(index):
        ids, words = index.items()
    else:
        ids, words = index.ids, index.words
    bits = int(index.bits)
    ids = np.asarray(ids, dtype=np.int64)
    words = np.asarray(words, dtype=np.uint64).reshape(len(ids), n_words(bits))
    if min_id is not None:
        keep = ids >= int(min_id)
        if not keep.all():
            ids, words = ids[keep], words[keep]
    if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
        order = np.argsort(ids, kind="stable")
        ids, words = ids[order], words[order]
    return bits, np.ascontiguousarray(ids), np.ascontiguousarray(words)


def _check_radius(radius, bits: int) -> int:
    if isinstance(radius, bool) or not isinstance(radius, (int, np.integer)) \
            or not 0 <= int(radius) <= bits:
        raise ValueError(f"radius must be an int in [0, {bits}], got {radius!r}")
    return int(radius)


def _check_positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------- blocks
def bit_masks(bits: int) -> tuple[np.ndarray, np.ndarray]:
    """For every bit position ``j`` of a code: its word and the mask of that bit there (bit
    ``j`` is the ``j``-th most significant, :mod:`index.codes`)."""
    word = np.empty(bits, dtype=np.int64)
    mask = np.empty(bits, dtype=np.uint64)
    j = 0
    for w, width in enumerate(word_widths(bits)):
        for i in range(width):
            word[j], mask[j] = w, np.uint64(1) << np.uint64(width - 1 - i)
            j += 1
    return word, mask


def block_masks(bits: int, b: int, k: int) -> np.ndarray:
    """``(C(b, k), W)`` uint64 masks of the tables of scheme ``(b, k)``: the code cut into ``b``
    contiguous blocks (the first ``Q mod b`` one bit wider), one table per k-subset of blocks in
    lexicographic order (the order that decides which table emits a pair)."""
    word, mask = bit_masks(bits)
    widths = [bits // b + (1 if j < bits % b else 0) for j in range(b)]
    starts = np.concatenate([[0], np.cumsum(widths)]).astype(int)
    block = np.zeros((b, n_words(bits)), dtype=np.uint64)
    for j in range(b):
        for p in range(starts[j], starts[j + 1]):
            block[j, word[p]] |= mask[p]
    tables = [np.bitwise_or.reduce(block[list(c)], axis=0)
              for c in itertools.combinations(range(b), k)]
    return np.ascontiguousarray(np.array(tables, dtype=np.uint64).reshape(-1, n_words(bits)))


def block_schemes(bits: int, radius: int) -> list[tuple[int, int]]:
    """The schemes ``(b, k)`` worth considering: ``b = R + k`` (the fewest blocks for ``k``, so
    the longest keys) with at most :data:`MAX_TABLES` tables and blocks of at least one bit."""
    out = []
    for k in range(1, bits + 1):
        b = radius + k
        if b > bits or math.comb(b, k) > MAX_TABLES:
            break
        out.append((b, k))
    return out


# ---------------------------------------------------------------------------------- sorted runs
class _SortedRuns:
    """Pairs of rows found out of order, handed back ordered by (a, b): each pair packed in one
    uint64 key ``a << (p + e) | b << e | d`` (``p`` bits a row, ``e`` bits a distance; with
    rows past 2^27 the key is ``a << 32 | b`` and ``d`` travels beside it), so one ``np.sort``
    orders them. Kept in memory up to ``memory_pairs``, then each batch sorted and spilled as a
    run (raw files in ``spill_dir``, a temporary directory by default), the runs merged at the
    end by blocks read from the files."""

    def __init__(self, n: int, R: int, memory_pairs: int, spill_dir=None,
                 stats: JoinStats | None = None, runs=None, keep: bool = False,
                 side: np.ndarray | None = None):
        self.row_bits = max(int(n - 1).bit_length(), 1)
        self.d_bits = max(int(R).bit_length(), 1)
        self.packed = 2 * self.row_bits + self.d_bits <= 64
        if not self.packed:
            self.row_bits, self.d_bits = 32, 0
        self.memory_pairs = memory_pairs
        self.spill_dir = spill_dir
        self.stats = stats
        self.parts: list[tuple[np.ndarray, np.ndarray | None]] = []
        self.held = 0
        # runs found before a resume (durable), then this join's; ``keep``: close() leaves
        # them (a join with checkpoints: the caller removes spill_dir)
        self.runs: list[tuple[Path, int]] = [(Path(r), int(size)) for r, size in runs or []]
        self._synced = len(self.runs)
        self.keep = keep
        self.side = side  # a cross join (index.crossjoin): keep the pairs across sides only
        self._tmp: Path | None = None

    def add(self, a, b, d) -> int:
        """Hold the pairs of rows ``a < b`` (those across ``side`` only, when given); returns
        how many were kept."""
        if self.side is not None:
            a, b, d = _across(self.side, a, b, d)
        if not len(a):
            return 0
        e, p = np.uint64(self.d_bits), np.uint64(self.row_bits)
        key = (a.astype(np.uint64) << (p + e)) | (b.astype(np.uint64) << e)
        if self.packed:
            key |= d.astype(np.uint64)
        self.parts.append((key, None if self.packed else d.copy()))
        self.held += len(a)
        if self.held >= self.memory_pairs:
            self._spill()
        return len(a)

    def _unpack(self, key, d):
        e, p = np.uint64(self.d_bits), np.uint64(self.row_bits)
        a = (key >> (p + e)).astype(np.int64)
        b = ((key >> e) & np.uint64((1 << self.row_bits) - 1)).astype(np.int64)
        if self.packed:
            d = (key & np.uint64((1 << self.d_bits) - 1)).astype(np.int32)
        return a, b, d

    def _sorted_parts(self):
        if not self.parts:
            return np.empty(0, np.uint64), None if self.packed else _EMPTY_I32
        key = np.concatenate([k for k, _ in self.parts])
        d = None if self.packed else np.concatenate([x for _, x in self.parts])
        self.parts, self.held = [], 0
        if self.packed:
            key.sort()
            return key, None
        order = np.argsort(key, kind="stable")
        return key[order], d[order]

    def _spill(self) -> None:
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="bucketsearch-join-", dir=self.spill_dir))
        key, d = self._sorted_parts()
        run = self._tmp / f"run-{len(self.runs):05d}"
        run.mkdir()
        key.tofile(run / "key.u64")
        if d is not None:
            d.tofile(run / "d.i32")
        self.runs.append((run, len(key)))
        if self.stats is not None:
            self.stats.spilled_runs = len(self.runs)

    def sorted_blocks(self, block: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The pairs ``(a, b, d)`` in (a, b) order, in blocks of about ``block`` pairs."""
        try:
            if not self.runs:
                key, d = self._sorted_parts()
                for s in range(0, len(key), block):
                    yield self._unpack(key[s:s + block], None if d is None else d[s:s + block])
                return
            if self.parts:
                self._spill()
            yield from self._merge(block)
        finally:
            self.close()

    def _merge(self, block: int):
        """Merge of the runs by blocks: from every run its next ``block`` keys; the keys up to
        the smallest last key of a run that has more are final, sorted and handed out."""
        runs = self.runs
        pos = [0] * len(runs)
        heads = [self._read(i, 0, block) for i in range(len(runs))]
        while True:
            frontier = None
            for i, (run, size) in enumerate(runs):
                if pos[i] + block < size:
                    last = int(heads[i][0][-1])
                    frontier = last if frontier is None else min(frontier, last)
            keys, ds = [], []
            for i in range(len(runs)):
                part, dpart = heads[i]
                cut = len(part) if frontier is None else \
                    int(np.searchsorted(part, np.uint64(frontier), side="right"))
                keys.append(part[:cut])
                if dpart is not None:
                    ds.append(dpart[:cut])
                pos[i] += cut
                heads[i] = self._read(i, pos[i], block)
            key = np.concatenate(keys)
            if not len(key):
                return
            if self.packed:
                key.sort()
                yield self._unpack(key, None)
            else:
                order = np.argsort(key, kind="stable")
                yield self._unpack(key[order], np.concatenate(ds)[order])

    def _read(self, i: int, start: int, block: int):
        """Run ``i``'s keys (and distances) ``start .. start + block``, read from its files
        (plain reads, not a memory map: mapped pages would count in the resident size)."""
        run, size = self.runs[i]
        count = max(min(block, size - start), 0)
        key = np.fromfile(run / "key.u64", dtype=np.uint64, count=count, offset=8 * start)
        d = None if self.packed else np.fromfile(run / "d.i32", dtype=np.int32, count=count,
                                                 offset=4 * start)
        return key, d

    def durable(self) -> list[list]:
        """Spill the pairs held, fsync every run not yet synced (files, folders), and return
        the runs as ``[[path, pairs], ...]`` (a checkpoint's ``runs``)."""
        if self.parts:
            self._spill()
        for run, _ in self.runs[self._synced:]:
            for file in sorted(run.iterdir()):
                _fsync(file)
            _fsync(run)
        if len(self.runs) > self._synced:
            _fsync(self.runs[-1][0].parent)
            self._synced = len(self.runs)
        return [[str(run), size] for run, size in self.runs]

    def close(self) -> None:
        self.parts = []
        if self._tmp is not None and not self.keep:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def _across(side: np.ndarray, a, b, d):
    """The pairs of rows whose two rows are on different sides."""
    keep = side[a] != side[b]
    return a[keep], b[keep], d[keep]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Checkpoints:
    """The pair search's checkpoints (module docstring): ``after(**position)`` makes the runs
    durable and calls ``callback(state)`` at most every ``interval_s`` seconds."""

    def __init__(self, callback, interval_s: float, sink: _SortedRuns, stats: JoinStats,
                 base: dict):
        self.callback, self.interval_s, self.sink, self.stats = callback, interval_s, sink, stats
        self.base = base
        self.last = time.monotonic()

    def after(self, **position) -> None:
        if self.callback is None or time.monotonic() - self.last < self.interval_s:
            return
        runs = self.sink.durable()
        self.callback({**self.base, **position, "runs": runs, "pairs": int(self.stats.pairs),
                       "candidates": int(self.stats.candidates),
                       "probes": int(self.stats.probes)})
        self.last = time.monotonic()


def _chunked(blocks, chunk_size: int, ids: np.ndarray, stats: JoinStats) -> Iterator[PairChunk]:
    """Sorted blocks of pairs of rows re-cut into :class:`PairChunk` s of ids, at most
    ``chunk_size`` pairs, never splitting the pairs of one ``a`` (see the module docstring)."""
    pend: list[tuple] = []
    held = 0

    def cut_out(final: bool):
        nonlocal pend, held
        a = np.concatenate([p[0] for p in pend])
        b = np.concatenate([p[1] for p in pend])
        d = np.concatenate([p[2] for p in pend]).astype(np.int32, copy=False)
        out = []
        start = 0
        while len(a) - start > chunk_size or (final and start < len(a)):
            if len(a) - start <= chunk_size:
                end = len(a)
            else:
                # the last boundary between two values of a at or before start + chunk_size
                at = start + chunk_size
                if a[at] != a[at - 1]:
                    end = at
                else:
                    end = int(np.searchsorted(a[start:at], a[at], side="left")) + start
                    if end == start:  # one a holds more than chunk_size pairs: all of it
                        end = int(np.searchsorted(a, a[start], side="right"))
                        if end == len(a) and not final:
                            break  # its pairs may go on in the next block
            out.append(PairChunk(ids[a[start:end]], ids[b[start:end]], d[start:end]))
            start = end
        rest = (a[start:], b[start:], d[start:])
        pend, held = ([rest], len(rest[0])) if len(rest[0]) else ([], 0)
        return out

    def emit(chunk: PairChunk):
        stats.pairs_emitted += len(chunk)
        stats.items_done = int(np.searchsorted(ids, chunk.last_a, side="right"))
        return chunk

    for a, b, d in blocks:
        stats._check()
        if not len(a):
            continue
        pend.append((a, b, d))
        held += len(a)
        if held > chunk_size:
            for chunk in cut_out(False):
                yield emit(chunk)
    if held:
        for chunk in cut_out(True):
            yield emit(chunk)
    stats.items_done = len(ids)


# ---------------------------------------------------------------------------------- algorithms
def _buffers(size: int):
    return np.empty(size, np.int64), np.empty(size, np.int64), np.empty(size, np.int32)


def _scan_blocks(words, R, stats: JoinStats, buffer: int, side: np.ndarray | None = None):
    """Pairs of rows by the linear scan, already in order (across ``side`` only, when
    given)."""
    out = _buffers(buffer)
    rows = np.arange(len(words), dtype=np.int64)
    tally = np.zeros(3, np.int64)
    n = len(words)
    i = j = 0
    while i < n:
        stats._check()
        t0 = clock()
        # rows of about 2^24 comparisons a call, so progress and a cancel are seen
        i_end = min(n, i + max(1, (1 << 24) // max(n - i, 1)))
        i, j, n_out = scan_pairs(words, rows, R, i, j, i_end, *out, tally)
        found = out[0][:n_out].copy(), out[1][:n_out].copy(), out[2][:n_out].copy()
        if side is not None:
            found = _across(side, *found)
        stats.candidates = int(tally[T_CANDIDATES])
        stats.pairs += len(found[0])
        done = n * (n - 1) / 2 - (n - i) * (n - i - 1) / 2
        stats.progress = done / max(n * (n - 1) / 2, 1)
        stats.phase("verify", t0)
        yield found


def _probe_into(words, bits, R, sink: _SortedRuns, stats: JoinStats, buffer: int,
                ck: _Checkpoints | None = None, resume: dict | None = None):
    t0 = clock()
    n = len(words)
    table = BucketTable.build(bits, words, np.arange(n, dtype=np.int64))
    codes, offsets, rows = table.codes, table.offsets, table.ids
    fw, fm = bit_masks(bits)
    lookup = table.lookup_args()[1:]  # slots, bitmap, table_shift, filter_shift, direct
    out = _buffers(buffer)
    hits = np.empty(1024, np.int64)
    tally = np.zeros(3, np.int64)
    nu = len(codes)
    per_code = sum(math.comb(bits, r) for r in range(R + 1))
    step = max(1, (1 << 22) // per_code)  # buckets a call: about 2^22 probes
    stats.phase("tables", t0)
    u, r = (int(resume["u"]), int(resume["r"])) if resume else (0, 0)
    while u < nu:
        stats._check()
        t0 = clock()
        u_end = min(nu, u + step)
        u, r, n_out, need = probe_pairs(codes, offsets, rows, *lookup, bits, fw, fm, R, u, r,
                                        u_end, hits, *out, tally)
        stats.phase("verify", t0)
        t0 = clock()
        kept = sink.add(out[0][:n_out], out[1][:n_out], out[2][:n_out])
        stats.phase("emit", t0)
        if need:
            hits = np.empty(2 * need, np.int64)
        elif n_out == 0 and u < u_end:
            out = _buffers(2 * len(out[0]))  # one step needs more room than the buffers have
        stats.probes, stats.candidates = int(tally[T_PROBES]), int(tally[T_CANDIDATES])
        stats.pairs += kept
        stats.progress = u / max(nu, 1)
        if ck is not None:
            ck.after(u=u, r=r)


class _BlockTable:
    """The buffers of one block table's radix sort, reused table after table (rows int32:
    fewer than 2^31 items)."""

    def __init__(self, words: np.ndarray):
        self.words = words
        n, W = words.shape
        if n >= 2**31:
            raise ValueError(f"a block join takes fewer than 2^31 items, got {n}")
        self.n = n
        self.top_bits = int(min(32, max(2, math.ceil(math.log2(max(n, 2))) + 2)))
        self.order, self.tmp_order = np.empty(n, np.int32), np.empty(n, np.int32)
        self.sorted_h, self.tmp_h = np.empty(n, np.uint64), np.empty(n, np.uint64)
        self.sorted_w, self.tmp_w = np.empty((n, W), np.uint64), np.empty((n, W), np.uint64)
        self.counts = np.empty((1 << (self.top_bits - self.top_bits // 2)) + 1, np.int64)

    def sort(self, mask: np.ndarray) -> int:
        return hash_blocks(self.words, mask, self.top_bits, self.order, self.sorted_h,
                           self.sorted_w, self.tmp_order, self.tmp_h, self.tmp_w, self.counts)

    def pairs(self, R, t, masks, p, out, tally):
        return block_pairs(self.sorted_w, self.order, self.sorted_h, R, t, masks,
                           self.top_bits, p, *out, tally)


def _blocks_into(words, bits, R, scheme, sink: _SortedRuns, stats: JoinStats, buffer: int,
                 ck: _Checkpoints | None = None, resume: dict | None = None):
    masks = block_masks(bits, *scheme)
    table = _BlockTable(words)
    out = _buffers(buffer)
    tally = np.zeros(3, np.int64)
    n = len(words)
    for t in range(int(resume["tables_done"]) if resume else 0, len(masks)):
        stats._check()
        t0 = clock()
        longest = table.sort(masks[t])
        stats.phase("tables", t0)
        if longest > len(out[0]):
            out = _buffers(longest)
        p = 0
        while p < n:
            stats._check()
            t0 = clock()
            p, n_out = table.pairs(R, t, masks, p, out, tally)
            stats.phase("verify", t0)
            t0 = clock()
            kept = sink.add(out[0][:n_out], out[1][:n_out], out[2][:n_out])
            stats.phase("emit", t0)
            stats.candidates = int(tally[T_CANDIDATES])
            stats.pairs += kept
        stats.progress = (t + 1) / len(masks)
        if ck is not None:
            ck.after(tables_done=t + 1)


# ---------------------------------------------------------------------------------- model
_CONSTANTS: dict[int, dict] = {}
_CONSTANTS_LOCK = threading.Lock()


def join_constants(W: int) -> dict:
    """CPU seconds (of the calling thread) per unit of work of each phase for ``W``-word codes,
    measured once per process on this machine on uniform codes, each the median of three runs
    (CPU time, not wall time: under a shared machine's load the wall time of the same
    calibration varied 2.4-4.6x between processes, its CPU time 1.0-1.5x; bench/RESULTS.md
    section 19): ``table_item`` (one item
    through one block table's radix sort, at 2^18 and 2^21 items: ``table_item_small`` /
    ``_large``), ``row`` (one sorted row of a table read for its candidates), ``candidate`` (one
    verified candidate), ``scan_pair`` (one pair compared by the scan), ``probe`` (one
    bucket lookup), ``pair`` (one pair sorted and emitted)."""
    with _CONSTANTS_LOCK:
        if W in _CONSTANTS:
            return _CONSTANTS[W]
        rng = np.random.default_rng(12345)
        bits = 64 * W
        out = {}
        tally = np.zeros(3, np.int64)
        buf = _buffers(1 << 16)
        for label, n in (("table_item_small", 1 << 18), ("table_item_large", 1 << 21)):
            words = rng.integers(0, 2**63, size=(n, W), dtype=np.uint64)
            masks = block_masks(bits, bits // 16, 1)  # 16-bit blocks
            table = _BlockTable(words)
            _BlockTable(words[:64]).sort(masks[0])  # compiled
            times = []
            for _ in range(3):
                t0 = time.thread_time()
                table.sort(masks[0])
                times.append(time.thread_time() - t0)
            out[label] = float(np.median(times)) / n
            if label == "table_item_large":  # rows: whole codes as keys (almost no candidates)
                mk = block_masks(bits, 1, 1)
                table.sort(mk[0])
                times = []
                for _ in range(3):
                    t0 = time.thread_time()
                    p = 0
                    while p < n:
                        p, _ = table.pairs(3, 0, mk, p, buf, tally)
                    times.append(time.thread_time() - t0)
                out["row"] = float(np.median(times)) / n
                spent, rows, cands = cand_run
                out["candidate"] = max(spent - out["row"] * rows, spent / 10) / cands
            if label == "table_item_small":
                # candidates: 8-bit keys over 2^15 items (runs of 128, 2^21 candidates)
                tb = _BlockTable(np.ascontiguousarray(words[:1 << 15]))
                mk = block_masks(bits, bits // 8, 1)
                tb.sort(mk[0])
                big = _buffers(tb.n)
                tb.pairs(3, 0, mk, tb.n - 2, big, tally)
                times = []
                for _ in range(3):
                    tally[:] = 0
                    t0 = time.thread_time()
                    p = 0
                    while p < tb.n:
                        p, _ = tb.pairs(3, 0, mk, p, big, tally)
                    times.append(time.thread_time() - t0)
                best = float(np.median(times))
                # the rows' time is taken off once the row cost is known (at 2^21)
                cand_run = (best, tb.n, max(int(tally[T_CANDIDATES]), 1))
                # scan: 4096 rows against each other
                rows = np.arange(n, dtype=np.int64)
                sw, si = words[:4096], rows[:4096]
                scan_pairs(sw[:16], si[:16], 3, 0, 0, 16, *buf, tally)
                tally[:] = 0
                t0 = time.thread_time()
                scan_pairs(sw, si, 3, 0, 0, len(si), *buf, tally)
                out["scan_pair"] = (time.thread_time() - t0) / max(int(tally[T_CANDIDATES]), 1)
                # probes: radius 2 around 2048 distinct codes of a table of 2^18
                bt = BucketTable.build(bits, words, rows)
                fw, fm = bit_masks(bits)
                hits = np.empty(1 << 16, np.int64)
                args = (bt.codes, bt.offsets, bt.ids, *bt.lookup_args()[1:], bits, fw, fm)
                probe_pairs(*args, 1, 0, 0, 16, hits, *buf, tally)
                tally[:] = 0
                t0 = time.thread_time()
                probe_pairs(*args, 2, 0, 0, 2048, hits, *buf, tally)
                out["probe"] = (time.thread_time() - t0) / max(int(tally[T_PROBES]), 1)
            # pair: one pair packed, sorted, unpacked and cut into chunks (2^20 pairs)
        m = 1 << 20
        pa = np.sort(rng.integers(0, 1 << 23, m))
        pb = pa + rng.integers(1, 1 << 20, m)
        ids = np.arange(1 << 24, dtype=np.int64)
        times = []
        for _ in range(3):
            sink = _SortedRuns(1 << 24, 8, 1 << 30)
            t0 = time.thread_time()
            sink.add(pb, pa, (pa & 7).astype(np.int32))
            for _ in _chunked(sink.sorted_blocks(1 << 16), DEFAULT_CHUNK_SIZE, ids,
                              JoinStats()):
                pass
            times.append(time.thread_time() - t0)
        out["pair"] = float(np.median(times)) / m
        _CONSTANTS[W] = out
        return out


_SLOWDOWN: list = [0.0, 1.0]  # (when measured, value)


def slowdown(since: tuple[float, float] | None = None, cpu_seconds: float = 0.05) -> float:
    """How much longer than its CPU time a CPU-bound thread takes on this machine now: wall over
    CPU time of this thread (>= 1; about 1 on an idle machine) since ``since`` (a :func:`clock`
    taken before CPU-bound work, e.g. the prediction's sampling), topped up by a fixed
    computation until the window holds ``cpu_seconds`` of CPU time (at most 20 x
    ``cpu_seconds`` of wall time). A measurement less than a second old is reused."""
    now = time.monotonic()
    if now - _SLOWDOWN[0] < 1.0:
        return _SLOWDOWN[1]
    a = np.arange(1 << 15, dtype=np.uint64)
    b = np.empty_like(a)
    w0, c0 = since if since is not None else clock()
    while True:
        for _ in range(16):
            np.right_shift(a, 3, out=b)
            np.bitwise_xor(a, b, out=a)
        w, c = clock()
        if c - c0 >= cpu_seconds or w - w0 >= 20 * cpu_seconds:
            break
    value = max((w - w0) / max(c - c0, 1e-9), 1.0)
    _SLOWDOWN[:] = [time.monotonic(), value]
    return value


def _table_item_seconds(c: dict, n: int) -> float:
    """Seconds per item of one table at ``n`` items: log-linear between the two measured sizes
    (the groups' counters and the scatter leave the caches as n grows), flat outside."""
    lo, hi = 18.0, 21.0
    x = min(max(math.log2(max(n, 2)), lo), hi + 3)
    slope = (c["table_item_large"] - c["table_item_small"]) / (hi - lo)
    return max(c["table_item_small"] + slope * (x - lo), c["table_item_small"])


def _sample(ids, words, size: int, seed: int = 0):
    n = len(ids)
    if n <= size:
        return words, 1.0
    idx = np.sort(np.random.default_rng(seed).choice(n, size, replace=False))
    s = size
    return np.ascontiguousarray(words[idx]), (n * (n - 1)) / (s * (s - 1))


def _sample_pairs(sw, R) -> int:
    """Pairs within R of the sample (the scan kernel)."""
    s = len(sw)
    rows = np.arange(s, dtype=np.int64)
    tally = np.zeros(3, np.int64)
    buf = _buffers(1 << 16)
    i = j = 0
    while i < s:
        i, j, _ = scan_pairs(sw, rows, R, i, j, s, *buf, tally)
    return int(tally[T_PAIRS])


def _sample_candidates(sw, masks) -> int:
    """Candidates of the sample in the tables of ``masks`` (pairs with equal hashes)."""
    s = len(sw)
    table = _BlockTable(sw)
    buf = _buffers(max(s, 1))
    tally = np.zeros(3, np.int64)
    for t in range(len(masks)):
        table.sort(masks[t])
        p = 0
        while p < s:  # R = -1: candidates counted, none emitted
            p, _ = table.pairs(-1, t, masks, p, buf, tally)
    return int(tally[T_CANDIDATES])


def _range_estimate(words, R, masks) -> tuple[float, float]:
    """``(pairs, candidates)`` of a block join estimated on a slice of each table's hash range:
    per table the items whose hash is below ``f 2^64`` (``f = RANGE_SAMPLE / n``) are joined
    as the table would (a pair counted by its first agreeing table). A pair of table ``t`` has
    one hash there, so it is in the slice with probability ``f``: both counts divided by ``f``
    are unbiased (this sees planted near-duplicates that a sample of items misses)."""
    n = len(words)
    f = min(1.0, RANGE_SAMPLE / max(n, 1))
    threshold = np.uint64(min(int(f * 2.0**64), 2**64 - 1))
    rows = np.empty(n, np.int64)
    tally = np.zeros(3, np.int64)
    for t in range(len(masks)):
        k = rows_below(words, masks[t], threshold, rows) if f < 1.0 else n
        sub = np.ascontiguousarray(words[rows[:k]]) if f < 1.0 else words
        if len(sub) < 2:
            continue
        table = _BlockTable(sub)
        longest = table.sort(masks[t])
        buf = _buffers(max(longest, 1 << 12))
        p = 0
        while p < len(sub):
            p, _ = table.pairs(R, t, masks, p, buf, tally)
    return float(tally[T_PAIRS]) / f, float(tally[T_CANDIDATES]) / f


def _predict(bits, ids, words, R) -> JoinPrediction:
    start = clock()
    n = len(ids)
    W = n_words(bits)
    c = join_constants(W)
    schemes = block_schemes(bits, R) if n > 1 else []
    masks_by_scheme = {s: block_masks(bits, *s) for s in schemes}  # (at most MAX_TABLES)
    sw, scale = _sample(ids, words, PREDICT_SAMPLE)
    pairs = _sample_pairs(sw, R) * scale
    emit_s = c["pair"] * pairs
    total_pairs = n * (n - 1) / 2
    alt, detail = {}, {}
    # scan: pairs come out in order (no sort: half the emit cost)
    scan_t = c["scan_pair"] * total_pairs * W
    alt["scan"] = scan_t + emit_s / 2
    detail["scan"] = ({}, 0.0, total_pairs, {"tables": 0.0, "verify": scan_t,
                                             "emit": emit_s / 2})
    # probe: distinct codes of the sample scaled (at most n and 2^Q)
    if len(sw):
        su = len(np.unique(sw, axis=0))
        nu = min(n, su * n / len(sw), 2.0 ** bits)
    else:
        nu = 0.0
    probes = nu * sum(math.comb(bits, r) for r in range(R + 1))
    probe_t = c["probe"] * probes
    build = _table_item_seconds(c, n) * n * 2
    alt["probe"] = build + probe_t + emit_s
    detail["probe"] = ({}, probes, pairs, {"tables": build, "verify": probe_t, "emit": emit_s})
    table_s = _table_item_seconds(c, n) + c["row"]
    for scheme in schemes:  # more tables as k grows: stop once the tables alone cost more
        T = len(masks_by_scheme[scheme])
        if T * n * table_s > min(alt.values()):
            break
        s_cands = _sample_candidates(sw, masks_by_scheme[scheme])
        cands = s_cands * scale
        tables = T * n * _table_item_seconds(c, n)
        verify = c["candidate"] * cands + T * n * c["row"]
        t = tables + verify + emit_s
        name = f"blocks{scheme}"
        alt[name] = t
        detail[name] = ({"b": scheme[0], "k": scheme[1], "tables": T}, 0.0, cands,
                        {"tables": tables, "verify": verify, "emit": emit_s})
    choice = min(alt, key=lambda m: alt[m])
    params, probes_c, cands_c, phases = detail[choice]
    if choice.startswith("blocks") and n > 1:  # the chosen scheme's counts, from its tables
        scheme = (params["b"], params["k"])
        pairs, cands_c = _range_estimate(words, R, masks_by_scheme[scheme])
        emit_s = c["pair"] * pairs
        T = params["tables"]
        phases = {"tables": phases["tables"],
                  "verify": c["candidate"] * cands_c + T * n * c["row"], "emit": emit_s}
        alt[choice] = sum(phases.values())
    f = slowdown(start)  # the model is in CPU seconds; the join's wall time is f times more
    return JoinPrediction(
        algorithm="blocks" if choice.startswith("blocks") else choice, params=params, items=n,
        radius=R, bits=bits, probes=probes_c, candidates=cands_c, pairs=pairs,
        seconds=alt[choice] * f, phases={k: v * f for k, v in phases.items()},
        alternatives={k: v * f for k, v in alt.items()}, sample=len(sw),
        cpu_seconds=alt[choice], cpu_phases=phases, slowdown=f)


def predict_join(index, radius: int, *, min_id: int | None = None) -> JoinPrediction:
    """The cost model's prediction of ``pairs(index, radius)``: the algorithm it would choose,
    its expected probes, candidates and pairs, and its seconds per phase (see the module
    docstring), from a sample of the index's own live codes and the constants measured on this
    machine (:func:`join_constants`)."""
    bits, ids, words = live_items(index, min_id)
    return _predict(bits, ids, words, _check_radius(radius, bits))


# ---------------------------------------------------------------------------------- pairs
def pairs(index, radius: int, *, chunk_size: int = DEFAULT_CHUNK_SIZE, min_id: int | None = None,
          stats: JoinStats | None = None, algorithm: str | None = None,
          scheme: tuple[int, int] | None = None, memory_pairs: int = DEFAULT_MEMORY_PAIRS,
          spill_dir=None, prediction: JoinPrediction | None = None, on_checkpoint=None,
          checkpoint_s: float = 10.0, resume: dict | None = None) -> Iterator[PairChunk]:
    """Every unordered pair of live items within ``radius``, once, as :class:`PairChunk` s
    ordered by (a, b) (module docstring: order, chunks, ``min_id``).

    ``stats`` (a :class:`JoinStats`) is filled in as the join runs (progress, counts, measured
    against modeled per phase) and can cancel it. ``algorithm`` (``"scan"``, ``"probe"``,
    ``"blocks"``) and ``scheme`` (``(b, k)`` of blocks) override the cost model's choice;
    ``memory_pairs`` bounds the pairs held in memory before a sorted run is spilled to
    ``spill_dir`` (a temporary directory by default). ``prediction``: a :func:`predict_join`
    of the same index, radius and ``min_id`` already made (else the join makes its own).
    ``on_checkpoint(position)``, ``checkpoint_s``, ``resume``: the pair search's checkpoints
    (module docstring; ``spill_dir`` is then required and left for the caller to remove)."""
    bits, ids, words = live_items(index, min_id)
    R = _check_radius(radius, bits)
    chunk_size = _check_positive("chunk_size", chunk_size)
    memory_pairs = _check_positive("memory_pairs", memory_pairs)
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)} or None, got "
                         f"{algorithm!r}")
    if scheme is not None:
        b, k = (int(x) for x in scheme)
        if not (1 <= k and R + k <= b <= bits):
            raise ValueError(f"scheme (b, k) must have k >= 1 and R + k <= b <= {bits} "
                             f"(R = {R}), got {scheme!r}")
        scheme = (b, k)
        algorithm = algorithm or "blocks"
    if (on_checkpoint is not None or resume is not None) and spill_dir is None:
        raise ValueError("spill_dir: the pair search's checkpoints keep their runs there; "
                         "give a folder")
    if resume is not None:
        algorithm, scheme = _check_resume(resume, len(ids), R, bits)
    stats = stats if stats is not None else JoinStats()
    if prediction is not None and (prediction.items, prediction.radius, prediction.bits) != (
            len(ids), R, bits):
        raise ValueError(f"prediction: made for {prediction.items} items, radius "
                         f"{prediction.radius}, {prediction.bits} bits; this join has "
                         f"{len(ids)} items, radius {R}, {bits} bits")
    return _pairs(bits, ids, words, R, chunk_size, stats, algorithm, scheme, memory_pairs,
                  spill_dir, prediction, (on_checkpoint, float(checkpoint_s), resume))


def _check_resume(resume: dict, n: int, R: int, bits: int) -> tuple[str, tuple | None]:
    """``(algorithm, scheme)`` of a checkpoint's position, checked against this join."""
    try:
        algorithm = resume["algorithm"]
        same = (int(resume["items"]), int(resume["radius"]), int(resume["bits"])) == (n, R, bits)
        runs = [(Path(p), int(size)) for p, size in resume["runs"]]
        scheme = tuple(int(x) for x in resume["scheme"]) if algorithm == "blocks" else None
        position = int(resume["tables_done"]) if algorithm == "blocks" else \
            (int(resume["u"]), int(resume["r"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"resume: not a checkpoint of the pair search ({exc!r})") from None
    if algorithm not in ("blocks", "probe") or not same:
        raise ValueError(f"resume: a checkpoint of a {algorithm} join of {resume.get('items')} "
                         f"items, radius {resume.get('radius')}, {resume.get('bits')} bits; "
                         f"this join has {n} items, radius {R}, {bits} bits")
    missing = [str(p) for p, _ in runs if not (p / "key.u64").exists()]
    if missing:
        raise ValueError(f"resume: sorted run {missing[0]} is missing")
    del position
    return algorithm, scheme


def _pairs(bits, ids, words, R, chunk_size, stats, algorithm, scheme, memory_pairs, spill_dir,
           prediction, checkpoints, side=None):
    """The join (:func:`pairs`, arguments checked); ``side`` (a bool per row): the pairs across
    the two sides only (:func:`index.crossjoin.cross_pairs`)."""
    stats.items, stats.radius = len(ids), R
    stats.started = time.monotonic()
    t0 = clock()
    if prediction is None and len(ids) > 1:
        prediction = _predict(bits, ids, words, R)
    if prediction is not None:
        stats.prediction = prediction
        stats.phase("plan", t0)
    if algorithm is None:
        algorithm = prediction.algorithm if prediction else "scan"
    if algorithm == "blocks" and scheme is None:
        if prediction is not None and prediction.algorithm == "blocks":
            scheme = (prediction.params["b"], prediction.params["k"])
        else:
            options = block_schemes(bits, R)
            if not options:
                raise ValueError(f"no block scheme for radius {R} of {bits}-bit codes (needs "
                                 f"R + 1 <= {bits}); use algorithm 'scan' or 'probe'")
            alt = prediction.alternatives if prediction else {}
            scheme = min(options, key=lambda s: (alt.get(f"blocks{s}", math.inf), s[1]))
    stats.algorithm = algorithm
    stats.params = {"b": scheme[0], "k": scheme[1], "tables": math.comb(*scheme)} \
        if algorithm == "blocks" else {}
    buffer = max(KERNEL_BUFFER, min(chunk_size, 1 << 22))
    if algorithm == "scan":
        blocks = _scan_blocks(words, R, stats, buffer, side)
    else:
        blocks = _sorted_blocks(words, bits, R, algorithm, scheme, stats, buffer, memory_pairs,
                                spill_dir, chunk_size, checkpoints, side)
    try:
        yield from _chunked(blocks, chunk_size, ids, stats)
    finally:
        blocks.close()
        stats.finished = time.monotonic()


def _sorted_blocks(words, bits, R, algorithm, scheme, stats, buffer, memory_pairs, spill_dir,
                   chunk_size, checkpoints, side=None):
    callback, interval_s, resume = checkpoints
    sink = _SortedRuns(len(words), R, memory_pairs, spill_dir, stats,
                       runs=resume["runs"] if resume else None,
                       keep=callback is not None or resume is not None, side=side)
    ck = _Checkpoints(callback, interval_s, sink, stats,
                      {"algorithm": algorithm, "items": len(words), "radius": R, "bits": bits,
                       **({"scheme": list(scheme)} if algorithm == "blocks" else {})})
    if resume:
        stats.pairs, stats.candidates = int(resume["pairs"]), int(resume["candidates"])
        stats.probes = int(resume.get("probes", 0))
        stats.params = {**stats.params, "resumed_at": {
            k: resume[k] for k in ("tables_done", "u", "r") if k in resume}}
    try:
        if algorithm == "probe":
            _probe_into(words, bits, R, sink, stats, buffer, ck, resume)
        else:
            _blocks_into(words, bits, R, scheme, sink, stats, buffer, ck, resume)
        stats.progress = 1.0
        yield from _emit_sorted(sink, stats, chunk_size)
    finally:
        sink.close()


def _emit_sorted(sink: "_SortedRuns", stats: JoinStats, chunk_size: int):
    """The sink's pairs in (a, b) order, in blocks of ``max(chunk_size, 2^16)``, timed as the
    ``emit`` phase (the consumer's time between blocks left out)."""
    t0 = clock()
    for block in sink.sorted_blocks(max(chunk_size, 1 << 16)):
        stats.phase("emit", t0)
        yield block
        t0 = clock()
    stats.phase("emit", t0)


# ---------------------------------------------------------------------------------- consumers
class Components(NamedTuple):
    """Connected components of the pair graph: ``labels[i]`` is the smallest id of the
    component of ``ids[i]`` (ids ascending; an item with no pair is its own label)."""

    ids: np.ndarray
    labels: np.ndarray


def _ids_of(index_or_ids) -> np.ndarray:
    if isinstance(index_or_ids, np.ndarray) or isinstance(index_or_ids, (list, tuple)):
        ids = np.asarray(index_or_ids, dtype=np.int64).reshape(-1)
    else:
        ids = live_items(index_or_ids)[1]
    ids = np.sort(ids)
    if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
        raise ValueError("ids: an id appears more than once")
    return ids


def _positions(ids: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    pos = np.searchsorted(ids, x)
    bad = (pos >= len(ids)) | (ids[np.minimum(pos, len(ids) - 1)] != x) if len(ids) else \
        np.ones(len(x), bool)
    if len(x) and bad.any():
        raise ValueError(f"pair_chunks: {name} id {int(x[bad][0])} is not among the ids")
    return pos


def components(index_or_ids, pair_chunks) -> Components:
    """Connected components (union-find) of the graph whose edges are the pairs of
    ``pair_chunks`` (any iterable of :class:`PairChunk` or ``(a, b, d)`` triples), over the live
    items of an engine / live state or the given ids. Label = smallest id of the component."""
    ids = _ids_of(index_or_ids)
    parent = np.arange(len(ids), dtype=np.int64)
    for chunk in pair_chunks:
        a, b = np.asarray(chunk[0] if not isinstance(chunk, PairChunk) else chunk.a), \
            np.asarray(chunk[1] if not isinstance(chunk, PairChunk) else chunk.b)
        union_pairs(parent, _positions(ids, a.astype(np.int64), "a"),
                    _positions(ids, b.astype(np.int64), "b"))
    return Components(ids, ids[roots(parent)] if len(ids) else ids.copy())


def keep_first(ids, pair_chunks) -> np.ndarray:
    """The keep-list of the greedy rule "keep the first item (lowest id), drop every later item
    within R of a kept one", items taken by id: the ids kept, ascending. ``pair_chunks`` must be
    ordered by ``a`` (as :func:`pairs` yields them; checked), ``ids`` an id array or an engine /
    live state (its live items). Exact: an item's status is final when its own pairs arrive."""
    ids = _ids_of(ids)
    dropped = np.zeros(len(ids), dtype=np.bool_)
    last = None
    for chunk in pair_chunks:
        a = np.asarray(chunk.a if isinstance(chunk, PairChunk) else chunk[0], dtype=np.int64)
        b = np.asarray(chunk.b if isinstance(chunk, PairChunk) else chunk[1], dtype=np.int64)
        if not len(a):
            continue
        if (last is not None and a[0] < last) or np.any(a[1:] < a[:-1]):
            raise ValueError("pair_chunks: keep_first needs pairs ordered by a (as pairs() "
                             "yields them)")
        if np.any(b <= a):
            raise ValueError("pair_chunks: every pair needs a < b")
        last = int(a[-1])
        drop_later(dropped, _positions(ids, a, "a"), _positions(ids, b, "b"))
    return ids[~dropped]


__all__ = ["ALGORITHMS", "Components", "JoinCancelled", "JoinPrediction", "JoinStats",
           "PairChunk", "block_masks", "block_schemes", "components", "join_constants",
           "clock", "keep_first", "live_items", "pairs", "predict_join", "slowdown"]
