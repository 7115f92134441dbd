"""The FastAPI application: ``uvicorn app.main:create_app --factory``."""
from __future__ import annotations

import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from app import errors
from app.metrics import AppMetrics, BodyLimitMiddleware, RequestMetricsMiddleware
from app.openapi import document_auth_only_when_enabled
from app.registry import Registry
from app.routers import costmodel, evaluate, health, indexes, search
from app.settings import Settings
from app.startup import start_up

DESCRIPTION = """Hamming-space bucket search over binary codes, with per-query, per-radius work
counters (probes, empty buckets, items, measured and modeled lookup time).

Hex codes are big-endian in np.packbits order: the first hex digit holds bits 0-3. Writes are
acknowledged only after their write-ahead-log record is fsynced. When BUCKETSEARCH_API_KEY is
set, mutating endpoints need `Authorization: Bearer <key>`; reads too when
BUCKETSEARCH_READ_KEY is set."""


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.ready = False
    app.state.startup_detail = "starting"
    app.state.registry = Registry(app.state.settings)
    loader = threading.Thread(target=start_up, args=(app,), name="bucketsearch-startup",
                              daemon=True)
    loader.start()
    try:
        yield
    finally:
        app.state.ready = False
        await run_in_threadpool(loader.join)
        await run_in_threadpool(app.state.registry.close)


ROUTERS = (health.router, indexes.router, search.router, costmodel.router, evaluate.router)


def create_app(settings: Settings | None = None) -> FastAPI:
    app = FastAPI(title="bucketsearch", version="0.1.0", description=DESCRIPTION,
                  lifespan=lifespan)
    app.state.settings = settings or Settings()
    app.state.metrics = AppMetrics(app)
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    document_auth_only_when_enabled(app, ROUTERS)
    app.add_middleware(BodyLimitMiddleware,
                       limit_getter=lambda scope: app.state.settings.max_body_bytes)
    app.add_middleware(RequestMetricsMiddleware)
    return app
