"""Index lifecycle and writes: create, list, describe, change mode, delete, insert, upsert,
read and delete items, merge, backup (a file, or snapshots kept on the server) and restore."""
from __future__ import annotations

import os
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from bucketsearch.app.deps import (BodyBytes, EntryDep, IndexName, ReadAuth, RegistryDep,
                                   SettingsDep, WriteAuth)
from bucketsearch.app.encode import dedup_binary, dedup_json
from bucketsearch.app.parsing import (check_batch, content_type, parse_dedup, parse_items,
                                      unsupported_media_type, wants_binary)
from bucketsearch.app.schemas import (MAX_ID, CreateIndex, DedupIn, DedupOut, DeleteIn, GetIn,
                                      GetOut, IndexInfo, IndexList, ItemsIn, SetMode,
                                      SnapshotInfo, WriteOut, json_or_octet_body)
from bucketsearch.index.codes import to_hex
from bucketsearch.index.storage import exports

router = APIRouter(prefix="/v1/indexes", tags=["indexes"])

RAW_LAYOUT = """\
Two bodies are accepted (pick with Content-Type):

* `application/json`: `{"ids": [int, ...], "codes": ["hex", ...]}`, one hex code
  (2*ceil(bits/8) digits, np.packbits byte order: the first digit holds bits 0-3) per id.
  With `?first_id=K` and no `ids`, the ids are `K, K+1, ...`.
* `application/octet-stream`: packed codes, `B = ceil(bits/8)` bytes each in np.packbits
  layout (padding bits at the end of the last byte must be 0).
  - without `first_id`: `n` int64 little-endian ids followed by the `n` packed codes, so the
    body is `n * (8 + B)` bytes;
  - with `?first_id=K`: the body is only the `n` packed codes (`n * B` bytes) and the ids are
    `K, K+1, ..., K+n-1`;
  - with `?auto_ids=true` (insert only): the body is only the packed codes and the index
    gives the ids (as for JSON without `ids`): `first_id` in the answer.

Ids are non-negative int64, unique in the batch and not already in the index (409 otherwise).
The response comes only after the write-ahead-log record is fsynced: an acknowledged write
survives a crash."""

ITEMS_BODY = json_or_octet_body(ItemsIn)
FirstId = Annotated[int | None, Query(ge=0, le=MAX_ID, description="ids are first_id, "
                                      "first_id+1, ...: an octet-stream body holds codes only, "
                                      "a JSON body leaves out ids")]
AutoIds = Annotated[bool, Query(description="insert: the index gives the ids (first_id in the "
                                           "answer); an octet-stream body holds codes only, a "
                                           "JSON body leaves out ids")]
SnapshotName = Annotated[str, Path(pattern=exports.NAME_PATTERN, description="a snapshot name "
                                   "as POST .../snapshots returns it")]
RESTORE_TYPES = ("application/x-tar", "application/octet-stream")
BACKUP_BODY = {"requestBody": {"required": True, "content": {
    t: {"schema": {"type": "string", "format": "binary"}} for t in RESTORE_TYPES}}}


@router.post("", status_code=201, response_model=IndexInfo, dependencies=[WriteAuth])
def create_index(body: CreateIndex, registry: RegistryDep) -> dict:
    """Create an empty index (atomic: validated by the engine first; nothing is left behind
    on failure). Names are unique regardless of case."""
    entry = registry.create(body.name, body.bits, body.mode, body.substrings,
                            partitioning=body.partitioning)
    return registry.info(entry)


@router.get("", response_model=IndexList, dependencies=[ReadAuth])
def list_indexes(registry: RegistryDep) -> dict:
    """Every index with its ``state`` (ready, read_only, corrupt, unavailable) and ``reason``."""
    return {"indexes": registry.info_all()}


@router.get("/{name}", response_model=IndexInfo, dependencies=[ReadAuth])
def get_index(entry: EntryDep, registry: RegistryDep) -> dict:
    """Size, bits, mode, bucket-size histogram, distinct codes, fraction of the code space."""
    return registry.info(entry)


@router.patch("/{name}", response_model=IndexInfo, dependencies=[WriteAuth])
def set_mode(entry: EntryDep, body: SetMode, registry: RegistryDep) -> dict:
    """Change the index's mode: rebuilt in place as a merge whose snapshot is in the new mode
    (searches and writes go on meanwhile; a crash keeps the old mode or the new one, never a
    mix). Answers when the new mode serves."""
    registry.set_mode(entry, body.mode, body.substrings)
    return registry.info(entry)


@router.delete("/{name}", status_code=204, dependencies=[WriteAuth])
def delete_index(name: IndexName, registry: RegistryDep) -> Response:
    """Delete an index (also a corrupt or unavailable one) and its files."""
    registry.delete(name)
    return Response(status_code=204)


@router.post("/{name}/items", response_model=WriteOut, dependencies=[WriteAuth],
             openapi_extra=ITEMS_BODY, description=RAW_LAYOUT)
def add_items(entry: EntryDep, request: Request, body: BodyBytes, settings: SettingsDep,
              first_id: FirstId = None, auto_ids: AutoIds = False) -> dict:
    """Insert a batch of items (JSON or raw packed bytes); acknowledged after the WAL fsync.
    Without ids the index gives them: ``first_id``, ``first_id + 1``, ... in the answer."""
    ids, words = parse_items(body, content_type(request), entry.bits, settings, first_id,
                             auto_ids)
    if ids is None:
        first, n = entry.live.add_next(words)
        return {"inserted": n, "first_id": first, "size": entry.live.ntotal}
    n = entry.live.add(words, ids)
    return {"inserted": n, "size": entry.live.ntotal}


@router.post("/{name}/items/upsert", response_model=WriteOut, dependencies=[WriteAuth],
             openapi_extra=ITEMS_BODY, description=RAW_LAYOUT.replace(
                 " and not already in the index (409 otherwise)", "; an id already in the index "
                 "gets its new code"))
def upsert_items(entry: EntryDep, request: Request, body: BodyBytes, settings: SettingsDep,
                 first_id: FirstId = None) -> dict:
    """Insert or replace a batch of items in one durable WAL record (all or nothing);
    idempotent, so a client may retry it."""
    ids, words = parse_items(body, content_type(request), entry.bits, settings, first_id)
    if ids is None:
        raise ValueError("ids: an upsert needs one id per code (it replaces the code of each "
                         "id); to insert with ids given by the index, POST .../items")
    inserted, replaced = entry.live.upsert(words, ids)
    return {"inserted": inserted, "replaced": replaced, "size": entry.live.ntotal}


DEDUP_LAYOUT = """\
Insert only the items with no near-duplicate: in request order, an item is inserted when no
live item of the index and no item this request inserted before it lies at Hamming distance
`d <= radius`; otherwise it is rejected and the answer names the items that blocked it,
nearest first by (distance, id), at most `max_reported`. Atomic: the check and the write (one
write-ahead-log record, fsynced before the answer) run under the index's write lock, so two
near-duplicates sent at the same time by two clients never both get in; searches do not wait.
A request applied and sent again inserts nothing: each item is then blocked by its own first
copy at distance 0. An inserted item whose id is already live (with a code farther than the
radius) is a 409 and nothing is written.

Bodies (pick with Content-Type), as `POST .../items`:

* `application/json`: `{"codes": ["hex", ...], "ids"?: [int, ...], "radius": r,
  "max_reported"?: k}` (without `ids` the index gives the inserted items their ids);
* `application/octet-stream`: the insert layouts of `POST .../items` (`n` int64 ids then `n`
  packed codes; codes only with `?first_id=K` or `?auto_ids=true`), `radius` and
  `max_reported` in the query string.

The answer is JSON (`inserted`, `rejected`, `first_id`, `size`, and per item `{"id",
"inserted", "duplicate_of", "distances"}`), or with `Accept: application/octet-stream` binary:
`u64 n | i64 item_ids[n] | i64 lims[n+1] | i64 duplicate_of[m] | i32 distances[m]`,
little-endian, `m = lims[n]`; item `j` was inserted iff `lims[j] == lims[j+1]`, its id is
`item_ids[j]` (-1: rejected, no id given)."""

DEDUP_BODY = json_or_octet_body(DedupIn)
RadiusParam = Annotated[int | None, Query(ge=0, le=256, description="octet-stream only: insert "
                                          "an item only when nothing lies at d <= radius")]
MaxReported = Annotated[int | None, Query(ge=1, description="octet-stream only: blocking "
                                          "items reported per rejected item (default 10)")]


@router.post("/{name}/items/dedup", response_model=DedupOut, dependencies=[WriteAuth],
             openapi_extra=DEDUP_BODY, description=DEDUP_LAYOUT,
             responses={200: {"description": "per item: inserted, or what blocked it (JSON, or "
                                             "binary with Accept: application/octet-stream)",
                              "content": {"application/octet-stream": {
                                  "schema": {"type": "string", "format": "binary"}}}}})
def add_items_dedup(entry: EntryDep, request: Request, body: BodyBytes, settings: SettingsDep,
                    radius: RadiusParam = None, max_reported: MaxReported = None,
                    first_id: FirstId = None, auto_ids: AutoIds = False) -> Response:
    """Dedup on ingest: insert the items that have no near-duplicate within ``radius``."""
    job = parse_dedup(body, content_type(request), entry.bits, settings,
                      {"radius": radius, "max_reported": max_reported, "first_id": first_id,
                       "auto_ids": auto_ids})
    # each item's probe budget: its search switches to a scan past it (as k-NN does)
    per_item = max(settings.max_request_probes // max(len(job.words), 1), 1)
    result = entry.live.add_dedup(job.words, job.radius, job.ids, report=job.report,
                                  max_probes=per_item)
    request.app.state.metrics.count_dedup(entry.name, result.n_inserted, result.n_rejected)
    if wants_binary(request.headers.get("accept", "")):
        return Response(dedup_binary(result), media_type="application/octet-stream")
    return Response(dedup_json(result, entry.live.ntotal), media_type="application/json")


@router.post("/{name}/items/get", response_model=GetOut, dependencies=[ReadAuth])
def get_items(entry: EntryDep, body: GetIn, settings: SettingsDep) -> dict:
    """The codes of items by id (null for an id that is not live), from one consistent state."""
    check_batch(len(body.ids), settings, "ids")
    found, words = entry.live.get(np.asarray(body.ids, dtype=np.int64))
    codes = to_hex(words, entry.bits)
    return {"ids": body.ids, "codes": [c if f else None for c, f in zip(codes, found)]}


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


@router.get("/{name}/backup", dependencies=[ReadAuth],
            response_class=Response, responses={200: {"content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}}}})
def backup(entry: EntryDep, registry: RegistryDep) -> Response:
    """The index's live items at one consistent state, as a self-checking backup file (magic,
    JSON header with bits and mode, ids, codes, CRC-32); ``POST /restore`` reads it."""
    return Response(registry.backup(entry), media_type="application/octet-stream",
                    headers={"Content-Disposition":
                             f'attachment; filename="{entry.name}.bsbackup"'})


@router.post("/{name}/snapshots", status_code=201, response_model=SnapshotInfo,
             dependencies=[WriteAuth])
def create_snapshot(entry: EntryDep, registry: RegistryDep) -> dict:
    """Write a snapshot of the index for backup: its live items at one state (every write
    acknowledged before this request is in it), a tar holding ``manifest.json`` (bits, mode,
    item count, the SHA-256 of the payload) and ``index.bsbackup`` (the backup file), kept on
    the server until deleted (or the index is). ``GET .../snapshots/{snapshot}`` downloads it,
    ``POST /v1/indexes/{new name}/restore`` reads it back."""
    return registry.snapshot(entry)


@router.get("/{name}/snapshots", response_model=list[SnapshotInfo], dependencies=[ReadAuth])
def list_snapshots(entry: EntryDep) -> list[dict]:
    """The index's snapshots, oldest first."""
    return exports.listing(entry.folder)


@router.get("/{name}/snapshots/{snapshot}", dependencies=[ReadAuth],
            response_class=StreamingResponse, responses={200: {"content": {"application/x-tar": {
                "schema": {"type": "string", "format": "binary"}}}}})
def download_snapshot(entry: EntryDep, snapshot: SnapshotName, registry: RegistryDep) -> Response:
    """One snapshot as a tar stream (``Content-Length``; the SHA-256 of the tar is in the
    listing of its creation, the payload's inside the tar). The file is opened first, so a
    snapshot deleted meanwhile still streams whole."""
    file = registry.open_snapshot(entry, snapshot)
    size = os.fstat(file.fileno()).st_size

    def chunks():
        with file:
            while data := file.read(1 << 20):
                yield data
    return StreamingResponse(chunks(), media_type="application/x-tar", headers={
        "content-length": str(size),
        "content-disposition": f'attachment; filename="{snapshot}"'})


@router.delete("/{name}/snapshots/{snapshot}", status_code=204, dependencies=[WriteAuth])
def delete_snapshot(entry: EntryDep, snapshot: SnapshotName, registry: RegistryDep) -> Response:
    """Remove one snapshot."""
    registry.delete_snapshot(entry, snapshot)
    return Response(status_code=204)


@router.post("/{name}/restore", status_code=201, response_model=IndexInfo,
             dependencies=[WriteAuth], openapi_extra=BACKUP_BODY)
def restore(name: IndexName, request: Request, body: BodyBytes, registry: RegistryDep) -> dict:
    """Create index ``name`` from a snapshot tar (application/x-tar, from ``GET
    .../snapshots/{snapshot}``) or a backup file (application/octet-stream, from ``GET
    .../backup``), atomically: everything is verified (checksums, header, ids, codes) before
    the index appears, complete or not at all; 409 if the name exists. Bits, mode and
    substrings come from the backup."""
    ctype = content_type(request)
    if ctype not in RESTORE_TYPES:
        raise unsupported_media_type(ctype, " or ".join(RESTORE_TYPES) + " (a snapshot tar or "
                                     "a backup file)")
    return registry.info(registry.restore(name, body))
