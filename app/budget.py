"""The work a request asks for, bounded before any of it starts (issue 31).

A request's time and memory follow from what it asks: ``nq`` queries, each a ball of radius
``R`` searched by the plan that will run, each answering at most the items of its ball. Every
figure below is an upper bound computed from the request and the index's shape alone (exact
Python integers), checked before the work; a request over a budget is refused with 400 and a
message naming the budget's setting (:class:`BudgetExceeded`).

* **probes** (time): ``nq x probe_count(R)`` of the plan that runs (``sum C(Q, r)`` for the
  single table, substring probes for multi-index hashing, 0 for the scan):
  ``max_request_probes``.
* **compares** (time): codes compared by linear scans, ``nq x N_main`` when the plan is the
  scan, plus ``nq x delta`` (every plan scans the items inserted since the last merge):
  ``max_request_compares``.
* **memory**: the answer and the statistics: ``answer x RESULT_BYTES + stats``, where
  ``answer = nq x min(N_live, ball(R) x m)`` ids (``ball(R) = sum_{r<=R} C(Q, r)`` codes lie
  within ``R`` of a query and ``m`` items at most share one code: the largest bucket), capped
  by ``max_results`` when the kernels enforce it, and ``stats = nq x width x fields x 8`` bytes
  (the per-query, per-radius counters; a scan's kernel allocates ``bits + 1`` radii):
  ``max_request_memory``.

:func:`answer_bound` also decides what may run on the event loop (app/routers/search.py): a
search whose answer may be large is built and encoded in the thread pool however few probes
it makes.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from bucketsearch.app.costfit import CALIBRATION_PASSES, paper_engine
from bucketsearch.index.base import CANDIDATE_FIELDS, STAT_FIELDS

#: Bytes one result may cost while it is built and sent: int64 id + int32 distance in the
#: kernel's arrays, and its encoding (JSON: up to 19 digits of id, 3 of distance, separators).
RESULT_BYTES = 12 + 28
#: Bytes of one per-query, per-radius counter row (every field int64).
STAT_ROW_BYTES = 8 * (len(STAT_FIELDS) + len(CANDIDATE_FIELDS))


class BudgetExceeded(ValueError):
    """A request asks for more work than a budget allows (400; ``limit`` names the setting)."""

    def __init__(self, what: str, asked: int, setting: str, limit: int, hint: str):
        self.asked, self.setting, self.limit = int(asked), setting, int(limit)
        super().__init__(f"{what} needs {asked:,} {_UNITS[setting]}, more than "
                         f"{setting}={limit:,} (BUCKETSEARCH_{setting.upper()}); {hint}")


_UNITS = {"max_request_probes": "bucket probes", "max_request_compares": "code comparisons",
          "max_request_memory": "bytes of answer and statistics (estimated before any work)"}


@dataclass
class Work:
    """What a request will do, at most: probes, codes compared, bytes held."""

    probes: int = 0
    compares: int = 0
    memory: int = 0

    def check(self, settings, what: str, hint: str) -> None:
        """Raise :class:`BudgetExceeded` for the first budget this work passes."""
        for asked, setting in ((self.probes, "max_request_probes"),
                               (self.compares, "max_request_compares"),
                               (self.memory, "max_request_memory")):
            limit = getattr(settings, setting)
            if asked > limit:
                raise BudgetExceeded(what, asked, setting, limit, hint)


# --------------------------------------------------------------------- the index's shape
_LARGEST_BUCKET: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cached_bucket(main) -> int | None:
    try:
        return _LARGEST_BUCKET.get(main)
    except TypeError:  # not weak-referenceable: never cached
        return None


def largest_bucket(main) -> int:
    """Most items sharing one code in the main table (``m``; cached per snapshot table)."""
    m = _cached_bucket(main)
    if m is not None:
        return m
    table = getattr(main, "table", None) or getattr(getattr(main, "single", None), "table",
                                                    None)
    if not main.ntotal:
        m = 0
    elif table is not None:
        m = int(np.asarray(table.bucket_sizes()).max(initial=0))
    elif getattr(main, "words", None) is None:  # no arrays here (a sharded index's summary)
        m = int(main.ntotal)
    else:  # words sorted by (code, id): equal codes are adjacent
        words = np.asarray(main.words)
        change = np.flatnonzero(np.any(words[1:] != words[:-1], axis=1)) + 1
        m = int(np.diff(np.concatenate([[0], change, [len(words)]])).max(initial=0))
    try:
        _LARGEST_BUCKET[main] = m
    except TypeError:
        pass
    return m


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
    """Most ids a radius-``radius`` search of ``nq`` queries can return from ``state``:
    ``nq x min(N_main, ball(R) x m) + nq x delta``. ``cached_only``: None instead of
    computing ``m`` of a snapshot not seen yet (an O(buckets) pass: the event loop asks this,
    and sends such a search to the thread pool, where its budget check computes it)."""
    main = state.main
    if cached_only and main.ntotal and _cached_bucket(main) is None:
        return None
    return nq * (ball_items(main, state.bits, radius) + len(state.delta_ids))


def stats_bytes(nq: int, width: int) -> int:
    return nq * width * STAT_ROW_BYTES


# ----------------------------------------------------------------------------- requests
def range_work(state, engine, nq: int, radius: int, max_results: int | None) -> Work:
    """The work of one radius search of ``nq`` queries on ``engine`` (the main table, or a
    copy of it under a lower probe limit) of ``state``; ``max_results``: the cap the kernels
    enforce (None: uncapped)."""
    mode = plan_mode(engine, radius, nq)
    scan = mode == "scan"
    answer = answer_bound(state, nq, radius)
    if max_results is not None:
        answer = min(answer, max_results)
    width = state.bits + 1 if scan else radius + 1
    return Work(probes=nq * engine.probe_count(radius, nq),
                compares=nq * (int(engine.ntotal) * scan + len(state.delta_ids)),
                memory=answer * RESULT_BYTES + stats_bytes(nq, width))


def knn_work(state, nq: int, k: int, radius: int | None) -> Work:
    """The memory of a k-NN search (``nq x k <= max_results`` is checked by the parser; the
    probes are shared out under ``max_request_probes``): ``nq x k`` results and counters of
    up to ``bits + 1`` radii; the compares of its plan when that is the scan."""
    scan = plan_mode(state.main, radius, nq, k) == "scan"
    return Work(compares=nq * (int(state.main.ntotal) * scan + len(state.delta_ids)),
                memory=nq * k * RESULT_BYTES + stats_bytes(nq, state.bits + 1))


def check_calibration(state, queries: int, max_distance: int, settings) -> None:
    """The budget of ``POST .../cost-model/calibrate``, before any work: ``queries`` sampled
    queries searched one by one at every radius ``r = 0..max_distance`` of the single table
    (:func:`bucketsearch.app.costfit.calibrate`; an ``auto`` index's planner's, none for an ``mih``
    index), with statistics and no result cap, up to ``CALIBRATION_PASSES`` times (a warm pass, then
    rounds until the interval is tight). Probes add up over the radii and passes; memory is the
    statistics of every search (kept for the fit, twice: the samples the fit builds are as
    large) plus the largest answer of one search."""
    single = paper_engine(state.main)
    passes = CALIBRATION_PASSES if single is not None else 0
    total = Work()
    kept, peak = 0, 0
    for r in range(max_distance + 1):
        total.probes += passes * queries * (single.probe_count(r) if single is not None else 0)
        kept += 2 * passes * stats_bytes(queries, r + 1)
        answer = ball_items(state.main, state.bits, r)
        peak = max(peak, answer * RESULT_BYTES + stats_bytes(1, r + 1))
    total.memory = kept + peak
    total.check(settings, f"calibration: {queries} queries x radii 0..{max_distance} x "
                          f"{passes} passes",
                "use fewer queries or a smaller max_distance")


def check_evaluation(nq: int, n_db: int, bits: int, words_per_code: int, levels: int,
                     settings) -> None:
    """The memory of ``POST .../evaluate`` (its time is ``max_evaluate_pairs``): per query a
    histogram over the ``bits + 2`` distances of every counter (items, relevant, gains, codes,
    ...; 8 arrays) and of ``levels`` relevance grades, and the database's codes gathered twice
    (live items, then the ``db_ids`` picked)."""
    memory = nq * (bits + 2) * 8 * (8 + levels) + 2 * n_db * (8 + 8 * words_per_code)
    Work(memory=memory).check(settings, f"evaluate: {nq} queries against {n_db} items",
                              "evaluate fewer queries per request")
