"""Snapshots on disk: a directory of flat ``.npy`` arrays plus ``manifest.json``.

``manifest.json`` holds the format version, the index kind, its metadata (bits, counts, ...)
and, per array, the file name, dtype, shape and CRC32 of the file. A snapshot is written to a
temporary sibling directory, every file and the directory are fsynced, and it is renamed into
place; a previous snapshot at the same path is swapped out by rename and removed afterwards.
Loading verifies every checksum (also with ``mmap=True``: the file is read once) and refuses a
missing, corrupt or newer-format snapshot with a message naming the file. No pickle anywhere:
arrays are read with ``allow_pickle=False``.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
import zlib
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CHUNK = 1 << 22


def file_crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            crc = zlib.crc32(block, crc)
    return crc


def fsync_path(path: Path) -> None:
    """fsync a file or a directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON to ``path`` via a fsynced temporary file and a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def save_arrays(path, kind: str, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write a snapshot directory atomically (temp dir + fsync + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.mkdir()
    entries = {}
    try:
        for name, array in arrays.items():
            file = tmp / f"{name}.npy"
            np.save(file, np.ascontiguousarray(array), allow_pickle=False)
            fsync_path(file)
            entries[name] = {"file": file.name, "dtype": str(array.dtype),
                             "shape": list(array.shape), "crc32": file_crc32(file)}
        manifest = {"format_version": FORMAT_VERSION, "kind": kind, "meta": meta,
                    "arrays": entries}
        write_json_atomic(tmp / MANIFEST, manifest)
        fsync_path(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_path(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_arrays(path, mmap: bool = False, verify: bool = True):
    """Read a snapshot directory: ``(kind, meta, arrays)``; checks version and checksums."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{path}: not a snapshot directory (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_path.read_text())
        version = manifest["format_version"]
        kind, meta, entries = manifest["kind"], manifest["meta"], manifest["arrays"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{manifest_path}: malformed manifest ({exc})") from None
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(f"{manifest_path}: format version {version!r} is newer than this "
                         f"bucketsearch reads (<= {FORMAT_VERSION}); upgrade bucketsearch")
    arrays = {}
    for name, entry in entries.items():
        file = path / Path(entry["file"]).name
        if not file.is_file():
            raise ValueError(f"{file}: array {name!r} listed in the manifest is missing")
        if verify and file_crc32(file) != entry["crc32"]:
            raise ValueError(f"{file}: checksum mismatch (CRC32 {file_crc32(file)} != "
                             f"{entry['crc32']} in the manifest): the snapshot is corrupt")
        try:
            array = np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"{file}: unreadable array ({exc})") from None
        if str(array.dtype) != entry["dtype"] or list(array.shape) != entry["shape"]:
            raise ValueError(f"{file}: dtype/shape {array.dtype}{array.shape} differ from the "
                             f"manifest's {entry['dtype']}{tuple(entry['shape'])}")
        arrays[name] = array
    return kind, meta, arrays


def save_index(path, index) -> None:
    """Snapshot a :class:`~index.probe.HammingIndex`, :class:`~index.scan.LinearScan` or
    :class:`~index.mih.MultiIndex` or :class:`~index.planner.AutoIndex` (kinds ``"mih"`` and
    ``"auto"``: their ``snapshot()`` meta and arrays, loaded by ``from_snapshot``)."""
    meta = {"bits": index.bits, "ntotal": index.ntotal}
    if index.kind == "hamming":
        meta.update(max_probes=index.max_probes, direct=index.table.direct)
        arrays = index.table.arrays()
    elif index.kind in ("mih", "auto"):
        extra, arrays = index.snapshot()
        meta.update(extra)
    else:
        arrays = {"words": index.words, "ids": index.ids}
    save_arrays(path, index.kind, meta, arrays)


def load_index(path, mmap: bool = False, expected_kind: str | None = None):
    """Load an index snapshot written by :func:`save_index`."""
    from index.probe import HammingIndex
    from index.scan import LinearScan
    from index.table import BucketTable

    kind, meta, arrays = load_arrays(path, mmap=mmap)
    if expected_kind and kind != expected_kind:
        raise ValueError(f"{path}: holds a {kind!r} index, not {expected_kind!r}")
    if kind == "hamming":
        index = HammingIndex(meta["bits"], max_probes=meta["max_probes"])
        index.table = BucketTable.from_arrays(meta["bits"], arrays, meta["direct"])
    elif kind == "mih":
        from index.mih import MultiIndex
        index = MultiIndex.from_snapshot(meta["bits"], meta, arrays)
    elif kind == "auto":
        from index.planner import AutoIndex
        index = AutoIndex.from_snapshot(meta["bits"], meta, arrays)
    elif kind == "scan":
        index = LinearScan(meta["bits"])
        index.words, index.ids = arrays["words"], arrays["ids"]
    else:
        raise ValueError(f"{path}: unknown index kind {kind!r}")
    if index.ntotal != meta["ntotal"]:
        raise ValueError(f"{path}: holds {index.ntotal} items, the manifest says {meta['ntotal']}")
    return index
