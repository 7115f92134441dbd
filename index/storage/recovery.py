"""Opening an index folder: the newest usable snapshot, then the log after it.

:func:`recover` chooses the base (:func:`choose_base`: the newest snapshot that loads and
verifies and has every later WAL segment, or the empty index when the log starts at segment
0; a damaged snapshot is set aside, one that failed with an I/O error is not), then replays
the later segments in order. A torn tail of the newest segment is cut (the bytes kept in
``.broken-<offset>``); any other damage raises
:class:`~bucketsearch.index.storage.wal.CorruptLogError` or :class:`CorruptIndexError` and
changes nothing, unless ``repair`` salvages every intact record (:func:`salvage_segment`). A
read-only opening (a follower) changes no file and replays only what the writer committed
(:mod:`bucketsearch.index.storage.follow`). The caller (the coordinator,
:class:`~bucketsearch.index.storage.live.LiveIndex`) opens the log where this left it.
"""
from __future__ import annotations

import contextlib
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from bucketsearch.index.factory import make_index
from bucketsearch.index.disk import fsio
from bucketsearch.index.errors import CorruptIndexError
from bucketsearch.index.storage import follow, layout, snapshot
from bucketsearch.index.storage.state import LiveState, apply_ops, base_state
from bucketsearch.index.storage.wal import (MAGIC, CorruptLogError, Op, cut_torn_tail,
                                            list_segments, record, salvage, scan_segment)

log = logging.getLogger(__name__)


@dataclass
class Recovery:
    """What opening an index found and did (shown in the index's status)."""

    snapshot: int | None = None  # wal_through of the snapshot used (None: started empty)
    segments: list[int] = field(default_factory=list)
    records: int = 0
    torn_bytes: int = 0
    broken_files: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # snapshots skipped, and why
    lost: list[dict] = field(default_factory=list)  # repair: byte ranges of salvaged segments
    #: seconds to choose the base (its snapshot read, every checksum verified, its index made),
    #: then to replay the log after it (with the state's one pass over the base's ids)
    base_seconds: float = 0.0
    replay_seconds: float = 0.0


@dataclass(frozen=True)
class Config:
    """What an index folder is opened as: the coordinator's settings recovery needs."""

    directory: Path
    bits: int
    mode: str
    substrings: int | None
    max_probes: int
    mmap: bool = False
    read_only: bool = False
    repair: bool = False


@dataclass
class Opened:
    """The result of :func:`recover`: the state, the mode the base snapshot was written in
    (a mode change writes a snapshot in the new mode: recovery adopts it), the merges so
    far, the base snapshot (-1: none), the log position applied, and where the writer's log
    goes on (``seq``, ``size``: None for the segment's own size)."""

    state: LiveState
    report: Recovery
    mode: str
    substrings: int | None
    merges: int
    through: int
    applied: follow.Position
    seq: int
    size: int | None


def new_main(cfg: Config, mode: str | None = None, substrings: int | None = None):
    """An empty main index of ``mode`` (default: the configured one)."""
    if mode is None:
        mode, substrings = cfg.mode, cfg.substrings
    return make_index(cfg.bits, mode, substrings=substrings, max_probes=cfg.max_probes)


def load_main(cfg: Config, snap_dir: Path, expected_mode: str | None = None):
    """``(main, info)`` of a snapshot (:func:`bucketsearch.index.storage.snapshot.load`) with
    the index's probe guard; ``expected_mode`` checks a snapshot just written."""
    main, info = snapshot.load(snap_dir, cfg.bits, mmap=cfg.mmap, expected_mode=expected_mode,
                               current_mode=cfg.mode, current_substrings=cfg.substrings)
    main.max_probes = cfg.max_probes
    return main, info


def choose_base(cfg: Config, report: Recovery):
    """The newest snapshot that loads and verifies and whose later WAL segments are all
    there (or the empty index, when the log starts at segment 0): ``(through, main, info)``
    (``info`` None for the empty index)."""
    segs = [s for s, _ in list_segments(cfg.directory)]
    bases = [(t, d) for t, d in reversed(snapshot.list_snapshots(cfg.directory))] + [(-1, None)]
    io_error = None  # an I/O error (EIO, EMFILE, ...) says nothing about the snapshot
    for through, snap_dir in bases:
        later = [s for s in segs if s > through]
        if later != list(range(through + 1, through + 1 + len(later))):
            report.fallbacks.append(
                f"snapshot {through}: WAL segments after it missing (found {later})")
            continue
        if snap_dir is None:
            if len(bases) > 1 and (not later or later[0] != 0):
                break  # there were snapshots, and the log no longer starts at 0
            return through, new_main(cfg), None
        try:
            return (through, *load_main(cfg, snap_dir))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            report.fallbacks.append(f"{snap_dir.name}: {exc}")
            log.warning("index %s: snapshot %s unusable (%s); trying the previous one",
                        cfg.directory.name, snap_dir.name, exc)
            if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
                io_error = io_error or exc  # not damage: never quarantine, maybe transient
            elif not cfg.read_only:
                with contextlib.suppress(OSError):
                    snapshot.set_aside(snap_dir, int(time.time()))
    if io_error is not None:  # retryable: report the I/O error, not corruption
        raise OSError(io_error.errno, f"cannot open the index: {io_error}") from io_error
    raise CorruptIndexError(
        f"no usable snapshot with a complete log after it: {'; '.join(report.fallbacks)}"
        " (run 'bucketsearch repair')")


def recover(cfg: Config) -> Opened:
    """Open ``cfg.directory``: base snapshot, then the later WAL segments (see the module
    docstring)."""
    report = Recovery()
    t = time.perf_counter()
    through, main, info = choose_base(cfg, report)
    report.base_seconds = time.perf_counter() - t
    t = time.perf_counter()
    report.snapshot = None if through < 0 else through
    mode, substrings = (cfg.mode, cfg.substrings) if info is None else \
        (info.mode, info.substrings)
    # a follower replays only what the writer committed (follow.py); None: all valid records
    limit = follow.read_position(cfg.directory) if cfg.read_only else None
    segments = [(s, p) for s, p in list_segments(cfg.directory) if s > through
                and (limit is None or s <= limit.segment)]
    applied = follow.Position(through + 1, len(MAGIC), through)
    ops: list[Op] = []
    size = None
    for k, (seq, path) in enumerate(segments):
        scan = scan_segment(path)
        if limit is not None and seq == limit.segment:  # what follows was not acknowledged
            keep = sum(end <= limit.offset for end in scan.ends)
            scan.ops, scan.ends = scan.ops[:keep], scan.ends[:keep]
            if scan.damage is not None and scan.damage.offset >= limit.offset:
                scan.damage = None
            elif scan.damage is not None or scan.valid_bytes < limit.offset:
                # committed records are damaged or missing: never a torn tail to ignore
                raise CorruptLogError(path, min(scan.valid_bytes, limit.offset),
                                      "committed records do not read back whole (the "
                                      f"writer committed up to byte {limit.offset})")
        newest = k == len(segments) - 1
        if scan.damage is not None and cfg.repair and (scan.damage.kind == "corrupt"
                                                       or not newest):
            ops.extend(salvage_segment(cfg, scan, report))
            report.segments.append(seq)
            size = None
            continue
        if scan.damage is not None:
            if scan.damage.kind == "corrupt" or not newest:
                raise CorruptLogError(path, scan.damage.offset,
                                      scan.damage.detail if newest else
                                      f"{scan.damage.detail} in a segment that is not the "
                                      "newest")
            log.warning("index %s: WAL %s: torn tail of %d bytes after offset %d %s",
                        cfg.directory.name, path.name, scan.torn_bytes,
                        scan.valid_bytes, "ignored (read-only)" if cfg.read_only
                        else "cut (kept in a .broken file)")
            report.torn_bytes += scan.torn_bytes
            if not cfg.read_only:
                broken = cut_torn_tail(scan)
                if broken is not None:
                    report.broken_files.append(broken.name)
                size = max(scan.valid_bytes, len(MAGIC))
        ops.extend(scan.ops)
        report.segments.append(seq)
        applied = follow.Position(seq, scan.ends[-1] if scan.ends else len(MAGIC), through)
    report.records = len(ops)
    state = base_state(main, cfg.bits, version=0, id_high=-1 if info is None else info.id_high)
    try:
        state = apply_ops(state, ops, replace_live=cfg.repair)
    except ValueError as exc:
        raise CorruptIndexError(f"the write-ahead log contradicts itself: {exc}") from None
    if not cfg.read_only:
        for leftover in layout.snapshot_leftovers(cfg.directory):
            shutil.rmtree(leftover, ignore_errors=True)
    report.replay_seconds = time.perf_counter() - t
    log.info("index %s: %s in %.2f s; %d WAL records of %d segments replayed in %.2f s",
             cfg.directory.name, "no snapshot (an empty base)" if report.snapshot is None
             else f"snapshot {report.snapshot} read, every checksum verified,",
             report.base_seconds, report.records, len(report.segments), report.replay_seconds)
    return Opened(state, report, mode, substrings, 0 if info is None else info.merges,
                  through, applied, segments[-1][0] if segments else through + 1, size)


def salvage_segment(cfg: Config, scan, report: Recovery) -> list[Op]:
    """Repair: keep every intact record of a damaged segment; the original bytes are kept
    in ``<segment>.corrupt-<time>``, the segment is rewritten atomically."""
    kept = salvage(scan.data)
    path = scan.path
    for start, end in kept.lost:
        report.lost.append({"segment": path.name, "start": start, "end": end})
    fsio.write_file(layout.set_aside(path, int(time.time())), scan.data)
    fsio.replace_file(path, MAGIC + b"".join(record(op) for op in kept.ops))
    log.warning("index %s: WAL %s salvaged: %d records kept, lost byte ranges %s",
                cfg.directory.name, path.name, len(kept.ops), kept.lost)
    return kept.ops
