"""Read-only figures the dashboard draws that no other route gives (issue 15).

* ``GET /v1/dashboard/session``: what the caller's key may do (``can_write``), so the page
  shows write controls only to a write key.
* ``GET /v1/indexes/{name}/radius-profile``: per radius, what a ball of that radius holds for
  sampled queries (empty and non-empty buckets, items, empty-ball queries), the extended cost
  model's prediction there, the served searches' empty buckets, and for mode "auto" the
  planner's choice per radius.

The profile runs ``queries`` sampled queries (``bucketsearch.app.costfit.sample_queries``: half
codes of the
index, half uniform random codes, seeded) as one radius search of the main snapshot table, with
the per-radius counters; it is not recorded in the cost model (the measured cost stays that of
real searches). Mode "auto" profiles its single table (the buckets of the RAMAP model), mode
"mih" its substring tables (probes and buckets are substring buckets). Bucket counters are the
main table's (items inserted since the last merge sit in the delta segment, which has no
buckets); a ball is empty when no live item (main minus tombstones, plus the delta) lies within
it.
"""
from __future__ import annotations

import math
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Query, Request

from bucketsearch.app import guard
from bucketsearch.app.budget import range_work
from bucketsearch.app.costfit import json_safe, sample_queries
from bucketsearch.app.deps import EntryDep, ReadAuth, SettingsDep
from bucketsearch.app.registry import require_in_process
from bucketsearch.index.base import ResultLimitError
from bucketsearch.index.codes import MAX_BITS
from bucketsearch.index.costmodel import per_radius_means

router = APIRouter(tags=["dashboard"])

MAX_PROFILE_QUERIES = 1024
#: the default radius of a profile: the largest r <= DEFAULT_MAX_RADIUS whose probes (all
#: queries) stay within DEFAULT_PROBE_BUDGET and the server's request budget
DEFAULT_MAX_RADIUS = 4
DEFAULT_PROBE_BUDGET = 20_000_000
FEATURES = ("probes", "nonempty_buckets", "empty_buckets", "items", "lookup_ns")


@router.get("/v1/dashboard/session", dependencies=[ReadAuth])
def session(request: Request) -> dict:
    """Which keys the server has and whether this request's key may write (the dashboard shows
    write controls only then). Never echoes a key."""
    settings = request.app.state.settings
    keys = guard.Keys.of(settings)
    denial = guard.authorize(guard.WRITE, keys, request.headers.get("authorization"))
    return {"can_write": denial is None and not settings.read_only,
            "write_key_set": keys.write is not None, "read_key_set": keys.read is not None,
            "read_only": settings.read_only,
            "why_not_write": None if denial is None else denial.detail}


def profile_engine(main):
    """The table the profile probes: the single table of mode auto, else the main index."""
    return main.single if getattr(main, "kind", "") == "auto" else main


def default_radius(engine, bits: int, queries: int, budget: int) -> int:
    r = 0
    while r < min(bits, DEFAULT_MAX_RADIUS) and \
            queries * engine.probe_count(r + 1) <= min(budget, DEFAULT_PROBE_BUDGET) and \
            engine.probe_count(r + 1) <= engine.max_probes:
        r += 1
    return r


def nearest_distances(lims: np.ndarray, D: np.ndarray, I: np.ndarray, radius: int,
                      excluded: np.ndarray | None = None) -> np.ndarray:
    """Per query, the smallest distance among its results whose id is not ``excluded``
    (``radius + 1`` for none)."""
    nq = len(lims) - 1
    first = np.full(nq, radius + 1, dtype=np.int64)
    query = np.repeat(np.arange(nq), np.diff(lims))
    keep = np.ones(len(I), dtype=bool) if excluded is None or not len(excluded) \
        else ~np.isin(I, excluded)
    np.minimum.at(first, query[keep], np.asarray(D, dtype=np.int64)[keep])
    return first


def empty_balls(state, xq: np.ndarray, radius: int, main_result: tuple,
                max_results: int | None = None) -> list[int]:
    """Per r in 0..radius, the queries whose ball ``d <= r`` holds no live item: the main
    table's results (``main_result = lims, D, I``) minus tombstones, and the delta segment
    (its search capped at ``max_results`` ids too)."""
    first = nearest_distances(*main_result, radius, state.tombstones)
    if state.delta is not None and len(state.delta_ids):
        try:
            lims, D, I = state.delta.range_search(xq, radius, max_results=max_results)[:3]
        except ResultLimitError as exc:
            raise ValueError(f"max_distance: radius {radius} finds at least {exc.reached:,} "
                             f"recent (delta) items for {len(xq)} queries, more than "
                             f"max_results={max_results}; use a smaller radius") from None
        first = np.minimum(first, nearest_distances(lims, D, I, radius))
    return [int((first > r).sum()) for r in range(radius + 1)]


def extended_prediction(model: dict | None, means: dict[str, np.ndarray],
                        width: int) -> tuple[list, list]:
    """``(per radius, cumulative)`` predicted ns of the per-query extended model
    (``query_model``, :mod:`bucketsearch.index.costmodel`) at the profile's mean features:
    ``T(R) = fixed + sum_t coef_t sum_{r<=R} feature_t(r)`` (``coef_t`` the ``coef_ns`` of each
    identified term; an unidentified term is left out of the model, so it adds nothing), and
    per radius ``T(r) - T(r - 1)`` (``T(0)`` at radius 0). The model is linear, so the
    prediction at the mean features is the mean prediction. None throughout when there is no
    model yet or it has a term the profile does not measure; None where the prediction is
    negative (the issue-26 dashboard showed "extended ns -987" at radius 0)."""
    terms = {name: float(t["coef_ns"]) for name, t in ((model or {}).get("terms") or {}).items()}
    features = [t for t in terms if t != "fixed"]
    if not terms or any(t not in means for t in features):
        return [None] * width, [None] * width
    per_radius = np.zeros(width)
    for term in features:
        per_radius += terms[term] * means[term][:width]
    cumulative = np.cumsum(per_radius) + terms.get("fixed", 0.0)
    per_radius[0] = cumulative[0]
    # a time is never negative: where a negative coefficient (an item term fitted below 0 on
    # noisy samples) makes the prediction so, there is none (the dashboard shows "-")
    return ([None if v < 0 else float(v) for v in per_radius],
            [None if v < 0 else float(v) for v in cumulative])


def planner_choices(main, radius: int) -> dict | None:
    """Mode auto: the plan of a one-query radius search at every r <= ``radius`` (the path the
    planner would run and the predicted ns of each path) and the last plan it ran."""
    if getattr(main, "kind", "") != "auto":
        return None
    plans = []
    for r in range(radius + 1):
        plan = main.plan(max_distance=r, nq=1)
        plans.append({"radius": r, "mode": plan["mode"], "predicted_ns": plan["predicted_ns"],
                      "reason": plan["reason"]})
    return json_safe({"calibrated": bool(main.calibrated), "choices": plans,
                   "last_plan": main.last_plan})


@router.get("/v1/indexes/{name}/radius-profile", dependencies=[ReadAuth])
def radius_profile(
        entry: EntryDep, settings: SettingsDep,
        queries: Annotated[int, Query(ge=1, le=MAX_PROFILE_QUERIES,
                                      description="sampled queries")] = 64,
        max_distance: Annotated[int | None, Query(
            ge=0, le=MAX_BITS, description="largest radius (default: the largest r <= "
            f"{DEFAULT_MAX_RADIUS} within {DEFAULT_PROBE_BUDGET:,} probes)")] = None,
        seed: Annotated[int, Query(ge=0, le=2**32 - 1)] = 0) -> dict:
    """Per radius r: mean probes, empty and non-empty buckets and items of one query, the
    queries whose ball of radius r holds no item, the per-query extended model's predicted ns
    (of radius r, and of the whole search up to r; ``extended_model`` names it); the mean
    empty buckets of the served searches; the planner's choices (mode auto)."""
    require_in_process(entry, "radius-profile")
    live = entry.live
    state = live.state  # one consistent view
    main = state.main
    engine = profile_engine(main)
    if max_distance is None:
        max_distance = default_radius(engine, entry.bits, queries, settings.max_request_probes)
    live.check_radius(max_distance)
    per_query = engine.probe_count(max_distance)
    if queries * per_query > settings.max_request_probes:
        raise ValueError(f"max_distance: {queries} queries x {per_query:,} probes (radius "
                         f"{max_distance}) is more than max_request_probes="
                         f"{settings.max_request_probes:,}; use a smaller radius or fewer "
                         "queries")
    range_work(state, engine, queries, max_distance, settings.max_results).check(
        settings, f"radius-profile: {queries} queries of radius {max_distance}",
        "use fewer queries or a smaller max_distance")
    xq = sample_queries(live, queries, seed)
    try:
        lims, D, I, st = engine.range_search(xq, max_distance, stats=True,
                                             max_results=settings.max_results)
    except ResultLimitError as exc:
        raise ValueError(f"max_distance: radius {max_distance} returns at least "
                         f"{exc.reached:,} ids for {queries} queries, more than max_results="
                         f"{settings.max_results}; use a smaller radius") from None
    width = max_distance + 1
    names = FEATURES + tuple(f for f in ("candidates",) if getattr(st, f, None) is not None)
    means = {f: per_radius_means(st, f) for f in names}
    empty = empty_balls(state, xq, max_distance, (lims, D, I), settings.max_results)
    model = entry.cost.extended()
    extended, extended_cum = extended_prediction(model, means, width)
    radii = []
    for r in range(width):
        paper = math.comb(entry.bits, r)
        radii.append({
            "radius": r, "paper_probes": paper,
            "cumulative_paper_probes": sum(math.comb(entry.bits, i) for i in range(r + 1)),
            **{f: float(means[f][r]) for f in names},
            "empty_share": float(means["empty_buckets"][r] / means["probes"][r])
            if means["probes"][r] else None,
            "empty_ball_queries": empty[r], "empty_ball_share": empty[r] / queries,
            "extended_ns": extended[r], "extended_cumulative_ns": extended_cum[r]})
    radii = json_safe(radii)
    served = [{"radius": r, "queries": rec.n, "probes": rec.probes_total / rec.n,
               "empty_buckets": rec.empty_total / rec.n}
              for r, rec in sorted(entry.cost.snapshot().items()) if rec.n]
    return {"index": entry.name, "bits": entry.bits, "mode": entry.mode,
            "engine": getattr(engine, "kind", ""), "queries": queries, "seed": seed,
            "max_distance": max_distance, "main_size": int(main.ntotal),
            "live_size": int(state.ntotal), "radii": radii,
            "extended_model": None if model is None else
            {"estimator": model["estimator"], "source": model["source"],
             "unidentified": model["unidentified"]},
            "served": served, "planner": planner_choices(main, max_distance)}
