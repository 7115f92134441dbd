"""Snapshots: atomic, checksummed, refuse corrupt or newer-format directories."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketsearch.index.disk import fsio
from bucketsearch.index.disk.hugepages import HUGE_PAGE
from bucketsearch.index.disk.store import array_of_npy, file_crc32
from bucketsearch.index.probe import HammingIndex
from bucketsearch.index.storage.store import FORMAT_VERSION, load_arrays, save_arrays
from bucketsearch.index.table import BucketTable, sort_items


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


def legacy_single_arrays(words, ids, bits=64) -> tuple[dict, dict]:
    """A format 1-2 single table: distinct codes, offsets, ids, slots and filter of a
    :class:`BucketTable`, and its ``direct`` flag."""
    table = BucketTable.from_sorted(bits, *sort_items(words, ids))
    return {"direct": table.direct}, table.arrays()


def legacy_mih_arrays(index) -> tuple[dict, dict]:
    """A format 1-3 multi-index: per substring a :class:`BucketTable` of the substring values
    holding positions into the items (``table_codes``, ``table_offsets``, ``table_ids``,
    ``table_slots``, ``table_bitmap``, concatenated) and its meta."""
    from bucketsearch.index.radix import sort_pairs
    subs = index.substring_codes(index.words)
    n = index.ntotal
    tables = []
    for j in range(index.substrings):
        keys, order = sort_pairs(np.ascontiguousarray(subs[:, j]), np.arange(n))
        tables.append(BucketTable.from_sorted(int(index.sub_widths[j]), keys.reshape(-1, 1),
                                              order.astype(np.int32)))
    names = ("codes", "offsets", "ids", "slots", "bitmap")
    meta = {"substrings": index.substrings, "fixed_substrings": index.fixed_substrings,
            "max_probes": index.max_probes, "direct": [t.direct for t in tables],
            "lengths": {k: [len(getattr(t, k)) for t in tables] for k in names}}
    arrays = {"words": index.words, "ids": index.ids,
              **{f"table_{k}": np.concatenate([getattr(t, k) for t in tables]) for k in names}}
    return meta, arrays


@pytest.mark.parametrize("version", [1, 2])
def test_format_1_and_2_auto_snapshots_still_load(tmp_path, version):
    """A version-1 ``auto`` snapshot (the single table a bucket table, its ids stored again as
    ``single_ids``, int64 offsets and positions) and a version-2 one (int32, ids stored once)
    load and answer like the index they were written from; the single table is indexed again
    from the multi-index's items, so the three engines share one copy of codes and ids."""
    from bucketsearch.index.planner import AutoIndex
    rng = np.random.default_rng(3)
    words = rng.integers(0, 2**63, (400, 1), dtype=np.uint64)
    words[200:300] = words[:100]  # buckets of two items
    ids = rng.permutation(1000)[:400].astype(np.int64)
    index = AutoIndex(64, calibrate_on_build=False)
    index.add(words, ids)
    meta, arrays = index.snapshot()
    assert "single_ids" not in arrays and "single_words" not in arrays and "mih_ids" in arrays
    single_meta, single = legacy_single_arrays(words, ids)
    mih_meta, mih = legacy_mih_arrays(index.mih)
    old = {f"mih_{k}": v for k, v in mih.items()}
    old.update({f"single_{k}": v for k, v in single.items() if k != "ids"})
    old_meta = {k: v for k, v in meta.items() if k != "single_table"}
    old_meta["direct"] = single_meta["direct"]
    old_meta["mih"] = mih_meta
    if version == 1:
        old = {k: (v.astype(np.int64) if v.dtype == np.int32 else v) for k, v in old.items()}
        old["single_ids"] = arrays["mih_ids"].copy()
    save_arrays(tmp_path / "old", "auto", {"bits": 64, "ntotal": 400, **old_meta}, old)
    manifest = tmp_path / "old" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["format_version"] = version
    manifest.write_text(json.dumps(doc))
    index.save(tmp_path / "new")
    queries = np.concatenate([words[:20] ^ np.uint64(3), words[200:210]])
    want = index.range_search(queries, 4)
    for path in ("old", "new"):
        loaded = AutoIndex.load(tmp_path / path)
        for mode in ("single", "mih", "scan"):
            got = loaded._index_for(mode).range_search(queries, 4)
            assert all((a == b).all() for a, b in zip(got, want)), (path, mode)
        assert loaded.single.table.words is loaded.mih.words is loaded.scan.words
    assert loaded.single.table.ids is loaded.mih.ids is loaded.scan.ids


@pytest.mark.parametrize("bits", [20, 64, 128])
def test_format_2_single_snapshot_still_loads(tmp_path, bits):
    """A version-2 ``single`` snapshot (a bucket table: distinct codes, offsets, ids, slots,
    filter) loads as an item table over the same items and answers like the index it was
    written from; the new snapshot stores the items and the slots."""
    rng = np.random.default_rng(bits)
    W = (bits + 63) // 64
    words = rng.integers(0, 2**min(bits, 63), (300, W), dtype=np.uint64)
    words[150:] = words[:150]
    ids = rng.permutation(600)[:300].astype(np.int64) - 50
    index = HammingIndex(bits)
    index.add(words, ids)
    meta, arrays = index.snapshot()
    assert set(arrays) == {"words", "ids", "slots", "bitmap"}
    single_meta, old = legacy_single_arrays(words, ids, bits)
    save_arrays(tmp_path / "old", "single",
                {"bits": bits, "ntotal": 300, "max_probes": index.max_probes, **single_meta}, old)
    manifest = tmp_path / "old" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["format_version"] = 2
    manifest.write_text(json.dumps(doc))
    queries = words[:30] ^ np.uint64(5)
    for R in (0, 2):
        want = index.range_search(queries, R)
        got = HammingIndex.load(tmp_path / "old").range_search(queries, R)
        assert all((a == b).all() for a, b in zip(got, want)), R


FORMAT3 = Path(__file__).parent / "data" / "format3"


@pytest.mark.parametrize("name, bits", [("auto64", 64), ("mih64", 64), ("mih128", 128)])
@pytest.mark.parametrize("mmap", [False, True])
def test_format_3_snapshots_still_load(tmp_path, name, bits, mmap):
    """Snapshots written by format 3 (commit 428bbce: the multi-index's bucket tables of
    distinct substrings, hashed here, with the exact layout derived at load) load, the
    substring tables built again from their items, and answer like brute force; saved again,
    they are format 4 and load mapped, with no rebuild."""
    from bucketsearch.index.mih import MultiIndex
    from bucketsearch.index.planner import AutoIndex
    from tests import naive
    words = np.load(FORMAT3 / f"{name}_words.npy")
    ids = np.load(FORMAT3 / f"{name}_ids.npy")
    kind, meta, arrays = load_arrays(FORMAT3 / name, mmap=mmap)
    assert json.loads((FORMAT3 / name / "manifest.json").read_text())["format_version"] == 3
    assert "codes" in (meta["mih"] if kind == "auto" else meta)["lengths"]  # bucket tables
    cls = AutoIndex if kind == "auto" else MultiIndex
    loaded = cls.load(FORMAT3 / name, mmap=mmap)
    mih = loaded.mih if kind == "auto" else loaded
    assert mih.substrings == 3 or kind == "auto"
    xq = np.concatenate([words[:20], words[260:270] ^ np.uint64(2)])
    for R in (0, 1, 2, 4, 7):
        want = naive.range_search(xq, words, ids, bits, R)
        got = loaded.range_search(xq, R)
        assert all((a == b).all() for a, b in zip(got, want)), R
    want = naive.knn(xq, words, ids, bits, 5)
    got = loaded.search(xq, 5)
    assert (got[0] == want[0]).all() and (got[1] == want[1]).all()
    loaded.save(tmp_path / "again")
    doc = json.loads((tmp_path / "again" / "manifest.json").read_text())
    assert doc["format_version"] == FORMAT_VERSION == 4
    again = cls.load(tmp_path / "again", mmap=True)
    again_mih = again.mih if kind == "auto" else again
    assert isinstance(again_mih.tables.positions, np.memmap) or \
        isinstance(again_mih.tables.positions.base, np.memmap)
    assert all((a == b).all()
               for a, b in zip(again.range_search(xq, 4), loaded.range_search(xq, 4)))


# ------------------------------------------------------------- one read: bytes and checksum
def _npy_bytes(tmp_path, array, name="a.npy", version=None) -> Path:
    """``array`` written by numpy's own writer (the twin of the reader)."""
    path = tmp_path / name
    with open(path, "wb") as f:
        np.lib.format.write_array(f, array, version=version, allow_pickle=False)
    return path


_NPY_DTYPES = st.sampled_from(["u1", "<i4", ">i4", "<u8", ">u8", "<f8", "?", "<c16",
                               "i8,u1"])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=_NPY_DTYPES, shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
       fortran=st.booleans(), version=st.sampled_from([None, (1, 0), (2, 0)]),
       seed=st.integers(0, 2**32 - 1))
def test_one_read_gives_np_load_array_and_file_crc32(tmp_path, dtype, shape, fortran, version,
                                                     seed):
    """``fsio.read_with_crc32`` + ``store.array_of_npy`` against their twins ``np.load`` and
    ``store.file_crc32`` (a second read of the file): the same array (dtype, shape, order,
    values) and the same checksum, for every dtype, byte order, shape (0-d and empty too),
    memory order and ``.npy`` version; chunks smaller than the file as well."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=math.prod(shape) * np.dtype(dtype).itemsize, dtype=np.uint8)
    array = raw.view(dtype).reshape(shape)
    if fortran:
        array = np.asfortranarray(array)
    path = _npy_bytes(tmp_path, array, version=version)
    for chunk in (7, 1 << 22):
        got_raw, crc = fsio.read_with_crc32(path, chunk)
        assert crc == file_crc32(path) and got_raw.tobytes() == path.read_bytes()
        got, want = array_of_npy(got_raw), np.load(path, allow_pickle=False)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.flags.f_contiguous == want.flags.f_contiguous
        assert got.tobytes(order="A") == want.tobytes(order="A")


def test_one_read_refuses_what_np_load_refuses(tmp_path):
    """An object array (no pickle), a truncated file and a file that is not ``.npy`` are
    unreadable; the checksum is compared first, so damage reads as a checksum mismatch."""
    path = tmp_path / "o.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, np.array([1, "x"], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="object arrays"):
        array_of_npy(fsio.read_with_crc32(path)[0])
    good = _npy_bytes(tmp_path, np.arange(100, dtype=np.uint64), "g.npy")
    data = good.read_bytes()
    (tmp_path / "short.npy").write_bytes(data[:-8])
    with pytest.raises(ValueError, match="data bytes"):
        array_of_npy(fsio.read_with_crc32(tmp_path / "short.npy")[0])
    (tmp_path / "junk.npy").write_bytes(b"not an npy file at all")
    with pytest.raises(ValueError):
        array_of_npy(fsio.read_with_crc32(tmp_path / "junk.npy")[0])


@pytest.mark.parametrize("damage, message", [("flip", "ids.npy: checksum mismatch"),
                                             ("truncate", "ids.npy: checksum mismatch"),
                                             ("truncate-both", "ids.npy: unreadable array")])
def test_damaged_array_file_is_refused_in_memory_and_mapped(tmp_path, damage, message):
    """A flipped byte or a cut file is refused by its checksum (in memory: from the one read
    of the bytes; mapped: read before mapping); with its manifest entry updated to match, a
    cut file is still refused as unreadable by its size. Nothing is returned either way."""
    save_arrays(tmp_path / "snap", "test", {}, {"ids": np.arange(1000, dtype=np.int64),
                                                "b": np.ones(3)})
    ids = tmp_path / "snap" / "ids.npy"
    data = bytearray(ids.read_bytes())
    if damage == "flip":
        data[500] ^= 0x10
    else:
        del data[-16:]
    ids.write_bytes(bytes(data))
    if damage == "truncate-both":
        manifest = tmp_path / "snap" / "manifest.json"
        doc = json.loads(manifest.read_text())
        doc["arrays"]["ids"]["crc32"] = file_crc32(ids)
        manifest.write_text(json.dumps(doc))
    for mmap in (False, True):
        with pytest.raises(ValueError, match=message):
            load_arrays(tmp_path / "snap", mmap=mmap)


def test_arrays_read_in_memory_are_aligned_writable_and_equal_to_mapped(tmp_path):
    """Small files are read into numpy's memory, files from ``fsio.ANONYMOUS_MIN_BYTES`` up
    into a mapping of their own: both writable, aligned, equal to the mapped copy."""
    big = fsio.ANONYMOUS_MIN_BYTES // 8 + 3
    arrays = {"w": np.arange(big, dtype=np.uint64), "i": np.arange(7, dtype=np.int32),
              "m": np.arange(12, dtype=np.uint16).reshape(3, 4)}
    save_arrays(tmp_path / "snap", "test", {}, arrays)
    mem = load_arrays(tmp_path / "snap")[2]
    mapped = load_arrays(tmp_path / "snap", mmap=True)[2]
    for name, want in arrays.items():
        assert mem[name].flags.aligned and mem[name].flags.writeable
        assert mem[name].flags.c_contiguous and not mapped[name].flags.writeable
        assert (mem[name] == want).all() and (mapped[name] == want).all()


def _anon_huge_kib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_collapse_to_huge_pages_keeps_the_arrays_and_reaches_each_mapping_once(tmp_path):
    """The mappings a load read into are tried once each (a second call finds nothing), the
    arrays' values unchanged; ``keep_going`` stops it between steps; the process holds as many
    more bytes in huge pages as it says it collapsed (Linux >= 6.1)."""
    fsio.collapse_to_huge_pages()  # mappings of earlier tests
    n = (6 << 20) // 8 + 5  # each mapping holds at least two whole 2 MiB pages
    arrays = {"a": np.arange(n, dtype=np.uint64), "b": np.arange(n, dtype=np.int64)[::-1].copy()}
    save_arrays(tmp_path / "snap", "test", {}, arrays)
    loaded = load_arrays(tmp_path / "snap")[2]
    assert fsio.collapse_to_huge_pages(keep_going=lambda: False) == 0  # stopped at once
    loaded = load_arrays(tmp_path / "snap")[2]  # (the stopped call let go of a mapping)
    before = _anon_huge_kib()
    done = fsio.collapse_to_huge_pages(step=1 << 21)
    after = _anon_huge_kib()
    for name, want in arrays.items():
        assert np.array_equal(loaded[name], want)
    assert fsio.collapse_to_huge_pages() == 0
    files = sum((tmp_path / "snap" / f"{k}.npy").stat().st_size for k in arrays)
    # whole 2 MiB pages only (the ends of each mapping stay); 0: a refusal (a kernel without
    # MADV_COLLAPSE, no free huge page)
    assert done % HUGE_PAGE == 0 and done <= files
    assert after - before >= done >> 10  # KiB
