"""Cost models: worked examples with exact answers and recovery of known parameters."""
import math

import numpy as np
import pytest

from bucketsearch.index.costmodel import (ExtendedModel, PaperModel, cost_report, fit_extended,
                                          fit_paper_model, fit_t0, microbenchmark_t0, paper_probes,
                                          plot_reports, print_report, probe_microbenchmark,
                                          r_squared, relative_errors)
from bucketsearch.index.mih import MultiIndex
from bucketsearch.index.probe import HammingIndex, SearchStats
from bucketsearch.index.scan import LinearScan
from bucketsearch.index.evaluation.synth import clustered_codes, queries_near


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
