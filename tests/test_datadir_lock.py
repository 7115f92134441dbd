"""One writer per data directory: a second writable server on the same directory exits with an
error naming the holder (its pid) and leaves the running one and its data alone; read-only
servers (BUCKETSEARCH_READ_ONLY=1, the several-workers setup) may share it; the lock dies with
its holder, so a SIGKILLed writer never blocks the next start."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.slow  # slow: make test-long

BITS = 16
EXIT_TIMEOUT = 120.0  # seconds for the refused server to import the app, fail and exit


def fill(server, ids=(1, 2, 3)) -> dict[int, str]:
    codes = {i: f"{i * 257:04x}" for i in ids}
    with server.client() as c:
        if c.get("/v1/indexes/lk").status_code == 404:
            assert c.post("/v1/indexes", json={"name": "lk", "bits": BITS}).status_code == 201
        r = c.post("/v1/indexes/lk/items", json={"ids": list(codes), "codes": list(codes.values())})
        assert r.status_code == 200, r.text
    return codes


def found(server, codes: dict[int, str]) -> bool:
    with server.client() as c:
        r = c.post("/v1/indexes/lk/search",
                   json={"codes": list(codes.values()), "max_distance": 0})
        assert r.status_code == 200, r.text
        return [res["ids"] for res in r.json()["results"]] == [[i] for i in codes]


def test_second_writer_exits_naming_the_holder(bucketsearch_server_factory, tmp_path):
    data = tmp_path / "data"
    holder = bucketsearch_server_factory(data, BUCKETSEARCH_WARMUP=0)
    codes = fill(holder)
    second = bucketsearch_server_factory(data, log_path=tmp_path / "second.log", start=False,
                                         BUCKETSEARCH_WARMUP=0)
    second.launch()
    code = second.wait_exit(EXIT_TIMEOUT)
    log = second.log_text()
    assert code is not None, f"a second writer on a locked data directory still runs after " \
                             f"{EXIT_TIMEOUT} s; its log:\n{log[-3000:]}"
    assert code != 0, f"the refused server exited with 0; its log:\n{log[-3000:]}"
    assert re.search(r"lock", log, re.IGNORECASE), f"the error does not mention the lock:\n{log}"
    assert re.search(rf"\b{holder.pid}\b", log), \
        f"the error does not name the holder (pid {holder.pid}):\n{log[-3000:]}"
    # the holder goes on serving, its data untouched, and still accepts writes
    assert holder.proc.poll() is None
    assert found(holder, codes)
    codes.update(fill(holder, ids=(4, 5)))
    assert found(holder, codes)


def test_read_only_servers_share_a_locked_data_dir(bucketsearch_server_factory, tmp_path):
    data = tmp_path / "data"
    writer = bucketsearch_server_factory(data, BUCKETSEARCH_WARMUP=0)
    codes = fill(writer)
    with writer.client() as c:
        assert c.post("/v1/indexes/lk/merge").status_code == 200  # a snapshot to share
    more = fill(writer, ids=(7, 8))  # and records in the WAL
    readers = [bucketsearch_server_factory(data, log_path=tmp_path / f"reader{k}.log",
                                           BUCKETSEARCH_READ_ONLY=1, BUCKETSEARCH_MMAP=1,
                                           BUCKETSEARCH_WARMUP=0) for k in range(2)]
    for reader in readers:
        assert found(reader, {**codes, **more})
        with reader.client() as c:
            r = c.post("/v1/indexes/lk/items", json={"ids": [99], "codes": ["0000"]})
            assert r.status_code == 409 and "read-only" in r.json()["detail"], r.text
    # the writer keeps its lock and its writes while the readers run
    assert found(writer, fill(writer, ids=(10, 11)))
    assert writer.proc.poll() is None and all(r.proc.poll() is None for r in readers)


def test_the_lock_dies_with_its_holder(bucketsearch_server_factory, tmp_path):
    data = tmp_path / "data"
    first = bucketsearch_server_factory(data, BUCKETSEARCH_WARMUP=0)
    codes = fill(first)
    first.kill()  # SIGKILL: no shutdown code releases anything
    second = bucketsearch_server_factory(data, log_path=tmp_path / "second.log",
                                         BUCKETSEARCH_WARMUP=0)
    assert found(second, codes)
    codes.update(fill(second, ids=(4,)))
    second.stop()  # a clean shutdown releases it too
    third = bucketsearch_server_factory(data, log_path=tmp_path / "third.log",
                                        BUCKETSEARCH_WARMUP=0)
    assert found(third, codes)
