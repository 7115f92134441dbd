"""The engine, storage and evaluation of bucketsearch (installed as ``bucketsearch.index``).

The engine classes are imported lazily (``import bucketsearch.index`` stays cheap), through
the same table as the top-level package::

    from bucketsearch.index import HammingIndex, MultiIndex, LinearScan, AutoIndex, make_index

(From a source checkout, ``from index import ...`` gives the same objects.)
"""
from __future__ import annotations

from bucketsearch import _LAZY, __getattr__  # noqa: F401  (module-level __getattr__)

__all__ = list(_LAZY)


def __dir__():
    return sorted(__all__)
