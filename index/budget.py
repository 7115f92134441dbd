"""The work a request asks for, bounded before any of it starts (issue 31).

A request's time and memory follow from what it asks: ``nq`` queries, each a ball of radius
``R`` searched by the plan that will run, each answering at most the items of its ball. Every
figure below is an upper bound computed from the request and the index's shape alone (exact
Python integers), checked before the work; a request over a budget (:class:`Budget`) is
refused with 400 and a message naming the budget's setting (:class:`BudgetExceeded`).

* **probes** (time): ``nq x probe_count(R)`` of the plan that runs (``sum C(Q, r)`` for the
  single table, substring probes for multi-index hashing, 0 for the scan):
  ``max_request_probes`` (:class:`RequestProbeLimit`).
* **compares** (time): codes compared by linear scans, ``nq x N_main`` when the plan is the
  scan, plus ``nq x delta`` (every plan scans the items inserted since the last merge):
  ``max_request_compares``.
* **memory**: the answer and the statistics: ``answer x RESULT_BYTES + stats``, where
  ``answer = nq x min(N_live, ball(R) x m)`` ids (``ball(R) = sum_{r<=R} C(Q, r)`` codes lie
  within ``R`` of a query and ``m`` items at most share one code: the largest bucket), capped
  by ``max_results`` when the kernels enforce it, and ``stats = nq x width x fields x 8`` bytes
  (the per-query, per-radius counters; a scan's kernel allocates ``bits + 1`` radii):
  ``max_request_memory``.

The index checks them (:meth:`bucketsearch.index.handle.IndexView.range_search` with a
``budget``) on the state it then searches; :func:`answer_bound` also decides what the service
runs on its event loop: a search whose answer may be large is built and encoded in the thread
pool however few probes it makes.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from bucketsearch.index.base import CANDIDATE_FIELDS, STAT_FIELDS, ProbeLimitError
from bucketsearch.index.item_table import bucket_size_counts as bucket_size_counts_of

#: Bytes one result may cost while it is built and sent: int64 id + int32 distance in the
#: kernel's arrays, and its encoding (JSON: up to 19 digits of id, 3 of distance, separators).
RESULT_BYTES = 12 + 28
#: Bytes of one per-query, per-radius counter row (every field int64).
STAT_ROW_BYTES = 8 * (len(STAT_FIELDS) + len(CANDIDATE_FIELDS))


class Budget(NamedTuple):
    """What one request may spend (the server's settings of the same names): probes of the
    whole batch, codes compared by linear scans, bytes of answer and statistics, results of
    a radius search. (A tuple: built for every request, in a fraction of a microsecond.)"""

    max_request_probes: int
    max_request_compares: int
    max_request_memory: int
    max_results: int | None = None

    @classmethod
    def of(cls, settings) -> Budget:
        """The budget of ``settings`` (any object with the four attributes)."""
        return cls(settings.max_request_probes, settings.max_request_compares,
                   settings.max_request_memory, settings.max_results)

    def probe_share(self, nq: int) -> int:
        """Each query's probe limit: the request's probes shared out, at least 1."""
        return max(self.max_request_probes // max(nq, 1), 1)


class BudgetExceeded(ValueError):
    """A request asks for more work than a budget allows (400; ``setting`` names it)."""

    def __init__(self, what: str, asked: int, setting: str, limit: int, hint: str):
        self.asked, self.setting, self.limit = int(asked), setting, int(limit)
        super().__init__(f"{what} needs {asked:,} {_UNITS[setting]}, more than "
                         f"{setting}={limit:,} (BUCKETSEARCH_{setting.upper()}); {hint}")


_UNITS = {"max_request_probes": "bucket probes", "max_request_compares": "code comparisons",
          "max_request_memory": "bytes of answer and statistics (estimated before any work)"}


class RequestProbeLimit(ProbeLimitError):
    """The whole batch would probe more buckets than ``max_request_probes``."""

    def __init__(self, nq: int, per_query: int, limit: int, radius: int, mode: str):
        self.probes, self.limit, self.radius = nq * per_query, limit, radius
        other = {"single": "mode 'mih' or 'auto'", "mih": "mode 'auto' (it can scan)"}
        ValueError.__init__(
            self, f"codes: {nq} queries x {per_query:,} probes (radius {radius}, mode "
                  f"{mode!r}) = {nq * per_query:,} buckets, more than the per-request limit "
                  f"max_request_probes={limit:,}; send fewer queries per request, use a smaller "
                  f"radius{', or ' + other[mode] if mode in other else ''}")


@dataclass
class Work:
    """What a request will do, at most: probes, codes compared, bytes held (of which
    ``answer`` ids: the answer's bound)."""

    probes: int = 0
    compares: int = 0
    memory: int = 0
    answer: int = 0

    def check(self, budget, what, hint: str | None = None) -> None:
        """Raise :class:`BudgetExceeded` for the first budget this work passes (``budget``: a
        :class:`Budget` or the server's settings); ``what`` and ``hint`` name the request and
        advise, or ``what`` is a function giving both (called only to raise: a search's
        check builds no message)."""
        for asked, setting in ((self.probes, "max_request_probes"),
                               (self.compares, "max_request_compares"),
                               (self.memory, "max_request_memory")):
            limit = getattr(budget, setting)
            if asked > limit:
                if callable(what):
                    what, hint = what()
                raise BudgetExceeded(what, asked, setting, limit, hint)


# --------------------------------------------------------------------- the index's shape
_SIZE_COUNTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _table(main):
    """The single table of ``main`` (mode auto: its single engine's), or None."""
    table = getattr(main, "table", None)
    if table is None:
        table = getattr(getattr(main, "single", None), "table", None)
    return table


def cached_size_counts(main) -> np.ndarray | None:
    """:func:`bucket_size_counts` of ``main`` if known already (without a pass), else None."""
    table = _table(main)
    if table is not None and getattr(table, "size_counts", None) is not None:
        return table.size_counts
    try:
        return _SIZE_COUNTS.get(main)
    except TypeError:  # not weak-referenceable: never cached
        return None


def bucket_size_counts(main) -> np.ndarray:
    """``counts[s]``: buckets (distinct full codes) of the main index holding ``s`` items,
    ``s = 0..largest``. The single table's (computed at its build, kept in its snapshot); else
    one pass over the code-sorted words (cached per main index: it never changes), or the
    bucket sizes of an engine that keeps no such order."""
    counts = cached_size_counts(main)
    if counts is not None:
        return counts
    if not main.ntotal:
        counts = np.zeros(1, dtype=np.int64)
    elif getattr(main, "sorted_by_code", False):
        counts = bucket_size_counts_of(np.asarray(main.words))
    else:
        counts = np.bincount(bucket_sizes(main))
    try:
        _SIZE_COUNTS[main] = counts
    except TypeError:
        pass
    return counts


def bucket_sizes(main) -> np.ndarray:
    """Items per distinct full code of the main index (its buckets in single mode): the
    table's bucket sizes, or from its words sorted by (code, id) (equal codes adjacent). An
    O(items) array: the info and the budget read :func:`bucket_size_counts` instead."""
    if not main.ntotal:
        return np.empty(0, dtype=np.int64)
    table = _table(main)
    if table is not None:
        return np.asarray(table.bucket_sizes())
    words = np.asarray(main.words)
    change = np.flatnonzero(np.any(words[1:] != words[:-1], axis=1)) + 1
    return np.diff(np.concatenate([[0], change, [len(words)]]))


def cached_largest_bucket(main) -> int | None:
    """:func:`largest_bucket` of ``main`` if known already, else None."""
    counts = cached_size_counts(main)
    return None if counts is None else len(counts) - 1


def largest_bucket(main) -> int:
    """Most items sharing one code in the main index (``m``)."""
    return len(bucket_size_counts(main)) - 1


def ball(bits: int, radius: int) -> int:
    """Codes within Hamming distance ``radius`` of one code: ``sum_{r<=R} C(Q, r)``."""
    return sum(math.comb(bits, r) for r in range(min(radius, bits) + 1))


def plan_mode(main, radius: int | None, nq: int, k: int | None = None) -> str:
    """The engine a search of ``main`` runs: its kind, or the planner's choice (mode auto)."""
    kind = getattr(main, "kind", "")
    if kind != "auto":
        return kind
    return main.plan(max_distance=radius, k=k, nq=nq)["mode"]


def ball_items(main, bits: int, radius: int) -> int:
    """Most items of ``main`` one ball of ``radius`` holds: ``min(N, ball(R) x m)``."""
    return min(int(main.ntotal), ball(bits, radius) * largest_bucket(main))


def answer_bound(state, nq: int, radius: int, cached_only: bool = False) -> int | None:
    """Most ids a radius-``radius`` search of ``nq`` queries can return from ``state`` (a
    live state: main index and delta): ``nq x min(N_main, ball(R) x m) + nq x delta``.
    ``cached_only``: None instead of computing ``m`` of a snapshot not seen yet (an
    O(buckets) pass: the event loop asks this, and sends such a search to the thread pool,
    where its budget check computes it)."""
    main = state.main
    if cached_only and main.ntotal and cached_largest_bucket(main) is None:
        return None
    return nq * (ball_items(main, state.bits, radius) + len(state.delta_ids))


def stats_bytes(nq: int, width: int) -> int:
    return nq * width * STAT_ROW_BYTES


# ----------------------------------------------------------------------------- requests
def work_of(nq: int, radius: int, bits: int, per_query_probes: int, scan: bool,
            main_size: int, delta_size: int, answer: int, max_results: int | None) -> Work:
    """The work of a radius search of ``nq`` queries from the figures of the index: probes
    per query of the plan that runs, whether that plan is the scan (``main_size`` compares a
    query), the items of the delta, the answer's bound."""
    if max_results is not None:
        answer = min(answer, max_results)
    width = bits + 1 if scan else radius + 1
    return Work(probes=nq * per_query_probes,
                compares=nq * (int(main_size) * scan + int(delta_size)),
                memory=answer * RESULT_BYTES + stats_bytes(nq, width), answer=answer)


def range_work(state, engine, nq: int, radius: int, max_results: int | None) -> Work:
    """The work of one radius search of ``nq`` queries on ``engine`` (the main table, or a
    copy of it under a lower probe limit) of ``state``; ``max_results``: the cap the kernels
    enforce (None: uncapped)."""
    scan = plan_mode(engine, radius, nq) == "scan"
    return work_of(nq, radius, state.bits, engine.probe_count(radius, nq), scan,
                   engine.ntotal, len(state.delta_ids), answer_bound(state, nq, radius),
                   max_results)


def knn_work(state, nq: int, k: int, radius: int | None) -> Work:
    """The memory of a k-NN search (``nq x k <= max_results`` is checked by the parser; the
    probes are shared out under ``max_request_probes``): ``nq x k`` results and counters of
    up to ``bits + 1`` radii; the compares of its plan when that is the scan."""
    scan = plan_mode(state.main, radius, nq, k) == "scan"
    return knn_work_of(nq, k, state.bits, scan, state.main.ntotal, len(state.delta_ids))


def knn_work_of(nq: int, k: int, bits: int, scan: bool, main_size: int,
                delta_size: int) -> Work:
    """:func:`knn_work` from the figures of the index."""
    return Work(compares=nq * (int(main_size) * scan + int(delta_size)),
                memory=nq * k * RESULT_BYTES + stats_bytes(nq, bits + 1), answer=nq * k)


def check_range_probes(nq: int, radius: int, per_query: int, guard: int, budget: Budget,
                       mode: str) -> bool:
    """The probe budget of a radius search of ``nq`` queries, ``per_query`` probes each under
    the request's share: False when that passes the index's own guard (the engine raises its
    per-query ProbeLimitError, before work too), :class:`RequestProbeLimit` when the batch
    passes ``max_request_probes``, else True."""
    if per_query > guard:
        return False
    if nq * per_query > budget.max_request_probes:
        raise RequestProbeLimit(nq, per_query, budget.max_request_probes, radius, mode)
    return True


def check_range(nq: int, radius: int, budget: Budget, guard: int, mode: str, probes_at,
                work_at) -> int | None:
    """The budget check of a radius search of ``nq`` queries: each query's share of the
    request's probes, ``probes_at(share)`` probes a query under it; None when that passes the
    index's ``guard`` (its own ProbeLimitError answers, before any work too), else the batch's
    probes and ``work_at(share, per_query)`` (a :class:`Work`) checked and the share returned
    (the per-query probe limit the search runs with)."""
    share = budget.probe_share(nq)
    per_query = probes_at(share)
    if not check_range_probes(nq, radius, per_query, guard, budget, mode):
        return None
    work_at(share, per_query).check(budget, lambda: range_hint(nq, radius))
    return share


def check_knn(nq: int, k: int, budget: Budget, work: Work) -> int:
    """The budget check of a k-NN search of ``nq`` queries: its ``work`` (compares, memory)
    checked, and each query's probe limit returned (its share of the request's probes; a
    query past it switches to a scan)."""
    work.check(budget, lambda: knn_hint(nq, k))
    return budget.probe_share(nq)


def range_hint(nq: int, radius: int) -> tuple[str, str]:
    """What a radius search's :class:`BudgetExceeded` names and advises."""
    return (f"codes: {nq} queries of radius {radius}",
            "send fewer queries per request or use a smaller radius")


def knn_hint(nq: int, k: int) -> tuple[str, str]:
    return f"codes: {nq} queries of k={k}", "send fewer queries per request"
