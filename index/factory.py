"""One factory: which engine serves which mode, how it is validated, and how any snapshot loads.

Mode names are the engines' :attr:`kind`:

    "single"  HammingIndex   single-table bucket search (hash lookup)
    "mih"     MultiIndex     multi-index hashing over substring tables
    "auto"    AutoIndex      the planner: cheapest of single / mih / scan per batch
    "scan"    LinearScan     popcount linear scan (engine only; not a served mode)

Validation is the engine constructor's own (``substrings`` for MIH, ``max_probes``, ...), so
a mode that a caller accepts is always a mode the engine can build. Snapshots are loaded by
the class their manifest names; :mod:`bucketsearch.index.storage.store` itself knows no engine.
"""
from __future__ import annotations

from bucketsearch.index.mih import MultiIndex
from bucketsearch.index.planner import AutoIndex
from bucketsearch.index.probe import DEFAULT_MAX_PROBES, HammingIndex
from bucketsearch.index.scan import LinearScan
from bucketsearch.index.disk.store import load_arrays

ENGINES = {cls.kind: cls for cls in (HammingIndex, MultiIndex, AutoIndex, LinearScan)}
MODES = tuple(ENGINES)
#: Modes a served (live) index can have.
SERVED_MODES = ("single", "mih", "auto")
_BY_KIND = {kind: cls for cls in ENGINES.values() for kind in (cls.kind, *cls.legacy_kinds)}


def make_index(bits: int, mode: str = "single", substrings: int | None = None,
               max_probes: int = DEFAULT_MAX_PROBES, **options):
    """An empty index of ``mode`` (see the module docstring); ``options`` go to AutoIndex.

    Raises ValueError/TypeError naming the field for a bad mode, bits, substrings (MIH: every
    substring fits 64 bits, so at least ceil(bits/64)), max_probes or option."""
    if mode not in ENGINES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if substrings is not None and mode not in ("mih", "auto"):
        raise ValueError(f"substrings applies to mode 'mih' or 'auto' only, got mode {mode!r}")
    if options and mode != "auto":
        raise ValueError(f"options {sorted(options)} apply to mode 'auto' only, got {mode!r}")
    if mode == "single":
        return HammingIndex(bits, max_probes=max_probes)
    if mode == "mih":
        return MultiIndex(bits, substrings=substrings, max_probes=max_probes)
    if mode == "auto":
        return AutoIndex(bits, substrings=substrings, max_probes=max_probes, **options)
    return LinearScan(bits)


def check_served_mode(mode: str, bits: int, substrings: int | None,
                      max_probes: int = DEFAULT_MAX_PROBES) -> None:
    """Validate a served index's configuration by building its (empty) engine."""
    if mode not in SERVED_MODES:
        raise ValueError(f"mode must be one of {', '.join(SERVED_MODES)}, got {mode!r}")
    make_index(bits, mode, substrings=substrings, max_probes=max_probes,
               **({"calibrate_on_build": False} if mode == "auto" else {}))


def load_index(path, mmap: bool = False, expected_kind: str | None = None):
    """Load any engine's snapshot (written by its ``save``), checking every checksum."""
    kind, meta, arrays = load_arrays(path, mmap=mmap)
    return index_from_arrays(path, kind, meta, arrays, expected_kind)


def index_from_arrays(path, kind: str, meta: dict, arrays: dict,
                      expected_kind: str | None = None):
    """The engine of a snapshot already read (:func:`~bucketsearch.index.storage.store.
    load_arrays` of ``path``): the class ``kind`` names, ``expected_kind``'s if given."""
    cls = _BY_KIND.get(kind)
    if cls is None:
        raise ValueError(f"{path}: unknown index kind {kind!r}, allowed: {', '.join(MODES)}")
    if expected_kind is not None and cls is not _BY_KIND.get(expected_kind):
        raise ValueError(f"{path}: holds a {cls.kind!r} index, not {expected_kind!r}")
    return cls.from_checked_snapshot(path, kind, meta, arrays)
