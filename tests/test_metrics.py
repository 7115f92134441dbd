"""Worked examples with exact answers, and the kernels against the naive twins."""
from __future__ import annotations

import math

import naive_metrics as nv
import numpy as np
import pytest

from bucketsearch.index.evaluation.relevance import dense, from_graded_matrix, from_labels
from bucketsearch.index.metrics import (Conventions, auprc, auprc_thesis, evaluate,
                                        hamming_histograms, lgap_from_balls, mlgap, modeled_costs,
                                        raap_from_precision, radius_metrics, ramap, ranking_metrics)
from bucketsearch.index.metrics.ramap import ball_probes
from bucketsearch.index.metrics.space import (code_utilization, empty_ball_queries,
                                              mean_empty_buckets)


# ---------------------------------------------------------------- RAMAP worked example
def test_ramap_table3_of_the_paper():
    raap = raap_from_precision([[0.1896, 0.1651, 0.1433, 0.1261]], bits=8)
    assert np.round(raap[0], 4).tolist() == [0.1896, 0.1040, 0.0706, 0.0533]


def test_ramap_costs_are_exact_integers_at_256_bits():
    costs = modeled_costs(256)
    assert costs[-1] == 2 ** 256
    assert costs[32] == sum(math.comb(256, i) for i in range(33))
    assert ball_probes(64, 4) == 679_121
    raap = raap_from_precision(np.full((1, 257), 0.5), bits=256)
    assert np.isfinite(raap).all() and raap[0, 0] == 0.5


def test_ramap_measured_cost_normalized_to_radius_zero():
    p = np.array([[0.4, 0.2, 0.1]])
    raap = raap_from_precision(p, bits=8, measured_cost=[2.0, 4.0, 8.0])
    assert np.allclose(raap[0], [0.4, (0.4 + 0.1) / 2, (0.4 + 0.1 + 0.025) / 3])
    per_radius = raap_from_precision(p, bits=8, measured_cost=[2.0, 2.0, 4.0], cumulative=False)
    assert np.allclose(per_radius, raap)
    with pytest.raises(ValueError, match="measured_cost"):
        raap_from_precision(p, bits=8, measured_cost=[1.0, 0.0, 2.0])


# ---------------------------------------------------------------- micro vs macro
def _micro_macro_case():
    db = np.array([[0, 0], [1, 1], [1, 1], [1, 1]])
    yb = np.array([0, 1, 0, 0])
    xq = np.array([[0, 0], [1, 1]])
    yq = np.array([0, 1])
    return db, xq, from_labels(yq, yb)


def test_micro_vs_macro_precision_recall_hand_checked():
    db, xq, rel = _micro_macro_case()
    m = radius_metrics(hamming_histograms(db, xq, rel, ks=[1]))
    # radius 0: query 0 sees {db0} (1 of 1 relevant; 1 of its 3 relevant found);
    # query 1 sees {db1, db2, db3} (1 relevant of 3; its only relevant item found)
    assert np.allclose(m.precision[:, 0], [1.0, 1 / 3])
    assert np.allclose(m.recall[:, 0], [1 / 3, 1.0])
    assert m.precision_macro[0] == pytest.approx(2 / 3)
    assert m.precision_micro[0] == pytest.approx(2 / 4)
    assert m.recall_macro[0] == pytest.approx(2 / 3)
    assert m.recall_micro[0] == pytest.approx(2 / 4)
    assert m.f_beta_macro[0] == pytest.approx(0.5)
    f2 = radius_metrics(hamming_histograms(db, xq, rel, ks=[1]), Conventions(beta=2.0))
    # F2 = 5 P R / (4 P + R): query 0 (P 1, R 1/3) -> 5/13, query 1 (P 1/3, R 1) -> 5/7
    assert f2.f_beta[:, 0] == pytest.approx([5 / 13, 5 / 7])
    assert f2.f_beta_micro[0] == pytest.approx(0.5)
    # radius 1 adds nothing (distances are 0 or 2); radius 2 is everything
    assert np.allclose(m.precision[:, 1], m.precision[:, 0])
    assert np.allclose(m.precision[:, 2], [3 / 4, 1 / 4])
    assert np.allclose(m.recall[:, 2], [1.0, 1.0])
    assert m.precision_micro[2] == pytest.approx(0.5)


def test_empty_ball_precision_convention_and_exclusive_radius():
    db = np.array([[1, 1]])
    xq = np.array([[0, 0]])
    rel = from_labels([0], [0])
    h = hamming_histograms(db, xq, rel, ks=[1])
    assert radius_metrics(h).precision[0].tolist() == [0.0, 0.0, 1.0]
    conv = Conventions(empty_precision=1.0)
    assert radius_metrics(h, conv).precision[0].tolist() == [1.0, 1.0, 1.0]
    excl = Conventions(radius_inclusive=False)
    assert radius_metrics(h, excl).precision[0].tolist() == [0.0, 0.0, 0.0]
    assert empty_ball_queries(h).tolist() == [1, 1, 0]
    assert np.allclose(mean_empty_buckets(h), [1, 3, 3])  # probes 1, 3, 4; occupied 0, 0, 1


# ---------------------------------------------------------------- mLGAP worked example
def test_mlgap_worked_example_of_the_paper():
    # seed 004, eqs. 12-15: Q = 4; balls of 1, 6 and 10 items (1, 5 and 11 codes); largest bin
    # 1, 2, 2; cumulative precisions 1, 4/6, 5/10 -> LGAP@2 = 0.5424
    lg = lgap_from_balls([1, 4 / 6, 5 / 10], [1, 6, 10], [1, 2, 2], bits=4)
    assert round(lg[2], 4) == 0.5424
    assert lg[2] == pytest.approx((1 + 4 / 6 * 6 / 10 + 5 / 10 * 10 / 22) / 3)
    # the same ball realized by codes around the query 0000: d = 0 one relevant item; d = 1
    # five items on four codes (1000 twice), 3 relevant; d = 2 four items, 1 relevant
    db = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0],
                   [0, 0, 0, 1], [1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    yb = np.array([0, 0, 0, 0, 1, 1, 0, 1, 1, 1])
    h = hamming_histograms(db, np.zeros((1, 4), dtype=int), from_labels([0], yb), ks=[1])
    lg_codes, mean = mlgap(h)
    assert np.allclose(radius_metrics(h).precision[0, :3], [1, 4 / 6, 5 / 10])
    assert round(mean[2], 4) == 0.5424 and np.allclose(lg_codes[0, :3], lg)
    assert np.allclose(lg_codes, nv.lgap(db, np.zeros((1, 4), dtype=int),
                                         dense(from_labels([0], yb)), 4))
    # the earlier variant (5, then 9 occupied codes) gives another number
    occ, _ = mlgap(h, denominator="occupied-codes")
    assert occ[0, 2] == pytest.approx((1 + 4 / 6 * 6 / 10 + 5 / 10 * 10 / 18) / 3)
    with pytest.raises(ValueError, match="denominator must be one of"):
        mlgap(h, denominator="codes")


def test_mlgap_hand_checked_both_denominators():
    # Q = 2: code 00 holds 3 items (labels A, A, B), 01 one item (A), 11 two items (B, B)
    db = np.array([[0, 0], [0, 0], [0, 0], [0, 1], [1, 1], [1, 1]])
    yb = np.array([0, 0, 1, 0, 1, 1])
    xq = np.array([[0, 0]])
    G = dense(from_labels([0], yb))
    h = hamming_histograms(db, xq, from_labels([0], yb), ks=[1])
    lg, mean = mlgap(h)
    # all codes (1, 3, 4 of them): S0: P = 2/3, phi = 3/(3*1) = 1; S1: P = 3/4,
    # phi = 4/(3*3) = 4/9; S2: P = 1/2, phi = 6/(3*4) = 1/2
    assert np.allclose(lg[0], [2 / 3, (2 / 3 + 1 / 3) / 2, (2 / 3 + 1 / 3 + 1 / 4) / 3])
    assert np.allclose(mean, lg[0]) and np.allclose(lg, nv.lgap(db, xq, G, 2))
    # occupied codes (1, 2, 3 of them): phi = 1, 4/(3*2) = 2/3, 6/(3*3) = 2/3
    occ, _ = mlgap(h, denominator="occupied-codes")
    assert np.allclose(occ[0], [2 / 3, (2 / 3 + 1 / 2) / 2, (2 / 3 + 1 / 2 + 1 / 3) / 3])
    assert np.allclose(occ, nv.lgap(db, xq, G, 2, denominator="occupied-codes"))


def test_mlgap_penalizes_one_shared_code_and_not_an_even_spread():
    # every item on one code: the occupied-codes variant sees no imbalance (phi = 1); the
    # paper's mLGAP charges the empty codes of the ball (phi = 4 / (4 * 3) at radius 1)
    one = hamming_histograms(np.zeros((4, 2), dtype=int), np.array([[0, 0]]),
                             from_labels([0], [0, 0, 0, 0]), ks=[1])
    assert mlgap(one, denominator="occupied-codes")[0][0].tolist() == [1.0, 1.0, 1.0]
    assert np.allclose(mlgap(one)[0][0], [1.0, (1 + 1 / 3) / 2, (1 + 1 / 3 + 1 / 4) / 3])
    # one item on every code: phi = 1 at every radius under both denominators
    db = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
    h = hamming_histograms(db, np.array([[0, 0]]), from_labels([0], [0, 0, 0, 0]), ks=[1])
    prec = radius_metrics(h).precision[0]
    for denominator in ("all-codes", "occupied-codes"):
        lg, _ = mlgap(h, denominator=denominator)
        assert np.allclose(lg[0], np.cumsum(prec) / np.arange(1, 4))


# ---------------------------------------------------------------- tie-aware worked example
def test_tie_aware_ap_hand_checked():
    db = np.array([[0, 0], [0, 0], [1, 1]])
    h = hamming_histograms(db, np.array([[0, 0]]), from_labels([0], [0, 1, 0]), ks=[1, 2])
    m = ranking_metrics(h)["per_query"]
    # tie of 2 at the top (1 relevant), then one relevant item alone at rank 3
    # best: 1/1 + 2/3; worst: 1/2 + 2/3; tie-aware: mean of the two
    assert m["map_all_best"][0] == pytest.approx((1 + 2 / 3) / 2)
    assert m["map_all_worst"][0] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert m["map_all_tie_aware"][0] == pytest.approx((1 + 1 / 2 + 4 / 3) / 4)
    assert m["map_all_ranked"][0] == pytest.approx((1 + 2 / 3) / 2)  # db index 0 first
    assert m["precision_tie_aware"][0].tolist() == [0.5, 0.5]
    conv = Conventions(ap_denominator="relevant-in-topk")
    top = ranking_metrics(h, conv)["per_query"]
    # k = 1: half the orderings put the relevant item first (AP 1), the rest have none (AP 0)
    assert top["map_tie_aware"][0, 0] == pytest.approx(0.5)
    assert top["map_best"][0, 0] == 1.0 and top["map_worst"][0, 0] == 0.0


# ---------------------------------------------------------------- kernels vs twins
@pytest.mark.parametrize("bits", [7, 64, 100])
def test_histograms_and_ranking_match_naive(bits):
    rng = np.random.default_rng(bits)
    nb, nq = 300, 6
    base = rng.integers(0, 2, (8, bits))
    db = base[rng.integers(0, 8, nb)] ^ (rng.random((nb, bits)) < 0.1)
    xq = base[rng.integers(0, 8, nq)] ^ (rng.random((nq, bits)) < 0.1)
    rel = from_labels(rng.integers(0, 4, nq), rng.integers(0, 4, nb))
    ks = [1, 5, 37, 300, 1000]
    h = hamming_histograms(db, xq, rel, ks=ks)
    D = nv.distances(db, xq)
    G = dense(rel)
    count, relc, gain, gexp = nv.histograms(D, G, bits)
    assert (h.count == count).all() and (h.relevant == relc).all()
    assert np.allclose(h.gain, gain) and np.allclose(h.gain_exp, gexp)
    m = ranking_metrics(h)["per_query"]
    top = ranking_metrics(h, Conventions(ap_denominator="relevant-in-topk"))["per_query"]
    for q in range(nq):
        assert m["map_all_tie_aware"][q] == pytest.approx(nv.tie_aware_ap_all(D, G, q), abs=1e-12)
        assert m["wmap_all_tie_aware"][q] == pytest.approx(nv.tie_aware_wap_all(D, G, q),
                                                           abs=1e-12)
        for j, k in enumerate(ks):
            assert m["mrr_tie_aware"][q, j] == pytest.approx(nv.tie_aware_rr(D, G, q, k),
                                                             abs=1e-12)
            ar = nv.as_ranked(D, G, q, k)
            assert m["map_ranked"][q, j] == pytest.approx(ar["ap_all"], abs=1e-12)
            assert top["map_ranked"][q, j] == pytest.approx(ar["ap_topk"], abs=1e-12)
            assert m["ndcg_ranked"][q, j] == pytest.approx(ar["ndcg"], abs=1e-12)
            assert m["wmap_ranked"][q, j] == pytest.approx(ar["wap"], abs=1e-12)
            best, worst = nv.best_worst(D, G, q, k), nv.best_worst(D, G, q, k, worst=True)
            assert m["map_best"][q, j] == pytest.approx(best["ap_all"], abs=1e-12)
            assert m["map_worst"][q, j] == pytest.approx(worst["ap_all"], abs=1e-12)
            assert top["map_best"][q, j] == pytest.approx(best["ap_topk"], abs=1e-12)
            assert top["map_worst"][q, j] == pytest.approx(worst["ap_topk"], abs=1e-12)
    for r in (0, 3, bits // 2, bits):
        p, rc = nv.precision_recall_radius(D, G, r)
        rm = radius_metrics(h)
        assert np.allclose(rm.precision[:, r], p)
        assert np.allclose(rm.recall[:, r], np.nan_to_num(rc))
        pm, rmic = nv.micro_precision_recall(D, G, r)
        assert rm.precision_micro[r] == pytest.approx(pm)
        assert rm.recall_micro[r] == pytest.approx(rmic)
    raap, _ = ramap(h)
    assert np.allclose(raap[:, :6], nv.ramap_naive(D, G, bits, 5))
    lg, _ = mlgap(h)
    assert np.allclose(lg[:, :6], nv.lgap(db, xq, G, 5))


def test_large_ties_use_the_asymptotic_harmonic_sums():
    # Q = 3 on 5,000 items: tie groups of hundreds, so the closed forms take the asymptotic path
    rng = np.random.default_rng(1)
    db = rng.integers(0, 2, (5000, 3))
    xq = rng.integers(0, 2, (3, 3))
    rel = from_labels(rng.integers(0, 5, 3), rng.integers(0, 5, 5000))
    h = hamming_histograms(db, xq, rel, ks=[700, 2000])
    m = ranking_metrics(h)["per_query"]
    D, G = nv.distances(db, xq), dense(rel)
    for q in range(3):
        assert m["map_all_tie_aware"][q] == pytest.approx(nv.tie_aware_ap_all(D, G, q), rel=1e-11)
        assert m["wmap_all_tie_aware"][q] == pytest.approx(nv.tie_aware_wap_all(D, G, q),
                                                           rel=1e-11)
        for j, k in enumerate([700, 2000]):
            assert m["mrr_tie_aware"][q, j] == pytest.approx(nv.tie_aware_rr(D, G, q, k),
                                                             rel=1e-11)
        assert m["mrr_all_tie_aware"][q] == pytest.approx(nv.tie_aware_rr(D, G, q, 5000),
                                                          rel=1e-11)
        for j, k in enumerate([700, 2000]):
            for fn, key in ((nv.best_worst, "map_best"),):
                assert m[key][q, j] == pytest.approx(fn(D, G, q, k)["ap_all"], rel=1e-11)
            worst = nv.best_worst(D, G, q, k, worst=True)["ap_all"]
            assert m["map_worst"][q, j] == pytest.approx(worst, rel=1e-11)


def test_graded_ndcg_matches_naive_multihot():
    rng = np.random.default_rng(3)
    yb = (rng.random((120, 5)) < 0.35).astype(int)
    yq = (rng.random((4, 5)) < 0.35).astype(int)
    db = rng.integers(0, 2, (120, 6))
    xq = rng.integers(0, 2, (4, 6))
    rel = from_labels(yq, yb)
    h = hamming_histograms(db, xq, rel, ks=[3, 20], graded=True)
    m = ranking_metrics(h)["per_query"]
    D, G = nv.distances(db, xq), dense(rel, graded=True)
    for q in range(4):
        assert m["wmap_all_tie_aware"][q] == pytest.approx(nv.tie_aware_wap_all(D, G, q),
                                                           abs=1e-12)
        for j, k in enumerate([3, 20]):
            ar = nv.as_ranked(D, G, q, k)
            assert m["ndcg_ranked"][q, j] == pytest.approx(ar["ndcg"], abs=1e-12)
            assert m["wmap_ranked"][q, j] == pytest.approx(ar["wap"], abs=1e-12)
    # a user-supplied graded matrix gives the same numbers
    h2 = hamming_histograms(db, xq, from_graded_matrix(G), ks=[3, 20], graded=True)
    m2 = ranking_metrics(h2)["per_query"]
    for key in ("ndcg_tie_aware", "ndcg_ranked", "wmap_ranked", "map_all_tie_aware"):
        assert np.allclose(m[key], m2[key])


def test_no_relevant_conventions():
    db = np.array([[0], [1]])
    xq = np.array([[0], [1]])
    rel = from_labels([0, 5], [0, 1])  # query 1 has no relevant item
    h = hamming_histograms(db, xq, rel, ks=[1])
    zero = ranking_metrics(h)
    assert zero["per_query"]["map_all_tie_aware"].tolist() == [1.0, 0.0]
    assert zero["mean"]["map_all_tie_aware"] == 0.5 and zero["n_excluded"] == 0
    excl = ranking_metrics(h, Conventions(no_relevant="exclude"))
    assert np.isnan(excl["per_query"]["map_all_tie_aware"][1])
    assert excl["mean"]["map_all_tie_aware"] == 1.0 and excl["n_excluded"] == 1
    rm = radius_metrics(h, Conventions(no_relevant="exclude"))
    assert rm.recall_macro[0] == 1.0 and rm.precision_micro[0] == 1.0 and rm.n_excluded == 1


def test_auprc_anchor_and_trapezoid():
    assert auprc([0.5, 1.0], [1.0, 0.5]) == pytest.approx(0.5 * 1.0 + 0.5 * 0.75)
    assert auprc([0.5, 1.0], [0.5, 0.5], anchor="one") == pytest.approx(0.5 * 0.75 + 0.25)
    assert auprc([0.5, 1.0], [1.0, 0.5], anchor=None) == pytest.approx(0.5 * 0.75)
    with pytest.raises(ValueError, match="anchor"):
        auprc([1.0], [1.0], anchor="zero")


def test_auprc_thesis_hand_checked():
    # micro curve over radius 1..Q only: the case of test_micro_vs_macro (distances 0 or 2):
    # radius 1: P 2/4, R 2/4; radius 2: P 4/8, R 4/4 -> trapezoid 0.5 * 0.5
    db, xq, rel = _micro_macro_case()
    h = hamming_histograms(db, xq, rel, ks=[1])
    assert auprc_thesis(h) == pytest.approx(0.25)
    D, G = nv.distances(db, xq), dense(rel)
    assert auprc_thesis(h) == pytest.approx(nv.auprc_thesis(D, G, 2))
    res = evaluate(db, xq, rel, ks=[1])
    assert res["auprc_thesis"] == pytest.approx(0.25)
    assert res["auprc"] != res["auprc_thesis"]  # the anchored macro form is another number


# ---------------------------------------------------------------- reciprocal rank, weighted mAP
def test_reciprocal_rank_hand_checked():
    # distances: 2 items at 0 (1 relevant), 3 at 1 (2 relevant), 1 at 2
    db = np.array([[0, 0], [0, 0], [0, 1], [1, 0], [0, 1], [1, 1]])
    yb = [1, 0, 0, 0, 1, 0]
    h = hamming_histograms(db, np.array([[0, 0]]), from_labels([0], yb), ks=[1, 3])
    m = ranking_metrics(h)["per_query"]
    # the relevant item of the first tie is at rank 1 or 2 with probability 1/2 each
    assert m["mrr_tie_aware"][0].tolist() == pytest.approx([0.5, 0.75])
    assert m["mrr_best"][0].tolist() == [1.0, 1.0]
    assert m["mrr_worst"][0].tolist() == [0.0, 0.5]
    assert m["mrr_all_tie_aware"][0] == pytest.approx(0.75)
    # no relevant item in the first tie: the first relevant of the group of 3 (2 relevant)
    # after 2 items is at rank 3 (p 2/3) or 4 (p 1/3)
    h2 = hamming_histograms(db, np.array([[0, 0]]), from_labels([1], [0, 0, 1, 0, 1, 0]),
                            ks=[3])
    m2 = ranking_metrics(h2)["per_query"]
    assert m2["mrr_all_tie_aware"][0] == pytest.approx(2 / 3 / 3 + 1 / 3 / 4)
    assert m2["mrr_tie_aware"][0, 0] == pytest.approx(2 / 3 / 3)
    assert m2["mrr_worst"][0, 0] == 0.0 and m2["mrr_all_worst"][0] == pytest.approx(1 / 4)
    res = evaluate(db, np.array([[0, 0]]), from_labels([0], yb), ks=[1, 3])
    assert res["mrr_all"]["tie_aware"] == pytest.approx(0.75)
    assert res["ranking"]["mrr_tie_aware"] == pytest.approx([0.5, 0.75])


def test_weighted_map_tie_aware_is_ap_topk_for_binary_gains():
    rng = np.random.default_rng(4)
    db = rng.integers(0, 2, (200, 4))
    xq = rng.integers(0, 2, (5, 4))
    rel = from_labels(rng.integers(0, 3, 5), rng.integers(0, 3, 200))
    h = hamming_histograms(db, xq, rel, ks=[1, 10, 75, 500])
    top = ranking_metrics(h, Conventions(ap_denominator="relevant-in-topk"))["per_query"]
    assert np.allclose(top["wmap_tie_aware"], top["map_tie_aware"], atol=1e-12)
    assert np.allclose(top["wmap_ranked"], top["map_ranked"], atol=1e-12)


def test_weighted_map_tie_aware_graded_hand_checked():
    # one tie of 2 items with gains 2 and 1 (multi-hot labels sharing 2 and 1 labels), k = 2:
    # order (2, 1): ACG@1 = 2, ACG@2 = 3/2 -> (2 + 3/2) / 2; order (1, 2): ACG 1, 3/2 ->
    # (1 + 3/2) / 2; the tie-aware value is their mean, 3/2
    yb = np.array([[1, 1, 0], [1, 0, 0]])
    h = hamming_histograms(np.zeros((2, 1), dtype=int), np.zeros((1, 1), dtype=int),
                           from_labels(np.array([[1, 1, 0]]), yb), ks=[1, 2], graded=True)
    m = ranking_metrics(h)["per_query"]
    assert m["wmap_tie_aware"][0].tolist() == pytest.approx([1.5, 1.5])
    assert m["wmap_ranked"][0].tolist() == pytest.approx([2.0, 1.75])


# ---------------------------------------------------------------- F-beta keys
def test_json_keys_say_fbeta_when_beta_is_not_one():
    db, xq, rel = _micro_macro_case()
    one = evaluate(db, xq, rel, ks=[1], per_query=True)
    assert "fbeta_macro" not in one["radius"] and one["radius"]["f1_macro"][0] == 0.5
    two = evaluate(db, xq, rel, ks=[1], per_query=True, conventions=Conventions(beta=2.0))
    assert two["conventions"]["beta"] == 2.0
    assert two["radius"]["f1_macro"] == one["radius"]["f1_macro"]  # F1 stays F1
    assert two["radius"]["fbeta_macro"][0] == pytest.approx((5 / 13 + 5 / 7) / 2)
    assert two["radius"]["fbeta_micro"][0] == pytest.approx(0.5)
    assert two["per_query"]["radius"]["fbeta_macro"][0][0] == pytest.approx(5 / 13)


def test_code_utilization():
    from bucketsearch.index.codes import as_words
    u = code_utilization(as_words(np.array([[0, 0], [0, 0], [1, 1], [1, 0]])), 2)
    assert u["distinct_codes"] == 3 and u["bucket_sizes"] == {1: 2, 2: 1}
    assert u["entropy_bits"] == pytest.approx(1.5) and u["utilization"] == 0.75


def test_errors_name_the_field():
    db = np.zeros((3, 4), dtype=int)
    with pytest.raises(ValueError, match="db labels of the wrong length"):
        hamming_histograms(db, db, from_labels([0, 0, 0], [0, 0]))
    with pytest.raises(ValueError, match="Q must match"):
        hamming_histograms(db, np.zeros((3, 5), dtype=int), from_labels([0] * 3, [0] * 3))
    with pytest.raises(ValueError, match="no_relevant"):
        Conventions(no_relevant="skip")
    with pytest.raises(ValueError, match="k cut-offs"):
        hamming_histograms(db, db, from_labels([0] * 3, [0] * 3), ks=[0])
    with pytest.raises(ValueError, match="radius_max"):
        evaluate(db, db, from_labels([0] * 3, [0] * 3), radius_max=9)


def test_code_stats_in_the_pass_match_the_distinct_code_pass():
    from bucketsearch.index.codes import as_words
    from bucketsearch.index.metrics.histogram import code_histograms
    rng = np.random.default_rng(5)
    db = rng.integers(0, 2, (500, 5))  # 32 possible codes: many repeats
    xq = rng.integers(0, 2, (7, 5))
    h = hamming_histograms(db, xq, from_labels([0] * 7, rng.integers(0, 2, 500)), ks=[1])
    ncodes, maxb = code_histograms(as_words(db), as_words(xq), 5)
    assert np.array_equal(h.code_count, ncodes) and np.array_equal(h.code_max, maxb)
    D = nv.distances(db, xq)
    codes = [tuple(r) for r in db]
    for q in range(7):
        for d in range(6):
            at_d = [codes[i] for i in np.flatnonzero(D[q] == d)]
            assert ncodes[q, d] == len(set(at_d))
            assert maxb[q, d] == (max(codes.count(c) for c in set(at_d)) if at_d else 0)


def test_query_blocks_and_db_chunks_agree_with_naive():
    # > CHUNK db items and > BLOCK_QUERIES queries: every chunk/block boundary is crossed;
    # the same relevance as class labels and as explicit pairs (CSR) must give the same sums
    from bucketsearch.index.evaluation.relevance import from_pairs
    from bucketsearch.index.metrics.histogram import BLOCK_QUERIES, CHUNK
    rng = np.random.default_rng(11)
    nb, nq = CHUNK * 2 + 123, BLOCK_QUERIES * 2 + 5
    db = rng.integers(0, 2, (nb, 8))
    xq = rng.integers(0, 2, (nq, 8))
    yb, yq = rng.integers(0, 7, nb), rng.integers(0, 7, nq)
    rel = from_labels(yq, yb)
    h = hamming_histograms(db, xq, rel, ks=[50, 2000])
    D = nv.distances(db, xq)
    G = dense(rel)
    for q in range(nq):
        assert np.array_equal(h.count[q], np.bincount(D[q], minlength=9))
        assert np.array_equal(h.relevant[q], np.bincount(D[q][G[q] > 0], minlength=9))
    m = ranking_metrics(h)["per_query"]
    for q in (0, 17, nq - 1):
        for j, k in enumerate([50, 2000]):
            ar = nv.as_ranked(D, G, q, k)
            assert m["map_ranked"][q, j] == pytest.approx(ar["ap_all"], abs=1e-12)
            assert m["ndcg_ranked"][q, j] == pytest.approx(ar["ndcg"], abs=1e-12)
    pairs = np.argwhere(G > 0)
    h2 = hamming_histograms(db, xq, from_pairs(pairs, nq, nb), ks=[50, 2000])
    assert np.array_equal(h.count, h2.count) and np.array_equal(h.relevant, h2.relevant)
    assert np.allclose(h.ranked, h2.ranked) and np.array_equal(h.code_max, h2.code_max)
