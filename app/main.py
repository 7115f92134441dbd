"""The FastAPI application: ``uvicorn app.main:create_app --factory``."""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from app import errors
from app.costfit import calibrate
from app.metrics import AppMetrics, BodyLimitMiddleware, RequestMetricsMiddleware
from app.registry import Registry
from app.routers import costmodel, evaluate, health, indexes, search
from app.settings import Settings

log = logging.getLogger("bucketsearch.app")

DESCRIPTION = """Hamming-space bucket search over binary codes, with per-query, per-radius work
counters (probes, empty buckets, items, measured and modeled lookup time).

Hex codes are big-endian in np.packbits order: the first hex digit holds bits 0-3. Writes are
acknowledged only after their write-ahead-log record is fsynced. When BUCKETSEARCH_API_KEY is
set, mutating endpoints need `Authorization: Bearer <key>`; reads too when
BUCKETSEARCH_READ_KEY is set."""


def warm_up(registry: Registry, settings: Settings) -> None:
    """Compile every search kernel (tiny indexes), touch every loaded index, calibrate t0."""
    from index.probe import HammingIndex
    from index.scan import LinearScan

    codes = np.array([[0], [1], [3]], dtype=np.uint64)
    for cls in (HammingIndex, LinearScan):
        idx = cls(64)
        idx.add(codes, ids=np.arange(3))
        for stats in (False, True):
            idx.range_search(codes, 1, stats=stats)
            idx.search(codes, 1, stats=stats)
    for entry in list(registry.entries.values()):
        state = entry.live.state
        if state.main.ntotal:
            q = np.asarray(state.main.words[:1])
            entry.live.range_search(q, 0, stats=True)
            entry.live.search(q, 1, stats=True)
        if settings.calibration_queries:
            radius = min(settings.calibration_radius, entry.bits)
            if state.main.probe_count(radius) <= state.main.max_probes:
                calibrate(entry.live, entry.cost, settings.calibration_queries, radius)


@asynccontextmanager
async def lifespan(app: FastAPI):
    settings: Settings = app.state.settings
    app.state.ready = False
    app.state.startup_detail = "loading indexes"
    registry = Registry(settings)
    app.state.registry = registry
    await run_in_threadpool(registry.load_all)
    if settings.warmup:
        app.state.startup_detail = "compiling and warming up search kernels"
        await run_in_threadpool(warm_up, registry, settings)
    app.state.ready = True
    app.state.startup_detail = None
    try:
        yield
    finally:
        app.state.ready = False
        await run_in_threadpool(registry.close)


def create_app(settings: Settings | None = None) -> FastAPI:
    app = FastAPI(title="bucketsearch", version="0.1.0", description=DESCRIPTION,
                  lifespan=lifespan)
    app.state.settings = settings or Settings()
    app.state.metrics = AppMetrics(app)
    errors.install(app)
    for router in (health.router, indexes.router, search.router, costmodel.router,
                   evaluate.router):
        app.include_router(router)
    app.add_middleware(BodyLimitMiddleware,
                       limit_getter=lambda scope: app.state.settings.max_body_bytes)
    app.add_middleware(RequestMetricsMiddleware)
    return app
