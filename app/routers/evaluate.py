"""Evaluation of query codes against the index's items with the metrics toolkit (the work is
in app/evaluation.py)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from bucketsearch.app.deps import EntryDep, ReadAuth, SettingsDep
from bucketsearch.app.registry import require_in_process
from bucketsearch.app.evaluation import evaluate_entry
from bucketsearch.app.schemas import EvaluateIn

router = APIRouter(prefix="/v1/indexes", tags=["evaluate"])


@router.post("/{name}/evaluate", response_model=dict[str, Any], dependencies=[ReadAuth])
def evaluate(entry: EntryDep, body: EvaluateIn, settings: SettingsDep) -> dict:
    """Every metric of the evaluation toolkit (index.metrics.evaluate) for the query codes
    against the index's items: precision/recall/F1 per radius, RAMAP with the modeled cost
    ``c(r) = sum_{i<=r} C(Q, i)`` and (``radius.ramap_measured``) with the per-radius lookup
    time measured on this index, ranking metrics, empty-ball statistics.

    Relevance: ``query_labels`` + ``db_ids`` + ``db_labels``, or ``relevant_ids`` per query.
    """
    require_in_process(entry, "evaluate")
    nq = len(body.codes)
    if nq > settings.max_batch:
        raise HTTPException(413, f"codes: {nq} queries exceed max_batch={settings.max_batch}")
    return evaluate_entry(entry, settings, body)
