"""OpenAPI tweaks: the bearer scheme, and the guard's answers, documented as the current
settings enforce them; FastAPI's 422 documented as the 400 that app.errors answers."""
from __future__ import annotations

from fastapi import FastAPI

from bucketsearch.app.guard import OPEN, READ, UNCAPPED_PATHS, WRITE, AccessPolicy

SCHEME = "HTTPBearer"
HTTP_METHODS = {"get", "head", "post", "put", "patch", "delete", "options"}
GUARD_RESPONSES = {
    401: "missing API key (sent before the body is read)",
    403: "wrong API key, or a key that does not open this operation",
    408: "the request body did not arrive within body_timeout_s",
    413: "body or batch too large",
    503: "too many requests in flight (Retry-After), or starting: see /readyz",
}

#: FastAPI documents a 422 for request validation; app.errors answers those with 400.
INVALID_VALUE = ("invalid value: `detail` names the field, the value and what is allowed; "
                 "`errors` lists them when the request failed schema validation")


def needs_key(permission: str, settings) -> bool:
    """Whether a request with this permission must carry a key under these settings."""
    if permission == WRITE:
        return settings.api_key is not None or settings.read_key is not None
    return permission == READ and settings.read_key is not None


def document_guard(app: FastAPI, policy_of) -> None:
    """Post-process /openapi.json: the bearer security requirement on exactly the operations
    that need a key with the current settings (``policy_of(app)`` is the guard's
    AccessPolicy), and the guard's 401/403/408/413/503 answers where they can happen."""
    base = app.openapi

    def openapi():
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = base()
        settings = app.state.settings
        policy: AccessPolicy = policy_of(app)
        components = spec.setdefault("components", {})
        error = ({"$ref": "#/components/schemas/ErrorOut"}
                 if "ErrorOut" in components.get("schemas", {}) else {"type": "object"})
        any_key = False
        for path, path_item in spec.get("paths", {}).items():
            for method, op in path_item.items():
                if method not in HTTP_METHODS:
                    continue
                permission = policy.permission(method.upper(), path)
                codes = [413]
                if "requestBody" in op:
                    codes.append(408)
                if path not in UNCAPPED_PATHS:
                    codes.append(503)
                if needs_key(permission, settings):
                    op["security"] = [{SCHEME: []}]
                    codes += [401, 403]
                    any_key = True
                else:
                    op.pop("security", None)
                responses = op.setdefault("responses", {})
                if responses.pop("422", None) is not None:  # app.errors answers 400 instead
                    responses.setdefault("400", {
                        "description": INVALID_VALUE,
                        "content": {"application/json": {"schema": error}}})
                for code in codes:
                    responses.setdefault(str(code), {
                        "description": GUARD_RESPONSES[code],
                        "content": {"application/json": {"schema": error}}})
                if permission != OPEN:
                    op.setdefault("x-permission", permission)
        for unused in ("HTTPValidationError", "ValidationError"):  # only the 422s used them
            components.get("schemas", {}).pop(unused, None)
        schemes = components.setdefault("securitySchemes", {})
        if any_key:
            schemes[SCHEME] = {"type": "http", "scheme": "bearer", "description":
                               "API key: 'Authorization: Bearer <key>' (the read key opens "
                               "reads, the write key (BUCKETSEARCH_API_KEY) reads and writes)"}
        else:
            schemes.pop(SCHEME, None)
        if not schemes:
            components.pop("securitySchemes")
        app.openapi_schema = spec
        return spec

    app.openapi = openapi
