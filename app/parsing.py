"""Request parsing shared by the routers: bodies read by the endpoints themselves.

* JSON bodies validated into the one 400 error shape (app/errors.py): ``validate_json_body``;
* hex codes: ``parse_hex``;
* insert bodies of either Content-Type (``parse_items``; octet-stream: ``parse_raw_items``),
  dedup inserts (``parse_dedup``, into a ``DedupJob``) and search bodies (``parse_search``, JSON or octet-stream, into a ``SearchJob``);
* the batch limits checked while a body is parsed: ``check_batch`` (413), ``check_knn``;
* headers: ``content_type``, ``wants_binary``.

Routers import from here, never from each other (tests/test_import_graph.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from bucketsearch.app.schemas import DEDUP_REPORT, MAX_ID, DedupIn, ItemsIn, SearchRequest
from bucketsearch.index.codes import n_bytes, pack_bytes, pack_hex


def content_type(request: Request) -> str:
    """The media type of the Content-Type header, lower case, without parameters."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def wants_binary(accept: str) -> bool:
    """True when the first media type of the Accept header is application/octet-stream."""
    return accept.split(",")[0].split(";")[0].strip().lower() == "application/octet-stream"


def unsupported_media_type(ctype: str, allowed: str = "application/json, "
                           "application/octet-stream") -> HTTPException:
    return HTTPException(415, f"Content-Type {ctype!r} is not supported; allowed: {allowed}")


def check_batch(n: int, settings, field: str) -> None:
    if n > settings.max_batch:
        raise HTTPException(413, f"{field}: batch of {n} exceeds the limit max_batch="
                                 f"{settings.max_batch} (BUCKETSEARCH_MAX_BATCH)")


def check_knn(nq: int, k: int, settings) -> None:
    """k-NN limits, before any work: ``k <= max_k`` and ``nq x k <= max_results``."""
    if k > settings.max_k:
        raise ValueError(f"k: {k} exceeds the limit max_k={settings.max_k}")
    if nq * k > settings.max_results:
        raise ValueError(f"k: {nq} queries x k={k} = {nq * k:,} results, more than "
                         f"max_results={settings.max_results}; send fewer queries per request "
                         "or a smaller k")


def validate_json_body(model, body: bytes):
    """``model`` from a JSON body; errors are a RequestValidationError (400, one error shape:
    app/errors.py) with ``loc`` under "body"."""
    try:
        return model.model_validate_json(body or b"null")
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        for err in errors:
            err["loc"] = ("body", *err["loc"])
        raise RequestValidationError(errors, body=None) from None


def parse_hex(codes: list[str], bits: int, field: str = "codes") -> np.ndarray:
    try:
        return pack_hex(codes, bits)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None


def parse_raw_items(body: bytes, bits: int, first_id: int | None, auto_ids: bool = False):
    """Decode an octet-stream insert body (app/routers/indexes.py RAW_LAYOUT) into
    ``(ids, words)``; ids None with ``auto_ids`` (codes only: the index gives the ids)."""
    nb = n_bytes(bits)
    if auto_ids and first_id is not None:
        raise ValueError(f"first_id: give first_id or auto_ids=true, not both (got first_id="
                         f"{first_id})")
    if first_id is None and not auto_ids:
        record = 8 + nb
        if len(body) % record:
            raise ValueError(f"body: {len(body)} bytes is not a multiple of 8 + {nb} (an int64 "
                             f"id and a packed {bits}-bit code per item); to send codes only, "
                             "pass ?first_id= or ?auto_ids=true")
        n = len(body) // record
        ids = np.frombuffer(body, dtype="<i8", count=n).astype(np.int64)
        packed = np.frombuffer(body, dtype=np.uint8, offset=8 * n).reshape(n, nb)
        if n and ids.min() < 0:
            raise ValueError(f"body: id {int(ids[ids < 0][0])} is negative (ids must be in "
                             f"[0, {MAX_ID}])")
    else:  # codes only
        if len(body) % nb:
            raise ValueError(f"body: {len(body)} bytes is not a multiple of {nb} (one packed "
                             f"{bits}-bit code per item)")
        n = len(body) // nb
        ids = None
        if first_id is not None:
            if first_id + n - 1 > MAX_ID:
                raise ValueError(f"first_id: {first_id} + {n} codes overflows int64")
            ids = np.arange(first_id, first_id + n, dtype=np.int64)
        packed = np.frombuffer(body, dtype=np.uint8).reshape(n, nb)
    try:
        words = pack_bytes(packed, bits)
    except ValueError as exc:
        raise ValueError(f"body: {exc}") from None
    return ids, words


def parse_items(body: bytes, ctype: str, bits: int, settings, first_id: int | None,
                auto_ids: bool = False):
    """Decode an insert body of either Content-Type into ``(ids, words)``, ``max_batch``
    checked (413); ids None when the index is to give them (JSON without ``ids``, or
    ``auto_ids``)."""
    if ctype == "application/octet-stream":
        ids, words = parse_raw_items(body, bits, first_id, auto_ids)
        check_batch(len(words), settings, "body")
    elif ctype in ("application/json", ""):
        items = validate_json_body(ItemsIn, body)
        check_batch(len(items.codes), settings, "codes")
        given = "first_id" if first_id is not None else "auto_ids=true" if auto_ids else None
        if items.ids is not None and given is not None:
            raise ValueError(f"ids: give ids in the body or {given}, not both")
        if first_id is not None and auto_ids:
            raise ValueError(f"first_id: give first_id or auto_ids=true, not both (got "
                             f"first_id={first_id})")
        if items.ids is not None and len(items.ids) != len(items.codes):
            raise ValueError(f"ids: {len(items.ids)} ids for {len(items.codes)} codes "
                             "(one id per code)")
        words = parse_hex(items.codes, bits)
        ids = None if items.ids is None else np.asarray(items.ids, dtype=np.int64)
        if first_id is not None:  # as octet-stream: the ids first_id, first_id + 1, ...
            if first_id + len(words) - 1 > MAX_ID:
                raise ValueError(f"first_id: {first_id} + {len(words)} codes overflows int64")
            ids = np.arange(first_id, first_id + len(words), dtype=np.int64)
    else:
        raise unsupported_media_type(ctype)
    return ids, words


@dataclass(frozen=True)
class SearchJob:
    """A parsed search request: packed query words and what to do with them."""

    xq: np.ndarray
    max_distance: int | None
    k: int | None
    stats: bool
    binary: bool  # answer with app.encode.results_binary instead of JSON
    parse_s: float  # seconds spent decoding the body


def parse_search(body: bytes, ctype: str, bits: int, settings, params: dict,
                 binary: bool = False) -> SearchJob:
    """Decode a search body of either Content-Type (app/routers/search.py SEARCH_LAYOUT) into
    a SearchJob; ``max_batch`` and the k-NN limits are checked before the codes are decoded."""
    t = time.perf_counter()
    if ctype == "application/octet-stream":
        nb = n_bytes(bits)
        if not body or len(body) % nb:
            raise ValueError(f"body: {len(body)} bytes is not a positive multiple of {nb} (one "
                             f"packed {bits}-bit code per query)")
        check_batch(len(body) // nb, settings, "body")
        if params["max_distance"] is None and params["k"] is None:
            raise ValueError("max_distance: give the query parameter max_distance (radius "
                             "search), k (k-NN) or both (the k nearest within max_distance)")
        if params["k"] is not None:
            check_knn(len(body) // nb, params["k"], settings)
        try:
            xq = pack_bytes(np.frombuffer(body, dtype=np.uint8).reshape(-1, nb), bits)
        except ValueError as exc:
            raise ValueError(f"body: {exc}") from None
        job = SearchJob(xq, params["max_distance"], params["k"], params["stats"], binary,
                        time.perf_counter() - t)
    elif ctype in ("application/json", ""):
        given = [name for name, value in params.items() if value not in (None, False)]
        if given:
            raise ValueError(f"{given[0]}: query parameters are only read with Content-Type "
                             "application/octet-stream; put it in the JSON body")
        req = validate_json_body(SearchRequest, body)
        check_batch(len(req.codes), settings, "codes")
        if req.k is not None:
            check_knn(len(req.codes), req.k, settings)
        job = SearchJob(parse_hex(req.codes, bits), req.max_distance, req.k, req.stats, binary,
                        time.perf_counter() - t)
    else:
        raise unsupported_media_type(ctype)
    if job.binary and job.stats:
        raise ValueError("stats: the per-radius counters come only in the JSON answer; drop "
                         "'Accept: application/octet-stream' or stats")
    return job


@dataclass(frozen=True)
class DedupJob:
    """A parsed dedup insert: ids (None: the index gives them), words, radius, report."""

    ids: np.ndarray | None
    words: np.ndarray
    radius: int
    report: int


def parse_dedup(body: bytes, ctype: str, bits: int, settings, params: dict) -> DedupJob:
    """Decode a dedup insert (app/routers/indexes.py DEDUP_LAYOUT): octet-stream as an insert
    body with ``radius``, ``max_reported``, ``first_id``, ``auto_ids`` in the query string;
    JSON as :class:`DedupIn`. ``max_batch`` (413), ``max_reported <= max_k`` and ``items x
    max_reported <= max_results`` are checked before any work."""
    if ctype == "application/octet-stream":
        if params["radius"] is None:
            raise ValueError("radius: give the query parameter radius (an item is inserted "
                             "only when nothing lies at d <= radius)")
        ids, words = parse_raw_items(body, bits, params["first_id"], params["auto_ids"])
        check_batch(len(words), settings, "body")
        radius = params["radius"]
        report = DEDUP_REPORT if params["max_reported"] is None else params["max_reported"]
    elif ctype in ("application/json", ""):
        given = [name for name, value in params.items() if value not in (None, False)]
        if given:
            raise ValueError(f"{given[0]}: query parameters are only read with Content-Type "
                             "application/octet-stream; put it in the JSON body")
        req = validate_json_body(DedupIn, body)
        check_batch(len(req.codes), settings, "codes")
        words = parse_hex(req.codes, bits)
        ids = None if req.ids is None else np.asarray(req.ids, dtype=np.int64)
        radius, report = req.radius, req.max_reported
    else:
        raise unsupported_media_type(ctype)
    if report > settings.max_k:
        raise ValueError(f"max_reported: {report} exceeds the limit max_k={settings.max_k}")
    if len(words) * report > settings.max_results:
        raise ValueError(f"max_reported: {len(words)} items x {report} = {len(words) * report:,}"
                         f" reported ids, more than max_results={settings.max_results}; send "
                         "fewer items per request or a smaller max_reported")
    return DedupJob(ids, words, radius, report)
