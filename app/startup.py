"""Startup work, off the event loop: load every index, compile every kernel a request can reach,
calibrate t0; ``/readyz`` turns 200 only after all of it ("ready means warm").

Numba compiles a kernel once per type signature: dtype, layout and read-only-ness of every array
argument. So the warm-up does not call kernels one by one; it sends every kind of request
through the same code the server runs, on tiny live indexes (:func:`warm_kernels`): each mode,
codes of one word (direct-addressed and hashed tables) and of several words, an empty index, a
delta only, a main table only and main + delta + tombstones, radius and k-NN with stats on and
off, both result writers, the t0 calibration and every relevance form of the evaluation. With
``mmap`` the main tables are memory-mapped snapshots, read-only arrays, as the server has them.
``tests/test_warmup.py`` checks that no request compiles anything after ready.

After ready, :func:`collapse_pages` makes the memory the snapshots were read into huge pages, on
a thread of its own. Each phase is logged with its time on the ``bucketsearch.app`` logger
(shown in the uvicorn log, see :func:`route_logs`). ``python -m bucketsearch.app.startup
--warm [--mmap]`` runs the warm-up alone: the Docker build runs it to fill the numba cache
(``NUMBA_CACHE_DIR``).
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("bucketsearch.app")

#: direct-addressed table (Q <= 16), one hashed word, several words
WARM_BITS = (16, 64, 128)
#: items per warm-up index: its first merge (half of them) builds the multi-index's 8-bit
#: substring tables by counting sort (2^8 <= mih_tables.COUNTING_MAX_FACTOR x 64), as a larger
#: index's merge does
WARM_ITEMS = 128
#: queries per warm-up search: as many as ``bucketsearch.index.probe.PARALLEL_MIN_QUERIES``, so the
#: chunks run on the pool threads too
WARM_QUERIES = 16
WARM_MAX_PROBES = 256


# ---------------------------------------------------------------------------------- logging
def route_logs() -> None:
    """Make the INFO lines of the ``bucketsearch`` loggers reach the server log.

    uvicorn configures only its own loggers, so with nothing else set up an INFO record of
    ``bucketsearch.app`` is dropped (Python's last-resort handler prints warnings and up). When
    no handler would print them, the ``bucketsearch`` logger gets one on stderr in uvicorn's
    format, at uvicorn's level (``--log-level``), INFO without uvicorn. A logging configuration
    of the user (any handler on the way to the root logger) is left alone.
    """
    logger = logging.getLogger("bucketsearch")
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler()
    try:
        from uvicorn.logging import DefaultFormatter
        handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s"))
    except ImportError:  # pragma: no cover -- uvicorn is a dependency
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        uvicorn_logger = logging.getLogger("uvicorn.error")
        configured = logging.getLogger("uvicorn").handlers or uvicorn_logger.handlers
        logger.setLevel(uvicorn_logger.getEffectiveLevel() if configured else logging.INFO)


# ---------------------------------------------------------------------------------- warm-up
def _codes(bits: int, n: int, seed: int) -> np.ndarray:
    """Clustered codes (so every radius finds items and buckets hold several), as words."""
    from bucketsearch.index.codes import pack_bits
    rng = np.random.default_rng(seed)
    centers = rng.integers(0, 2, size=(4, bits), dtype=np.uint8)
    rows = centers[rng.integers(0, len(centers), size=n)]
    flips = rng.random(rows.shape) < 2.0 / bits
    return pack_bits(rows ^ flips.astype(np.uint8))


def _search_every_way(live, xq: np.ndarray) -> None:
    """Radius, k-NN and top-k-within-a-radius searches as the search endpoint runs them, stats
    on and off, with the probe guard lowered (k-NN then ranks by a scan) and k above the item
    count, each answer written as JSON and binary; then the index's info."""
    from bucketsearch.app.encode import knn_to_csr, results_binary, results_json
    from bucketsearch.index.handle import ProbeLimitError
    for stats in (False, True):
        for radius, max_probes in ((1, None), (0, 1), (2, 1)):
            try:  # radius 2 under a 1-probe guard: auto plans its scan (a restored
                # calibration times no scan at load); the probing modes refuse it
                lims, D, I, _ = live.range_search(xq, radius, stats=stats, max_probes=max_probes)
            except ProbeLimitError:
                continue
            results_json(lims, D, I)
            results_binary(lims, D, I)
        for k, max_probes, max_distance in ((3, None, None), (3, 1, None),
                                            (2 * WARM_ITEMS, None, None), (3, None, 1)):
            D, I, _ = live.search(xq, k, max_distance=max_distance, stats=stats,
                                  max_probes=max_probes)
            lims, D, I = knn_to_csr(D, I)
            results_json(lims, D, I)
            results_binary(lims, D, I)
    live.info()  # the index route: sizes, the bucket-size histogram


def _evaluate_every_way(live, xq: np.ndarray) -> None:
    """The evaluation as the evaluate endpoint runs it, with every relevance form: class ids of
    each integer width the histogram kernel narrows them to, multi-hot labels, relevant ids;
    graded and not, with and without a measured cost."""
    from bucketsearch.index.metrics import relevance as rel
    from bucketsearch.index.metrics import evaluate

    xb = live.items()[1]
    nq, nb = len(xq), len(xb)
    q_class, b_class = np.arange(nq) % 3, np.arange(nb) % 3
    relevances = [rel.from_labels(q_class * scale, b_class * scale)
                  for scale in (1, 2**20, 2**40)]  # int16, int32, int64 class ids
    eye = np.eye(3, dtype=np.int64)
    relevances.append(rel.from_labels(eye[q_class], eye[b_class]))  # multi-hot
    pairs = np.array([(q, q % nb) for q in range(nq)], dtype=np.int64)
    relevances.append(rel.from_pairs(pairs, nq, nb))  # relevant ids
    measured = np.cumsum(np.ones(live.bits + 1))
    for relevance in relevances:
        for graded in (False, True):
            evaluate(xb, xq, relevance, bits=live.bits, radius_max=2, ks=(1, 5),
                     graded=graded, measured_cost=measured if graded else None)


def _warm_live(directory: Path, bits: int, mode: str, mmap: bool, evaluate: bool) -> None:
    """One tiny live index taken through every state, searched every way in each; then the t0
    calibration and (``evaluate``) the evaluation."""
    from bucketsearch.app.costfit import CostTracker, calibrate
    from bucketsearch.index.storage.live import LiveIndex

    words = _codes(bits, WARM_ITEMS, seed=bits)
    xq = np.ascontiguousarray(words[:WARM_QUERIES])
    half = WARM_ITEMS // 2
    # a low probe guard keeps the planner's calibration (at every merge of an "auto" index)
    # to radius 1 or 2: the same kernels, a fraction of the time
    live = LiveIndex(directory, bits, mode, max_probes=WARM_MAX_PROBES, merge_threshold=10**9,
                     mmap=mmap, background_merge=False)
    try:
        _search_every_way(live, xq)  # empty
        live.add(words[:half], np.arange(half))
        _search_every_way(live, xq)  # a delta only
        live.merge()
        _search_every_way(live, xq)  # a main table only (a memory-mapped snapshot with mmap)
        live.add(words[half:], np.arange(half, WARM_ITEMS))
        live.delete(np.array([0, 1, half]))
        _search_every_way(live, xq)  # main + delta + tombstones
        calibrate(live, CostTracker(bits), 8, 1)  # the t0 fit (start-up and endpoint)
        if evaluate:
            _evaluate_every_way(live, xq)
    finally:
        live.close()


def warm_kernels(mmap: bool = False, modes=None, bit_lengths=WARM_BITS) -> int:
    """Compile (or load from the numba cache) every kernel a request can reach: every kind of
    request on tiny live indexes in a temporary directory, for each mode and code length, with
    in-memory main tables and, with ``mmap``, memory-mapped (read-only) ones too. Returns the
    number of compiled kernel signatures. ``modes``: default every mode a server may hold."""
    from bucketsearch.index.factory import SERVED_MODES

    first = True  # the evaluation sees copies of the codes: once is enough
    with tempfile.TemporaryDirectory(prefix="bucketsearch-warmup-", dir=_scratch_dir()) as tmp:
        for use_mmap in (False, True) if mmap else (False,):
            for mode in modes or SERVED_MODES:
                for bits in bit_lengths:
                    _warm_live(Path(tmp) / f"{mode}-{bits}-{int(use_mmap)}", bits, mode,
                               use_mmap, evaluate=first)
                    first = False
    return compiled_signature_count()


def _scratch_dir() -> str | None:
    """A tmpfs when there is one: the warm-up's writes, merges and snapshots make some 600
    fsyncs, free there and up to seconds on a disk; else the default temporary directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


#: Modules whose numba kernels a request can reach.
KERNEL_MODULES = ("bucketsearch.app.", "bucketsearch.index.")


def compiled_signatures() -> dict[str, set[str]]:
    """``{module.function: {signature, ...}}`` of every numba kernel defined in a loaded
    :data:`KERNEL_MODULES` module."""
    import sys

    from numba.core.dispatcher import Dispatcher
    out = {}
    for name, module in list(sys.modules.items()):
        if name.startswith(KERNEL_MODULES):
            for obj in list(vars(module).values()):
                if isinstance(obj, Dispatcher) and obj.py_func.__module__ == name:
                    out[f"{name}.{obj.py_func.__name__}"] = {str(s) for s in obj.signatures}
    return out


def compiled_signature_count() -> int:
    """Compiled signatures of every kernel of :func:`compiled_signatures`."""
    return sum(len(sigs) for sigs in compiled_signatures().values())


def _cache_dir() -> str:
    from numba.core.config import CACHE_DIR
    return CACHE_DIR or "__pycache__ next to the sources"


def warm_index(entry, settings) -> None:
    """Touch one loaded index (a memory-mapped snapshot's pages are read in) and calibrate its
    t0 (:func:`bucketsearch.app.costfit.calibrate`); one log line."""
    from bucketsearch.app.costfit import calibrate

    t = time.perf_counter()
    live = entry.live
    live.warm()
    if live.shards:  # its shards loaded their kernels; t0 not calibrated
        log.info("warm-up: sharded index %s (%d items, %d shards) in %.2f s", entry.name,
                 live.ntotal, live.shards, time.perf_counter() - t)
        return
    radius = min(settings.calibration_radius, entry.bits)
    single = live.paper_engine()
    if not settings.calibration_queries:
        note = "not calibrated (BUCKETSEARCH_CALIBRATION_QUERIES=0)"
    elif single is not None and single.probe_count(radius) > single.max_probes:
        note = f"not calibrated (radius {radius} is over the probe guard)"
    else:
        calibrate(live, entry.cost, settings.calibration_queries, radius)
        cal = entry.cost.calibration
        note = (f"t0 [{cal['estimator']}] {cal['verdict']} from "
                f"{settings.calibration_queries} queries at radius {radius} and below"
                if cal.get("t0_ns") is not None else f"t0 not calibrated: {cal['reason']}")
    log.info("calibration: index %s (%d items): %s in %.2f s", entry.name, live.ntotal, note,
             time.perf_counter() - t)


def warm_up(registry, settings) -> None:
    """Compile every kernel (:func:`warm_kernels`), then touch and calibrate every loaded index
    (:func:`warm_index`; a failure stays with its index); each phase logged."""
    t = time.perf_counter()
    signatures = warm_kernels(mmap=settings.mmap)
    log.info("warm-up: %d kernel signatures compiled or loaded from the numba cache (%s) in "
             "%.2f s", signatures, _cache_dir(), time.perf_counter() - t)
    entries = list(registry.entries.values())
    t = time.perf_counter()
    for entry in entries:
        try:
            warm_index(entry, settings)
        except Exception:  # noqa: BLE001 -- the other indexes still serve
            log.exception("index %s: warm-up search or calibration failed", entry.name)
    if entries:
        log.info("calibration: %d indexes in %.2f s", len(entries), time.perf_counter() - t)


def collapse_pages(app) -> None:
    """After ready, while the server is up: the memory the snapshots were read into made into
    huge pages (:func:`bucketsearch.index.disk.fsio.collapse_to_huge_pages`: read without them
    a restart is seconds faster at 100M; searches are faster with them); one log line."""
    from bucketsearch.index.disk.fsio import collapse_to_huge_pages

    t = time.perf_counter()
    done = collapse_to_huge_pages(keep_going=lambda: app.state.ready)
    if done:
        log.info("memory: %.2f GiB of the loaded snapshots made into huge pages in %.2f s",
                 done / 2**30, time.perf_counter() - t)


def start_up(app) -> None:
    """Load every index, then warm up; runs in a thread so /healthz answers meanwhile."""
    route_logs()
    settings = app.state.settings
    registry = app.state.registry
    t_start = time.perf_counter()
    try:
        app.state.startup_detail = "loading indexes"
        t = time.perf_counter()
        registry.load_all()
        unavailable = len(registry.unavailable)  # each one logged by the registry
        log.info("loading indexes: %d loaded (%d items)%s in %.2f s", len(registry.entries),
                 sum(e.live.ntotal for e in list(registry.entries.values())),
                 f", {unavailable} unavailable" if unavailable else "",
                 time.perf_counter() - t)
        if settings.warmup:
            app.state.startup_detail = "compiling and warming up search kernels"
            warm_up(registry, settings)
        else:
            log.warning("warm-up disabled (BUCKETSEARCH_WARMUP=0): first requests compile "
                        "kernels")
        jobs = getattr(app.state, "jobs", None)
        if jobs is not None:  # near-duplicate jobs: resume the ones a stop interrupted
            jobs.load(registry)
        app.state.startup_detail = None
        app.state.ready = True
        log.info("ready in %.2f s", time.perf_counter() - t_start)
        threading.Thread(target=collapse_pages, args=(app,), name="bucketsearch-huge-pages",
                         daemon=True).start()
    except Exception as exc:  # stays not-ready; /readyz reports why
        log.exception("startup failed")
        app.state.startup_detail = f"startup failed: {type(exc).__name__}: {exc}"


def main(argv=None) -> int:
    """``python -m bucketsearch.app.startup --warm [--mmap]``: fill the numba cache (the Docker
    build step)."""
    parser = argparse.ArgumentParser(prog="python -m bucketsearch.app.startup",
                                     description=main.__doc__)
    parser.add_argument("--warm", action="store_true", required=True,
                        help="compile every kernel a request can reach (into NUMBA_CACHE_DIR)")
    parser.add_argument("--mmap", action="store_true",
                        help="also the read-only (memory-mapped snapshot) signatures")
    args = parser.parse_args(argv)
    route_logs()
    t = time.perf_counter()
    signatures = warm_kernels(mmap=args.mmap)
    log.info("warm-up: %d kernel signatures in the numba cache (%s) in %.2f s", signatures,
             _cache_dir(), time.perf_counter() - t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
