"""The FastAPI application: ``uvicorn bucketsearch.app.main:create_app --factory``."""
from __future__ import annotations

import threading
from contextlib import asynccontextmanager
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import (get_redoc_html, get_swagger_ui_html,
                                  get_swagger_ui_oauth2_redirect_html)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from bucketsearch import __version__
from bucketsearch.app import errors
from bucketsearch.app.deps import declared_permission
from bucketsearch.app.guard import AccessPolicy, Guard
from bucketsearch.app.jobs import JobManager
from bucketsearch.app.metrics import AppMetrics, RequestMetricsMiddleware
from bucketsearch.app.openapi import document_guard
from bucketsearch.index.cluster.raysession import stop_ray
from bucketsearch.app.registry import Registry
from bucketsearch.app.routers import (advise, audit, costmodel, dashboard, evaluate, health,
                                      indexes, jobs, sample, search, ui)
from bucketsearch.app.settings import Settings, warn_unknown_env
from bucketsearch.app.startup import start_up

DESCRIPTION = """Hamming-space bucket search over binary codes, with per-query, per-radius work
counters (probes, empty buckets, items, measured and modeled lookup time).

Hex codes are big-endian in np.packbits order: the first hex digit holds bits 0-3. Writes are
acknowledged only after their write-ahead-log record is fsynced.

Auth: when BUCKETSEARCH_API_KEY (the write key) is set, writes need
`Authorization: Bearer <key>`; when BUCKETSEARCH_READ_KEY is set, reads need the read key or
the write key; with the read key alone nobody may write. The key is checked before the body is
read. Every operation answers 413 for a body above BUCKETSEARCH_MAX_BODY_BYTES, 408 for a body
slower than BUCKETSEARCH_BODY_TIMEOUT_S and 503 (Retry-After) beyond
BUCKETSEARCH_MAX_CONCURRENT_REQUESTS requests in flight."""


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.ready = False
    app.state.startup_detail = "starting"
    app.state.registry = Registry(app.state.settings)
    app.state.jobs = JobManager(app.state.settings)
    loader = threading.Thread(target=start_up, args=(app,), name="bucketsearch-startup",
                              daemon=True)
    loader.start()
    await run_in_threadpool(lambda: None)  # anyio's thread-pool backend loads now, not in a request
    try:
        yield
    finally:
        app.state.ready = False
        await run_in_threadpool(loader.join)
        await run_in_threadpool(app.state.metrics.close)  # a worker's last figures
        await run_in_threadpool(app.state.jobs.close)  # running jobs stop at a checkpoint
        try:
            await run_in_threadpool(app.state.registry.close)
        finally:  # serve --shards: Ray's processes end with the server
            await run_in_threadpool(stop_ray)


ROUTERS = (health.router, indexes.router, search.router, costmodel.router, evaluate.router,
           sample.router, dashboard.router, ui.router, advise.router, audit.router,
           jobs.router)


def access_policy(app: FastAPI) -> AccessPolicy:
    """Who may call what: from the routes' ReadAuth/WriteAuth declarations (app.guard)."""
    return AccessPolicy(app.routes, declared_permission)


#: Swagger UI and ReDoc assets, served from the fastapi-offline package (no CDN: /docs works
#: on a machine without internet access). app.guard opens this prefix like /docs itself.
DOCS_ASSETS_URL = "/docs/assets"
DOCS_ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"


def add_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc with locally served assets (FastAPI's recipe "Custom
    Docs UI Static Assets"); the app is created with ``docs_url=None, redoc_url=None``."""
    app.mount(DOCS_ASSETS_URL, StaticFiles(directory=DOCS_ASSETS_DIR), name="docs-assets")
    oauth2_redirect = app.swagger_ui_oauth2_redirect_url

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{oauth2_redirect}",
            swagger_js_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters)

    @app.get(oauth2_redirect, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png", with_google_fonts=False)


def create_app(settings: Settings | None = None) -> FastAPI:
    app = FastAPI(title="bucketsearch", version=__version__, description=DESCRIPTION,
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings or Settings()
    warn_unknown_env()
    app.state.metrics = AppMetrics(app)
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    add_docs(app)
    document_guard(app, access_policy)
    # Starlette builds the middleware stack (so the guard's policy) at the first request, after
    # every route is included; the guard is inside the metrics so that its answers are counted
    # innermost first: the search fast path runs after the guard's checks
    # (bucketsearch.app.routers.search)
    app.add_middleware(search.SearchFastPath, app_state=app.state, routes=app.routes)
    app.add_middleware(Guard, app_state=app.state, make_policy=lambda: access_policy(app))
    app.add_middleware(RequestMetricsMiddleware)
    return app
