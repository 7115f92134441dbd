"""One test suite of the index handle protocol (issue 29, bucketsearch.index.handle), run on
every implementation: the live index in modes single, mih and auto, and the sharded index on
Ray actors (id_hash and code_prefix partitioning).

Each handle gets the same writes (adds, a merge, deletes of main and delta items, upserts
that move codes, an add after a delete) and the same queries, and must give the answers of a
brute-force scan of a plain dict model (tests/naive.py); its info, sizes and merge state must
agree with the model and with each other; bad input raises the protocol's errors; a budget
refuses before any work; close refuses writes."""
from __future__ import annotations

import numpy as np
import pytest
from naive import hamming_matrix, knn, knn_within, range_search

from bucketsearch.index.handle import (Budget, BudgetExceeded, DuplicateIdError, IndexHandle,
                                       IndexView, NotServed, ProbeLimitError, RadiusProfile,
                                       ResultLimitError, Sizes)
from bucketsearch.index.storage.live import LiveIndex

BITS = 32
#: (implementation, mode, partitioning)
KINDS = [("live", "single", None), ("live", "mih", None), ("live", "auto", None),
         ("sharded", "single", "id_hash"), ("sharded", "mih", "code_prefix")]
IDS = [f"{impl}-{mode}" + (f"-{part}" if part else "") for impl, mode, part in KINDS]
BIG_BUDGET = Budget(10**12, 10**12, 10**12, None)


def sharded_class():
    from bucketsearch.index.cluster.shards import ShardedLive
    return ShardedLive


@pytest.fixture(params=KINDS, ids=IDS)
def handle(request, tmp_path):
    impl, mode, partitioning = request.param
    if impl == "live":
        h = LiveIndex(tmp_path / "ix", BITS, mode, max_probes=10**7, merge_threshold=10**6)
    else:
        request.getfixturevalue("ray_local")
        h = sharded_class()(tmp_path / "ix", BITS, mode, None, 2, partitioning,
                            max_probes=10**7, merge_threshold=10**6)
    yield h
    h.close()


def _codes(n: int, seed: int) -> np.ndarray:
    """Clustered 32-bit codes as (n, 1) words: 8 centres, a few bits flipped each."""
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 2**32, 8, dtype=np.uint64)
    flips = np.zeros(n, dtype=np.uint64)
    for _ in range(3):
        flips |= np.uint64(1) << rng.integers(0, BITS, n).astype(np.uint64)
    return (centres[rng.integers(0, 8, n)] ^ (flips * (rng.random(n) < 0.8))).reshape(-1, 1)


class Model:
    """The live items as a plain dict, id -> code word."""

    def __init__(self):
        self.items: dict[int, int] = {}

    def arrays(self):
        ids = np.array(sorted(self.items), dtype=np.int64)
        return ids, np.array([[self.items[i]] for i in ids.tolist()],
                             dtype=np.uint64).reshape(-1, 1)


def _script(h, model: Model):
    """The writes every handle gets; yields after each phase (its answers are checked)."""
    a = _codes(300, 1)
    assert h.add(a, np.arange(300)) == 300
    model.items.update({i: int(a[i, 0]) for i in range(300)})
    yield "delta only"
    assert h.merge() is True
    yield "main only"
    b = _codes(80, 2)
    assert h.add(b, np.arange(1000, 1080)) == 80
    model.items.update({1000 + i: int(b[i, 0]) for i in range(80)})
    gone = np.array([3, 4, 5, 1001, 1002, 77777])  # main, delta and unknown ids
    assert h.delete(gone) == 5
    for i in gone.tolist():
        model.items.pop(i, None)
    c = _codes(6, 3)
    assert h.upsert(c, np.array([10, 11, 1003, 2000, 2001, 3])) == (3, 3)
    model.items.update({i: int(w) for i, w in zip([10, 11, 1003, 2000, 2001, 3], c[:, 0])})
    first, n = h.add_next(_codes(4, 4))
    assert first == 2002 and n == 4
    model.items.update({first + i: int(w) for i, w in enumerate(_codes(4, 4)[:, 0])})
    yield "main, delta and tombstones"
    assert h.merge() is True
    yield "merged again"


def _check_answers(h, model: Model):
    ids, words = model.arrays()
    xq = np.concatenate([words[::37], _codes(5, 9)])
    view = h.view()
    assert isinstance(view, IndexView)
    for r in (0, 1, 2, 4):
        lims, D, I, st = view.range_search(xq, r, stats=True, budget=BIG_BUDGET)
        want = range_search(xq, words, ids, BITS, r)
        assert np.array_equal(lims, want[0]) and np.array_equal(I, want[2]), f"radius {r}"
        assert np.array_equal(D, want[1])
        assert st is not None and st.probes.shape[0] == len(xq)
        assert np.array_equal(h.range_search(xq, r)[2], want[2])  # the handle's own state
    for k in (1, 7):
        D, I, _ = view.search(xq, k, budget=BIG_BUDGET)
        wD, wI = knn(xq, words, ids, BITS, k)
        assert np.array_equal(I, wI) and np.array_equal(D, wD), f"k {k}"
        D, I, _ = view.search(xq, k, max_distance=2, stats=True)
        wD, wI = knn_within(xq, words, ids, BITS, k, 2)
        assert np.array_equal(I, wI) and np.array_equal(D, wD), f"k {k} within 2"
    asked = np.array([*ids[:1], *ids[-1:], 3, 4, 123456], dtype=np.int64)
    found, got = view.get(asked)
    assert found.tolist() == [int(i) in model.items for i in asked]
    assert [int(w) for w in got[found, 0]] == [model.items[int(i)] for i in asked[found]]
    assert not got[~found].any()
    all_ids, all_words = view.items()
    assert sorted(all_ids.tolist()) == ids.tolist()
    assert {int(i): int(w) for i, w in zip(all_ids, all_words[:, 0])} == model.items
    for n, seed in ((1, 0), (50, 3), (10**6, 1)):
        s_ids, s_words = view.sample(n, seed)
        assert len(s_ids) == min(n, len(ids)) == len(np.unique(s_ids))
        assert all(model.items[int(i)] == int(w) for i, w in zip(s_ids, s_words[:, 0]))
        assert np.array_equal(view.sample(n, seed)[0], s_ids)  # seeded
    assert view.ntotal == h.ntotal == len(ids) == view.sizes().size


def test_the_handle_gives_brute_force_answers_after_every_write(handle):
    assert isinstance(handle, IndexHandle)
    model = Model()
    _check_answers(handle, model)  # empty
    for _phase in _script(handle, model):
        _check_answers(handle, model)


def distinct_buckets(h, model: Model) -> int:
    """The buckets of a merged index: its distinct codes; id_hash shards each have their own
    table, so a code held on two shards is two buckets (code_prefix: a code's prefix picks
    its one shard)."""
    if h.partitioning != "id_hash":
        return len(set(model.items.values()))
    from bucketsearch.index.cluster.partitioning import id_shard
    ids, words = model.arrays()
    return len(set(zip(id_shard(ids, h.shards).tolist(), words[:, 0].tolist())))


def test_info_sizes_and_merge_state_agree(handle):
    model = Model()
    fields = {"mode", "substrings", "size", "main_size", "delta_size", "tombstones",
              "distinct_codes", "code_space_fraction", "bucket_size_histogram",
              "memory_bytes", "merges", "merging", "merge", "last_merge", "last_merge_error",
              "applied_lsn", "lag_ms"}
    merges = handle.info()["merges"]
    for phase in _script(handle, model):
        info, sizes = handle.info(), handle.sizes()
        assert fields <= set(info), fields - set(info)
        assert isinstance(sizes, Sizes) and sizes.info() == {
            k: info[k] for k in ("size", "main_size", "delta_size", "tombstones")}
        assert info["size"] == len(model.items) == handle.ntotal
        assert info["size"] == info["main_size"] - info["tombstones"] + info["delta_size"]
        hist = info["bucket_size_histogram"]
        assert sum(b["size"] * b["buckets"] for b in hist) == info["main_size"]
        assert sum(b["buckets"] for b in hist) == info["distinct_codes"]
        if phase == "merged again":  # every item in the main index: its distinct codes
            assert info["distinct_codes"] == distinct_buckets(handle, model)
        assert info["code_space_fraction"] == pytest.approx(info["distinct_codes"] / 2**BITS)
        assert info["merge"] == handle.merge_status == "none" and info["merging"] is False
        assert info["mode"] == handle.mode and info["memory_bytes"] > 0
        if phase in ("main only", "merged again"):
            assert info["delta_size"] == info["tombstones"] == 0
            assert info["merges"] > merges and info["last_merge"] is not None
            merges = info["merges"]
            assert handle.merge() is False  # nothing to fold
        else:
            assert info["delta_size"] > 0
    assert handle.failed is None and info["last_merge_error"] is None


def test_bad_input_raises_the_protocol_errors(handle):
    handle.add(_codes(20, 5), np.arange(20))
    xq = _codes(2, 6)
    for radius in (-1, BITS + 1):
        with pytest.raises(ValueError, match="max_distance"):
            handle.range_search(xq, radius)
        with pytest.raises(ValueError, match="max_distance"):
            handle.search(xq, 3, max_distance=radius)
    for k in (0, -2, True, 2.5):
        with pytest.raises(ValueError, match="k must be"):
            handle.search(xq, k)
    with pytest.raises(ValueError, match="ids has 3 entries"):
        handle.add(_codes(2, 7), [100, 101, 102])
    with pytest.raises(ValueError, match="more than once"):
        handle.upsert(_codes(2, 7), [100, 100])
    for write in (handle.add, handle.upsert):  # -1 is the padding of k-NN results
        with pytest.raises(ValueError, match="id -1 is negative"):
            write(_codes(2, 7), [100, -1])
    with pytest.raises(DuplicateIdError, match="id 5 already exists"):
        handle.add(_codes(2, 7), [100, 5])
    with pytest.raises(ValueError):
        handle.add(np.zeros((2, 3), dtype=np.uint64), [200, 201])  # 3 words for 32 bits
    with pytest.raises(ValueError):
        handle.set_mode("nonsense", None)
    assert handle.ntotal == 20  # nothing of the refused writes landed
    assert not handle.get([100, 101, 200])[0].any()


def test_a_budget_refuses_before_any_work(handle):
    handle.add(_codes(200, 8), np.arange(200))
    xq = _codes(4, 9)
    tiny_memory = Budget(10**12, 10**12, 1, None)
    for search in (lambda v: v.range_search(xq, 2, budget=tiny_memory),
                   lambda v: v.search(xq, 5, budget=tiny_memory)):
        with pytest.raises(BudgetExceeded) as err:
            search(handle.view())
        assert err.value.setting == "max_request_memory" and err.value.asked > 1
    few_compares = Budget(10**12, 3, 10**12, None)  # the delta alone compares 4 x 200
    with pytest.raises(BudgetExceeded, match="max_request_compares"):
        handle.range_search(xq, 1, budget=few_compares)
    capped = Budget(10**12, 10**12, 10**12, 2)
    with pytest.raises(ResultLimitError):
        handle.range_search(np.repeat(_codes(1, 8), 4, axis=0), 6, budget=capped)
    if handle.mode == "single":  # a single table cannot scan instead: the probes are refused
        with pytest.raises(ProbeLimitError, match="max_request_probes"):
            handle.range_search(xq, 3, budget=Budget(100, 10**12, 10**12, None))
    work = handle.range_estimate(len(xq), 1)
    assert work.probes >= 0 and work.compares >= len(xq) * 200 and work.answer >= 0


def test_mode_change_keeps_the_answers(handle):
    model = Model()
    phases = _script(handle, model)
    next(phases), next(phases), next(phases)  # main, delta and tombstones
    before = handle.range_search(_codes(6, 10), 3)
    other = "auto" if handle.mode != "auto" else "single"
    assert handle.set_mode(other, None) is True
    assert handle.mode == other == handle.info()["mode"]
    after = handle.range_search(_codes(6, 10), 3)
    assert all(np.array_equal(a, b) for a, b in zip(before[:3], after[:3]))
    assert handle.set_mode(other, None) is False
    _check_answers(handle, model)


def test_the_cost_model_reads(handle):
    """The radius profile and the calibration's table: computed in the index for a live
    index (the profile's empty balls against brute force); NotServed / None for a sharded
    one (its tables live in the shard actors)."""
    model = Model()
    phases = _script(handle, model)
    next(phases), next(phases), next(phases)
    budget = Budget(10**9, 10**12, 10**12, None)
    if handle.shards:
        with pytest.raises(NotServed):
            handle.radius_profile(16, 2, 0, budget)
        assert handle.paper_engine() is None
        return
    prof = handle.radius_profile(16, None, 0, budget)
    assert isinstance(prof, RadiusProfile) and prof.max_distance >= 1
    xq = handle.query_sample(16, 0)
    ids, words = model.arrays()
    nearest = hamming_matrix(xq, words, BITS).min(axis=1)
    assert prof.empty_balls == [int((nearest > r).sum()) for r in range(prof.max_distance + 1)]
    assert prof.live_size == len(ids) and prof.stats.probes.shape == (16, prof.max_distance + 1)
    assert prof.engine == ("mih" if handle.mode == "mih" else "single")
    assert (prof.planner is not None) == (handle.mode == "auto")
    assert (handle.paper_engine() is not None) == (handle.mode != "mih")
    with pytest.raises(ValueError, match="max_request_probes"):
        handle.radius_profile(16, 8, 0, Budget(10, 10**12, 10**12, None))


def test_close_refuses_writes(handle):
    handle.add(_codes(5, 11), np.arange(5))
    handle.close()
    with pytest.raises(PermissionError, match="closed"):
        handle.add(_codes(1, 12), [99])
    with pytest.raises(PermissionError, match="closed"):
        handle.delete([1])
    handle.close()  # twice: nothing more
