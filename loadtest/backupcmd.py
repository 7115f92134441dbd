"""``bucketsearch backup`` and ``bucketsearch restore``: an index's backup file over HTTP.

The server makes the file (``GET /v1/indexes/{name}/backup``: the live items of one state,
bits, mode, a CRC-32 over everything; ``index/storage/backup.py``) and restores it into a new
index atomically (``POST /v1/indexes/{name}/restore``); these commands are the
:class:`~bucketsearch.loadtest.client.Client` calls with a file on disk.
"""
from __future__ import annotations

import contextlib
import os
import sys
from types import SimpleNamespace


def _common(parser) -> None:
    parser.add_argument("--url", default=os.environ.get("BUCKETSEARCH_URL",
                                                        "http://127.0.0.1:8000"),
                        help="server URL (BUCKETSEARCH_URL; default http://127.0.0.1:8000)")
    parser.add_argument("--api-key", default=os.environ.get("BUCKETSEARCH_API_KEY"),
                        help="Bearer key (BUCKETSEARCH_API_KEY)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds per request (default 600: large indexes)")


@contextlib.contextmanager
def _client(args):
    """A Client; its typed errors become the CLI's one-line error (RuntimeError)."""
    from bucketsearch.loadtest.client import BucketsearchError, Client
    try:
        with Client(args.url, api_key=args.api_key, timeout=args.timeout) as client:
            yield client
    except BucketsearchError as exc:
        raise RuntimeError(str(exc)) from None


def _backup_arguments(parser) -> None:
    _common(parser)
    parser.add_argument("index", help="the index to back up")
    parser.add_argument("file", help="where to write the backup file ('-': stdout)")


def _backup(args) -> int:
    if args.file != "-":
        folder = os.path.dirname(os.path.abspath(args.file))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"file: the folder of {args.file!r} ({folder}) does not "
                                    "exist")
        if os.path.isdir(args.file):
            raise IsADirectoryError(f"file: {args.file!r} is a folder; give a file name")
    with _client(args) as client:
        size = client.backup(args.index, args.file if args.file != "-" else sys.stdout.buffer)
    if args.file != "-":
        print(f"backup of {args.index!r}: {size:,} bytes written to {args.file}")
    return 0


def _restore_arguments(parser) -> None:
    _common(parser)
    parser.add_argument("index", help="the new index's name (it must not exist)")
    parser.add_argument("file", help="a backup file made by 'bucketsearch backup'")


def _restore(args) -> int:
    if os.path.isdir(args.file):
        raise IsADirectoryError(f"file: {args.file!r} is a folder, not a backup file")
    if not os.path.isfile(args.file):
        raise FileNotFoundError(f"file: {args.file!r} does not exist")
    with _client(args) as client:
        info = client.restore(args.index, args.file)
    print(f"restored {args.index!r}: {info.get('size', 0):,} items, {info.get('bits')} bits, "
          f"mode {info.get('mode')}")
    return 0


BACKUP = SimpleNamespace(
    HELP="write an index's backup file (one consistent state, self-checking)",
    EPILOG="examples:\n  bucketsearch backup photos photos.bsbackup\n"
           "  bucketsearch backup --url http://10.0.0.5:8000 --api-key KEY photos - | gzip > p.gz",
    add_arguments=_backup_arguments, run=_backup)

RESTORE = SimpleNamespace(
    HELP="create a new index from a backup file (atomically: whole or not at all)",
    EPILOG="examples:\n  bucketsearch restore photos2 photos.bsbackup",
    add_arguments=_restore_arguments, run=_restore)
