"""OpenAPI tweaks: the bearer scheme and every operation's error answers, documented as the
current settings enforce them (one mechanism for all routes: :func:`error_codes`); FastAPI's
422 documented as the 400 that app.errors answers; integer bounds exact; the rules a JSON
schema cannot state listed (:data:`SCHEMA_CANNOT_STATE`)."""
from __future__ import annotations

from fastapi import FastAPI

from bucketsearch.app.guard import OPEN, READ, UNCAPPED_PATHS, WRITE, AccessPolicy
from bucketsearch.app.schemas import EXACT_BOUNDS, ErrorOut

SCHEME = "HTTPBearer"
HTTP_METHODS = {"get", "head", "post", "put", "patch", "delete", "options"}
#: The rules a JSON schema cannot state: a schema-valid request is refused (400) by these
#: only, each ``(pattern of the answer's detail, the rule)``. They depend on the index the
#: request names (its bits), on bytes the schema calls binary, on the server's settings, or
#: tie one field to another in ways JSON Schema has no words for (tests/st_checks.py holds
#: schemathesis's positive-data check to exactly this list).
SCHEMA_CANNOT_STATE = (
    (r"has \d+ hex digits, a \d+-bit code needs exactly|is not a hex string|bits set above|"
     r"nonzero padding|last byte .* has nonzero",
     "a hex code has 2*ceil(bits/8) digits of the index's bits, padding bits 0"),
    (r"must be in \[0, bits=\d+\]", "a radius is at most the index's bits"),
    (r"substrings must be in \[", "substrings in [ceil(bits/64), bits] of the index's bits"),
    (r"^body: ", "a binary body (backup file, snapshot tar, packed codes) must parse"),
    (r"query parameters are only read with Content-Type application/octet-stream|"
     r"give the query parameter max_distance",
     "a search's query parameters go with an octet-stream body, which needs max_distance, k "
     "or both"),
    (r"substrings applies to mode", "substrings only with mode mih or auto"),
    (r"give the query parameter radius", "a dedup insert's octet-stream body needs the query "
     "parameter radius"),
    (r"max_reported: \d+ exceeds the limit max_k", "a dedup insert's max_reported at most "
     "max_k"),
    (r"parquet needs pyarrow", "a job result as parquet only on a server with pyarrow"),
    (r"give ids in the body or .*, not both|give first_id or auto_ids=true, not both|"
     r"ids: \d+ ids for \d+ codes|an upsert needs one id per code|overflows int64",
     "one id per code: ids in the body, or first_id / auto_ids, not both; an upsert names its "
     "ids"),
    (r"^(query_labels|db_labels|relevant_ids|db_ids)(\[\d+\])?: ",
     "evaluate: labels or relevant ids, one per query and per database item, of this index"),
    (r"^(sample|query_ids|codes|pairs(\[\d+\])?|holdout|radius_max): |advise_max_|"
     r"radius_inclusive must be true",
     "advise: the queries from one source (a sample, query_ids or codes) of this index's "
     "items, at most advise_max_queries of them, radius_max <= advise_max_radius; labels or "
     "duplicate pairs name its items and queries; radii are inclusive"),
    (r"queries x k=\d+ = .* results, more than|max_results|max_request_|max_probes|max_batch|"
     r"max_evaluate_pairs",
     "the server's limits (GET /v1/limits) on a whole request"),
)

#: FastAPI documents a 422 for request validation; app.errors answers those with 400.
INVALID_VALUE = ("invalid value: `detail` names the field, the value and what is allowed; "
                 "`errors` lists them when the request failed schema validation. Besides the "
                 "schema: " + "; ".join(rule for _, rule in SCHEMA_CANNOT_STATE))


#: The error answers every operation may give, by what it has (:func:`error_codes`): declared
#: here once for all routes, so a route declares only its success answers.
COMMON_RESPONSES = {
    400: INVALID_VALUE,
    401: "missing API key (sent before the body is read)",
    403: "wrong API key, or a key that does not open this operation",
    404: "unknown index (or snapshot)",
    408: "the request body did not arrive within body_timeout_s",
    409: "conflict: a duplicate id or name, a read-only server or index, or an operation a "
         "sharded index does not serve",
    413: "body or batch too large",
    415: "unsupported Content-Type",
    503: "too many requests in flight (Retry-After), starting (see /readyz), or the index is "
         "unavailable or corrupt (its state and reason: GET /v1/indexes)",
}


def error_codes(path: str, op: dict, permission: str, keyed: bool) -> list[int]:
    """The error statuses of one operation: 400 when it takes parameters or a body, 404 when
    its path names something, 408 and 415 when it reads a body, 409 when it writes or works
    on a named index, 401/403 when it needs a key (``keyed``), 503 outside the uncapped
    probes, 413 always (the guard's Content-Length check)."""
    codes = [413]
    if op.get("parameters") or "requestBody" in op:
        codes.append(400)
    if "{" in path:
        codes.append(404)
    if "requestBody" in op:
        codes += [408, 415]
    if permission == WRITE or "{name}" in path:
        codes.append(409)
    if keyed:
        codes += [401, 403]
    if path not in UNCAPPED_PATHS:
        codes.append(503)
    return sorted(codes)


def exact_bounds(node, exact: dict[float, int]) -> None:
    """Integer bounds as integers, in place: FastAPI's OpenAPI models keep ``minimum`` and
    ``maximum`` as floats, so 2^63 - 1 would read 2^63 (and a client generating ids up to the
    stated maximum would send one the server refuses). ``exact`` maps a float back to the
    integer it stands for (:data:`bucketsearch.app.schemas.EXACT_BOUNDS`); small ones are exact
    anyway."""
    if isinstance(node, dict):
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            value = node.get(key)
            if isinstance(value, float) and value.is_integer() and (
                    node.get("type") == "integer" or value in exact):
                node[key] = exact.get(value, int(value)) if abs(value) > 2**53 else int(value)
        for child in node.values():
            exact_bounds(child, exact)
    elif isinstance(node, list):
        for child in node:
            exact_bounds(child, exact)


def _integer_options(schema: dict) -> list[dict]:
    return [o for o in schema.get("anyOf", [schema]) if o.get("type") == "integer"]


def state_limits(spec: dict, settings) -> None:
    """The limits the settings put on a request's fields, stated in the schema: ``k`` (the
    search body's and its query parameter) at most ``max_k``."""
    for path_item in spec.get("paths", {}).values():
        for op in path_item.values():
            if not isinstance(op, dict):
                continue
            ks = [p.get("schema", {}) for p in op.get("parameters", [])
                  if p.get("name") == "k" and p.get("in") == "query"]
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            k = body.get("schema", {}).get("properties", {}).get("k")
            for schema in ks + ([k] if k is not None else []):
                for option in _integer_options(schema):
                    option["maximum"] = settings.max_k


def needs_key(permission: str, settings) -> bool:
    """Whether a request with this permission must carry a key under these settings."""
    if permission == WRITE:
        return settings.api_key is not None or settings.read_key is not None
    return permission == READ and settings.read_key is not None


def document_guard(app: FastAPI, policy_of) -> None:
    """Post-process /openapi.json: the bearer security requirement on exactly the operations
    that need a key with the current settings (``policy_of(app)`` is the guard's
    AccessPolicy), every operation's error answers (:func:`error_codes`, the one place they
    are declared), integer bounds written exactly and the limits the settings put on fields."""
    base = app.openapi

    def openapi():
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = base()
        settings = app.state.settings
        policy: AccessPolicy = policy_of(app)
        components = spec.setdefault("components", {})
        components.setdefault("schemas", {}).setdefault(
            "ErrorOut", ErrorOut.model_json_schema(ref_template="#/components/schemas/{model}"))
        error = {"$ref": "#/components/schemas/ErrorOut"}
        any_key = False
        for path, path_item in spec.get("paths", {}).items():
            for method, op in path_item.items():
                if method not in HTTP_METHODS:
                    continue
                permission = policy.permission(method.upper(), path)
                keyed = needs_key(permission, settings)
                if keyed:
                    op["security"] = [{SCHEME: []}]
                    any_key = True
                else:
                    op.pop("security", None)
                responses = op.setdefault("responses", {})
                responses.pop("422", None)  # app.errors answers 400 instead
                for code in error_codes(path, op, permission, keyed):
                    responses.setdefault(str(code), {
                        "description": COMMON_RESPONSES[code],
                        "content": {"application/json": {"schema": error}}})
                if permission != OPEN:
                    op.setdefault("x-permission", permission)
        exact_bounds(spec, {float(v): v for v in EXACT_BOUNDS})
        state_limits(spec, settings)
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
