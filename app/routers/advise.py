"""The radius advisor (the work is in app/advise.py and index/evaluation/advisor.py)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from bucketsearch.app.advise import advise_entry
from bucketsearch.app.deps import EntryDep, ReadAuth, SettingsDep
from bucketsearch.app.registry import require_in_process
from bucketsearch.app.schemas import AdviseIn, error_responses

router = APIRouter(prefix="/v1/indexes", tags=["advise"],
                   responses=error_responses(400, 401, 403, 404, 409, 413, 503))


@router.post("/{name}/advise", response_model=dict[str, Any], dependencies=[ReadAuth])
def advise(entry: EntryDep, body: AdviseIn, settings: SettingsDep) -> dict:
    """Which radius to use: for radii 0..radius_max, from a sample of the index's own items
    (or the queries sent), the answers per query (mean, p50/p90/p99), the share of empty
    balls, the modeled and measured cost per query of the mode that runs, and, given
    relevance (labels, or pairs marked duplicate / not duplicate), precision / recall / F1 /
    RAMAP per radius (``bucketsearch eval``'s formulas) with 95% bootstrap intervals, mAP;
    a recommended radius with its reason (``recommendation.rule`` states the rule) and the
    quality-vs-cost frontier (``pareto`` per radius).

    Limits (400 naming them): ``advise_max_queries``, ``advise_max_radius``,
    ``max_evaluate_pairs`` (queries x items); a radius over the probe guard,
    ``max_request_probes`` or ``max_results`` is reported unmeasured with the reason. 409 on a
    sharded index."""
    require_in_process(entry, "advise")
    return advise_entry(entry, settings, body)
