"""Dependencies: settings, registry, the index named in the path, and the auth declarations.

``ReadAuth`` / ``WriteAuth`` declare what a route needs; ``bucketsearch.app.guard.Guard`` enforces
it before
the body is read (FastAPI parses a pydantic body before it resolves dependencies, so a check
here alone would answer 400 before 401). The dependencies check again only when the guard did
not run, or enforced less than the route declares (an app built without the guard).

They are ``async def`` on purpose: each does a few attribute reads and no blocking work, and
FastAPI would run a plain ``def`` dependency through the thread pool (one thread hop each,
~0.1-0.5 ms under load). The CPU work stays in the plain ``def`` endpoints."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request

from bucketsearch.app import guard
from bucketsearch.app.redact import redact
from bucketsearch.app.registry import Entry, Registry
from bucketsearch.app.schemas import NAME_PATTERN
from bucketsearch.app.settings import Settings


def settings_of(request: Request) -> Settings:
    return request.app.state.settings


def registry_of(request: Request) -> Registry:
    """The registry, or 503 while the server is still starting."""
    state = request.app.state
    if not getattr(state, "ready", False):
        detail = redact(getattr(state, "startup_detail", None), state.settings)
        raise HTTPException(503, f"not ready: {detail} (poll /readyz)",
                            headers={"Retry-After": "1"})
    return state.registry


# each dependency below reads the request itself rather than depending on the others: every
# sub-dependency costs FastAPI tens of microseconds per request
async def get_settings(request: Request) -> Settings:
    return settings_of(request)


async def get_registry(request: Request) -> Registry:
    return registry_of(request)


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
IndexName = Annotated[str, Path(pattern=NAME_PATTERN, description="index name")]


def _enforce(request: Request, permission: str) -> None:
    """The guard's check, unless the guard already enforced at least ``permission``."""
    done = request.scope.get(guard.SCOPE_KEY)
    if done is not None and guard.RANK[done] >= guard.RANK[permission]:
        return
    settings = settings_of(request)
    denial = guard.authorize(permission, guard.Keys.of(settings),
                             request.headers.get("authorization"))
    if denial is not None:
        raise HTTPException(denial.status, denial.detail,
                            headers={k.decode(): v.decode() for k, v in denial.headers})


async def require_write(request: Request) -> None:
    _enforce(request, guard.WRITE)


async def require_read(request: Request) -> None:
    _enforce(request, guard.READ)


#: The permission each auth dependency declares (read by app.guard.AccessPolicy).
DECLARED = {require_write: guard.WRITE, require_read: guard.READ}


def declared_permission(route) -> str | None:
    """``"read"`` / ``"write"`` if the route depends (at any depth) on ReadAuth / WriteAuth,
    the stricter if both; None if on neither or not a FastAPI route."""
    found, todo = [], [getattr(route, "dependant", None)]
    while todo:
        dependant = todo.pop()
        if dependant is None:
            continue
        found += [perm for call, perm in DECLARED.items() if dependant.call is call]
        todo.extend(dependant.dependencies)
    return max(found, key=guard.RANK.__getitem__) if found else None


async def get_entry(name: IndexName, request: Request) -> Entry:
    """The index named in the path, also kept as ``request.state.entry`` (the error handlers
    tell a write cut short by a concurrent DELETE from a storage fault: app/errors.py)."""
    entry = registry_of(request).get(name)
    request.state.entry = entry
    return entry


WriteAuth = Depends(require_write)
ReadAuth = Depends(require_read)
EntryDep = Annotated[Entry, Depends(get_entry)]


async def raw_body(request: Request) -> bytes:
    """The request body as bytes (read in the event loop, handed to a plain ``def`` endpoint)."""
    return await request.body()


BodyBytes = Annotated[bytes, Depends(raw_body)]
