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
