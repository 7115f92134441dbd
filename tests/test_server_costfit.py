"""app.costfit: the server's per-radius bookkeeping, on made-up stats with exact answers."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from bucketsearch.app.costfit import CostTracker, RadiusRecord, bucket_of, bucket_upper_ns
from bucketsearch.index.probe import SearchStats


def _stats(lookup_ns, probes, radii, empty=None):
    lookup_ns = np.asarray(lookup_ns, dtype=np.int64)
    probes = np.asarray(probes, dtype=np.int64)
    zeros = np.zeros_like(probes)
    empty = zeros if empty is None else np.asarray(empty, dtype=np.int64)
    return SearchStats(probes, probes - empty, empty, zeros.copy(), lookup_ns,
                       radii=np.asarray(radii), total_ns=lookup_ns.sum(axis=1))


def test_histogram_buckets_bound_the_value():
    ns = np.array([1, 2, 3, 100, 12345, 10**9])
    b = bucket_of(ns)
    upper = bucket_upper_ns(b)
    lower = bucket_upper_ns(b - 1)
    assert np.all(lower <= ns) and np.all(ns < upper * 1.0000001)
    assert np.all(upper / lower < 1.05)  # 16 buckets per octave: ~4.4% wide


def test_observe_counts_only_radii_each_query_reached():
    tracker = CostTracker(64)
    st = _stats(lookup_ns=[[100, 6400, 0], [120, 7000, 200_000]],
                probes=[[1, 64, 0], [1, 64, 2016]], radii=[2, 3], empty=[[1, 60, 0],
                                                                    [0, 64, 2000]])
    tracker.observe(st)
    rec = tracker.snapshot()
    assert sorted(rec) == [0, 1, 2]
    assert [rec[r].n for r in (0, 1, 2)] == [2, 2, 1]
    assert rec[1].probes_total == 128 and rec[2].probes_total == 2016
    assert rec[1].empty_total == 124 and rec[2].empty_total == 2000
    assert rec[2].sum_ns == 200_000
    assert 200_000 <= rec[2].quantile(0.5) < 200_000 * 1.05
    p = np.array([1, 64, 1, 64, 2016.0])
    t = np.array([100, 6400, 120, 7000, 200_000.0])
    assert tracker.t0() == (pytest.approx(float(p @ t / (p @ p))), "observed searches")
    tracker.set_calibration(2.5, {"queries": 1})
    assert tracker.t0() == (2.5, "calibration")


def test_quantiles_of_made_up_latencies():
    tracker = CostTracker(8)
    lat = np.arange(1, 1001) * 1000  # 1 us .. 1 ms
    tracker.observe(_stats(lookup_ns=lat[:, None], probes=np.ones((1000, 1)),
                           radii=np.ones(1000, dtype=int)))
    rec = tracker.snapshot()[0]
    for q, exact in ((0.5, 500_000), (0.9, 900_000), (0.99, 990_000)):
        assert exact <= rec.quantile(q) <= exact * 1.05


def test_concurrent_observers_lose_nothing():
    tracker = CostTracker(16)
    st = _stats(lookup_ns=[[50, 500]], probes=[[1, 16]], radii=[2])

    def work():
        for _ in range(500):
            tracker.observe(st)
            if np.random.random() < 0.05:
                tracker.snapshot()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec = tracker.snapshot()
    assert rec[0].n == rec[1].n == 2000 and rec[1].probes_total == 2000 * 16
    assert tracker.samples == 4000


def test_cumulative_histogram_empty_balls_and_items():
    """Per radius: T(R) = the query's lookup_ns summed up to R; empty_ball counts the queries
    with no item up to R; the observed t0 interval is the radius_fit's."""
    tracker = CostTracker(64)
    lookup = [[100, 6400, 0], [120, 7000, 200_000], [90, 0, 0]]
    items = [[0, 0, 0], [0, 2, 5], [1, 0, 0]]
    st = _stats(lookup_ns=lookup, probes=[[1, 64, 0], [1, 64, 2016], [1, 0, 0]],
                radii=[2, 3, 1])
    st.items = np.asarray(items)
    tracker.observe(st)
    rec = tracker.snapshot()
    assert [rec[r].empty_ball for r in range(3)] == [2, 1, 0]
    assert [rec[r].items_total for r in range(3)] == [1, 2, 5]
    assert rec[1].cum_sum_ns == 6500 + 7120 and rec[2].cum_sum_ns == 207_120
    assert bucket_of(np.array([207_120]))[0] == np.flatnonzero(rec[2].cum_counts)[0]
    # the quantile is the upper bound of the bucket of the rank-th value (here: the larger)
    assert rec[1].cumulative_quantile(0.99) == bucket_upper_ns(bucket_of(np.array([7120]))[0])
    assert tracker.queries == 3
    est = tracker.observed_t0()
    assert est.estimator == "radius_fit" and est.samples == 6
    assert est.ci_ns[0] < est.t0_ns < est.ci_ns[1]


def test_records_copy_add_and_json_round_trip():
    tracker = CostTracker(16)
    st = _stats(lookup_ns=[[50, 500], [70, 900]], probes=[[1, 16], [1, 16]], radii=[2, 2])
    tracker.observe(st)
    rec = tracker.snapshot()[1]
    again = RadiusRecord.from_json(rec.to_json())
    for f in RadiusRecord.ADDITIVE:
        assert np.array_equal(getattr(again, f), getattr(rec, f)), f
    total = rec.copy().add(again)
    assert total.n == 2 * rec.n and total.empty_ball == 2 * rec.empty_ball
    assert np.array_equal(total.cum_counts, 2 * rec.cum_counts)
    assert rec.n == 2  # the copy was added to, not the record


# -- the calibration: repeated until its interval is tight, or reported unstable ---------------
def _live_single(tmp_path, mode="single"):
    from bucketsearch.index.codes import pack_bits
    from bucketsearch.index.storage.live import LiveIndex

    rng = np.random.default_rng(2)
    live = LiveIndex(tmp_path, 32, mode=mode, background_merge=False)
    live.add(pack_bits(rng.integers(0, 2, size=(2000, 32), dtype=np.uint8)), np.arange(2000))
    live.merge()
    return live


def _timed_as(monkeypatch, engine, ns_per_probe):
    """Beneath the real search: each call's measured lookup_ns replaced by
    ``ns_per_probe() x probes`` (a quiet machine: a constant; a busy one: a random factor)."""
    real = type(engine).range_search

    def range_search(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        out[3].lookup_ns = (out[3].probes * ns_per_probe()).astype(np.int64)
        return out

    monkeypatch.setattr(type(engine), "range_search", range_search)


def test_calibration_stops_once_its_interval_is_tight(tmp_path, monkeypatch):
    from bucketsearch.app.costfit import CALIBRATION_ROUNDS, calibrate

    live = _live_single(tmp_path)
    _timed_as(monkeypatch, live.state.main, lambda: 12.0)
    tracker = CostTracker(32)
    assert calibrate(live, tracker, 16, 2) == pytest.approx(12.0)
    cal = tracker.calibration
    assert len(cal["rounds"]) == CALIBRATION_ROUNDS[0] and cal["stable"] is True
    assert cal["ci_ns"] == pytest.approx([12.0, 12.0]) and cal["engine"] == "single"
    assert cal["verdict"].startswith("stable: 3 rounds")
    live.close()


def test_a_noisy_calibration_is_reported_unstable_with_its_interval(tmp_path, monkeypatch):
    from bucketsearch.app.costfit import CALIBRATION_ROUNDS, calibrate

    live = _live_single(tmp_path, mode="auto")
    rng = np.random.default_rng(0)
    # an auto index: its planner's single table is the one timed
    _timed_as(monkeypatch, live.state.main.single, lambda: 10.0 * rng.choice([1.0, 11.0]))
    tracker = CostTracker(32)
    t0 = calibrate(live, tracker, 16, 2)
    cal = tracker.calibration
    assert len(cal["rounds"]) == CALIBRATION_ROUNDS[1] and cal["stable"] is False
    lo, hi = cal["ci_ns"]
    assert lo < t0 < hi and t0 == pytest.approx(np.mean(cal["rounds"]))
    assert cal["verdict"].startswith(f"unstable after {CALIBRATION_ROUNDS[1]} rounds")
    assert f"{lo:.3g} .. {hi:.3g}" in cal["verdict"]
    live.close()


def test_an_mih_index_has_no_single_table_to_calibrate(tmp_path):
    from bucketsearch.app.costfit import calibrate

    live = _live_single(tmp_path, mode="mih")
    tracker = CostTracker(32)
    assert calibrate(live, tracker, 16, 2) is None
    assert "no single table" in tracker.calibration["reason"] and tracker.t0() == (None, None)
    live.close()


def test_knn_and_other_engines_move_no_per_radius_row_of_the_paper():
    """A k-NN query (radius reached 17, 0 ns per ring: a scan) folds into no per-radius row and
    moves no p50; an mih query counts for the radii of what ran but not for the paper's rows
    nor its t0 (issue 26: R = 5..15 rows of 0 ns, R = 4's p50 turned 0)."""
    from bucketsearch.index.base import ENGINES

    tracker = CostTracker(64)
    single = _stats(lookup_ns=[[100, 6400]] * 3, probes=[[1, 64]] * 3, radii=[2, 2, 2])
    single.engine = np.full(3, ENGINES.index("single"), dtype=np.int8)
    single.k = np.zeros(3, dtype=np.int32)
    knn = _stats(lookup_ns=np.zeros((5, 18)), probes=np.zeros((5, 18)), radii=[18] * 5)
    knn.engine = np.full(5, ENGINES.index("scan"), dtype=np.int8)
    knn.k = np.full(5, 10, dtype=np.int32)
    mih = _stats(lookup_ns=[[300, 300]] * 4, probes=[[1, 1]] * 4, radii=[2] * 4)
    mih.engine = np.full(4, ENGINES.index("mih"), dtype=np.int8)
    mih.k = np.zeros(4, dtype=np.int32)
    for st in (single, knn, mih):
        tracker.observe(st)
    every, paper = tracker.snapshot(), tracker.snapshot(paper=True)
    assert sorted(every) == sorted(paper) == [0, 1]           # nothing above radius 1
    assert [every[r].n for r in (0, 1)] == [7, 7] and [paper[r].n for r in (0, 1)] == [3, 3]
    assert 100 <= paper[0].quantile(0.5) < 105 and 6400 <= paper[1].quantile(0.5) < 6400 * 1.05
    assert tracker.queries == 7 and tracker.knn_queries == 5
    # the paper's t0: single-table samples only (100/1, 6400/64: 100 ns per probe)
    assert tracker.t0()[0] == pytest.approx(100.0)
