"""The evaluate endpoint's domain logic: every metric of the evaluation toolkit
(bucketsearch.index.metrics.evaluate) for query codes against an index's live items, with
RAMAP's cost measured on the index itself. app/routers/evaluate.py keeps only the HTTP part."""
from __future__ import annotations

import numpy as np

from bucketsearch.app.budget import check_evaluation
from bucketsearch.app.parsing import parse_hex
from bucketsearch.index.codes import n_words
from bucketsearch.index.probe import ResultLimitError


def live_items(view) -> tuple[np.ndarray, np.ndarray]:
    """Every live (id, words) of an index view, ordered by id."""
    ids, words = view.items()
    order = np.argsort(ids, kind="stable")
    return ids[order], words[order]


def check_pairs(nq: int, n_db: int, settings) -> None:
    """The evaluate limit: ``nq x n_db`` distances at most ``max_evaluate_pairs``."""
    if nq * n_db > settings.max_evaluate_pairs:
        raise ValueError(f"codes: {nq} queries x {n_db} database items = "
                         f"{nq * n_db:,} distances, more than max_evaluate_pairs="
                         f"{settings.max_evaluate_pairs:,}; evaluate fewer queries per request")


def levels_of(body) -> int:
    """Relevance grades the histograms keep per distance: 1, or with ``graded`` multi-hot
    labels, one per possible count of shared labels."""
    labels = body.query_labels
    if not body.graded:
        return 1
    if labels and isinstance(labels[0], list):
        return len(labels[0]) + 1
    if body.relevant_ids:  # a repeated pair adds its gain
        return max(len(ids) for ids in body.relevant_ids) + 1
    return 1


def max_guarded_radius(main, cap: int) -> int:
    r = 0
    while r < cap and main.probe_count(r + 1) <= main.max_probes:
        r += 1
    return r


def evaluation_database(entry, view, db_ids_in: list[int] | None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """``(db_ids, db_words)``: the live items named by ``db_ids_in`` (all of them when None),
    every id checked to be in the index and unique; never empty."""
    all_ids, all_words = live_items(view)
    if db_ids_in is not None:
        db_ids = np.asarray(db_ids_in, dtype=np.int64)
        pos = np.searchsorted(all_ids, db_ids)
        ok = (pos < len(all_ids)) & (all_ids[np.minimum(pos, len(all_ids) - 1)] == db_ids) \
            if len(all_ids) else np.zeros(len(db_ids), bool)
        if not ok.all():
            raise ValueError(f"db_ids: id {int(db_ids[~ok][0])} is not in index {entry.name!r}")
        if len(np.unique(db_ids)) != len(db_ids):
            raise ValueError("db_ids: ids must be unique")
        db_words = all_words[pos]
    else:
        db_ids, db_words = all_ids, all_words
    if len(db_ids) == 0:
        raise ValueError("db_ids: the evaluation database is empty (the index has no items)")
    return db_ids, db_words


def relevance_of(body, nq: int, db_ids: np.ndarray):
    """The relevance matrix of the request: ``relevant_ids`` per query, or ``query_labels``
    against ``db_labels``."""
    from bucketsearch.index.metrics import relevance as rel

    if body.relevant_ids is not None:
        if body.query_labels is not None or body.db_labels is not None:
            raise ValueError("relevant_ids: give either relevant_ids or query_labels + "
                             "db_labels, not both")
        if len(body.relevant_ids) != nq:
            raise ValueError(f"relevant_ids: {len(body.relevant_ids)} lists for {nq} queries")
        pairs = []
        row_of = {int(i): j for j, i in enumerate(db_ids.tolist())}
        for q, ids in enumerate(body.relevant_ids):
            missing = [i for i in ids if i not in row_of]
            if missing:
                raise ValueError(f"relevant_ids[{q}]: id {missing[0]} is not in the database")
            pairs.extend((q, row_of[i]) for i in ids)
        return rel.from_pairs(np.array(pairs, dtype=np.int64).reshape(-1, 2), nq, len(db_ids))
    if body.query_labels is None or body.db_labels is None or body.db_ids is None:
        raise ValueError("query_labels: labels need query_labels, db_ids and db_labels "
                         "(or give relevant_ids instead)")
    if len(body.query_labels) != nq:
        raise ValueError(f"query_labels: {len(body.query_labels)} labels for {nq} queries")
    if len(body.db_labels) != len(db_ids):
        raise ValueError(f"db_labels: {len(body.db_labels)} labels for {len(db_ids)} db_ids")
    return rel.from_labels(labels_array(body.query_labels, "query_labels"),
                           labels_array(body.db_labels, "db_labels"))


def labels_array(labels: list, field: str) -> np.ndarray:
    """``labels`` (class ids, or multi-hot rows) as an int64 array; multi-hot rows must all
    have the same number of columns, at least one (ValueError naming the row otherwise)."""
    if labels and isinstance(labels[0], list):
        width = len(labels[0])
        for row, values in enumerate(labels):
            if not values:
                raise ValueError(f"{field}[{row}]: a multi-hot row needs at least one column "
                                 "(one 0/1 per label), got []")
            if len(values) != width:
                raise ValueError(f"{field}[{row}]: {len(values)} columns, but {field}[0] has "
                                 f"{width} (every multi-hot row has one 0/1 per label)")
    return np.asarray(labels, dtype=np.int64)


def measure_cost(entry, main, xq: np.ndarray, radius_max: int, measure_queries: int,
                 settings) -> tuple[np.ndarray | None, dict | None, str | None]:
    """RAMAP's measured cost: ``(cumulative ns per radius 0..bits or None, the reported
    ``measured_cost``, the ``measured_cost_note`` when not measured)``. Times a radius search
    of the first queries on ``main`` within the probe guard and the request's probe budget
    (the timings also feed the index's cost tracker)."""
    per_query = main.probe_count(radius_max)
    n_measure = min(measure_queries, settings.max_request_probes // max(per_query, 1))
    st = None
    over_results = None
    if n_measure and per_query <= main.max_probes:
        sample = xq[:n_measure]
        try:
            st = main.range_search(sample, radius_max, stats=True,
                                   max_results=settings.max_results)[3]
        except ResultLimitError as exc:
            over_results = exc.reached
    if st is not None:
        entry.cost.observe(st)
        per_radius = st.lookup_ns[:, :radius_max + 1].mean(axis=0)
        per_radius = np.maximum(per_radius, 1.0)  # a clock tick below 1 ns reads as 0
        measured = np.cumsum(per_radius)
        # RAMAP's kernel wants a cost for every radius 0..Q; radii above radius_max are not
        # reported, so they get the last measured value (it does not enter any reported number)
        measured = np.concatenate([measured, np.full(entry.bits - radius_max,
                                                     measured[-1])])
        return measured, {"queries": int(len(sample)), "lookup_ns_per_radius":
                          per_radius.tolist(),
                          "cumulative_ns": measured[:radius_max + 1].tolist()}, None
    if over_results is not None:
        return None, None, (
            f"not measured: the timed radius-{radius_max} search of {n_measure} queries returns "
            f"at least {over_results:,} ids, more than max_results={settings.max_results}; "
            "use a smaller radius_max or measure_queries")
    return None, None, (
        f"not measured: radius_max={radius_max} probes {main.probe_count(radius_max):,} "
        f"buckets per query, above the probe guard {main.max_probes:,} or the request budget "
        f"max_request_probes={settings.max_request_probes:,}"
        if measure_queries else "not measured: measure_queries=0")


def evaluate_entry(entry, settings, body) -> dict:
    """The evaluate response for ``body`` (a schemas.EvaluateIn) against ``entry``'s live state
    (read once): every metric of bucketsearch.index.metrics.evaluate plus ``measured_cost`` (and
    ``measured_cost_note`` when it is not measured). Request errors raise ValueError (400);
    the caller checks ``max_batch`` (413) first."""
    from bucketsearch.index.metrics import Conventions
    from bucketsearch.index.metrics import evaluate as run_evaluate

    nq = len(body.codes)
    if body.radius_max is not None and body.radius_max > entry.bits:
        raise ValueError(f"radius_max must be in [0, bits={entry.bits}], got {body.radius_max}")
    view = entry.live.view()
    # the limit before the work: the database's size is known without gathering its items
    n_db = len(body.db_ids) if body.db_ids is not None else view.ntotal
    check_pairs(nq, n_db, settings)
    check_evaluation(nq, view.ntotal, entry.bits, n_words(entry.bits), levels_of(body),
                     settings)
    xq = parse_hex(body.codes, entry.bits)
    db_ids, db_words = evaluation_database(entry, view, body.db_ids)
    check_pairs(nq, len(db_ids), settings)  # the same count (a state swap could change it)
    relevance = relevance_of(body, nq, db_ids)
    # RAMAP's measured cost is that of bucket probing radius by radius: the planner's
    # single table is timed (its plan could be a scan, which has no per-radius time)
    main = view.probe_engine()
    radius_max = body.radius_max
    if radius_max is None:
        radius_max = max_guarded_radius(main, min(entry.bits, 10))
    measured, measured_info, note = measure_cost(entry, main, xq, radius_max,
                                                 body.measure_queries, settings)
    conv = Conventions(**body.conventions.model_dump())
    result = run_evaluate(db_words, xq, relevance, bits=entry.bits, radius_max=radius_max,
                          ks=tuple(body.ks), graded=body.graded, conventions=conv,
                          measured_cost=measured)
    result["measured_cost"] = measured_info
    if note is not None:
        result["measured_cost_note"] = note
    return result
