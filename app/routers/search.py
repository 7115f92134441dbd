"""Radius and k-NN search with per-query, per-radius work counters."""
from __future__ import annotations

import time

import orjson

from fastapi import APIRouter, HTTPException, Response
from starlette.concurrency import run_in_threadpool

from app.deps import EntryDep, ReadAuth, SettingsDep
from app.routers.indexes import parse_hex
from app.schemas import SearchRequest, SearchResponse, error_responses
from index.probe import ProbeLimitError

router = APIRouter(prefix="/v1/indexes", tags=["search"],
                   responses=error_responses(400, 401, 403, 404, 413, 503))


class RequestProbeLimit(ProbeLimitError):
    """The whole batch would probe more buckets than ``max_request_probes``."""

    def __init__(self, nq: int, per_query: int, limit: int):
        self.probes, self.limit, self.radius = nq * per_query, limit, None
        ValueError.__init__(
            self, f"codes: {nq} queries x {per_query:,} probes = {nq * per_query:,} buckets, "
                  f"more than the per-request limit max_request_probes={limit:,}; send fewer "
                  "queries per request, use a smaller radius, or mode 'mih'/'auto'")

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


#: A radius search of at most this many probes in total runs on the event loop itself: the hop
#: to the thread pool (tens to hundreds of microseconds) would cost more than the search.
INLINE_MAX_PROBES = 5_000
INLINE_MAX_QUERIES = 8
INLINE_MAX_DELTA = 10_000  # items the delta scan may hold for an inline search


@router.post("/{name}/search", response_model=SearchResponse, dependencies=[ReadAuth])
async def search(entry: EntryDep, body: SearchRequest, settings: SettingsDep) -> Response:
    """A batch of radius (``max_distance``, inclusive) or k-NN (``k``) queries.

    Small radius searches (at most INLINE_MAX_QUERIES queries, INLINE_MAX_PROBES probes in all
    and INLINE_MAX_DELTA delta items, i.e. microseconds of work) run inline; everything else
    runs in the thread pool (the kernels release the GIL, so searches run in parallel).

    Results per query are ordered by (distance, id). With ``stats: true`` every query gets,
    per radius searched in the main table, ``probes, nonempty_buckets, empty_buckets, items,
    lookup_ns`` (in-kernel clock) and ``modeled_ns = t0 * probes``. Items inserted since the
    last merge (the delta segment) are scanned linearly and are not in these counters.
    """
    nq = len(body.codes)
    if body.max_distance is not None and nq <= INLINE_MAX_QUERIES \
            and 0 <= body.max_distance <= entry.bits:
        state = entry.live.state
        if body.max_distance <= 3 and entry.mode != "auto" \
                and len(state.delta_ids) <= INLINE_MAX_DELTA \
                and nq * state.main.probe_count(body.max_distance) <= INLINE_MAX_PROBES:
            return run_search(entry, body, settings)
    return await run_in_threadpool(run_search, entry, body, settings)


def run_search(entry, body: SearchRequest, settings) -> Response:
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
        # the request's probe budget, shared by its queries, caps each query's k-NN growth
        per_query = max(settings.max_request_probes // nq, 1)
        D, I, st = live.search(xq, body.k, stats=True, max_probes=per_query)
        ids, dists = I.tolist(), D.tolist()
        results = []
        for row_i, row_d in zip(ids, dists):
            n = len(row_i)
            while n and row_i[n - 1] < 0:
                n -= 1
            results.append({"ids": row_i[:n], "distances": row_d[:n]})
    else:
        live.check_radius(body.max_distance)
        main = live.state.main
        per_query = main.probe_count(body.max_distance)
        if entry.mode != "auto" and per_query <= main.max_probes \
                and nq * per_query > settings.max_request_probes:
            raise RequestProbeLimit(nq, per_query, settings.max_request_probes)
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
    # serialized here (the dict has exactly the SearchResponse shape): skips FastAPI's
    # re-validation of thousands of result rows
    return Response(orjson.dumps(out), media_type="application/json",
                    headers={"Server-Timing": (
                        f"parse;dur={(t_parsed - t_start) * 1e3:.3f}, "
                        f"search;dur={(t_searched - t_parsed) * 1e3:.3f}, "
                        f"format;dur={(t_done - t_searched) * 1e3:.3f}")})
