"""Every file name of the data directory and of an index folder, and the format of each.

One place spells the names; the modules that write and read the files ask here::

    <data_dir>/LOCK                             the one writer's flock (catalog.DataDirLock)
    <data_dir>/indexes/<name>.<id>/             one index incarnation (an index folder)
    <data_dir>/indexes/.creating-<hex>/         a create in progress (removed at start-up)
    <data_dir>/indexes/.deleted-<hex>/          a delete in progress (removed at start-up)

    <index folder>/index.json                   name, bits, mode, substrings (catalog)
                   wal-00000007.log             WAL segment 7: magic b"BSWAL001", records (wal)
                   wal-00000007.log.tmp         a rotation in progress (ignored, replaced)
                   wal-00000007.log.broken-<offset>  a torn tail cut by recovery
                   wal-00000007.log.corrupt-<time>   a segment's bytes before repair rewrote it
                   wal.committed                the commit position followers read (follow)
                   snap-00000006/               the main index through WAL segment 6 (snapshot)
                   .snap-00000006.<hex>.tmp/    a snapshot being written (removed at recovery)
                   .snap-00000006.<hex>.old/    the snapshot a retried write replaces
                   snap-00000006.corrupt-<time>/  a snapshot set aside as damaged
                   backups/<index>-<time>-<hex>.tar  snapshot tars for backup (exports)
                   cost-history.json            the cost figures of its searches (app registry)
                   shard-<i>/                   shard i's own index folder (a sharded index)
                   write.pending                a sharded write's intent (app shardwrites)

A snapshot directory has one of two layouts (:data:`SNAPSHOT_LAYOUT` is the one written):

- layout 2 (written since issue 29): ``manifest.json`` (the array manifest of
  :mod:`bucketsearch.index.storage.store`: format version, kind, checksums) whose ``meta``
  holds the engine's fields and, under ``"snapshot"``, the snapshot's own (``layout``,
  ``wal_through``, ``mode``, ``substrings``, ``id_high``, ``merges``), beside the arrays:
  one directory written atomically, one metadata file;
- layout 1 (read only): ``snapshot.json`` (the snapshot's fields, no version) and the
  engine's array directory ``main/`` with its own ``manifest.json``.
"""
from __future__ import annotations

import re
from pathlib import Path

from bucketsearch.index.disk.store import MANIFEST

# -------------------------------------------------------------------------- data directory
LOCK = "LOCK"
INDEXES = "indexes"
CREATING = ".creating-"
DELETING = ".deleted-"

# ---------------------------------------------------------------------------- index folder
INDEX_META = "index.json"
COMMIT_FILE = "wal.committed"
BACKUPS = "backups"
COST_HISTORY = "cost-history.json"
INTENT_FILE = "write.pending"

_SEGMENT_RE = re.compile(r"^wal-(\d{8})\.log$")
_SNAPSHOT_RE = re.compile(r"^snap-(\d{8})$")

#: the snapshot layout written (see the module docstring); 1 is still read
SNAPSHOT_LAYOUT = 2
#: layout 1: the snapshot's fields, and the folder of its engine's arrays
LEGACY_SNAPSHOT_META, LEGACY_MAIN = "snapshot.json", "main"


def segment_name(seq: int) -> str:
    """``wal-<seq, 8 digits>.log``."""
    return f"wal-{seq:08d}.log"


def segment_seq(name: str) -> int | None:
    """The sequence number of a WAL segment's file name, else None (temp, broken, ...)."""
    m = _SEGMENT_RE.match(name)
    return int(m.group(1)) if m else None


def segment_tmp(seq: int) -> str:
    return f"{segment_name(seq)}.tmp"


def broken_tail(segment: Path, offset: int) -> Path:
    """Where the bytes cut from ``segment`` at ``offset`` (a torn tail) are kept."""
    return segment.with_name(f"{segment.name}.broken-{offset}")


def set_aside(path: Path, when: int) -> Path:
    """The name a damaged segment's bytes or a damaged snapshot are kept under (``when``:
    seconds since the epoch): ``<name>.corrupt-<when>``."""
    return path.with_name(f"{path.name}.corrupt-{when}")


def snapshot_name(through: int) -> str:
    """``snap-<wal_through, 8 digits>``: the main index of every record of the WAL segments
    up to ``through``."""
    return f"snap-{through:08d}"


def snapshot_through(name: str) -> int | None:
    """The ``wal_through`` of a snapshot directory's name, else None."""
    m = _SNAPSHOT_RE.match(name)
    return int(m.group(1)) if m else None


def snapshot_metadata(snap_dir: Path) -> Path:
    """The file that makes a snapshot directory complete: layout 1's ``snapshot.json`` when
    present, else the manifest of layout 2."""
    legacy = snap_dir / LEGACY_SNAPSHOT_META
    return legacy if legacy.exists() else snap_dir / MANIFEST


def snapshot_leftovers(directory: Path) -> list[Path]:
    """Temporary directories of snapshot writes a crash interrupted (``.snap-*.tmp``, and the
    ``.snap-*.old`` a replaced snapshot was moved to)."""
    return [*directory.glob(".snap-*.tmp"), *directory.glob(".snap-*.old")]


def shard_folder(folder: Path, shard: int) -> Path:
    """The folder of shard ``shard`` inside ``folder``: a sharded index's folder (the shard's
    own index folder), or a near-duplicate job's (the copy of the shard's items at the job's
    start)."""
    return Path(folder) / f"shard-{shard}"
