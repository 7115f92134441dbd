"""Exception handlers: engine and registry errors become 4xx JSON ``{"detail": ...}``."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from bucketsearch.app.registry import IndexExists, IndexLimit, IndexNotFound, IndexUnavailable
from bucketsearch.index.live import DuplicateIdError
from bucketsearch.index.wal import AppendFailed, LogFailed
from bucketsearch.index.probe import ProbeLimitError


def _json(status: int, detail, headers: dict | None = None, **extra) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(ProbeLimitError)
    async def probe_limit(request: Request, exc: ProbeLimitError):
        return _json(400, str(exc), probes=int(exc.probes), limit=int(exc.limit),
                     radius=None if exc.radius is None else int(exc.radius),
                     hint="use mode 'mih' or 'auto', or a smaller radius")

    @app.exception_handler(DuplicateIdError)
    async def duplicate(request: Request, exc: DuplicateIdError):
        return _json(409, str(exc))

    @app.exception_handler(IndexExists)
    async def exists(request: Request, exc: IndexExists):
        return _json(409, str(exc))

    @app.exception_handler(IndexLimit)
    async def too_many(request: Request, exc: IndexLimit):
        return _json(409, str(exc))

    @app.exception_handler(IndexUnavailable)
    async def unavailable(request: Request, exc: IndexUnavailable):
        return _json(503, str(exc), headers={"Retry-After": "30"})

    @app.exception_handler(AppendFailed)
    @app.exception_handler(LogFailed)
    async def log_refused(request: Request, exc: OSError):
        return _json(503, exc.strerror or str(exc), headers={"Retry-After": "5"})

    @app.exception_handler(IndexNotFound)
    async def not_found(request: Request, exc: IndexNotFound):
        return _json(404, str(exc))

    @app.exception_handler(PermissionError)
    async def read_only(request: Request, exc: PermissionError):
        return _json(409, str(exc))

    @app.exception_handler(OSError)
    async def storage_failed(request: Request, exc: OSError):
        # PermissionError (read-only worker) is handled above; anything else is the disk
        return _json(503, f"storage error, nothing was acknowledged: {exc.strerror or exc}")

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError):
        return _json(400, str(exc))
