"""Errors the index layer raises to whoever serves it (the server maps them to HTTP), in a module
of their own at the engines' floor so that the storage and the cluster packages raise them
without importing each other or the server."""
from __future__ import annotations

from pathlib import Path


class DuplicateIdError(ValueError):
    """An inserted id is already live in the index (HTTP 409)."""


class NotServed(LookupError):
    """An operation this index does not serve (a sharded index: the routes that read the
    index's arrays in one process; HTTP 409)."""


class CorruptIndexError(ValueError):
    """The index's files are damaged beyond what recovery repairs by itself (a torn tail of
    the newest WAL segment); nothing was changed. ``bucketsearch repair`` salvages."""


class CorruptLogError(ValueError):
    """A segment is damaged beyond a torn tail: ``path`` and ``offset`` say where."""

    def __init__(self, path, offset: int, detail: str):
        self.path, self.offset, self.detail = Path(path), int(offset), detail
        super().__init__(f"{self.path.name}: corrupt at byte {offset}: {detail}")


class FollowerStopped(CorruptIndexError):
    """A follower found damage in the log the writer committed and stopped following (the
    message says where); it applies nothing more."""


class AppendFailed(OSError):
    """The disk refused a record; the log was restored as it was: nothing was acknowledged."""


class LogFailed(OSError):
    """The log could not be restored after a failed append: it refuses writes (fail-stop)."""


class IndexUnavailable(OSError):
    """The index exists but could not be opened (HTTP 503 with the reason and
    ``Retry-After: retry_after_s``)."""

    retry_after_s = 30  # an index that failed to open: a repair or restart, not seconds away


class JobFailed(RuntimeError):
    """A near-duplicate job stopped on a limit or a bad input (its reason)."""


__all__ = ["AppendFailed", "CorruptIndexError", "CorruptLogError", "DuplicateIdError", "FollowerStopped",
           "IndexUnavailable", "JobFailed", "LogFailed", "NotServed"]
