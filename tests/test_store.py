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
