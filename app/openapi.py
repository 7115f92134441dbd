"""OpenAPI tweaks."""
from __future__ import annotations

from fastapi import FastAPI

from app.deps import require_read, require_write


def document_auth_only_when_enabled(app: FastAPI, routers) -> None:
    """Keep the bearer scheme in /openapi.json only on the endpoints that really check a key
    with the current settings (writes when api_key is set, reads when read_key is set)."""
    base = app.openapi

    def openapi():
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = base()
        settings = app.state.settings
        kind = {}  # (path, method) -> "write" | "read", from the route's auth dependency
        for route in (r for router in routers for r in router.routes):
            deps = {d.dependency for d in getattr(route, "dependencies", [])}
            for method in getattr(route, "methods", ()) or ():
                if require_write in deps:
                    kind[(route.path, method.lower())] = "write"
                elif require_read in deps:
                    kind[(route.path, method.lower())] = "read"
        for path, path_item in spec.get("paths", {}).items():
            for method, op in path_item.items():
                needed = kind.get((path, method))
                enabled = (needed == "write" and settings.api_key is not None) or (
                    needed == "read" and settings.read_key is not None)
                if not enabled:
                    op.pop("security", None)
        if settings.api_key is None and settings.read_key is None:
            spec.get("components", {}).get("securitySchemes", {}).pop("HTTPBearer", None)
        app.openapi_schema = spec
        return spec

    app.openapi = openapi
