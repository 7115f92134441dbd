"""Inserts without ids: the index gives ``next_id, next_id + 1, ...`` and never gives an id
twice, across deletes, merges, mode changes, restarts and followers (LiveState.next_id)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from storage_model import clustered_pool

from bucketsearch.index.storage.live import LiveIndex

BITS = 16
POOL = clustered_pool(BITS, 64, seed=5)
KW = dict(background_merge=False, merge_threshold=10**6)

steps = st.lists(st.one_of(
    st.tuples(st.just("add_next"), st.integers(0, 4)),
    st.tuples(st.just("add"), st.integers(0, 40)),
    st.tuples(st.just("upsert"), st.integers(0, 40)),
    st.tuples(st.just("delete_top"), st.integers(1, 3)),
    st.tuples(st.just("merge"), st.just(0)),
    st.tuples(st.just("mode"), st.integers(0, 1)),
    st.tuples(st.just("reopen"), st.just(0)),
), max_size=16)


@settings(max_examples=40, deadline=None)
@given(steps=steps)
def test_an_id_is_never_given_twice(tmp_path_factory, steps):
    root = tmp_path_factory.mktemp("auto")
    index = LiveIndex(root, BITS, "single", **KW)
    written: set[int] = set()  # every id ever written
    live: set[int] = set()
    for kind, n in steps:
        if kind == "add_next":
            first, count = index.add_next(POOL[:n])
            given_ids = set(range(first, first + count))
            assert count == n and not given_ids & written
            assert first == (max(written) + 1 if written else 0)
            written |= given_ids
            live |= given_ids
        elif kind == "add" and n not in live:
            index.add(POOL[[n]], [n])
            written.add(n)
            live.add(n)
        elif kind == "upsert":
            index.upsert(POOL[[n]], [n])
            written.add(n)
            live.add(n)
        elif kind == "delete_top" and live:
            top = sorted(live)[-n:]
            index.delete(top)
            live -= set(top)
        elif kind == "merge":
            index.merge()
        elif kind == "mode":
            index.set_mode(["single", "mih"][n])
        elif kind == "reopen":
            index.close()
            index = LiveIndex(root, BITS, "single", **KW)
        follower = LiveIndex(root, BITS, "single", read_only=True)
        expected = max(written) + 1 if written else 0
        assert index.state.next_id == expected
        assert follower.state.next_id == expected
        follower.close()
    assert sorted(index.state.items()[0].tolist()) == sorted(live)
    index.close()


def test_the_mark_survives_a_merge_that_drops_the_largest_ids(tmp_path):
    index = LiveIndex(tmp_path, BITS, "single", **KW)
    assert index.add_next(POOL[:5]) == (0, 5)
    index.delete([3, 4])
    index.merge()  # the snapshot holds ids 0..2 and the mark 4
    index.close()
    index = LiveIndex(tmp_path, BITS, "mih", **KW)
    assert index.add_next(POOL[:2]) == (5, 2)
    assert index.add_next(POOL[:0]) == (7, 0)
    index.close()


def test_the_mark_survives_a_crash_at_every_storage_call_of_a_merge(tmp_path):
    """A simulated crash at each storage call of the merge that drops the largest ids (the
    snapshot carrying the mark half written, renamed, or its log cleanup cut short): the
    reopened index still gives ids above every id ever written."""
    from bucketsearch.index.storage import fsio
    from bucketsearch.index.storage.fsio import FaultPlan, SimulatedCrash
    for at in range(1, 200):
        root = tmp_path / f"crash-{at}"
        index = LiveIndex(root, BITS, "single", **KW)
        index.add_next(POOL[:6])
        index.delete([4, 5])
        plan = FaultPlan(at=at, crash=True)
        with fsio.inject(plan):
            try:
                index.merge()
            except SimulatedCrash:
                pass
        reopened = LiveIndex(root, BITS, "single", **KW)
        assert reopened.add_next(POOL[:1]) == (6, 1), f"crash at storage call {at}"
        reopened.close()
        if not plan.fired:  # past the merge's last storage call
            break
    else:
        raise AssertionError("the merge kept calling storage")


def test_ids_past_the_largest_int64_are_refused(tmp_path):
    """Once id 2^63 - 1 is written there is no id left to give: an insert without ids (even
    an empty one) is a ValueError naming ``ids`` and the limit, not an id outside int64."""
    import pytest

    from bucketsearch.index.storage.live import MAX_ID
    index = LiveIndex(tmp_path, BITS, "single", **KW)
    index.add(POOL[:1], [MAX_ID - 2])
    assert index.add_next(POOL[1:3]) == (MAX_ID - 1, 2)
    for n in (0, 1):
        with pytest.raises(ValueError, match=rf"ids: .*largest ever written \({MAX_ID}\).*"
                                             rf"largest id {MAX_ID}"):
            index.add_next(POOL[:n])
    index.close()
