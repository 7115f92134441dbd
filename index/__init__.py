"""The engine, storage and evaluation of bucketsearch (installed as ``bucketsearch.index``).

The engine classes are imported lazily (``import bucketsearch.index`` stays cheap), through
the same table as the top-level package::

    from bucketsearch.index import HammingIndex, MultiIndex, LinearScan, AutoIndex, make_index

(From a source checkout, ``from index import ...`` gives the same objects.)
"""
from __future__ import annotations

import bucketsearch
from bucketsearch import _LAZY

_ENGINE = [name for name, module in _LAZY.items() if module.startswith("bucketsearch.index.")]
__all__ = list(_ENGINE)


def __getattr__(name: str):
    if name not in _ENGINE:
        raise AttributeError(f"module 'bucketsearch.index' has no attribute {name!r}")
    return getattr(bucketsearch, name)


def __dir__():
    return sorted(__all__)
