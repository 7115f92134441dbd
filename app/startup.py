"""Startup work, off the event loop: load every index, compile and warm every search path,
calibrate t0; ``/readyz`` turns 200 only after all of it."""
from __future__ import annotations

import logging

import numpy as np
from fastapi import FastAPI

from app.costfit import calibrate
from app.registry import Registry
from app.settings import Settings

log = logging.getLogger("bucketsearch.app")


def warm_up(registry: Registry, settings: Settings) -> None:
    """Compile every search kernel (tiny indexes), touch every loaded index, calibrate t0."""
    from index.probe import HammingIndex
    from index.scan import LinearScan

    from index.mih import MultiIndex

    # multi-index hashing is also one of the planner's paths
    engines = [HammingIndex, LinearScan, lambda bits: MultiIndex(bits, substrings=2)]
    codes = np.array([[0], [1], [3]], dtype=np.uint64)
    for make in engines:
        idx = make(64)
        idx.add(codes, ids=np.arange(3))
        for stats in (False, True):
            idx.range_search(codes, 1, stats=stats)
            idx.search(codes, 1, stats=stats)
    for entry in list(registry.entries.values()):
        state = entry.live.state
        if state.main.ntotal:
            q = np.asarray(state.main.words[:1])
            entry.live.range_search(q, 0, stats=True)
            entry.live.search(q, 1, stats=True)
        if settings.calibration_queries:
            radius = min(settings.calibration_radius, entry.bits)
            if state.main.probe_count(radius) <= state.main.max_probes:
                calibrate(entry.live, entry.cost, settings.calibration_queries, radius)


def start_up(app: FastAPI) -> None:
    """Load every index, then warm up; runs in a thread so /healthz answers meanwhile."""
    settings: Settings = app.state.settings
    try:
        app.state.startup_detail = "loading indexes"
        app.state.registry.load_all()
        if settings.warmup:
            app.state.startup_detail = "compiling and warming up search kernels"
            warm_up(app.state.registry, settings)
        app.state.startup_detail = None
        app.state.ready = True
    except Exception as exc:  # stays not-ready; /readyz reports why
        log.exception("startup failed")
        app.state.startup_detail = f"startup failed: {type(exc).__name__}: {exc}"
