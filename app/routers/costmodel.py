"""The cost model of one index, live: the t0 estimates (each named), the per-query extended
model, per radius measured T(r) and T(R) beside the paper's model, and the verdicts; all from
:mod:`bucketsearch.app.costfit` (bookkeeping) and :mod:`bucketsearch.index.costmodel` (formulas)."""
from __future__ import annotations

from fastapi import APIRouter

from bucketsearch.app.budget import check_calibration
from bucketsearch.app.costfit import CALIBRATION, agreement, calibrate, json_safe, live_rows
from bucketsearch.app.deps import EntryDep, ReadAuth, SettingsDep, WriteAuth
from bucketsearch.app.registry import require_in_process
from bucketsearch.app.schemas import CalibrateIn, CostModelOut
from bucketsearch.index.costmodel import HOLDS_FACTOR, RADIUS_FIT

router = APIRouter(prefix="/v1/indexes", tags=["cost model"])


def cost_model_out(entry) -> dict:
    tracker = entry.cost
    observed = tracker.observed_t0()  # refits first: t0() below then reads the same fit
    t0, source = tracker.t0(refit=True)
    ext = tracker.extended()
    estimates = tracker.estimates()
    rows = live_rows(tracker.snapshot(paper=True), entry.bits, t0)
    judged = [r for r in rows if r["paper_holds"] is not None]
    paper = {"holds_at": [r["radius"] for r in judged if r["paper_holds"]],
             "fails_at": [r["radius"] for r in judged if not r["paper_holds"]]}
    engines = tracker.engines(t0, paper)
    cal = tracker.calibration
    used = cal if source == CALIBRATION else observed.to_dict()
    return json_safe({
        "index": entry.name, "bits": entry.bits, "t0_ns": t0, "t0_source": source,
        "t0_estimator": (cal["estimator"] if source == CALIBRATION else RADIUS_FIT)
        if t0 is not None else None,
        "t0_ci_ns": used["ci_ns"] if t0 is not None else None,
        "t0_samples": tracker.samples, "queries": tracker.queries,
        "calibration": cal, "estimates": estimates, "extended_model": ext, "radii": rows,
        "engines": engines,
        "verdicts": {
            "t0_agreement": agreement(estimates),
            "paper_model": {
                "rule": f"holds at R when 1/{HOLDS_FACTOR:g} <= t0 sum_(i<=R) C(Q, i) / "
                        f"T(R)_p50 <= {HOLDS_FACTOR:g} (t0: {RADIUS_FIT}, {source}); judged "
                        "on range queries that ran single-table probing only",
                **paper},
            "engines": engines["verdicts"] if engines else None},
    })


@router.get("/{name}/cost-model", response_model=CostModelOut, dependencies=[ReadAuth])
def get_cost_model(entry: EntryDep) -> dict:
    """Every t0 estimate, named by its estimator and source (``radius_fit``: least squares
    through the origin of per-radius lookup_ns on probes; ``microbenchmark``; the query
    model's per-probe term), the per-query extended model (fixed, per probe, per item, per
    candidate; unidentified terms reported and left out), and per radius over every search
    since the server started: measured T(r) and cumulative T(R) (p50, p90, p99), t0 C(Q, r) and
    its cumulative sum, T(R)/T(0) beside sum_{i<=R} C(Q, i), mean empty buckets, queries and
    empty_ball_queries (queries whose ball up to R held no item); those per-radius rows and the
    paper's verdict cover only range queries that ran single-table probing. ``engines``: the
    cost model of what ran (index.costmodel.engines): each engine's own model (a line per
    term with the counter it multiplies) and, per query class and radius, the engine or plan
    that ran with its share, the counters, modeled and measured cost, their ratio, the
    paper's t0 x sum C(Q, i) beside it, a legend of every column, and the verdict per model."""
    return cost_model_out(entry)


@router.post("/{name}/cost-model/calibrate", response_model=CostModelOut,
             dependencies=[WriteAuth])
def post_calibrate(entry: EntryDep, body: CalibrateIn, settings: SettingsDep) -> dict:
    """Run sampled queries (half codes of the index, half uniform random codes) at every radius
    0..``max_distance``, time the probes of the single table apart (micro-benchmark), and refit
    every estimate from them (:func:`bucketsearch.index.costmodel.fit_all`)."""
    require_in_process(entry, "calibrate")
    radius = min(2, entry.bits) if body.max_distance is None else body.max_distance
    entry.live.check_radius(radius)
    check_calibration(entry.live, body.queries, radius, settings)
    calibrate(entry.live, entry.cost, body.queries, radius, body.seed)
    return cost_model_out(entry)
