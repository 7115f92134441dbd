"""Near-duplicate jobs on a sharded index (issue 27 item 4, index/cluster): 2 shard actors on a
local Ray, both partitionings, main + pending delta + deletes.

* pairs, clusters and keep-lists equal brute force and an unsharded index's job on the same
  items; writes after the start do not reach the job; the tasks ran on the shard actors;
* cancel; a result cap; a shard actor killed during a task (the task runs again);
* a restart (the manager shut down mid-job, a new one loads it): the finished tasks are kept and
  the job completes exactly; an index no longer sharded: the job fails with the reason;
* ``serve --shards 2`` SIGKILLed during a job: after the restart the job completes exactly or
  failed with its reason, and a result is never served before it is whole.
"""
from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import naive
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from helpers import ShardedServer, add_codes, app_settings, create_index, kill_left, ray_processes

from bucketsearch.index.cluster import shardjobs, shardtasks
from bucketsearch.app.jobs import RECORDS, JobManager
from bucketsearch.index.codes import pack_bits
from bucketsearch.index.disk import fsio
from bucketsearch.index.storage.live import LiveIndex

ray = pytest.importorskip("ray")
shards = pytest.importorskip("bucketsearch.index.cluster.shards")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # slow: make test-long
BITS = 32


def planted(rng, n, bits=BITS, dup_every=4):
    rows = rng.integers(0, 2, size=(n, bits), dtype=np.uint8)
    for i in range(dup_every, n, dup_every):  # planted near-duplicates
        rows[i] = rows[int(rng.integers(0, i))]
        rows[i, rng.integers(0, bits, size=int(rng.integers(0, 4)))] ^= 1
    return pack_bits(rows)


def fill(target, rng, n=260):
    """Items written as to an index in use: a merged main, deletes, a pending delta."""
    words = planted(rng, n)
    ids = rng.permutation(10 * n)[:n].astype(np.int64)
    half = n * 2 // 3
    target.add(words[:half], ids[:half])
    target.merge()
    target.add(words[half:], ids[half:])
    target.delete(ids[rng.random(n) < 0.15])
    target.upsert(planted(rng, 5), ids[:5])  # replaced codes: in the delta, old ones dead


def expected(live, radius):
    ids, words = live.items()
    order = np.argsort(ids)
    ids, words = ids[order], words[order]
    pairs = naive.join_pairs(ids, words, BITS, radius)
    return {"pairs": pairs, "clusters": list(zip(*naive.components(ids, pairs))),
            "keep": [(int(i),) for i in naive.keep_first(ids, pairs)]}


def rows(manager, job):
    data = np.fromfile(manager.result_path(job), dtype=RECORDS[job.output])
    return [tuple(int(x) for x in r) for r in data.tolist()]


def entry_of(name, folder, live):
    return SimpleNamespace(name=name, folder=folder, bits=BITS, live=live)


def wait(job, timeout=300):
    deadline = time.monotonic() + timeout
    while job.state == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    if job.thread is not None:
        job.thread.join(30)
    return job


@settings(max_examples=80, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
@given(pairs=st.sets(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=120),
       files=st.integers(1, 5), rows=st.integers(1, 7), seed=st.integers(0, 2**31))
def test_merge_of_task_files_equals_a_sort(tmp_path_factory, pairs, files, rows, seed):
    """Pair files (each ordered by (a, b), no pair in two) merged by blocks of ``rows`` records:
    the records of all of them sorted by (a, b) (the twin: one sort)."""
    folder = tmp_path_factory.mktemp("merge")
    rng = np.random.default_rng(seed)
    recs = np.array([(a, b, (a * 7 + b) % 5) for a, b in pairs],
                    dtype=RECORDS["pairs"]) if pairs else np.empty(0, RECORDS["pairs"])
    owner = rng.integers(0, files, size=len(recs))
    paths = []
    for f in range(files):
        part = recs[owner == f]
        part = part[np.lexsort((part["b"], part["a"]))]
        paths.append(folder / f"t{f}.bin")
        part.tofile(paths[-1])
    out = folder / "out.bin"
    fd = fsio.open_fd(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        count, written = shardjobs.merge_pair_files(paths, fd, out, rows=rows)
    finally:
        fsio.close(fd)
    got = np.fromfile(out, dtype=RECORDS["pairs"])
    assert (count, written) == (len(recs), recs.nbytes)
    assert got.tolist() == recs[np.lexsort((recs["b"], recs["a"]))].tolist()


@pytest.fixture(scope="module", params=shards.PARTITIONINGS)
def sharded(request, ray_local, tmp_path_factory):
    """A 2-shard index of each partitioning, filled once; delta pending (merge threshold high)."""
    root = tmp_path_factory.mktemp(request.param)
    live = shards.ShardedLive(root / "idx", BITS, "single", None, 2, request.param,
                              max_probes=10**7, merge_threshold=10**6)
    fill(live, np.random.default_rng(5))
    live.refresh()
    yield request.param, root, live
    live.close()


@pytest.mark.parametrize("radius", [0, 3, 6])
def test_sharded_jobs_equal_brute_force_and_an_unsharded_index(sharded, tmp_path, radius):
    partitioning, root, live = sharded
    assert live.sizes().delta_size and live.sizes().tombstoned  # a pending delta, deletes
    ref = LiveIndex(tmp_path / "ref", BITS, "single", max_probes=10**7, merge_threshold=10**6)
    fill(ref, np.random.default_rng(5))  # the same writes, one process
    manager = JobManager(app_settings(tmp_path / "data"))
    entry = entry_of("s", root / "idx", live)
    want = expected(live, radius)
    assert want == expected(ref, radius)
    try:
        for output in ("pairs", "clusters", "keep"):
            job = wait(manager.start(entry, radius, output))
            assert job.state == "completed", job.reason
            assert rows(manager, job) == want[output], output
            info = manager.info(job)
            assert info["items"] == info["items_done"] == ref.ntotal
            assert info["pairs"] == len(want["pairs"]) and info["algorithm"] == "sharded"
            tasks = shardjobs.plan_tasks(job.shards, radius)
            assert [t["task"] for t in job.join["tasks"]] == [t.name for t in tasks]
            assert sum(t["pairs"] for t in job.join["tasks"]) == len(want["pairs"])
            assert job.join["params"] == {"shards": 2, "partitioning": partitioning,
                                          "tasks": len(tasks)}
            # the model: every task predicted, the job's wall time their makespan on 2 actors
            pred = info["prediction"]
            assert pred["algorithm"] == "sharded" and pred["seconds"] > 0
            assert set(pred["params"]["tasks"]) == {t.name for t in tasks}
            assert pred["seconds"] <= sum(pred["params"]["tasks"].values()) + 1e-9
            assert info["remaining_s"] == 0.0
            # the same job on the unsharded index: the same file
            other = wait(manager.start(entry_of("u", tmp_path / "ref", ref), radius, output))
            assert other.state == "completed"
            assert manager.result_path(other).read_bytes() == \
                manager.result_path(job).read_bytes()
        pids = {t["pid"] for t in job.join["tasks"]}
        assert pids <= {s["pid"] for s in live.refresh()}  # ran in the shard actors
    finally:
        manager.close()
        ref.close()


def test_writes_after_the_start_do_not_reach_the_job(ray_local, tmp_path):
    live = shards.ShardedLive(tmp_path / "idx", BITS, "single", None, 2, "id_hash",
                              max_probes=10**7, merge_threshold=10**6)
    manager = JobManager(app_settings(tmp_path / "data"))
    try:
        empty = wait(manager.start(entry_of("w", tmp_path / "idx", live), 4, "clusters"))
        assert empty.state == "completed" and rows(manager, empty) == []  # no items, no task
        fill(live, np.random.default_rng(9))
        want = expected(live, 4)
        job = manager.start(entry_of("w", tmp_path / "idx", live), 4, "pairs")
        ids, words = live.items()
        live.delete(ids[: len(ids) // 2])
        live.add(words[:50], np.arange(10**6, 10**6 + 50))
        assert wait(job).state == "completed"
        assert rows(manager, job) == want["pairs"]
    finally:
        manager.close()
        live.close()


def big(ray_local, tmp_path, n=60_000, partitioning="id_hash"):
    """An index whose radius-8 job on 32 bits takes seconds (a uniform scan-like join)."""
    live = shards.ShardedLive(tmp_path / "big", BITS, "single", None, 2, partitioning,
                              max_probes=10**7, merge_threshold=10**7)
    rng = np.random.default_rng(1)
    live.add(rng.integers(0, 2**32, size=(n, 1), dtype=np.uint64), np.arange(n))
    return live


def test_cancel_and_the_result_cap(ray_local, tmp_path):
    live = big(ray_local, tmp_path)
    manager = JobManager(app_settings(tmp_path / "data"))
    try:
        job = manager.start(entry_of("b", tmp_path / "big", live), 8, "pairs")
        time.sleep(1.0)
        manager.cancel(job.id)
        assert wait(job).state == "cancelled"
        assert not manager.result_path(job).exists()
        assert not (manager.folder(job) / "tasks").exists()
        assert shardtasks.ShardTasks().progress(job.id) == {}
        # nothing of the job runs in the actors any more
        assert all(p == {} for p in ray.get([a.job_progress.remote(job.id)
                                             for a in live.actors]))
        small = JobManager(app_settings(tmp_path / "data2", job_max_result_bytes=2000))
        capped = wait(small.start(entry_of("b", tmp_path / "big", live), 8, "pairs"))
        assert capped.state == "failed" and "job_max_result_bytes=2,000" in capped.reason
        assert not small.result_path(capped).exists()
        small.close()
    finally:
        manager.close()
        live.close()


def test_a_shard_killed_during_a_task_runs_it_again(ray_local, tmp_path):
    live = big(ray_local, tmp_path, n=30_000, partitioning="code_prefix")
    manager = JobManager(app_settings(tmp_path / "data"))
    try:
        # a task that ends between the progress read and the kill is not cut (CI saw it once):
        # the kill waits for a task in its first half, and the job is run again, at most 3
        # times, until a cut task has run again
        for attempt in range(3):
            job = manager.start(entry_of("b", tmp_path / "big", live), 5, "keep")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and job.state == "running" and not any(
                    progress < 0.5 for progress, _ in ray.get(
                        live.actors[0].job_progress.remote(job.id)).values()):
                time.sleep(0.005)
            ray.kill(live.actors[0], no_restart=False)  # Ray restarts it; its task is cut
            assert wait(job).state == "completed", job.reason
            if sum(job.join["retried"].values()) >= 1:
                break
        assert sum(job.join["retried"].values()) >= 1, "no task was cut in 3 kills"
        ids, words = live.items()
        order = np.argsort(ids)
        ref = LiveIndex(tmp_path / "ref", BITS, "single", max_probes=10**7)
        ref.add(words[order], ids[order])
        other = wait(manager.start(entry_of("u", tmp_path / "ref", ref), 5, "keep"))
        assert manager.result_path(other).read_bytes() == manager.result_path(job).read_bytes()
        ref.close()
    finally:
        manager.close()
        live.close()


def test_a_restart_resumes_from_the_finished_tasks(ray_local, tmp_path):
    live = big(ray_local, tmp_path, n=40_000, partitioning="code_prefix")
    settings = app_settings(tmp_path / "data")
    entry = entry_of("b", tmp_path / "big", live)
    first = JobManager(settings)
    job = first.start(entry, 6, "clusters")
    deadline = time.monotonic() + 120
    while job.state == "running" and job.checkpoint.get("tasks_done", 0) < 1 \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    progress = first.info(job)  # progress: the finished tasks' work, their pairs
    first.close()  # a shutdown mid-job: job.json says running, the finished tasks stay
    saved = json.loads((first.folder(job) / "job.json").read_text())
    try:
        if saved["state"] != "running":
            pytest.skip("the job finished before the shutdown (machine too fast)")
        assert progress["state"] == "running" and progress["algorithm"] == "sharded"
        assert 0 < progress["items_done"] < progress["items"] and progress["pairs"] > 0
        assert 0 < progress["remaining_s"] < progress["prediction"]["seconds"]
        kept = saved["checkpoint"]["tasks_done"]
        assert kept >= 1 and len(list((first.folder(job) / "tasks").glob("*.bin"))) == kept
        assert not first.result_path(job).exists()
        second = JobManager(settings)
        second.load(SimpleNamespace(entries={"b": entry}))
        resumed = wait(second.get(job.id))
        assert resumed.state == "completed" and resumed.resumed == 1, resumed.reason
        ref = LiveIndex(tmp_path / "ref", BITS, "single", max_probes=10**7)
        ids, words = live.items()
        ref.add(words, ids)
        other = wait(second.start(entry_of("u", tmp_path / "ref", ref), 6, "clusters"))
        assert second.result_path(other).read_bytes() == \
            second.result_path(resumed).read_bytes()
        ref.close()
        second.close()
        # the same restart onto an index no longer sharded: failed, with the reason
        job2 = JobManager(settings).start(entry, 6, "pairs")
        job2_folder = first.root / job2.id
        wait(job2)
        data = json.loads((job2_folder / "job.json").read_text())
        data.update(state="running", checkpoint={"min_id": 0, "bytes": 0, "pairs": 0},
                    result=None)
        (job2_folder / "job.json").write_text(json.dumps(data))
        (job2_folder / "result.bin").unlink()
        third = JobManager(settings)
        third.load(SimpleNamespace(entries={"b": entry_of("b", tmp_path / "big", ref)}))
        failed = wait(third.get(job2.id))
        assert failed.state == "failed" and "not served over 2 shards" in failed.reason
        third.close()
    finally:
        live.close()


def test_a_sharded_server_killed_mid_job(tmp_path):
    """``serve --shards 2``: a job started, the server SIGKILLed during it, started again: the
    job completes with the exact pairs (or failed with its reason); no result before."""
    server = ShardedServer(tmp_path / "data", {"BUCKETSEARCH_CALIBRATION_QUERIES": "0"},
                           command="serve")
    server.start(timeout=300)
    rng = np.random.default_rng(4)
    n = 40_000
    words = rng.integers(0, 2**32, size=(n, 1), dtype=np.uint64)
    try:
        with server.client() as c:
            create_index(c, "k", BITS, mode="single", partitioning="code_prefix")
            for s in range(0, n, 10_000):
                add_codes(c, "k", range(s, s + 10_000), words[s:s + 10_000], BITS)
            r = c.post("/v1/jobs", json={"index": "k", "radius": 6, "output": "pairs"})
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            time.sleep(1.5)
            mid = c.get(f"/v1/jobs/{job_id}").json()
            if mid["state"] == "running":
                assert c.get(f"/v1/jobs/{job_id}/result").status_code == 409
        procs = ray_processes(server.pid)
        server.kill()
        kill_left(procs)  # Ray's agents, orphaned, would exit a minute later
        folder = tmp_path / "data" / "jobs" / job_id
        saved = json.loads((folder / "job.json").read_text())
        assert (saved["state"] == "completed") == (folder / "result.bin").exists()
        server.start(timeout=300)
        with server.client() as c:
            deadline = time.monotonic() + 400
            while True:
                info = c.get(f"/v1/jobs/{job_id}").json()
                if info["state"] != "running" or time.monotonic() > deadline:
                    break
                assert c.get(f"/v1/jobs/{job_id}/result").status_code == 409
                time.sleep(0.2)
            if info["state"] == "failed":
                assert info["reason"]
                assert c.get(f"/v1/jobs/{job_id}/result").status_code == 409
                return
            assert info["state"] == "completed", info
            assert info["resumed"] == (saved["state"] == "running")
            r = c.get(f"/v1/jobs/{job_id}/result", params={"format": "binary"})
            got = np.frombuffer(r.content, dtype=RECORDS["pairs"])
            ids = np.arange(n)
            from bucketsearch.index.join import pairs
            from bucketsearch.index.scan import LinearScan
            scan = LinearScan(BITS)
            scan.add(words, ids)
            want = np.concatenate([np.stack([ch.a, ch.b, ch.d], 1) for ch in
                                   pairs(scan, 6)] or [np.empty((0, 3), np.int64)])
            assert len(got) == len(want) == info["pairs"]
            assert np.array_equal(got["a"], want[:, 0]) and np.array_equal(got["b"], want[:, 1])
            assert np.array_equal(got["d"], want[:, 2])
    finally:
        server.kill()
