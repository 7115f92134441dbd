"""k-NN by the incremental multi-index search (index/mih_knn.py) against brute force and a
numpy twin of its steps (where it stops, what each step probes and meets)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.mih import MultiIndex, min_substrings
from bucketsearch.index.planner import AutoIndex
from tests import naive
from tests.test_mih import make_data, substring_distances, twin_step_counts


def twin_stop_step(xq, xb, bits, k, max_radius):
    """Per query, the last radius step of the incremental search: the first ``R`` with
    ``min(k, n)`` items at distance ``<= R`` (every one of them met by then, the pigeonhole
    bound), else ``max_radius``."""
    dist = naive.hamming_matrix(xq, xb, bits)
    kk = min(k, len(xb))
    out = []
    for row in dist:
        within = np.array([(row <= R).sum() for R in range(max_radius + 1)])
        hit = np.flatnonzero(within >= kk)
        out.append(int(hit[0]) if len(hit) else max_radius)
    return np.array(out)


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([8, 16, 24, 40, 64, 128, 256]), n=st.integers(0, 300),
       k=st.integers(1, 100), seed=st.integers(0, 2**16), clustered=st.booleans(),
       dup=st.booleans(), data=st.data())
def test_knn_matches_brute_force(bits, n, k, seed, clustered, dup, data):
    """Answers identical to brute force, tie order (distance, id) included, for any substring
    count; duplicate codes (dup: every code twice, other ids) and clustered codes."""
    words, ids, xq = make_data(bits, n, 12, seed, clustered)
    if dup and n:
        words = np.concatenate([words, words])
        ids = np.concatenate([ids, ids.max() + 1 + np.arange(n)])
    m = data.draw(st.integers(min_substrings(bits), min(bits, 8)), label="m")
    index = MultiIndex(bits, substrings=m)
    index.add(words, ids)
    D, I = index.search(xq, k)
    eD, eI = naive.knn(xq, words, ids, bits, k)
    assert np.array_equal(D, eD) and np.array_equal(I, eI)
    R = data.draw(st.integers(0, bits), label="max_distance")
    D, I = index.search(xq, k, max_distance=R)
    eD, eI = naive.knn_within(xq, words, ids, bits, k, R)
    assert np.array_equal(D, eD) and np.array_equal(I, eI)


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([16, 32, 48, 64]), n=st.integers(1, 400), k=st.integers(1, 40),
       seed=st.integers(0, 2**16), clustered=st.booleans(), data=st.data())
def test_steps_match_twin(bits, n, k, seed, clustered, data):
    """Statistics of the one-word kernel against the twin: the step it stops at (the first
    ``R`` with ``k`` items within ``R``), and per step the probes, non-empty buckets,
    candidates and first visits; codes_compared 0 unless it switched to a scan."""
    words, ids, xq = make_data(bits, n, 10, seed, clustered)
    # m >= 2 at 64 bits: a 64-bit substring takes the general kernel (tests/test_mih.py)
    m = data.draw(st.integers(max(min_substrings(bits), -(-bits // 63)), min(bits, 6)),
                  label="m")
    index = MultiIndex(bits, substrings=m)
    index.add(words, ids)
    D, I, stats = index.search(xq, k, stats=True)
    assert np.array_equal(I, naive.knn(xq, words, ids, bits, k)[1])
    stop = twin_stop_step(xq, words, bits, k, bits)
    twin = twin_step_counts(xq, words, bits, m, bits)
    for qi in range(len(xq)):
        scanned = stats.scanned_from[qi]
        if scanned < 0:  # stopped by the bound: at the twin's step, everything before it run
            assert stats.radii[qi] == stop[qi] + 1
            steps = slice(0, stop[qi] + 1)
            found = np.bincount(D[qi][D[qi] >= 0], minlength=bits + 1)[:stop[qi] + 1]
            assert np.array_equal(stats.items[qi, steps], found)
        else:  # a step past the budget (C(w_j, s) > n): it comes before the twin's stop
            assert scanned <= stop[qi] and stats.codes_compared[qi] == len(ids)
            steps = slice(0, scanned)
        assert np.array_equal(stats.probes[qi, steps], twin["probes"][qi, steps])
        assert np.array_equal(stats.nonempty_buckets[qi, steps], twin["nonempty"][qi, steps])
        assert np.array_equal(stats.candidates[qi, steps], twin["candidates"][qi, steps])
        assert np.array_equal(stats.unique_candidates[qi, steps], twin["unique"][qi, steps])
    assert (stats.engine == 2).all() and (stats.k == k).all()
    assert (stats.codes_compared[stats.scanned_from < 0] == 0).all()


def test_probe_budget_switches_to_scan_exactly():
    """A budget too small for the radius needed: the query verifies every item from the step
    that would pass it (scanned_from), answers still exact, codes_compared = ntotal."""
    words, ids, xq = make_data(64, 2000, 20, 3, clustered=False)
    index = MultiIndex(64, substrings=4, max_probes=50)
    index.add(words, ids)
    D, I, stats = index.search(xq, 7, stats=True)
    eD, eI = naive.knn(xq, words, ids, 64, 7)
    assert np.array_equal(D, eD) and np.array_equal(I, eI)
    assert (stats.scanned_from >= 0).any()
    assert (stats.codes_compared[stats.scanned_from >= 0] == index.ntotal).all()


def test_each_item_once_when_several_tables_meet_it():
    """32-bit codes, m = 4: every item equals the query on substrings 0 and 1 and differs on
    the last two, so steps 0 and 1 both meet every item before the k-th is certain (it is at
    distance >= 2); the answer holds each id once, in (distance, id) order."""
    rng = np.random.default_rng(4)
    low = rng.integers(1, 1 << 16, 60).astype(np.uint64)
    words = (np.uint64(0xABCD) << np.uint64(16) | low).reshape(-1, 1)
    ids = rng.permutation(1000)[:60].astype(np.int64)
    xq = np.array([[0xABCD0000]], dtype=np.uint64)
    index = MultiIndex(32, substrings=4)
    index.add(words, ids)
    for k in (5, 60, 80):
        D, I, stats = index.search(xq, k, stats=True)
        eD, eI = naive.knn(xq, words, ids, 32, k)
        assert np.array_equal(D, eD) and np.array_equal(I, eI)
        assert stats.candidates[0, 0] == 60 and stats.candidates[0, 1] == 60
        assert stats.unique_candidates[0, 0] == 60 and stats.unique_candidates[0, 1] == 0


@pytest.mark.parametrize("mode", ["auto"])
def test_planner_knn_identical(mode):
    """The planner's k-NN (whatever engine it picks) equals brute force on uniform codes."""
    words, ids, xq = make_data(64, 3000, 30, 5, clustered=False)
    index = AutoIndex(64)
    index.add(words, ids)
    for k in (1, 10, 100):
        D, I = index.search(xq, k)
        eD, eI = naive.knn(xq, words, ids, 64, k)
        assert np.array_equal(D, eD) and np.array_equal(I, eI)


def test_substring_distances_helper_agrees():
    """(sanity of the twin's helper) the substring distances sum to the full distance."""
    words, ids, xq = make_data(64, 50, 5, 1)
    assert np.array_equal(substring_distances(xq, words, 64, 5).sum(axis=2),
                          naive.hamming_matrix(xq, words, 64))
