"""Liveness, readiness and the Prometheus endpoint."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.schemas import Health, error_responses

router = APIRouter(tags=["health"], responses=error_responses(413))


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up (says nothing about the indexes)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(request: Request):
    """200 once every index is loaded and every search path compiled by a warm-up query."""
    state = request.app.state
    if not getattr(state, "ready", False):
        return JSONResponse(Health(status="starting",
                                   detail=getattr(state, "startup_detail", None)).model_dump(),
                            status_code=503)
    return Health(status="ready", indexes=len(state.registry.entries))


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}}})
def metrics(request: Request) -> Response:
    """Prometheus exposition: request counts/latency and per-index, per-radius search figures."""
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)
