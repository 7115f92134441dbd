"""Write-ahead log: round trip, torn tails at every byte, corrupt records, append after repair."""
from __future__ import annotations

import numpy as np
import pytest

from index import wal
from index.wal import MAGIC, Op, WriteAheadLog, replay


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
    log = WriteAheadLog(path.parent, 0)
    for op in ops:
        log.append(op)
    log.close()
    return path.parent / wal.segment_name(0)


def test_round_trip(tmp_path):
    ops = _ops(np.random.default_rng(0))
    seg = _write(tmp_path / "x", ops)
    res = replay(seg)
    assert res.torn_bytes == 0 and res.valid_bytes == seg.stat().st_size
    assert len(res.ops) == len(ops) and all(_same(a, b) for a, b in zip(ops, res.ops))


def test_torn_tail_at_every_byte_is_truncated(tmp_path):
    ops = _ops(np.random.default_rng(1), n_ops=3)
    seg = _write(tmp_path / "x", ops)
    full = seg.read_bytes()
    before_last = replay(seg).valid_bytes - len(wal.HEADER.pack(0, 0)) - len(wal.encode(ops[-1]))
    for cut in range(before_last, len(full)):
        seg.write_bytes(full[:cut])
        res = replay(seg, truncate=True)
        assert len(res.ops) == len(ops) - 1, cut
        assert all(_same(a, b) for a, b in zip(ops, res.ops))
        assert seg.stat().st_size == before_last  # cut back to the record boundary
        assert res.torn_bytes == cut - before_last


def test_corrupt_crc_stops_replay_and_append_continues(tmp_path):
    ops = _ops(np.random.default_rng(2), n_ops=4)
    seg = _write(tmp_path / "x", ops)
    data = bytearray(seg.read_bytes())
    data[-1] ^= 0xFF  # flip a byte of the last payload
    seg.write_bytes(bytes(data))
    res = replay(seg, truncate=True)
    assert len(res.ops) == 3 and res.torn_bytes > 0
    extra = Op("delete", np.array([7, 8], dtype=np.int64))
    log = WriteAheadLog(tmp_path, 0)  # reopen the same segment and append after the repair
    log.append(extra)
    log.close()
    res = replay(seg)
    assert res.torn_bytes == 0 and len(res.ops) == 4 and _same(res.ops[-1], extra)


def test_garbage_and_empty_files(tmp_path):
    seg = tmp_path / wal.segment_name(3)
    seg.write_bytes(b"not a wal at all")
    res = replay(seg, truncate=True)
    assert res.ops == [] and seg.read_bytes() == MAGIC
    seg.write_bytes(b"")
    assert replay(seg, truncate=True).ops == [] and seg.read_bytes() == MAGIC
    seg.write_bytes(MAGIC + wal.HEADER.pack(2**31 + 5, 0))  # absurd length field
    assert replay(seg).ops == [] and replay(seg).torn_bytes == 8


def test_rotate_and_list_segments(tmp_path):
    log = WriteAheadLog(tmp_path, 5)
    log.append(Op("delete", np.array([1], dtype=np.int64)))
    assert log.rotate() == 5
    log.append(Op("delete", np.array([2], dtype=np.int64)))
    log.close()
    segs = wal.list_segments(tmp_path)
    assert [s for s, _ in segs] == [5, 6]
    assert [int(replay(p).ops[0].ids[0]) for _, p in segs] == [1, 2]


def test_unknown_op_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown op kind"):
        wal.encode(Op("update", np.array([1], dtype=np.int64)))
