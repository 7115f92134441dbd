"""A uniform sample of an index's live codes (read-only), for load tests to draw queries from."""
from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request, Response

from bucketsearch.app.deps import EntryDep, ReadAuth
from bucketsearch.app.parsing import wants_binary
from bucketsearch.index.codes import to_hex, to_packed

router = APIRouter(prefix="/v1/indexes", tags=["indexes"])

#: most codes one sample request returns
MAX_SAMPLE = 10_000

SAMPLE_LAYOUT = """\
Up to `n` codes drawn uniformly without replacement from the live items (main index and
items inserted since the last merge, minus deleted ones), seeded by `seed`. Fewer when the
index holds fewer items; none for an empty index.

* JSON (default): `{"bits": Q, "size": live items, "ids": [...], "codes": ["hex", ...]}`,
  hex codes as the search and insert bodies take them.
* `Accept: application/octet-stream` (first media type listed): the layout of an
  octet-stream insert body, `m` int64 little-endian ids followed by the `m` packed codes
  (`B = ceil(bits/8)` bytes each, np.packbits layout); headers `X-Bits`, `X-Count` (m) and
  `X-Index-Size`."""


@router.get("/{name}/sample", dependencies=[ReadAuth], description=SAMPLE_LAYOUT,
            responses={200: {"description": "sampled codes (JSON, or binary with Accept: "
                                            "application/octet-stream)",
                             "content": {"application/json": {"schema": {
                                 "type": "object",
                                 "required": ["bits", "size", "ids", "codes"],
                                 "properties": {
                                     "bits": {"type": "integer"}, "size": {"type": "integer"},
                                     "ids": {"type": "array", "items": {"type": "integer"}},
                                     "codes": {"type": "array", "items": {"type": "string"}}}}},
                                 "application/octet-stream": {
                                     "schema": {"type": "string", "format": "binary"}}}}})
def sample(entry: EntryDep, request: Request,
           n: Annotated[int, Query(ge=1, le=MAX_SAMPLE, description="codes wanted "
                                   f"(1..{MAX_SAMPLE})")] = 100,
           seed: Annotated[int, Query(ge=0, le=2**63 - 1, description="seed of the draw")] = 0,
           ) -> Response:
    """Codes sampled uniformly from the index's live items (for load tests and inspection)."""
    view = entry.live.view()  # read once: one consistent view
    ids, words = view.sample(n, seed)
    if wants_binary(request.headers.get("accept", "")):
        body = ids.astype("<i8").tobytes() + to_packed(words, entry.bits).tobytes()
        return Response(body, media_type="application/octet-stream",
                        headers={"X-Bits": str(entry.bits), "X-Count": str(len(ids)),
                                 "X-Index-Size": str(view.ntotal)})
    return Response(orjson.dumps({"bits": entry.bits, "size": view.ntotal,
                                  "ids": ids.tolist(), "codes": to_hex(words, entry.bits)}),
                    media_type="application/json")
