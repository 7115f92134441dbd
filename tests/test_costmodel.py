"""Cost models: worked examples with exact answers and recovery of known parameters."""
import math

import naive
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.costmodel import (COND_MAX, CostSamples, ExtendedModel, PaperModel,
                                          condition_index, cost_report, describe, fit_all,
                                          fit_extended, fit_linear, fit_paper_model,
                                          fit_query_model, fit_t0, microbenchmark_t0,
                                          mix_probe_times, paper_probes, plot_reports, print_report,
                                          probe_microbenchmark, r_squared, radius_fit,
                                          radius_fit_from_sums, radius_rows, relative_errors,
                                          select_terms, t0_from_query_model, t0_radius_fit,
                                          t_quantile)
from bucketsearch.index.evaluation.synth import clustered_codes, queries_near
from bucketsearch.index.mih import MultiIndex
from bucketsearch.index.probe import HammingIndex, SearchStats
from bucketsearch.index.scan import LinearScan


def fake_stats(features: dict, lookup_ns, radii):
    zeros = np.zeros_like(lookup_ns)
    st = SearchStats(features.get("probes", zeros), features.get("nonempty_buckets", zeros),
                     features.get("empty_buckets", zeros), features.get("items", zeros),
                     np.asarray(lookup_ns), radii=np.asarray(radii),
                     total_ns=np.asarray(lookup_ns).sum(axis=1))
    if "candidates" in features:
        st.candidates = features["candidates"]
    return st


def test_paper_probes_exact_ints():
    assert paper_probes(64, 4) == [1, 65, 2081, 43745, 679121]
    big = paper_probes(256, 128)[-1]
    assert isinstance(big, int) and big > 2**200
    assert paper_probes(8, 8)[-1] == 256


def test_fit_t0_worked_example():
    # t0 = sum p t / sum p^2 = (1*2 + 2*4 + 3*7) / (1 + 4 + 9) = 31 / 14
    assert fit_t0([1, 2, 3], [2, 4, 7]) == pytest.approx(31 / 14)
    assert fit_t0([0, 0], [5, 6]) == 0.0
    # huge exact ints are accepted (turned into floats only to multiply)
    assert fit_t0([2**70], [2.0**71]) == pytest.approx(2.0)


def test_r_squared_worked_example():
    # SS_res = 0.01 + 0.01 + 0.04 + 0.04 = 0.10, SS_tot = 5 -> R^2 = 0.98
    assert r_squared([1, 2, 3, 4], [1.1, 1.9, 3.2, 3.8]) == pytest.approx(0.98)
    assert r_squared([1, 2, 3], [1, 2, 3]) == 1.0
    assert r_squared([1, 2, 3], [2, 2, 2]) == pytest.approx(0.0)  # the mean predictor
    assert math.isnan(r_squared([3, 3], [1, 2]))
    assert relative_errors([10, 20, 0], [11, 15, 1])[:2] == pytest.approx([0.1, 0.25])


def test_paper_model_recovers_known_t0():
    rng = np.random.default_rng(0)
    bits, t0, nq, R = 64, 23.5, 50, 3
    probes = np.array([[math.comb(bits, r) for r in range(R + 1)]] * nq)
    noisy = probes * t0 * (1 + 0.02 * rng.standard_normal(probes.shape))
    model = fit_paper_model(fake_stats({"probes": probes}, noisy, [R + 1] * nq), bits)
    assert model.t0_ns == pytest.approx(t0, rel=0.01)
    assert model.r2 > 0.999 and model.radii == [0, 1, 2, 3]
    exact = fit_paper_model(fake_stats({"probes": probes}, probes * t0, [R + 1] * nq), bits)
    assert exact.t0_ns == pytest.approx(t0) and exact.r2 == pytest.approx(1.0)
    assert exact.max_rel_error == pytest.approx(0.0, abs=1e-12)
    assert PaperModel(bits, 2.0).predict(2) == [2.0, 130.0, 4162.0]


def test_extended_model_recovers_known_coefficients():
    rng = np.random.default_rng(1)
    nq, width = 40, 6
    feats = {"probes": rng.integers(1, 5000, (nq, width)),
             "nonempty_buckets": rng.integers(0, 300, (nq, width)),
             "items": rng.integers(0, 900, (nq, width)),
             "candidates": rng.integers(0, 2000, (nq, width))}
    coef = {"const": 80.0, "probes": 21.0, "nonempty_buckets": 35.0, "items": 4.0,
            "candidates": 9.5}
    t = coef["const"] + sum(coef[k] * feats[k] for k in feats)
    model = fit_extended(fake_stats(feats, t.astype(np.float64), [width] * nq))
    for name, value in coef.items():
        assert model.coef[name] == pytest.approx(value, rel=1e-6)
    assert model.r2 == pytest.approx(1.0) and model.max_rel_error < 1e-9
    assert model.samples == nq * width
    rel = fit_extended(fake_stats(feats, t.astype(np.float64), [width] * nq), relative=True)
    assert rel.coef["probes"] == pytest.approx(21.0, rel=1e-6)
    # only the radii each query reached are samples
    radii = rng.integers(1, width + 1, nq)
    part = fit_extended(fake_stats(feats, t.astype(np.float64), radii))
    assert part.samples == int(radii.sum()) and part.coef["items"] == pytest.approx(4.0)


def test_extended_model_drops_negative_terms():
    nq = 30
    p = np.arange(1, nq * 3 + 1).reshape(nq, 3)
    items = (p * 7) % 11
    t = 10.0 * p - 0.5 * items + 100  # a negative item cost is not a cost
    model = fit_extended(fake_stats({"probes": p, "items": items}, t, [3] * nq),
                         terms=("const", "probes", "items"))
    assert model.coef["items"] == 0.0 and model.coef["probes"] > 0
    assert isinstance(model, ExtendedModel) and model.predict({"probes": [0], "items": [0]}) >= 0


@pytest.fixture(scope="module")
def small_indexes():
    xb = clustered_codes(3000, 64, n_clusters=30, flip=0.03, seed=3)
    xq = queries_near(xb, 12, 64, flips=2, seed=4)
    single, mih, scan = HammingIndex(64), MultiIndex(64), LinearScan(64)
    for index in (single, mih, scan):
        index.add(xb)
    return single, mih, scan, xq


def test_paper_model_on_real_single_table_stats(small_indexes):
    single, _, _, xq = small_indexes
    st = single.range_search(xq, 2, stats=True)[3]
    model = fit_paper_model(st, 64)
    assert model.t0_ns > 0 and len(model.rel_error) == 3


def test_cost_report_any_mode(small_indexes, tmp_path):
    single, mih, scan, xq = small_indexes
    rep_single = cost_report(single, xq, 2)
    paper = PaperModel(64, rep_single["t0_ns"])
    reports = [rep_single, cost_report(mih, xq, 5, paper=paper), cost_report(scan, xq, 1)]
    for rep in reports:
        assert [r["radius"] for r in rep["rows"]] == list(range(len(rep["rows"])))
        for r in rep["rows"]:
            assert r["probes_paper"] == paper_probes(64, r["radius"])[-1]
            assert isinstance(r["probes_paper"], int)
            assert r["measured_ns"] > 0
            assert r["paper_ns"] == pytest.approx(rep["t0_ns"] * r["probes_paper"])
    assert reports[1]["t0_ns"] == rep_single["t0_ns"]
    assert reports[1]["mode"] == "mih" and "extended" in reports[1]
    assert reports[1]["rows"][3]["probes_measured"] == mih.probe_count(3)
    print_report(reports[1])
    plot_reports(reports, tmp_path / "cost.png")
    assert (tmp_path / "cost.png").stat().st_size > 1000


def test_cost_report_marks_radii_over_the_probe_limit():
    index = HammingIndex(64, max_probes=100)
    index.add(clustered_codes(200, 64, seed=1))
    rep = cost_report(index, queries_near(index.words, 3, 64), 2)
    assert rep["rows"][2]["measured_ns"] is None and "max_probes" in rep["rows"][2]["error"]


def test_probe_microbenchmark(small_indexes):
    single = small_indexes[0]
    bench = probe_microbenchmark(single.table, n_keys=2000, repeats=2)
    assert bench["empty_ns"] > 0 and bench["nonempty_ns"] > 0 and 0 <= bench["fill"] < 0.01
    mixed = microbenchmark_t0(single.table, fill=0.25, n_keys=2000, repeats=2)
    assert mixed["t0_ns"] == pytest.approx(0.75 * mixed["empty_ns"] + 0.25 * mixed["nonempty_ns"])
    # several-word codes take the generic lookup
    wide = HammingIndex(128)
    wide.add(clustered_codes(500, 128, seed=2))
    assert probe_microbenchmark(wide.table, n_keys=500, repeats=1)["nonempty_ns"] > 0


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), width=st.integers(1, 3), nk=st.integers(1, 30),
       seed=st.integers(0, 2**32 - 1))
def test_row_bounds_match_a_scan(n, width, nk, seed):
    """The run of equal rows found by binary search (the microbenchmark's hit test, the
    planner's bucket sizes) against a plain scan of the rows; few distinct values so that keys
    hit, repeat and miss."""
    from bucketsearch.index.kernels import row_bounds
    from bucketsearch.index.table import sort_items
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**64, size=(6, width), dtype=np.uint64, endpoint=False)
    words = values[rng.integers(0, 6, n)] if n else np.empty((0, width), np.uint64)
    words, _ = sort_items(words, np.arange(n, dtype=np.int64))
    keys = np.ascontiguousarray(np.concatenate([values, rng.integers(
        0, 2**64, size=(nk, width), dtype=np.uint64, endpoint=False)]))
    first, end = row_bounds(words, keys)
    rows = [tuple(r) for r in words.tolist()]
    for k, key in enumerate(map(tuple, keys.tolist())):
        equal = [i for i, r in enumerate(rows) if r == key]
        below = sum(r < key for r in rows)  # rows sort as tuples: words first to last
        assert (first[k], end[k]) == ((equal[0], equal[-1] + 1) if equal else (below, below))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), width=st.integers(1, 3), distinct=st.integers(1, 40),
       seed=st.integers(0, 2**32 - 1))
def test_run_bounds_at_a_position_match_a_scan(n, width, distinct, seed):
    """The run of the row at a position found by galloping from it (the planner's sampled
    bucket sizes) against a plain scan of the rows; runs of one row to all of them."""
    from bucketsearch.index.kernels import run_bounds_at
    from bucketsearch.index.table import sort_items
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**64, size=(distinct, width), dtype=np.uint64, endpoint=False)
    words, _ = sort_items(values[rng.integers(0, distinct, n)], np.arange(n, dtype=np.int64))
    at = rng.integers(0, n, 50)
    first, end = run_bounds_at(words, at)
    for k, p in enumerate(at):
        equal = np.flatnonzero((words == words[p]).all(axis=1))
        assert (first[k], end[k]) == (equal[0], equal[-1] + 1)


# ------------------------------------------------------------------ estimators (issue 12)
def _query_samples(rng, nq, coef, noise=0.05, mih=True, radii_max=3, bits=32):
    """Synthetic per-query samples: per radius r < radii[q], probes C(bits, r) (mih: fewer),
    Poisson items and candidates; the radius-0 ring carries the fixed cost; the time of a ring
    is its cost times (1 + noise N(0, 1)) (so the spread grows with the work)."""
    width = radii_max + 1
    radii = rng.integers(1, width + 1, nq)
    reached = np.arange(width)[None] < radii[:, None]
    probes = np.array([[math.comb(bits, r) for r in range(width)]] * nq)
    if mih:
        probes = probes // 3 + rng.integers(0, 4, (nq, width))
    items = rng.poisson(2.0, (nq, width))
    cand = rng.poisson(30.0, (nq, width)) if mih else None
    ring = coef["probes"] * probes + coef["items"] * items
    if mih:
        ring = ring + coef["candidates"] * cand
    ring = ring.astype(np.float64)
    ring[:, 0] += coef["fixed"]
    ring *= np.maximum(1 + noise * rng.standard_normal(ring.shape), 0.05)
    nonempty = np.minimum(items, probes)
    z = lambda a: None if a is None else np.where(reached, a, 0).astype(np.int64)  # noqa: E731
    return CostSamples(z(probes), z(nonempty), z(probes - nonempty), z(items), z(ring), radii,
                       candidates=z(cand))


def test_t_quantile_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 5, 10, 30, 99, 100, 101, 1000):
        for p in (0.005, 0.1, 0.5, 0.9, 0.975, 0.995):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-6, abs=1e-9)
    with pytest.raises(ValueError, match="p must be in"):
        t_quantile(1.0, 3)


def test_radius_fit_recovers_t0_within_its_interval():
    """Homoscedastic noise (what the classical interval assumes): the 95% interval holds the
    true t0 in about 95% of 300 runs; the running-sums form gives the same estimate."""
    rng = np.random.default_rng(7)
    t0, hits = 12.5, 0
    for _ in range(300):
        p = rng.integers(1, 2000, 80)
        t = t0 * p + rng.normal(0, 300.0, len(p))
        est = radius_fit(p, t)
        hits += est.ci_ns[0] <= t0 <= est.ci_ns[1]
    assert 0.91 <= hits / 300 <= 0.99
    sums = radius_fit_from_sums(len(p), float(p @ t), float(p @ p), float(t @ t))
    assert sums.t0_ns == pytest.approx(est.t0_ns) and sums.ci_ns == pytest.approx(est.ci_ns)
    assert est.estimator == "radius_fit" and est.t0_ns == pytest.approx(fit_t0(p, t))
    assert radius_fit([0, 0], [1, 2]).t0_ns is None


def test_query_model_recovers_known_coefficients_within_intervals():
    """MIH-like samples with all four terms: each HC3 95% interval holds the true coefficient
    in about 95% of 150 runs, and one run's estimates are close."""
    coef = {"fixed": 400.0, "probes": 9.0, "items": 60.0, "candidates": 4.0}
    rng = np.random.default_rng(11)
    hits = dict.fromkeys(coef, 0)
    runs = 150
    for _ in range(runs):
        model = fit_query_model(_query_samples(rng, 300, coef))
        assert model.fit.terms == list(coef) and not model.fit.unidentified
        for name, value in coef.items():
            lo, hi = model.fit.ci[name]
            hits[name] += lo <= value <= hi
    for name in coef:
        assert 0.88 <= hits[name] / runs <= 1.0, (name, hits[name])
    assert model.fit.coef["probes"] == pytest.approx(9.0, rel=0.1)
    assert model.fit.significant("probes") and model.fit.r2 > 0.9
    assert model.predict({"probes": [0], "items": [0], "candidates": [0]})[0] == \
        pytest.approx(model.fit.coef["fixed"])


def test_items_at_radius_zero_are_unidentified_not_fitted():
    """Radius 0 only, one item per query: per-probe and per-item costs are the fixed cost under
    other names; both are reported unidentified and left out; fixed is the mean time."""
    rng = np.random.default_rng(2)
    nq = 400
    ones = np.ones((nq, 1), dtype=np.int64)
    t = (700 + rng.normal(0, 20, (nq, 1))).astype(np.int64)
    s = CostSamples(ones, ones, ones * 0, ones, t, np.ones(nq, dtype=np.int64))
    model = fit_query_model(s)
    assert model.fit.terms == ["fixed"]
    assert set(model.fit.unidentified) == {"probes", "items", "candidates"}
    assert "collinear" in model.fit.unidentified["items"]
    assert "items ~ 1 fixed" in model.fit.unidentified["items"]
    assert model.fit.coef["fixed"] == pytest.approx(t.mean())
    assert t0_from_query_model(model).t0_ns is None
    # one query in 400 without an item: the unit columns [1, items] have cosine
    # sqrt(399/400), condition index sqrt((1 + c) / (1 - c)) = 40 > 30: still unidentified
    items = ones.copy()
    items[0] = 0
    near = fit_query_model(CostSamples(ones, items, ones * 0, items, t, s.radii))
    assert f"condition index 40 > {COND_MAX:g}" in near.fit.unidentified["items"]
    # one in ten without an item (index 6.2): identified, with its interval
    items[::10] = 0
    t_items = t + 250 * items
    ok = fit_query_model(CostSamples(ones, items, ones * 0, items, t_items, s.radii))
    assert ok.fit.terms == ["fixed", "items"]
    lo, hi = ok.fit.ci["items"]
    assert lo <= 250 <= hi and ok.fit.significant("items")


def test_select_terms_rules():
    n = 50
    cols = {"a": np.ones(n), "b": np.arange(n, dtype=float), "c": np.zeros(n),
            "d": 2 * np.arange(n, dtype=float) + 3}
    kept, why, cond = select_terms(cols, ["a", "b", "c", "d"])
    assert kept == ["a", "b"] and "zero in every sample" in why["c"]
    assert "d ~ 3 a + 2 b" in why["d"] and "exactly collinear" in why["d"]
    assert cond == pytest.approx(condition_index(np.column_stack([cols["a"], cols["b"]])))
    kept, why, _ = select_terms({k: v[:2] for k, v in cols.items()}, ["a", "b"])
    assert kept == ["a"] and "too few" in why["b"]
    with pytest.raises(ValueError, match="covariance"):
        fit_linear(cols, np.ones(n), ["a"], covariance="HC9")


@settings(max_examples=40, deadline=None)
@given(st.integers(3, 40), st.integers(0, 2**31))
def test_fit_linear_matches_numpy_lstsq(n, seed):
    """Well-conditioned columns: the coefficients are numpy's least squares; the classical
    standard errors are sqrt(diag(s^2 (X'X)^-1))."""
    rng = np.random.default_rng(seed)
    cols = {"one": np.ones(n), "x": rng.normal(size=n), "z": rng.normal(size=n)}
    y = rng.normal(size=n)
    fit = fit_linear(cols, y, ["one", "x", "z"], covariance="classical")
    X = np.column_stack([cols[k] for k in fit.terms])
    b = np.linalg.lstsq(X, y, rcond=None)[0]
    assert [fit.coef[k] for k in fit.terms] == pytest.approx(list(b), abs=1e-8)
    if len(fit.terms) and n > len(fit.terms):
        res = y - X @ b
        se = np.sqrt(np.diag(np.linalg.inv(X.T @ X)) * (res @ res) / (n - len(fit.terms)))
        assert [fit.se[k] for k in fit.terms] == pytest.approx(list(se), rel=1e-6, abs=1e-12)


def _naive_rows(s: CostSamples, bits: int, t0: float):
    """Literal per-radius figures of CostSamples, one query at a time."""
    out = {}
    for r in range(s.width):
        ring, cum, empty, balls = [], [], [], 0
        for q in range(s.nq):
            if r < s.radii[q]:
                ring.append(s.lookup_ns[q, r])
                cum.append(sum(s.lookup_ns[q, :r + 1]))
                empty.append(s.empty_buckets[q, r])
                balls += sum(s.items[q, :r + 1]) == 0
        if ring:
            out[r] = {"queries": len(ring), "p50": np.percentile(ring, 50),
                      "cum_p99": np.percentile(cum, 99), "empty": np.mean(empty),
                      "balls": balls, "paper": t0 * math.comb(bits, r),
                      "paper_cum": t0 * sum(math.comb(bits, i) for i in range(r + 1))}
    return out


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 30), st.integers(1, 4), st.integers(0, 2**31))
def test_radius_rows_match_literal_formulas(nq, width, seed):
    rng = np.random.default_rng(seed)
    s = _query_samples(rng, nq, {"fixed": 50.0, "probes": 3.0, "items": 9.0},
                       mih=False, radii_max=width - 1, bits=16)
    s.items = np.where(rng.random(s.items.shape) < 0.6, 0, s.items)  # some empty balls
    rows = radius_rows(s, 16, 2.5)
    naive = _naive_rows(s, 16, 2.5)
    assert [r["radius"] for r in rows] == sorted(naive)
    for row in rows:
        ref = naive[row["radius"]]
        assert row["queries"] == ref["queries"] and row["empty_ball_queries"] == ref["balls"]
        assert row["measured"]["p50_ns"] == pytest.approx(ref["p50"])
        assert row["measured_cumulative"]["p99_ns"] == pytest.approx(ref["cum_p99"])
        assert row["mean_empty_buckets"] == pytest.approx(ref["empty"])
        assert row["paper_ns"] == pytest.approx(ref["paper"])
        assert row["paper_cumulative_ns"] == pytest.approx(ref["paper_cum"])
        assert row["paper_ratio"] == row["cumulative_paper_probes"]
        assert row["measured_ratio"] == pytest.approx(
            row["measured_cumulative"]["p50_ns"] / rows[0]["measured_cumulative"]["p50_ns"])


def test_microbenchmark_estimate_from_passes():
    bench = {"fill": 0.01, "empty_ns": 3.0, "nonempty_ns": 9.0,
             "empty_pass_ns": [2.0, 3.0, 4.0], "nonempty_pass_ns": [8.0, 9.0, 10.0]}
    est = mix_probe_times(bench, fill=0.5)
    # mixes 5, 6, 7: mean 6, sd 1, half-width t_{0.975, 2} / sqrt(3)
    assert est.estimator == "microbenchmark" and est.t0_ns == pytest.approx(6.0)
    half = t_quantile(0.975, 2) / math.sqrt(3)
    assert est.ci_ns == pytest.approx((6.0 - half, 6.0 + half))
    assert mix_probe_times(bench).t0_ns == pytest.approx(0.99 * 3 + 0.01 * 9)
    with pytest.raises(ValueError, match="fill must be in"):
        mix_probe_times(bench, fill=1.5)


def test_fit_all_on_a_real_index_names_every_figure(small_indexes):
    """A real single table: every t0 is named; empty balls and probes agree with brute force;
    the records form of the stats (HTTP) gives the same samples."""
    single, _, _, xq = small_indexes
    xq = np.concatenate([xq, single.words[:5] ^ np.uint64(0xFFFF0000)])  # far from every code
    stats = [single.range_search(xq, r, stats=True)[3] for r in range(3)]
    result = fit_all(stats, 64, microbenchmark=probe_microbenchmark(single.table, n_keys=2000))
    assert [e["estimator"] for e in result["t0"]] == ["radius_fit", "microbenchmark",
                                                      "query_model.probes"]
    assert all(e["t0_ns"] > 0 for e in result["t0"])
    dist = naive.hamming_matrix(xq, single.words, 64).min(axis=1)
    by_r = {row["radius"]: row for row in result["radii"]}
    nq = len(xq)
    assert [by_r[r]["queries"] for r in range(3)] == [3 * nq, 2 * nq, nq]
    for r in range(3):  # queries of the radius-r' searches for every r' >= r
        assert by_r[r]["empty_ball_queries"] == (3 - r) * int((dist > r).sum())
        assert by_r[r]["probes"] == math.comb(64, r)
    assert result["query_model"]["terms"]["probes"]["significant"]
    verdict = result["verdicts"]["paper_model"]
    assert sorted(verdict["holds_at"] + verdict["fails_at"]) == [0, 1, 2]
    assert verdict["holds_at"] == [r for r in range(3) if by_r[r]["paper_holds"]]
    text = describe(result)
    for name in ("radius_fit", "microbenchmark", "query_model", "empty balls", "T(R)/T(0)"):
        assert name in text
    records = [st_.per_query(i) for st_ in stats for i in range(len(st_.radii))]
    again = CostSamples.from_records(records)
    base = CostSamples.from_stats(stats)
    for f in ("probes", "items", "lookup_ns", "empty_buckets"):
        assert np.array_equal(again.per_query(f), base.per_query(f))
    with pytest.raises(ValueError, match=r"bits must be in \[1, 1024\], got 0"):
        fit_all(stats, 0)
    empty = fit_all([], 64)
    assert empty["t0"][0]["t0_ns"] is None and empty["query_model"]["unidentified"]["fixed"] \
        == "no samples"
    with pytest.raises(ValueError, match=r"queries\[0\]\[0\].items"):
        CostSamples.from_records([[{"radius": 0, "probes": 1, "nonempty_buckets": 0,
                                    "lookup_ns": 5}]])


def test_preempted_samples_are_left_out_and_counted():
    """A few samples inflated 1000x (a preempted thread) would decide a least-squares fit; the
    fence leaves them out and says how many; trim=False keeps them."""
    rng = np.random.default_rng(4)
    coef = {"fixed": 300.0, "probes": 5.0, "items": 40.0}
    s = _query_samples(rng, 400, coef, noise=0.02, mih=False, bits=24)
    s.lookup_ns[:3, 0] *= 1000
    est = t0_radius_fit(s)
    assert est.detail["excluded"] >= 3 and est.t0_ns == pytest.approx(5.0, rel=0.05)
    model = fit_query_model(s)
    assert model.excluded >= 3 and model.fit.coef["probes"] == pytest.approx(5.0, rel=0.05)
    raw = fit_query_model(s, trim=False, nonnegative=False)
    assert raw.excluded == 0 and raw.fit.samples == 400
    assert abs(raw.fit.coef["fixed"] - 300) > abs(model.fit.coef["fixed"] - 300)


def test_a_term_fitted_below_zero_is_left_out_so_no_time_is_negative():
    """Samples whose true per-item cost is negative (what noise does to a small item term):
    plain least squares fits it below 0, the default fit leaves it out, says why, and every
    prediction at non-negative counters is >= 0 (the dashboard showed "extended ns -987")."""
    rng = np.random.default_rng(9)
    s = _query_samples(rng, 300, {"fixed": 300.0, "probes": 5.0, "items": -80.0}, mih=False,
                       noise=0.01, bits=24)
    plain = fit_query_model(s, nonnegative=False)
    assert plain.fit.coef["items"] < 0
    model = fit_query_model(s)
    assert "items" not in model.fit.coef
    assert model.fit.unidentified["items"].startswith("negative coefficient (")
    assert all(c >= 0 for c in model.fit.coef.values())
    grid = {"probes": np.arange(0, 3000, 100), "items": np.arange(0, 300, 10)}
    assert (model.predict(grid) >= 0).all()
