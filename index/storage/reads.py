"""The read path of one live state: radius search and k-NN over the main index minus the
tombstones plus the delta segment (:class:`~bucketsearch.index.storage.state.LiveState`'s
``range_search`` and ``search`` call these).

Both engines' answers come ordered by (distance, id) per query (CSR ``lims, D, I``, or
``(nq, k)`` rows padded with id -1), and are merged without sorting again by
:func:`merge_results` (the compiled :func:`bucketsearch.index.kernels.merge_rows`); the
delta's linear scan has no buckets, so it is timed apart (``st.delta_items``,
``st.delta_ns``). Nothing here writes: a state is immutable.
"""
from __future__ import annotations

import copy
import time

import numpy as np

from bucketsearch.index.kernels import merge_rows, rows_done
from bucketsearch.index.probe import ResultLimitError

_EMPTY_IDS = np.empty(0, dtype=np.int64)


def with_probe_limit(main, limit: int | None):
    """``main`` itself, or a shallow copy sharing its arrays with a lower ``max_probes``."""
    if limit is None or limit >= main.max_probes:
        return main
    view = copy.copy(main)
    for child in ("single", "mih"):  # the planner's engines: copy them too, never mutate shared
        if hasattr(view, child):
            setattr(view, child, copy.copy(getattr(view, child)))
    view.max_probes = max(int(limit), 1)
    return view


def _lims(counts: np.ndarray) -> np.ndarray:
    lims = np.zeros(len(counts) + 1, dtype=np.int64)
    np.add.accumulate(counts, out=lims[1:])  # (np.cumsum: ~1 us more a call)
    return lims


def _row_lims(nq: int, width: int) -> np.ndarray:
    """CSR ``lims`` of ``(nq, width)`` rows read as flat arrays."""
    return np.arange(nq + 1, dtype=np.int64) * width


def merge_results(nq: int, main: tuple, delta: tuple, tombstones: np.ndarray, k: int = -1):
    """Main-table results minus the tombstoned ids, merged with the delta's, both already
    ordered by (distance, id) per query (CSR ``(lims, D, I)``, padding id -1 skipped) by
    :func:`bucketsearch.index.kernels.merge_rows`: nothing is sorted again. ``k < 0``: CSR ``(lims, D,
    I)``; ``k >= 1``: ``(D, I)`` of shape ``(nq, k)`` padded with -1."""
    counts, D, I = merge_rows(*main, *delta, tombstones, k)
    if k < 0:
        return _lims(counts), D, I
    return D.reshape(nq, k), I.reshape(nq, k)


def _empty_csr(nq: int) -> tuple:
    return np.zeros(nq + 1, dtype=np.int64), np.empty(0, np.int32), _EMPTY_IDS


def range_search(state, xq: np.ndarray, radius: int, stats: bool = False,
                 max_probes: int | None = None, max_results: int | None = None):
    """``lims, D, I, main_stats``: radius search of ``state`` (a :class:`LiveState`) over main
    minus tombstones plus delta.

    ``max_results`` caps the live results of the batch (``ResultLimitError``, raised while
    searching): the main index is capped at ``max_results + len(tombstones)`` (at most that
    many of its results are dropped), the delta scan at what the main index left."""
    nq = len(xq)
    main = with_probe_limit(state.main, max_probes)
    if state.delta is None and not len(state.tombstones):  # fast path: the main table only
        res = main.range_search(xq, radius, stats=stats, max_results=max_results)
        return (*res[:3], res[3] if stats else None)
    st = None
    main_res = _empty_csr(nq)
    if stats or state.main.ntotal:
        try:
            res = main.range_search(xq, radius, stats=stats, max_results=None
                                    if max_results is None
                                    else max_results + len(state.tombstones))
        except ResultLimitError as exc:
            raise ResultLimitError(max_results, exc.reached - len(state.tombstones)) \
                from None
        main_res = res[:3]
        st = res[3] if stats else None
    else:  # nothing to probe, but the same refusal as when there is (no queries: cheap)
        main.range_search(xq[:0], radius)
    found = len(main_res[2])  # live results of the main index
    if max_results is not None and len(state.tombstones) and found:
        found -= int(np.isin(main_res[2], state.tombstones).sum())
        if found > max_results:
            raise ResultLimitError(max_results, found)
    delta_res = _empty_csr(nq)
    if state.delta is not None:
        t = time.perf_counter_ns()
        try:
            delta_res = state.delta.range_search(
                xq, radius, max_results=None if max_results is None else max_results - found)
        except ResultLimitError as exc:
            raise ResultLimitError(max_results, found + exc.reached) from None
        _note_delta(state, st, time.perf_counter_ns() - t)
    return (*merge_results(nq, main_res, delta_res, state.tombstones), st)


def _note_delta(state, st, scan_ns: int) -> None:
    """Record the delta's linear scan on the stats: it has no buckets, so it is not in the
    per-radius counters; ``delta_items`` items were scanned per query in ``delta_ns`` (the
    whole batch, wall clock)."""
    if st is not None:
        st.delta_items, st.delta_ns = len(state.delta_ids), int(scan_ns)


def knn(state, xq: np.ndarray, k: int, max_distance: int | None = None,
        stats: bool = False, max_probes: int | None = None):
    """``D, I, main_stats``: the k nearest by (distance, id) (within ``max_distance`` when
    given), padded with id -1 and distance -1.

    Tombstones hide main-index items only: an id deleted and inserted again lives in the
    delta. The delta is scanned first; when it holds k items within distance ``b`` of a
    query, the main table only needs its k nearest within ``b`` for that query (the union's
    k nearest are within ``b``). A query whose k nearest in the main table include
    tombstones is searched again with twice the k until k live items are found (or every
    item within the radius was returned). Main and delta rows, each ordered by (distance,
    id) by its kernel, are merged without sorting again (:func:`merge_results`).
    """
    nq = len(xq)
    main = with_probe_limit(state.main, max_probes)
    if state.delta is None and not len(state.tombstones) and main.ntotal >= k:
        # fast path: the main index only (~30 us less a one-query search)
        res = main.search(xq, k, max_distance=max_distance, stats=stats)
        return res[0], res[1], res[2] if stats else None
    R = state.bits if max_distance is None else int(max_distance)
    delta_rows = (_row_lims(nq, 0), np.empty(0, np.int32), _EMPTY_IDS)
    groups = [(None, R)]  # (queries or None: all, the radius their main search needs)
    delta_ns = 0
    if state.delta is not None:
        kd = min(k, len(state.delta_ids))
        t = time.perf_counter_ns()
        Dd, Id = state.delta.search(xq, kd, max_distance=R)
        delta_ns = time.perf_counter_ns() - t
        delta_rows = (_row_lims(nq, kd), Dd.ravel(), Id.ravel())
        if kd == k and nq == 1:  # (np.where and np.unique: ~5 us of a one-query search)
            b = int(Dd[0, k - 1])
            groups = [(None, b if b >= 0 else R)]
        elif kd == k:  # a row padded with -1 (fewer than k within R) keeps the bound R
            bound = np.where(Dd[:, k - 1] >= 0, Dd[:, k - 1], R)
            groups = [(np.flatnonzero(bound == b), int(b)) for b in np.unique(bound)]
    parts = []  # (queries or None: all, D, I, stats)
    if main.ntotal:
        for todo, b in groups:
            kk = min(k, main.ntotal)
            while todo is None or len(todo):
                res = main.search(xq if todo is None else xq[todo], kk, max_distance=b,
                                  stats=stats)
                D, I = res[0], res[1]
                done = rows_done(I, state.tombstones, k, kk >= main.ntotal)
                if done.all():
                    parts.append((todo, D, I, res[2] if stats else None))
                    break
                sel = np.flatnonzero(done) if todo is None else todo[done]
                parts.append((sel, D[done], I[done], res[2].rows(done) if stats else None))
                todo = np.flatnonzero(~done) if todo is None else todo[~done]
                kk = min(2 * kk, main.ntotal)
    if len(parts) == 1 and parts[0][0] is None:  # every query done in one search
        Dm, Im = parts[0][1], parts[0][2]
    else:
        width = max((p[1].shape[1] for p in parts), default=0)
        Dm = np.full((nq, width), -1, dtype=np.int32)
        Im = np.full((nq, width), -1, dtype=np.int64)
        for sel, D, I, _ in parts:
            Dm[sel, :D.shape[1]] = D
            Im[sel, :I.shape[1]] = I
    D_out, I_out = merge_results(nq, (_row_lims(nq, Dm.shape[1]), Dm.ravel(), Im.ravel()),
                                 delta_rows, state.tombstones, k)
    st = None
    if stats and parts:
        st = parts[0][3] if parts[0][0] is None else _assemble_stats(
            nq, [(sel, part_st) for sel, _, _, part_st in parts])
    if state.delta is not None:
        _note_delta(state, st, delta_ns)
    return D_out, I_out, st


def _assemble_stats(nq: int, st_parts):
    """Per-query stats from several partial searches, back in query order (missing rows are 0):
    every field of :class:`~bucketsearch.index.base.SearchStats` is kept."""
    sel = np.concatenate([s for s, _ in st_parts])
    return type(st_parts[0][1]).concat([p for _, p in st_parts]).scatter(nq, sel)
