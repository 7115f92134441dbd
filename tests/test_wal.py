"""Write-ahead log: round trip, torn tails at every byte (cut and kept), corruption refused and
salvaged, user data that looks like records."""
from __future__ import annotations

import numpy as np
import pytest

from bucketsearch.index.storage import wal
from bucketsearch.index.storage.wal import MAGIC, Op, WriteAheadLog, replay


def _ops(rng, n_ops=6, w=2):
    ops = []
    for i in range(n_ops):
        n = int(rng.integers(0, 5))
        ids = rng.integers(0, 2**62, size=n, dtype=np.int64)
        if i % 3 == 2:
            ops.append(Op("delete", ids))
        else:
            ops.append(Op("add", ids, rng.integers(0, 2**63, size=(n, w), dtype=np.uint64)))
    return ops


def _same(a: Op, b: Op) -> bool:
    return a.kind == b.kind and np.array_equal(a.ids, b.ids) and (
        a.kind == "delete" or np.array_equal(a.words, b.words))


def _write(path, ops):
    path.parent.mkdir(exist_ok=True)
    log = WriteAheadLog(path.parent, 0)
    for op in ops:
        log.append(op)
    return path.parent / wal.segment_name(0)


def test_round_trip(tmp_path):
    ops = _ops(np.random.default_rng(0))
    seg = _write(tmp_path / "x", ops)
    res = replay(seg)
    assert res.damage is None and res.valid_bytes == seg.stat().st_size
    assert len(res.ops) == len(ops) and all(_same(a, b) for a, b in zip(ops, res.ops))


def test_torn_tail_at_every_byte_is_cut_and_kept(tmp_path):
    ops = _ops(np.random.default_rng(1), n_ops=3)
    seg = _write(tmp_path / "x", ops)
    full = seg.read_bytes()
    before_last = len(full) - len(wal.record(ops[-1]))
    for cut in range(before_last + 1, len(full)):
        seg.write_bytes(full[:cut])
        scan = wal.scan_segment(seg)
        assert scan.damage.kind == "torn" and len(scan.ops) == len(ops) - 1, cut
        broken = wal.cut_torn_tail(scan)
        assert seg.read_bytes() == full[:before_last]  # cut back to the record boundary
        assert broken.read_bytes() == full[before_last:cut]  # the cut bytes are kept
        assert broken.name == f"{seg.name}.broken-{before_last}"


def test_zero_filled_tail_is_torn(tmp_path):
    ops = _ops(np.random.default_rng(6), n_ops=3)
    seg = _write(tmp_path / "x", ops)
    full = seg.read_bytes()
    seg.write_bytes(full + bytes(4096))  # a file extended by a crash but never written
    assert wal.scan_segment(seg).damage.kind == "torn"
    last = len(full) - len(wal.record(ops[-1]))
    seg.write_bytes(full[:last + 12] + bytes(len(full) - last - 12))  # zeros inside a record
    scan = wal.scan_segment(seg)
    assert scan.damage.kind == "torn" and scan.valid_bytes == last


def test_damage_before_valid_records_is_corruption(tmp_path):
    """A bad record followed by valid ones is never treated as a torn tail."""
    ops = _ops(np.random.default_rng(2), n_ops=4)
    seg = _write(tmp_path / "x", ops)
    data = bytearray(seg.read_bytes())
    first_end = len(MAGIC) + len(wal.record(ops[0]))
    data[first_end + 9] ^= 0xFF  # a payload byte of the second record
    seg.write_bytes(bytes(data))
    scan = wal.scan_segment(seg)
    assert scan.damage.kind == "corrupt" and scan.damage.offset == first_end
    assert len(scan.ops) == 1
    with pytest.raises(wal.CorruptLogError, match=f"corrupt at byte {first_end}"):
        replay(seg)
    salvaged = wal.salvage(bytes(data))
    assert len(salvaged.ops) == 3 and [_same(a, b) for a, b in
                                        zip(salvaged.ops, ops[:1] + ops[2:])] == [True] * 3
    assert salvaged.lost == [(first_end, first_end + len(wal.record(ops[1])))]


def test_records_inside_a_payload_do_not_make_a_torn_tail_corrupt(tmp_path):
    """User data may look like records: a torn record whose payload embeds a valid record is
    still a torn tail (the search for later records starts after the bad record's extent)."""
    inner = wal.record(Op("delete", np.array([5], dtype=np.int64)))
    words = np.frombuffer(inner + bytes(-len(inner) % 8), dtype="<u8").reshape(-1, 1)
    op = Op("add", np.arange(len(words), dtype=np.int64), words.astype(np.uint64))
    seg = _write(tmp_path / "x", [op])
    data = bytearray(seg.read_bytes())
    data[-1] ^= 0xFF  # damage the last byte: the record's CRC fails
    seg.write_bytes(bytes(data))
    assert wal.scan_segment(seg).damage.kind == "torn"


def test_garbage_and_empty_files(tmp_path):
    seg = tmp_path / wal.segment_name(3)
    seg.write_bytes(b"not a wal at all")
    assert wal.scan_segment(seg).damage.kind == "corrupt"
    seg.write_bytes(b"")
    assert wal.scan_segment(seg).damage.kind == "torn"
    seg.write_bytes(MAGIC[:5])
    scan = wal.scan_segment(seg)
    assert scan.damage.kind == "torn"
    wal.cut_torn_tail(scan)
    assert seg.read_bytes() == MAGIC
    seg.write_bytes(MAGIC + wal.HEADER.pack(2**31 + 5, 0))  # absurd length field, at the end
    assert replay(seg).ops == [] and replay(seg).torn_bytes == 8


def test_rotate_and_list_segments(tmp_path):
    log = WriteAheadLog(tmp_path, 5)
    log.append(Op("delete", np.array([1], dtype=np.int64)))
    assert log.rotate() == 5
    log.append(Op("delete", np.array([2], dtype=np.int64)))
    segs = wal.list_segments(tmp_path)
    assert [s for s, _ in segs] == [5, 6]
    assert [int(replay(p).ops[0].ids[0]) for _, p in segs] == [1, 2]


def test_unknown_op_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown op kind"):
        wal.encode(Op("update", np.array([1], dtype=np.int64)))
