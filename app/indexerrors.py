"""The errors of the index registry (:mod:`bucketsearch.app.registry`), in a module of their
own so the modules the registry opens (the sharded index, its shard actors) raise them without
importing the registry: no import circle."""
from __future__ import annotations

from bucketsearch.index.errors import IndexUnavailable, NotServed  # noqa: F401 -- raised by the index


class IndexNotFound(LookupError):
    def __init__(self, name: str):
        super().__init__(f"index {name!r} not found")


class SnapshotNotFound(LookupError):
    """A snapshot name that the index does not hold (404)."""


class IndexExists(LookupError):
    def __init__(self, name: str, existing: str):
        same = "" if name == existing else f" (as {existing!r}: names are unique regardless " \
                                             "of case)"
        super().__init__(f"name: index {name!r} already exists{same}; delete it first or pick "
                         "another name")


class IndexLimit(LookupError):
    """The server holds ``max_indexes`` indexes already (HTTP 409)."""


class NotOnShards(NotServed):
    """A route that reads an index's arrays in this process, asked of a sharded index (409)."""


def require_in_process(entry, what: str) -> None:
    """Raise :class:`NotOnShards` when ``entry`` is split over shard actors (the handle's
    ``shards``)."""
    if entry.live.shards:
        raise NotOnShards(f"{what}: not available for index {entry.name!r}, which is split over "
                          f"{entry.live.shards} shards ({what} reads the index's arrays in one "
                          "process; docs/scale-out.md lists what a sharded index serves)")

