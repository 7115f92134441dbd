"""Liveness, readiness, the request limits and the Prometheus endpoint."""
from __future__ import annotations

from collections import Counter

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bucketsearch.app.deps import ReadAuth, SettingsDep
from bucketsearch.app.schemas import Health, Limits

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up (says nothing about the indexes)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(request: Request):
    """200 once the indexes are loaded and every search path is compiled (warm-up). An index
    that failed to load does not hold the others back: ``index_states`` lists each index's
    state (ready, read_only, corrupt, unavailable) and reason (with a read key configured,
    only ``state_counts``: this route is open, index names are not). ``merges_pending`` counts
    the indexes whose merge is pending or running (each one's ``merge`` in ``index_states``):
    still ready and serving, exact, but slower until the merge ends."""
    state = request.app.state
    if not getattr(state, "ready", False):
        detail = getattr(state, "startup_detail", None)
        registry = getattr(state, "registry", None)
        if detail and registry is not None:
            detail = registry.redact(detail)
        return JSONResponse(Health(status="starting", detail=detail).model_dump(),
                            status_code=503)
    registry = state.registry
    states = registry.states()
    pending = sum(s.get("merge") in ("pending", "running") for s in states.values())
    if state.settings.read_key is not None:  # an open route: with a read key, no index names
        return Health(status="ready", indexes=len(registry.entries),
                      state_counts=dict(Counter(s["state"] for s in states.values())),
                      merges_pending=pending)
    return Health(status="ready", indexes=len(registry.entries), index_states=states,
                  merges_pending=pending)


@router.get("/v1/limits", response_model=Limits, dependencies=[ReadAuth])
def limits(settings: SettingsDep) -> dict:
    """The limits a request must keep to (a client splits its batches under them)."""
    return {name: getattr(settings, name) for name in Limits.model_fields}


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}}})
def metrics(request: Request) -> Response:
    """Prometheus exposition: request counts/latency and per-index, per-radius search figures."""
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)
