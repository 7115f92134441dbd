"""Coding strategies: the invariants the RAMAP argument rests on."""
from __future__ import annotations

import naive_metrics as nv
import numpy as np
import pytest

from bucketsearch.index.evaluation.coding import different_extension, itq, lsh_codes, same_extension
from bucketsearch.index.evaluation.datasets import digits, load, synthetic_cifar


@pytest.fixture(scope="module")
def small():
    return synthetic_cifar(seed=3, n_db=600, n_queries=40, dim=32)


def test_synthetic_is_deterministic_and_cifar_shaped(small):
    again = synthetic_cifar(seed=3, n_db=600, n_queries=40, dim=32)
    assert np.array_equal(small.xb, again.xb) and np.array_equal(small.yq, again.yq)
    assert small.xb.shape == (600, 32) and small.xq.shape == (40, 32)
    assert np.bincount(small.yq).tolist() == [4] * 10  # queries evenly over 10 classes
    other = synthetic_cifar(seed=4, n_db=600, n_queries=40, dim=32)
    assert not np.array_equal(small.xb, other.xb)


def test_lsh_deterministic_and_shaped(small):
    b1, q1 = lsh_codes(small.xb, small.xq, 16, seed=1)
    b2, q2 = lsh_codes(small.xb, small.xq, 16, seed=1)
    assert b1.shape == (600, 16) and q1.shape == (40, 16)
    assert np.array_equal(b1, b2) and np.array_equal(q1, q2)
    assert set(np.unique(b1)) <= {0, 1}


def test_extensions_shift_distances(small):
    b, q = lsh_codes(small.xb, small.xq, 8)
    d = nv.distances(b, q)
    bs, qs = same_extension(b, q, 3)
    bd, qd = different_extension(b, q, 3)
    assert bs.shape[1] == 11 and bd.shape[1] == 11
    assert np.array_equal(nv.distances(bs, qs), d)
    assert np.array_equal(nv.distances(bd, qd), d + 3)


def test_itq_lowers_quantization_loss_and_beats_chance(small):
    from bucketsearch.index.metrics import hamming_histograms, ranking_metrics
    from bucketsearch.index.evaluation.relevance import from_labels
    b, q = itq(small.xb, small.xq, 16, n_iter=30)
    assert b.shape == (600, 16) and q.shape == (40, 16)
    rel = from_labels(small.yq, small.yb)
    m = ranking_metrics(hamming_histograms(b, q, rel, ks=[10]))["mean"]["map_all_tie_aware"]
    assert m > 0.12  # 10 balanced classes: a random ranking gives about 0.1


def test_digits_and_loaders(tmp_path):
    d = digits(n_queries=50)
    assert d.xb.shape == (1747, 64) and d.xq.shape == (50, 64)
    np.savez(tmp_path / "set.npz", xb=d.xb, yb=d.yb, xq=d.xq, yq=d.yq)
    back = load(str(tmp_path / "set.npz"))
    assert np.array_equal(back.yq, d.yq)
    with pytest.raises(ValueError, match="data set must be"):
        load("cifar")
    with pytest.raises(ValueError, match="bits"):
        lsh_codes(d.xb, d.xq, 0)
