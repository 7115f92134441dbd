"""Near-duplicate jobs (app/jobs.py): start, list, status, cancel, delete, download the result."""
from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from bucketsearch.app.deps import ReadAuth, RegistryDep, WriteAuth
from bucketsearch.app.jobs import MEDIA_TYPES, JobManager
from bucketsearch.app.schemas import ErrorOut, JobIn, JobInfo, JobList

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
JobId = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="the job's id")]

RESULT_LAYOUT = """\
The result of a completed job, streamed (409 before it has completed: a partial result is
never served). `format`:

* `ndjson`: one JSON object per line: `{"a", "b", "d"}` (pairs, ordered by (a, b)),
  `{"id", "cluster"}` (clusters: every item, ordered by id, `cluster` the smallest id of its
  component) or `{"id"}` (keep: the ids kept, ascending);
* `csv`: the same columns with a header row (on the first page only);
* `binary`: the records as stored, little-endian: `i64 a | i64 b | i32 d` (20 bytes),
  `i64 id | i64 cluster` or `i64 id`;
* `parquet`: only when the server has pyarrow installed (400 otherwise).

`offset` and `limit` (records) select a page, so a client can read a large result in parts
and resume a download; `X-Rows` gives the records in the answer, `X-Total-Rows` all of them."""


def jobs_of(request: Request) -> JobManager:
    return request.app.state.jobs


@router.post("", status_code=202, response_model=JobInfo, dependencies=[WriteAuth],
             responses={404: {"model": ErrorOut, "description": "unknown index"}})
def start_job(body: JobIn, request: Request, registry: RegistryDep) -> dict:
    """Start a job on an index: every pair of its live items within ``radius``, their
    clusters, or the keep-list, over the index's state at this moment (its items are copied to
    the job first; writes go on). Runs in the background: poll ``GET /v1/jobs/{id}``. 409 when
    the index has ``jobs_per_index`` jobs running. A sharded index joins each shard and every
    pair of shards on the shard actors."""
    jobs = jobs_of(request)
    job = jobs.start(registry.get(body.index), body.radius, body.output)
    return jobs.info(job)


@router.get("", response_model=JobList, dependencies=[ReadAuth])
def list_jobs(request: Request, registry: RegistryDep,
              index: Annotated[str | None, Query(max_length=64, description="only the jobs of "
                                                 "this index")] = None) -> dict:
    """Every job (oldest first) with its state and progress."""
    jobs = jobs_of(request)
    return {"jobs": [jobs.info(j) for j in jobs.list(index)]}


@router.get("/{job_id}", response_model=JobInfo, dependencies=[ReadAuth])
def get_job(job_id: JobId, request: Request, registry: RegistryDep) -> dict:
    """A job's state and progress: items done, pairs so far, elapsed, the cost model's
    remaining time, and the join's measured against modeled seconds per phase."""
    jobs = jobs_of(request)
    return jobs.info(jobs.get(job_id))


@router.post("/{job_id}/cancel", response_model=JobInfo, dependencies=[WriteAuth])
def cancel_job(job_id: JobId, request: Request, registry: RegistryDep) -> dict:
    """Stop a running job (its partial files are removed); a job that is not running is left
    as it is (cancel is idempotent): the answer is its status."""
    jobs = jobs_of(request)
    return jobs.info(jobs.cancel(job_id))


@router.delete("/{job_id}", status_code=204, dependencies=[WriteAuth])
def delete_job(job_id: JobId, request: Request, registry: RegistryDep) -> Response:
    """Remove a finished job and its files; 409 while it runs (cancel it first)."""
    jobs_of(request).delete(job_id)
    return Response(status_code=204)


@router.get("/{job_id}/result", dependencies=[ReadAuth], response_class=StreamingResponse,
            description=RESULT_LAYOUT,
            responses={200: {"content": {t: {"schema": {"type": "string", "format": "binary"}}
                                         for t in MEDIA_TYPES.values()}},
                       409: {"model": ErrorOut, "description": "the job has not completed "
                             "(running, failed or cancelled): no partial result is served"}})
def job_result(job_id: JobId, request: Request, registry: RegistryDep,
               format: Annotated[Literal["ndjson", "csv", "binary", "parquet"],
                                 Query(description="ndjson, csv, binary or parquet")] = "ndjson",
               offset: Annotated[int, Query(ge=0, le=2**62, description="first record")] = 0,
               limit: Annotated[int | None, Query(ge=1, le=2**62,
                                                  description="records at most")] = None
               ) -> StreamingResponse:
    """The result of a completed job, streamed from its file."""
    jobs = jobs_of(request)
    job = jobs.get(job_id)
    media_type, body, rows = jobs.stream(job, format, offset, limit)
    ext = {"ndjson": "ndjson", "csv": "csv", "binary": "bin", "parquet": "parquet"}[format]
    return StreamingResponse(body, media_type=media_type, headers={
        "x-rows": str(rows), "x-total-rows": str(job.result["rows"]),
        "content-disposition": f'attachment; filename="{job.id}-{job.output}.{ext}"'})
