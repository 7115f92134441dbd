"""The index handle: what the service may ask of an index, local or sharded (issue 29 item 1).

Two protocols (:class:`typing.Protocol`, checked structurally):

* :class:`IndexView`: reads of one index. ``handle.view()`` gives one, and a request that
  reads several times (a budget check, then the search, then the exactness audit of the
  answer) reads one consistent state through it: the live index's view holds one immutable
  state (:class:`~bucketsearch.index.storage.view.LiveView`); the sharded index's view is the
  index itself (each shard searches one consistent state of its own per call).
* :class:`IndexHandle`: an index: its reads (through its current view), its writes, merge
  and mode change, info with sizes, bucket-size histogram and merge state, following the
  writer (read replicas), close.

Implemented by :class:`~bucketsearch.index.storage.live.LiveIndex` (one folder in this
process) and by the sharded index on Ray actors (``index/cluster``). The service maps names
and HTTP to handles and reads nothing else of an index (tests/test_import_graph.py checks
that no ``app/`` file reads an index's ``state``, ``main``, ``delta*`` or ``tombstones``).

Budgets: a search given a :class:`Budget` checks the work it would do (probes, codes compared,
bytes of answer and statistics; :mod:`bucketsearch.index.budget`) against it before any work,
on the state it then searches, and raises :class:`BudgetExceeded` or
:class:`RequestProbeLimit` (both ``ValueError``: HTTP 400) naming the setting.

The errors an index raises (:mod:`bucketsearch.index.errors`, re-exported here beside the
protocol; the service gives each its HTTP status):

==========================  ========  ===================================================
error                       status    raised when
==========================  ========  ===================================================
``ValueError``              400       bad input (its message names the field and the value)
:class:`ProbeLimitError`    400       a search would probe more than ``max_probes``
:class:`ResultLimitError`   400       a radius search passes ``max_results``
:class:`BudgetExceeded`     400       a request's work passes a budget of :class:`Budget`
:class:`DuplicateIdError`   409       an add of an id that is live
:class:`NotServed`          409       an operation this index does not serve (sharded)
``PermissionError``         409       a write to a read-only or closed index
:class:`IndexUnavailable`   503       the index cannot answer now (``retry_after_s``)
:class:`CorruptIndexError`  (open)    the folder's snapshots or log are damaged
:class:`CorruptLogError`    (open)    a log record is damaged past the torn tail
:class:`FollowerStopped`    (follow)  a follower found damage in the writer's log
:class:`AppendFailed`       503       the disk refused a log record (nothing acknowledged)
:class:`LogFailed`          503       ... and the log could not be restored: writes refused
``OSError``                 503       any other storage fault (nothing was acknowledged)
==========================  ========  ===================================================
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from bucketsearch.index.base import ProbeLimitError, ResultLimitError, SearchStats
from bucketsearch.index.budget import Budget, BudgetExceeded, RequestProbeLimit, Work
from bucketsearch.index.errors import (AppendFailed, CorruptIndexError, CorruptLogError,
                                       DuplicateIdError, FollowerStopped, IndexUnavailable,
                                       LogFailed, NotServed)

__all__ = ["DEFAULT_PROFILE_PROBES", "DEFAULT_PROFILE_RADIUS", "AppendFailed", "Budget",
           "BudgetExceeded", "CorruptIndexError", "CorruptLogError", "DuplicateIdError",
           "FollowerStopped", "IndexHandle", "IndexUnavailable", "IndexView", "LogFailed",
           "NotServed", "ProbeLimitError", "RadiusProfile", "RequestProbeLimit",
           "ResultLimitError", "Sizes", "Work", "check_k", "check_radius"]


# ------------------------------------------------------------------------------------ values
#: a radius profile's default radius: the largest r <= DEFAULT_PROFILE_RADIUS whose probes (all
#: queries) stay within DEFAULT_PROFILE_PROBES and the request's probe budget
DEFAULT_PROFILE_RADIUS = 4
DEFAULT_PROFILE_PROBES = 20_000_000


@dataclass(frozen=True)
class Sizes:
    """The counts of one state: ``size`` live items = ``main_size - tombstoned +
    delta_size``; ``main_size`` items of the main index (as of the last merge),
    ``delta_size`` items inserted since (scanned linearly), ``tombstoned`` items of the main
    index deleted since (IndexInfo's ``tombstones``)."""

    size: int
    main_size: int
    delta_size: int
    tombstoned: int

    def info(self) -> dict:
        """The IndexInfo fields: ``size, main_size, delta_size, tombstones``."""
        return {"size": self.size, "main_size": self.main_size, "delta_size": self.delta_size,
                "tombstones": self.tombstoned}


@dataclass
class RadiusProfile:
    """What balls of radius ``0..max_distance`` hold for sampled queries, as one radius
    search of the table probed radius by radius (mode auto: its single table) with
    statistics: ``stats`` its per-query, per-radius counters; ``empty_balls[r]`` the queries
    whose ball ``d <= r`` holds no live item (main minus tombstones, plus the delta);
    ``engine`` the kind of the table profiled; ``planner``: mode auto's choices per radius
    and its last plan (None for another mode)."""

    max_distance: int
    stats: SearchStats
    empty_balls: list[int]
    engine: str
    main_size: int
    live_size: int
    planner: dict | None


def check_radius(radius: int, bits: int) -> None:
    """``ValueError`` naming ``max_distance`` unless ``0 <= radius <= bits``."""
    if not 0 <= radius <= bits:
        raise ValueError(f"max_distance must be in [0, bits={bits}], got {radius}")


def check_k(k) -> int:
    """``k`` as an int, ``ValueError`` unless it is an int >= 1 (a bool is not)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    return int(k)


# --------------------------------------------------------------------------------- protocols
@runtime_checkable
class IndexView(Protocol):
    """Reads of an index, each over one consistent state (a live index's view: the same state
    for every call; see the module docstring)."""

    bits: int

    @property
    def ntotal(self) -> int:
        """Live items."""

    def sizes(self) -> Sizes:
        """The counts of the state (:class:`Sizes`)."""

    def check_radius(self, radius: int) -> None:
        """``ValueError`` unless ``0 <= radius <= bits``."""

    def range_search(self, xq, radius: int, stats: bool = False, max_probes: int | None = None,
                     max_results: int | None = None, budget: Budget | None = None):
        """``(lims, D, I, stats or None)``: every live item with ``d <= radius`` per query, in
        (distance, id) order (CSR). ``max_probes`` lowers the per-query probe guard,
        ``max_results`` caps the batch (:class:`ResultLimitError`); ``budget``: the request's
        budget, checked before any work (it sets both limits)."""

    def search(self, xq, k: int, max_distance: int | None = None, stats: bool = False,
               max_probes: int | None = None, budget: Budget | None = None):
        """``(D, I, stats or None)``: the k nearest live items by (distance, id) (within
        ``max_distance`` when given), ``(nq, k)`` padded with -1; ``budget`` as above (its
        probes shared out as each query's probe limit)."""

    def get(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """``(found, words)``: a bool per id and its code (zeros where not found)."""

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, words)`` of every live item."""

    def item_parts(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The live items without a copy where the index can: ``(ids, words, dropped)``
        segments, an item whose id is in ``dropped`` not live (the exactness audit's input)."""

    def sample(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, words)`` of ``min(n, live)`` live items drawn uniformly without replacement
        (seeded)."""

    def range_estimate(self, nq: int, radius: int, cheap: bool = False) -> Work | None:
        """The most work a radius search of ``nq`` queries does (:class:`Work`, probes at the
        index's own guard); None when ``cheap`` and that is not known without an O(items)
        pass or a remote call (the caller then does not run it on the event loop)."""


@runtime_checkable
class IndexHandle(IndexView, Protocol):
    """An index (see the module docstring). Its read methods read its current state; a
    request reading more than once reads ``view()``."""

    mode: str
    substrings: int | None
    max_probes: int
    #: shard actors the index is split over (0: one index in this process)
    shards: int
    #: how items are split over the shards (``id_hash`` or ``code_prefix``; None: not split)
    partitioning: str | None

    def view(self) -> IndexView:
        """The reads of one consistent state."""

    # writes: durable when they return (an error: nothing written)
    def add(self, codes, ids) -> int:
        """Insert (:class:`DuplicateIdError` for an id that is live); returns the count."""

    def add_next(self, codes) -> tuple[int, int]:
        """Insert with the ids ``next_id, next_id + 1, ...``: ``(first_id, count)``."""

    def add_dedup(self, codes, radius: int, ids=None, *, report: int = ...,
                  max_probes: int | None = None):
        """Insert each item with no live item within ``radius`` (a ``DedupResult``)."""

    def upsert(self, codes, ids) -> tuple[int, int]:
        """Insert or replace: ``(inserted, replaced)``."""

    def delete(self, ids) -> int:
        """Delete the live ones of ``ids``; returns how many."""

    # merge and mode
    def merge(self) -> bool:
        """Fold the delta and the tombstones into a new main index; False if nothing to do."""

    def set_mode(self, mode: str, substrings: int | None = None) -> bool:
        """Rebuild in another mode, in place; False if unchanged."""

    @property
    def merge_status(self) -> str:
        """``running``, ``pending`` (the delta or tombstones at the threshold) or ``none``."""

    @property
    def failed(self) -> str | None:
        """Why the index refuses writes after a storage fault (fail-stop), else None."""

    @property
    def merging(self) -> bool:
        """Whether a merge (or mode change) runs now."""

    merges: int  # merges of the index so far (kept in its snapshots)
    last_merge: float | None  # end of the last merge (Unix time), None before the first
    last_merge_error: str | None  # why the last background merge failed, None after a success

    def info(self) -> dict:
        """The IndexInfo fields of the index: mode, substrings, the :class:`Sizes`, distinct
        codes, ``bucket_size_histogram`` (``[{"size", "buckets"}]``), memory, merge state
        (``merges, merging, merge, last_merge, last_merge_error``), ``applied_lsn``,
        ``lag_ms``; a sharded index adds ``partitioning`` and ``shard_detail``."""

    # the cost model's reads (NotServed where the index's tables are not in this process)
    def radius_profile(self, queries: int, max_distance: int | None, seed: int,
                       budget: Budget) -> RadiusProfile:
        """:class:`RadiusProfile` of ``queries`` sampled queries (half codes of the index, half
        uniform random codes, seeded); ``max_distance`` None: the largest
        ``r <= DEFAULT_PROFILE_RADIUS`` within the budget's probes."""

    def query_sample(self, n: int, seed: int) -> np.ndarray:
        """``n`` query words: half codes of live items, half uniform random codes."""

    def paper_engine(self):
        """The single table the paper's cost model describes (cost calibration times it),
        None for multi-index hashing or a scan."""

    def probe_engine(self):
        """The table a search probes radius by radius (mode auto: its single table)."""

    # life
    def warm(self) -> None:
        """One tiny search of every kind (kernels loaded, pages read in)."""

    def catch_up(self) -> bool:
        """A read-only follower: apply what the writer committed since; whether it changed."""

    def close(self) -> None:
        """Refuse writes from now on, let a running merge finish, close the log."""
