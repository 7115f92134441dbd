"""The trust issue's examples, one test each (in process, on real files), plus repair, the
index cap, names regardless of case, and many indexes under a low file-descriptor limit."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bucketsearch.app.main import create_app
from bucketsearch.app.settings import Settings
from bucketsearch.index.storage import catalog
from bucketsearch.index.codes import to_hex
from bucketsearch.index.storage.live import LiveIndex
from bucketsearch.index.storage.repair import repair

ROOT = Path(__file__).resolve().parents[1]


def _client(data_dir: Path, **settings) -> TestClient:
    app = create_app(Settings(data_dir=data_dir, warmup=False, calibration_queries=0,
                              **settings))
    return TestClient(app)


def _ready(c: TestClient) -> dict:
    for _ in range(600):
        r = c.get("/readyz")
        if r.status_code == 200:
            return r.json()
        time.sleep(0.05)
    raise AssertionError(r.text)


def _hex(values, bits=16):
    return to_hex(np.asarray(values, dtype=np.uint64)[:, None], bits)


def test_knn_finds_an_id_deleted_and_inserted_again(tmp_path):
    """Example 1: after delete + re-insert (what the 409 message advises), k-NN omitted the id
    until the next merge while range search returned it."""
    with _client(tmp_path) as c:
        _ready(c)
        c.post("/v1/indexes", json={"name": "k", "bits": 16})
        c.post("/v1/indexes/k/items", json={"ids": [1, 2], "codes": _hex([0x0001, 0xFF00])})
        c.post("/v1/indexes/k/merge")
        assert c.post("/v1/indexes/k/items", json={"ids": [1], "codes": _hex([0x00F0])}) \
            .status_code == 409
        c.post("/v1/indexes/k/items/delete", json={"ids": [1]})
        assert c.post("/v1/indexes/k/items", json={"ids": [1], "codes": _hex([0x00F0])}) \
            .status_code == 200
        new = _hex([0x00F0])
        knn = c.post("/v1/indexes/k/search", json={"codes": new, "k": 1}).json()
        rng = c.post("/v1/indexes/k/search", json={"codes": new, "max_distance": 0}).json()
        assert knn["results"][0]["ids"] == [1] == rng["results"][0]["ids"]
        old = c.post("/v1/indexes/k/search", json={"codes": _hex([0x0001]), "k": 2}).json()
        assert old["results"][0] == {"ids": [1, 2], "distances": [5, 9]}  # old code gone


def test_a_refused_create_leaves_nothing_and_restart_serves(tmp_path):
    """Example 2: mode mih with too few substrings for its bits answered 400 but left its
    folder, and after a restart no index became ready."""
    with _client(tmp_path) as c:
        _ready(c)
        assert c.post("/v1/indexes", json={"name": "ok", "bits": 64}).status_code == 201
        r = c.post("/v1/indexes", json={"name": "bad", "bits": 128, "mode": "mih",
                                        "substrings": 1})
        assert r.status_code == 400 and "substrings" in r.json()["detail"]
    assert [f.name for f in catalog.read_folders(tmp_path / "indexes")] == ["ok"]
    with _client(tmp_path) as c:
        states = _ready(c)["index_states"]
        assert states == {"ok": {"state": "ready", "reason": None, "merge": "none"}}


def test_names_are_unique_regardless_of_case_and_capped(tmp_path):
    with _client(tmp_path, max_indexes=2) as c:
        _ready(c)
        assert c.post("/v1/indexes", json={"name": "Photos", "bits": 8}).status_code == 201
        r = c.post("/v1/indexes", json={"name": "photos", "bits": 8})
        assert r.status_code == 409 and "regardless of case" in r.json()["detail"]
        assert c.post("/v1/indexes", json={"name": "b", "bits": 8}).status_code == 201
        r = c.post("/v1/indexes", json={"name": "c", "bits": 8})
        assert r.status_code == 409 and "max_indexes" in r.json()["detail"]
        assert c.delete("/v1/indexes/b").status_code == 204
        assert c.post("/v1/indexes", json={"name": "c", "bits": 8}).status_code == 201


def test_recreating_a_name_gets_a_new_folder(tmp_path):
    """A delete and re-create while a merge of the old incarnation runs cannot touch the new
    index's files: every incarnation has its own folder."""
    with _client(tmp_path) as c:
        _ready(c)
        c.post("/v1/indexes", json={"name": "x", "bits": 16})
        first = {f.folder for f in catalog.read_folders(tmp_path / "indexes")}
        c.delete("/v1/indexes/x")
        c.post("/v1/indexes", json={"name": "x", "bits": 16})
        second = {f.folder for f in catalog.read_folders(tmp_path / "indexes")}
        assert len(first) == len(second) == 1 and first != second


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    holder = catalog.DataDirLock(tmp_path)
    try:
        with pytest.raises(catalog.DataDirLocked, match=r"locked by another bucketsearch "
                                                        r"process \(pid \d+"):
            catalog.DataDirLock(tmp_path)
    finally:
        holder.release()
    catalog.DataDirLock(tmp_path).release()  # free again once the holder is gone


def _damage_middle_record(folder: Path) -> Path:
    segment = sorted(folder.glob("wal-*.log"))[-1]
    raw = bytearray(segment.read_bytes())
    raw[8 + 8 + 3] ^= 0xFF  # inside the first record's payload: valid records follow
    segment.write_bytes(bytes(raw))
    return segment


def test_repair_salvages_every_intact_record_and_reports_the_loss(tmp_path, capsys):
    folder = tmp_path / "indexes" / "r.0001"
    folder.mkdir(parents=True)
    (folder / "index.json").write_text(json.dumps({"name": "r", "bits": 16, "mode": "single"}))
    live = LiveIndex(folder, 16, background_merge=False)
    live.add(_codes([1, 2]), [1, 2])  # record 1: lost below
    live.add(_codes([3]), [3])
    live.delete([3])
    live.add(_codes([4]), [4])
    segment = _damage_middle_record(folder)
    before = segment.read_bytes()
    with pytest.raises(ValueError, match=r"corrupt at byte 8"):
        LiveIndex(folder, 16, background_merge=False)
    assert segment.read_bytes() == before  # refusing to open changes nothing
    report = repair(tmp_path, "r")
    assert report["items"] == 1 and report["lost"] == [
        {"segment": segment.name, "start": 8, "end": 8 + 8 + 9 + 16 + 16}]
    assert list(folder.glob("wal-*.log.corrupt-*"))[0].read_bytes() == before
    again = LiveIndex(folder, 16, background_merge=False)
    assert again.range_search(_codes([4]), 0)[2].tolist() == [4]
    from bucketsearch.cli import main
    assert main(["repair", "--data-dir", str(tmp_path), "--index", "r"]) == 0
    assert "nothing lost" in capsys.readouterr().out  # the second run finds it whole


def _codes(values):
    return np.asarray(values, dtype=np.uint64)[:, None]


def test_delta_drains_after_a_bulk_load_and_at_start_up(tmp_path):
    """Issue 18.1: writes that arrived during a background merge were never merged later, and
    a delta over the threshold at start-up was never merged."""
    live = LiveIndex(tmp_path, 32, merge_threshold=500)
    write_snapshot, merging = live._write_snapshot, threading.Event()

    def slow_snapshot(*args):  # hold the first merge open while more writes arrive
        merging.set()
        time.sleep(0.3)
        return write_snapshot(*args)

    live._write_snapshot = slow_snapshot
    rng = np.random.default_rng(0)
    live.add(rng.integers(0, 2**32, (600, 1), dtype=np.uint64), np.arange(600))
    assert merging.wait(30)  # the background merge of the first 600 items runs
    live.add(rng.integers(0, 2**32, (600, 1), dtype=np.uint64), np.arange(600, 1200))
    deadline = time.monotonic() + 60
    while (live.merging or live.needs_merge()) and time.monotonic() < deadline:
        time.sleep(0.05)
    live.wait_for_merge()
    assert len(live.state.delta_ids) == 0 and live.ntotal == 1200 and live.merges == 2
    live.close()
    cold = LiveIndex(tmp_path, 32, merge_threshold=500, background_merge=False)
    cold.add(rng.integers(0, 2**32, (600, 1), dtype=np.uint64), np.arange(1200, 1800))
    cold.close()  # 600 items left in the delta, over the threshold
    warm = LiveIndex(tmp_path, 32, merge_threshold=500)
    warm.wait_for_merge()
    assert len(warm.state.delta_ids) == 0 and warm.ntotal == 1800


def test_many_indexes_under_a_low_file_descriptor_limit(tmp_path):
    """Isolation: with few file descriptors the WAL holds none between appends, so 200 indexes
    open and serve under RLIMIT_NOFILE = 64; an index whose load fails would be reported
    alone."""
    script = textwrap.dedent(f"""
        import resource, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        from fastapi.testclient import TestClient
        from bucketsearch.app.main import create_app
        from bucketsearch.app.settings import Settings
        app = create_app(Settings(data_dir={str(tmp_path)!r}, warmup=False,
                                  calibration_queries=0))
        with TestClient(app) as c:
            while c.get("/readyz").status_code != 200:
                time.sleep(0.05)
            for i in range(200):
                r = c.post("/v1/indexes", json={{"name": f"i{{i}}", "bits": 16}})
                assert r.status_code == 201, r.text
                r = c.post(f"/v1/indexes/i{{i}}/items", json={{"ids": [i], "codes": ["00ff"]}})
                assert r.status_code == 200, r.text
        with TestClient(create_app(Settings(data_dir={str(tmp_path)!r}, warmup=False,
                                            calibration_queries=0))) as c:
            while c.get("/readyz").status_code != 200:
                time.sleep(0.05)
            states = c.get("/readyz").json()["index_states"]
            ok = sum(s["state"] == "ready" for s in states.values())
            r = c.post("/v1/indexes/i7/search", json={{"codes": ["00ff"], "max_distance": 0}})
            print(ok, r.json()["results"][0]["ids"])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["200", "[7]"]


def test_merge_state_in_the_index_and_as_prometheus_gauges(tmp_path):
    """Issue 18: delta size, merging, last merge and its error, in GET /v1/indexes/{name} and
    /metrics."""
    with _client(tmp_path, merge_threshold=1000) as c:
        _ready(c)
        c.post("/v1/indexes", json={"name": "g", "bits": 16})
        c.post("/v1/indexes/g/items", json={"ids": [1, 2, 3], "codes": _hex([1, 2, 3])})
        info = c.get("/v1/indexes/g").json()
        assert (info["delta_size"], info["merging"], info["last_merge"]) == (3, False, None)
        c.post("/v1/indexes/g/merge")
        c.post("/v1/indexes/g/items/delete", json={"ids": [2]})
        info = c.get("/v1/indexes/g").json()
        assert info["delta_size"] == 0 and info["tombstones"] == 1 and info["last_merge"] > 0
        text = c.get("/metrics").text
        for line in ('bucketsearch_index_items{index="g"} 2.0',
                     'bucketsearch_index_delta_items{index="g"} 0.0',
                     'bucketsearch_index_tombstones{index="g"} 1.0',
                     'bucketsearch_index_merging{index="g"} 0.0',
                     'bucketsearch_index_merges_total{index="g"} 1.0',
                     'bucketsearch_index_last_merge_failed{index="g"} 0.0',
                     'bucketsearch_index_state{index="g",state="ready"} 1.0'):
            assert line in text, line


def test_a_pending_or_running_merge_is_stated_while_serving(tmp_path):
    """Issue 28.4: after a bulk add over the merge threshold the index state and /readyz say
    the merge is pending, then running (still 200, searches answered), then done."""
    with _client(tmp_path, merge_threshold=5) as c:
        _ready(c)
        c.post("/v1/indexes", json={"name": "g", "bits": 16})
        live = c.app.state.registry.entries["g"].live
        live.background_merge = False  # hold it pending
        r = c.post("/v1/indexes/g/items", json={"ids": list(range(8)), "codes": _hex(range(8))})
        assert r.status_code == 200, r.text
        assert c.get("/v1/indexes/g").json()["merge"] == "pending"
        ready = c.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["merges_pending"] == 1
        assert ready.json()["index_states"]["g"]["merge"] == "pending"
        started, release = threading.Event(), threading.Event()
        write_snapshot = live._write_snapshot

        def held_snapshot(*args):
            started.set()
            assert release.wait(30)
            return write_snapshot(*args)

        live._write_snapshot = held_snapshot
        live.background_merge = True
        live._maybe_merge()
        assert started.wait(30)
        assert c.get("/v1/indexes/g").json()["merge"] == "running"
        ready = c.get("/readyz")
        assert ready.status_code == 200 and ready.json()["merges_pending"] == 1
        r = c.post("/v1/indexes/g/search", json={"codes": _hex([3]), "max_distance": 0})
        assert r.status_code == 200 and r.json()["results"][0]["ids"] == [3]
        release.set()
        live.wait_for_merge()
        assert c.get("/v1/indexes/g").json()["merge"] == "none"
        assert c.get("/readyz").json()["merges_pending"] == 0
