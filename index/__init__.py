"""The engine, storage and evaluation of bucketsearch (installed as ``bucketsearch.index``).

Imported lazily, so ``import bucketsearch.index`` stays cheap::

    from bucketsearch.index import HammingIndex, MultiIndex, LinearScan, AutoIndex, make_index

(From a source checkout, ``from index import ...`` gives the same objects.)
"""
from __future__ import annotations

import importlib

_LAZY = {
    "HammingIndex": "bucketsearch.index.probe",
    "SearchStats": "bucketsearch.index.probe",
    "MultiIndex": "bucketsearch.index.mih",
    "LinearScan": "bucketsearch.index.scan",
    "AutoIndex": "bucketsearch.index.planner",
    "make_index": "bucketsearch.index.factory",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
