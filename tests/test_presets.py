"""Each preset against its source's own formula on a worked example; TREC export and import
scored by trec_eval (pytrec_eval) against our own numbers."""
from __future__ import annotations

import numpy as np
import pytest
from naive_metrics import distances, micro_precision_recall, ramap_naive, tie_aware_ap_all

from bucketsearch.index.evaluation import presets, trec
from bucketsearch.index.evaluation.relevance import dense, from_labels
from bucketsearch.index.metrics import evaluate


def calc_topmap(rB, qB, retrievalL, queryL, topk, kind="quicksort"):
    """DeepHash-pytorch utils/tools.py CalcTopMap, line for line (codes in {-1,+1})."""
    num_query = queryL.shape[0]
    topkmap = 0
    for it in range(num_query):
        gnd = (np.dot(queryL[it, :], retrievalL.transpose()) > 0).astype(np.float32)
        hamm = 0.5 * (rB.shape[1] - np.dot(qB[it, :], rB.transpose()))   # CalcHammingDist
        ind = np.argsort(hamm, kind=kind)
        gnd = gnd[ind]
        tgnd = gnd[0:topk]
        tsum = np.sum(tgnd).astype(int)
        if tsum == 0:
            continue
        count = np.linspace(1, tsum, tsum)
        tindex = np.asarray(np.where(tgnd == 1)) + 1.0
        topkmap_ = np.mean(count / (tindex))
        topkmap = topkmap + topkmap_
    return topkmap / num_query


@pytest.fixture(scope="module")
def example():
    rng = np.random.default_rng(7)
    db = rng.integers(0, 2, (120, 10))
    q = db[rng.integers(0, 120, 12)] ^ (rng.random((12, 10)) < 0.2)
    yb = (rng.random((120, 5)) < 0.3).astype(int)
    yq = (rng.random((12, 5)) < 0.3).astype(int)
    return db, q, yb, yq


def _conv(name):
    conv, notes = presets.resolve(name, {})
    assert notes == []
    return conv


def test_deephash_pytorch_matches_calc_topmap(example):
    db, q, yb, yq = example
    res = evaluate(db, q, from_labels(yq, yb), ks=[5, 20, 60], radius_max=2,
                   conventions=_conv("deephash-pytorch"), per_query=True)
    rB, qB = 2 * db - 1, 2 * q - 1
    for j, k in enumerate([5, 20, 60]):
        # a stable sort is our (distance, id) order: equal to the as-ranked mAP@k
        assert res["ranking"]["map_ranked"][j] == pytest.approx(
            calc_topmap(rB, qB, yb, yq, k, kind="stable"), abs=1e-12)
        # numpy's default (unstable) sort: any tie order lies between worst and best
        value = calc_topmap(rB, qB, yb, yq, k)
        assert res["ranking"]["map_worst"][j] - 1e-12 <= value <= \
            res["ranking"]["map_best"][j] + 1e-12
    # the all-relevant denominator gives another number: the preset matters here
    plain = evaluate(db, q, from_labels(yq, yb), ks=[20], radius_max=2)
    assert plain["ranking"]["map_ranked"][0] != pytest.approx(res["ranking"]["map_ranked"][1])


def test_talr_is_the_tie_aware_ap_of_mcsherry_najork(example):
    db, q, yb, yq = example
    rel = from_labels(yq, yb)
    res = evaluate(db, q, rel, ks=[10], radius_max=2, conventions=_conv("talr"))
    D, G = distances(db, q), dense(rel, graded=False)
    want = np.mean([tie_aware_ap_all(D, G, i) for i in range(len(q))])
    assert res["map_all"]["tie_aware"] == pytest.approx(want, abs=1e-12)


def test_thesis_is_pooled_precision_and_recall(example):
    db, q, yb, yq = example
    rel = from_labels(yq, yb)
    res = evaluate(db, q, rel, ks=[10], radius_max=4, conventions=_conv("thesis"))
    D, G = distances(db, q), dense(rel, graded=False)
    for r in range(5):
        p, rc = micro_precision_recall(D, G, r)
        assert res["radius"]["precision_micro"][r] == pytest.approx(p, abs=1e-12)
        assert res["radius"]["recall_micro"][r] == pytest.approx(rc, abs=1e-12)


def test_ramap_paper_is_the_papers_formula(example):
    db, q, yb, yq = example
    rel = from_labels(yq, yb)
    res = evaluate(db, q, rel, ks=[10], radius_max=3, conventions=_conv("ramap-paper"))
    D, G = distances(db, q), dense(rel, graded=False)
    want = ramap_naive(D, G, 10, 3).mean(axis=0)
    assert res["radius"]["ramap"] == pytest.approx(want.tolist(), abs=1e-12)


def test_resolve_explicit_over_preset_over_default():
    conv, notes = presets.resolve("deephash-pytorch", {"ap_denominator": "all-relevant",
                                                        "beta": 2.0, "no_relevant": None})
    assert conv.ap_denominator == "all-relevant" and conv.beta == 2.0
    assert conv.no_relevant == "zero"
    assert len(notes) == 1 and "overrides the preset's 'relevant-in-topk'" in notes[0]
    with pytest.raises(ValueError, match="--preset must be one of"):
        presets.resolve("nope", {})
    for name in presets.NAMES:
        text = presets.describe(name)
        assert text.startswith(f"preset {name}: ") and "reports:" in text


# ---------------------------------------------------------------------- TREC interop
def _strip(path):
    return "".join(line for line in open(path) if not line.startswith("#"))


def _parse(text, qrels=False):
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if qrels:
            out.setdefault(parts[0], {})[parts[2]] = int(parts[3])
        else:
            out.setdefault(parts[0], {})[parts[2]] = float(parts[4])
    return out


def test_trec_export_scored_by_trec_eval_matches_ours(tmp_path):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rng = np.random.default_rng(11)
    db = rng.integers(0, 2, (300, 8))      # 8 bits: many ties, so the tie-break matters
    q = rng.integers(0, 2, (15, 8))
    yb = rng.integers(0, 4, 300)
    yq = rng.integers(0, 4, 15)
    rel = from_labels(yq, yb)
    run_path, qrels_path = tmp_path / "run.txt", tmp_path / "qrels.txt"
    trec.write_run(run_path, db, q, depth=300)
    assert trec.write_qrels(qrels_path, rel) == int(dense(rel).sum())
    assert open(run_path).readline().startswith("# bucketsearch TREC run")
    run = _parse(_strip(run_path))
    qrels = _parse(qrels_path.read_text(), qrels=True)
    measures = {"map", "P_5", "P_10", "map_cut_10", "map_cut_100"}
    scores = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    ours = evaluate(db, q, rel, ks=[5, 10, 100], radius_max=2, per_query=True)
    pq = ours["per_query"]
    for i in range(len(q)):
        s = scores[f"q{i}"]
        assert s["map"] == pytest.approx(pq["map_all"]["ranked"][i], abs=1e-9)
        assert s["P_5"] == pytest.approx(pq["ranking"]["precision_ranked"][i][0], abs=1e-9)
        assert s["P_10"] == pytest.approx(pq["ranking"]["precision_ranked"][i][1], abs=1e-9)
        assert s["map_cut_10"] == pytest.approx(pq["ranking"]["map_ranked"][i][1], abs=1e-9)
        assert s["map_cut_100"] == pytest.approx(pq["ranking"]["map_ranked"][i][2], abs=1e-9)


def test_qrels_round_trip_and_errors(tmp_path):
    rng = np.random.default_rng(2)
    g = rng.integers(0, 3, (6, 9)) * (rng.random((6, 9)) < 0.5)
    from bucketsearch.index.evaluation.relevance import from_graded_matrix
    rel = from_graded_matrix(g)
    path = tmp_path / "q.txt"
    trec.write_qrels(path, rel, graded=True)
    back = trec.read_qrels(path, 6, 9)
    assert np.array_equal(dense(back), g)
    for text, message in (("q0 0 d1\n", "expected 4 columns"), ("q0 0 d99 1\n", "out of range"),
                          ("x 0 d1 1\n", "query id 'x' is not q<row>"),
                          ("q0 0 d1 a\n", "relevance 'a' is not a number"),
                          ("q0 0 d1 1\nq0 0 d1 2\n", "listed twice")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            trec.read_qrels(path, 6, 9)
