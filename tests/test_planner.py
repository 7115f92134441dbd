"""The planner (mode "auto"): exact whatever it chooses, never an over-limit single table."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.evaluation.synth import clustered_codes, queries_near
from bucketsearch.index.factory import make_index
from bucketsearch.index.mih import MultiIndex
from bucketsearch.index.planner import PLAN_MODES, AutoIndex
from bucketsearch.index.probe import HammingIndex
from bucketsearch.index.scan import LinearScan
from tests import naive
from tests.test_mih import BITS, RADII, check_same, make_data


def build_auto(bits, xb, ids, **kw):
    kw.setdefault("calibration_queries", 6)
    index = AutoIndex(bits, **kw)
    if len(xb):
        index.add(xb, ids)
    return index


def build_scan(bits, xb, ids):
    scan = LinearScan(bits)
    if len(xb):
        scan.add(xb, ids)
    return scan


def force(index, mode):
    """Make ``mode`` the cheapest by the models (the others 1000x dearer)."""
    index.scan_ns_per_item = 0.0 if mode == "scan" else 1e6
    for name, model in index.models.items():
        model.coef = {k: (0.0 if name == mode else 1e6) for k in model.coef}
        index.overhead_ns[name] = (0.0, 0.0) if name == mode else (1e9, 0.0)
    index._plan_cache = {}


@settings(max_examples=30, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 50), seed=st.integers(0, 2**31),
       clustered=st.booleans())
def test_auto_matches_scan(bits, n, seed, clustered):
    xb, ids, xq = make_data(bits, n, 6, seed, clustered)
    index = build_auto(bits, xb, ids)
    scan = build_scan(bits, xb, ids)
    for R in RADII:
        out = index.range_search(xq, R, stats=True)
        check_same(out[:3], scan.range_search(xq, R))
        plan = out[3].plan
        assert plan["mode"] in PLAN_MODES and plan["radius"] == R
        assert set(plan["predicted_ns"]) == set(PLAN_MODES)
        if index.single.probe_count(R) > index.single.max_probes:
            assert plan["predicted_ns"]["single"] is None and plan["mode"] != "single"
    for k in (1, 4, 30):
        D, I, stats = index.search(xq, k, stats=True)
        check_same((D, I), scan.search(xq, k))
        assert stats.plan["k"] == k


@settings(max_examples=25, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 50), seed=st.integers(0, 2**31),
       k=st.sampled_from([1, 4, 30]), data=st.data())
def test_top_k_within_radius_matches_brute_force(bits, n, seed, k, data):
    """search(k, max_distance) by whichever path the planner picks equals brute force; the
    plan is made for radius min(R_k, max_distance)."""
    xb, ids, xq = make_data(bits, n, 6, seed, True)
    index = build_auto(bits, xb, ids)
    R = data.draw(st.integers(0, bits))
    D, I, stats = index.search(xq, k, max_distance=R, stats=True)
    nD, nI = naive.knn_within(xq, xb, ids, bits, k, R) if n else \
        (np.full((6, k), -1), np.full((6, k), -1))
    assert np.array_equal(D, nD) and np.array_equal(I, nI)
    assert stats.plan["k"] == k and stats.plan["radius"] <= R and (stats.radii <= R + 1).all()


def test_probe_count_is_the_planned_engines_count():
    """probe_count(R, nq) of the planner is the count of the engine its plan runs (one meaning
    across engines: bucket lookups per query; the scan's 0)."""
    bits = 64
    xb, ids, xq = make_data(bits, 300, 5, 2)
    index = build_auto(bits, xb, ids, max_probes=3000)
    for mode in PLAN_MODES:
        force(index, mode)
        for R in RADII:
            planned = index.plan(max_distance=R, nq=7)["mode"]
            count = index.probe_count(R, 7)
            assert count == index._index_for(planned).probe_count(R) <= index.max_probes
            st_ = index.range_search(xq, R, stats=True)[3]
            assert (st_.probes.sum(axis=1) == count).all()  # what the stats add up to
    assert index.scan.probe_count(3) == 0


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("bits", [16, 64, 128])
def test_every_forced_plan_is_exact(mode, bits):
    xb, ids, xq = make_data(bits, 200, 9, 11)
    index = build_auto(bits, xb, ids, max_probes=200_000)
    scan = build_scan(bits, xb, ids)
    force(index, mode)
    for R in RADII:
        lims, D, I, stats = index.range_search(xq, R, stats=True)
        check_same((lims, D, I), scan.range_search(xq, R))
        expected = mode
        if mode == "single" and index.single.probe_count(R) > index.single.max_probes:
            expected = min(("mih", "scan"), key=lambda m: stats.plan["predicted_ns"][m] or 1e300)
        assert stats.plan["mode"] == expected
        assert index.last_plan["mode"] == expected
        if expected == "mih":
            assert stats.candidates is not None
    D, I, stats = index.search(xq, 5, stats=True)
    check_same((D, I), scan.search(xq, 5))


def test_single_table_never_chosen_over_max_probes():
    bits = 64
    xb, ids, xq = make_data(bits, 300, 5, 2)
    index = build_auto(bits, xb, ids, max_probes=1000)
    force(index, "single")  # single is free by the models, yet over the limit at R >= 2
    for R in RADII:
        plan = index.range_search(xq, R, stats=True)[3].plan
        if index.single.probe_count(R) > 1000:
            assert plan["mode"] != "single" and plan["predicted_ns"]["single"] is None
            assert "excluded" in plan["reason"]
        else:
            assert plan["mode"] == "single"
    # k-NN: a single-table plan that hits the probe limit falls back, still exact
    D, I, stats = index.search(xq, 50, stats=True)
    check_same((D, I), build_scan(bits, xb, ids).search(xq, 50))
    assert stats.plan["mode"] in ("mih", "scan", "single")
    if stats.plan["mode"] != "single":
        assert stats.plan.get("fallbacks") or stats.plan["predicted_ns"]["single"] is None


def test_calibration_and_prediction():
    bits = 64
    xb = clustered_codes(4000, bits, n_clusters=40, flip=0.03, seed=5)
    index = AutoIndex(bits, calibration_queries=12)
    index.add(xb)
    cal = index.calibration
    assert cal["calibrated"] and cal["queries"] == 12
    assert cal["single"]["radius"] >= 2 and cal["mih"]["radius"] >= 2
    assert index.paper.t0_ns > 0 and index.scan_ns_per_item > 0
    # the data profile: expected items per distance sum to N
    assert index.items_d.sum() == pytest.approx(4000)
    for j, w in enumerate(index.mih.sub_widths):
        assert index.sub_items[j].sum() == pytest.approx(4000)
        assert len(index.sub_codes[j]) == w + 1
    pred = index.predict(3)
    assert all(v is None or v > 0 for v in pred.values())
    # re-runnable, with the caller's queries
    xq = queries_near(xb, 10, bits, flips=1, seed=9)
    again = index.calibrate(xq)
    assert again["calibrated"] and again["queries"] == 10
    assert index.knn_radius(1) <= index.knn_radius(100) <= bits
    # uncalibrated (empty) index still plans
    empty = AutoIndex(bits)
    assert empty.calibration["calibrated"] is False
    assert empty.plan(max_distance=2)["mode"] in PLAN_MODES


def test_make_index_modes():
    assert type(make_index(64)) is HammingIndex
    assert type(make_index(64, "mih", substrings=4)) is MultiIndex
    assert make_index(64, "mih", substrings=4).substrings == 4
    auto = make_index(64, "auto", substrings=2, calibration_queries=4)
    assert type(auto) is AutoIndex and auto.substrings == 2
    assert type(make_index(64, "scan")) is LinearScan
    with pytest.raises(ValueError, match="mode must be one of"):
        make_index(64, "fast")
    with pytest.raises(ValueError, match="substrings applies to mode 'mih' or 'auto'"):
        make_index(64, "single", substrings=2)
    with pytest.raises(ValueError, match=r"substrings must be in \[1, 64\]"):
        make_index(64, "mih", substrings=65)
    with pytest.raises(ValueError, match="calibration_queries"):
        make_index(64, "auto", calibration_queries=0)


def test_auto_save_load_and_threads(tmp_path):
    bits = 128
    xb, ids, xq = make_data(bits, 300, 24, 8)
    index = build_auto(bits, xb, ids)
    index.save(tmp_path / "auto")
    loaded = AutoIndex.load(tmp_path / "auto")
    assert loaded.ntotal == 300 and loaded.substrings == index.substrings
    scan = build_scan(bits, xb, ids)
    for threads in (1, 2):
        loaded.threads = threads
        for R in (0, 3, 8):
            check_same(loaded.range_search(xq, R), scan.range_search(xq, R))
        check_same(loaded.search(xq, 6), scan.search(xq, 6))
    assert loaded.remove(ids[:10]) == 10 and loaded.ntotal == 290


def test_plan_cache_respects_a_lowered_probe_limit():
    """A shallow copy with a lower max_probes (the server's per-request limit) shares the plan
    cache: a plan made under the higher limit must not be reused."""
    import copy
    bits = 64
    xb, ids, xq = make_data(bits, 300, 5, 4)
    index = build_auto(bits, xb, ids)
    force(index, "single")
    assert index.range_search(xq, 2, stats=True)[3].plan["mode"] == "single"
    view = copy.copy(index)
    view.single, view.mih = copy.copy(index.single), copy.copy(index.mih)
    view.max_probes = 100
    plan = view.range_search(xq, 2, stats=True)[3].plan
    assert plan["mode"] != "single" and plan["predicted_ns"]["single"] is None
    assert index.range_search(xq, 2, stats=True)[3].plan["mode"] == "single"


def test_distinct_code_profile_from_a_sample_estimates_the_exact_one():
    """The planner's count of distinct codes at each distance, from a weighted sample of items
    (no pass over them at a restart), against the exact count over every distinct code: a
    clustered set (codes repeated up to hundreds of times) of 60k items, sampled 8k."""
    from bucketsearch.index.planner import _distance_histograms, _distinct_sample
    from bucketsearch.index.table import sort_items
    words, _ = sort_items(clustered_codes(60_000, 32, seed=5), np.arange(60_000))
    xq = np.ascontiguousarray(queries_near(words, 8, 32, seed=6))
    exact_codes, ones = _distinct_sample(words, len(words), np.random.default_rng(0))
    assert np.all(ones == 1) and len(exact_codes) == len(np.unique(words, axis=0))
    exact = _distance_histograms(xq, exact_codes, ones, 32).sum(axis=0)
    rows, weights = _distinct_sample(words, 8_000, np.random.default_rng(1))
    assert len(rows) == 8_000
    estimate = _distance_histograms(xq, rows, weights, 32).sum(axis=0)
    assert estimate.sum() == pytest.approx(exact.sum(), rel=0.1)
    cum_e, cum_x = np.cumsum(estimate), np.cumsum(exact)
    big = cum_x > 200  # where the exact cumulative count is large enough to be estimated
    assert np.all(np.abs(cum_e[big] / cum_x[big] - 1) < 0.25)


def test_distinct_substring_profile_from_a_sample_estimates_the_exact_one():
    """Each table's count of distinct substrings at each distance from a weighted sample of
    items (run sizes by binary search in the table), against the exact count."""
    from bucketsearch.index.planner import _distance_histograms
    words = clustered_codes(60_000, 32, seed=8)
    index = MultiIndex(32, substrings=2)
    index.add(words, np.arange(len(words)))
    xq = np.ascontiguousarray(queries_near(words, 8, 32, seed=9))
    qsubs = index.substring_codes(xq)
    for j in range(index.substrings):
        w = int(index.sub_widths[j])
        qj = np.ascontiguousarray(qsubs[:, j:j + 1])
        exact_values, ones = index.distinct_substring_sample(j, 10**9, np.random.default_rng(0))
        assert np.all(ones == 1)
        assert len(exact_values) == len(np.unique(index.substring_codes(words)[:, j]))
        exact = _distance_histograms(qj, exact_values.reshape(-1, 1), ones, w).sum(axis=0)
        values, weights = index.distinct_substring_sample(j, 8_000, np.random.default_rng(1))
        estimate = _distance_histograms(qj, np.ascontiguousarray(values.reshape(-1, 1)),
                                        weights, w).sum(axis=0)
        assert estimate.sum() == pytest.approx(exact.sum(), rel=0.1)
        cum_e, cum_x = np.cumsum(estimate), np.cumsum(exact)
        big = cum_x > 200
        assert np.all(np.abs(cum_e[big] / cum_x[big] - 1) < 0.25)


def test_scan_calibrated_on_a_prefix_of_the_items(monkeypatch):
    """Past SCAN_CALIBRATION_ITEMS the scan's cost per item is timed on a prefix of the items
    (shared, not copied); the answers stay exact whatever the plan."""
    from bucketsearch.index import planner
    monkeypatch.setattr(planner, "SCAN_CALIBRATION_ITEMS", 1_000)
    words = clustered_codes(5_000, 64, seed=3)
    index = AutoIndex(64, calibration_queries=16)
    index.add(words, np.arange(len(words)))
    part, m = index._prefix_scan(planner.SCAN_CALIBRATION_ITEMS)
    assert m == 1_000 and part is not index.scan and part.words.base is not None
    whole, n = index._prefix_scan(planner.SCAN_STREAM_ITEMS)  # (the stream: every item here)
    assert n == len(words) and whole is index.scan
    summary = index.calibrate()
    assert 0 < summary["scan"]["ns_per_item"] < 1e4
    knn = summary["scan"]["knn"]  # (c, s, e) of the blocked k-NN scan
    assert 0 < knn["ns_per_item"] < 1e4 and knn["ns_per_item_pass"] >= 0 \
        and knn["ns_per_kept"] >= 0
    xq = queries_near(words, 5, 64, seed=4)
    lims, D, I = index.range_search(xq, 3)
    nl, nD, nI = naive.range_search(xq, words, np.arange(len(words)), 64, 3)
    assert (lims == nl).all() and sorted(zip(D, I)) == sorted(zip(nD, nI))


def test_a_snapshot_keeps_its_calibration_on_the_same_machine(monkeypatch):
    """The planner's calibration travels in the snapshot's metadata (JSON) and is taken back
    on the machine that timed it: the plans and predictions are the saved ones, no timing
    runs. On another machine, or from a state timed with statistics (before "timed"), the
    loaded index calibrates again."""
    import json

    from bucketsearch.index import planner
    words = clustered_codes(3_000, 64, seed=11)
    index = AutoIndex(64, calibration_queries=16)
    index.add(words, np.arange(len(words)))
    assert index.calibrated
    meta, arrays = index.snapshot()
    meta = json.loads(json.dumps(meta))
    timed = []
    monkeypatch.setattr(AutoIndex, "calibrate",
                        lambda self, *a, **k: timed.append(1) or self._set_default_models())
    loaded = AutoIndex.from_snapshot(64, meta, arrays)
    assert timed == [] and loaded.calibrated and loaded.calibration["restored"]
    for r in range(6):
        assert loaded.predict(r) == pytest.approx(index.predict(r))
        assert loaded.plan(max_distance=r)["mode"] == index.plan(max_distance=r)["mode"]
    assert loaded.plan(k=10)["predicted_ns"] == pytest.approx(index.plan(k=10)["predicted_ns"])
    older = {**meta, "calibration_state": {k: v for k, v in meta["calibration_state"].items()
                                           if k != "timed"}}  # timed with statistics
    AutoIndex.from_snapshot(64, older, arrays)
    assert timed == [1]
    monkeypatch.setattr(planner, "machine_fingerprint", lambda: "another machine")
    AutoIndex.from_snapshot(64, meta, arrays)
    assert timed == [1, 1]


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("bits", [16, 64, 128])
def test_a_cached_plan_goes_to_its_engine_exactly(mode, bits):
    """A batch whose plan is cached goes straight to the planned engine's range_search (the
    short way of AutoIndex.range_search): the same answers as the planned path and the scan,
    for queries as uint64 words, as a non-contiguous view and as packed bytes, the plan in
    last_plan (a copy, with the batch size), and a copy with a lower probe limit (the
    server's per-request limit) planned again, never given the original's plan."""
    from bucketsearch.index.codes import to_packed
    from bucketsearch.index.storage.reads import with_probe_limit
    xb, ids, xq = make_data(bits, 200, 9, 11)
    index = build_auto(bits, xb, ids, max_probes=200_000)
    scan = build_scan(bits, xb, ids)
    force(index, mode)
    W = xq.shape[1]
    wide = np.zeros((len(xq), 2 * W), dtype=np.uint64)
    wide[:, ::2] = xq
    for R in (0, 1, 2):
        first = index.range_search(xq, R)  # planned, then cached
        plan = index.last_plan
        assert plan["nq"] == len(xq)
        expected = scan.range_search(xq, R)
        check_same(first, expected)
        for q in (xq, wide[:, ::2], to_packed(xq, bits)):
            check_same(index.range_search(q, R), expected)
            assert index.last_plan == plan and index.last_plan is not index.last_plan
        index.last_plan["mode"] = "changed"  # a copy: the cached plan is untouched
        assert index.last_plan["mode"] == plan["mode"]
        check_same(index.range_search(xq[:1], R), scan.range_search(xq[:1], R))
        assert index.last_plan["nq"] == 1
        low = with_probe_limit(index, 1)  # the single table and MIH over the limit from R = 1
        check_same(low.range_search(xq, R), expected)
        if R >= 1:
            assert low.last_plan["mode"] == "scan"
    with pytest.raises(ValueError, match="max_distance"):
        index.range_search(xq, -1)
    with pytest.raises(ValueError, match="max_distance"):
        index.range_search(xq, bits + 1)


def _stop_radius_twin(within, k, n, last):
    """P(D <= R) of the k-NN stop radius, R = 0..last: per query the Poisson tail
    P(X >= min(k, n)) summed term by term, averaged over the queries; 1 at ``last``."""
    need = min(k, n)
    out = []
    for R in range(last + 1):
        tails = []
        for lam in within[:, min(R, within.shape[1] - 1)]:
            cdf = sum(math.exp(-lam) * lam ** i / math.factorial(i) for i in range(need))
            tails.append(1.0 - cdf if need else 1.0)
        out.append(1.0 if R == last else float(np.mean(tails)))
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.lists(st.lists(st.floats(0, 30), min_size=9, max_size=9),
                                    min_size=1, max_size=5),
       st.one_of(st.none(), st.integers(0, 8)))
def test_knn_stop_radius_distribution_matches_its_twin(k, per_distance, max_distance):
    """The k-NN stop radius's distribution (the plan's expected k-NN costs weigh each radius
    by it): a mixture over the profile's queries of Poisson tails, against a term-by-term
    twin; its weights sum to 1 and stop at max_distance."""
    index = AutoIndex(8)
    index.add(np.arange(200, dtype=np.uint64).reshape(-1, 1) % 256)
    index.items_within_q = np.cumsum(np.array(per_distance), axis=1)
    weights = index.knn_radius_weights(k, max_distance)
    assert sum(p for _, p in weights) == pytest.approx(1.0)
    last = 8 if max_distance is None else max_distance
    assert all(0 <= r <= last and p > 0 for r, p in weights)
    twin = _stop_radius_twin(index.items_within_q, k, index.ntotal, last)
    cum = np.cumsum([dict(weights).get(r, 0.0) for r in range(last + 1)])
    for R in range(last + 1):  # (a tail under KNN_TAIL is moved to the last radius kept)
        assert cum[R] == pytest.approx(twin[R], abs=2e-4) or (
            cum[R] == pytest.approx(1.0) and twin[R] >= 1 - 2e-4)


def test_knn_plan_weighs_every_stop_radius():
    """Queries whose k-th neighbour is at radius 1 for some and 3 for others: the single
    table's expected k-NN cost is the mixture, above its cost at the mean profile's radius."""
    index = AutoIndex(16, calibrate_on_build=False)
    index.add(np.arange(5000, dtype=np.uint64).reshape(-1, 1))
    near = np.array([0, 20, 20, 20] + [20] * 13, dtype=float)  # 20 items within radius 1
    far = np.array([0, 0, 0, 20] + [20] * 13, dtype=float)  # 20 items at radius 3 only
    index.items_within_q = np.stack([np.cumsum(near), np.cumsum(far)])
    weights = dict(index.knn_radius_weights(10))  # (Poisson(20) reaches 10: 0.995)
    assert weights[1] == pytest.approx(0.5, abs=0.01) and weights[3] == pytest.approx(0.5, abs=0.01)
    plan = index.plan(k=10)
    expected = sum(p * index.predict(r)["single"] for r, p in weights.items())
    assert plan["predicted_ns"]["single"] == pytest.approx(
        expected + index.call_ns["single"], rel=1e-6)
    assert expected > index.predict(index.knn_radius(10))["single"]
