"""The cost model of one index: calibrated t0, extended model, per-radius modeled vs measured."""
from __future__ import annotations

import math

from fastapi import APIRouter

from bucketsearch.app.costfit import _finite, calibrate
from bucketsearch.app.deps import EntryDep, ReadAuth, SettingsDep, WriteAuth
from bucketsearch.app.schemas import CalibrateIn, CostModelOut, error_responses

router = APIRouter(prefix="/v1/indexes", tags=["cost model"],
                   responses=error_responses(400, 401, 403, 404, 409, 413, 503))


def cost_model_out(entry) -> dict:
    tracker = entry.cost
    t0, source = tracker.t0()
    ext = tracker.extended()
    records = tracker.snapshot()
    radii = []
    for r in sorted(records):
        rec = records[r]
        probes = rec.probes_total / rec.n if rec.n else 0.0  # mean probes of one query
        radii.append({
            "radius": r, "probes": probes, "paper_probes": math.comb(entry.bits, r),
            "cumulative_paper_probes": sum(math.comb(entry.bits, i) for i in range(r + 1)),
            "modeled_ns": t0 * probes if t0 is not None else None,
            "measured": {"count": rec.n, "p50_ns": rec.quantile(0.5),
                         "p90_ns": rec.quantile(0.9), "p99_ns": rec.quantile(0.99),
                         "mean_ns": rec.sum_ns / rec.n if rec.n else None}})
    return {
        "index": entry.name, "bits": entry.bits, "t0_ns": t0, "t0_source": source,
        "t0_samples": tracker.samples, "calibration": tracker.calibration,
        "extended_model": None if ext is None else {
            **ext, "r2": _finite(ext["r2"]), "max_rel_error": _finite(ext["max_rel_error"]),
            "rel_error": [_finite(e) for e in ext["rel_error"]], "terms": list(ext["terms"])},
        "radii": radii,
    }


@router.get("/{name}/cost-model", response_model=CostModelOut, dependencies=[ReadAuth])
def get_cost_model(entry: EntryDep) -> dict:
    """t0 (least squares through the origin of per-radius lookup_ns against probes), the
    extended model, and per radius the probes, modeled cost and measured latency distribution
    over every search since the server started."""
    return cost_model_out(entry)


@router.post("/{name}/cost-model/calibrate", response_model=CostModelOut,
             dependencies=[WriteAuth])
def post_calibrate(entry: EntryDep, body: CalibrateIn, settings: SettingsDep) -> dict:
    """Run sampled queries (half codes of the index, half uniform random codes) at radius
    ``max_distance`` and refit t0 from their per-radius timings."""
    entry.live.check_radius(body.max_distance)
    per_query = entry.live.state.main.probe_count(body.max_distance)
    if body.queries * per_query > settings.max_request_probes:
        raise ValueError(f"queries: {body.queries} x {per_query:,} probes exceeds "
                         f"max_request_probes={settings.max_request_probes:,}; use fewer "
                         "queries or a smaller max_distance")
    calibrate(entry.live, entry.cost, body.queries, body.max_distance, body.seed)
    return cost_model_out(entry)
