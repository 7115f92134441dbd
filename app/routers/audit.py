"""The exactness audit's report (the sampler and checker are app/audit.py)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from bucketsearch.app.deps import ReadAuth, registry_of
from bucketsearch.app.schemas import error_responses

router = APIRouter(prefix="/v1", tags=["audit"], responses=error_responses(401, 403, 503))


@router.get("/audit", response_model=dict[str, Any], dependencies=[ReadAuth])
def audit_report(request: Request) -> dict:
    """The exactness audit of this server process: a share ``rate`` of the answered searches
    (one in every block of ``period``, at a random position; a fault in every answer is
    sampled within ``sampling_bound`` searches) is re-checked against a linear scan of the
    state the request read, off the request path. Counters (``sampled``, ``checked``,
    ``mismatched``, ``dropped`` when the queue was full, ``errors``) and the last mismatches,
    newest first, each with its query, the served and the expected answer (first 50 ids),
    the ids missing and extra. The same counters are on /metrics (``bucketsearch_audit_*``).
    """
    return registry_of(request).audit.report()
