"""Near-duplicate jobs on the server (issue 27 item 4): app/jobs.py and /v1/jobs.

* in process: pairs, clusters and keep-lists over main + delta + tombstones equal brute force,
  in every format and page; the job reads the state when it started while writes go on;
  limits (one job per index, the result cap), refusals, Prometheus;
* a crash (SimulatedCrash at a write of the pairs file, beneath the real code) resumes from the
  last checkpoint on the next start and ends with the whole, exact result;
* a real server SIGKILLed mid-job: after the restart the job resumes and completes (or fails
  with its reason), and a result is never served, nor on disk as result.bin, before it is whole.
"""
from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import naive
import numpy as np
import pytest
from helpers import add_codes, app_client, app_settings, create_index

from bucketsearch.app import jobs as jobs_module
from bucketsearch.app.jobs import JobManager
from bucketsearch.index.codes import pack_bits
from bucketsearch.index.storage import fsio
from bucketsearch.index.storage.live import LiveIndex
from bucketsearch.loadtest.client import Client, Conflict
from bucketsearch.loadtest.wire import JOB_RECORDS

pytestmark = pytest.mark.timeout(900)


def codes(rng, n, bits, dup_every=5):
    rows = rng.integers(0, 2, size=(n, bits), dtype=np.uint8)
    for i in range(dup_every, n, dup_every):  # planted near-duplicates
        rows[i] = rows[i - dup_every]
        rows[i, rng.integers(0, bits, size=2)] ^= 1
    return pack_bits(rows)


def brute(ids, words, bits, radius):
    """Pairs (a < b, d) by brute force, the components' smallest ids, the greedy keep-list."""
    order = np.argsort(ids)
    ids, words = ids[order], words[order]
    d = naive.hamming_matrix(words, words, bits)
    a, b = np.nonzero(np.triu(d <= radius, k=1))
    pairs = sorted(zip(ids[a].tolist(), ids[b].tolist(), d[a, b].tolist()))
    label = {int(i): int(i) for i in ids}

    def find(x):
        while label[x] != x:
            x = label[x]
        return x
    for p, q, _ in pairs:
        rp, rq = find(p), find(q)
        label[max(rp, rq)] = min(rp, rq)
    clusters = [(int(i), find(int(i))) for i in ids]
    dropped = set()
    for p, q, _ in pairs:  # ordered by a: p's status is final when its pairs come
        if p not in dropped:
            dropped.add(q)
    keep = [int(i) for i in ids if int(i) not in dropped]
    return pairs, clusters, keep


def wait(c, job_id, timeout=600):
    deadline = time.monotonic() + timeout
    while True:
        info = c.get(f"/v1/jobs/{job_id}").json()
        if info["state"] != "running" or time.monotonic() > deadline:
            return info
        time.sleep(0.05)


def rows_of(c, job_id, fmt, **params):
    r = c.get(f"/v1/jobs/{job_id}/result", params={"format": fmt, **params})
    assert r.status_code == 200, r.text
    if fmt == "binary":
        return [tuple(x) for x in np.frombuffer(r.content, dtype=JOB_RECORDS[
            c.get(f"/v1/jobs/{job_id}").json()["output"]]).tolist()]
    if fmt == "csv":
        lines = r.text.splitlines()
        return [tuple(int(v) for v in line.split(",")) for line in lines[1:]]
    return [tuple(json.loads(line).values()) for line in r.text.splitlines()]


@pytest.mark.parametrize("bits, radius", [(24, 3), (64, 4)])
def test_results_equal_brute_force_over_main_delta_and_tombstones(tmp_path, bits, radius):
    rng = np.random.default_rng(bits)
    words = codes(rng, 400, bits)
    with app_client(tmp_path) as c:
        create_index(c, "x", bits)
        add_codes(c, "x", range(300), words[:300], bits)
        assert c.post("/v1/indexes/x/merge").status_code == 200
        add_codes(c, "x", range(300, 400), words[300:], bits)  # the delta
        gone = [3, 10, 305]
        assert c.post("/v1/indexes/x/items/delete", json={"ids": gone}).status_code == 200
        keep_ids = np.setdiff1d(np.arange(400), gone)
        pairs, clusters, keep = brute(keep_ids, words[keep_ids], bits, radius)
        assert pairs  # the planted near-duplicates
        expected = {"pairs": pairs, "clusters": clusters, "keep": [(i,) for i in keep]}
        for output in ("pairs", "clusters", "keep"):
            r = c.post("/v1/jobs", json={"index": "x", "radius": radius, "output": output})
            assert r.status_code == 202, r.text
            info = wait(c, r.json()["id"])
            assert info["state"] == "completed", info
            assert info["items"] == info["items_done"] == len(keep_ids)
            assert info["pairs"] == len(pairs) and info["result"]["rows"] == len(
                expected[output])
            assert info["phases"] and info["prediction"]["pairs"] >= 0
            for fmt in ("ndjson", "csv", "binary"):
                assert rows_of(c, info["id"], fmt) == expected[output], (output, fmt)
            # pages: offset and limit (the CSV header only on the first page)
            n = len(expected[output])
            got = rows_of(c, info["id"], "csv", offset=0, limit=7) + \
                rows_of(c, info["id"], "ndjson", offset=7, limit=n)
            assert got == expected[output]


def test_a_job_reads_the_state_when_it_started(tmp_path, monkeypatch):
    """Writes right after the start (near-duplicates of every item) are not in the result."""
    bits, radius = 32, 2
    rng = np.random.default_rng(1)
    words = codes(rng, 300, bits)
    with app_client(tmp_path) as c:
        create_index(c, "x", bits)
        add_codes(c, "x", range(300), words, bits)
        pairs, _, _ = brute(np.arange(300), words, bits, radius)
        r = c.post("/v1/jobs", json={"index": "x", "radius": radius})
        add_codes(c, "x", range(1000, 1300), words, bits)  # an exact copy of each item
        c.post("/v1/indexes/x/items/delete", json={"ids": list(range(0, 300, 2))})
        info = wait(c, r.json()["id"])
        assert info["state"] == "completed"
        assert rows_of(c, info["id"], "binary") == pairs


def test_limits_and_refusals(tmp_path):
    bits = 32
    words = codes(np.random.default_rng(2), 200, bits, dup_every=1)
    with app_client(tmp_path, job_max_result_bytes=100) as c:
        create_index(c, "x", bits)
        add_codes(c, "x", range(200), words, bits)
        for body, field in [({"index": "x", "radius": True}, "radius"),
                            ({"index": "x", "radius": 33}, "radius"),
                            ({"index": "x", "radius": 1, "output": "edges"}, "output"),
                            ({"index": "x"}, "radius")]:
            r = c.post("/v1/jobs", json=body)
            assert r.status_code == 400 and field in r.json()["detail"], r.text
        assert c.post("/v1/jobs", json={"index": "nope", "radius": 1}).status_code == 404
        assert c.get("/v1/jobs/0123456789abcdef").status_code == 404
        assert c.get("/v1/jobs/not-an-id").status_code == 400
        # one job per index: a running job holds the slot
        jobs: JobManager = c.app.state.jobs
        held = jobs_module.Job("f" * 16, "x", "folder", 1, "pairs", bits, 0, time.time())
        jobs.jobs[held.id] = held
        r = c.post("/v1/jobs", json={"index": "x", "radius": 1})
        assert r.status_code == 409 and "jobs_per_index=1" in r.json()["detail"]
        assert c.get(f"/v1/jobs/{held.id}/result").status_code == 409  # not completed
        assert c.delete(f"/v1/jobs/{held.id}").status_code == 409  # running
        del jobs.jobs[held.id]
        # the result cap: 20 bytes a pair, 100 bytes: the job fails with the reason
        info = wait(c, c.post("/v1/jobs", json={"index": "x", "radius": 3}).json()["id"])
        assert info["state"] == "failed" and "job_max_result_bytes" in info["reason"]
        assert not list((tmp_path / "jobs" / info["id"]).glob("*.part"))
        assert c.get(f"/v1/jobs/{info['id']}/result").status_code == 409
        r = c.get(f"/v1/jobs/{info['id']}/result", params={"format": "parquet"})
        assert r.status_code == 409
        metrics = c.get("/metrics").text
        assert 'bucketsearch_jobs{state="failed"} 1.0' in metrics
        assert c.delete(f"/v1/jobs/{info['id']}").status_code == 204
        assert c.get("/v1/jobs").json() == {"jobs": []}


def test_cancel(tmp_path):
    bits = 64
    words = codes(np.random.default_rng(3), 20_000, bits)
    with app_client(tmp_path) as c:
        create_index(c, "x", bits)
        add_codes(c, "x", range(20_000), words, bits)
        job = c.post("/v1/jobs", json={"index": "x", "radius": 20}).json()
        r = c.post(f"/v1/jobs/{job['id']}/cancel")
        assert r.status_code == 200 and r.json()["state"] in ("cancelled", "completed")
        if r.json()["state"] == "cancelled":
            assert not (tmp_path / "jobs" / job["id"] / "pairs.part").exists()
            again = c.post(f"/v1/jobs/{job['id']}/cancel")  # idempotent: left as it is
            assert again.status_code == 200 and again.json()["state"] == "cancelled"


def test_a_crash_mid_job_resumes_from_the_last_checkpoint(tmp_path, monkeypatch):
    """The pairs file's 3rd write "crashes" the process (SimulatedCrash, beneath the real
    code): job.json keeps the checkpoint after the 2nd chunk; a new manager on the same
    folder resumes there and ends with the exact result."""
    monkeypatch.setattr(jobs_module, "CHUNK_SIZE", 50)
    monkeypatch.setattr(jobs_module, "CHECKPOINT_S", 0.0)
    bits, radius = 24, 3
    words = codes(np.random.default_rng(4), 600, bits, dup_every=2)
    live = LiveIndex(tmp_path / "index", bits, background_merge=False)
    live.add(words, np.arange(600))
    entry = SimpleNamespace(name="x", bits=bits, live=live, folder=tmp_path / "index")
    settings = app_settings(tmp_path)
    pairs, _, _ = brute(np.arange(600), words, bits, radius)
    assert len(pairs) > 200
    crashed = threading.Event()
    old_hook = threading.excepthook
    threading.excepthook = lambda args: crashed.set() if issubclass(
        args.exc_type, fsio.SimulatedCrash) else old_hook(args)
    try:
        with fsio.inject(fsio.FaultPlan(at=3, ops=("write",), path_contains="pairs.part",
                                        crash=True)):
            first = JobManager(settings)
            job = first.start(entry, radius, "pairs")
            job.thread.join(120)
    finally:
        threading.excepthook = old_hook
    assert crashed.is_set()
    saved = json.loads((tmp_path / "jobs" / job.id / "job.json").read_bytes())
    assert saved["state"] == "running" and saved["checkpoint"]["min_id"] > 0
    assert saved["checkpoint"]["bytes"] == 20 * saved["checkpoint"]["pairs"] > 0
    assert not (tmp_path / "jobs" / job.id / "result.bin").exists()
    again = JobManager(settings)
    again.load(SimpleNamespace(entries={"x": entry}))
    resumed = again.get(job.id)
    resumed.thread.join(120)
    info = again.info(resumed)
    assert info["state"] == "completed" and info["resumed"] == 1, info
    got = np.fromfile(tmp_path / "jobs" / job.id / "result.bin", dtype=JOB_RECORDS["pairs"])
    assert [tuple(x) for x in got.tolist()] == pairs
    # a job whose index is gone at the restart fails with the reason; so does one whose
    # result file went missing
    (tmp_path / "jobs" / job.id / "result.bin").unlink()
    third = JobManager(settings)
    third.load(SimpleNamespace(entries={}))
    assert third.get(job.id).state == "failed" and "missing" in third.get(job.id).reason
    live.close()


def test_a_crash_during_the_table_phase_resumes_from_the_search_checkpoint(tmp_path,
                                                                            monkeypatch):
    """A blocks join searches every table before it writes a pair: its checkpoint is then the
    search's position (tables done, sorted runs durable). A crash at the 3rd save of job.json
    (SimulatedCrash beneath the real code: the 2nd search checkpoint) leaves the 1st; a new
    manager resumes the search from its tables, not from zero, and ends with the exact
    result."""
    monkeypatch.setattr(jobs_module, "SEARCH_CHECKPOINT_S", 0.0)
    bits, radius = 64, 3
    words = codes(np.random.default_rng(5), 3000, bits, dup_every=3)
    live = LiveIndex(tmp_path / "index", bits, background_merge=False)
    live.add(words, np.arange(3000))
    entry = SimpleNamespace(name="x", bits=bits, live=live, folder=tmp_path / "index")
    settings = app_settings(tmp_path)
    pairs, _, keep = brute(np.arange(3000), words, bits, radius)
    crashed = threading.Event()
    old_hook = threading.excepthook
    threading.excepthook = lambda args: crashed.set() if issubclass(
        args.exc_type, fsio.SimulatedCrash) else old_hook(args)
    try:
        with fsio.inject(fsio.FaultPlan(at=3, ops=("rename",), path_contains="job.json",
                                        crash=True)):
            job = JobManager(settings).start(entry, radius, "keep")
            job.thread.join(120)
    finally:
        threading.excepthook = old_hook
    assert crashed.is_set()
    saved = json.loads((tmp_path / "jobs" / job.id / "job.json").read_bytes())
    search = saved["checkpoint"]["search"]
    assert saved["state"] == "running" and search["algorithm"] == "blocks"
    assert 1 <= search["tables_done"] < math.comb(*search["scheme"])
    assert all(Path(run).exists() for run, _ in search["runs"])
    again = JobManager(settings)
    again.load(SimpleNamespace(entries={"x": entry}))
    resumed = again.get(job.id)
    resumed.thread.join(120)
    info = again.info(resumed)
    assert info["state"] == "completed" and info["resumed"] == 1, info
    assert resumed.join["params"]["resumed_at"] == {"tables_done": search["tables_done"]}
    assert info["pairs"] == len(pairs)
    got = np.fromfile(tmp_path / "jobs" / job.id / "result.bin", dtype=JOB_RECORDS["keep"])
    assert got["id"].tolist() == keep
    assert not (tmp_path / "jobs" / job.id / "spill").exists()  # the runs removed at the end
    live.close()


@pytest.mark.slow  # a kill test: make test-long
def test_sigkill_mid_job_resumes_and_never_serves_a_partial_result(bucketsearch_server_factory,
                                                                   tmp_path):
    srv = bucketsearch_server_factory(tmp_path / "data")
    bits, radius, n = 32, 4, 600_000
    words = codes(np.random.default_rng(5), n, bits, dup_every=3)
    with Client(srv.url) as c:
        c.create_index("x", bits)
        c.add("x", words, ids=np.arange(n))
        job = c.start_job("x", radius, "pairs")
        # the kill lands as soon as the job is under way (a fixed sleep of 2 s outlasted the
        # whole job on a quiet machine)
        deadline = time.monotonic() + 60
        while (info := c.job(job["id"]))["elapsed_s"] < 0.3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert info["state"] == "running", info
        with pytest.raises(Conflict):  # no partial result is ever served
            next(c.job_result(job["id"]))
    srv.kill()
    folder = tmp_path / "data" / "jobs" / job["id"]
    saved = json.loads((folder / "job.json").read_bytes())
    assert saved["state"] == "running" and not (folder / "result.bin").exists()
    srv.start()
    with Client(srv.url) as c:
        info = c.wait_job(job["id"], timeout=600)
        assert info["state"] == "completed", info
        assert info["resumed"] == 1
        pages = list(c.job_result(job["id"], page_rows=100_000))
    got = np.concatenate(pages)
    assert len(got) == info["result"]["rows"] == info["pairs"]
    assert (got["a"] < got["b"]).all() and (got["d"] <= radius).all()
    order = np.lexsort((got["b"], got["a"]))
    assert (order == np.arange(len(got))).all()  # ordered by (a, b), no pair twice
    key = got["a"] * n + got["b"]
    assert len(np.unique(key)) == len(key)
    # the planted pairs (i - 3, i) at distance <= 2 are all there
    planted = np.arange(3, n, 3)
    assert np.isin((planted - 3) * n + planted, key).all()


def test_the_clients_job_methods_page_through_the_result(bucketsearch_server_factory, tmp_path):
    """Client and AsyncClient: start, wait, list, pages of the result (equal to brute force
    however the pages fall), cancel (idempotent), delete."""
    import asyncio

    from bucketsearch.loadtest.client import AsyncClient, NotFound
    srv = bucketsearch_server_factory(tmp_path / "data")
    bits, radius = 24, 3
    words = codes(np.random.default_rng(6), 500, bits, dup_every=2)
    pairs, clusters, keep = brute(np.arange(500), words, bits, radius)
    with Client(srv.url) as c:
        c.create_index("x", bits)
        c.add("x", words, ids=np.arange(500))
        job = c.start_job("x", radius, "pairs")
        info = c.wait_job(job["id"])
        assert info["state"] == "completed" and [j["id"] for j in c.jobs("x")] == [job["id"]]
        pages = list(c.job_result(job["id"], page_rows=37))
        assert all(len(p) == 37 for p in pages[:-1])
        assert [tuple(r) for p in pages for r in p.tolist()] == pairs
        assert c.cancel_job(job["id"])["state"] == "completed"  # finished: left as it is
        keep_job = c.start_job("x", radius, "keep")

    async def run():
        async with AsyncClient(srv.url) as ac:
            info = await ac.wait_job(keep_job["id"])
            got = [r for page in [p async for p in ac.job_result(keep_job["id"], page_rows=100)]
                   for r in page["id"].tolist()]
            await ac.delete_job(keep_job["id"])
            return info, got
    info, got = asyncio.run(run())
    assert info["state"] == "completed" and got == keep
    with Client(srv.url) as c:
        with pytest.raises(NotFound):
            c.job(keep_job["id"])
        with pytest.raises(ValueError, match="page_rows"):
            next(c.job_result(job["id"], page_rows=0))
