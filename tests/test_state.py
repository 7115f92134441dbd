"""Issue 29 item 3: the live state and its transitions are pure values, tested with no folder,
no log and no thread: sequences of adds, deletes, upserts and re-inserts applied one at a time
(apply_one, as a write publishes them) and all at once (apply_ops, as recovery and a merge
replay them) give the same state, equal to a dict model; every read of that state equals the
plain-numpy twin (tests/naive.py), over a main index of each served mode."""
from __future__ import annotations

import naive
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketsearch.index.factory import make_index
from bucketsearch.index.budget import (bucket_size_counts as size_counts_of_main,
                                       cached_largest_bucket, cached_size_counts,
                                       largest_bucket)
from bucketsearch.index.item_table import bucket_size_counts
from bucketsearch.index.storage.state import (DuplicateIdError, apply_one, apply_ops, base_state,
                                              bucket_sizes)
from bucketsearch.index.storage.wal import Op

BITS = 16
POOL = np.random.default_rng(29).integers(0, 1 << BITS, size=(64, 1), dtype=np.uint64)
POOL[40:] = POOL[:24]  # duplicate codes: buckets of several items


def _main(mode: str, ids: list[int]):
    main = make_index(BITS, mode, **({"calibrate_on_build": False} if mode == "auto" else {}))
    if ids:
        main.build(POOL[ids], np.array(ids, dtype=np.int64))
    return main


op_strategy = st.lists(st.tuples(st.sampled_from(["add", "delete", "upsert"]),
                                 st.lists(st.integers(0, 39), min_size=1, max_size=5,
                                          unique=True),
                                 st.integers(0, 63)), max_size=25)


def _replay(state, model: dict, script) -> tuple[object, list[Op]]:
    """Apply ``script`` one op at a time, skipping adds of live ids (a write refuses them:
    DuplicateIdError) and deletes of absent ids (a write ignores them); the ops applied."""
    applied = []
    for kind, ids, code in script:
        ids = np.array(ids, dtype=np.int64)
        words = POOL[(ids + code) % len(POOL)]
        if kind == "add":
            try:
                state.check_absent(ids)
            except DuplicateIdError:
                assert any(int(i) in model for i in ids)
                continue
            op = Op("add", ids, words)
        elif kind == "delete":
            ids = ids[state.live_mask(ids)]
            if not len(ids):
                continue
            op = Op("delete", ids)
        else:
            op = Op("upsert", ids, words)
        state = apply_one(state, op, version=state.version + 1)
        applied.append(op)
        for j, i in enumerate(op.ids.tolist()):
            if op.kind == "delete":
                model.pop(i, None)
            else:
                model[i] = int(op.words[j, 0])
    return state, applied


def _check(state, model: dict):
    ids, words = state.items()
    assert dict(zip(ids.tolist(), words[:, 0].tolist())) == model
    assert state.ntotal == len(model)
    mids = np.array(sorted(model), dtype=np.int64)
    mwords = np.array([[model[i]] for i in mids], dtype=np.uint64).reshape(-1, 1)
    xq = POOL[:6]
    for radius in (0, 2):
        lims, D, I, _ = state.range_search(xq, radius)
        rl, rd, ri = naive.range_search(xq, mwords, mids, BITS, radius)
        assert lims.tolist() == rl.tolist() and I.tolist() == ri.tolist() \
            and D.tolist() == rd.tolist()
    for k in (1, 5):
        D, I, _ = state.search(xq, k)
        nd, ni = naive.knn(xq, mwords, mids, BITS, k)
        assert D.tolist() == nd.tolist() and I.tolist() == ni.tolist()
    found, got = state.get(np.arange(45))
    assert found.tolist() == [i in model for i in range(45)]
    assert got[found][:, 0].tolist() == [model[i] for i in range(45) if i in model]


@pytest.mark.parametrize("mode", ["single", "mih", "auto"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base_ids=st.lists(st.integers(0, 39), max_size=20, unique=True), script=op_strategy)
def test_transitions_one_at_a_time_and_all_at_once_agree_with_the_model(mode, base_ids,
                                                                         script):
    main = _main(mode, base_ids)
    start = base_state(main, BITS, version=0)
    model = {i: int(POOL[i, 0]) for i in base_ids}
    _check(start, dict(model))
    state, applied = _replay(start, model, script)
    _check(state, model)
    assert state.version == len(applied)
    replayed = apply_ops(start, applied)  # recovery: vectorized, checked
    _check(replayed, model)
    assert replayed.tombstones.tolist() == state.tombstones.tolist()
    assert state.next_id == max([*base_ids, *[int(i) for op in applied for i in op.ids]],
                                default=-1) + 1


def test_a_log_that_adds_a_live_id_is_refused_by_the_checked_replay():
    start = base_state(_main("single", [0, 1]), BITS, version=0)
    with pytest.raises(ValueError, match="id 1 is added while it is live"):
        apply_ops(start, [Op("add", np.array([1]), POOL[[5]])])
    state = apply_ops(start, [Op("add", np.array([1]), POOL[[5]])], replace_live=True)
    assert state.get(np.array([1]))[1][0, 0] == POOL[5, 0]  # repair: the later add wins


def test_new_ids_and_the_largest_id():
    state = base_state(_main("single", [3, 9]), BITS, version=0)
    assert state.new_ids(3).tolist() == [10, 11, 12]
    state = apply_one(state, Op("delete", np.array([9])))
    assert state.new_ids(1).tolist() == [10]  # a deleted id is never given again
    high = base_state(_main("single", []), BITS, version=0, id_high=2**63 - 2)
    assert high.new_ids(1).tolist() == [2**63 - 1]
    with pytest.raises(ValueError, match="would pass the largest id"):
        high.new_ids(2)


def test_bucket_sizes_of_each_engine():
    ids = list(range(40)) + [40, 41, 42]  # 40..42 repeat the codes of 0..2
    sizes = {mode: sorted(bucket_sizes(_main(mode, ids)).tolist())
             for mode in ("single", "mih", "auto")}
    want = sorted(np.unique(POOL[ids, 0], return_counts=True)[1].tolist())
    assert sizes == {"single": want, "mih": want, "auto": want}
    assert bucket_sizes(_main("single", [])).tolist() == []


@pytest.mark.parametrize("mode", ["single", "mih", "auto", "scan"])
def test_largest_bucket_of_each_engine_known_before_it_serves(mode):
    """The search budget's largest bucket equals the bucket sizes' maximum in every mode, and
    a new state has it before its first search (no O(N) pass on a request after a merge or a
    restart: at 100M that pass took 2.7-5 s of the first search)."""
    ids = list(range(40)) + [40, 41, 42]
    main = _main(mode, ids)
    state = base_state(main, BITS, version=0)
    assert cached_largest_bucket(state.main) == int(bucket_sizes(main).max())
    assert largest_bucket(_main(mode, ids)) == int(bucket_sizes(main).max())
    assert largest_bucket(_main(mode, [])) == 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 5), max_size=200), st.integers(1, 3))
def test_bucket_size_counts_equal_the_numpy_twin(values, width):
    """The one-pass kernel (buckets per size, grown by doubling past 64) against numpy's run
    lengths of the sorted rows."""
    words = np.sort(np.array(values, dtype=np.uint64)).reshape(-1, 1).repeat(width, axis=1)
    if width > 1:
        words[:, -1] ^= words[:, 0] % np.uint64(2)  # rows differing in a later word only
        words = words[np.lexsort(words.T[::-1])]
    sizes = np.unique(words, axis=0, return_counts=True)[1] if len(words) else np.zeros(0, int)
    want = np.bincount(sizes, minlength=1)
    want[0] = 0
    assert bucket_size_counts(np.ascontiguousarray(words)).tolist() == want.tolist()


@pytest.mark.parametrize("mode", ["single", "mih", "auto", "scan"])
def test_bucket_size_counts_of_each_engine_and_after_a_snapshot(mode, tmp_path):
    """The info's histogram source equals the bucket sizes' histogram in every mode, and comes
    back from a snapshot without a pass (the single table keeps it in its meta)."""
    ids = list(range(40)) + [40, 41, 42]
    main = _main(mode, ids)
    want = np.bincount(bucket_sizes(main)).tolist()
    assert size_counts_of_main(main).tolist() == want
    main.save(tmp_path / "snap")
    from bucketsearch.index.factory import load_index
    back = load_index(tmp_path / "snap")
    if mode in ("single", "auto"):  # read from the snapshot's meta, before any pass
        assert cached_size_counts(back).tolist() == want
    assert size_counts_of_main(back).tolist() == want
