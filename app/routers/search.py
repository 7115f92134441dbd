"""Radius and k-NN search with per-query, per-radius work counters.

The search limits, each checked before the work it limits (issue 10), the same for JSON and
octet-stream bodies:

* ``max_batch`` (413): queries per request, checked while the body is parsed
  (app/parsing.py).
* ``max_k``, and ``nq x k <= max_results`` (k-NN): checked before any search
  (``bucketsearch.app.parsing.check_knn``, while the body is parsed).
* ``max_request_probes``: bucket lookups of the whole request, charged with the engine's
  ``probe_count(R, nq)`` (one meaning for every engine, index/base.py: sum C(Q, r) for the
  single table, substring probes for multi-index hashing, 0 for a scan, the chosen plan's
  count for the planner). A radius search is refused up front when ``nq x`` that count passes
  it; the planner plans under the per-query share ``max_request_probes // nq``, so it picks a
  plan that fits (the scan when no probing plan does). k-NN (also top-k within a radius): every
  query gets that share (at least one probe) and switches to a scan when its next radius would
  pass it, so it never fails.
* ``max_results`` (radius search): enforced by the kernels while they build the results: they
  stop once the count passes it, so even a huge radius holds at most about threads x
  max_results results in memory before the 400 (which gives the count reached, a lower bound).

Linear scans (the planner's scan plan, the delta segment of recent inserts) probe no bucket;
they are charged to ``max_request_compares`` (queries x items compared), and every search's
answer and statistics to ``max_request_memory``, both estimated from the request and the
index's shape before any work (index/budget.py). k-NN's scan fallback (a query whose probe share
ran out) is bounded by ``nq x N`` compares, ``nq <= max_batch``.
"""
from __future__ import annotations

import time
from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request, Response
from starlette._utils import get_route_path
from starlette.concurrency import run_in_threadpool

from bucketsearch.app import guard
from bucketsearch.app.deps import EntryDep, ReadAuth, settings_of
from bucketsearch.app.encode import knn_to_csr, results_binary, results_json
from bucketsearch.app.parsing import SearchJob, content_type, parse_search, wants_binary
from bucketsearch.app.schemas import (SearchRequest, SearchResponse,
                                      json_or_octet_body)
from bucketsearch.index.budget import RequestProbeLimit  # noqa: F401 -- importable here
from bucketsearch.index.codes import MAX_BITS
from bucketsearch.index.handle import Budget, ResultLimitError

router = APIRouter(prefix="/v1/indexes", tags=["search"])


def stats_records(st, t0: float | None) -> list[list[dict]]:
    """Per query, one record per radius searched (``modeled_ns = t0 * probes``, the paper's
    single-table charge: None for a query another engine ran), with every
    per-radius field the engine recorded (``candidates`` and ``unique_candidates`` too for
    multi-index hashing)."""
    if st is None:
        return None
    names = st.radius_fields()
    cols = {f: getattr(st, f).tolist() for f in names}
    engines = st.engine_names()
    out = []
    for qi, n_radii in enumerate(st.radii.tolist()):
        rows = []
        paper = t0 if engines[qi] == "single" else None  # the paper's model: bucket probes
        for r in range(n_radii):
            rec = {"radius": r, **{f: cols[f][qi][r] for f in names}}
            rec["modeled_ns"] = paper * rec["probes"] if paper is not None else None
            rows.append(rec)
        out.append(rows)
    return out


SEARCH_LAYOUT = """\
Two bodies are accepted (pick with Content-Type):

* `application/json`: `{"codes": ["hex", ...], "max_distance": r}` (radius search: every item
  with d <= r), `{"codes": [...], "k": k}` (k-NN: the k nearest) or both, `{"codes": [...],
  "k": k, "max_distance": r}` (top-k within a radius: the k nearest with d <= r; fewer when
  fewer lie that close); optionally `"stats": true`; one hex code per query (2*ceil(bits/8)
  digits, np.packbits byte order: the first digit holds bits 0-3).
* `application/octet-stream`: the query codes packed, `B = ceil(bits/8)` bytes each in
  np.packbits layout (padding bits at the end of the last byte must be 0), so the body is
  `nq * B` bytes; `max_distance`, `k` (one or both, as above) and `stats` go in the query
  string. No hex, no JSON to parse: the cheapest way to send a large batch.

The answer is JSON (one `{"ids", "distances"}` entry per query, in order, each ordered by
(distance, id)), or with `Accept: application/octet-stream` (first media type listed) the same
results in binary: `u64 nq | i64 lims[nq+1] | i64 ids[n] | i32 distances[n]`, little-endian,
`n = lims[nq]`, query q's results at `lims[q]:lims[q+1]` (faiss's range_search layout; no
`stats` in that form)."""

SEARCH_BODY = json_or_octet_body(SearchRequest)


#: A radius search of at most this many probes in total runs on the event loop itself: the hop
#: to the thread pool (tens to hundreds of microseconds) would cost more than the search.
INLINE_MAX_PROBES = 5_000
INLINE_MAX_BODY = 1_024  # bytes of a body parsed on the event loop (a handful of codes)
INLINE_MAX_DELTA = 10_000  # items the delta scan may hold for an inline search
#: Most ids an inline search may return (bucketsearch.index.budget.answer_bound): building and encoding a
#: large answer takes milliseconds whatever the probes (radius 0 on a bucket of 39,000 items,
#: 128 queries: 5M ids, 0.2-1 s of the event loop), and blocks every other request meanwhile.
INLINE_MAX_RESULTS = 4_096


def runs_inline(entry, job: SearchJob) -> bool:
    """Microseconds of work: a radius search of few probes (at least one: a scan, 0 probes,
    reads every item), a small delta, and a small answer (at most INLINE_MAX_RESULTS ids
    however the items fall: bucketsearch.index.budget.answer_bound). An index that cannot say
    so cheaply (its first search of a snapshot; a sharded index: a Ray round trip) runs in the
    thread pool."""
    if job.k is not None or job.max_distance is None \
            or not 0 <= job.max_distance <= min(entry.bits, 3):
        return False
    nq = len(job.xq)
    work = entry.live.range_estimate(nq, job.max_distance, cheap=True)
    return work is not None and 0 < work.probes <= INLINE_MAX_PROBES \
        and work.compares <= nq * INLINE_MAX_DELTA and work.answer <= INLINE_MAX_RESULTS


@router.post("/{name}/search", response_model=SearchResponse, dependencies=[ReadAuth],
             responses={200: {"description": "results (JSON, or binary with Accept: "
                                             "application/octet-stream)",
                              "content": {"application/octet-stream": {
                                  "schema": {"type": "string", "format": "binary"}}}}},
             openapi_extra=SEARCH_BODY, description=SEARCH_LAYOUT)
async def search(
        entry: EntryDep, request: Request,
        max_distance: Annotated[int | None, Query(
            ge=0, le=MAX_BITS, description="octet-stream only: radius search, d <= r (with k: the "
                                      "k nearest within r)")] = None,
        k: Annotated[int | None, Query(ge=1, description="octet-stream only: k-NN (with "
                                                         "max_distance: within that radius)")]
        = None,
        stats: Annotated[bool, Query(description="octet-stream only: per-radius counters")]
        = False) -> Response:
    """A batch of radius (``max_distance``, inclusive), k-NN (``k``) or top-k within a radius
    (both) queries.

    Small requests (at most INLINE_MAX_BODY bytes, INLINE_MAX_PROBES probes in all and
    INLINE_MAX_DELTA delta items, i.e. microseconds of work) run inline; everything else is
    parsed and searched in the thread pool (the kernels release the GIL, so searches run in
    parallel).

    Results per query are ordered by (distance, id). With ``stats: true`` every query gets,
    per radius searched in the main table, ``probes, nonempty_buckets, empty_buckets, items,
    lookup_ns`` (in-kernel clock), ``modeled_ns = t0 * probes`` and, for multi-index hashing,
    ``candidates, unique_candidates``; ``scanned_from`` gives per query the radius from which a
    k-NN query ranked codes by a scan (-1: none), ``engine`` the engine that ran each query
    (single, mih or scan: mode auto's plan), ``total_ns`` its whole in-kernel time and
    ``codes_compared`` the codes a linear pass compared with it, and ``plan`` the planner's
    choice (mode auto).
    Items inserted since the last merge (the delta segment) are scanned linearly, not probed:
    ``delta`` gives the items scanned per query and the scan's wall-clock ns for the batch
    (also ``delta`` in Server-Timing).
    """
    t_start = time.perf_counter()
    body = await request.body()
    content, media_type, headers = await answer_search(
        entry, body, content_type(request), {"max_distance": max_distance, "k": k, "stats": stats},
        wants_binary(request.headers.get("accept", "")), settings_of(request), t_start)
    return Response(content, media_type=media_type, headers=dict(headers))


async def answer_search(entry, body: bytes, ctype: str, params: dict, binary: bool, settings,
                        t_start: float) -> tuple[bytes, str, list[tuple[str, str]]]:
    """``(content, media type, extra headers)`` of a search request: parsed and searched on
    the event loop when it is small (:func:`runs_inline`), else in the thread pool. Raises
    what the parser and the engine raise (the app's exception handlers answer them)."""
    if len(body) <= INLINE_MAX_BODY:
        job = parse_search(body, ctype, entry.bits, settings, params, binary)
        if runs_inline(entry, job):
            return run_search(entry, job, settings, t_start)
        return await run_in_threadpool(run_search, entry, job, settings, t_start)

    def parse_and_run():
        job = parse_search(body, ctype, entry.bits, settings, params, binary)
        return run_search(entry, job, settings, t_start)
    return await run_in_threadpool(parse_and_run)


def run_search(entry, job: SearchJob, settings, t_start: float) \
        -> tuple[bytes, str, list[tuple[str, str]]]:
    """The search of a parsed request: ``(content, media type, extra headers)``. The index
    checks the request's budget (probes, compares, memory: bucketsearch.index.budget) on the
    state it then searches, before any work; the audit reads that same state (``view``)."""
    t_parsed = time.perf_counter()
    nq = len(job.xq)
    view = entry.live.view()  # the request reads one state
    budget = Budget.of(settings)
    if job.k is not None:  # k and nq x k were checked by parse_search, before decoding
        # the request's probe budget, shared by its queries, caps each query's k-NN growth
        D, I, st = view.search(job.xq, job.k, max_distance=job.max_distance, stats=True,
                               budget=budget)
        lims, D, I = knn_to_csr(D, I)  # the response's CSR layout (padding dropped)
    else:
        R = job.max_distance
        try:
            lims, D, I, st = view.range_search(job.xq, R, stats=True, budget=budget)
        except ResultLimitError as exc:
            raise ValueError(
                f"max_distance: radius {R} returns at least {exc.reached:,} ids for {nq} "
                f"queries (counted before the search stopped), more than max_results="
                f"{settings.max_results}; use a smaller radius, fewer queries per request, "
                "or k") from None
    t_searched = time.perf_counter()
    entry.cost.observe(st)
    audit = entry.audit  # the exactness audit: one count and one compare unless sampled
    if audit is not None and next(audit.counter) >= audit.next_pick:
        audit.submit(entry.name, view, job.k, job.max_distance, job.xq, lims, D, I)
    if job.binary:
        out = [results_binary(lims, D, I)]
        media_type = "application/octet-stream"
    else:
        out = [b'{"results":', results_json(lims, D, I)]
        if job.stats:
            records = stats_records(st, entry.cost.t0()[0]) if st is not None \
                else [[] for _ in range(nq)]
            out += [b',"stats":', orjson.dumps(records), b',"delta":', orjson.dumps(
                {"items": st.delta_items, "scan_ns": st.delta_ns} if st is not None else None),
                b',"scanned_from":', orjson.dumps(
                    st.scanned_from.tolist() if st is not None and st.scanned_from is not None
                    else None),
                b',"engine":', orjson.dumps(st.engine_names() if st is not None else None),
                b',"total_ns":', orjson.dumps(st.total_ns.tolist() if st is not None else None),
                b',"codes_compared":', orjson.dumps(
                    st.codes_compared.tolist() if st is not None
                    and st.codes_compared is not None else None),
                b',"plan":', orjson.dumps(st.plan if st is not None else None,
                                          option=orjson.OPT_SERIALIZE_NUMPY)]
        media_type = "application/json"
    t_done = time.perf_counter()
    took_ms = (t_done - t_start) * 1e3
    if not job.binary:
        out += [b',"took_ms":', orjson.dumps(took_ms), b"}"]
    # written here (the bytes have exactly the SearchResponse shape): skips FastAPI's
    # re-validation and Python lists of thousands of result rows
    timing = (f"parse;dur={job.parse_s * 1e3:.3f}, "
              f"queue;dur={(t_parsed - t_start - job.parse_s) * 1e3:.3f}, "
              f"search;dur={(t_searched - t_parsed) * 1e3:.3f}, "
              f"format;dur={(t_done - t_searched) * 1e3:.3f}")
    if st is not None and st.delta_items:
        timing += f", delta;dur={st.delta_ns * 1e-6:.3f}"
    return b"".join(out), media_type, [("server-timing", timing),
                                       ("x-took-ms", f"{took_ms:.3f}")]


# ---------------------------------------------------------------------------- the fast path
#: The route :class:`SearchFastPath` answers (its label in the request metrics).
SEARCH_ROUTE = "/v1/indexes/{name}/search"
_PREFIX, _SUFFIX = SEARCH_ROUTE.split("{name}")
_BOOLS = {b"true": True, b"false": False, b"1": True, b"0": False}
_INT_PARAMS = {b"max_distance": (0, MAX_BITS), b"k": (1, None)}  # the endpoint's Query bounds


def plain_params(query: bytes) -> dict | None:
    """The search's query parameters when they are in their plainest form: ``max_distance``
    and ``k`` in decimal digits within the endpoint's bounds, ``stats`` true/false/1/0, each at
    most once and nothing else; None for anything else (FastAPI parses it, and refuses it
    with its usual message)."""
    params = {"max_distance": None, "k": None, "stats": False}
    if not query:
        return params
    seen = set()
    for pair in query.split(b"&"):
        key, eq, value = pair.partition(b"=")
        if not eq or key in seen:
            return None
        seen.add(key)
        if key == b"stats":
            params["stats"] = flag = _BOOLS.get(value)
            if flag is None:
                return None
            continue
        bounds = _INT_PARAMS.get(key)
        if bounds is None or not value.isdigit() or len(value) > 9 \
                or (len(value) > 1 and value[:1] == b"0"):
            return None
        number = int(value)
        low, high = bounds
        if number < low or (high is not None and number > high):
            return None
        params[key.decode()] = number
    return params


def _replay(body: bytes, receive):
    """A ``receive`` that gives ``body`` as one message, then defers to ``receive``."""
    sent = False

    async def replayed():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return replayed


class SearchFastPath:
    """Pure ASGI middleware, inside :class:`bucketsearch.app.guard.Guard` (auth, concurrency, body
    limits are enforced before it): a search the endpoint would answer 200 is answered here by the
    endpoint's own functions (:func:`answer_search`), without FastAPI's routing, dependency
    resolution and Request/Response objects, the larger part of the fixed cost of a small
    search (issue 13; figures in bench/RESULTS.md).

    Everything else goes on to FastAPI unchanged: other routes, and every search this path
    declines: server not ready, unknown index, the guard did not enforce read access, query
    parameters in any but their plainest form (:func:`plain_params`), or a request the parser
    or the engine refuses. For the last, FastAPI runs the same request again and answers with
    the usual error: the search is read-only, and the limits are checked before the work they
    limit (``max_results`` stops the kernels once passed), so a refused request costs at most
    its own bounded work twice. So every status code and message is the endpoint's, and
    OpenAPI documents the one route (tests/test_http_cost.py)."""

    def __init__(self, app, app_state, routes):
        self.app = app
        self.app_state = app_state
        self.route = None  # the APIRoute FastAPI would set (the metrics label its path)
        for ctx in guard.flat_routes(routes):
            route = getattr(ctx, "original_route", ctx)
            if getattr(ctx, "path", None) == SEARCH_ROUTE and "POST" in (ctx.methods or ()):
                self.route = route
                break

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or self.route is None:
            return await self.app(scope, receive, send)
        path = get_route_path(scope)
        state = self.app_state
        if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)
                and getattr(state, "ready", False)):
            return await self.app(scope, receive, send)
        entry = state.registry.entries.get(path[len(_PREFIX):-len(_SUFFIX)])
        permission = scope.get(guard.SCOPE_KEY)
        params = plain_params(scope["query_string"])
        if entry is None or params is None or permission is None \
                or guard.RANK[permission] < guard.RANK[guard.READ]:
            return await self.app(scope, receive, send)
        t_start = time.perf_counter()
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        ctype = accept = None  # the first of each header, as Starlette's Headers.get
        for name, value in scope["headers"]:
            if name == b"content-type":
                if ctype is None:
                    ctype = value.decode("latin-1")
            elif name == b"accept" and accept is None:
                accept = value.decode("latin-1")
        try:
            content, media_type, headers = await answer_search(
                entry, body, (ctype or "").split(";")[0].strip().lower(), params,
                wants_binary(accept or ""), state.settings, t_start)
        except Exception:  # noqa: BLE001 -- FastAPI runs it again and answers the error
            return await self.app(scope, _replay(body, receive), send)
        scope["route"] = self.route
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", media_type.encode()), (b"content-length", b"%d" % len(content)),
            *((name.encode(), value.encode()) for name, value in headers)]})
        await send({"type": "http.response.body", "body": content})
