"""The shard actor's side of a near-duplicate job on a sharded index (shardjobs.py: the
layout, the tasks and the coordinator): the copy of a shard's items, and the tasks a shard
actor runs (:class:`ShardTasks`: run, predict, cancel, progress), each into its own file."""
from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bucketsearch.index.disk import fsio, store
from bucketsearch.index.storage.layout import shard_folder

#: a pair on disk: the records of ``app.jobs.RECORDS["pairs"]``
PAIR_RECORD = np.dtype([("a", "<i8"), ("b", "<i8"), ("d", "<i4")])


@dataclass(frozen=True)
class Items:
    """The items one task side reads (what :func:`index.join.live_items` takes)."""

    bits: int
    ids: np.ndarray
    words: np.ndarray


@dataclass(frozen=True)
class Task:
    """The join of shards ``i <= j`` at ``radius`` (suffix codes), distances plus ``offset``."""

    i: int
    j: int
    radius: int
    offset: int
    work: float

    @property
    def name(self) -> str:
        return f"{self.i}-{self.j}"




def task_path(job_dir, task_name: str, suffix: str = ".bin") -> Path:
    return Path(job_dir) / "tasks" / f"{task_name}{suffix}"


def snapshot_shard(live, folder: str) -> int:
    """A shard's live items (one state), ordered by id, written to ``folder``; their count."""
    ids, words = live.items()
    order = np.argsort(ids, kind="stable")
    store.save_arrays(Path(folder), "job-items", {"bits": live.bits},
                      {"ids": np.asarray(ids)[order], "words": np.asarray(words)[order]})
    return int(len(ids))


def load_items(job_dir, i: int, verify: bool = True) -> Items:
    _, meta, arrays = store.load_arrays(shard_folder(job_dir, i), verify=verify)
    return Items(int(meta["bits"]), np.ascontiguousarray(arrays["ids"]),
                 np.ascontiguousarray(arrays["words"]))


class ShardTasks:
    """A shard actor's running job tasks (by job id), so that another call can cancel them or
    read their progress while they run (the actor serves several calls at once)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running: dict[str, dict] = {}  # job id -> {task name: JoinStats}

    def predict(self, job_dir: str, task: dict) -> dict | None:
        """The cost model's prediction of one task (``JoinPrediction.to_dict``): the shard's
        self-join, or the cross join by ``union`` (:func:`index.crossjoin.predict_cross`);
        None when not modeled."""
        from bucketsearch.index.crossjoin import predict_cross
        from bucketsearch.index.join import predict_join
        t = Task(**task)
        left = load_items(job_dir, t.i)
        pred = predict_join(left, t.radius) if t.i == t.j else \
            predict_cross(left, load_items(job_dir, t.j), t.radius)
        return None if pred is None else pred.to_dict()

    def run(self, job_id: str, job_dir: str, task: dict, max_bytes: int, cap: int,
            prediction: dict | None = None) -> dict:
        """Run one task (:class:`Task` as a dict) into its ``.bin`` file (module docstring),
        at most ``max_bytes`` (what the result cap ``cap`` leaves), with its ``prediction``
        (:meth:`predict`) when made; returns its figures, or ``{"cancelled": True}``."""
        from bucketsearch.index.crossjoin import cross_pairs
        from bucketsearch.index.join import JoinCancelled, JoinPrediction, JoinStats, pairs
        t = Task(**task)
        pred = None if prediction is None else JoinPrediction(**prediction)
        stats = JoinStats()
        with self._lock:
            self._running.setdefault(job_id, {})[t.name] = stats
        part, final = task_path(job_dir, t.name, ".part"), task_path(job_dir, t.name)
        spill = task_path(job_dir, t.name, ".spill")
        t0 = time.perf_counter()
        try:
            part.parent.mkdir(parents=True, exist_ok=True)
            spill.mkdir(exist_ok=True)
            left = load_items(job_dir, t.i)
            if t.i == t.j:
                chunks = pairs(left, t.radius, stats=stats, spill_dir=spill, prediction=pred)
            else:
                chunks = cross_pairs(left, load_items(job_dir, t.j), t.radius, stats=stats,
                                     spill_dir=spill, prediction=pred)
            count = _write_pairs(part, chunks, t.offset, max_bytes, cap)
            fsio.rename(part, final)
            fsio.fsync_path(final.parent)
        except JoinCancelled:
            part.unlink(missing_ok=True)
            return {"cancelled": True}
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        finally:
            shutil.rmtree(spill, ignore_errors=True)
            with self._lock:
                tasks = self._running.get(job_id, {})
                tasks.pop(t.name, None)
                if not tasks:
                    self._running.pop(job_id, None)
        pred = stats.prediction
        return {"task": t.name, "pairs": count, "bytes": count * PAIR_RECORD.itemsize,
                "algorithm": stats.algorithm, "seconds": round(time.perf_counter() - t0, 6),
                "phases": stats.phases, "pid": os.getpid(),
                "modeled_s": None if pred is None else pred.seconds}

    def cancel(self, job_id: str) -> int:
        with self._lock:
            tasks = list(self._running.get(job_id, {}).values())
        for stats in tasks:
            stats.cancel()
        return len(tasks)

    def progress(self, job_id: str) -> dict:
        """``{task name: [progress, pairs found]}`` of the job's running tasks."""
        with self._lock:
            tasks = dict(self._running.get(job_id, {}))
        return {name: [float(s.progress), int(s.pairs)] for name, s in tasks.items()}


def _write_pairs(path: Path, chunks, offset: int, max_bytes: int, cap: int) -> int:
    """The chunks' pairs (distance plus ``offset``) as records in ``path``, fsynced; raises
    ValueError past ``max_bytes`` (the job's result cap ``cap`` named). Returns the pairs
    written."""
    fd = fsio.open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    pos = count = 0
    try:
        for chunk in chunks:
            if not len(chunk):
                continue
            out = np.empty(len(chunk), dtype=PAIR_RECORD)
            out["a"], out["b"], out["d"] = chunk.a, chunk.b, chunk.d + offset
            if pos + out.nbytes > max_bytes:
                raise ValueError(f"the result passes job_max_result_bytes={cap:,} "
                                 "(BUCKETSEARCH_JOB_MAX_RESULT_BYTES): use a smaller radius or "
                                 "raise the limit")
            fsio.pwrite_all(fd, out.tobytes(), pos, path)
            pos += out.nbytes
            count += len(out)
        fsio.fsync_fd(fd, path)
    finally:
        fsio.close(fd)
    return count
