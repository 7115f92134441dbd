"""Read-only figures the dashboard draws that no other route gives (issue 15).

* ``GET /v1/dashboard/session``: what the caller's key may do (``can_write``), so the page
  shows write controls only to a write key.
* ``GET /v1/indexes/{name}/radius-profile``: per radius, what a ball of that radius holds for
  sampled queries (empty and non-empty buckets, items, empty-ball queries), the extended cost
  model's prediction there, the served searches' empty buckets, and for mode "auto" the
  planner's choice per radius.

The profile runs ``queries`` sampled queries (``IndexHandle.query_sample``: half
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
from bucketsearch.app.costfit import json_safe
from bucketsearch.app.deps import EntryDep, ReadAuth, SettingsDep
from bucketsearch.app.registry import require_in_process
from bucketsearch.index.codes import MAX_BITS
from bucketsearch.index.costmodel import per_radius_means
from bucketsearch.index.handle import DEFAULT_PROFILE_PROBES as DEFAULT_PROBE_BUDGET
from bucketsearch.index.handle import DEFAULT_PROFILE_RADIUS as DEFAULT_MAX_RADIUS
from bucketsearch.index.handle import Budget

router = APIRouter(tags=["dashboard"])

MAX_PROFILE_QUERIES = 1024
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
    profile = entry.live.radius_profile(queries, max_distance, seed, Budget.of(settings))
    st, max_distance = profile.stats, profile.max_distance
    width = max_distance + 1
    names = FEATURES + tuple(f for f in ("candidates",) if getattr(st, f, None) is not None)
    means = {f: per_radius_means(st, f) for f in names}
    empty = profile.empty_balls
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
            "engine": profile.engine, "queries": queries, "seed": seed,
            "max_distance": max_distance, "main_size": profile.main_size,
            "live_size": profile.live_size, "radii": radii,
            "extended_model": None if model is None else
            {"estimator": model["estimator"], "source": model["source"],
             "unidentified": model["unidentified"]},
            "served": served, "planner": json_safe(profile.planner)}
