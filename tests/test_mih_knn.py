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
    ``R`` with ``k`` items within ``R``, else the largest distance asked), and per step the probes, non-empty buckets,
    candidates and first visits; codes_compared 0 unless it switched to a scan."""
    words, ids, xq = make_data(bits, n, 10, seed, clustered)
    # m >= 2 at 64 bits: a 64-bit substring takes the general kernel (tests/test_mih.py)
    m = data.draw(st.integers(max(min_substrings(bits), -(-bits // 63)), min(bits, 6)),
                  label="m")
    index = MultiIndex(bits, substrings=m)
    index.add(words, ids)
    # a radius below m - 1 too: fewer steps than tables (the first block looks up one
    # bucket per step run)
    R = data.draw(st.sampled_from([bits, bits, 0, 1, 2, m - 1]), label="max_distance")
    D, I, stats = index.search(xq, k, stats=True, max_distance=R)
    assert np.array_equal(I, naive.knn_within(xq, words, ids, bits, k, R)[1])
    stop = twin_stop_step(xq, words, bits, k, R)
    twin = twin_step_counts(xq, words, bits, m, R)
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


def test_hashed_bucket_over_many_end_words():
    """A hashed table's bucket of 300 items (five words of end bits and more, at any offset
    in the table): the lookup's end from the end bits holds every item of it and none past
    it (step 0's candidates are the 300), and the answers are brute force's for k up to past
    the bucket."""
    rng = np.random.default_rng(11)
    lead = np.uint64(0x2B5A3C) << np.uint64(42)  # the first 22 bits: substring 0 of m = 3
    low = rng.integers(0, 1 << 42, 300, dtype=np.uint64)
    other = rng.integers(0, 2**63, 500, dtype=np.uint64) | np.uint64(1 << 63)
    words = np.concatenate([lead | low, other]).reshape(-1, 1)
    ids = rng.permutation(5000)[:len(words)].astype(np.int64)
    index = MultiIndex(64, substrings=3)
    index.add(words, ids)
    assert index.sub_widths[0] == 22 and not index.tables.direct[0]
    xq = np.concatenate([lead | rng.integers(0, 1 << 42, 6, dtype=np.uint64),
                         words[rng.integers(0, len(words), 6), 0] ^ np.uint64(1 << 5)])
    xq = xq.reshape(-1, 1)
    for k in (1, 10, 299, 400):
        D, I, stats = index.search(xq, k, stats=True)
        eD, eI = naive.knn(xq, words, ids, 64, k)
        assert np.array_equal(D, eD) and np.array_equal(I, eI)
        assert (stats.candidates[:6, 0] == 300).all()


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


def twin_splice(lims, D, I, rows, lims_b, D_b, I_b):
    """:func:`bucketsearch.index.base.splice_rows` plainly: per query, its own row or, for
    the i-th of ``rows``, row i of the second results."""
    src = {int(r): i for i, r in enumerate(rows)}
    out_lims, out_d, out_i = [0], [], []
    for q in range(len(lims) - 1):
        if q in src:
            i = src[q]
            seg = slice(lims_b[i], lims_b[i + 1])
            out_d += list(D_b[seg])
            out_i += list(I_b[seg])
        else:
            out_d += list(D[lims[q]:lims[q + 1]])
            out_i += list(I[lims[q]:lims[q + 1]])
        out_lims.append(len(out_i))
    return out_lims, out_d, out_i


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 5), min_size=0, max_size=12), data=st.data())
def test_splice_rows_matches_twin(sizes, data):
    from bucketsearch.index.base import splice_rows
    nq = len(sizes)
    rows = sorted(data.draw(st.sets(st.integers(0, max(nq - 1, 0)), max_size=nq), label="rows")
                  if nq else [])
    sizes = [0 if q in rows else s for q, s in enumerate(sizes)]  # replaced rows are empty
    lims = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    D = np.arange(lims[-1], dtype=np.int32)
    I = 100 + np.arange(lims[-1], dtype=np.int64)
    sizes_b = data.draw(st.lists(st.integers(0, 5), min_size=len(rows), max_size=len(rows)),
                        label="sizes_b")
    lims_b = np.concatenate([[0], np.cumsum(sizes_b)]).astype(np.int64)
    D_b = -np.arange(lims_b[-1], dtype=np.int32)
    I_b = 1000 + np.arange(lims_b[-1], dtype=np.int64)
    rows = np.array(rows, dtype=np.int64)
    got = splice_rows(lims, D, I, rows, lims_b, D_b, I_b)
    want = twin_splice(lims, D, I, rows, lims_b, D_b, I_b)
    assert got[0].tolist() == want[0] and got[1].tolist() == want[1] \
        and got[2].tolist() == want[2]


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([16, 32, 64]), n=st.integers(1, 600), k=st.integers(1, 60),
       seed=st.integers(0, 2**16), clustered=st.booleans(), with_stats=st.booleans(),
       budget=st.sampled_from([0.0, 2_000.0, 50_000.0, None]),
       min_work=st.sampled_from([0.0, 0.0, 5_000.0, float("inf")]), data=st.data())
def test_budget_gives_queries_to_the_scan(bits, n, k, seed, clustered, with_stats, budget,
                                          min_work, data):
    """Under a time budget (0: every query not done after its first block or step) the kernel
    gives queries up: each has no result and scanned_from DEFERRED, every other one brute
    force's answer; knn_search answers the given-up ones by the scan and splices them in:
    the whole answer brute force's, the statistics tagged per query by the engine that
    answered (``info["deferred"]`` of them the scan's). A query is given up only past
    ``min_work_ns`` of modeled work (20 ns a probe, 5 a candidate here): none past an
    infinite one."""
    from bucketsearch.index._jit import ns_per_tick
    from bucketsearch.index.mih_knn import DEFERRED, NO_BUDGET, _mih_knn_kernel, knn_search
    from bucketsearch.index.scan import LinearScan
    words, ids, xq = make_data(bits, n, 30, seed, clustered)
    m = data.draw(st.integers(max(min_substrings(bits), -(-bits // 63)), min(bits, 4)),
                  label="m")
    index = MultiIndex(bits, substrings=m)
    index.add(words, ids)
    scan = LinearScan(bits)
    scan.share(index.words, index.ids)
    eD, eI = naive.knn(xq, words, ids, bits, k)
    t = index.tables
    ticks = NO_BUDGET if budget is None else int(budget / ns_per_tick())
    counts, D, I, _, _, _, scanned_from, _ = _mih_knn_kernel(
        xq, k, bits, index.sub_widths, index._step_array(bits), index.max_probes, with_stats,
        t.tables, t.starts, t.slots, t.bitmap, t.positions, t.ends, index.words, index.ids,
        index._word_width, ticks, 20.0, 5.0, min_work)
    lims = np.concatenate([[0], np.cumsum(counts)])
    for q in range(len(xq)):
        if scanned_from[q] == DEFERRED:
            assert counts[q] == 0
        else:
            assert counts[q] == min(k, n)  # (ids may be negative: not a padding test)
            assert I[lims[q]:lims[q + 1]].tolist() == eI[q][:counts[q]].tolist()
            assert D[lims[q]:lims[q + 1]].tolist() == eD[q][:counts[q]].tolist()
    if budget is None or min_work == float("inf"):
        assert not (scanned_from == DEFERRED).any()
    info = {}
    out = knn_search(index, xq, k, with_stats, bits, budget_ns=budget, scan=scan, info=info,
                     work_coef=(20.0, 5.0), min_work_ns=min_work)
    from bucketsearch.index.base import csr_to_knn
    gD, gI = csr_to_knn(*out[:3], k)
    assert np.array_equal(gD, eD) and np.array_equal(gI, eI)
    if with_stats:
        names = out[3].engine_names()
        assert names.count("scan") == info["deferred"]
        assert set(names) <= {"mih", "scan"}
        codes = out[3].codes_compared
        assert all(codes[q] == len(ids) for q in range(len(xq)) if names[q] == "scan")


def test_planned_knn_tries_the_multi_index_first():
    """A k-NN plan of one-word codes carries a budget whatever its mode; near-duplicate
    queries are answered by the multi-index even when the plan is the scan (k = 100 here),
    random ones the scan's; every answer brute force's."""
    from bucketsearch.index.synth import queries_near, uniform_codes
    words = uniform_codes(60_000, 64, seed=1)
    ids = np.arange(len(words))
    index = AutoIndex(64, calibration_queries=16)
    index.add(words, ids)
    index.threads = 1
    near = queries_near(words, 20, 64, flips=0, seed=2)  # each a database code
    far = uniform_codes(20, 64, seed=3)
    for xq, k in ((near, 1), (far, 1), (far, 100)):
        D, I, st_ = index.search(xq, k, stats=True)
        eD, eI = naive.knn(xq, words, ids, 64, k)
        assert np.array_equal(D, eD) and np.array_equal(I, eI)
        plan = index.last_plan
        assert plan["mih_budget_ns"] > 0 and plan["mode"] in ("mih", "scan")
        assert plan["deferred_to_scan"] == st_.engine_names().count("scan")
    D, I = index.search(near, 1)
    assert index.last_plan["ran"] in ("mih", "mih+scan")  # exact matches: R = 0, one step
    assert index.last_plan["deferred_to_scan"] == 0
