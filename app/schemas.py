"""Request and response models of the HTTP API."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from bucketsearch.index.storage.catalog import NAME_PATTERN

HEX_PATTERN = r"^[0-9a-fA-F]*$"
MAX_ID = 2**63 - 1

IndexNameStr = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
HexCode = Annotated[str, StringConstraints(pattern=HEX_PATTERN, max_length=64)]
ItemId = Annotated[int, Field(ge=0, le=MAX_ID)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateIndex(Strict):
    name: IndexNameStr = Field(description="index name, [A-Za-z0-9_-]{1,64}")
    bits: int = Field(ge=1, le=256, description="code length Q in bits")
    mode: Literal["single", "mih", "auto"] = Field(
        "auto", description="auto (default): the planner picks single-table probing, "
                            "multi-index hashing or a scan per batch by predicted cost; single: "
                            "single-table bucket search only; mih: multi-index hashing only "
                            "(README: Which mode)")
    substrings: int | None = Field(None, ge=1, le=256,
                                   description="number of MIH substrings (mih/auto only)")


class BucketSizeCount(BaseModel):
    size: int = Field(description="items in a bucket")
    buckets: int = Field(description="number of buckets of that size")


class IndexInfo(BaseModel):
    name: str
    bits: int | None
    mode: str | None
    substrings: int | None
    state: str = Field(description="ready, read_only (a storage fault it could not undo: "
                                   "writes refused), corrupt (run 'bucketsearch repair') or "
                                   "unavailable (could not be loaded; see reason)")
    reason: str | None = Field(None, description="why the state is not ready")
    size: int | None = Field(None, description="live items (main - tombstones + delta)")
    main_size: int | None = Field(None, description="items in the main snapshot table")
    delta_size: int | None = Field(None, description="items inserted since the last merge")
    tombstones: int | None = Field(None, description="main-table items deleted since the last "
                                                     "merge")
    distinct_codes: int | None = Field(None, description="non-empty buckets of the main table")
    code_space_fraction: float | None = Field(None, description="distinct_codes / 2^bits")
    bucket_size_histogram: list[BucketSizeCount] = []
    memory_bytes: int | None = None
    merges: int = Field(0, description="merges since the server started")
    merging: bool = False
    last_merge: float | None = Field(None, description="end of the last merge (Unix time)")
    last_merge_error: str | None = None


class IndexList(BaseModel):
    indexes: list[IndexInfo]


class ItemsIn(Strict):
    ids: list[ItemId] = Field(description="one non-negative int64 id per code, unique")
    codes: list[HexCode] = Field(description="hex codes, 2*ceil(bits/8) digits, np.packbits order")


class DeleteIn(Strict):
    ids: list[ItemId]


class WriteOut(BaseModel):
    inserted: int | None = None
    deleted: int | None = None
    size: int = Field(description="live items after the write")


class SearchRequest(Strict):
    codes: list[HexCode] = Field(min_length=1, description="query codes (hex)")
    max_distance: int | None = Field(None, ge=0, le=256,
                                     description="radius search: every item with d <= r")
    k: int | None = Field(None, ge=1, description="k-NN search, ordered by (distance, id)")
    stats: bool = Field(False, description="return per-query, per-radius work counters")

    @model_validator(mode="after")
    def _one_kind(self):
        if (self.max_distance is None) == (self.k is None):
            raise ValueError("give exactly one of max_distance (radius search) or k (k-NN)")
        return self


class RadiusStats(BaseModel):
    radius: int
    probes: int = Field(description="buckets probed at this radius, C(Q, r)")
    nonempty_buckets: int
    empty_buckets: int
    items: int = Field(description="items found in the probed buckets of the main table")
    lookup_ns: int = Field(description="measured time of this radius (in-kernel clock)")
    modeled_ns: float | None = Field(description="t0 * probes (null before any calibration)")


class SearchResult(BaseModel):
    ids: list[int]
    distances: list[int]


class DeltaScan(BaseModel):
    items: int = Field(description="delta items (inserted since the last merge) scanned "
                       "linearly by each query")
    scan_ns: int = Field(description="wall-clock ns of the delta scan for the whole batch")


class SearchResponse(BaseModel):
    results: list[SearchResult]
    stats: list[list[RadiusStats]] | None = None
    delta: DeltaScan | None = Field(None, description="with stats: the delta segment's scan, "
                                    "which has no buckets and is not in the per-radius stats")
    took_ms: float


class LatencySummary(BaseModel):
    count: int
    p50_ns: float | None
    p90_ns: float | None
    p99_ns: float | None
    mean_ns: float | None


class RadiusCost(BaseModel):
    radius: int = Field(description="radius (a radius step of multi-index hashing)")
    probes: float = Field(description="mean buckets probed by one query at this radius, as "
                          "measured (= C(Q, r) for a single table; substring buckets for mih)")
    paper_probes: int = Field(description="C(Q, r): the single-table count of the RAMAP model")
    cumulative_paper_probes: int = Field(description="sum_{i<=r} C(Q, i)")
    modeled_ns: float | None = Field(description="t0 * probes")
    measured: LatencySummary


class ExtendedModel(BaseModel):
    source: str
    terms: list[str]
    coef: dict[str, float] = Field(description="ns per unit of each term ('const' in ns)")
    r2: float | None
    rel_error: list[float | None]
    max_rel_error: float | None
    samples: int


class CostModelOut(BaseModel):
    index: str
    bits: int
    t0_ns: float | None = Field(description="cost of one probe, least squares through the origin")
    t0_source: str | None
    t0_samples: int
    calibration: dict | None = Field(description="the last calibration run, if any")
    extended_model: ExtendedModel | None
    radii: list[RadiusCost]


class CalibrateIn(Strict):
    queries: int = Field(256, ge=1, le=100_000, description="number of sampled queries")
    max_distance: int = Field(2, ge=0, le=256, description="radius searched by each query")
    seed: int = Field(0, ge=0, le=2**32 - 1)


class IndexState(BaseModel):
    state: str = Field(description="ready, read_only (a storage fault it could not undo), "
                                   "corrupt (run bucketsearch repair) or unavailable")
    reason: str | None = None


class Health(BaseModel):
    status: str
    indexes: int | None = None
    detail: str | None = None
    index_states: dict[str, IndexState] | None = None
    state_counts: dict[str, int] | None = None


class ConventionsIn(Strict):
    empty_precision: float = Field(0.0, ge=0.0, le=1.0,
                                   description="precision of an empty Hamming ball")
    no_relevant: Literal["zero", "exclude"] = "zero"
    ap_denominator: Literal["all-relevant", "relevant-in-topk"] = "all-relevant"
    radius_inclusive: bool = True
    beta: float = Field(1.0, gt=0.0, le=1e6)
    auprc_anchor: Literal["first", "one"] = "first"


Label = Annotated[int, Field(ge=-(2**62), le=2**62)]


class EvaluateIn(Strict):
    codes: list[HexCode] = Field(min_length=1, description="query codes (hex)")
    query_labels: list[Label] | list[list[Annotated[int, Field(ge=0, le=1)]]] | None = Field(
        None, description="class id per query (1-D) or multi-hot rows (2-D)")
    db_ids: list[ItemId] | None = Field(
        None, description="database = these items of the index, in this order (default: every "
        "live item, ordered by id)")
    db_labels: list[Label] | list[list[Annotated[int, Field(ge=0, le=1)]]] | None = Field(
        None, description="labels of the db_ids items, same form as query_labels")
    relevant_ids: list[list[ItemId]] | None = Field(
        None, description="instead of labels: per query, the ids of its relevant items")
    radius_max: int | None = Field(None, ge=0, le=256, description="largest radius reported "
                                   "(default: min(bits, 10, largest radius within the probe "
                                   "guard))")
    ks: list[Annotated[int, Field(ge=1, le=100_000)]] = Field(
        [10, 100, 1000], min_length=1, max_length=16)
    graded: bool = False
    measure_queries: int = Field(32, ge=0, le=10_000, description="queries timed by the index "
                                 "to get the measured per-radius cost of RAMAP")
    conventions: ConventionsIn = Field(default_factory=ConventionsIn)


class ErrorOut(BaseModel):
    """Every 4xx answer: ``detail`` names the field, the value and what is allowed."""

    model_config = ConfigDict(extra="allow")
    detail: str | list | dict


def error_responses(*codes: int) -> dict:
    text = {400: "invalid value (the message names the field)", 401: "missing API key",
            403: "wrong API key", 404: "unknown index", 409: "conflict (duplicate id or name, "
            "read-only server)", 413: "body or batch too large", 415: "unsupported Content-Type",
            503: "starting: indexes loading or kernels compiling (see /readyz)"}
    return {code: {"model": ErrorOut, "description": text[code]} for code in codes}


def json_or_octet_body(model: type[BaseModel]) -> dict:
    """``openapi_extra`` of an endpoint that reads its body itself: ``model`` as JSON, or raw
    ``application/octet-stream`` bytes."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": model.model_json_schema()},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
