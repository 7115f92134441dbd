"""The radius advisor's service: the request's queries, database and relevance gathered from
an index's live state (read once), then :func:`bucketsearch.index.evaluation.advisor.advise`.
app/routers/advise.py keeps only the HTTP part.

Queries: ``query_ids`` (items of the index), ``codes`` (hex), or else ``sample`` items
(default ``min(200, advise_max_queries)``; with ``holdout`` at most half of the items, so the
database keeps the rest) drawn without replacement by ``numpy.random.default_rng(seed)`` from
the live ids in id order. With ``holdout`` (default) item queries are left out of
the database. Relevance: labels (``db_ids`` + ``db_labels``; an item query's label is its own,
a code query's is ``query_labels``; unlabeled items are relevant to no query) or ``pairs``
``[query position, item id, duplicate]``.

Limits, each checked before the work (400 naming the limit): ``advise_max_queries`` queries,
``radius_max <= advise_max_radius`` and ``<= bits``, ``queries x database items <=
max_evaluate_pairs``; each timed radius within the probe guard, ``max_request_probes`` and
``max_results`` (a radius over them is reported unmeasured, with the reason).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.app.evaluation import check_pairs, labels_array, live_items
from bucketsearch.app.parsing import parse_hex


def _limits(entry, body, settings, nq: int) -> int:
    """The request's radius_max after checking every limit that does not need the items."""
    if nq > settings.advise_max_queries:
        raise ValueError(f"sample: {nq} queries, more than advise_max_queries="
                         f"{settings.advise_max_queries}; ask for fewer")
    radius_max = body.radius_max
    if radius_max is None:
        radius_max = min(entry.bits, 10, settings.advise_max_radius)
    if radius_max > entry.bits:
        raise ValueError(f"radius_max must be in [0, bits={entry.bits}], got {radius_max}")
    if radius_max > settings.advise_max_radius:
        raise ValueError(f"radius_max: {radius_max} is more than advise_max_radius="
                         f"{settings.advise_max_radius} (each radius is one timed search)")
    return radius_max


#: queries of a sample when the request names no number
DEFAULT_SAMPLE = 200


def sample_size(sample: int, n_items: int, holdout: bool) -> int:
    """Items a drawn sample takes: ``sample``, at most every item, and with ``holdout`` at most
    half of them (at least one), so the database keeps the rest."""
    return min(sample, max(n_items // 2, 1) if holdout else n_items)


def _queries(entry, body, ids: np.ndarray, words: np.ndarray, sample: int):
    """``(xq, query ids or None, rows of ids used as queries)``."""
    given = [f for f in ("query_ids", "codes") if getattr(body, f) is not None]
    if len(given) > 1:
        raise ValueError("query_ids: give query_ids or codes, not both")
    if body.codes is not None:
        if not body.codes:
            raise ValueError("codes: at least one query code")
        return parse_hex(body.codes, entry.bits), None, np.empty(0, np.int64)
    if body.query_ids is not None:
        qids = np.asarray(body.query_ids, dtype=np.int64)
        if not len(qids):
            raise ValueError("query_ids: at least one id")
        if len(np.unique(qids)) != len(qids):
            raise ValueError("query_ids: ids must be unique")
        rows = np.searchsorted(ids, qids)
        ok = (rows < len(ids)) & (ids[np.minimum(rows, len(ids) - 1)] == qids) \
            if len(ids) else np.zeros(len(qids), bool)
        if not ok.all():
            raise ValueError(f"query_ids: id {int(qids[~ok][0])} is not in index {entry.name!r}")
    else:
        if not len(ids):
            raise ValueError(f"sample: index {entry.name!r} has no items to sample queries from")
        rng = np.random.default_rng(body.seed)
        rows = np.sort(rng.choice(len(ids), size=sample_size(sample, len(ids), body.holdout),
                                  replace=False))
        qids = ids[rows]
    return words[rows], qids, rows


def _relevance(body, nq: int, qids, db_ids: np.ndarray):
    """The Relevance of the request over (queries, database rows), or None."""
    from bucketsearch.index.metrics import relevance as rel

    if body.pairs is not None:
        if body.db_labels is not None or body.query_labels is not None:
            raise ValueError("pairs: give pairs or labels, not both")
        row_of = {int(i): j for j, i in enumerate(db_ids.tolist())}
        found = []
        for n, (q, item, duplicate) in enumerate(body.pairs):
            if q >= nq:
                raise ValueError(f"pairs[{n}]: query position {q}, but there are {nq} queries")
            if item not in row_of:
                raise ValueError(f"pairs[{n}]: id {item} is not in the database (not in the "
                                 "index, or a held-out query)")
            if duplicate:
                found.append((q, row_of[item]))
        pairs = np.unique(np.array(found, dtype=np.int64).reshape(-1, 2), axis=0)
        return rel.from_pairs(pairs, nq, len(db_ids))
    if body.db_labels is None:
        if body.query_labels is not None or body.db_ids is not None:
            raise ValueError("db_labels: labels need db_ids and db_labels")
        return None
    if body.db_ids is None or len(body.db_ids) != len(body.db_labels):
        raise ValueError(f"db_labels: {len(body.db_labels)} labels for "
                         f"{0 if body.db_ids is None else len(body.db_ids)} db_ids")
    labeled = np.asarray(body.db_ids, dtype=np.int64)
    if len(np.unique(labeled)) != len(labeled):
        raise ValueError("db_ids: ids must be unique")
    labels = labels_array(body.db_labels, "db_labels")
    multihot = labels.ndim == 2
    # unlabeled items: a class no query has, or an all-zero multi-hot row
    fill = np.zeros(labels.shape[1], np.int64) if multihot else labels.min(initial=0) - 1
    order = np.argsort(labeled)
    labeled, labels = labeled[order], labels[order]

    def label_of(wanted: np.ndarray, field: str, required: bool) -> np.ndarray:
        pos = np.minimum(np.searchsorted(labeled, wanted), max(len(labeled) - 1, 0))
        hit = (labeled[pos] == wanted) if len(labeled) else np.zeros(len(wanted), bool)
        if required and not hit.all():
            raise ValueError(f"{field}: query item {int(wanted[~hit][0])} has no label in "
                             "db_ids / db_labels")
        out = np.empty((len(wanted),) + labels.shape[1:], np.int64)
        out[...] = fill
        out[hit] = labels[pos[hit]]
        return out

    if qids is None:
        if body.query_labels is None or len(body.query_labels) != nq:
            raise ValueError(f"query_labels: {nq} code queries need {nq} labels, got "
                             f"{0 if body.query_labels is None else len(body.query_labels)}")
        yq = labels_array(body.query_labels, "query_labels")
        if yq.ndim != labels.ndim or (multihot and yq.shape[1] != labels.shape[1]):
            raise ValueError("query_labels: not the form of db_labels (both class ids or both "
                             "multi-hot rows of the same width)")
    else:
        if body.query_labels is not None:
            raise ValueError("query_labels: item queries take their own label from db_labels")
        yq = label_of(qids, "query_ids", True)
    return rel.from_labels(yq, label_of(db_ids, "db_ids", False))


def advise_entry(entry, settings, body) -> dict:
    """The advice for ``body`` (a schemas.AdviseIn) on ``entry``'s live state (read once).
    Request errors raise ValueError (400)."""
    from bucketsearch.index.evaluation.advisor import advise
    from bucketsearch.index.metrics import Conventions

    view = entry.live.view()
    sample = body.sample if body.sample is not None \
        else min(DEFAULT_SAMPLE, settings.advise_max_queries)
    n_q = len(body.codes) if body.codes is not None else len(body.query_ids) \
        if body.query_ids is not None else sample_size(sample, view.ntotal, body.holdout)
    radius_max = _limits(entry, body, settings, n_q)
    check_pairs(n_q, view.ntotal, settings)  # before gathering the items
    ids, words = live_items(view)
    xq, qids, rows = _queries(entry, body, ids, words, sample)
    if body.holdout and len(rows):
        keep = np.ones(len(ids), bool)
        keep[rows] = False
        db_ids, db_words = ids[keep], words[keep]
    else:
        db_ids, db_words = ids, words
    if not len(db_ids):
        raise ValueError("holdout: the database is empty (the index holds no item but the "
                         "held-out queries); send holdout=false or add items")
    relevance = _relevance(body, len(xq), qids, db_ids)
    t0 = entry.cost.t0()[0]
    result = advise(view, np.ascontiguousarray(xq), db_words, relevance,
                    radius_max=radius_max, mode=entry.mode,
                    conventions=Conventions(**body.conventions.model_dump()), t0_ns=t0,
                    objective=body.objective, min_gain=body.min_gain,
                    min_precision=body.min_precision,
                    budget_ns=None if body.budget_us is None else body.budget_us * 1e3,
                    resamples=body.resamples, seed=body.seed,
                    max_request_probes=settings.max_request_probes,
                    max_results=settings.max_results, repeats=body.repeats,
                    measure_queries=body.measure_queries)
    result["index"] = entry.name
    result["t0_ns"] = t0
    result["holdout"] = bool(body.holdout and len(rows))
    result["query_ids"] = None if qids is None else qids.tolist()
    if body.pairs is not None:
        result["pairs"] = {"duplicate": sum(1 for p in body.pairs if p[2]),
                           "not_duplicate": sum(1 for p in body.pairs if not p[2])}
    from bucketsearch.index.metrics import to_jsonable
    return to_jsonable(result)
