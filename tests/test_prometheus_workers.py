"""/metrics summed over the workers of ``bucketsearch serve --workers 2`` (issue 18 item 7):
prometheus-client's multiprocess mode for the HTTP series, per-worker files for the per-radius
search figures, live gauges of a killed worker removed (app.workermetrics).

A real server: ``bucketsearch serve --workers 2`` in its own process group on a data directory
written beforehand (the workers are read-only replicas), real scrapes over fresh connections
(each may reach either worker)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import ROOT, ServerProcess, free_port
from fastapi.testclient import TestClient
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from bucketsearch.app import workermetrics
from bucketsearch.app.costfit import RadiusRecord
from bucketsearch.app.main import create_app
from bucketsearch.app.settings import Settings
from bucketsearch.index.codes import pack_bits

pytestmark = pytest.mark.slow  # slow: make test-long

BITS = 16
SEARCH_ROUTE = "/v1/indexes/{name}/search"
N_SEARCHES = 64
#: stale files of an "earlier start" that the serve command must wipe
STALE_PID = 4_000_000


class WorkersServer(ServerProcess):
    """``bucketsearch serve --workers N`` in its own process group (so that stopping it never
    leaves a worker behind)."""

    def __init__(self, data_dir: Path, workers: int, env: dict):
        super().__init__(data_dir, env)
        self.workers = workers

    def launch(self) -> WorkersServer:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k != workermetrics.ENV} | self.env
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bucketsearch", "serve", "--data-dir", str(self.data_dir),
                 "--port", str(self.port), "--workers", str(self.workers),
                 "--log-level", "warning"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        return self

    def signal_group(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            if self.wait_exit(30) is None:
                self.kill()

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)
        self.proc.wait(timeout=30)


def write_data_dir(data: Path) -> np.ndarray:
    """Index ``w`` (16 bits, mode single: every search probes, 200 codes, merged) written by an
    in-process server."""
    rng = np.random.default_rng(7)
    words = pack_bits(rng.integers(0, 2, size=(200, BITS), dtype=np.uint8))
    hexes = [f"{int(w):04x}" for w in words[:, 0]]
    settings = Settings(data_dir=data, warmup=False, calibration_queries=0)
    with TestClient(create_app(settings)) as c:
        deadline = time.monotonic() + 60
        while c.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = c.post("/v1/indexes", json={"name": "w", "bits": BITS, "mode": "single"})
        assert r.status_code == 201, r.text
        r = c.post("/v1/indexes/w/items", json={"ids": list(range(200)), "codes": hexes})
        assert r.status_code == 200, r.text
        assert c.post("/v1/indexes/w/merge").status_code == 200
    return np.array(hexes)


def write_stale_files(prom: Path) -> None:
    """What a killed earlier start leaves: a search file and a counter file."""
    prom.mkdir()
    rec = RadiusRecord(n=10**6, probes_total=10**9)
    workermetrics.write_search_file(prom, STALE_PID, {"w": [("1", rec)]})
    (prom / f"counter_{STALE_PID}.db").write_bytes(b"\0" * 64)


def wait_all_workers_ready(url: str, rounds_in_a_row: int = 3, timeout: float = 300) -> None:
    """/readyz answered 200 by one worker says nothing of the other, which may still be
    starting (and answer 503 "not ready"). One at a time, the ready worker can take every
    fresh connection while the other is busy starting (seen on a loaded machine: 20 in a row,
    then searches answered 503), so each round sends N_SEARCHES concurrent ones, as the
    searches will; wait for ``rounds_in_a_row`` rounds answered 200 throughout."""
    deadline, streak = time.monotonic() + timeout, 0
    while streak < rounds_in_a_row:
        assert time.monotonic() < deadline, "the workers did not all become ready"
        with ThreadPoolExecutor(8) as pool:
            ok = all(s == 200 for s in pool.map(
                lambda _: httpx.get(url + "/readyz", timeout=30).status_code,
                range(N_SEARCHES)))
        streak = streak + 1 if ok else 0
        if not ok:
            time.sleep(0.2)


@pytest.fixture
def workers_server(tmp_path):
    data, prom = tmp_path / "data", tmp_path / "prom"
    codes = write_data_dir(data)
    write_stale_files(prom)
    server = WorkersServer(data, 2, {"PROMETHEUS_MULTIPROC_DIR": str(prom),
                                     "BUCKETSEARCH_WARMUP": "0",
                                     "BUCKETSEARCH_CALIBRATION_QUERIES": "0"})
    server.start(timeout=180)
    wait_all_workers_ready(server.url)
    yield server, prom, codes
    server.kill()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """One scrape over a fresh connection: ``{(sample name, sorted labels): value}``."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def label_values(samples: dict, name: str, label: str) -> set[str]:
    return {dict(lab)[label] for (n, lab), _ in samples.items() if n == name}


def searches_per_worker(prom: Path) -> dict[int, float]:
    """Search requests counted in each worker's own counter file."""
    out = {}
    for path in prom.glob("counter_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        if pid == STALE_PID:
            continue
        families = MultiProcessCollector.merge([str(path)], accumulate=False)
        out[pid] = sum(s.value for family in families for s in family.samples
                       if s.name == "bucketsearch_http_requests_total"
                       and s.labels.get("route") == SEARCH_ROUTE)
    return out


def search(url: str, code: str) -> int | str:
    """The status of one search (200), or the status and the answer's text (to see why)."""
    r = httpx.post(url + "/v1/indexes/w/search", json={"codes": [code], "max_distance": 1},
                   timeout=30)  # a fresh connection: either worker may accept it
    return 200 if r.status_code == 200 else f"{r.status_code}: {r.text[:300]}"


def send_until_both_served(url: str, prom: Path, codes, rounds: int = 5) -> int:
    """Rounds of N_SEARCHES concurrent searches (fresh connections: the two workers share the
    accepts) until each worker's own counter file shows some; returns the searches sent."""
    sent = 0
    for _ in range(rounds):
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda i: search(url, codes[i % len(codes)]),
                                     range(sent, sent + N_SEARCHES)))
        assert statuses == [200] * N_SEARCHES, [s for s in statuses if s != 200]
        sent += N_SEARCHES
        per_worker = searches_per_worker(prom)
        assert sum(per_worker.values()) == sent
        if sum(1 for count in per_worker.values() if count > 0) == 2:
            return sent
    raise AssertionError(f"after {sent} searches one worker served them all: {per_worker}")


def test_every_scrape_sums_every_worker(workers_server):
    server, prom, codes = workers_server
    assert not (prom / f"counter_{STALE_PID}.db").exists()  # wiped at start
    assert not workermetrics.search_file(prom, STALE_PID).exists()
    n = send_until_both_served(server.url, prom, codes)

    for _ in range(12):  # each scrape reaches one worker; every one sees both
        samples = scrape(server.url)
        assert total(samples, "bucketsearch_http_requests_total", route=SEARCH_ROUTE,
                     status="200") == n
        assert total(samples, "bucketsearch_http_request_seconds_count",
                     route=SEARCH_ROUTE) == n
        assert total(samples, "bucketsearch_workers") == 2
        assert len(label_values(samples, "bucketsearch_worker_resident_memory_bytes",
                                "pid")) == 2
        assert total(samples, "bucketsearch_index_items", index="w") == 200  # a replica's
        # the search figures of the other worker arrive within PUBLISH_INTERVAL_S: never more
        assert total(samples, "bucketsearch_lookup_seconds_count", index="w",
                     radius="1") <= n
    deadline = time.monotonic() + 10 * workermetrics.PUBLISH_INTERVAL_S
    while True:
        samples = scrape(server.url)
        counts = [total(samples, "bucketsearch_lookup_seconds_count", index="w", radius=r)
                  for r in ("0", "1")]
        probes = [total(samples, "bucketsearch_probes_total", index="w", radius=r)
                  for r in ("0", "1")]
        if counts == [n] * 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert counts == [n, n]
    assert probes == [n * 1, n * BITS]  # C(16, 0) and C(16, 1) per query


def test_a_killed_worker_leaves_its_counts_but_not_its_live_gauges(workers_server):
    server, prom, codes = workers_server
    n = send_until_both_served(server.url, prom, codes)
    per_worker = searches_per_worker(prom)
    victim = max(per_worker, key=per_worker.get)
    time.sleep(2 * workermetrics.PUBLISH_INTERVAL_S)  # its search figures are in its file
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while workermetrics.pid_alive(victim) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not workermetrics.pid_alive(victim)
    for _ in range(8):
        try:
            samples = scrape(server.url)
        except httpx.HTTPError:  # the killed worker's accepted connection
            continue
        assert str(victim) not in label_values(
            samples, "bucketsearch_worker_resident_memory_bytes", "pid")
        live = label_values(samples, "bucketsearch_worker_resident_memory_bytes", "pid")
        assert total(samples, "bucketsearch_workers") == len(live) >= 1
        # a counter never goes down: the dead worker's requests are still counted
        assert total(samples, "bucketsearch_http_requests_total", route=SEARCH_ROUTE,
                     status="200") == n
        assert total(samples, "bucketsearch_probes_total", index="w", radius="1") >= \
            per_worker[victim] * BITS
    assert not list(prom.glob(f"gauge_live*_{victim}.db"))


def test_graceful_stop_removes_live_gauges_and_keeps_final_figures(workers_server):
    server, prom, codes = workers_server
    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(lambda i: search(server.url, codes[i]), range(N_SEARCHES))) == {200}
    server.stop()
    assert server.proc.returncode == 0
    assert not list(prom.glob("gauge_live*.db"))
    files = list(prom.glob(f"{workermetrics.SEARCH_FILE_PREFIX}*.json"))
    ones = sum(json.loads(f.read_text())["indexes"].get("w", {}).get("1", {}).get("n", 0)
               for f in files)
    assert ones == N_SEARCHES  # each worker wrote its last figures at shutdown


def test_the_serve_command_makes_and_removes_a_temporary_directory(tmp_path):
    """Without PROMETHEUS_MULTIPROC_DIR, ``serve --workers 2`` makes a private temporary
    directory and removes it when it stops."""
    data = tmp_path / "data"
    write_data_dir(data)
    server = WorkersServer(data, 2, {"BUCKETSEARCH_WARMUP": "0",
                                     "BUCKETSEARCH_CALIBRATION_QUERIES": "0"})
    try:
        server.start(timeout=180)
        assert total(scrape(server.url), "bucketsearch_workers") == 2
        line = next(line for line in server.log_text().splitlines()
                    if f"{workermetrics.ENV}=" in line)
        directory = Path(line.split(f"{workermetrics.ENV}=", 1)[1].rstrip(")"))
        assert directory.is_dir() and directory.name.startswith("bucketsearch-metrics-")
        server.stop()
        assert server.proc.returncode == 0 and not directory.exists()
    finally:
        server.kill()


def test_one_process_keeps_its_own_registry_with_process_series(tmp_path):
    with TestClient(create_app(Settings(data_dir=tmp_path / "d", warmup=False,
                                        calibration_queries=0))) as c:
        assert c.app.state.metrics.directory is None
        text = c.get("/metrics").text
    assert "process_resident_memory_bytes" in text and "bucketsearch_workers" not in text


def test_prepare_dir_wipes_only_metric_files(tmp_path):
    prom = tmp_path / "prom"
    write_stale_files(prom)
    (prom / "notes.txt").write_text("kept")
    (prom / f"{workermetrics.SEARCH_FILE_PREFIX}{STALE_PID}.tmp").write_text("{")
    directory, created = workermetrics.prepare_dir(prom)
    assert directory == prom and not created
    assert sorted(p.name for p in prom.iterdir()) == ["notes.txt"]
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="PROMETHEUS_MULTIPROC_DIR.*not a directory"):
        workermetrics.prepare_dir(tmp_path / "file")


def test_search_files_round_trip_and_sum(tmp_path):
    """Every additive field of a RadiusRecord survives the worker file and is summed."""
    from bucketsearch.app.metrics import add_figures
    rng = np.random.default_rng(0)
    recs = []
    for pid in (11, 12, 13):
        rec = RadiusRecord()
        for f in RadiusRecord.ADDITIVE:
            if f.endswith("counts"):
                getattr(rec, f)[rng.integers(0, len(rec.counts), size=20)] += 3
            else:
                setattr(rec, f, float(rng.random()) if f.endswith("_ns")
                        else int(rng.integers(1, 10**12)))
        recs.append(rec)
        workermetrics.write_search_file(tmp_path, pid, {"w": [("gt16", rec)]})
    others = workermetrics.read_search_files(tmp_path, exclude_pid=11)
    summed = dict(add_figures({"w": [("gt16", recs[0])]}, others)["w"])["gt16"]
    for f in RadiusRecord.ADDITIVE:
        want = sum(getattr(r, f) for r in recs)
        if f.endswith("counts"):
            assert np.array_equal(getattr(summed, f), want), f
        else:
            assert getattr(summed, f) == pytest.approx(want, rel=1e-12), f
    assert recs[0].n < summed.n  # the inputs are not modified
