"""Ready means warm: once ``/readyz`` says 200, no request compiles a numba kernel.

The check counts compiled type signatures, not time: numba compiles a dispatcher once per
signature (dtype, layout, read-only-ness of each array), and a signature loaded from the on-disk
cache is added to ``dispatcher.signatures`` just like a compiled one, so the cache cannot hide a
miss. (The kernels a kernel calls are part of its cached code and get a signature only when they
are compiled, i.e. with a caller that missed.) Signatures are per process, so every check runs
in a fresh interpreter (this file run as a script): in the pytest process, kernels compiled by
earlier tests would hide what the warm-up missed.

The driver starts the app in-process (``TestClient``) on an empty data directory, waits for
``/readyz``, records the signatures of every dispatcher of the ``bucketsearch.app`` and
``bucketsearch.index`` modules, then
sends every kind of request (every mode; direct-addressed, one-word and multi-word codes; radius
and k-NN, stats on and off, JSON and octet-stream bodies, JSON and binary answers, small inline
batches and large thread-pool ones; on an empty index, a delta only, a main table only, and main
+ delta + tombstones; inserts, deletes, merge, index info, cost model, calibration, evaluate) and
reports the dispatchers that gained a signature.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from bucketsearch.app.startup import compiled_signatures

pytestmark = pytest.mark.slow  # slow: make test-long

ROOT = Path(__file__).resolve().parents[1]
#: direct-addressed tables (16), one-word codes (64), multi-word codes (130)
DRIVE_BITS = (16, 64, 130)
OCTET = "application/octet-stream"
N_ITEMS = 300
DELETED = [0, 1, 2, 150, 151]  # tombstones in the main table (0-2), gone from the delta (150-1)


# ------------------------------------------------------------------------------- the driver
def new_signatures(before: dict, after: dict) -> dict[str, list[str]]:
    return {name: sorted(sigs - before.get(name, set())) for name, sigs in after.items()
            if sigs - before.get(name, set())}


def _codes(bits: int, n: int, seed: int) -> np.ndarray:
    """Clustered codes (so radius searches find something), packed to words."""
    from bucketsearch.index.codes import pack_bits
    rng = np.random.default_rng(seed)
    centers = rng.integers(0, 2, size=(6, bits), dtype=np.uint8)
    rows = centers[rng.integers(0, len(centers), size=n)].copy()
    for row in rows:
        row[rng.choice(bits, size=int(rng.integers(0, 4)), replace=False)] ^= 1
    return pack_bits(rows)


def _ok(response, *codes):
    assert response.status_code in (codes or (200,)), (response.status_code, response.text)
    return response


def drive_searches(client, name: str, bits: int) -> None:
    """Every kind of search request on index ``name``."""
    from bucketsearch.index.codes import to_hex, to_packed
    url = f"/v1/indexes/{name}/search"
    for nq in (2, 40):  # inline on the event loop / parsed and searched in the thread pool
        xq = _codes(bits, nq, seed=nq)
        hexes = to_hex(xq, bits)
        body = to_packed(xq, bits).tobytes()
        # a small radius; a large one (over the probe guard: 400, or the planner's scan); k-NN
        # growing the radius; k above the item count
        for query in ({"max_distance": 1}, {"max_distance": min(bits, 12)}, {"k": 3},
                      {"k": 500}):
            for stats in (False, True):
                for accept in ("application/json", OCTET):
                    expect = (400,) if stats and accept == OCTET else (200, 400)
                    _ok(client.post(url, json={"codes": hexes, **query, "stats": stats},
                                    headers={"accept": accept}), *expect)
                    _ok(client.post(url, content=body, params={**query, "stats": stats},
                                    headers={"content-type": OCTET, "accept": accept}), *expect)


def drive_reads(client, name: str, bits: int, ids: np.ndarray | None = None) -> None:
    """Searches, the other read endpoints, and with ``ids`` (the live items) evaluate."""
    from bucketsearch.index.codes import to_hex
    drive_searches(client, name, bits)
    _ok(client.get(f"/v1/indexes/{name}"))
    _ok(client.get(f"/v1/indexes/{name}/cost-model"))
    _ok(client.get("/v1/indexes"))
    _ok(client.get("/metrics"))
    if ids is None:
        return
    xq = to_hex(_codes(bits, 5, seed=7), bits)
    db = ids[:20].tolist()
    url = f"/v1/indexes/{name}/evaluate"
    for labels in ([1, 2, 3, 1, 2], [40_000] * 5, [2**40] * 5):  # int16, int32, int64 class ids
        for graded in (False, True):
            _ok(client.post(url, json={"codes": xq, "query_labels": labels, "db_ids": db,
                                       "db_labels": [labels[i % 5] for i in range(len(db))],
                                       "graded": graded, "ks": [1, 5]}))
    multihot = [[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1], [1, 0, 0]]
    _ok(client.post(url, json={"codes": xq, "query_labels": multihot, "db_ids": db,
                               "db_labels": [multihot[i % 5] for i in range(len(db))],
                               "graded": True, "measure_queries": 0}))
    for graded in (False, True):
        _ok(client.post(url, json={"codes": xq, "relevant_ids": [db[:3]] * 5,
                                   "graded": graded, "radius_max": 2}))


def drive_index(client, bits: int, mode: str) -> None:
    """Create an index and take it through every state, every request kind in each."""
    from bucketsearch.index.codes import to_hex, to_packed
    name = f"{mode}-{bits}"
    _ok(client.post("/v1/indexes", json={"name": name, "bits": bits, "mode": mode}), 201)
    items = f"/v1/indexes/{name}/items"
    words = _codes(bits, N_ITEMS, seed=bits)
    drive_reads(client, name, bits)  # empty
    _ok(client.post(items, json={"ids": list(range(100)), "codes": to_hex(words[:100], bits)}))
    raw = np.arange(100, 150, dtype="<i8").tobytes() + to_packed(words[100:150], bits).tobytes()
    _ok(client.post(items, content=raw, headers={"content-type": OCTET}))
    drive_reads(client, name, bits)  # a delta only
    _ok(client.post(f"/v1/indexes/{name}/merge"))
    drive_reads(client, name, bits)  # a main table only
    _ok(client.post(items, content=to_packed(words[150:], bits).tobytes(),
                    params={"first_id": 150}, headers={"content-type": OCTET}))
    _ok(client.post(f"/v1/indexes/{name}/items/delete", json={"ids": DELETED}))
    drive_reads(client, name, bits, np.setdiff1d(np.arange(N_ITEMS), DELETED))  # all; evaluate
    _ok(client.post(f"/v1/indexes/{name}/cost-model/calibrate",
                    json={"max_distance": 1, "queries": 8}))


def check(data_dir: str, mmap: bool = False, read_only: bool = False, warmup: bool = True,
          bit_lengths=DRIVE_BITS, modes=None) -> dict:
    """Start the app, wait until ready, drive every request; the signatures compiled after
    ready (``new``) and how many there were at ready (``warm``)."""
    from fastapi.testclient import TestClient

    from bucketsearch.app.main import create_app
    from bucketsearch.app.settings import Settings
    from bucketsearch.index.factory import SERVED_MODES

    settings = Settings(data_dir=Path(data_dir), mmap=mmap, read_only=read_only,
                        warmup=warmup, calibration_queries=8, merge_threshold=1_000_000)
    t = time.perf_counter()
    with TestClient(create_app(settings)) as client:
        while client.get("/readyz").status_code != 200:
            assert "failed" not in str(client.get("/readyz").json().get("detail")), \
                client.get("/readyz").json()
            time.sleep(0.05)
        ready_s = time.perf_counter() - t
        before = compiled_signatures()
        if read_only:  # a restarted read-only server: search what the previous run wrote
            for entry in client.get("/v1/indexes").json()["indexes"]:
                drive_reads(client, entry["name"], entry["bits"],
                            np.setdiff1d(np.arange(N_ITEMS), DELETED))
        else:
            for bits in bit_lengths:
                for mode in modes or SERVED_MODES:
                    drive_index(client, bits, mode)
        after = compiled_signatures()
    return {"new": new_signatures(before, after), "ready_s": ready_s,
            "warm": sum(len(s) for s in before.values()),
            "dispatchers": len(after)}


def run_check(data_dir: Path, *flags: str) -> dict:
    """:func:`check` in a fresh interpreter (compiled signatures are per process)."""
    out = subprocess.run([sys.executable, str(Path(__file__)), str(data_dir), *flags],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200,
                         env={**os.environ, "BUCKETSEARCH_THREADS": "2"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------- the tests
def _explain(result: dict) -> str:
    lines = [f"{name}: {sig}" for name, sigs in sorted(result["new"].items()) for sig in sigs]
    return "kernels compiled after /readyz said 200:\n  " + "\n  ".join(lines)


@pytest.mark.slow
def test_no_request_compiles_a_kernel_after_ready(tmp_path):
    result = run_check(tmp_path / "data")
    assert result["warm"] > 0 and result["dispatchers"] > 10
    assert not result["new"], _explain(result)


@pytest.mark.slow
def test_no_request_compiles_a_kernel_after_ready_with_mmap(tmp_path):
    """Memory-mapped snapshots are read-only arrays: other signatures. First a writable server
    with mmap, then a read-only one (as ``--workers 2`` starts) on what the first one wrote."""
    result = run_check(tmp_path / "data", "--mmap")
    assert not result["new"], _explain(result)
    result = run_check(tmp_path / "data", "--mmap", "--read-only")
    assert not result["new"], _explain(result)


@pytest.mark.slow
def test_the_check_sees_what_a_start_without_warm_up_compiles(tmp_path):
    """The check has teeth: with the warm-up off, the first requests compile the kernels."""
    result = run_check(tmp_path / "data", "--no-warmup", "--quick")
    assert {"bucketsearch.app.encode._csr_json", "bucketsearch.index.probe._probe_kernel",
            "bucketsearch.index.scan._knn_word_kernel",
            "bucketsearch.index.item_table._fill_slots"} <= set(result["new"])


def test_start_up_phases_are_in_the_uvicorn_log(tmp_path):
    """uvicorn configures only its own loggers: the start-up's INFO lines must still show."""
    from bucketsearch.index.codes import to_hex

    data = tmp_path / "data"
    log_path = tmp_path / "server.log"
    env = {**os.environ, "BUCKETSEARCH_DATA_DIR": str(data),
           "BUCKETSEARCH_CALIBRATION_QUERIES": "8"}
    for start in range(2):  # the second start loads the index the first one created
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "bucketsearch.app.main:create_app", "--factory",
                 "--host", "127.0.0.1", "--port", str(port), "--log-level", "info"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 600
            while True:
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                try:
                    if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            if start == 0:
                words = _codes(64, 50, seed=0)
                _ok(httpx.post(url + "/v1/indexes", json={"name": "a", "bits": 64}), 201)
                _ok(httpx.post(url + "/v1/indexes/a/items",
                               json={"ids": list(range(50)), "codes": to_hex(words, 64)}))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    text = log_path.read_text()
    for line in ("loading indexes: 1 loaded (50 items) in", "warm-up: ",
                 "calibration: index a (50 items): t0 ", "from 8 queries at radius 2",
                 "ready in "):
        assert line in text, text


if __name__ == "__main__":
    args = sys.argv[1:]
    directory = args[0] if args and not args[0].startswith("--") else tempfile.mkdtemp()
    quick = {"bit_lengths": (64,), "modes": ("single",)} if "--quick" in args else {}
    print(json.dumps(check(directory, mmap="--mmap" in args, read_only="--read-only" in args,
                           warmup="--no-warmup" not in args, **quick)))
