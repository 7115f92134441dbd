"""Near-duplicate jobs on a sharded index (issue 27 item 4, app/jobs.py): each shard joined with
itself and every pair of shards joined, the tasks spread over the shard actors (Ray), their
pairs merged into the job's one ``pairs.part`` ordered by (a, b); clusters and keep-lists then
come from it as for an unsharded index (:meth:`app.jobs.JobManager._finish`).

State read. At start the ingress takes its write lock (no sharded write is between two shards'
copies: one state of the whole index) and every shard actor writes its live items, ids global
and codes as the shard stores them, to ``<job>/shard-<i>/``
(:func:`shardtasks.snapshot_shard`, CRC-checked arrays). Every task reads those copies, so
writes go on and a resumed job reads what it started with. (A shard's folder is reachable from every actor: the sharded index already assumes it.)

Tasks. A task ``(i, j)``, ``i <= j``: ``i == j`` the self-join of shard ``i``
(:func:`index.join.pairs`), else the cross join of shards ``i`` and ``j``
(:func:`index.crossjoin.cross_pairs`). Under ``code_prefix`` a shard holds the ``Q - P`` bits
after its ``P``-bit prefix ``i``: a pair of shards ``i, j`` is at distance
``popcount(i ^ j) + d(suffixes)``, so the task joins the suffixes to radius
``R - popcount(i ^ j)`` (none when negative) and adds ``popcount(i ^ j)`` to every distance;
under ``id_hash`` codes are whole and every task has radius ``R``. Every unordered pair of
items is in exactly one task. A task writes ``tasks/<i>-<j>.part`` (records of
:data:`app.jobs.RECORDS` ``pairs``, ordered by (a, b)), fsyncs it and renames it to
``tasks/<i>-<j>.bin``: a ``.bin`` file is a whole task.

Checkpoint and resume. The finished tasks are the checkpoint: after a restart the job runs the
tasks that have no ``.bin`` only. A task cut by a shard restart is run again (at most
:data:`TASK_ATTEMPTS` times, then the job fails with the reason). Once every task is done the
files are merged (by blocks: :func:`merge_pair_files`) into ``pairs.part``, fsynced, and the
checkpoint says ``min_id = None`` (every pair written), as for an unsharded job.

Cost model: at the job's first run every task is predicted by an actor (:meth:`ShardTasks.
predict`: the shard's :func:`index.join.predict_join`, or the union's for a cross join) and
the predictions kept in the checkpoint; each task runs with its own. The job's prediction
(:func:`job_prediction`): CPU seconds summed, wall seconds the makespan of the tasks over the
actors. Scheduling: the largest task first (work: its predicted CPU seconds; without a model
``n_i (n_i - 1) / 2`` or ``n_i n_j``, the pairs a brute force compares), one task per actor at
a time, to an actor holding one of its shards when one is free. Progress: the fraction of that
work done (finished tasks, and the running tasks' own progress, polled); the remaining time is
the predicted wall time times the fraction left; ``items_done`` is the job's items times the
fraction done (a sharded join does not find the pairs in id order). Cancel: the coordinator
asks every actor running a task of the job to stop it (:meth:`ShardTasks.cancel`).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from bucketsearch.index.errors import JobFailed
from bucketsearch.index.cluster.shards import ShardUnavailable, _get
from bucketsearch.index.cluster.shardtasks import PAIR_RECORD, Task, load_items, task_path
from bucketsearch.index.disk import fsio
from bucketsearch.index.join import JoinCancelled, JoinPrediction, clock

log = logging.getLogger("bucketsearch.app")

#: runs of one task cut by a shard that went away, before the job fails
TASK_ATTEMPTS = 3
#: seconds between two polls of the running tasks' progress (and checks of a cancel)
POLL_S = 0.2
#: records per block of the merge of the task files
MERGE_ROWS = 1 << 18


def plan_tasks(spec: dict, radius: int) -> list[Task]:
    """Every task of a job over shards of ``spec`` (``n``, ``partitioning``, ``sizes``)."""
    n, sizes = int(spec["n"]), [int(s) for s in spec["sizes"]]
    prefix = spec["partitioning"] == "code_prefix"
    tasks = []
    for i in range(n):
        for j in range(i, n):
            offset = bin(i ^ j).count("1") if prefix else 0
            work = sizes[i] * (sizes[i] - 1) / 2 if i == j else sizes[i] * sizes[j]
            if radius - offset >= 0 and work > 0:
                tasks.append(Task(i, j, radius - offset, offset, float(work)))
    return tasks


def _stop_if_cancelled(stats) -> None:
    if stats.cancelled:
        raise JoinCancelled("the join was cancelled")


# ----------------------------------------------------------------------------- merge
def _read_block(path: Path, start: int, rows: int) -> np.ndarray:
    return np.fromfile(path, dtype=PAIR_RECORD, count=rows, offset=start * PAIR_RECORD.itemsize)


def merge_pair_files(paths: list[Path], out_fd: int, out_path: Path, check=None,
                     rows: int = MERGE_ROWS) -> tuple[int, int]:
    """Merge pair files, each ordered by (a, b), no pair in two of them, into ``out_fd`` ordered
    by (a, b), by blocks of ``rows`` records a file: the records up to the smallest last (a, b)
    of a file that has more are final; ``check()`` is called between blocks (a cancel).
    Returns ``(records, bytes)`` written."""
    sizes = [p.stat().st_size // PAIR_RECORD.itemsize for p in paths]
    pos = [0] * len(paths)
    heads = [_read_block(p, 0, rows) for p in paths]
    written = count = 0
    while True:
        if check is not None:
            check()
        frontier = None
        for k, head in enumerate(heads):
            if pos[k] + len(head) < sizes[k] and len(head):
                last = (int(head["a"][-1]), int(head["b"][-1]))
                frontier = last if frontier is None else min(frontier, last)
        parts = []
        for k, head in enumerate(heads):
            if frontier is None:
                cut = len(head)
            else:
                a = head["a"]
                lo = int(np.searchsorted(a, frontier[0], side="left"))
                hi = int(np.searchsorted(a, frontier[0], side="right"))
                cut = lo + int(np.searchsorted(head["b"][lo:hi], frontier[1], side="right"))
            parts.append(head[:cut])
            if cut:
                pos[k] += cut
                heads[k] = np.concatenate([head[cut:], _read_block(paths[k], pos[k] + len(head)
                                                                   - cut, cut)])
        block = np.concatenate(parts) if parts else np.empty(0, PAIR_RECORD)
        if not len(block):
            return count, written
        block = block[np.lexsort((block["b"], block["a"]))]
        fsio.pwrite_all(out_fd, block.tobytes(), written, out_path)
        written += block.nbytes
        count += len(block)


# ----------------------------------------------------------------------------- coordinator
def snapshot(live, job_dir: Path) -> dict:
    """At job start: every shard's items copied to the job (one state of the whole index:
    :meth:`shards.ShardedLive.job_snapshot`); the job's ``shards`` spec."""
    sizes = live.job_snapshot(job_dir)
    return {"n": live.n, "partitioning": live.partitioning, "bits": live.bits,
            "shard_bits": live.shard_bits, "sizes": [int(s) for s in sizes]}


def item_ids(job_dir, spec: dict) -> np.ndarray:
    """Every item id of the job, ascending (the shards' copies, checked)."""
    ids = [load_items(job_dir, i).ids for i in range(int(spec["n"]))]
    return np.sort(np.concatenate(ids)) if ids else np.empty(0, np.int64)


def done_tasks(job_dir, tasks: list[Task]) -> dict:
    """The tasks whose ``.bin`` file is there (whole: renamed after its fsync), with their
    pairs; a file that is not a whole number of records is removed (run again)."""
    out = {}
    for t in tasks:
        path = task_path(job_dir, t.name)
        if path.exists():
            size = path.stat().st_size
            if size % PAIR_RECORD.itemsize:
                log.error("job task file %s has %d bytes, not whole records: run again", path,
                          size)
                fsio.unlink(path)
                continue
            out[t.name] = {"task": t.name, "pairs": size // PAIR_RECORD.itemsize, "bytes": size}
    return out


def run(manager, job, live) -> np.ndarray:
    """Phase 1 of a sharded job (module docstring): the tasks not done yet over the shard
    actors, then their files merged into ``pairs.part``; returns the item ids. Raises
    :class:`~index.join.JoinCancelled` on a cancel or shutdown (the finished tasks stay:
    the checkpoint), :class:`app.jobs.JobFailed` on a limit or a task that keeps failing."""
    folder = manager.folder(job)
    spec = job.shards
    ids = item_ids(folder, spec)
    if job.checkpoint.get("min_id") is None:  # merged before a restart
        return ids
    if live is None or live.shards != spec["n"]:
        raise JobFailed(f"index {job.index!r} is not served over {spec['n']} shards any more")
    tasks = plan_tasks(spec, job.radius)
    stats = job.stats
    stats.items, stats.radius, stats.algorithm = job.items, job.radius, "sharded"
    stats.params = {"shards": spec["n"], "partitioning": spec["partitioning"],
                    "tasks": len(tasks)}
    cap = manager.settings.job_max_result_bytes
    done = done_tasks(folder, tasks)
    preds = _predictions(job, live, tasks, folder)
    if all(preds.get(t.name) for t in tasks):  # the tasks' work: their modeled CPU seconds
        tasks = [replace(t, work=float(preds[t.name]["cpu_seconds"])) for t in tasks]
        stats.prediction = job_prediction(job, tasks, preds, live.n)
        job.prediction = stats.prediction.to_dict()
    total_work = sum(t.work for t in tasks) or 1.0
    retried = _run_tasks(manager, job, live, tasks, done, total_work, cap, preds)
    _stop_if_cancelled(stats)
    size = sum(d["bytes"] for d in done.values())
    if size > cap:
        raise JobFailed(f"the result passes job_max_result_bytes={cap:,} "
                        "(BUCKETSEARCH_JOB_MAX_RESULT_BYTES): use a smaller radius or raise "
                        "the limit")
    t0 = clock()
    path = folder / "pairs.part"
    fd = fsio.open_fd(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        files = [task_path(folder, t.name) for t in tasks if t.name in done]
        count, written = merge_pair_files(files, fd, path, lambda: _stop_if_cancelled(stats))
        fsio.fsync_fd(fd, path)
    finally:
        fsio.close(fd)
    stats.phase("merge", t0)
    job.checkpoint = {"min_id": None, "bytes": written, "pairs": count,
                      "tasks_done": len(done), "tasks": len(tasks)}
    job.live_pairs = count
    manager._save(job)
    for t in tasks:  # merged: the task files are not needed again
        fsio.unlink(task_path(folder, t.name))
    stats.progress, stats.pairs, stats.pairs_emitted = 1.0, count, count
    stats.finished = time.monotonic()
    job.join = {**{k: v for k, v in stats.to_dict().items() if k != "prediction"},
                "tasks": [done[t.name] for t in tasks if t.name in done], "retried": retried}
    return ids


def _predictions(job, live, tasks: list[Task], folder: Path) -> dict:
    """Every task's prediction (:meth:`ShardTasks.predict`), made once by the actors at the
    job's first run and kept in the checkpoint (``predictions``); ``{}`` when a shard is down
    (the job goes on without a model)."""
    preds = dict(job.checkpoint.get("predictions") or {})
    todo = [t for t in tasks if t.name not in preds]
    if todo:
        try:
            made = _get([live.actors[k % live.n].job_predict.remote(str(folder), asdict(t))
                         for k, t in enumerate(todo)], "job prediction")
        except ShardUnavailable as exc:
            log.warning("job %s: no cost prediction (%s)", job.id, exc)
            return {}
        preds.update({t.name: p for t, p in zip(todo, made)})
        job.checkpoint = {**job.checkpoint, "predictions": preds}
    return preds


def job_prediction(job, tasks: list[Task], preds: dict, actors: int):
    """The job's prediction from its tasks': CPU seconds summed; wall seconds the makespan of
    the tasks' predicted wall times, largest first, each to the least busy of ``actors`` (the
    coordinator's schedule); pairs the self-joins' plus each cross join's union minus its two
    sides' self-joins (a union's prediction counts the pairs within the sides too)."""
    load = [0.0] * max(int(actors), 1)
    for t in sorted(tasks, key=lambda t: -preds[t.name]["seconds"]):
        k = load.index(min(load))
        load[k] += preds[t.name]["seconds"]
    selves = {t.i: preds[t.name]["pairs"] for t in tasks if t.i == t.j}
    pairs = sum(preds[t.name]["pairs"] if t.i == t.j else
                max(preds[t.name]["pairs"] - selves.get(t.i, 0) - selves.get(t.j, 0), 0)
                for t in tasks)
    cpu = sum(preds[t.name]["cpu_seconds"] for t in tasks)
    wall = max(load)
    return JoinPrediction(
        algorithm="sharded", params={"tasks": {t.name: round(preds[t.name]["seconds"], 6)
                                               for t in tasks}},
        items=job.items, radius=job.radius, bits=job.bits,
        probes=sum(preds[t.name]["probes"] for t in tasks),
        candidates=sum(preds[t.name]["candidates"] for t in tasks), pairs=float(pairs),
        seconds=wall, phases={"tasks": wall}, alternatives={}, sample=0, cpu_seconds=cpu,
        cpu_phases={"tasks": cpu},
        slowdown=max((preds[t.name]["slowdown"] for t in tasks), default=1.0))


def _run_tasks(manager, job, live, tasks, done, total_work, cap, preds) -> dict:
    """Every task not in ``done`` on the shard actors (one at a time each), the checkpoint
    saved as each ends; a cancel stops the running ones and raises JoinCancelled. Returns the
    tasks run again after a shard went away (name: times)."""
    import ray

    stats, folder = job.stats, str(manager.folder(job))
    pending = sorted((t for t in tasks if t.name not in done), key=lambda t: -t.work)
    by_name = {t.name: t for t in tasks}
    attempts: dict[str, int] = {}
    free = list(range(live.n))
    running: dict = {}  # ref -> (task, actor)
    live_progress: dict = {}
    last_poll = 0.0

    def account() -> None:
        work = sum(by_name[n].work for n in done)
        work += sum(by_name[n].work * p for n, (p, _) in live_progress.items() if n not in done)
        stats.progress = min(work / total_work, 1.0)
        found = sum(d["pairs"] for d in done.values())
        job.live_pairs = found + sum(c for n, (_, c) in live_progress.items() if n not in done)
        stats.pairs = job.live_pairs
        job.live_items_done = int(job.items * stats.progress)

    def stop_running() -> None:
        """Stop the job's running tasks; one that finished meanwhile is recorded (its file is
        whole: a restart would take it anyway)."""
        actors = {a for _, a in running.values()}
        try:
            _get([live.actors[a].job_cancel.remote(job.id) for a in actors], "job cancel")
            ready, _ = ray.wait(list(running), num_returns=len(running), timeout=30)
            for ref in ready:
                res = _get(ref, "job task")
                if not res.get("cancelled"):
                    finished(running[ref][0], res)
        except Exception:  # noqa: BLE001 -- the job stops anyway; the actor's task ends alone
            log.warning("job %s: could not stop every running task", job.id)

    def finished(task: Task, res: dict) -> None:
        done[task.name] = res
        live_progress.pop(task.name, None)
        account()
        job.checkpoint = {**job.checkpoint, "pairs": job.live_pairs, "tasks_done": len(done),
                          "tasks": len(tasks), "items_done": job.live_items_done}
        manager._save(job)

    account()
    job.checkpoint = {**job.checkpoint, "tasks_done": len(done), "tasks": len(tasks)}
    while pending or running:
        if stats.cancelled:
            stop_running()
            raise JoinCancelled("the join was cancelled")
        while pending and free:
            a = free.pop(0)
            own = next((t for t in pending if a in (t.i, t.j)), pending[0])
            pending.remove(own)
            remaining = cap - sum(d["bytes"] for d in done.values())
            ref = live.actors[a].job_task.remote(job.id, folder, {
                "i": own.i, "j": own.j, "radius": own.radius, "offset": own.offset,
                "work": own.work}, max(remaining, 0), cap, preds.get(own.name))
            running[ref] = (own, a)
        ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
        for ref in ready:
            task, a = running.pop(ref)
            free.append(a)
            try:
                res = _get(ref, "job task")
            except ShardUnavailable as exc:
                attempts[task.name] = attempts.get(task.name, 0) + 1
                if attempts[task.name] >= TASK_ATTEMPTS:
                    stop_running()
                    raise JobFailed(f"task {task.name} (shards {task.i} and {task.j}) failed "
                                    f"{TASK_ATTEMPTS} times: {exc}") from None
                log.warning("job %s: task %s cut (%s); run again", job.id, task.name, exc)
                pending.insert(0, task)
                time.sleep(1.0)  # Ray restarts the shard actor meanwhile
                continue
            except ValueError as exc:  # the result cap, or a bad input in the task
                stop_running()
                raise JobFailed(str(exc)) from None
            except Exception:
                stop_running()
                raise
            if res.get("cancelled"):
                if stats.cancelled:
                    continue  # raised at the top of the loop
                pending.insert(0, task)  # cancelled by someone else (never): run again
                continue
            finished(task, res)
        if running and time.monotonic() - last_poll >= 1.0:
            last_poll = time.monotonic()
            try:
                polled = _get([live.actors[a].job_progress.remote(job.id)
                               for a in {a for _, a in running.values()}], "job progress")
                live_progress = {k: v for p in polled for k, v in p.items()}
            except Exception:  # noqa: BLE001 -- progress only; a dead shard shows at its task
                pass
            account()
    account()
    return attempts
