"""The cost model of one index: calibrated t0, extended model, per-radius modeled vs measured."""
from __future__ import annotations

import math

from fastapi import APIRouter

from app.costfit import EXTENDED_TERMS, calibrate
from app.deps import EntryDep, ReadAuth, SettingsDep, WriteAuth
from app.schemas import CalibrateIn, CostModelOut

router = APIRouter(prefix="/v1/indexes", tags=["cost model"])


def cost_model_out(entry) -> dict:
    tracker = entry.cost
    t0, source = tracker.t0()
    ext = tracker.extended()
    records = tracker.snapshot()
    radii = []
    cumulative = 0
    for r in sorted(records):
        rec = records[r]
        probes = math.comb(entry.bits, r)
        cumulative = sum(math.comb(entry.bits, i) for i in range(r + 1))
        radii.append({
            "radius": r, "probes": probes, "cumulative_probes": cumulative,
            "modeled_ns": t0 * probes if t0 is not None else None,
            "measured": {"count": rec.n, "p50_ns": rec.quantile(0.5),
                         "p90_ns": rec.quantile(0.9), "p99_ns": rec.quantile(0.99),
                         "mean_ns": rec.sum_ns / rec.n if rec.n else None}})
    return {
        "index": entry.name, "bits": entry.bits, "t0_ns": t0, "t0_source": source,
        "t0_samples": tracker.samples,
        "extended_model": None if ext is None else {
            "source": "app.costfit least squares (fallback until index.costmodel lands)",
            "terms": list(EXTENDED_TERMS), "coefficients_ns": ext[0], "samples": ext[1]},
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
    calibrate(entry.live, entry.cost, body.queries, body.max_distance, body.seed)
    return cost_model_out(entry)
