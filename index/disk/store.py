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

import contextlib
import json
import shutil
import uuid
import zlib
from pathlib import Path

import numpy as np

from bucketsearch.index.disk import fsio

#: 2: an ``auto`` snapshot stores the single table's ids once, as the multi-index's ``mih_ids``
#: (1 stored a copy as ``single_ids``; both are read); offsets and MIH table positions may be
#: int32. 3: the single table (``single`` and auto's) stores the items and int32 slots of
#: positions (:class:`index.item_table.ItemTable`) instead of distinct codes, offsets, slots and
#: a filter; auto's stores only ``single_slots``. Versions 1-2 load as before (the single table
#: indexed again from their items). 4: the multi-index (``mih`` and auto's ``mih_*``) stores its
#: substring tables as positions into the shared items (:mod:`index.mih_tables`:
#: ``table_positions``, ``table_starts``, ``table_slots``, ``table_bitmap``, ``table_tables``,
#: and ``table_ends``, the hashed tables' bucket end bits, added without a new version: a
#: version-4 snapshot without them gets them from its slots at load; meta ``layout:
#: "positions"``), mapped as they are on load; versions 1-3 (bucket tables of
#: distinct substrings, ``table_codes`` ... ``table_bitmap``) load with the tables built again
#: from their items.
FORMAT_VERSION = 4
MANIFEST = "manifest.json"
CHUNK = 1 << 22


def file_crc32(path: Path) -> int:
    crc = 0
    with fsio.open_read(path) as f:
        while block := f.read(CHUNK):
            crc = zlib.crc32(block, crc)
    return crc


def save_arrays(path, kind: str, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write a snapshot directory atomically (temp dir + fsync + rename); on any failure the
    temp dir is removed (best effort) and ``path`` holds the previous snapshot, or the new
    one, complete, when only the final fsync of the parent failed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fsio.mkdir(tmp)
    entries = {}
    old = None
    try:
        for name, array in arrays.items():
            file = tmp / f"{name}.npy"
            crc = fsio.write_npy(file, array)
            entries[name] = {"file": file.name, "dtype": str(array.dtype),
                             "shape": list(array.shape), "crc32": crc}
        manifest = {"format_version": FORMAT_VERSION, "kind": kind, "meta": meta,
                    "arrays": entries}
        fsio.write_file(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        fsio.fsync_path(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
            fsio.rename(path, old)
        fsio.rename(tmp, path)
        fsio.fsync_path(path.parent)
    except BaseException as exc:
        if not isinstance(exc, fsio.SimulatedCrash):
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None and not path.exists():  # swapped out, new one not in: undo
                with contextlib.suppress(OSError):
                    fsio.rename(old, path)
            elif old is not None:
                shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def load_arrays(path, mmap: bool = False, verify: bool = True):
    """Read a snapshot directory: ``(kind, meta, arrays)``; checks version and checksums."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{path}: not a snapshot directory (no {MANIFEST})")
    try:
        manifest = json.loads(fsio.read_bytes(manifest_path))
        version = manifest["format_version"]
        kind, meta, entries = manifest["kind"], manifest["meta"], manifest["arrays"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{manifest_path}: malformed manifest ({exc})") from None
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(f"{manifest_path}: format version {version!r} is newer than this "
                         f"bucketsearch reads (<= {FORMAT_VERSION}); upgrade bucketsearch")
    try:
        return kind, meta, _load_entries(path, entries, mmap, verify)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{manifest_path}: malformed array entry ({exc!r})") from None


def _load_entries(path: Path, entries: dict, mmap: bool, verify: bool) -> dict:
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
        except (ValueError, EOFError) as exc:
            raise ValueError(f"{file}: unreadable array ({exc})") from None
        if str(array.dtype) != entry["dtype"] or list(array.shape) != entry["shape"]:
            raise ValueError(f"{file}: dtype/shape {array.dtype}{array.shape} differ from the "
                             f"manifest's {entry['dtype']}{tuple(entry['shape'])}")
        arrays[name] = array
    return arrays
