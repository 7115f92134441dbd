"""Property tests (hypothesis): kernels against the naive twins, tie-aware metrics against the
brute-force average over every ordering inside the ties (tiny inputs)."""
from __future__ import annotations

import naive_metrics as nv
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.evaluation.relevance import dense, from_labels
from bucketsearch.index.metrics import (Conventions, auprc_thesis, hamming_histograms, mlgap,
                                        radius_metrics, ranking_metrics)

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def tiny_case(draw, max_nb=6, max_bits=3, graded=False):
    bits = draw(st.integers(1, max_bits))
    nb = draw(st.integers(1, max_nb))
    nq = draw(st.integers(1, 2))
    db = np.array(draw(st.lists(st.lists(st.integers(0, 1), min_size=bits, max_size=bits),
                                min_size=nb, max_size=nb)))
    xq = np.array(draw(st.lists(st.lists(st.integers(0, 1), min_size=bits, max_size=bits),
                                min_size=nq, max_size=nq)))
    if graded:
        yb = np.array(draw(st.lists(st.lists(st.integers(0, 1), min_size=3, max_size=3),
                                    min_size=nb, max_size=nb)))
        yq = np.array(draw(st.lists(st.lists(st.integers(0, 1), min_size=3, max_size=3),
                                    min_size=nq, max_size=nq)))
    else:
        yb = np.array(draw(st.lists(st.integers(0, 2), min_size=nb, max_size=nb)))
        yq = np.array(draw(st.lists(st.integers(0, 2), min_size=nq, max_size=nq)))
    ks = sorted(set(draw(st.lists(st.integers(1, max_nb + 2), min_size=1, max_size=3))))
    return db, xq, from_labels(yq, yb), ks


def _check_tie_aware(db, xq, rel, ks, graded):
    h = hamming_histograms(db, xq, rel, ks=ks, graded=graded)
    m = ranking_metrics(h)["per_query"]
    top = ranking_metrics(h, Conventions(ap_denominator="relevant-in-topk"))["per_query"]
    D, G = nv.distances(db, xq), dense(rel, graded=graded)
    for q in range(len(xq)):
        whole = nv.tie_average(D, G, q, len(db))
        assert m["map_all_tie_aware"][q] == pytest.approx(whole["ap_all"], abs=1e-12)
        assert m["mrr_all_tie_aware"][q] == pytest.approx(whole["rr"], abs=1e-12)
        assert m["wmap_all_tie_aware"][q] == pytest.approx(whole["wap"], abs=1e-12)
        for j, k in enumerate(ks):
            ta = nv.tie_average(D, G, q, k)
            assert m["map_tie_aware"][q, j] == pytest.approx(ta["ap_all"], abs=1e-12)
            assert top["map_tie_aware"][q, j] == pytest.approx(ta["ap_topk"], abs=1e-12)
            assert m["ndcg_tie_aware"][q, j] == pytest.approx(ta["ndcg"], abs=1e-12)
            assert m["precision_tie_aware"][q, j] == pytest.approx(ta["precision"], abs=1e-12)
            assert m["recall_tie_aware"][q, j] == pytest.approx(ta["recall"], abs=1e-12)
            assert m["f1_tie_aware"][q, j] == pytest.approx(ta["f1"], abs=1e-12)
            assert m["acg_tie_aware"][q, j] == pytest.approx(ta["acg"], abs=1e-12)
            assert m["wmap_tie_aware"][q, j] == pytest.approx(ta["wap"], abs=1e-12)
            assert m["mrr_tie_aware"][q, j] == pytest.approx(ta["rr"], abs=1e-12)
            ar = nv.as_ranked(D, G, q, k)
            assert m["map_ranked"][q, j] == pytest.approx(ar["ap_all"], abs=1e-12)
            assert top["map_ranked"][q, j] == pytest.approx(ar["ap_topk"], abs=1e-12)
            assert m["ndcg_ranked"][q, j] == pytest.approx(ar["ndcg"], abs=1e-12)
            assert m["wmap_ranked"][q, j] == pytest.approx(ar["wap"], abs=1e-12)
            assert m["precision_ranked"][q, j] == pytest.approx(ar["precision"], abs=1e-12)
            for worst, key in ((False, "best"), (True, "worst")):
                bw = nv.best_worst(D, G, q, k, worst=worst)
                assert m["map_" + key][q, j] == pytest.approx(bw["ap_all"], abs=1e-12)
                assert top["map_" + key][q, j] == pytest.approx(bw["ap_topk"], abs=1e-12)
                assert m["mrr_" + key][q, j] == pytest.approx(bw["rr"], abs=1e-12)
            # the expectation lies between the best and the worst case
            assert m["map_worst"][q, j] - 1e-12 <= m["map_tie_aware"][q, j] \
                <= m["map_best"][q, j] + 1e-12


@SETTINGS
@given(tiny_case())
def test_tie_aware_equals_brute_force_average(case):
    _check_tie_aware(*case, graded=False)


@SETTINGS
@given(tiny_case(graded=True))
def test_tie_aware_graded_equals_brute_force_average(case):
    _check_tie_aware(*case, graded=True)


@settings(max_examples=40, deadline=None)
@given(tiny_case(max_nb=25, max_bits=6), st.floats(0, 1), st.booleans())
def test_radius_metrics_and_lgap_match_naive(case, empty_precision, inclusive):
    db, xq, rel, _ = case
    bits = db.shape[1]
    conv = Conventions(empty_precision=empty_precision, radius_inclusive=inclusive)
    h = hamming_histograms(db, xq, rel, ks=[1])
    rm = radius_metrics(h, conv)
    D, G = nv.distances(db, xq), dense(rel)
    has_rel = (G > 0).any(axis=1)
    for r in range(bits + 1):
        radius = r if inclusive else r - 1  # d < r  <=>  d <= r - 1
        p, rc = nv.precision_recall_radius(D, G, radius, empty_precision)
        assert np.allclose(rm.precision[:, r], np.where(has_rel, p, 0.0))
        assert np.allclose(rm.recall[:, r], np.nan_to_num(rc))
        pm, _ = nv.micro_precision_recall(D, G, radius, empty_precision)
        assert rm.precision_micro[r] == pytest.approx(pm)
    if inclusive:
        for denominator in ("all-codes", "occupied-codes"):
            lg, _ = mlgap(h, conv, denominator)
            expect = nv.lgap(db, xq, G, bits, empty_precision, denominator)
            assert np.allclose(lg, np.where(has_rel[:, None], expect, 0.0))
        if (G > 0).any():
            assert auprc_thesis(h, conv) == pytest.approx(
                nv.auprc_thesis(D, G, bits, empty_precision), abs=1e-12)
