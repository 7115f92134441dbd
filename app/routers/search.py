"""Radius and k-NN search with per-query, per-radius work counters."""
from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Response

from app.deps import EntryDep, ReadAuth, SettingsDep
from app.routers.indexes import parse_hex
from app.schemas import SearchRequest, SearchResponse

router = APIRouter(prefix="/v1/indexes", tags=["search"])

STAT_FIELDS = ("probes", "nonempty_buckets", "empty_buckets", "items", "lookup_ns")


def stats_records(st, t0: float | None) -> list[list[dict]]:
    """Per query, one record per radius searched (``modeled_ns = t0 * probes``)."""
    if st is None:
        return None
    cols = {f: getattr(st, f).tolist() for f in STAT_FIELDS}
    out = []
    for qi, n_radii in enumerate(st.radii.tolist()):
        rows = []
        for r in range(n_radii):
            rec = {"radius": r, **{f: cols[f][qi][r] for f in STAT_FIELDS}}
            rec["modeled_ns"] = t0 * rec["probes"] if t0 is not None else None
            rows.append(rec)
        out.append(rows)
    return out


@router.post("/{name}/search", response_model=SearchResponse, dependencies=[ReadAuth],
             responses={400: {"description": "bad code, radius over the probe guard, ..."},
                        404: {"description": "unknown index"},
                        413: {"description": "batch too large"}})
def search(entry: EntryDep, body: SearchRequest, settings: SettingsDep,
           response: Response) -> dict:
    """A batch of radius (``max_distance``, inclusive) or k-NN (``k``) queries.

    Results per query are ordered by (distance, id). With ``stats: true`` every query gets,
    per radius searched in the main table, ``probes, nonempty_buckets, empty_buckets, items,
    lookup_ns`` (in-kernel clock) and ``modeled_ns = t0 * probes``. Items inserted since the
    last merge (the delta segment) are scanned linearly and are not in these counters.
    """
    t_start = time.perf_counter()
    nq = len(body.codes)
    if nq > settings.max_batch:
        raise HTTPException(413, f"codes: batch of {nq} queries exceeds the limit max_batch="
                                 f"{settings.max_batch} (BUCKETSEARCH_MAX_BATCH)")
    xq = parse_hex(body.codes, entry.bits)
    t_parsed = time.perf_counter()
    live = entry.live
    if body.k is not None:
        if body.k > settings.max_k:
            raise ValueError(f"k: {body.k} exceeds the limit max_k={settings.max_k}")
        D, I, st = live.search(xq, body.k, stats=True)
        ids, dists = I.tolist(), D.tolist()
        results = []
        for row_i, row_d in zip(ids, dists):
            n = len(row_i)
            while n and row_i[n - 1] < 0:
                n -= 1
            results.append({"ids": row_i[:n], "distances": row_d[:n]})
    else:
        live.check_radius(body.max_distance)
        lims, D, I, st = live.range_search(xq, body.max_distance, stats=True)
        total = int(lims[-1])
        if total > settings.max_results:
            raise ValueError(f"max_distance: radius {body.max_distance} returns {total} ids, "
                             f"more than max_results={settings.max_results}; use a smaller "
                             "radius, fewer queries, or k")
        ids, dists, bounds = I.tolist(), D.tolist(), lims.tolist()
        results = [{"ids": ids[a:b], "distances": dists[a:b]}
                   for a, b in zip(bounds[:-1], bounds[1:])]
    t_searched = time.perf_counter()
    entry.cost.observe(st)
    out = {"results": results}
    if body.stats:
        out["stats"] = stats_records(st, entry.cost.t0()[0]) if st is not None \
            else [[] for _ in range(nq)]
    t_done = time.perf_counter()
    out["took_ms"] = (t_done - t_start) * 1e3
    response.headers["Server-Timing"] = (
        f"parse;dur={(t_parsed - t_start) * 1e3:.3f}, "
        f"search;dur={(t_searched - t_parsed) * 1e3:.3f}, "
        f"format;dur={(t_done - t_searched) * 1e3:.3f}")
    return out
