"""One shard of a sharded index (shards.py): :class:`ShardServer`, a
:class:`~bucketsearch.index.storage.live.LiveIndex` in its own directory, run as a Ray actor; its
errors cross Ray as :class:`ShardError` and are raised again as their own kind in the ingress."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from bucketsearch.index.cluster.shardtasks import ShardTasks, snapshot_shard
from bucketsearch.index.probe import ProbeLimitError, ResultLimitError
from bucketsearch.index.storage.live import DuplicateIdError


class ShardError(Exception):
    """An error raised in a shard, in a form that crosses Ray (pickled by its args): the
    engine's limit errors and any exception that does not pickle. :func:`_get` raises the
    original kind again in the ingress."""

    def __init__(self, kind: str, fields: dict, message: str):
        super().__init__(kind, fields, message)
        self.kind, self.fields, self.message = kind, fields, message

    def rebuild(self) -> BaseException:
        f = self.fields
        if self.kind == "probe":
            return ProbeLimitError(f["probes"], f["limit"], f["radius"], f["bits"])
        if self.kind == "result":
            return ResultLimitError(f["limit"], f["reached"])
        for base in (DuplicateIdError, PermissionError, OSError, ValueError, LookupError):
            if base.__name__ == self.kind:
                return base(self.message)
        return RuntimeError(self.message)


def _portable(method):
    """Raise what ``method`` raises as something that unpickles (see :class:`ShardError`)."""
    import functools
    import pickle

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except ProbeLimitError as exc:
            raise ShardError("probe", {"probes": int(exc.probes), "limit": int(exc.limit),
                                       "radius": None if exc.radius is None else int(exc.radius),
                                       "bits": self.live.bits}, str(exc)) from None
        except ResultLimitError as exc:
            raise ShardError("result", {"limit": exc.limit, "reached": exc.reached},
                             str(exc)) from None
        except Exception as exc:
            try:
                pickle.loads(pickle.dumps(exc))
            except Exception:  # noqa: BLE001 -- sent as its nearest plain kind
                kind = next((b.__name__ for b in (DuplicateIdError, PermissionError, OSError,
                                                  ValueError, LookupError)
                             if isinstance(exc, b)), "RuntimeError")
                raise ShardError(kind, {}, f"{type(exc).__name__}: {exc}") from None
            raise
    return wrapped


class ShardServer:
    """One shard: a :class:`LiveIndex` in its own directory (own WAL, snapshots), in a Ray actor
    process. Every method returns numpy arrays (moved through Ray's object store)."""

    def __init__(self, folder: str, bits: int, mode: str, substrings, max_probes: int,
                 merge_threshold: int, threads: int = 1, replica: bool = False,
                 follow_interval_s: float = 0.2):
        import numba

        from bucketsearch.index.storage.live import LiveIndex
        threads = max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS))
        os.environ["BUCKETSEARCH_THREADS"] = str(threads)
        numba.set_num_threads(threads)
        Path(folder).mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        # a replica: a read-only follower of the shard's directory (index/storage/follow.py),
        # as the one-machine read-only workers are; it applies the primary's committed records
        self.live = LiveIndex(folder, bits, mode, substrings, max_probes=max_probes,
                              merge_threshold=merge_threshold, read_only=replica,
                              background_merge=not replica)
        self.opened_s = time.perf_counter() - t
        self.folder, self._plan = folder, None
        self._tasks = ShardTasks()  # near-duplicate job tasks running here (shardtasks.py)
        self.pid = os.getpid()
        self.follow_error = None
        if replica:
            self._stop = threading.Event()
            threading.Thread(target=self._follow, args=(follow_interval_s,), daemon=True,
                             name="follow-primary").start()

    def _follow(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.live.catch_up()
                self.follow_error = None
            except Exception as exc:  # noqa: BLE001 -- retried at the next round
                self.follow_error = f"{type(exc).__name__}: {exc}"

    def lag(self) -> dict:
        """A replica's staleness: its applied position and ``lag_ms`` bound."""
        applied = self.live.applied
        return {"pid": self.pid, "applied_lsn": applied.lsn, "applied": list(applied[:2]),
                "lag_ms": round(self.live.lag_ms, 1), "follow_error": self.follow_error}

    def position(self) -> list[int]:
        """The log position ``[segment, offset]`` this shard has applied (its replicas have
        applied a write once they reach it: :meth:`lag`)."""
        return list(self.live.applied[:2])

    def ping(self) -> int:
        return self.pid

    def counts(self) -> dict:
        """The cheap part of :meth:`summary` (sent back with every write)."""
        live, view = self.live, self.live.view()
        return {"pid": self.pid, **view.sizes().info(), "next_id": view.next_id,
                "mode": live.mode, "substrings": view.substrings or live.substrings,
                "failed": live.failed, "merging": live.merging,
                "merge_status": live.merge_status, "merges": live.merges,
                "last_merge": live.last_merge, "last_merge_error": live.last_merge_error}

    @_portable
    def write(self, delete_ids, words, ids, add: bool = False):
        """This shard's part of a sharded write (or of its undo): delete ``delete_ids``, then
        add (``add``: refused for an id already live) or upsert ``words`` with ``ids``; each
        step one fsynced log record. Without ``add`` it is idempotent: an undo sent twice, or
        to a shard that never applied the write, leaves the same state. Returns the counts."""
        if len(delete_ids):
            self.live.delete(delete_ids)
        if len(ids):
            (self.live.add if add else self.live.upsert)(words, ids)
        self._fault_point("reply")
        return self.counts()

    # ------------------------------------------------------------------ fault injection
    def inject_kill(self, at: int, ops=()) -> None:
        """Tests: SIGKILL this shard's process at the ``at``-th of its next steps of ``ops``
        (default all): its storage calls (``bucketsearch.index.storage.fsio``: open, write, fsync,
        ...) and ``"reply"``, the end of a write before its answer. A restarted actor has none."""
        from bucketsearch.index.disk import fsio
        self.clear_fault()
        self._plan = fsio.FaultPlan(at=int(at), ops=tuple(ops), kill=True)
        self._installed = fsio.inject(self._plan)  # beneath every storage call of the actor
        self._installed.__enter__()

    def clear_fault(self) -> int:
        """Tests: remove the plan of :meth:`inject_kill`; returns the steps it counted."""
        plan, self._plan = self._plan, None
        if plan is None:
            return 0
        self._installed.__exit__(None, None, None)
        return plan.calls

    def _fault_point(self, op: str) -> None:
        if self._plan is not None:
            self._plan(op, self.folder)

    @_portable
    def get(self, ids):
        return self.live.get(ids)

    @_portable
    def range_groups(self, groups, stats: bool, max_probes, max_results):
        """Radius searches of several query groups (``[(xq, radius), ...]``), one state."""
        view = self.live.view()
        return [view.range_search(xq, r, stats, max_probes, max_results) for xq, r in groups]

    @_portable
    def knn_groups(self, groups, k: int, stats: bool, max_probes):
        """k-NN of several query groups (``[(xq, max_distance), ...]``), one state."""
        view = self.live.view()
        return [view.search(xq, k, r, stats, max_probes) for xq, r in groups]

    def probe_count(self, radius: int, nq: int, max_probes) -> int:
        return self.live.view().probe_count(radius, nq, max_probes)

    @_portable
    def merge(self) -> bool:
        return self.live.merge()

    @_portable
    def set_mode(self, mode: str, substrings) -> bool:
        return self.live.set_mode(mode, substrings)

    def items(self):
        return self.live.items()

    # ------------------------------------------ near-duplicate jobs (shardjobs.py, shardtasks)
    @_portable
    def job_snapshot(self, folder: str) -> int:
        return snapshot_shard(self.live, folder)

    @_portable
    def job_task(self, job_id: str, job_dir: str, task: dict, max_bytes: int, cap: int,
                 prediction: dict | None = None) -> dict:
        """One task of a sharded job (:meth:`shardtasks.ShardTasks.run`)."""
        return self._tasks.run(job_id, job_dir, task, max_bytes, cap, prediction)

    @_portable
    def job_predict(self, job_dir: str, task: dict) -> dict | None:
        """The cost model's prediction of a task (:meth:`shardtasks.ShardTasks.predict`)."""
        return self._tasks.predict(job_dir, task)

    def job_cancel(self, job_id: str) -> int:
        return self._tasks.cancel(job_id)

    def job_progress(self, job_id: str) -> dict:
        return self._tasks.progress(job_id)

    def summary(self) -> dict:
        info = self.live.info()
        return {**self.counts(),
                "applied_lsn": info["applied_lsn"], "distinct_codes": info["distinct_codes"],
                "histogram": {b["size"]: b["buckets"] for b in info["bucket_size_histogram"]},
                "memory_bytes": info["memory_bytes"], "max_probes": int(self.live.max_probes),
                "opened_s": round(self.opened_s, 3)}

    def close(self) -> None:
        self.live.close()
