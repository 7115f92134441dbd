"""The service's budgets beyond a search's (issue 31): a calibration's and an evaluation's
work, bounded before it starts. A search's own work is estimated and checked by the index
(:mod:`bucketsearch.index.budget`, re-exported here), on the state it then searches.
"""
from __future__ import annotations

from bucketsearch.app.costfit import CALIBRATION_PASSES
from bucketsearch.index.budget import (RESULT_BYTES, STAT_ROW_BYTES, Budget,  # noqa: F401
                                       BudgetExceeded, Work, answer_bound, ball, ball_items,
                                       knn_work, largest_bucket, plan_mode, range_work,
                                       stats_bytes)


def check_calibration(live, queries: int, max_distance: int, settings) -> None:
    """The budget of ``POST .../cost-model/calibrate``, before any work: ``queries`` sampled
    queries searched one by one at every radius ``r = 0..max_distance`` of the single table
    (:func:`bucketsearch.app.costfit.calibrate`; an ``auto`` index's planner's, none for an ``mih``
    index), with statistics and no result cap, up to ``CALIBRATION_PASSES`` times (a warm pass, then
    rounds until the interval is tight). Probes add up over the radii and passes; memory is the
    statistics of every search (kept for the fit, twice: the samples the fit builds are as
    large) plus the largest answer of one search."""
    single = live.paper_engine()
    passes = CALIBRATION_PASSES if single is not None else 0
    total = Work()
    kept, peak = 0, 0
    for r in range(max_distance + 1):
        total.probes += passes * queries * (single.probe_count(r) if single is not None else 0)
        kept += 2 * passes * stats_bytes(queries, r + 1)
        answer = ball_items(single, live.bits, r) if single is not None else 0  # none runs
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
