"""``bucketsearch repair``: salvage a corrupt index, reporting exactly what was lost."""
from __future__ import annotations

import json
from pathlib import Path

from bucketsearch.index.storage import catalog, layout
from bucketsearch.index.storage.live import LiveIndex

HELP = "salvage a corrupt index: keep every intact WAL record, report what was lost"
EPILOG = """examples:
  bucketsearch repair --data-dir data --index photos
  bucketsearch repair --data-dir data --index photos --json report.json

The server must be stopped (repair takes the data directory's lock). What happens:
  - a WAL segment damaged in the middle (or an older segment with a torn end) is rewritten
    with every intact record; the original bytes are kept beside it as <segment>.corrupt-<time>;
  - an add of an id that is still live (the salvaged log lost the delete before it) replaces
    the item;
  - a corrupt snapshot is set aside (<snap>.corrupt-<time>) and the previous generation plus
    the log is used (this also happens on a normal start: nothing is lost).
The report lists every lost byte range; records inside them are gone."""


def add_arguments(parser) -> None:
    parser.add_argument("--data-dir", required=True, help="the server's data directory")
    parser.add_argument("--index", required=True, help="name of the index to repair")
    parser.add_argument("--json", default=None, help="also write the report as JSON here")


def repair(data_dir, name: str) -> dict:
    """Open index ``name`` of ``data_dir`` with salvage and return the report."""
    lock = catalog.DataDirLock(data_dir)
    try:
        found = [f for f in catalog.read_folders(Path(data_dir) / layout.INDEXES) if f.name == name]
        if not found:
            raise ValueError(f"--index: no index {name!r} in {data_dir}")
        if found[0].meta is None:
            raise ValueError(f"--index: {name!r} has {found[0].error}; restore its index.json "
                             "(name, bits, mode, substrings) by hand")
        meta = found[0].meta
        live = LiveIndex(found[0].folder, int(meta["bits"]), meta["mode"],
                         meta.get("substrings"), background_merge=False, repair=True)
        rec = live.recovery
        report = {"index": name, "items": live.ntotal, "snapshot": rec.snapshot,
                  "segments": rec.segments, "records": rec.records, "lost": rec.lost,
                  "lost_bytes": sum(x["end"] - x["start"] for x in rec.lost),
                  "torn_bytes_cut": rec.torn_bytes, "broken_files": rec.broken_files,
                  "snapshots_skipped": rec.fallbacks}
        live.close()
        return report
    finally:
        lock.release()


def run(args) -> int:
    report = repair(args.data_dir, args.index)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"index {report['index']}: opened with {report['items']} items from snapshot "
          f"{report['snapshot']} and {report['records']} WAL records in segments "
          f"{report['segments']}")
    for lost in report["lost"]:
        print(f"  lost: {lost['segment']} bytes [{lost['start']}, {lost['end']})")
    for skipped in report["snapshots_skipped"]:
        print(f"  snapshot skipped: {skipped}")
    if report["torn_bytes_cut"]:
        print(f"  torn tail cut: {report['torn_bytes_cut']} bytes (kept in "
              f"{', '.join(report['broken_files'])})")
    print("nothing lost" if not report["lost"] else
          f"{report['lost_bytes']} bytes of the log were unreadable; the records in them are lost")
    return 0
