"""Real faults beneath the real server: the server runs under Debian's libfiu (``fiu-run -x``
preloads its POSIX wrappers), and ``fiu-ctrl`` turns a system-call failure on and off at the
moment the test chooses.

Fault points exercised (libfiu names; ``failinfo`` is the errno the call fails with):

* ``posix/io/sync/fsync`` and ``posix/io/sync/fdatasync``: ENOSPC (28), the WAL record or a
  snapshot file cannot be made durable;
* ``posix/io/rw/pwrite``: ENOSPC, the WAL append cannot be written (the storage layer writes
  files with ``os.pwrite`` only). ``posix/io/rw/write`` is not usable here: it fails every
  ``write(2)`` of the process, and uvicorn's event loop (uvloop, i.e. libuv) aborts the process
  (SIGABRT) when the ``write`` to its wake-up eventfd fails, which a full disk never causes;
  with ``--loop asyncio`` the server runs on under that fault and inserts still succeed, since
  no storage call uses ``write``;
* ``posix/io/oc/open``: ENOSPC. The WAL keeps the segment of a busy index open between
  appends, so inserts go on; a merge, which must create its files, answers 503 and leaves
  the index whole.

For fsync and pwrite: acknowledged inserts before the fault; with the fault on, an insert and a delete
answer 503 "nothing was acknowledged" (never 200, never 500) and searches keep answering; with
the fault off, the failed insert's id is inserted again with a new code and more inserts
succeed; then SIGKILL and restart: every acknowledged write is there, the failed insert is
absent (its code never matches, and the id is there once, with the retry's code), the failed
delete had no effect, and the size is exact. A merge (snapshot write) under fsync failure
answers 503 too and leaves the index whole.

Needs ``fiu-run``/``fiu-ctrl`` (Debian package ``fiu-utils``); without them the module is
skipped, unless ``CI_REQUIRE_FIU=1`` (set by .ci/run), which makes their absence an error.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess

import httpx
import pytest

pytestmark = pytest.mark.slow  # slow: make test-long

FIU_RUN, FIU_CTRL = shutil.which("fiu-run"), shutil.which("fiu-ctrl")
if not (FIU_RUN and FIU_CTRL):
    if os.environ.get("CI_REQUIRE_FIU") == "1":
        pytest.fail("CI_REQUIRE_FIU=1 but fiu-run/fiu-ctrl are not installed "
                    "(apt-get install fiu-utils)", pytrace=False)
    pytest.skip("fiu-run/fiu-ctrl not installed (Debian package fiu-utils)",
                allow_module_level=True)

BITS = 64
NAME = "fiu"
ENOSPC = 28
FAULTS = {
    "fsync": ("posix/io/sync/fsync", "posix/io/sync/fdatasync"),
    "pwrite": ("posix/io/rw/pwrite",),
    "open": ("posix/io/oc/open",),
}
#: every libfiu fault point these tests turn on (for the docs)
FAULT_POINTS = sorted({p for points in FAULTS.values() for p in points})


class Fiu:
    """``fiu-ctrl`` for one server started under ``fiu-run -x -f <prefix>``."""

    def __init__(self, prefix):
        self.prefix = str(prefix)

    def command(self, server, *commands: str) -> None:
        # fiu-ctrl would wait forever on the control FIFO of a dead process
        code = server.proc.poll()
        assert code is None, f"the server exited with {code} before fiu-ctrl {commands}; its " \
                             f"log ends:\n{server.log_text()[-3000:]}"
        args = [FIU_CTRL, "-f", self.prefix]
        for c in commands:
            args += ["-c", c]
        out = subprocess.run([*args, str(server.pid)], capture_output=True, text=True,
                             timeout=30)
        # fiu-ctrl exits 0 even when the pid is unknown or a command fails; it says so instead
        assert out.returncode == 0 and "rror" not in out.stdout + out.stderr, \
            f"fiu-ctrl {commands}: {out.stdout} {out.stderr}"

    def enable(self, server, points, errno: int = ENOSPC) -> None:
        self.command(server, *[f"enable name={p},failinfo={errno}" for p in points])

    def disable(self, server, points) -> None:
        self.command(server, *[f"disable name={p}" for p in points])


@pytest.fixture
def fiu_server(bucketsearch_server_factory, tmp_path):
    """``start() -> (server, fiu)``: a server under fiu-run on one data directory; call again
    after a kill to restart it (still under fiu-run, no fault enabled)."""
    fiu = Fiu(tmp_path / "fiu-ctrl")
    data = tmp_path / "data"

    def start():
        server = bucketsearch_server_factory(data, cmd_prefix=[FIU_RUN, "-x", "-f", fiu.prefix],
                                             log_path=tmp_path / "server.log")
        return server, fiu
    return start


def hexcode(code: int) -> str:
    return f"{code:016x}"


class Client:
    """httpx on one server; a dropped connection fails the test with the server's exit status
    and the end of its log (a crash under a fault is a finding, not noise)."""

    def __init__(self, server):
        self.server = server
        self.http = server.client()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.http.close()

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            code = self.server.wait_exit(2.0)
            raise AssertionError(
                f"{method} {path} {kwargs.get('json')}: {type(exc).__name__}: {exc}; server "
                f"{'still running' if code is None else f'exited with {code}'}; its log ends:"
                f"\n{self.server.log_text()[-3000:]}") from None

    def post(self, path: str, **kwargs) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def get(self, path: str, **kwargs) -> httpx.Response:
        return self.request("GET", path, **kwargs)


def insert(c, ident: int, code: int):
    return c.post(f"/v1/indexes/{NAME}/items", json={"ids": [ident], "codes": [hexcode(code)]})


def assert_refused(r, what: str) -> None:
    assert r.status_code == 503, f"{what}: expected 503 under the fault, got {r.status_code} " \
                                 f"{r.text}"
    assert "nothing was acknowledged" in r.json()["detail"], r.text


def lookup(c, codes: list[int]) -> list[list[int]]:
    r = c.post(f"/v1/indexes/{NAME}/search",
               json={"codes": [hexcode(x) for x in codes], "max_distance": 0})
    assert r.status_code == 200, r.text
    return [res["ids"] for res in r.json()["results"]]


def assert_state(c, live: dict[int, int], absent_codes: list[int]) -> None:
    """The index holds exactly ``live`` ({id: code}); no code of ``absent_codes`` matches."""
    ids = list(live)
    assert lookup(c, [live[i] for i in ids]) == [[i] for i in ids]
    assert lookup(c, absent_codes) == [[] for _ in absent_codes]
    r = c.post(f"/v1/indexes/{NAME}/search", json={"codes": [hexcode(0)], "k": 1000})
    dump = r.json()["results"][0]
    assert sorted(dump["ids"]) == sorted(ids), "the k-NN dump differs from the acknowledged ids"
    assert c.get(f"/v1/indexes/{NAME}").json()["size"] == len(live)


@pytest.mark.parametrize("fault", ["fsync", "pwrite"])
def test_fault_under_the_wal_refuses_then_recovers(fiu_server, fault):
    points = FAULTS[fault]
    rng = random.Random(fault)
    live: dict[int, int] = {}
    server, fiu = fiu_server()
    with Client(server) as c:
        assert c.post("/v1/indexes", json={"name": NAME, "bits": BITS}).status_code == 201
        for i in range(10):
            live[i] = rng.getrandbits(BITS)
            assert insert(c, i, live[i]).status_code == 200

        fiu.enable(server, points)
        try:
            failed = {100: rng.getrandbits(BITS), 101: rng.getrandbits(BITS)}
            for ident, code in failed.items():
                assert_refused(insert(c, ident, code), f"insert({ident}) with {fault} failing")
            assert_refused(c.post(f"/v1/indexes/{NAME}/items/delete", json={"ids": [3]}),
                           f"delete(3) with {fault} failing")
            # reads keep answering, and see neither the failed insert nor the failed delete
            assert lookup(c, [failed[100], live[3]]) == [[], [3]]
        finally:
            fiu.disable(server, points)

        retry = rng.getrandbits(BITS)
        r = insert(c, 100, retry)
        assert r.status_code == 200, f"the retry after the fault cleared: {r.status_code} {r.text}"
        live[100] = retry
        for i in range(10, 20):
            live[i] = rng.getrandbits(BITS)
            assert insert(c, i, live[i]).status_code == 200
        r = c.post(f"/v1/indexes/{NAME}/items/delete", json={"ids": [5]})
        assert r.status_code == 200 and r.json()["deleted"] == 1
        gone = live.pop(5)
        assert_state(c, live, [failed[100], failed[101], gone])

    server.kill()
    server, fiu = fiu_server()
    with Client(server) as c:
        assert_state(c, live, [failed[100], failed[101], gone])
        assert insert(c, 101, failed[101]).status_code == 200  # the failed id is free


@pytest.mark.parametrize("fault", ["fsync", "open"])
def test_merge_under_a_fault_refuses_and_leaves_the_index_whole(fiu_server, fault):
    points = FAULTS[fault]
    rng = random.Random(7)
    live: dict[int, int] = {}
    server, fiu = fiu_server()
    with Client(server) as c:
        assert c.post("/v1/indexes", json={"name": NAME, "bits": BITS}).status_code == 201
        for i in range(30):
            live[i] = rng.getrandbits(BITS)
            assert insert(c, i, live[i]).status_code == 200
        assert c.post(f"/v1/indexes/{NAME}/merge").status_code == 200  # a first snapshot
        for i in range(30, 40):
            live[i] = rng.getrandbits(BITS)
            assert insert(c, i, live[i]).status_code == 200
        assert c.post(f"/v1/indexes/{NAME}/items/delete", json={"ids": [0]}).status_code == 200
        gone = live.pop(0)

        fiu.enable(server, points)
        try:
            r = c.post(f"/v1/indexes/{NAME}/merge")
            assert r.status_code == 503, f"merge with {fault} failing: {r.status_code} {r.text}"
            assert_state(c, live, [gone])
            if fault == "open":  # the open segment takes writes on
                live[99] = rng.getrandbits(BITS)
                assert insert(c, 99, live[99]).status_code == 200
        finally:
            fiu.disable(server, points)

        for i in range(40, 45):
            live[i] = rng.getrandbits(BITS)
            assert insert(c, i, live[i]).status_code == 200
        r = c.post(f"/v1/indexes/{NAME}/merge")
        assert r.status_code == 200, f"merge after the fault cleared: {r.status_code} {r.text}"
        assert_state(c, live, [gone])

    server.kill()
    server, fiu = fiu_server()
    with Client(server) as c:
        assert_state(c, live, [gone])
