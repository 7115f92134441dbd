"""Exception handlers: every 4xx is JSON ``{"detail": "<message>"}``, ``detail`` always a string.

One status per kind of error, whichever layer caught it (issue 18 item 8):

* **400** a value of the request is invalid: out of range, wrong hex length, non-hex, k=0,
  k above max_k, a malformed JSON body... Raised by our code as ``ValueError`` (the message
  names the field, the value and what is allowed) or by FastAPI/pydantic as
  ``RequestValidationError``; the latter also carries ``errors``, the per-field list
  ``[{"loc": [...], "msg": ..., "type": ...}]``, and its ``detail`` joins them into one string.
* 404 unknown index, 409 conflict, 413 too large, 415 Content-Type, 503 unavailable (as before).
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette._utils import get_route_path
from starlette.exceptions import HTTPException as StarletteHTTPException

from bucketsearch.app.guard import flat_routes
from bucketsearch.app.jobs import JobConflict, JobNotFound
from bucketsearch.app.registry import IndexExists, IndexLimit, IndexNotFound, SnapshotNotFound
from bucketsearch.index.handle import (AppendFailed, DuplicateIdError, IndexUnavailable,
                                       LogFailed, NotServed, ProbeLimitError)


def _json(status: int, detail, headers: dict | None = None, **extra) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status, headers=headers)


#: The status of every invalid value, whether our code or FastAPI's validation caught it.
INVALID_STATUS = 400
_LOC_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})
_MAX_INPUT_REPR = 60


def field_name(loc) -> str:
    """``("body", "codes", 0)`` -> ``"codes[0]"``; ``("query", "k")`` -> ``"k"``; ``("body",)``
    -> ``"body"`` (the field names the messages of our own code use)."""
    parts = list(loc)
    if len(parts) > 1 and parts[0] in _LOC_SOURCES:
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "request"


def _short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_INPUT_REPR else text[:_MAX_INPUT_REPR - 3] + "..."


def validation_errors(errors) -> tuple[str, list[dict]]:
    """``(detail, errors)`` of a RequestValidationError: one string naming each field, its
    value and what is allowed, and the list of ``{"loc", "msg", "type"}``."""
    items, messages = [], []
    for err in errors:
        loc = [p if isinstance(p, (int, str)) else str(p) for p in err.get("loc", ())]
        msg = str(err.get("msg", "invalid value"))
        if err.get("type") == "json_invalid" and len(loc) == 2 and isinstance(loc[1], int):
            # FastAPI's own JSON parse: loc is ("body", character offset), not a field
            reason = (err.get("ctx") or {}).get("error")
            msg = f"{msg} at character {loc[1]}" + (f" ({reason})" if reason else "") + \
                "; the body must be a JSON object"
            loc = loc[:1]
        items.append({"loc": loc, "msg": msg, "type": str(err.get("type", "value_error"))})
        text = f"{field_name(loc)}: {msg}"
        if "input" in err and err.get("type") not in ("missing", "json_invalid"):
            text += f" (got {_short_repr(err['input'])})"
        messages.append(text)
    return "; ".join(messages) or "invalid request", items


def deleted_meanwhile(request: Request) -> JSONResponse | None:
    """404 when the index the request works on (``request.state.entry``, set by
    bucketsearch.app.deps.get_entry) was deleted while the request ran: its folder was renamed
    away under it (bucketsearch.app.registry.Registry.delete), which is no storage fault (503)
    and no conflict to retry (409). None otherwise."""
    entry = getattr(request.state, "entry", None)
    if entry is None or entry.folder.exists():
        return None
    return _json(404, f"index {entry.name!r} was deleted while this request ran; nothing was "
                      "acknowledged")


def allowed_methods(app, path: str) -> str:
    """The ``Allow`` value of ``path``: every method of every route whose path matches it
    (Starlette's 405 names only the methods of the first route that matched the path)."""
    methods: set[str] = set()
    for route in flat_routes(app.routes):
        regex, verbs = getattr(route, "path_regex", None), getattr(route, "methods", None)
        if regex is not None and verbs and regex.match(path):
            methods |= set(verbs)
    return ", ".join(sorted(methods))


def install(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 405:  # RFC 9110 15.5.6: Allow lists the path's methods, all
            exc.headers = {**(exc.headers or {}),
                           "Allow": allowed_methods(request.app, get_route_path(request.scope))}
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        detail, items = validation_errors(exc.errors())
        return _json(INVALID_STATUS, detail, errors=items)

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
    @app.exception_handler(NotServed)
    @app.exception_handler(JobConflict)
    async def too_many(request: Request, exc: LookupError):
        return _json(409, str(exc))

    @app.exception_handler(IndexUnavailable)
    async def unavailable(request: Request, exc: IndexUnavailable):
        return _json(503, str(exc), headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(AppendFailed)
    @app.exception_handler(LogFailed)
    async def log_refused(request: Request, exc: OSError):
        return deleted_meanwhile(request) or \
            _json(503, exc.strerror or str(exc), headers={"Retry-After": "5"})

    @app.exception_handler(IndexNotFound)
    @app.exception_handler(SnapshotNotFound)
    @app.exception_handler(JobNotFound)
    async def not_found(request: Request, exc: LookupError):
        return _json(404, str(exc))

    @app.exception_handler(PermissionError)
    async def read_only(request: Request, exc: PermissionError):
        return deleted_meanwhile(request) or _json(409, str(exc))

    @app.exception_handler(OSError)
    async def storage_failed(request: Request, exc: OSError):
        # PermissionError (read-only worker) is handled above; anything else is the disk
        return deleted_meanwhile(request) or \
            _json(503, f"storage error, nothing was acknowledged: {exc.strerror or exc}")

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError):
        return _json(INVALID_STATUS, str(exc))
