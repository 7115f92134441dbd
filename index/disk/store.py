"""Snapshots on disk: a directory of flat ``.npy`` arrays plus ``manifest.json``.

``manifest.json`` holds the format version, the index kind, its metadata (bits, counts, ...)
and, per array, the file name, dtype, shape and CRC32 of the file. A snapshot is written to a
temporary sibling directory, every file and the directory are fsynced, and it is renamed into
place; a previous snapshot at the same path is swapped out by rename and removed afterwards.
Loading verifies every checksum before an array is used and refuses a missing, corrupt or
newer-format snapshot with a message naming the file. Each file is read once: in memory, its
bytes are read into one buffer with the CRC32 computed chunk by chunk as they arrive
(:func:`bucketsearch.index.disk.fsio.read_with_crc32`), and the array is a view of that buffer
past the ``.npy`` header (:func:`array_of_npy`); with ``mmap=True`` the file is read for its
checksum (the pages it maps are then in the page cache) and mapped. No pickle anywhere: an
object array is refused as ``np.load(allow_pickle=False)`` refuses it.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
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
#: the longest ``.npy`` header read (``np.load``'s default ``max_header_size``)
NPY_MAX_HEADER = 10_000


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


def array_of_npy(raw: np.ndarray) -> np.ndarray:
    """The array a ``.npy`` file's bytes ``raw`` (``uint8``) hold: a view of them past the
    header (no copy; copied only if the data would sit misaligned for its dtype). ValueError
    for a bad header, an object dtype (no pickle) or a size that does not match the header's
    shape (a truncated file)."""
    fmt = np.lib.format
    head = io.BytesIO(raw[:fmt.MAGIC_LEN + 4 + NPY_MAX_HEADER].tobytes())
    version = fmt.read_magic(head)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f".npy format version {version} (this reads 1.0 and 2.0)")
    read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, fortran_order, dtype = read_header(head, max_header_size=NPY_MAX_HEADER)
    if dtype.hasobject:
        raise ValueError("object arrays are not read (no pickle)")
    offset, count = head.tell(), math.prod(shape)
    if len(raw) - offset != count * dtype.itemsize:
        raise ValueError(f"{len(raw) - offset} data bytes, the header's shape {shape} of "
                         f"{dtype} needs {count * dtype.itemsize}")
    data = raw[offset:]
    if data.ctypes.data % max(dtype.alignment, 1):
        data = data.copy()
    return data.view(dtype).reshape(shape, order="F" if fortran_order else "C")


def _load_entries(path: Path, entries: dict, mmap: bool, verify: bool) -> dict:
    arrays = {}
    for name, entry in entries.items():
        file = path / Path(entry["file"]).name
        if not file.is_file():
            raise ValueError(f"{file}: array {name!r} listed in the manifest is missing")
        raw = None
        if mmap:
            crc = file_crc32(file) if verify else None
        else:  # one read: the bytes and their checksum
            raw, crc = fsio.read_with_crc32(file, CHUNK)
        if verify and crc != entry["crc32"]:
            raise ValueError(f"{file}: checksum mismatch (CRC32 {crc} != {entry['crc32']} in "
                             "the manifest): the snapshot is corrupt")
        try:
            array = np.load(file, mmap_mode="r", allow_pickle=False) if raw is None \
                else array_of_npy(raw)
        except (ValueError, EOFError) as exc:
            raise ValueError(f"{file}: unreadable array ({exc})") from None
        if str(array.dtype) != entry["dtype"] or list(array.shape) != entry["shape"]:
            raise ValueError(f"{file}: dtype/shape {array.dtype}{array.shape} differ from the "
                             f"manifest's {entry['dtype']}{tuple(entry['shape'])}")
        arrays[name] = array
    return arrays
