"""Hashtable-bucket evaluation against a brute-force twin, the Hamming-ball special cases and
the real engine's retrieved sets."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_buckets import naive_metrics, naive_retrieved

from bucketsearch.index.evaluation import buckets
from bucketsearch.index.evaluation.relevance import dense, from_labels
from bucketsearch.index.metrics import evaluate
from bucketsearch.index.metrics.conventions import Conventions


@st.composite
def problems(draw):
    bits = draw(st.integers(1, 14))
    nb = draw(st.integers(1, 40))
    nq = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    db = rng.integers(0, 2, (nb, bits))
    # queries near some db codes, so collisions happen
    q = db[rng.integers(0, nb, nq)] ^ (rng.random((nq, bits)) < draw(st.floats(0, 0.5)))
    yb = rng.integers(0, 3, nb)
    yq = rng.integers(0, 4, nq)   # class 3 has no relevant item
    return db, q.astype(np.int64), yb, yq


@settings(max_examples=60, deadline=None)
@given(problems(), st.floats(0.25, 4.0), st.sampled_from([0.0, 1.0]))
def test_every_configuration_matches_brute_force(problem, beta, empty_precision):
    db, q, yb, yq = problem
    rel = from_labels(yq, yb)
    conv = Conventions(beta=beta, empty_precision=empty_precision)
    res = buckets.evaluate_tables(db, q, rel, conventions=conv, measure_radii=())
    bits = db.shape[1]
    assert sorted((c["K"], c["L"]) for c in res["configs"]) == buckets.full_grid(bits)
    gains = dense(rel)
    for row in res["configs"]:
        for r in row["radius"]:
            want = naive_metrics(naive_retrieved(db, q, row["K"], row["L"], r), gains,
                                 empty_precision, beta)
            for key, value in want.items():
                assert row[key][r] == pytest.approx(value, abs=1e-12), (row["K"], row["L"], r,
                                                                        key)


@settings(max_examples=20, deadline=None)
@given(problems())
def test_wide_codes_take_the_segment_path(problem):
    """Codes over 64 bits go through the per-width kernel; pad a small problem to 70 bits and
    compare the configurations that use only the first bits with the brute force."""
    db, q, yb, yq = problem
    pad = 70 - db.shape[1]
    db70 = np.hstack([db, np.zeros((len(db), pad), np.int64)])
    q70 = np.hstack([q, np.ones((len(q), pad), np.int64)])
    rel = from_labels(yq, yb)
    k = max(1, db.shape[1] // 2)
    hists = buckets.min_segment_histograms(db70, q70, rel, {k: 70 // k})
    count, _ = hists[k]
    for n in range(1, 70 // k + 1):
        for r in range(k + 1):
            want = naive_retrieved(db70, q70, k, n, r).sum(1)
            assert np.array_equal(count[:, n - 1, :r + 1].sum(1), want)


def test_single_table_is_the_hamming_ball_and_one_bit_tables_the_ball_q_minus_1():
    """Thesis Fig. 3.5's analogy: a Hamming ranking cut at distance t retrieves what one table
    of all Q bits probed to radius t retrieves; Q one-bit tables at radius 0 retrieve the cut at
    t = Q - 1 (every item that agrees with the query on some bit); any (K, L) holds the ball of
    radius L (r + 1) - 1."""
    rng = np.random.default_rng(3)
    bits = 10
    db = rng.integers(0, 2, (300, bits))
    q = rng.integers(0, 2, (25, bits))
    db[:5] = 1 - q[:5]   # complements: at distance Q, agree on no bit
    rel = from_labels(rng.integers(0, 3, 25), rng.integers(0, 3, 300))
    ball = evaluate(db, q, rel, radius_max=bits, ks=[1])["radius"]
    res = buckets.evaluate_tables(db, q, rel, configs=[(bits, 1), (1, bits)], measure_radii=())
    whole, one_bit = sorted(res["configs"], key=lambda c: -c["K"])
    for r in range(bits + 1):
        assert whole["precision_macro"][r] == pytest.approx(ball["precision_macro"][r])
        assert whole["recall_micro"][r] == pytest.approx(ball["recall_micro"][r])
    assert one_bit["recall_macro"][0] == pytest.approx(ball["recall_macro"][bits - 1])
    assert one_bit["precision_micro"][0] == pytest.approx(ball["precision_micro"][bits - 1])
    dist = (q[:, None, :] != db[None, :, :]).sum(2)
    for k, n in buckets.full_grid(bits):
        for r in range(k + 1):
            got = naive_retrieved(db, q, k, n, r)
            assert np.all(got[dist <= n * (r + 1) - 1])


def test_engine_retrieves_the_same_sets_and_reports_cost():
    rng = np.random.default_rng(5)
    db = rng.integers(0, 2, (2000, 24))
    q = db[rng.integers(0, 2000, 40)] ^ (rng.random((40, 24)) < 0.1)
    rel = from_labels(rng.integers(0, 4, 40), rng.integers(0, 4, 2000))
    configs = [(8, 3), (6, 2), (24, 1), (4, 6)]
    res = buckets.evaluate_tables(db, q, rel, configs=configs, measure_radii=(0, 1, 2))
    for row in res["configs"]:
        want = [naive_retrieved(db, q, row["K"], row["L"], r).sum(1).mean()
                for r in range(3)]
        assert [m["radius"] for m in row["measured"]] == [0, 1, 2]
        for m in row["measured"]:
            assert m["retrieved_mean"] == pytest.approx(want[m["radius"]])
            assert m["lookup_ns_mean"] > 0 and m["total_ns_mean"] >= m["lookup_ns_mean"]
            assert m["candidates_mean"] >= m["retrieved_mean"]
        assert row["probes"][:3] == [row["L"] * p for p in (1, 1 + row["K"],
                                                            1 + row["K"] + row["K"] * (
                                                                row["K"] - 1) // 2)]


def test_probe_limit_leaves_radii_unmeasured():
    rng = np.random.default_rng(1)
    db = rng.integers(0, 2, (100, 40))
    cost = buckets.engine_cost(db, db[:3], 40, 1, radii=[0, 1, 5], max_probes=1000)
    assert sorted(cost) == [0, 1]


@pytest.mark.parametrize("k, n, message", [
    (0, 1, "K must be an int >= 1"), (4, 0, "L must be an int >= 1"),
    (5, 3, "K x L must be <= Q = 12"), (13, 1, "K must be in [1, 12]")])
def test_bad_configurations_name_the_field(k, n, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        buckets.check_tables(12, k, n)


def test_bad_codes_are_refused():
    rel = from_labels(np.zeros(2, int), np.zeros(3, int))
    with pytest.raises(ValueError, match="values must be in"):
        buckets.evaluate_tables(np.full((3, 4), 2), np.zeros((2, 4)), rel, measure_radii=())
    with pytest.raises(ValueError, match="relevance covers"):
        buckets.evaluate_tables(np.zeros((4, 4)), np.zeros((2, 4)), rel, measure_radii=())
