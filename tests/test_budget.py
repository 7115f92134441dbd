"""Bounded work before it starts (issue 31, app/budget.py): a request's probes, compares and
memory are estimated from what it asks and refused with 400 naming the budget before any work;
what runs on the event loop is decided by the answer's size too.

The acceptance test runs a real server process and reads its resident memory from /proc: the
peak (``VmHWM``, reset through ``/proc/<pid>/clear_refs`` before each request) stays within
100 MB of the resident size before the request."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import ServerProcess, app_client

from bucketsearch.app import budget
from bucketsearch.app.parsing import SearchJob
from bucketsearch.app.routers.search import INLINE_MAX_RESULTS, runs_inline
from bucketsearch.index.codes import pack_hex

MB = 1 << 20


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def _reset_peak(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # 5: reset the peak RSS (VmHWM)
    except OSError:
        return False
    return True


def _random_hex(n: int, bits: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [bytes(row).hex() for row in rng.integers(0, 256, (n, bits // 8), dtype=np.uint8)]


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory):
    """A real server with a 64 MiB memory budget and a 1,000-item 64-bit index (mode auto:
    the planner scans large radii, 0 probes, which the old calibration guard did not count)."""
    server = ServerProcess(tmp_path_factory.mktemp("budget") / "data",
                           {"BUCKETSEARCH_MAX_REQUEST_MEMORY": str(64 * MB),
                            "BUCKETSEARCH_CALIBRATION_QUERIES": "0"}).start()
    with server.client() as c:
        assert c.post("/v1/indexes", json={"name": "ix", "bits": 64}).status_code == 201
        codes = _random_hex(1000, 64, seed=1)
        assert c.post("/v1/indexes/ix/items", json={"ids": list(range(1000)),
                                                   "codes": codes}).status_code == 200
        assert c.post("/v1/indexes/ix/merge").status_code == 200
    yield server
    server.kill()


OVER_BUDGET = {
    # the example: grew the server to 18 GB before it was killed
    "calibrate": ("/v1/indexes/ix/cost-model/calibrate", {"queries": 100000, "max_distance": 64}),
    # 20,000 radius-64 queries with statistics: up to max_results ids and 20,000 x 65 counters
    "search": ("/v1/indexes/ix/search", {"codes": _random_hex(20000, 64, seed=2),
                                         "max_distance": 64, "stats": True}),
    # 20,000 queries: per query a histogram of 66 distances of every counter
    "evaluate": ("/v1/indexes/ix/evaluate", {"codes": _random_hex(20000, 64, seed=3),
                                             "relevant_ids": [[1]] * 20000}),
}


@pytest.mark.parametrize("route", sorted(OVER_BUDGET))
def test_a_request_over_the_budget_is_refused_before_memory_grows(budget_server, route):
    path, body = OVER_BUDGET[route]
    pid = budget_server.pid
    with budget_server.client() as c:
        before = _status_kb(pid, "VmRSS")
        if not _reset_peak(pid):
            pytest.skip("cannot reset the peak RSS through /proc/<pid>/clear_refs")
        res = c.post(path, json=body)
        peak = _status_kb(pid, "VmHWM")
        assert res.status_code == 400, res.text[:300]
        detail = res.json()["detail"]
        # a calibration times the single table (issue 26): its probes are counted first
        assert "max_request_memory" in detail or "max_request_compares" in detail or (
            route == "calibrate" and "max_request_probes" in detail), detail
        assert "BUCKETSEARCH_MAX_REQUEST_" in detail
        print(f"{route}: refused, peak RSS - RSS before = {(peak - before) / 1024:.1f} MB")
        assert (peak - before) * 1024 < 100 * MB, (route, before, peak)
        # and the server still serves: a request within the budget runs
        ok = c.post("/v1/indexes/ix/cost-model/calibrate", json={"queries": 16,
                                                                  "max_distance": 2})
        assert ok.status_code == 200, ok.text[:300]


# ------------------------------------------------------------------------- the estimates
def _live(client, name="ix"):
    return client.app.state.registry.entries[name].live


def _state(client, name="ix"):
    return _live(client, name).state


def test_the_calibration_budget_counts_the_scan_plan(tmp_path):
    """The old guard multiplied by the single-table probe count, 0 when the planner scans: the
    issue's request passed it. The budget counts every radius's answer and counters."""
    with app_client(tmp_path / "d") as c:
        c.post("/v1/indexes", json={"name": "ix", "bits": 64})
        c.post("/v1/indexes/ix/items", json={"ids": list(range(1000)),
                                            "codes": _random_hex(1000, 64, seed=1)})
        c.post("/v1/indexes/ix/merge")
        state, settings = _state(c), c.app.state.settings
        assert budget.plan_mode(state.main, 64, 100000) == "scan"
        assert state.main.probe_count(64, 100000) == 0  # what the old guard multiplied by
        with pytest.raises(budget.BudgetExceeded) as err:
            budget.check_calibration(_live(c), 100000, 64, settings)
        # the calibration times the single table (issue 26), 9 passes at most: its probes
        assert err.value.setting in ("max_request_memory", "max_request_compares",
                                     "max_request_probes")
        assert err.value.asked > err.value.limit
        budget.check_calibration(_live(c), 256, 2, settings)  # the default passes
        res = c.post("/v1/indexes/ix/cost-model/calibrate", json={"queries": 100000,
                                                                   "max_distance": 64})
        assert res.status_code == 400 and "max_request_" in res.json()["detail"]


def test_answer_bound_is_an_upper_bound_of_the_answer(tmp_path):
    """Against real answers: a skewed index (one code held by many items) and random ones."""
    rng = np.random.default_rng(5)
    with app_client(tmp_path / "d") as c:
        c.post("/v1/indexes", json={"name": "ix", "bits": 16, "mode": "single"})
        codes = ["abcd"] * 300 + _random_hex(700, 16, seed=6)
        c.post("/v1/indexes/ix/items", json={"ids": list(range(1000)), "codes": codes})
        c.post("/v1/indexes/ix/merge")
        c.post("/v1/indexes/ix/items", json={"ids": [5000, 5001], "codes": ["abcd", "0000"]})
        state = _state(c)
        assert budget.largest_bucket(state.main) >= 300
        for radius in (0, 1, 2, 4):
            queries = ["abcd"] + _random_hex(7, 16, seed=int(rng.integers(1 << 30)))
            got = c.post("/v1/indexes/ix/search", json={"codes": queries,
                                                        "max_distance": radius}).json()
            n = sum(len(r["ids"]) for r in got["results"])
            assert n <= budget.answer_bound(state, len(queries), radius)


def test_a_small_search_with_a_huge_answer_does_not_run_on_the_event_loop(tmp_path):
    """Radius 0 on a bucket of 39,000 items: one probe per query, so the old rule (probes
    only) ran it inline: 128 queries built and encoded 5M ids on the event loop."""
    with app_client(tmp_path / "d") as c:
        c.post("/v1/indexes", json={"name": "ix", "bits": 16, "mode": "single"})
        c.post("/v1/indexes/ix/items", json={"ids": list(range(39000)),
                                            "codes": ["abcd"] * 39000})
        c.post("/v1/indexes/ix/merge")
        c.post("/v1/indexes/ix/items", json={"ids": [90000], "codes": ["0001"]})
        entry = c.app.state.registry.entries["ix"]
        # the first search of a snapshot runs in the thread pool, where its budget check
        # finds the largest bucket (an O(buckets) pass kept off the event loop)
        assert not runs_inline(entry, SearchJob(pack_hex(["0001"], 16), 0, None, False, False,
                                                0.0))
        c.post("/v1/indexes/ix/search", json={"codes": ["0001"], "max_distance": 0})
        big = SearchJob(pack_hex(["abcd"] * 128, 16), 0, None, False, False, 0.0)
        assert 128 * entry.live.state.main.probe_count(0) <= 5_000  # few probes
        assert not runs_inline(entry, big)
        small = SearchJob(pack_hex(["abcd"], 16), 0, None, False, False, 0.0)
        assert not runs_inline(entry, small)  # 39,000 ids > INLINE_MAX_RESULTS
        assert 39000 > INLINE_MAX_RESULTS
    with app_client(tmp_path / "e") as c:  # a small answer still runs inline
        c.post("/v1/indexes", json={"name": "ix", "bits": 16, "mode": "single"})
        c.post("/v1/indexes/ix/items", json={"ids": [1, 2], "codes": ["abcd", "0000"]})
        c.post("/v1/indexes/ix/merge")
        entry = c.app.state.registry.entries["ix"]
        c.post("/v1/indexes/ix/search", json={"codes": ["abcd"], "max_distance": 1})
        assert runs_inline(entry, SearchJob(pack_hex(["abcd"], 16), 1, None, False, False,
                                            0.0))


def test_work_of_is_the_documented_bound():
    """The figures the sharded index has (counts of its shards, the fan-out's probes), turned
    into work by the same formula as a live state's: a worked example."""
    from bucketsearch.index.budget import work_of
    work = work_of(3, 1, 64, per_query_probes=65, scan=False, main_size=1000, delta_size=10,
                   answer=3 * (1000 + 10), max_results=100)
    assert work.probes == 3 * 65 and work.compares == 3 * 10 and work.answer == 100
    assert work.memory == 100 * budget.RESULT_BYTES + budget.stats_bytes(3, 2)
    scan = work_of(3, 1, 64, 0, True, 1000, 10, 3030, None)
    assert scan.compares == 3 * (1000 + 10) and scan.answer == 3030
    assert scan.memory == 3030 * budget.RESULT_BYTES + budget.stats_bytes(3, 65)


@pytest.fixture(scope="module")
def small_budget(tmp_path_factory):
    """In process, the smallest memory budget (1 MiB), a 16-bit index of 2,000 items."""
    with app_client(tmp_path_factory.mktemp("small") / "d", max_request_memory=1 << 20) as c:
        c.post("/v1/indexes", json={"name": "ix", "bits": 16})
        c.post("/v1/indexes/ix/items", json={"ids": list(range(2000)),
                                            "codes": _random_hex(2000, 16, seed=9)})
        c.post("/v1/indexes/ix/merge")
        yield c


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/v1/indexes/ix/radius-profile?queries=1024&max_distance=4", None),
    ("POST", "/v1/indexes/ix/search", {"codes": _random_hex(200, 16, seed=4), "k": 200}),
    ("POST", "/v1/indexes/ix/search", {"codes": _random_hex(200, 16, seed=4),
                                       "max_distance": 6}),
    # radii 0..3: the single table's probes (9 passes) within max_request_probes, memory not
    ("POST", "/v1/indexes/ix/cost-model/calibrate", {"queries": 5000, "max_distance": 3}),
])
def test_every_route_that_searches_checks_the_memory_budget(small_budget, method, path, body):
    res = small_budget.request(method, path, json=body)
    assert res.status_code == 400, res.text[:300]
    detail = res.json()["detail"]
    assert "max_request_memory=1,048,576 (BUCKETSEARCH_MAX_REQUEST_MEMORY)" in detail, detail
    small = small_budget.post("/v1/indexes/ix/search", json={"codes": ["0000"],
                                                             "max_distance": 1})
    assert small.status_code == 200
