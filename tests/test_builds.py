"""Builds as linear passes (issue 28 item 2): the build kernels against plain-numpy twins
(hypothesis), and a build on several threads equal to the one-thread build, bit for bit."""
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index import mih_tables, pool, radix
from bucketsearch.index.factory import make_index
from bucketsearch.index.item_table import ItemTable, filter_words, run_starts
from bucketsearch.index.table import merge_items, sort_items
from tests import naive

_KEYS = st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1), st.integers(0, 2**20),
                  st.sampled_from([0, 255, 256, 2**32, 2**63, 2**64 - 1]))


@st.composite
def skewed_keys(draw):
    """Keys of a few hundred to a few thousand: uniform, narrow (runs of many equal leading
    bits: the in-cache LSD and the insertion sort), or narrow with a far outlier (one run
    holding nearly all of them)."""
    n = draw(st.integers(0, 3000))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    shape = draw(st.sampled_from(["uniform", "narrow", "outlier", "listed"]))
    if shape == "listed":
        return np.array(draw(st.lists(_KEYS, max_size=300)), dtype=np.uint64)
    if shape == "uniform":
        return rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    top = draw(st.integers(1, 40))
    keys = rng.integers(0, 2**top, n, dtype=np.uint64)
    if shape == "outlier" and n:
        keys[rng.integers(0, n)] = np.uint64(2**63 + 5)
    return keys


@settings(max_examples=150, deadline=None)
@given(keys=skewed_keys(), threads=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_sort_pairs_on_any_threads_is_the_stable_sort(keys, threads, seed):
    """The split by the leading digit, the runs sorted in the cache (insertion sort and LSD),
    on one thread or several: numpy's stable sort (the twin), inputs untouched."""
    values = np.random.default_rng(seed).integers(-2**40, 2**40, len(keys))
    before = keys.copy(), values.copy()
    tk, tv = naive.stable_sort_pairs(keys, values)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(radix, "PARALLEL_MIN_PAIRS", 8)  # the threads' path on small inputs
        threaded = radix.sort_pairs_threads(keys, values, threads)
    for out_k, out_v in (radix.sort_pairs(keys, values), threaded):
        assert out_k.dtype == keys.dtype and out_v.dtype == values.dtype
        assert (out_k == tk).all() and (out_v == tv).all()
    assert (keys == before[0]).all() and (values == before[1]).all()


@settings(max_examples=100, deadline=None)
@given(keys=skewed_keys(), data=st.data())
def test_sort_digit_runs_sorts_each_run_below_the_shift(keys, data):
    """Runs that agree from bit ``shift`` up (each its own leading value), sorted in place by
    the bits below: each run equals its stable sort, nothing moves between runs."""
    shift = data.draw(st.integers(0, 40))
    low = keys & np.uint64((1 << shift) - 1)
    cuts = np.unique(np.array(data.draw(st.lists(st.integers(0, len(keys)), max_size=6)) +
                              [0, len(keys)], dtype=np.int64))
    run_of = np.searchsorted(cuts, np.arange(len(keys)), side="right") - 1
    work = (low | (run_of.astype(np.uint64) << np.uint64(shift))).astype(np.uint64) \
        if shift < 58 else low
    values = np.arange(len(keys), dtype=np.int64)
    want_k, want_v = work.copy(), values.copy()
    for a, b in zip(cuts, cuts[1:]):
        want_k[a:b], want_v[a:b] = naive.stable_sort_pairs(work[a:b], values[a:b])
    radix.sort_digit_runs(work, values, cuts, 0, len(cuts) - 1, shift)
    assert (work == want_k).all() and (values == want_v).all()


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(-2**62, 2**62), max_size=200) | st.lists(st.integers(-3, 40),
                                                                           max_size=60),
       ordered=st.booleans())
def test_repeated_id_is_the_smallest_repeated(ids, ordered):
    ids = np.array(sorted(ids) if ordered else ids, dtype=np.int64)
    assert radix.repeated_id(ids) == naive.repeated_id(ids)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 400), lo=st.integers(-2**40, 2**40), gaps=st.booleans(),
       form=st.sampled_from(["shuffled", "increasing", "swapped"]), seed=st.integers(0, 2**31))
def test_positions_by_id_is_the_id_order(n, lo, gaps, form, seed):
    """Consecutive ids in any order (the scatter), ids with gaps (the radix sort), increasing
    ids (empty: the identity): the positions in ascending id order (the twin: argsort)."""
    rng = np.random.default_rng(seed)
    ids = lo + (np.sort(rng.choice(3 * n + 1, n, replace=False)) if gaps else np.arange(n))
    if form == "shuffled":
        ids = rng.permutation(ids)
    elif form == "swapped" and n >= 2:
        ids[[0, -1]] = ids[[-1, 0]]
    ids = ids.astype(np.int64)
    got = mih_tables.positions_by_id(ids, np.uint32)
    want = naive.positions_by_id(ids)
    if len(got) == 0:
        assert (want == np.arange(n)).all()
    else:
        assert got.dtype == np.uint32 and (got == want).all()


def test_inverse_dense_refuses_ids_out_of_range_or_repeated():
    out = np.full(3, 3, dtype=np.uint32)
    assert not mih_tables._inverse_dense(np.array([0, 1, 1]), np.int64(0), out)
    out = np.full(3, 3, dtype=np.uint32)
    assert not mih_tables._inverse_dense(np.array([0, 1, 5]), np.int64(0), out)
    out = np.full(3, 3, dtype=np.uint32)
    assert mih_tables._inverse_dense(np.array([7, 5, 6]), np.int64(5), out)
    assert out.tolist() == [1, 2, 0]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 600), spread=st.integers(1, 64), seed=st.integers(0, 2**31))
def test_slot_fill_is_the_insertion_in_run_order(n, spread, seed):
    """The prefetched slot fill leaves the table of inserting every run start in order with
    linear probing (the twin), wrap-around and clustered homes included, and its filter."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**spread - 1, n, dtype=np.uint64, endpoint=True).reshape(-1, 1)
    words, ids = sort_items(codes, np.arange(n))
    table = ItemTable.from_sorted(64, words, ids)
    assert not table.direct
    starts = run_starts(words)
    slots, bitmap = naive.fill_slots([int(c) for c in words[:, 0]], starts.tolist(),
                                     len(table.slots), table.fp_bits,
                                     filter_words(len(starts)))
    assert table.slots.tolist() == slots and table.bitmap.tolist() == bitmap


def _arrays(index) -> dict:
    return {k: np.asarray(v) for k, v in index.snapshot()[1].items()}


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("mode", ["single", "mih", "auto"])
@pytest.mark.parametrize("ids_form", ["increasing", "shuffled", "gaps"])
def test_a_build_on_threads_is_the_one_thread_build_bit_for_bit(bits, mode, ids_form,
                                                                 monkeypatch):
    """Sort, slot fill and substring tables on 1 and on 3 threads (the parallel paths taken:
    PARALLEL_MIN_PAIRS lowered): every array of the index the same; then an add to the built
    index (the sorted items merged) the same as a build of all of them."""
    if bits == 64 and numba.config.DISABLE_JIT:
        pytest.skip("counting sorts of 2^22 values as plain Python (the 32-bit case runs)")
    monkeypatch.setattr(radix, "PARALLEL_MIN_PAIRS", 64)
    rng = np.random.default_rng(7)
    n = 6000
    codes = rng.integers(0, 2**bits - 1, n, dtype=np.uint64, endpoint=True)
    codes[: n // 3] = codes[n // 3: 2 * (n // 3)]  # repeated codes: runs of several items
    ids = {"increasing": np.arange(n), "shuffled": rng.permutation(n),
           "gaps": rng.permutation(n) * 3 + 11}[ids_form]
    built = []
    for threads in (1, 3):
        options = {"calibrate_on_build": False} if mode == "auto" else {}
        index = make_index(bits, mode, **options)
        index.threads = threads
        index.add(codes, ids)
        built.append(_arrays(index))
        index.add(codes[:500] ^ np.uint64(1), ids.max() + 1 + np.arange(500))
        whole = make_index(bits, mode, **options)
        whole.threads = threads
        whole.add(np.concatenate([codes, codes[:500] ^ np.uint64(1)]),
                  np.concatenate([ids, ids.max() + 1 + np.arange(500)]))
        assert _arrays(index).keys() == _arrays(whole).keys()
        for name, a in _arrays(whole).items():
            assert (_arrays(index)[name] == a).all(), name
    assert built[0].keys() == built[1].keys()
    for name in built[0]:
        assert built[0][name].dtype == built[1][name].dtype
        assert (built[0][name] == built[1][name]).all(), name


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 500), spread=st.integers(1, 40), seed=st.integers(0, 2**31),
       shuffled=st.booleans())
def test_mih_tables_the_same_with_the_codes_in_id_order_given(n, spread, seed, shuffled):
    """``build_tables`` given the codes in id order (a build's input) or gathering them: the
    same tables, and each table's positions ordered by (substring, id) (the twin: lexsort)."""
    from bucketsearch.index.mih import substring_ranges
    bits = 40  # tables of 14, 13, 13 bits (direct; cheap as plain Python too)
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**min(spread, bits) - 1, n, dtype=np.uint64,
                         endpoint=True).reshape(-1, 1)
    ids = rng.permutation(n) if shuffled else np.arange(n) * 2
    words, sorted_ids = sort_items(codes, ids)
    starts, widths = substring_ranges(bits, 3)
    ww = np.array([bits])
    by_order = codes[np.argsort(ids)]
    a = mih_tables.build_tables(bits, words, sorted_ids, starts, widths, ww)
    b = mih_tables.build_tables(bits, words, sorted_ids, starts, widths, ww, 3,
                                np.ascontiguousarray(by_order))
    for name, x in a.arrays().items():
        assert (x == b.arrays()[name]).all(), name
    subs = [(words[:, 0] >> np.uint64(bits - s - w)) & np.uint64((1 << w) - 1)
            for s, w in zip(starts, widths)]
    for j in range(3):
        assert (a.rows(j) == np.lexsort((sorted_ids, subs[j]))).all()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), m=st.integers(0, 300), seed=st.integers(0, 2**31))
def test_merge_items_is_the_sort_of_the_union(n, m, seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 50, n + m, dtype=np.uint64).reshape(-1, 1)
    ids = rng.permutation(n + m).astype(np.int64)
    words, sorted_ids = sort_items(codes[:n], ids[:n])
    got_w, got_i = merge_items(words, sorted_ids, codes[n:], ids[n:], threads=2)
    want_w, want_i = naive.sort_codes_ids(codes[:, 0], ids)
    assert (got_w[:, 0] == want_w).all() and (got_i == want_i).all()


def test_run_lanes_keeps_the_order_and_raises_a_part_error():
    calls = [lambda i=i: i * i for i in range(7)]
    assert pool.run_lanes(calls, 3) == [i * i for i in range(7)]
    assert pool.run_lanes(calls, 1) == [i * i for i in range(7)]

    def boom():
        raise ValueError("part 2")
    with pytest.raises(ValueError, match="part 2"):
        pool.run_parts([lambda: 1, boom, lambda: 3])


def test_added_ids_checked_in_one_pass_keep_their_messages():
    index = make_index(64, "single")
    index.add(np.arange(10, dtype=np.uint64), np.arange(10) * 2)
    with pytest.raises(ValueError, match="id 4 is already in the index"):
        index.add(np.arange(3, dtype=np.uint64), [30, 4, 31])
    with pytest.raises(ValueError, match="id 5 appears more than once"):
        index.add(np.arange(4, dtype=np.uint64), [9, 5, 7, 5])
    index.add(np.arange(3, dtype=np.uint64), [1, 3, 100])  # between the present ids: fine
    assert index.ntotal == 13


@pytest.mark.parametrize("bits,direct", [(24, True), (64, False)])
def test_sampled_bucket_sizes_are_the_counts(bits, direct):
    """The profile's sampled substring buckets: a direct table's sizes read off its bucket
    starts, a hashed table's by galloping, equal the number of items with that substring
    (the twin: numpy counts)."""
    from bucketsearch.index.mih import MultiIndex
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 2**10, 3000, dtype=np.uint64) << np.uint64(bits - 10)
    codes |= rng.integers(0, 4, 3000, dtype=np.uint64)  # a few values in the low table too
    index = MultiIndex(bits, substrings=2)
    index.add(codes)
    assert index.table_direct() == [direct, direct]
    subs = index.substring_codes(index.words)
    for j in range(2):
        values, weights = index.distinct_substring_sample(j, 100, np.random.default_rng(1))
        counts = np.array([(subs[:, j] == v).sum() for v in values])
        assert np.allclose(weights, 3000 / (100 * counts), rtol=1e-12)


@pytest.mark.parametrize("mode", ["single", "mih", "auto"])
def test_remove_keeps_the_order_and_equals_a_build_of_the_rest(mode):
    """Items removed from a built index (their order kept, no sort): every array equal to a
    build of the remaining items."""
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 2**20, 3000, dtype=np.uint64) << np.uint64(44)
    ids = rng.permutation(3000)
    options = {"calibrate_on_build": False} if mode == "auto" else {}
    index = make_index(64, mode, **options)
    index.add(codes, ids)
    gone = ids[::7]
    assert index.remove(np.append(gone, 10**9)) == len(gone)
    rest = ~np.isin(ids, gone)
    whole = make_index(64, mode, **options)
    whole.add(codes[rest], ids[rest])
    for name, a in _arrays(whole).items():
        assert (_arrays(index)[name] == a).all(), name
