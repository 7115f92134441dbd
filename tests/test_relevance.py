"""Relevance builders against literal dense definitions."""
from __future__ import annotations

import numpy as np
import pytest

from bucketsearch.index.evaluation import relevance as R


def test_class_labels():
    rel = R.from_labels([0, 2], [0, 1, 2, 0])
    assert rel.mode == "class"
    assert R.dense(rel).tolist() == [[1, 0, 0, 1], [0, 0, 1, 0]]


def test_multihot_shared_labels_graded_and_binary():
    yq = np.array([[1, 1, 0], [0, 0, 0]])
    yb = np.array([[1, 1, 1], [0, 1, 0], [0, 0, 1]])
    rel = R.from_labels(yq, yb)
    assert rel.mode == "multihot" and rel.max_level == 3
    assert R.dense(rel, graded=True).tolist() == [[2, 1, 0], [0, 0, 0]]
    assert R.dense(rel, graded=False).tolist() == [[1, 1, 0], [0, 0, 0]]


def test_multihot_over_64_labels():
    rng = np.random.default_rng(0)
    yq = (rng.random((3, 130)) < 0.1).astype(int)
    yb = (rng.random((9, 130)) < 0.1).astype(int)
    assert np.array_equal(R.dense(R.from_labels(yq, yb)), yq @ yb.T)


def test_graded_matrix_and_pairs():
    g = np.array([[0, 2.5, 0], [1, 0, 0]])
    rel = R.from_graded_matrix(g)
    assert rel.mode == "csr" and np.array_equal(R.dense(rel), g)
    pairs = R.from_pairs([(0, 1), (1, 0), (0, 1)], 2, 3)
    assert R.dense(pairs).tolist() == [[0, 2, 0], [1, 0, 0]]  # duplicate gains add up
    assert R.dense(pairs, graded=False).tolist() == [[0, 1, 0], [1, 0, 0]]


def test_epsilon_ball_from_features():
    rng = np.random.default_rng(1)
    xb = rng.standard_normal((300, 5))
    xq = rng.standard_normal((7, 5))
    eps = R.epsilon_from_features(xb, n_neighbors=50, n_samples=100, seed=0)
    # literal: mean over the same sampled points of the distance to the 50th nearest neighbour
    pick = np.random.default_rng(0).choice(300, size=100, replace=False)
    d = np.linalg.norm(xb[pick, None] - xb[None], axis=2)
    d[np.arange(100), pick] = np.inf
    assert eps == pytest.approx(np.sort(d, axis=1)[:, 49].mean())
    rel, eps2 = R.from_features(xq, xb, chunk=3)
    assert eps2 == eps
    truth = np.linalg.norm(xq[:, None] - xb[None], axis=2) <= eps
    assert np.array_equal(R.dense(rel) > 0, truth)


def test_subset_queries():
    rel = R.from_pairs([(0, 1), (2, 0), (2, 2)], 3, 3)
    sub = rel.subset_queries(np.array([2, 0]))
    assert R.dense(sub).tolist() == [[1, 0, 1], [0, 1, 0]]


@pytest.mark.parametrize("args, match", [
    (([0, 1], [[0, 1]]), "1-D but db labels are 2-D"),
    (([[0, 2]], [[0, 1]]), "not 0 or 1"),
    (([[0, 1]], [[0, 1, 1]]), "columns"),
    (([0.5], [1]), "integers"),
])
def test_label_errors(args, match):
    with pytest.raises(ValueError, match=match):
        R.from_labels(*args)


def test_pair_errors():
    with pytest.raises(ValueError, match="db index out of range"):
        R.from_pairs([(0, 5)], 1, 3)
    with pytest.raises(ValueError, match="must be 2-D"):
        R.from_graded_matrix([1, 2])


def test_csr_rows_are_sorted_and_checked():
    rel = R.from_csr([0, 2, 3], [2, 0, 1], [1.0, 3.0, 1.0], 2, 3)
    assert R.dense(rel).tolist() == [[3, 0, 1], [0, 1, 0]]
    with pytest.raises(ValueError, match="twice"):
        R.from_csr([0, 2], [1, 1], [1.0, 1.0], 1, 3)
    with pytest.raises(ValueError, match="CSR arrays disagree"):
        R.from_csr([0, 3], [1, 2], [1.0, 1.0], 1, 3)
