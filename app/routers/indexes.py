"""Index lifecycle and writes: create, list, describe, delete, insert, delete items, merge."""
from __future__ import annotations

from typing import Annotated

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from bucketsearch.app.deps import (BodyBytes, EntryDep, IndexName, ReadAuth, RegistryDep, SettingsDep,
                      WriteAuth)
from bucketsearch.app.schemas import (MAX_ID, CreateIndex, DeleteIn, IndexInfo, IndexList, ItemsIn,
                         WriteOut, error_responses, json_or_octet_body)
from bucketsearch.index.codes import n_bytes, pack_bytes, pack_hex

router = APIRouter(prefix="/v1/indexes", tags=["indexes"],
                   responses=error_responses(400, 401, 403, 404, 409, 413, 415, 503))

RAW_LAYOUT = """\
Two bodies are accepted (pick with Content-Type):

* `application/json`: `{"ids": [int, ...], "codes": ["hex", ...]}`, one hex code
  (2*ceil(bits/8) digits, np.packbits byte order: the first digit holds bits 0-3) per id.
* `application/octet-stream`: packed codes, `B = ceil(bits/8)` bytes each in np.packbits
  layout (padding bits at the end of the last byte must be 0).
  - without `first_id`: `n` int64 little-endian ids followed by the `n` packed codes, so the
    body is `n * (8 + B)` bytes;
  - with `?first_id=K`: the body is only the `n` packed codes (`n * B` bytes) and the ids are
    `K, K+1, ..., K+n-1`.

Ids are non-negative int64, unique in the batch and not already in the index (409 otherwise).
The response comes only after the write-ahead-log record is fsynced: an acknowledged write
survives a crash."""

ITEMS_BODY = json_or_octet_body(ItemsIn)


@router.post("", status_code=201, response_model=IndexInfo, dependencies=[WriteAuth])
def create_index(body: CreateIndex, registry: RegistryDep) -> dict:
    """Create an empty index (atomic: validated by the engine first; nothing is left behind
    on failure). Names are unique regardless of case."""
    entry = registry.create(body.name, body.bits, body.mode, body.substrings)
    return registry.info(entry)


@router.get("", response_model=IndexList, dependencies=[ReadAuth])
def list_indexes(registry: RegistryDep) -> dict:
    """Every index with its ``state`` (ready, read_only, corrupt, unavailable) and ``reason``."""
    return {"indexes": registry.info_all()}


@router.get("/{name}", response_model=IndexInfo, dependencies=[ReadAuth])
def get_index(entry: EntryDep, registry: RegistryDep) -> dict:
    """Size, bits, mode, bucket-size histogram, distinct codes, fraction of the code space."""
    return registry.info(entry)


@router.delete("/{name}", status_code=204, dependencies=[WriteAuth])
def delete_index(name: IndexName, registry: RegistryDep) -> Response:
    """Delete an index (also a corrupt or unavailable one) and its files."""
    registry.delete(name)
    return Response(status_code=204)


def check_batch(n: int, settings, field: str) -> None:
    if n > settings.max_batch:
        raise HTTPException(413, f"{field}: batch of {n} exceeds the limit max_batch="
                                 f"{settings.max_batch} (BUCKETSEARCH_MAX_BATCH)")


def parse_raw_items(body: bytes, bits: int, first_id: int | None):
    """Decode an octet-stream insert body (see RAW_LAYOUT) into ``(ids, words)``."""
    nb = n_bytes(bits)
    if first_id is None:
        record = 8 + nb
        if len(body) % record:
            raise ValueError(f"body: {len(body)} bytes is not a multiple of 8 + {nb} (an int64 "
                             f"id and a packed {bits}-bit code per item); to send codes only, "
                             "pass ?first_id=")
        n = len(body) // record
        ids = np.frombuffer(body, dtype="<i8", count=n).astype(np.int64)
        packed = np.frombuffer(body, dtype=np.uint8, offset=8 * n).reshape(n, nb)
        if n and ids.min() < 0:
            raise ValueError(f"body: id {int(ids[ids < 0][0])} is negative (ids must be in "
                             f"[0, {MAX_ID}])")
    else:
        if len(body) % nb:
            raise ValueError(f"body: {len(body)} bytes is not a multiple of {nb} (one packed "
                             f"{bits}-bit code per item)")
        n = len(body) // nb
        if first_id + n - 1 > MAX_ID:
            raise ValueError(f"first_id: {first_id} + {n} codes overflows int64")
        ids = np.arange(first_id, first_id + n, dtype=np.int64)
        packed = np.frombuffer(body, dtype=np.uint8).reshape(n, nb)
    try:
        words = pack_bytes(packed, bits)
    except ValueError as exc:
        raise ValueError(f"body: {exc}") from None
    return ids, words


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


@router.post("/{name}/items", response_model=WriteOut, dependencies=[WriteAuth],
             openapi_extra=ITEMS_BODY, description=RAW_LAYOUT)
def add_items(entry: EntryDep, request: Request, body: BodyBytes, settings: SettingsDep,
              first_id: Annotated[int | None, Query(
                  ge=0, le=MAX_ID, description="octet-stream only: ids are first_id, "
                  "first_id+1, ... and the body holds codes only")] = None) -> dict:
    """Insert a batch of items (JSON or raw packed bytes); acknowledged after the WAL fsync."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/octet-stream":
        ids, words = parse_raw_items(body, entry.bits, first_id)
        check_batch(len(ids), settings, "body")
    elif ctype in ("application/json", ""):
        if first_id is not None:
            raise ValueError("first_id: only allowed with Content-Type application/octet-stream")
        items = validate_json_body(ItemsIn, body)
        check_batch(len(items.codes), settings, "codes")
        if len(items.ids) != len(items.codes):
            raise ValueError(f"ids: {len(items.ids)} ids for {len(items.codes)} codes "
                             "(one id per code)")
        words = parse_hex(items.codes, entry.bits)
        ids = np.asarray(items.ids, dtype=np.int64)
    else:
        raise HTTPException(415, f"Content-Type {ctype!r} is not supported; allowed: "
                                 "application/json, application/octet-stream")
    n = entry.live.add(words, ids)
    return {"inserted": n, "size": entry.live.ntotal}


@router.post("/{name}/items/delete", response_model=WriteOut, dependencies=[WriteAuth])
def delete_items(entry: EntryDep, body: DeleteIn, settings: SettingsDep) -> dict:
    """Delete items by id (unknown ids are ignored); tombstones until the next merge."""
    check_batch(len(body.ids), settings, "ids")
    n = entry.live.delete(np.asarray(body.ids, dtype=np.int64))
    return {"deleted": n, "size": entry.live.ntotal}


@router.post("/{name}/merge", response_model=IndexInfo, dependencies=[WriteAuth])
def merge(entry: EntryDep, registry: RegistryDep) -> dict:
    """Fold the delta and tombstones into a new main snapshot now (normally a background job
    started when the delta reaches BUCKETSEARCH_MERGE_THRESHOLD)."""
    entry.live.merge()
    return registry.info(entry)
