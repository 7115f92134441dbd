"""The process's worker threads: one pool for query chunks, one for the parts of a build.

Kernels release the GIL, so the parts a build or a search splits its work into run in
parallel on these threads. Each pool is made on first use and reused (threads are not created
per call). Builds have their own pool: a build submits its parts while a search's chunks may
hold every thread of the other, and a part never submits to its own pool, so neither waits on
itself.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from bucketsearch.index._jit import default_threads

_POOLS: dict[str, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def pool(name: str) -> ThreadPoolExecutor:
    """The process-wide pool ``name`` (``"chunk"`` or ``"build"``), ``max(default_threads(),
    2)`` threads."""
    with _LOCK:
        if name not in _POOLS:
            _POOLS[name] = ThreadPoolExecutor(max(default_threads(), 2),
                                              thread_name_prefix=f"bucketsearch-{name}")
        return _POOLS[name]


def run_parts(calls: list) -> list:
    """Run ``calls`` (zero-argument callables, each a GIL-releasing kernel call) in parallel:
    the first on the calling thread, the others on the build pool. Their results, in order;
    the first exception raised by any is raised after all have ended."""
    if len(calls) <= 1:
        return [call() for call in calls]
    futures = [pool("build").submit(call) for call in calls[1:]]
    try:
        first = calls[0]()
    finally:
        rest = [f.exception() for f in futures]  # wait for all of them
    for exc in rest:
        if exc is not None:
            raise exc
    return [first] + [f.result() for f in futures]


def run_lanes(calls: list, threads: int) -> list:
    """Run ``calls`` on at most ``threads`` threads (:func:`run_parts`): lane ``t`` runs calls
    ``t, t + lanes, ...`` one after another. Their results, in the order of ``calls``."""
    lanes = max(1, min(int(threads), len(calls)))
    if lanes == 1:
        return [call() for call in calls]

    def lane(t):
        return [call() for call in calls[t::lanes]]

    done = run_parts([partial(lane, t) for t in range(lanes)])
    out = [None] * len(calls)
    for t, results in enumerate(done):
        out[t::lanes] = results
    return out


def build_threads(threads: int | None) -> int:
    """The threads a build of an index whose ``threads`` setting is ``threads`` uses: the
    setting, or :func:`bucketsearch.index._jit.default_threads` when it is None."""
    return max(1, int(threads) if threads else default_threads())
