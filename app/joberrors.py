"""The errors of near-duplicate jobs (app/jobs.py; ``JobFailed`` is the index's, raised by the
sharded job's coordinator index/cluster/shardjobs.py too)."""
from __future__ import annotations

from bucketsearch.index.errors import JobFailed


class JobNotFound(LookupError):
    """No job of that id (404)."""


class JobConflict(LookupError):
    """A job limit or a job in the wrong state for the request (409)."""


__all__ = ["JobConflict", "JobFailed", "JobNotFound"]
