"""Read replicas that follow the writer (issue 14, item 2, on one machine).

A read-only :class:`LiveIndex` on the writer's directory catches up with what the writer
committed: new records, merges (a reload from the new snapshot), mode changes; never a record
past the commit position (one that may still be rolled back). Then two real servers on one
data directory: the writer, and a read-only server that follows it, also new and deleted
indexes."""
from __future__ import annotations

import errno
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_model import Model, assert_matches, clustered_pool

from bucketsearch.index.codes import to_hex
from bucketsearch.index.storage import follow, fsio, wal
from bucketsearch.index.storage.fsio import FaultPlan
from bucketsearch.index.storage.live import LiveIndex

BITS = 16
POOL = clustered_pool(BITS, 50, seed=11)
XQ = POOL[40:]
KW = dict(background_merge=False, merge_threshold=10**6)

ops_strategy = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 25), min_size=1, max_size=4, unique=True),
              st.integers(0, 35)),
    st.tuples(st.just("upsert"), st.lists(st.integers(0, 25), min_size=1, max_size=4,
                                          unique=True), st.integers(0, 35)),
    st.tuples(st.just("delete"), st.lists(st.integers(0, 25), max_size=4), st.just(0)),
    st.tuples(st.just("merge"), st.just([]), st.just(0)),
    st.tuples(st.just("mode"), st.just([]), st.integers(0, 2)),
    st.tuples(st.just("catch_up"), st.just([]), st.just(0)),
), max_size=14)


@settings(max_examples=40, deadline=None)
@given(ops=ops_strategy)
def test_a_follower_equals_the_writer_after_every_catch_up(tmp_path_factory, ops):
    root = tmp_path_factory.mktemp("follow")
    writer, model = LiveIndex(root, BITS, "single", **KW), Model(BITS)
    follower = LiveIndex(root, BITS, "single", read_only=True)
    seen = Model(BITS)  # what the follower must show: the model at its last catch-up
    for kind, ids, row in ops:
        if kind == "add":
            fresh = [i for i in ids if i not in model.items]
            if fresh:
                writer.add(POOL[row:row + len(fresh)], fresh)
                model.apply(("add", np.array(fresh), POOL[row:row + len(fresh)]))
        elif kind == "upsert":
            writer.upsert(POOL[row:row + len(ids)], ids)
            model.apply(("upsert", np.array(ids), POOL[row:row + len(ids)]))
        elif kind == "delete":
            writer.delete(ids)
            model.apply(("delete", np.array(ids, dtype=np.int64)))
        elif kind == "merge":
            writer.merge()
        elif kind == "mode":
            writer.set_mode(["single", "mih", "auto"][row])
        else:
            follower.catch_up()
            seen = model.copy()
            assert follower.applied[:2] == writer.applied[:2]
            assert follower.mode == writer.mode
        assert_matches(follower, seen, XQ)
    follower.catch_up()
    assert_matches(follower, model, XQ)
    writer.close()
    follower.close()


def test_records_past_the_commit_position_are_never_applied(tmp_path):
    writer = LiveIndex(tmp_path, BITS, "single", **KW)
    writer.add(POOL[:3], [0, 1, 2])
    follower = LiveIndex(tmp_path, BITS, "single", read_only=True)
    # a whole, valid record the writer never acknowledged (its fsync failed, say)
    segment = wal.list_segments(tmp_path)[-1][1]
    with open(segment, "ab") as f:
        f.write(wal.record(wal.Op("add", np.array([7], dtype=np.int64), POOL[[7]])))
    for reader in (follower, LiveIndex(tmp_path, BITS, "single", read_only=True)):
        reader.catch_up()
        assert reader.get([0, 7])[0].tolist() == [True, False]


def test_a_write_whose_fsync_fails_is_never_seen_by_a_follower(tmp_path):
    writer = LiveIndex(tmp_path, BITS, "single", **KW)
    follower = LiveIndex(tmp_path, BITS, "single", read_only=True)
    writer.add(POOL[:2], [0, 1])
    with fsio.inject(FaultPlan(at=2, errno=errno.ENOSPC)), pytest.raises(OSError):
        writer.add(POOL[[5]], [5])  # the record is written, its fsync fails: rolled back
    follower.catch_up()
    assert follower.get([0, 1, 5])[0].tolist() == [True, True, False]
    assert follower.applied[:2] == writer.applied[:2]


def test_a_follower_reloads_after_a_merge_that_removed_its_segments(tmp_path):
    writer = LiveIndex(tmp_path, BITS, "mih", **KW)
    follower = LiveIndex(tmp_path, BITS, "mih", read_only=True)
    model = Model(BITS)
    for start in range(0, 30, 10):  # three merges: the first segments are deleted
        writer.add(POOL[start:start + 10], np.arange(start, start + 10))
        model.apply(("add", np.arange(start, start + 10), POOL[start:start + 10]))
        writer.merge()
    assert wal.list_segments(tmp_path)[0][0] > 0
    assert follower.catch_up()
    assert_matches(follower, model, XQ)
    assert follower.applied == writer.applied and follower.lag_ms < 1000


def test_the_commit_position_file_is_checked(tmp_path):
    LiveIndex(tmp_path, BITS, "single", **KW).close()
    (tmp_path / follow.COMMIT_FILE).write_bytes(b"short")
    follower = None
    with pytest.raises(OSError, match="wal.committed: 5 bytes"):
        follower = LiveIndex(tmp_path, BITS, "single", read_only=True)
    assert follower is None


# ------------------------------------------------------------- read-side faults
def _writer_ahead(tmp_path, merges: int):
    """A writer with items 0..9, a follower caught up to them, then items 10..19 and an upsert
    the follower has not seen yet, with ``merges`` merges among them (the follower must
    reload; after three, the first log segments are gone)."""
    writer = LiveIndex(tmp_path, BITS, "single", **KW)
    model = Model(BITS)
    writer.add(POOL[:10], np.arange(10))
    model.apply(("add", np.arange(10), POOL[:10]))
    follower = LiveIndex(tmp_path, BITS, "single", read_only=True)
    seen = model.copy()
    for i in range(max(merges, 1)):
        ids = np.arange(10 + 5 * i, 15 + 5 * i)
        writer.add(POOL[ids], ids)
        model.apply(("add", ids, POOL[ids]))
        if merges:
            writer.merge()
    writer.upsert(POOL[[30]], [3])
    model.apply(("upsert", np.array([3]), POOL[[30]]))
    return writer, follower, model, seen


def _rewind(follower, saved) -> None:
    """Put a follower back where it was (to replay one catch-up with a fault elsewhere)."""
    follower.state, follower._applied, follower.mode, follower.substrings = saved


@pytest.mark.parametrize("merges", [0, 1, 3], ids=["records", "reload", "reload-3-merges"])
def test_a_read_fault_during_catch_up_leaves_the_follower_as_it_was(tmp_path, merges):
    """EIO on each read of a catch-up in turn (the commit position, a segment, a snapshot's
    files): the follower either raises and keeps answering from the state it had (never half a
    catch-up), or absorbs the fault (an unreadable newest snapshot: the previous generation and
    the log) and shows the writer's state exactly; a catch-up without faults then gets
    everything, at the writer's position."""
    writer, follower, model, seen = _writer_ahead(tmp_path, merges)
    saved = (follower.state, follower._applied, follower.mode, follower.substrings)
    failed = 0
    for at in range(1, 200):
        _rewind(follower, saved)
        plan = FaultPlan(at=at, ops=("read",), errno=errno.EIO)
        with fsio.inject(plan):
            try:
                follower.catch_up()
            except OSError:
                failed += 1
                assert follower.applied == saved[1]
                assert_matches(follower, seen, XQ)
                continue
        # absorbed (an unreadable newest snapshot: the previous generation and the log): the
        # writer's state exactly, and the next catch-up adopts the writer's snapshot
        assert_matches(follower, model, XQ)
        if not plan.fired:  # past the last read: every read has failed once
            assert follower.applied == writer.applied
            break
        follower.catch_up()
        assert follower.applied == writer.applied
        assert_matches(follower, model, XQ)
    else:
        raise AssertionError("the catch-up kept reading")
    assert failed >= 2  # at least the commit position and one segment or snapshot file
    _rewind(follower, saved)
    assert follower.catch_up()
    assert follower.applied == writer.applied
    assert_matches(follower, model, XQ)
    writer.close()
    follower.close()


def test_a_torn_commit_position_fails_the_catch_up_not_the_follower(tmp_path):
    writer, follower, model, seen = _writer_ahead(tmp_path, merges=0)
    position = (tmp_path / follow.COMMIT_FILE).read_bytes()
    for torn in (position[:0], position[:7], position + b"x"):
        (tmp_path / follow.COMMIT_FILE).write_bytes(torn)
        with pytest.raises(OSError, match=follow.COMMIT_FILE):
            follower.catch_up()
        assert_matches(follower, seen, XQ)
    (tmp_path / follow.COMMIT_FILE).write_bytes(position)
    assert follower.catch_up()
    assert_matches(follower, model, XQ)
    writer.close()
    follower.close()


# ------------------------------------------------------------------- two real servers
def wait_until(check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("the read-only server did not catch up in time")


def test_a_read_only_server_follows_the_writer(bucketsearch_server_factory, tmp_path):
    data = tmp_path / "data"
    writer = bucketsearch_server_factory(data)
    reader = bucketsearch_server_factory(data, BUCKETSEARCH_READ_ONLY=1,
                                         BUCKETSEARCH_FOLLOW_INTERVAL_S=0.05)
    with writer.client() as w, reader.client() as r:
        assert w.post("/v1/indexes", json={"name": "a", "bits": BITS}).status_code == 201
        wait_until(lambda: r.get("/v1/indexes/a").status_code == 200)
        codes = to_hex(POOL[:5], BITS)
        assert w.post("/v1/indexes/a/items", json={"ids": [0, 1, 2, 3, 4],
                                                  "codes": codes}).status_code == 200

        def reader_has(ids, expected):
            got = r.post("/v1/indexes/a/items/get", json={"ids": ids}).json()["codes"]
            return got == expected

        wait_until(lambda: reader_has([0, 4], [codes[0], codes[4]]))
        res = r.post("/v1/indexes/a/items", json={"ids": [9], "codes": codes[:1]})
        assert res.status_code == 409 and "read-only" in res.json()["detail"]
        w.post("/v1/indexes/a/merge")
        w.post("/v1/indexes/a/items/delete", json={"ids": [0]})
        wait_until(lambda: reader_has([0, 4], [None, codes[4]]))
        wi, ri = w.get("/v1/indexes/a").json(), r.get("/v1/indexes/a").json()
        assert ri["applied_lsn"] == wi["applied_lsn"] and wi["lag_ms"] == 0
        assert 0 <= ri["lag_ms"] < 5000 and ri["size"] == wi["size"] == 4
        assert w.delete("/v1/indexes/a").status_code == 204
        wait_until(lambda: r.get("/v1/indexes/a").status_code == 404)


# ----------------------------------------------------- damage across a rotation (issue 31)
def _damage_record(segment, index: int) -> int:
    """Flip one payload byte of record ``index`` of ``segment`` (its CRC no longer matches);
    returns the record's offset."""
    scan = wal.scan_segment(segment)
    start = len(wal.MAGIC) if index == 0 else scan.ends[index - 1]
    data = bytearray(segment.read_bytes())
    data[start + wal.HEADER.size + 12] ^= 0xFF  # inside the ids: the header stays plausible
    segment.write_bytes(bytes(data))
    return start


def _rotated_writer(root):
    """A writer with item 0 seen by a follower, then items 1 and 2 in the same segment, a
    rotation (as a merge starts), and item 3 in the next segment."""
    writer = LiveIndex(root, BITS, "single", **KW)
    writer.add(POOL[[0]], [0])
    follower = LiveIndex(root, BITS, "single", read_only=True)
    assert follower.get([0])[0].tolist() == [True]
    writer.add(POOL[[1]], [1])
    writer.add(POOL[[2]], [2])
    first = writer._wal.seq
    writer._wal.rotate()
    writer.add(POOL[[3]], [3])  # publishes the position: (next segment, its end)
    assert follower.applied.segment == first < follower_position(root).segment
    return writer, follower, root / wal.segment_name(first)


def follower_position(root):
    return follow.read_position(root)


@pytest.mark.parametrize("damaged", [1, 2], ids=["middle-record", "last-record"])
def test_damage_in_a_segment_closed_by_a_rotation_stops_the_follower(tmp_path, damaged):
    """Before: the follower applied the closed segment up to the damaged record, dropped the
    acknowledged records after it and applied the next segment: item 3 visible, item 2 (and
    1) silently gone. Now it stops with the reason and applies nothing."""
    writer, follower, segment = _rotated_writer(tmp_path)
    offset = _damage_record(segment, damaged)
    before = follower.applied
    with pytest.raises(Exception, match="following the writer stopped") as raised:
        follower.catch_up()
    assert type(raised.value).__name__ == "FollowerStopped"
    assert segment.name in str(raised.value) and f"byte {offset}" in str(raised.value)
    assert follower.follow_stopped == str(raised.value)
    assert follower.applied == before  # nothing applied past the damage
    assert follower.get([0, 1, 2, 3])[0].tolist() == [True, False, False, False]
    with pytest.raises(Exception, match="following the writer stopped"):
        follower.catch_up()  # stays stopped: never skips on a later round either
    # a follower opened afresh on the same folder refuses it too (no torn tail to ignore)
    with pytest.raises(wal.CorruptLogError, match=segment.name):
        LiveIndex(tmp_path, BITS, "single", read_only=True)
    writer.close()


def test_damage_before_the_commit_position_of_the_current_segment_stops_the_follower(tmp_path):
    writer = LiveIndex(tmp_path, BITS, "single", **KW)
    follower = LiveIndex(tmp_path, BITS, "single", read_only=True)
    writer.add(POOL[[1]], [1])
    writer.add(POOL[[2]], [2])
    segment = wal.list_segments(tmp_path)[-1][1]
    _damage_record(segment, 0)
    with pytest.raises(Exception, match="following the writer stopped") as raised:
        follower.catch_up()
    assert type(raised.value).__name__ == "FollowerStopped"
    assert follower.get([1, 2])[0].tolist() == [False, False]
    writer.close()


def test_a_read_only_server_reports_a_follower_stopped_by_damage(tmp_path):
    """The server's side: the index turns ``corrupt`` with the reason, in its state and in
    /readyz, and serves no more reads from the stopped state (503, as a corrupt index on the
    writer)."""
    from helpers import app_client
    data = tmp_path / "data"
    with app_client(data) as w:
        assert w.post("/v1/indexes", json={"name": "a", "bits": BITS}).status_code == 201
        assert w.post("/v1/indexes/a/items", json={"ids": [0], "codes": to_hex(POOL[[0]], BITS)}
                      ).status_code == 200
        with app_client(data, read_only=True, follow_interval_s=60) as r:
            registry = r.app.state.registry
            writer = w.app.state.registry.entries["a"].live
            for i in (1, 2):
                w.post("/v1/indexes/a/items", json={"ids": [i], "codes": to_hex(POOL[[i]], BITS)})
            first = writer._wal.seq
            writer._wal.rotate()
            w.post("/v1/indexes/a/items", json={"ids": [3], "codes": to_hex(POOL[[3]], BITS)})
            folder = registry.entries["a"].folder
            _damage_record(folder / wal.segment_name(first), 1)
            registry.follow()
            ready = r.get("/readyz").json()
            assert ready["index_states"]["a"]["state"] == "corrupt"
            assert "following the writer stopped" in ready["index_states"]["a"]["reason"]
            assert wal.segment_name(first) in ready["index_states"]["a"]["reason"]
            listed = r.get("/v1/indexes").json()["indexes"]
            assert [(i["name"], i["state"]) for i in listed] == [("a", "corrupt")]
            got = r.post("/v1/indexes/a/items/get", json={"ids": [3]})
            assert got.status_code == 503 and "corrupt" in got.json()["detail"]
