"""Request and response models of the HTTP API."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints,
                      model_validator)

from bucketsearch.index.codes import MAX_BITS
from bucketsearch.index.storage.catalog import NAME_PATTERN

HEX_PATTERN = r"^[0-9a-fA-F]*$"
MAX_ID = 2**63 - 1


def json_integer(value):
    """JSON Schema's ``integer``: a number without a fractional part (``8`` and ``8.0``), never
    a boolean (``false`` is not the id 0, nor radius 0) and never a string (``"8"``)."""
    if isinstance(value, bool):
        raise ValueError(f"a boolean is not an integer (got {str(value).lower()})")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: An integer of a request body (the request models are strict: no str -> int, no bool -> int).
Int = Annotated[int, BeforeValidator(json_integer)]


def int_in(ge: int | None = None, le: int | None = None):
    """:data:`Int` within ``[ge, le]`` (the bounds before the validator: so pydantic states
    them in the JSON schema as ``minimum`` / ``maximum``, also inside a list or a union)."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(json_integer)]
#: The integer bounds the OpenAPI document states exactly (FastAPI writes bounds as floats:
#: 2^63 - 1 would read 2^63; app.openapi puts these back).
EXACT_BOUNDS = (MAX_ID, 2**62, -(2**62), 2**32 - 1)

IndexNameStr = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
HexCode = Annotated[str, StringConstraints(pattern=HEX_PATTERN, max_length=MAX_BITS // 4)]
ItemId = int_in(0, MAX_ID)
ServedMode = Literal["single", "mih", "auto"]


class Strict(BaseModel):
    """A request body: unknown fields refused, and no type is coerced (a boolean is not an
    integer, a string not a number; integers through :data:`Int`)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class CreateIndex(Strict):
    name: IndexNameStr = Field(description="index name, [A-Za-z0-9_-]{1,64}")
    bits: Int = Field(ge=1, le=MAX_BITS, description="code length Q in bits")
    mode: ServedMode = Field(
        "auto", description="auto (default): the planner picks single-table probing, "
                            "multi-index hashing or a scan per batch by predicted cost; single: "
                            "single-table bucket search only; mih: multi-index hashing only "
                            "(README: Which mode)")
    substrings: int_in(1, MAX_BITS) | None = Field(None,
                                   description="number of MIH substrings (mih/auto only)")
    partitioning: Literal["id_hash", "code_prefix"] = Field(
        "id_hash", description="sharded server (serve --shards N) only: id_hash (an item's "
                               "shard is a hash of its id; every shard probes the whole ball) "
                               "or code_prefix (the first log2(N) bits of the code pick the "
                               "shard; each shard probes only its part of the ball; N a power "
                               "of two); ignored by an unsharded server")


class BucketSizeCount(BaseModel):
    size: int = Field(description="items in a bucket")
    buckets: int = Field(description="number of buckets of that size")


MERGE_DESCRIPTION = ("none; pending (the delta or the tombstones reached the merge "
                     "threshold, the merge has not started); running (a merge or mode change "
                     "builds the new main index). Searches are answered meanwhile, exact, but "
                     "scan the delta: slower until the merge ends")


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
    merges: int = Field(0, description="merges of the index (kept in its snapshots: read back "
                                       "on restart)")
    merging: bool = False
    merge: str | None = Field(None, description=MERGE_DESCRIPTION)
    last_merge: float | None = Field(None, description="end of the last merge (Unix time)")
    last_merge_error: str | None = None
    applied_lsn: str | None = Field(None, description="log position applied, 'segment/offset' "
                                    "in hex (the writer: all it acknowledged; a read-only "
                                    "server: what it has caught up with)")
    lag_ms: float | None = Field(None, description="read-only server: staleness bound, ms since "
                                 "a catch-up last found the writer's log fully applied (0 on "
                                 "the writer)")
    follow_error: str | None = Field(None, description="read-only server: why the last "
                                     "catch-up failed (retried)")
    partitioning: str | None = Field(None, description="sharded index: id_hash or code_prefix "
                                     "(null: one unsharded index)")
    shard_detail: list[dict] | None = Field(None, description="sharded index: per shard its "
                                            "size, delta, tombstones, mode, merges, state")


class IndexList(BaseModel):
    indexes: list[IndexInfo]


class ItemsIn(Strict):
    ids: list[ItemId] | None = Field(None, description="one non-negative int64 id per code, "
                                     "unique; omitted (insert only): the index gives the ids "
                                     "next_id, next_id+1, ... (first_id in the answer)")
    codes: list[HexCode] = Field(description="hex codes, 2*ceil(bits/8) digits, np.packbits order")


#: a radius of a dedup insert or a join (an integer: true/false and "3" are refused, 3.0 is 3)
Radius = int_in(0, 256)
#: the blocking items a dedup insert reports per rejected item, nearest first
DEDUP_REPORT = 10


class DedupIn(Strict):
    codes: list[HexCode] = Field(description="hex codes, 2*ceil(bits/8) digits, np.packbits "
                                 "order, in request order (an earlier inserted item blocks a "
                                 "later one within the radius)")
    ids: list[ItemId] | None = Field(None, description="one non-negative int64 id per code, "
                                     "unique; omitted: the index gives the inserted items the "
                                     "ids next_id, next_id+1, ... (first_id in the answer)")
    radius: Radius = Field(description="an item is inserted only when no live item and no "
                           "earlier inserted item of the request lies at d <= radius "
                           "(at most the index's bits)")
    max_reported: int_in(1) = Field(DEDUP_REPORT, description="blocking items "
                              "reported per rejected item, nearest first by (distance, id) "
                              "(at most max_k)")

    @model_validator(mode="after")
    def _one_id_per_code(self):
        if self.ids is not None and len(self.ids) != len(self.codes):
            raise ValueError(f"ids: {len(self.ids)} ids for {len(self.codes)} codes (one id "
                             "per code)")
        return self


class DedupItem(BaseModel):
    id: int | None = Field(description="the item's id (given, or given by the index when "
                           "inserted); null for a rejected item of a request without ids")
    inserted: bool
    duplicate_of: list[int] = Field(description="rejected: the ids of the items that blocked "
                                    "it (live, or inserted earlier by this request), nearest "
                                    "first by (distance, id), at most max_reported; [] when "
                                    "inserted")
    distances: list[int] = Field(description="their Hamming distances")


class DedupOut(BaseModel):
    inserted: int = Field(description="items inserted")
    rejected: int = Field(description="items rejected as near-duplicates")
    first_id: int | None = Field(None, description="a request without ids: the inserted items "
                                 "got first_id, first_id+1, ... in request order")
    size: int = Field(description="live items after the write")
    items: list[DedupItem] = Field(description="one entry per code, in request order")


class JobIn(Strict):
    index: IndexNameStr = Field(description="the index whose live items the job reads (its "
                                "state when the job starts; writes go on meanwhile)")
    radius: Radius = Field(description="pairs at Hamming distance d <= radius (at most the "
                           "index's bits)")
    output: Literal["pairs", "clusters", "keep"] = Field(
        "pairs", description="pairs: every pair a < b within the radius, once, ordered by "
        "(a, b); clusters: per item the smallest id of its connected component of the pair "
        "graph; keep: the ids kept by the greedy rule (lowest id first, every later item "
        "within the radius of a kept one dropped)")


class JobResultInfo(BaseModel):
    rows: int = Field(description="records of the result (pairs, items, or kept ids)")
    bytes: int = Field(description="size of the result file (binary records)")
    pairs: int = Field(description="pairs within the radius")


class JobInfo(BaseModel):
    id: str
    index: str
    radius: int
    output: str
    state: str = Field(description="running, completed, failed (see reason) or cancelled")
    reason: str | None = None
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    items: int = Field(description="live items the job reads")
    items_done: int = Field(description="items whose pairs are all written")
    pairs: int = Field(description="pairs written so far")
    elapsed_s: float = Field(description="run time, restarts included")
    remaining_s: float | None = Field(None, description="the join's cost model: predicted "
                                      "seconds x the fraction of its search left")
    resumed: int = Field(0, description="restarts the job resumed from its checkpoint")
    algorithm: str | None = Field(None, description="the join's algorithm (scan, probe, blocks)")
    phases: dict | None = Field(None, description="per phase of the join: measured_s and "
                                "modeled_s")
    prediction: dict | None = Field(None, description="the cost model's prediction before the "
                                    "join ran (probes, candidates, pairs, seconds per phase)")
    result: JobResultInfo | None = None


class JobList(BaseModel):
    jobs: list[JobInfo]


class DeleteIn(Strict):
    ids: list[ItemId]


class WriteOut(BaseModel):
    inserted: int | None = None
    replaced: int | None = Field(None, description="upsert: ids that were live and got their "
                                                   "new code")
    deleted: int | None = None
    first_id: int | None = Field(None, description="an insert without ids: the ids given are "
                                 "first_id, first_id+1, ..., first_id+inserted-1 (one more "
                                 "than the largest id ever written; never given twice)")
    size: int = Field(description="live items after the write")


class SnapshotInfo(BaseModel):
    snapshot: str = Field(description="the snapshot's name: GET/DELETE .../snapshots/{snapshot}")
    bytes: int = Field(description="size of the tar")
    created_at: float = Field(description="Unix time of the snapshot")
    sha256: str | None = Field(None, description="SHA-256 of the whole tar (creation only)")
    index: str | None = None
    bits: int | None = None
    mode: str | None = None
    items: int | None = Field(None, description="live items in the snapshot (creation only)")


class SearchRequest(Strict):
    # the rule of _a_kind, stated in the schema: max_distance, k or both, as integers
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"anyOf": [
        {"required": [f], "properties": {f: {"type": "integer"}}}
        for f in ("max_distance", "k")]})

    codes: list[HexCode] = Field(min_length=1, description="query codes (hex)")
    max_distance: int_in(0, MAX_BITS) | None = Field(None,
                                     description="radius search: every item with d <= r; with "
                                                 "k, top-k within the radius")
    k: int_in(1) | None = Field(None, description="k-NN search, ordered by (distance, id); "
                          "with max_distance, the k nearest with d <= max_distance (fewer "
                          "when fewer lie that close)")
    stats: bool = Field(False, description="return per-query, per-radius work counters")

    @model_validator(mode="after")
    def _a_kind(self):
        if self.max_distance is None and self.k is None:
            raise ValueError("give max_distance (radius search), k (k-NN) or both (the k "
                             "nearest within max_distance)")
        return self


class RadiusStats(BaseModel):
    radius: int
    probes: int = Field(description="bucket lookups of this radius by the engine that ran: "
                        "C(Q, r) for a single table, the substring probes of radius step r "
                        "for multi-index hashing, 0 for a scan")
    nonempty_buckets: int
    empty_buckets: int
    items: int = Field(description="items found in the probed buckets of the main table")
    lookup_ns: int = Field(description="measured time of this radius (in-kernel clock)")
    modeled_ns: float | None = Field(description="the paper's t0 * probes for a query the "
                                     "single table ran (null for mih or scan, or before "
                                     "any t0)")
    candidates: int | None = Field(None, description="multi-index hashing: substring-bucket "
                                   "entries examined at this step (absent otherwise)")
    unique_candidates: int | None = Field(None, description="multi-index hashing: items first "
                                          "visited (and verified) at this step")


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
    scanned_from: list[int] | None = Field(None, description="with stats: per query, the "
                                           "radius from which a k-NN query ranked codes by a "
                                           "scan instead of probing (-1: it did not)")
    engine: list[str] | None = Field(None, description="with stats: per query, the engine "
                                     "that ran it (single, mih, scan; mode auto: its plan)")
    total_ns: list[int] | None = Field(None, description="with stats: per query, its whole "
                                       "in-kernel time (ns), what each engine's model charges")
    codes_compared: list[int] | None = Field(None, description="with stats: per query, codes "
                                             "compared by a linear pass (a scan, or a k-NN "
                                             "query's switch to one)")
    plan: dict | None = Field(None, description="with stats, mode auto: the path the planner "
                              "ran and the predicted per-query ns that chose it")
    took_ms: float


class LatencySummary(BaseModel):
    count: int
    p50_ns: float | None
    p90_ns: float | None
    p99_ns: float | None
    mean_ns: float | None


class CalibrateIn(Strict):
    queries: Int = Field(256, ge=1, le=100_000, description="number of sampled queries")
    max_distance: int_in(0, MAX_BITS) | None = Field(None, description="radius searched by each "
                                     "query (default: min(2, bits))")
    seed: Int = Field(0, ge=0, le=2**32 - 1)


class IndexState(BaseModel):
    state: str = Field(description="ready, read_only (a storage fault it could not undo), "
                                   "corrupt (run bucketsearch repair) or unavailable")
    reason: str | None = None
    merge: str | None = Field(None, description=MERGE_DESCRIPTION)


class Health(BaseModel):
    status: str
    indexes: int | None = None
    detail: str | None = None
    index_states: dict[str, IndexState] | None = None
    state_counts: dict[str, int] | None = None
    merges_pending: int | None = Field(None, description="indexes whose merge is pending or "
                                       "running: they serve, exact, but slower until it ends")


class ConventionsIn(Strict):
    empty_precision: float = Field(0.0, ge=0.0, le=1.0,
                                   description="precision of an empty Hamming ball")
    no_relevant: Literal["zero", "exclude"] = "zero"
    ap_denominator: Literal["all-relevant", "relevant-in-topk"] = "all-relevant"
    radius_inclusive: bool = True
    beta: float = Field(1.0, gt=0.0, le=1e6)
    auprc_anchor: Literal["first", "one"] = "first"


Label = int_in(-(2**62), 2**62)


class EvaluateIn(Strict):
    codes: list[HexCode] = Field(min_length=1, description="query codes (hex)")
    query_labels: list[Label] | list[list[int_in(0, 1)]] | None = Field(
        None, description="class id per query (1-D) or multi-hot rows (2-D)")
    db_ids: list[ItemId] | None = Field(
        None, description="database = these items of the index, in this order (default: every "
        "live item, ordered by id)")
    db_labels: list[Label] | list[list[int_in(0, 1)]] | None = Field(
        None, description="labels of the db_ids items, same form as query_labels")
    relevant_ids: list[list[ItemId]] | None = Field(
        None, description="instead of labels: per query, the ids of its relevant items")
    radius_max: int_in(0, MAX_BITS) | None = Field(None, description="largest radius reported "
                                   "(default: min(bits, 10, largest radius within the probe "
                                   "guard))")
    ks: list[int_in(1, 100_000)] = Field(
        [10, 100, 1000], min_length=1, max_length=16)
    graded: bool = False
    measure_queries: Int = Field(32, ge=0, le=10_000, description="queries timed by the index "
                                 "to get the measured per-radius cost of RAMAP")
    conventions: ConventionsIn = Field(default_factory=ConventionsIn)


class AdviseIn(Strict):
    """The radius advisor's request (app/advise.py): the queries (a seeded sample of the
    index's own items, ``query_ids``, or ``codes``), the radii, optional relevance, the rule's
    parameters."""

    sample: int_in(1, 1_000_000) | None = Field(
        None, description="queries drawn at random (seeded) from the index's own items, when "
        "neither query_ids nor codes is given (default min(200, advise_max_queries))")
    seed: int_in(0, 2**32 - 1) = Field(0, description="seed of the sample and the bootstrap")
    query_ids: list[ItemId] | None = Field(None, description="these items of the index as the "
                                           "queries (instead of a random sample)")
    codes: list[HexCode] | None = Field(None, description="these codes (hex) as the queries")
    holdout: bool = Field(True, description="queries that are items of the index are left out "
                          "of the database they are scored against (the figures of new items)")
    radius_max: int_in(0, 256) | None = Field(
        None, description="radii 0..radius_max (default min(bits, 10, advise_max_radius))")
    db_ids: list[ItemId] | None = Field(None, description="items whose labels db_labels gives "
                                        "(unlabeled items are relevant to no query)")
    db_labels: list[Label] | list[list[int_in(0, 1)]] | None = Field(
        None, description="class id (1-D) or multi-hot row (2-D) of each db_ids item; an item "
        "query's label is its own")
    query_labels: list[Label] | list[list[int_in(0, 1)]] | None = Field(
        None, description="labels of the codes queries (same form as db_labels)")
    pairs: list[Annotated[tuple[int_in(0, 2**31), ItemId, Annotated[bool, Field(strict=True)]],
                          Field(strict=False)]] | None = Field(
        None, description="[query position, item id, duplicate]: the duplicates are the relevant "
        "items; pairs marked not duplicate, like unjudged ones, are not relevant")
    objective: Literal["f1", "recall"] = Field("f1", description="quality the rule maximizes")
    min_gain: float = Field(0.01, ge=0.0, le=1.0, description="quality a larger radius must add")
    min_precision: float = Field(0.0, ge=0.0, le=1.0, description="precision floor of a radius")
    budget_us: float | None = Field(None, gt=0, le=1e9, description="cost budget per query (us)")
    resamples: int_in(0, 10_000) = Field(
        1000, description="bootstrap resamples of the intervals (0: none)")
    repeats: int_in(1, 10) = Field(3, description="timed runs per radius (the fastest kept)")
    measure_queries: int_in(0, 10_000) = Field(
        64, description="queries of the sample timed per radius (the measured cost; 0: not "
        "measured)")
    conventions: ConventionsIn = Field(default_factory=ConventionsIn)


class ErrorOut(BaseModel):
    """Every 4xx answer: ``detail`` names the field, the value and what is allowed."""

    model_config = ConfigDict(extra="allow")
    detail: str | list | dict


def error_responses(*codes: int) -> dict:
    """``responses`` of a route that wants its own description of an error status. Not needed
    to declare one: app/openapi.py (``error_codes``) declares every common error answer of
    every operation."""
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


class GetIn(Strict):
    ids: list[ItemId] = Field(description="ids whose codes to read")


class GetOut(BaseModel):
    ids: list[int]
    codes: list[str | None] = Field(description="hex code per id (np.packbits byte order), "
                                                "null for an id that is not live")


class SetMode(Strict):
    mode: ServedMode = Field(description="the mode to rebuild the index in (README: Which mode)")
    substrings: int_in(1, MAX_BITS) | None = Field(None,
                                   description="number of MIH substrings (mih/auto only)")


# ---------------------------------------------------------------- cost model (index.costmodel)
class RadiusCost(BaseModel):
    """One radius of the live cost model (docs/cost-model.md)."""

    radius: int = Field(description="radius (a radius step of multi-index hashing)")
    queries: int = Field(description="queries that reached this radius since start")
    probes: float = Field(description="mean buckets probed by one query at this radius, as "
                          "measured (= C(Q, r) for a single table; substring buckets for mih)")
    modeled_ns: float | None = Field(description="t0 x probes (the engine's probes)")
    measured: LatencySummary = Field(description="T(r): in-kernel lookup time of this radius "
                                     "alone, per query")
    measured_cumulative: LatencySummary = Field(description="T(R): a query's lookup time of "
                                                "radii 0..R together")
    mean_empty_buckets: float | None = Field(description="empty buckets probed per query at "
                                             "this radius")
    empty_ball_queries: int = Field(description="queries whose ball up to R held no item of "
                                    "the main table (RAMAP paper, Fig. 5)")
    paper_probes: int = Field(description="C(Q, r): the single-table count of the RAMAP model")
    cumulative_paper_probes: int = Field(description="sum_{i<=r} C(Q, i)")
    paper_ns: float | None = Field(description="t0 x C(Q, r)")
    paper_cumulative_ns: float | None = Field(description="t0 x sum_{i<=R} C(Q, i)")
    measured_ratio: float | None = Field(description="T(R)_p50 / T(0)_p50")
    paper_ratio: int = Field(description="the paper's T(R)/T(0) = sum_{i<=R} C(Q, i)")
    paper_over_measured: float | None = Field(description="t0 sum C(Q, i) / T(R)_p50")
    paper_holds: bool | None = Field(description="paper_over_measured within a factor 2")


class T0EstimateOut(BaseModel):
    estimator: str = Field(description="radius_fit, microbenchmark or query_model.probes")
    source: str = Field(description="'observed searches' or 'calibration'")
    t0_ns: float | None
    ci_ns: list[float] | None = Field(description="interval at `confidence`")
    samples: int
    formula: str
    confidence: float
    detail: dict


class TermFit(BaseModel):
    coef_ns: float = Field(description="ns per unit of the term (fixed: ns per query)")
    se_ns: float
    ci_ns: list[float]
    significant: bool = Field(description="the interval excludes 0")


class QueryModelOut(BaseModel):
    estimator: str
    source: str = Field(description="the samples: a calibration or the recent searches")
    time: str = Field(description="what is fitted: the per-query sum of lookup_ns")
    formula: str
    terms: dict[str, TermFit] = Field(description="identified terms")
    unidentified: dict[str, str] = Field(description="terms left out and why (collinear, "
                                         "zero, too few samples)")
    r2: float | None
    samples: int
    dof: int
    condition_index: float | None
    covariance: str
    confidence: float
    coef: dict[str, float] = Field(description="coef_ns of each identified term")


class CostModelOut(BaseModel):
    index: str
    bits: int
    t0_ns: float | None = Field(description="the t0 the server models with")
    t0_source: str | None = Field(description="'calibration' or 'observed searches'")
    t0_estimator: str | None = Field(description="the estimator of t0_ns (radius_fit)")
    t0_ci_ns: list[float] | None
    t0_samples: int = Field(description="(query, radius) samples observed since start")
    queries: int = Field(description="range queries observed since start")
    calibration: dict | None = Field(description="the last calibration run, with its fit_all "
                                     "result under 'fits'")
    estimates: list[T0EstimateOut] = Field(description="every t0 estimate, named")
    extended_model: QueryModelOut | None
    radii: list[RadiusCost] = Field(description="per radius, the range queries that ran "
                                    "single-table probing (the paper's model's scope)")
    engines: dict | None = Field(None, description="the cost model of what ran: per engine "
                                 "its model (a line per term with its counter), per query "
                                 "class and radius the engine with its share, counters, "
                                 "modeled, measured, ratio, the paper's t0 x sumC; a legend "
                                 "of every column; verdicts per model (null before any "
                                 "search)")
    verdicts: dict


class Limits(BaseModel):
    """The request limits of this server (settings of the same names, README "Limits")."""

    max_batch: int = Field(description="codes or ids per request")
    max_k: int = Field(description="largest k of a k-NN search")
    max_results: int = Field(description="largest total number of ids one search may return")
    max_request_probes: int = Field(description="probe budget of one search request")
    max_request_compares: int = Field(description="codes one request may compare by scans")
    max_request_memory: int = Field(description="bytes of answer and statistics one request "
                                    "may hold (estimated before any work)")
    max_body_bytes: int = Field(description="request body limit")
