"""Errors the index layer raises to whoever serves it (the server maps them to HTTP), in a module
of their own at the engines' floor so that the storage and the cluster packages raise them
without importing each other or the server."""
from __future__ import annotations


class IndexUnavailable(OSError):
    """The index exists but could not be opened (HTTP 503 with the reason and
    ``Retry-After: retry_after_s``)."""

    retry_after_s = 30  # an index that failed to open: a repair or restart, not seconds away


class JobFailed(RuntimeError):
    """A near-duplicate job stopped on a limit or a bad input (its reason)."""


__all__ = ["IndexUnavailable", "JobFailed"]
