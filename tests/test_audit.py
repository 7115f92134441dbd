"""Issue 30, the exactness audit: the sampler takes exactly one search per block of
round(1/rate); its oracle (index/storage/exact.py) equals the brute-force twin; served answers
(range, k-NN, top-k within a radius; with a delta and tombstones) check clean; an engine that
drops one id is found within the sampling bound, counted on /metrics, logged at error level and
reported by GET /v1/audit with its query; a full queue drops and counts; the checker keeps to
its CPU share."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
from helpers import add_codes, app_client, create_index
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import knn_within, range_search

from bucketsearch.app.audit import ExactnessAudit, Sample
from bucketsearch.index.codes import pack_bits, to_hex
from bucketsearch.index.storage.exact import exact_answer

BITS = 20


def words_of(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 2, size=(max(n // 3, 1), BITS), dtype=np.uint8)
    return pack_bits(pool[rng.integers(0, len(pool), n)] ^ (rng.random((n, BITS)) < 0.1))


def test_one_sample_per_block_at_a_random_position():
    audit = ExactnessAudit(rate=0.1, seed=1)
    assert audit.period == 10
    picks = []
    for n in range(1000):
        if audit.due():
            picks.append(n)
            audit.submit("x", None, None, 0, np.zeros((3, 1), np.uint64),
                         np.zeros(4, np.int64), np.empty(0, np.int32), np.empty(0, np.int64))
    assert [p // 10 for p in picks] == list(range(100))  # one per block
    assert len({p % 10 for p in picks}) > 5  # not always the same position
    assert max(b - a for a, b in zip(picks, picks[1:])) <= 2 * 10 - 1  # the sampling bound
    assert audit.sampled == 100
    audit.close()
    off = ExactnessAudit(rate=0.0)
    assert not any(off.due() for _ in range(100)) and off.report()["enabled"] is False


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 60), radius=st.integers(0, BITS), k=st.integers(1, 70),
       seed=st.integers(0, 10_000))
def test_oracle_equals_brute_force(n, radius, k, seed):
    xb = words_of(max(n, 1), seed)[:n]
    ids = np.random.default_rng(seed).permutation(10 * n + 1)[:n].astype(np.int64)
    q = words_of(1, seed + 1)
    got = exact_answer([(ids, xb, None)], q[0], max_distance=radius)
    _, want_d, want_ids = range_search(q, xb, ids, BITS, radius)
    assert got[0].tolist() == want_ids.tolist() and got[1].tolist() == want_d.tolist()
    got = exact_answer([(ids, xb, None)], q[0], k=k, max_distance=radius)
    want = knn_within(q, xb, ids, BITS, k, radius)
    assert got[0].tolist() == [i for i in want[1][0] if i >= 0]
    assert got[1].tolist() == [d for d in want[0][0] if d >= 0]
    got = exact_answer([(ids, xb, None)], q[0], k=k)  # k-NN over every item
    want = knn_within(q, xb, ids, BITS, k, BITS)
    assert got[0].tolist() == [i for i in want[1][0] if i >= 0]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 60), cut=st.integers(0, 60), drop=st.sets(st.integers(0, 59)),
       radius=st.integers(0, BITS), k=st.integers(1, 70), seed=st.integers(0, 10_000))
def test_oracle_over_segments_with_dropped_ids(n, cut, drop, radius, k, seed):
    """The oracle over in-place segments (a main part with tombstones, a delta part) equals
    brute force over the live items alone: range, k-NN within a radius and over everything."""
    xb = words_of(max(n, 1), seed)[:n]
    ids = np.random.default_rng(seed).permutation(10 * n + 1)[:n].astype(np.int64)
    cut = min(cut, n)
    gone = np.array(sorted(ids[i] for i in drop if i < cut), dtype=np.int64)
    parts = [(ids[:cut], xb[:cut], gone), (ids[cut:], xb[cut:], np.empty(0, np.int64))]
    keep = ~np.isin(ids, gone)
    live_ids, live_xb = ids[keep], xb[keep]
    q = words_of(1, seed + 1)
    got = exact_answer(parts, q[0], max_distance=radius)
    _, want_d, want_ids = range_search(q, live_xb, live_ids, BITS, radius)
    assert got[0].tolist() == want_ids.tolist() and got[1].tolist() == want_d.tolist()
    for within in (radius, None):
        got = exact_answer(parts, q[0], k=k, max_distance=within)
        want = knn_within(q, live_xb, live_ids, BITS, k, BITS if within is None else within)
        assert got[0].tolist() == [i for i in want[1][0] if i >= 0]
        assert got[1].tolist() == [d for d in want[0][0] if d >= 0]


def live_index(c, n: int = 400):
    """Main table (merged), a delta and tombstones (some in main, some re-inserted)."""
    w = words_of(n + 60, 0)
    create_index(c, "a", BITS, mode="single")
    add_codes(c, "a", range(n), w[:n], BITS)
    assert c.post("/v1/indexes/a/merge").status_code == 200
    add_codes(c, "a", range(n, n + 60), w[n:], BITS)
    assert c.post("/v1/indexes/a/items/delete", json={"ids": list(range(0, 40, 2))}
                  ).status_code == 200
    add_codes(c, "a", [0, 2], w[:2] ^ np.uint64(1), BITS)  # deleted from main, back in delta
    return w


def searches(c, w, n_requests: int):
    rng = np.random.default_rng(5)
    for i in range(n_requests):
        q = to_hex(w[rng.integers(0, len(w), 1 + i % 3)], BITS)
        body = [{"max_distance": 3}, {"k": 7}, {"k": 5, "max_distance": 2}][i % 3]
        r = c.post("/v1/indexes/a/search", json={"codes": q, **body})
        assert r.status_code == 200, r.text


def test_served_answers_check_clean_with_delta_and_tombstones(tmp_path):
    with app_client(tmp_path / "d", audit_rate=1.0, audit_cpu_share=1.0,
                    audit_queue=1000) as c:
        w = live_index(c)
        searches(c, w, 60)
        audit = c.app.state.registry.audit
        assert audit.drain()
        rep = c.get("/v1/audit").json()
        assert rep["sampled"] == 60 and rep["checked"] == 60 and rep["dropped"] == 0
        assert rep["checked_queries"] == sum(1 + i % 3 for i in range(60))
        assert rep["mismatched"] == 0 and rep["mismatches"] == [] and rep["errors"] == 0


class DropOne:
    """Wraps an engine: every answer loses its first id (range) or its first neighbour (k-NN,
    the row shifted left and padded): a wrong answer planted below the index."""

    def __init__(self, engine):
        self.engine = engine
        self.dropped: list[int] = []
        self.range_search, self.search = engine.range_search, engine.search

    def wrong_range(self, xq, radius, stats=False, max_results=None):
        lims, D, I, *rest = self.range_search(xq, radius, stats=stats, max_results=max_results)
        if len(I):
            self.dropped.append(int(I[0]))
            counts = np.diff(lims)
            counts[np.flatnonzero(counts)[0]] -= 1
            lims = np.concatenate([[0], np.cumsum(counts)])
            D, I = D[1:], I[1:]
        return (lims, D, I, *rest)

    def wrong_knn(self, xq, k, max_distance=None, stats=False):
        D, I, *rest = self.search(xq, k, max_distance=max_distance, stats=stats)
        D, I = D.copy(), I.copy()
        if I.size and I[0, 0] >= 0:
            self.dropped.append(int(I[0, 0]))
            D[0, :-1], I[0, :-1] = D[0, 1:], I[0, 1:]
            D[0, -1], I[0, -1] = -1, -1
        return (D, I, *rest)


@pytest.mark.parametrize("kind", ["range", "knn"])
def test_a_planted_wrong_answer_is_found_within_the_sampling_bound(tmp_path, kind, caplog):
    rate = 0.2  # one search in every 5 is sampled: the bound is 2 * 5 - 1 = 9 searches
    with app_client(tmp_path / "d", audit_rate=rate, audit_cpu_share=1.0) as c:
        w = live_index(c)
        entry = c.app.state.registry.entries["a"]
        main = entry.live.state.main
        fault = DropOne(main)
        if kind == "range":
            main.range_search = fault.wrong_range
        else:
            main.search = fault.wrong_knn
        bound = c.get("/v1/audit").json()["sampling_bound"]
        assert bound == 9
        body = {"max_distance": 2} if kind == "range" else {"k": 3}
        with caplog.at_level(logging.ERROR, logger="bucketsearch.audit"):
            for i in range(bound):
                r = c.post("/v1/indexes/a/search",
                           json={"codes": to_hex(w[100 + i:101 + i], BITS), **body})
                assert r.status_code == 200
            assert entry.audit.drain()
        assert fault.dropped  # the fault did fire
        rep = c.get("/v1/audit").json()
        assert rep["sampled"] >= 1 and rep["mismatched"] == rep["sampled"]
        bad = rep["mismatches"][0]
        assert bad["kind"] == kind and bad["index"] == "a"
        assert bad["query"] in [to_hex(w[100 + i:101 + i], BITS)[0] for i in range(bound)]
        assert set(bad["missing_ids"]) <= set(fault.dropped) and bad["missing_ids"]
        assert bad["tombstones"] == 20 and bad["delta_items"] == 62
        assert bad["served"]["n"] == bad["expected"]["n"] - (kind == "range")
        metrics = c.get("/metrics").text
        assert f"bucketsearch_audit_mismatched_total {float(rep['mismatched'])}" in metrics
        assert f"bucketsearch_audit_checked_total {float(rep['checked'])}" in metrics
        assert any(rec.levelno == logging.ERROR and "wrong" in rec.getMessage()
                   for rec in caplog.records)


def test_a_full_queue_drops_and_counts_and_the_cpu_share_holds(tmp_path):
    with app_client(tmp_path / "d", audit_rate=1.0, audit_queue=1,
                    audit_cpu_share=0.01) as c:
        w = live_index(c)
        searches(c, w, 30)
        rep = c.get("/v1/audit").json()
        assert rep["dropped"] > 0 and rep["sampled"] == 30
        assert "bucketsearch_audit_dropped_total" in c.get("/metrics").text


def test_checker_waits_for_the_serving_cpu():
    """After a check of c CPU seconds the checker waits until the other threads have used
    c (1/s - 1) CPU seconds (and as many wall seconds), or IDLE_SLOWDOWN times that idle."""
    audit = ExactnessAudit(rate=1.0, cpu_share=0.5)
    used = 0.02  # need = 0.02 s of other threads' CPU and of wall time
    stop = threading.Event()
    burner = threading.Thread(target=lambda: [sum(range(1000)) for _ in iter(stop.is_set,
                                                                              True)])
    others0 = time.process_time() - time.thread_time()
    t = time.monotonic()
    burner.start()
    audit._throttle(used)
    waited, others = time.monotonic() - t, time.process_time() - time.thread_time() - others0
    stop.set()
    burner.join()
    assert waited >= 0.02 and others >= 0.02  # a busy process: both conditions met
    t = time.monotonic()
    audit._throttle(used)  # nothing else runs: the idle bound, 10 x 0.02 s
    assert time.monotonic() - t >= 0.2
    audit.close()


def test_audit_off(tmp_path):
    with app_client(tmp_path / "d", audit_rate=0.0) as c:
        w = live_index(c)
        searches(c, w, 5)
        rep = c.get("/v1/audit").json()
        assert rep["enabled"] is False and rep["sampled"] == 0 and rep["period"] is None
