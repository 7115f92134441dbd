"""Near-duplicate jobs on the server (issue 27 item 4): every pair of an index's items within a
radius, their clusters, or the keep-list, computed in the background over one consistent state
of the index, resumable after a restart, downloaded streamed.

A job reads the index's :class:`~index.storage.live.LiveState` at the moment it starts: its live
items (ids, codes) are written to the job's folder first (``items/``, CRC-checked arrays,
:func:`index.storage.store.save_arrays`), and the join (:func:`index.join.pairs`) runs over that
copy, so writes to the index go on meanwhile and a resumed job reads exactly what it started
with. Files, under ``<data_dir>/jobs/<id>/``:

* ``job.json``: the spec and the status, replaced atomically (``fsio.replace_file``);
* ``items/``: the items the job reads;
* ``pairs.part``: the pairs found so far, records ``<i8 a | <i8 b | <i4 d`` (20 bytes) ordered by
  (a, b); valid up to ``checkpoint.bytes``. Before the first pair is written (the ``probe`` and
  ``blocks`` joins search every table first), the checkpoint is the pair search's position
  ``checkpoint.search`` (every :data:`SEARCH_CHECKPOINT_S`: the tables done, the sorted runs made
  durable in ``spill/``, :func:`index.join.pairs` ``on_checkpoint``); a resumed job continues
  the search from there instead of from zero. The join's chunks never split the pairs of one
  ``a``, so after a chunk ending at ``a = A`` is written and fsynced, the checkpoint
  ``{"min_id": A + 1, "bytes", "pairs"}`` is saved; a resumed job truncates the file there and
  runs the join from ``min_id`` (pairs with ``a >= min_id``);
* ``result.bin``: the finished result, written as ``result.part``, fsynced and renamed (then the
  folder fsynced) before the status says ``completed``: pairs (the pairs file itself),
  clusters (``<i8 id | <i8 cluster``: the smallest id of its connected component, every item),
  keep (``<i8 id``: the greedy keep-list, lowest id first). So a file is never presented as a
  result unless it is whole.

States: ``running`` -> ``completed`` | ``failed`` (``reason``) | ``cancelled``. At start-up
(:meth:`JobManager.load`) a job found ``running`` resumes from its checkpoint, or fails with
the reason (its items unreadable, its index deleted); a ``completed`` job whose result file is
missing or of the wrong size is reported ``failed``. Limits: ``jobs_per_index`` jobs running
per index (409 beyond), the result file at most ``job_max_result_bytes`` (the job fails past
it).

A sharded index (``serve --shards N``): every shard copies its items to ``shard-<i>/`` at start
and the join runs as tasks (each shard, every pair of shards) on the shard actors, each task's
pairs a whole file once done (the checkpoint), merged into ``pairs.part``:
:mod:`index.cluster.shardjobs`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bucketsearch.app.joberrors import JobConflict, JobFailed, JobNotFound
from bucketsearch.app.redact import redact
from bucketsearch.index.disk import fsio, store

log = logging.getLogger("bucketsearch.app")

OUTPUTS = ("pairs", "clusters", "keep")
#: result records on disk (little-endian, packed)
RECORDS = {"pairs": np.dtype([("a", "<i8"), ("b", "<i8"), ("d", "<i4")]),
           "clusters": np.dtype([("id", "<i8"), ("cluster", "<i8")]),
           "keep": np.dtype([("id", "<i8")])}
FORMATS = ("ndjson", "csv", "binary", "parquet")
MEDIA_TYPES = {"ndjson": "application/x-ndjson", "csv": "text/csv",
               "binary": "application/octet-stream",
               "parquet": "application/vnd.apache.parquet"}
#: seconds between two checkpoints of a running job (each fsyncs the pairs file and job.json)
CHECKPOINT_S = 1.0
#: seconds between two checkpoints of the pair search, before the first pair is written (each
#: spills and fsyncs the sorted runs found so far)
SEARCH_CHECKPOINT_S = 10.0
#: pairs per chunk of the join (a checkpoint falls between two chunks)
CHUNK_SIZE = 65_536
#: records per block of a streamed download
STREAM_ROWS = 65_536
_ID_RE = re.compile(r"^[0-9a-f]{16}$")



@dataclass
class Job:
    """One job: its spec, status and checkpoint (``job.json``), and while it runs its thread
    and the join's live :class:`~index.join.JoinStats`."""

    id: str
    index: str
    index_folder: str
    radius: int
    output: str
    bits: int
    items: int
    created_at: float
    state: str = "running"
    reason: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    checkpoint: dict = field(default_factory=lambda: {"min_id": 0, "bytes": 0, "pairs": 0})
    result: dict | None = None
    resumed: int = 0
    elapsed_before_s: float = 0.0  # run time of the runs before the last restart
    prediction: dict | None = None
    join: dict | None = None  # the join's figures when it ended: algorithm, phases measured
    # against modeled, counts (index.join.JoinStats.to_dict)
    shards: dict | None = None  # a sharded index's job: n, partitioning, sizes
    # (index/cluster/shardjobs.py)
    # runtime only
    stats: object = field(default=None, repr=False)
    thread: threading.Thread | None = field(default=None, repr=False)
    stop: str | None = field(default=None, repr=False)  # "cancel" or "shutdown"
    live_pairs: int = field(default=0, repr=False)
    live_min_id: int = field(default=0, repr=False)
    live_items_done: int = field(default=0, repr=False)  # a sharded job's (cluster/shardjobs)
    source: object = field(default=None, repr=False)  # the index's live (a sharded job's tasks)

    SAVED = ("id", "index", "index_folder", "radius", "output", "bits", "items", "created_at",
             "state", "reason", "started_at", "finished_at", "checkpoint", "result", "resumed",
             "elapsed_before_s", "prediction", "join", "shards")

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.SAVED}


class JobManager:
    """The server's jobs (one per folder under ``<data_dir>/jobs``) and their threads."""

    def __init__(self, settings):
        self.settings = settings
        self.root = Path(settings.data_dir) / "jobs"
        self.jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.started = 0  # jobs started or resumed since the server started
        self.finished = {state: 0 for state in ("completed", "failed", "cancelled")}

    # ------------------------------------------------------------------------- files
    def folder(self, job: Job) -> Path:
        return self.root / job.id

    def _save(self, job: Job) -> None:
        fsio.replace_file(self.folder(job) / "job.json",
                          json.dumps(job.to_json(), indent=1).encode())

    def result_path(self, job: Job) -> Path:
        return self.folder(job) / "result.bin"

    # ------------------------------------------------------------------------- start-up
    def load(self, registry) -> None:
        """Read every job folder: running jobs resume (or fail with the reason), completed
        ones are checked against their result file. Read-only servers only list them."""
        if not self.root.is_dir():
            if self.settings.read_only:
                return
            self.root.mkdir(parents=True, exist_ok=True)
        for folder in sorted(self.root.iterdir()):
            if not _ID_RE.match(folder.name):
                continue
            try:
                data = json.loads(fsio.read_bytes(folder / "job.json"))
                job = Job(**{k: data[k] for k in Job.SAVED if k in data})
            except (OSError, ValueError, TypeError) as exc:
                log.error("job folder %s unreadable (%s); skipped", folder.name, exc)
                continue
            self.jobs[job.id] = job
            if self.settings.read_only:
                continue
            if job.state == "completed":
                self._check_result(job)
            elif job.state == "running":
                entry = registry.entries.get(job.index)
                if entry is None or entry.folder.name != job.index_folder:
                    self._fail(job, f"index {job.index!r} was deleted while the job ran")
                    continue
                job.resumed += 1
                job.source = entry.live
                self._launch(job)

    def _check_result(self, job: Job) -> None:
        path = self.result_path(job)
        size = path.stat().st_size if path.exists() else None
        if job.result is None or size != job.result.get("bytes"):
            self._fail(job, f"the result file is {'missing' if size is None else 'damaged'} "
                            f"({size} bytes, expected {(job.result or {}).get('bytes')})")

    # ------------------------------------------------------------------------- requests
    def start(self, entry, radius: int, output: str) -> Job:
        """Start a job on ``entry``'s current state: its items are copied to the job folder
        (the state it reads), then the join runs in a thread (a sharded index: every shard's
        items, copied by the shard actors, :mod:`index.cluster.shardjobs`)."""
        if self.settings.read_only:
            raise PermissionError("the server is read-only: jobs run on the writer")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if isinstance(radius, bool) or not isinstance(radius, int) \
                or not 0 <= radius <= entry.bits:
            raise ValueError(f"radius must be in [0, bits={entry.bits}], got {radius!r}")
        with self._lock:
            running = [j for j in self.jobs.values()
                       if j.index == entry.name and j.state == "running"]
            limit = self.settings.jobs_per_index
            if len(running) >= limit:
                raise JobConflict(f"index: index {entry.name!r} has {len(running)} job(s) "
                                  f"running ({', '.join(j.id for j in running)}), the limit "
                                  f"jobs_per_index={limit} (BUCKETSEARCH_JOBS_PER_INDEX); "
                                  "cancel it or wait")
            job = Job(secrets.token_hex(8), entry.name, entry.folder.name, radius, output,
                      entry.bits, 0, time.time())
            self.jobs[job.id] = job  # holds the slot while the items are written
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fsio.mkdir(self.folder(job))
            job.source = entry.live
            if entry.live.shards:
                from bucketsearch.index.cluster import shardjobs
                job.shards = shardjobs.snapshot(entry.live, self.folder(job))
                job.items = sum(job.shards["sizes"])
            else:
                ids, words = entry.live.items()  # one consistent state
                order = np.argsort(ids, kind="stable")
                job.items = len(ids)
                store.save_arrays(self.folder(job) / "items", "job-items",
                                  {"bits": entry.bits, "index": entry.name},
                                  {"ids": ids[order], "words": words[order]})
            self._save(job)
            fsio.fsync_path(self.root)
        except BaseException:
            with self._lock:
                self.jobs.pop(job.id, None)
            shutil.rmtree(self.folder(job), ignore_errors=True)
            raise
        self._launch(job)
        return job

    def get(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise JobNotFound(f"job {job_id!r} not found (GET /v1/jobs lists them)")
        return job

    def list(self, index: str | None = None) -> list[Job]:
        jobs = sorted(self.jobs.values(), key=lambda j: j.created_at)
        return [j for j in jobs if index is None or j.index == index]

    def cancel(self, job_id: str) -> Job:
        """Stop a running job (a finished one is left as it is: cancel is idempotent)."""
        job = self.get(job_id)
        if job.state != "running":
            return job
        job.stop = "cancel"
        if job.stats is not None:
            job.stats.cancel()
        thread = job.thread
        if thread is not None:
            thread.join(30)
        return job

    def delete(self, job_id: str) -> None:
        job = self.get(job_id)
        if job.state == "running":
            raise JobConflict(f"job {job_id!r} is running: cancel it first")
        with self._lock:
            self.jobs.pop(job_id, None)
        fsio.rmtree(self.folder(job))

    def close(self) -> None:
        """At shutdown: stop the running jobs where they are (their checkpoint stays, so they
        resume at the next start) and wait for their threads."""
        self._closed = True
        for job in list(self.jobs.values()):
            if job.state == "running" and job.thread is not None:
                job.stop = job.stop or "shutdown"
                if job.stats is not None:
                    job.stats.cancel()
        for job in list(self.jobs.values()):
            if job.thread is not None:
                job.thread.join(60)

    # ------------------------------------------------------------------------- running
    def _launch(self, job: Job) -> None:
        self.started += 1
        job.started_at = job.started_at or time.time()
        job.thread = threading.Thread(target=self._run, args=(job,), daemon=True,
                                      name=f"job-{job.id}")
        job.thread.start()

    def _fail(self, job: Job, reason: str) -> None:
        job.state, job.reason, job.finished_at = "failed", reason, time.time()
        self.finished["failed"] += 1
        log.error("job %s (index %s) failed: %s", job.id, job.index, reason)
        try:
            self._save(job)
        except OSError as exc:
            log.error("job %s: could not record its failure (%s)", job.id, exc)

    def _run(self, job: Job) -> None:
        from bucketsearch.index.join import JoinCancelled, JoinStats
        t0 = time.monotonic()
        try:
            job.stats = JoinStats()
            if job.stop is not None:  # cancelled or shut down before the thread ran
                job.stats.cancel()
            if job.shards is not None:
                from bucketsearch.index.cluster import shardjobs
                ids = shardjobs.run(self, job, job.source)
            elif job.checkpoint.get("min_id") is None:  # every pair written before a restart
                ids = np.asarray(self._items(job).ids)
            else:
                ids = self._join(job)
            self._finish(job, ids)
            job.state, job.finished_at = "completed", time.time()
            self.finished["completed"] += 1
        except JoinCancelled:
            if job.stop == "shutdown":  # left running: resumes at the next start
                job.elapsed_before_s += time.monotonic() - t0
                self._save_quietly(job)
                return
            job.state, job.finished_at = "cancelled", time.time()
            self.finished["cancelled"] += 1
            self._remove_partial(job)
        except Exception as exc:  # noqa: BLE001 -- any failure is the job's, with its reason
            job.elapsed_before_s += time.monotonic() - t0
            self._remove_partial(job)
            self._fail(job, f"{type(exc).__name__}: {exc}")
            return
        job.elapsed_before_s += time.monotonic() - t0
        self._save_quietly(job)

    def _save_quietly(self, job: Job) -> None:
        try:
            self._save(job)
        except OSError as exc:
            log.error("job %s: job.json not saved (%s)", job.id, exc)

    def _remove_partial(self, job: Job) -> None:
        for name in ("pairs.part", "result.part"):
            (self.folder(job) / name).unlink(missing_ok=True)
        for name in ("spill", "tasks"):
            shutil.rmtree(self.folder(job) / name, ignore_errors=True)

    def _items(self, job: Job):
        """The job's items (CRC-checked): an engine over them for the join."""
        from bucketsearch.index.scan import LinearScan
        _, _, arrays = store.load_arrays(self.folder(job) / "items")
        return LinearScan.of_items_by_id(job.bits, np.ascontiguousarray(arrays["words"]),
                                         np.ascontiguousarray(arrays["ids"]))  # sorted by id

    def _join(self, job: Job) -> np.ndarray:
        """Phase 1: the pairs, appended to ``pairs.part`` from the checkpoint on; returns the
        item ids."""
        from bucketsearch.index.join import pairs
        index = self._items(job)
        path = self.folder(job) / "pairs.part"
        ck = job.checkpoint
        fd = fsio.open_fd(path, os.O_RDWR | os.O_CREAT)
        try:
            fsio.ftruncate(fd, ck["bytes"], path)  # what the checkpoint vouches for
            offset, count, min_id = ck["bytes"], ck["pairs"], ck["min_id"]
            job.live_pairs, job.live_min_id = count, min_id
            cap = self.settings.job_max_result_bytes
            rec = RECORDS["pairs"]
            last_save = time.monotonic()
            spill = self.folder(job) / "spill"
            spill.mkdir(exist_ok=True)
            # no pair written yet: the pair search's position, if one was saved
            resume = ck.get("search") if offset == 0 and min_id == 0 else None

            def searched(position: dict) -> None:  # the runs are durable: save the position
                job.checkpoint = {"min_id": 0, "bytes": 0, "pairs": 0, "search": position}
                self._save(job)

            for chunk in pairs(index, job.radius, min_id=min_id, stats=job.stats,
                               spill_dir=spill, chunk_size=CHUNK_SIZE, resume=resume,
                               on_checkpoint=searched, checkpoint_s=SEARCH_CHECKPOINT_S):
                if not len(chunk):
                    continue
                out = np.empty(len(chunk), dtype=rec)
                out["a"], out["b"], out["d"] = chunk.a, chunk.b, chunk.d
                if offset + out.nbytes > cap:
                    raise JobFailed(f"the result passes job_max_result_bytes={cap:,} "
                                    "(BUCKETSEARCH_JOB_MAX_RESULT_BYTES): use a smaller radius "
                                    "or raise the limit")
                fsio.pwrite_all(fd, out.tobytes(), offset, path)
                offset += out.nbytes
                count += len(chunk)
                job.live_pairs, job.live_min_id = count, chunk.last_a + 1
                if job.prediction is None and job.stats.prediction is not None:
                    job.prediction = job.stats.prediction.to_dict()
                if time.monotonic() - last_save >= CHECKPOINT_S:
                    fsio.fsync_fd(fd, path)
                    job.checkpoint = {"min_id": chunk.last_a + 1, "bytes": offset,
                                      "pairs": count}
                    self._save(job)
                    last_save = time.monotonic()
            fsio.fsync_fd(fd, path)
            job.checkpoint = {"min_id": None, "bytes": offset, "pairs": count}  # all pairs
        finally:
            fsio.close(fd)
        if job.prediction is None and job.stats.prediction is not None:
            job.prediction = job.stats.prediction.to_dict()
        job.join = {k: v for k, v in job.stats.to_dict().items() if k != "prediction"}
        shutil.rmtree(spill, ignore_errors=True)
        return np.asarray(index.ids)

    def _finish(self, job: Job, ids: np.ndarray) -> None:
        """Phase 2: the result file, whole, fsynced, renamed into place."""
        folder = self.folder(job)
        pairs_path, final = folder / "pairs.part", self.result_path(job)
        rec = RECORDS[job.output]
        if not pairs_path.exists() and final.exists():
            # a restart after the rename (and the removal of the pairs), before job.json said
            # completed: the renamed file is whole (fsynced before the rename)
            rows = final.stat().st_size // rec.itemsize
        elif job.output == "pairs":
            rows = job.checkpoint["pairs"]
            fsio.rename(pairs_path, final)
        else:
            from bucketsearch.index.join import components, keep_first
            chunks = _read_pairs(pairs_path)
            if job.output == "clusters":
                comp = components(ids, chunks)
                out = np.empty(len(comp.ids), dtype=RECORDS["clusters"])
                out["id"], out["cluster"] = comp.ids, comp.labels
            else:
                kept = keep_first(ids, chunks)
                out = np.empty(len(kept), dtype=RECORDS["keep"])
                out["id"] = kept
            rows = len(out)
            part = folder / "result.part"
            fsio.write_file(part, out.tobytes())  # fsynced
            fsio.rename(part, final)
            fsio.unlink(pairs_path)
        fsio.fsync_path(folder)
        job.result = {"rows": int(rows), "bytes": final.stat().st_size,
                      "pairs": int(job.checkpoint["pairs"])}

    # ------------------------------------------------------------------------- views
    def info(self, job: Job) -> dict:
        """The job's status: spec, state, progress (items done, pairs so far, elapsed, the
        model's remaining time), the join's measured against modeled per phase, the result."""
        state = job.state  # read once: the runner thread may finish the job meanwhile
        stats = job.stats if state == "running" else None
        running = stats is not None
        elapsed = job.elapsed_before_s + (stats.elapsed_s if running else 0.0)
        min_id = job.live_min_id if running else job.checkpoint.get("min_id")
        if state == "completed" or min_id is None:
            done = job.items
        elif job.shards is not None:  # the fraction of the tasks' work done, of the items
            done = job.live_items_done if running else job.checkpoint.get("items_done", 0)
        else:
            done = self._items_below(job, min_id)
        return {"id": job.id, "index": job.index, "radius": job.radius, "output": job.output,
                "state": state, "reason": redact(job.reason, self.settings),
                "created_at": job.created_at,
                "started_at": job.started_at, "finished_at": job.finished_at,
                "items": job.items, "items_done": done,
                "pairs": job.live_pairs if running else job.checkpoint.get("pairs", 0),
                "elapsed_s": round(elapsed, 3),
                "remaining_s": stats.remaining_s() if running else
                (0.0 if state == "completed" else None),
                "resumed": job.resumed,
                "algorithm": stats.algorithm if running else (job.join or {}).get("algorithm"),
                "phases": stats.phases if running else (job.join or {}).get("phases"),
                "prediction": job.prediction,
                "result": job.result}

    def _items_below(self, job: Job, min_id: int) -> int:
        """Items with id < ``min_id`` (their pairs are all written)."""
        try:
            _, _, arrays = store.load_arrays(self.folder(job) / "items", mmap=True,
                                             verify=False)
            return int(np.searchsorted(arrays["ids"], min_id))
        except (OSError, ValueError, KeyError):
            return 0

    def stream(self, job: Job, fmt: str, offset: int = 0, limit: int | None = None):
        """``(media type, byte generator, rows)`` of rows ``offset .. offset + limit`` of a
        completed job's result in ``fmt`` (module docstring: records)."""
        if job.state != "completed":
            raise JobConflict(f"job {job.id!r} is {job.state}: a result is served only once "
                              "the job has completed" + (f" ({job.reason})" if job.reason
                                                         else ""))
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        if fmt == "parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise ValueError("format: parquet needs pyarrow, which this server does not "
                                 "have; use ndjson, csv or binary") from None
        rec = RECORDS[job.output]
        total = job.result["rows"]
        start = min(max(int(offset), 0), total)
        stop = total if limit is None else min(total, start + int(limit))
        file = fsio.open_read(self.result_path(job))  # opened now: a delete cannot cut it short

        def blocks():
            with file:
                file.seek(start * rec.itemsize)
                for s in range(start, stop, STREAM_ROWS):
                    n = min(STREAM_ROWS, stop - s)
                    data = np.frombuffer(file.read(n * rec.itemsize), dtype=rec)
                    if len(data) != n:
                        raise OSError(f"job {job.id}: result file shorter than recorded")
                    yield data

        if fmt == "parquet":
            return MEDIA_TYPES[fmt], _parquet(blocks(), rec), stop - start
        return MEDIA_TYPES[fmt], _encoded(blocks(), fmt, rec, first=start == 0), stop - start


def _read_pairs(path: Path, rows: int = 1 << 20):
    """The pairs file as ``(a, b, d)`` chunks (ordered by a)."""
    rec = RECORDS["pairs"]
    with fsio.open_read(path) as f:
        while data := f.read(rows * rec.itemsize):
            arr = np.frombuffer(data, dtype=rec)
            yield arr["a"].astype(np.int64), arr["b"].astype(np.int64), arr["d"].astype(np.int32)


def _encoded(blocks, fmt: str, rec: np.dtype, first: bool):
    """Bytes of record blocks as NDJSON lines, CSV (a header row on the first page) or the
    raw little-endian records."""
    names = rec.names
    if fmt == "csv" and first:
        yield (",".join(names) + "\n").encode()
    for data in blocks:
        if fmt == "binary":
            yield data.tobytes()
            continue
        cols = [data[n].tolist() for n in names]
        if fmt == "csv":
            line = ",".join("{}" for _ in names) + "\n"
        else:
            line = "{{" + ",".join(f'"{n}":{{}}' for n in names) + "}}\n"
        yield "".join(line.format(*row) for row in zip(*cols)).encode()


def _parquet(blocks, rec: np.dtype):  # pragma: no cover -- pyarrow is not installed here
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    sink = io.BytesIO()
    writer = None
    for data in blocks:
        table = pa.table({n: data[n] for n in rec.names})
        writer = writer or pq.ParquetWriter(sink, table.schema)
        writer.write_table(table)
    if writer is not None:
        writer.close()
    yield sink.getvalue()
