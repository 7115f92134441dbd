"""bucketsearch: Hamming-space bucket search over binary codes, its HTTP service, load tester
and evaluation toolkit.

The engine and the HTTP client, imported lazily (``import bucketsearch`` stays cheap)::

    from bucketsearch import HammingIndex, MultiIndex, LinearScan, AutoIndex, make_index
    from bucketsearch import Client, AsyncClient    # a server's API, shaped like the engine

Subpackages: ``bucketsearch.index`` (engine, storage, metrics), ``bucketsearch.app`` (the
FastAPI service), ``bucketsearch.loadtest`` (the load tester). The distribution installs
nothing else at the top level.
"""
from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bucketsearch")
except PackageNotFoundError:  # a source tree that was not installed
    __version__ = "0+unknown"

_LAZY = {
    "HammingIndex": "bucketsearch.index.probe",
    "SearchStats": "bucketsearch.index.probe",
    "MultiIndex": "bucketsearch.index.mih",
    "LinearScan": "bucketsearch.index.scan",
    "AutoIndex": "bucketsearch.index.planner",
    "make_index": "bucketsearch.index.factory",
    "Client": "bucketsearch.loadtest.client",
    "AsyncClient": "bucketsearch.loadtest.client",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bucketsearch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
