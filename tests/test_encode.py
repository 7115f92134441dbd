"""The search answer encoders against plain twins: numba JSON writer vs orjson of Python lists,
binary layout round trip, k-NN padding removal."""
from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.app.encode import knn_to_csr, results_binary, results_json
from bucketsearch.loadtest.wire import decode_binary_results as decode_results_binary

INT64 = st.integers(-(2**63), 2**63 - 1)


def json_twin(lims, D, I) -> bytes:
    return orjson.dumps([{"ids": I[a:b].tolist(), "distances": D[a:b].tolist()}
                         for a, b in zip(lims[:-1], lims[1:])])


@st.composite
def csr(draw):
    counts = draw(st.lists(st.integers(0, 6), min_size=0, max_size=12))
    n = sum(counts)
    lims = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
    ids = np.array(draw(st.lists(INT64, min_size=n, max_size=n)), dtype=np.int64)
    dists = np.array(draw(st.lists(st.integers(0, 256), min_size=n, max_size=n)),
                     dtype=np.int32)
    return lims, dists, ids


@settings(max_examples=300, deadline=None)
@given(csr())
def test_json_writer_equals_orjson_of_lists(case):
    lims, D, I = case
    assert results_json(lims, D, I) == json_twin(lims, D, I)


@settings(max_examples=200, deadline=None)
@given(csr())
def test_binary_round_trip(case):
    lims, D, I = case
    buf = results_binary(lims, D, I)
    assert len(buf) == 8 + 8 * len(lims) + 12 * len(I)
    lims2, D2, I2 = decode_results_binary(buf)
    assert lims2.tolist() == lims.tolist() and I2.tolist() == I.tolist() \
        and D2.tolist() == D.tolist()


def test_json_writer_edges():
    lims = np.array([0, 0, 3], dtype=np.int64)
    I = np.array([0, 2**63 - 1, -(2**63)], dtype=np.int64)
    D = np.array([0, 9, 10], dtype=np.int32)
    assert results_json(lims, D, I) == (b'[{"ids":[],"distances":[]},{"ids":[0,'
                                        b'9223372036854775807,-9223372036854775808],'
                                        b'"distances":[0,9,10]}]')
    assert results_json(np.zeros(1, dtype=np.int64), D[:0], I[:0]) == b"[]"


def test_binary_decoder_rejects_bad_sizes():
    buf = results_binary(np.array([0, 2]), np.array([1, 2]), np.array([5, 6]))
    for bad in (buf[:-1], buf + b"\0", buf[:10], b""):
        with pytest.raises(ValueError, match="binary results"):
            decode_results_binary(bad)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.data())
def test_knn_to_csr_drops_padding(nq, k, data):
    I = np.full((nq, k), -1, dtype=np.int64)
    D = np.full((nq, k), -1, dtype=np.int32)
    for q in range(nq):  # k-NN rows: found items first, then -1 padding
        found = data.draw(st.integers(0, k))
        I[q, :found] = data.draw(st.lists(st.integers(0, 10**6), min_size=found,
                                          max_size=found))
        D[q, :found] = sorted(data.draw(st.lists(st.integers(0, 64), min_size=found,
                                                 max_size=found)))
    lims, D2, I2 = knn_to_csr(D, I)
    for q in range(nq):
        keep = I[q] >= 0
        assert I2[lims[q]:lims[q + 1]].tolist() == I[q][keep].tolist()
        assert D2[lims[q]:lims[q + 1]].tolist() == D[q][keep].tolist()
