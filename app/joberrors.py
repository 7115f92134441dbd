"""The errors of near-duplicate jobs (app/jobs.py, app/shardjobs.py), in a module of their own so
that the sharded job's coordinator raises them without importing the job manager."""
from __future__ import annotations


class JobNotFound(LookupError):
    """No job of that id (404)."""


class JobConflict(LookupError):
    """A job limit or a job in the wrong state for the request (409)."""


class JobFailed(RuntimeError):
    """A job stopped on a limit or a bad input (its reason)."""


__all__ = ["JobConflict", "JobFailed", "JobNotFound"]
