"""Dependencies: settings, registry, the index named in the path, and API-key checks.

They are ``async def`` on purpose: each does a few attribute reads and no blocking work, and
FastAPI would run a plain ``def`` dependency through the thread pool (one thread hop each,
~0.1-0.5 ms under load). The CPU work stays in the plain ``def`` endpoints."""
from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from app.registry import Entry, Registry
from app.schemas import NAME_PATTERN
from app.settings import Settings

bearer = HTTPBearer(auto_error=False, description="API key: 'Authorization: Bearer <key>'")


def settings_of(request: Request) -> Settings:
    return request.app.state.settings


def registry_of(request: Request) -> Registry:
    """The registry, or 503 while the server is still starting."""
    state = request.app.state
    if not getattr(state, "ready", False):
        raise HTTPException(503, f"not ready: {getattr(state, 'startup_detail', None)} "
                                 "(poll /readyz)", headers={"Retry-After": "1"})
    return state.registry


# each dependency below reads the request itself rather than depending on the others: every
# sub-dependency costs FastAPI tens of microseconds per request
async def get_settings(request: Request) -> Settings:
    return settings_of(request)


async def get_registry(request: Request) -> Registry:
    return registry_of(request)


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
IndexName = Annotated[str, Path(pattern=NAME_PATTERN, description="index name")]


def _check_key(creds: HTTPAuthorizationCredentials | None, keys: list[SecretStr]) -> None:
    if creds is None or not creds.credentials:
        raise HTTPException(401, "missing 'Authorization: Bearer <key>' header",
                            headers={"WWW-Authenticate": "Bearer"})
    given = creds.credentials.encode()
    ok = False
    for key in keys:  # compare with every key, constant time each
        ok |= hmac.compare_digest(given, key.get_secret_value().encode())
    if not ok:
        raise HTTPException(403, "invalid API key")


async def require_write(request: Request, creds: Credentials) -> None:
    settings = settings_of(request)
    if settings.api_key is not None:
        _check_key(creds, [settings.api_key])


async def require_read(request: Request, creds: Credentials) -> None:
    settings = settings_of(request)
    if settings.read_key is not None:
        keys = [settings.read_key] + ([settings.api_key] if settings.api_key else [])
        _check_key(creds, keys)


async def get_entry(name: IndexName, request: Request) -> Entry:
    return registry_of(request).get(name)


WriteAuth = Depends(require_write)
ReadAuth = Depends(require_read)
EntryDep = Annotated[Entry, Depends(get_entry)]


async def raw_body(request: Request) -> bytes:
    """The request body as bytes (read in the event loop, handed to a plain ``def`` endpoint)."""
    return await request.body()


BodyBytes = Annotated[bytes, Depends(raw_body)]
