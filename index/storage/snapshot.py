"""Snapshots of a live index's main index: the one writer, the reader of every layout, and
the clean-up of old generations.

A snapshot ``snap-<through>`` holds the main index built from every WAL record up to segment
``through`` (names: :mod:`bucketsearch.index.storage.layout`). :func:`write` makes it in one
atomic directory write (:func:`bucketsearch.index.storage.store.save_arrays`: the arrays and
one ``manifest.json`` into a temporary sibling, every file and the directory fsynced, renamed
into place, the parent fsynced), the snapshot's fields (:class:`SnapshotInfo`) in the
manifest's meta under ``"snapshot"``: one metadata file, one format version. :func:`load`
and :func:`verify` also read layout 1 (``snapshot.json`` beside ``main/``, written before
issue 29), so an index folder written by an older version opens, and its next merge writes
layout 2.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from bucketsearch.index.factory import index_from_arrays
from bucketsearch.index.disk import fsio
from bucketsearch.index.storage import layout
from bucketsearch.index.disk.store import load_arrays
from bucketsearch.index.storage.wal import list_segments

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot's own fields: the WAL segment it folds in (``wal_through``), the index's
    bits, mode and substrings, the largest id ever written (``id_high``: see
    :attr:`~bucketsearch.index.storage.state.LiveState.next_id`) and the merges so far;
    ``ntotal``, the main index's item count. Layout 1 snapshots written before ``id_high``
    and ``merges`` were kept read them as -1 and 0."""

    wal_through: int
    bits: int
    mode: str
    substrings: int | None
    id_high: int = -1
    merges: int = 0

    @classmethod
    def from_meta(cls, meta: dict, substrings: int | None = None) -> SnapshotInfo:
        """From a snapshot's fields (``substrings``: the value when they do not say)."""
        return cls(int(meta["wal_through"]), meta["bits"], meta["mode"],
                   meta.get("substrings", substrings),
                   int(meta.get("id_high", -1)), int(meta.get("merges", 0)))


def write(directory: Path, main, info: SnapshotInfo) -> Path:
    """Write ``main`` as snapshot ``snap-<info.wal_through>`` of ``directory`` (atomic: a
    crash leaves it whole or absent; an unverified earlier attempt under the same name is
    replaced)."""
    path = Path(directory) / layout.snapshot_name(info.wal_through)
    main.save(path, {"snapshot": {"layout": layout.SNAPSHOT_LAYOUT, **asdict(info)}})
    return path


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """``(wal_through, path)`` of every complete snapshot directory, oldest first."""
    found = []
    for entry in Path(directory).iterdir():
        through = layout.snapshot_through(entry.name)
        if through is not None and layout.snapshot_metadata(entry).exists():
            found.append((through, entry))
    return sorted(found)


def _info(snap_dir: Path, meta: dict, substrings: int | None) -> SnapshotInfo:
    """The snapshot fields in a layout 2 manifest's ``meta``."""
    fields = meta.get("snapshot")
    if not isinstance(fields, dict) or fields.get("layout") != layout.SNAPSHOT_LAYOUT:
        raise ValueError(f"{snap_dir.name}: snapshot layout "
                         f"{fields.get('layout') if isinstance(fields, dict) else None!r}, "
                         f"this bucketsearch reads 1 and {layout.SNAPSHOT_LAYOUT}")
    return SnapshotInfo.from_meta(fields, substrings)


def read_info(snap_dir: Path, substrings: int | None = None) -> SnapshotInfo:
    """A snapshot's fields alone (no array is read or checked), of either layout."""
    legacy = snap_dir / layout.LEGACY_SNAPSHOT_META
    if legacy.exists():
        return SnapshotInfo.from_meta(json.loads(fsio.read_bytes(legacy)), substrings)
    manifest = json.loads(fsio.read_bytes(snap_dir / layout.MANIFEST))
    return _info(snap_dir, manifest.get("meta") or {}, substrings)


def _read(snap_dir: Path, mmap: bool, substrings: int | None = None):
    """``(info, kind, meta, arrays, arrays_dir)`` of a snapshot of either layout, every
    checksum verified."""
    legacy = snap_dir / layout.LEGACY_SNAPSHOT_META
    if legacy.exists():  # layout 1: snapshot.json, the engine's arrays in main/
        info = SnapshotInfo.from_meta(json.loads(fsio.read_bytes(legacy)), substrings)
        arrays_dir = snap_dir / layout.LEGACY_MAIN
        kind, meta, arrays = load_arrays(arrays_dir, mmap=mmap)
        return info, kind, meta, arrays, arrays_dir
    kind, meta, arrays = load_arrays(snap_dir, mmap=mmap)
    return _info(snap_dir, meta, substrings), kind, meta, arrays, snap_dir


def _check(snap_dir: Path, info: SnapshotInfo, bits: int, mode: str | None,
           expected: str) -> None:
    if info.bits != bits or (mode is not None and info.mode != mode):
        raise ValueError(f"{snap_dir.name}: holds bits={info.bits} mode={info.mode!r}, "
                         f"expected bits={bits} mode={expected!r}")


def load(snap_dir: Path, bits: int, *, mmap: bool = False, expected_mode: str | None = None,
         current_mode: str | None = None, current_substrings: int | None = None):
    """``(main, info)`` of a snapshot, every checksum verified; its bits must be ``bits``
    and, when given, its mode ``expected_mode`` (``current_mode`` names the mode expected in
    the error; ``current_substrings`` stands in when the snapshot does not say). ValueError
    (or OSError) names what is wrong."""
    info, kind, meta, arrays, arrays_dir = _read(snap_dir, mmap, current_substrings)
    _check(snap_dir, info, bits, expected_mode, expected_mode or current_mode)
    main = index_from_arrays(arrays_dir, kind, meta, arrays, expected_kind=info.mode)
    return main, info


def verify(snap_dir: Path, bits: int, mode: str, ntotal: int) -> None:
    """Check a snapshot just written as :func:`load` would, without building an index of
    it: its fields (bits, mode), every array's checksum, dtype and shape, its kind and item
    count."""
    info, kind, meta, _, _ = _read(snap_dir, mmap=True)
    _check(snap_dir, info, bits, mode, mode)
    if kind != mode or meta.get("ntotal") != ntotal:
        raise ValueError(f"{snap_dir.name}: holds a {kind!r} index of "
                         f"{meta.get('ntotal')} items, expected {mode!r} of {ntotal}")


def set_aside(snap_dir: Path, when: int) -> None:
    """Rename a damaged snapshot out of the way (kept for inspection, never listed again)."""
    fsio.rename(snap_dir, layout.set_aside(snap_dir, when))


def remove_generations(directory: Path, keep: tuple[int, int]) -> None:
    """Remove every snapshot but the two generations ``keep`` (older, newer) and every WAL
    segment the older does not need (``<= keep[0]``), then fsync the directory."""
    for through, path in list_snapshots(directory):
        if through not in keep:
            fsio.rmtree(path)
    for seq, path in list_segments(directory):
        if seq <= keep[0]:
            fsio.unlink(path)
    fsio.fsync_path(directory)
