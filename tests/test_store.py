"""Snapshots: atomic, checksummed, refuse corrupt or newer-format directories."""
import json

import numpy as np
import pytest

from bucketsearch.index.probe import HammingIndex
from bucketsearch.index.storage.store import FORMAT_VERSION, load_arrays, save_arrays


def test_roundtrip_and_overwrite(tmp_path):
    path = tmp_path / "snap"
    save_arrays(path, "test", {"bits": 8}, {"a": np.arange(5)})
    save_arrays(path, "test", {"bits": 8}, {"a": np.arange(7)})
    kind, meta, arrays = load_arrays(path)
    assert kind == "test" and meta == {"bits": 8} and arrays["a"].tolist() == list(range(7))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]  # no temp or old dirs left


def test_corrupt_array_is_refused(tmp_path):
    index = HammingIndex(16)
    index.add(np.random.default_rng(0).integers(0, 2, (100, 16)))
    index.save(tmp_path / "snap")
    ids = tmp_path / "snap" / "ids.npy"
    raw = bytearray(ids.read_bytes())
    raw[-1] ^= 0xFF
    ids.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="ids.npy: checksum mismatch"):
        HammingIndex.load(tmp_path / "snap")


def test_newer_format_is_refused(tmp_path):
    save_arrays(tmp_path / "snap", "test", {}, {"a": np.arange(3)})
    manifest = tmp_path / "snap" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["format_version"] = FORMAT_VERSION + 1
    manifest.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="is newer than this bucketsearch reads"):
        load_arrays(tmp_path / "snap")


def test_missing_and_malformed(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a snapshot directory"):
        load_arrays(tmp_path / "nothing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="malformed manifest"):
        load_arrays(tmp_path / "bad")


def test_wrong_kind_is_refused(tmp_path):
    from bucketsearch.index.scan import LinearScan
    LinearScan(8).save(tmp_path / "scan")
    with pytest.raises(ValueError, match="holds a 'scan' index, not 'single'"):
        HammingIndex.load(tmp_path / "scan")


def test_format_1_auto_snapshot_still_loads(tmp_path):
    """A version-1 ``auto`` snapshot (the single table's ids stored again as ``single_ids``,
    int64 offsets and positions) loads and answers like the index it was written from; a
    version-2 one stores the ids once and shares them between the engines on load."""
    from bucketsearch.index.planner import AutoIndex
    rng = np.random.default_rng(3)
    words = rng.integers(0, 2**63, (400, 1), dtype=np.uint64)
    ids = rng.permutation(1000)[:400].astype(np.int64)
    index = AutoIndex(64, calibrate_on_build=False)
    index.add(words, ids)
    meta, arrays = index.snapshot()
    assert "single_ids" not in arrays and "mih_ids" in arrays
    v1 = {k: (v.astype(np.int64) if v.dtype == np.int32 else v) for k, v in arrays.items()}
    v1["single_ids"] = arrays["mih_ids"].copy()
    save_arrays(tmp_path / "v1", "auto", {"bits": 64, "ntotal": 400, **meta}, v1)
    manifest = tmp_path / "v1" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["format_version"] = 1
    manifest.write_text(json.dumps(doc))
    index.save(tmp_path / "v2")
    queries = words[:20] ^ np.uint64(3)
    want = index.range_search(queries, 4)
    for path in ("v1", "v2"):
        loaded = AutoIndex.load(tmp_path / path)
        for mode in ("single", "mih", "scan"):
            got = loaded._index_for(mode).range_search(queries, 4)
            assert all((a == b).all() for a, b in zip(got, want)), (path, mode)
    assert loaded.single.table.ids is loaded.mih.ids is loaded.scan.ids
