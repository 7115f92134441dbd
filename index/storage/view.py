"""The reads of one live state: what the service may ask of it (the
:class:`~bucketsearch.index.handle.IndexView` of a live index).

A :class:`LiveView` holds one immutable :class:`~bucketsearch.index.storage.state.LiveState`:
a request that reads several times (the budget check, the search, the audit of its answer)
reads that one state, never half of a write. Each figure the service shows is computed here
once: the live items (main minus tombstones, then the delta: :meth:`LiveState.items`), a
uniform sample of them, the bucket sizes (:func:`bucketsearch.index.budget.bucket_sizes`), the
radius profile, the work a search would do (:mod:`bucketsearch.index.budget`).
"""
from __future__ import annotations

import math

import numpy as np

from bucketsearch.index import budget as work
from bucketsearch.index.base import ResultLimitError
from bucketsearch.index.codes import as_words, n_words, pack_bits
from bucketsearch.index.handle import (DEFAULT_PROFILE_PROBES, DEFAULT_PROFILE_RADIUS, Budget,
                                       RadiusProfile, Sizes, check_k,
                                       check_radius)
from bucketsearch.index.storage.reads import with_probe_limit
from bucketsearch.index.storage.state import LiveState



class LiveReads:
    """Mixin of :class:`~bucketsearch.index.storage.live.LiveIndex`: the reads of the handle
    protocol (:class:`~bucketsearch.index.handle.IndexHandle`), each over the state of the
    moment (``self.state``, swapped by every write); :meth:`view` gives one state to a request
    that reads several times. Its other attributes: ``bits, mode, substrings, merges,
    merging, merge_status, last_merge, last_merge_error, applied, lag_ms``."""

    shards = 0  # one index in this process (the handle's shards and partitioning)
    partitioning = None

    def view(self) -> LiveView:
        """The reads of the current state (one consistent state for every call)."""
        return LiveView(self.state)

    @property
    def ntotal(self) -> int:
        return self.state.ntotal

    def sizes(self) -> Sizes:
        return self.view().sizes()

    def check_radius(self, radius: int) -> None:
        check_radius(radius, self.bits)

    def get(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """The codes of live ``ids`` (one consistent state): ``(found, words)``, ``found`` a
        bool per id and ``words`` its (n, W) uint64 code (zeros where not found)."""
        return self.view().get(ids)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, words)`` of every live item (main minus tombstones, then the delta)."""
        return self.state.items()

    def item_parts(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The live items in place: ``(ids, words, dropped)`` segments (LiveState.item_parts)."""
        return self.state.item_parts()

    def sample(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return self.view().sample(n, seed)

    def query_sample(self, n: int, seed: int) -> np.ndarray:
        return self.view().query_sample(n, seed)

    def range_search(self, xq, radius: int, stats: bool = False,
                     max_probes: int | None = None, max_results: int | None = None,
                     budget: Budget | None = None):
        """Radius search (d <= radius) of one consistent state; ``max_probes`` lowers the
        per-query probe guard for this call only, ``max_results`` caps the batch's results
        (``bucketsearch.index.probe.ResultLimitError``); ``budget``: checked first
        (:meth:`LiveView.range_search`)."""
        return self.view().range_search(xq, radius, stats, max_probes, max_results, budget)

    def search(self, xq, k: int, max_distance: int | None = None, stats: bool = False,
               max_probes: int | None = None, budget: Budget | None = None):
        """The k nearest live items (within ``max_distance`` when given) of one consistent
        state: ``(D, I, stats or None)``, ``(nq, k)`` padded with -1."""
        return self.view().search(xq, k, max_distance, stats, max_probes, budget)

    def range_estimate(self, nq: int, radius: int, cheap: bool = False):
        return self.view().range_estimate(nq, radius, cheap)

    def probe_engine(self):
        return self.view().probe_engine()

    def paper_engine(self):
        return self.view().paper_engine()

    def radius_profile(self, queries: int, max_distance: int | None, seed: int,
                       budget: Budget) -> RadiusProfile:
        return self.view().radius_profile(queries, max_distance, seed, budget)

    def info(self) -> dict:
        """The IndexInfo fields of one state (:meth:`IndexHandle.info`)."""
        view = self.view()
        return {"mode": self.mode,
                "substrings": (view.substrings or self.substrings)
                if self.mode != "single" else None,
                **view.sizes().info(), **view.bucket_info(), "memory_bytes": view.memory_bytes(),
                "merges": self.merges, "merging": self.merging, "merge": self.merge_status,
                "last_merge": self.last_merge, "last_merge_error": self.last_merge_error,
                "applied_lsn": self.applied.lsn, "lag_ms": round(self.lag_ms, 1)}

    def warm(self) -> None:
        """One radius-0 and one 1-NN search with statistics of an item's code (the kernels
        compiled or loaded, a memory-mapped snapshot's pages touched); nothing when empty."""
        view = self.view()
        if view.ntotal:
            q = view.sample(1, 0)[1].copy()  # a copy: queries are never read-only arrays
            view.range_search(q, 0, stats=True)
            view.search(q, 1, stats=True)


class LiveView:
    """One consistent state of a live index, read (see the module docstring). ``state`` is
    for the modules of ``index/`` (the advisor, the join); the service calls methods."""

    def __init__(self, state: LiveState):
        self.state = state
        self.bits = state.bits

    @property
    def ntotal(self) -> int:
        return self.state.ntotal

    @property
    def version(self) -> int:
        """The state's version: one more with every write."""
        return self.state.version

    @property
    def next_id(self) -> int:
        """The first id an insert without ids gets (:attr:`LiveState.next_id`)."""
        return self.state.next_id

    @property
    def substrings(self) -> int | None:
        """The main index's substrings (multi-index hashing and the planner's; None for a
        single table)."""
        return getattr(self.state.main, "substrings", None)

    def sizes(self) -> Sizes:
        st = self.state
        return Sizes(st.ntotal, int(st.main.ntotal), int(len(st.delta_ids)),
                     int(len(st.tombstones)))

    def check_radius(self, radius: int) -> None:
        check_radius(radius, self.bits)

    # ------------------------------------------------------------------------- searches
    def range_search(self, xq, radius: int, stats: bool = False, max_probes: int | None = None,
                     max_results: int | None = None, budget: Budget | None = None):
        """Radius search (d <= radius): :meth:`LiveState.range_search`; with a ``budget``,
        its probes (each query's share, and the batch's), compares and memory are checked
        first (:mod:`bucketsearch.index.budget`) and the batch's results capped at its
        ``max_results``."""
        self.check_radius(radius)
        xq = as_words(xq, self.bits)
        if budget is not None:
            max_probes = self._check_range(len(xq), radius, budget)
            max_results = budget.max_results
        return self.state.range_search(xq, radius, stats, max_probes, max_results)

    def _check_range(self, nq: int, radius: int, budget: Budget) -> int | None:
        """The per-query probe limit a budgeted radius search runs with (None: the engine's
        own guard answers first, before any work too)."""
        main = self.state.main
        return work.check_range(
            nq, radius, budget, main.max_probes, getattr(main, "kind", ""),
            lambda share: with_probe_limit(main, share).probe_count(radius, nq),
            lambda share, _: work.range_work(self.state, with_probe_limit(main, share), nq,
                                             radius, budget.max_results))

    def search(self, xq, k: int, max_distance: int | None = None, stats: bool = False,
               max_probes: int | None = None, budget: Budget | None = None):
        """The k nearest live items (within ``max_distance`` when given):
        :meth:`LiveState.search`; with a ``budget``, its compares and memory checked first and
        its probes shared out as each query's limit (a query past it switches to a scan)."""
        k = check_k(k)
        if max_distance is not None:
            self.check_radius(max_distance)
        xq = as_words(xq, self.bits)
        if budget is not None:
            max_probes = work.check_knn(len(xq), k, budget,
                                        work.knn_work(self.state, len(xq), k, max_distance))
        return self.state.search(xq, k, max_distance, stats, max_probes)

    def range_estimate(self, nq: int, radius: int, cheap: bool = False) -> work.Work | None:
        """The most work of a radius search of ``nq`` queries at the index's own probe guard;
        ``cheap``: None when the largest bucket of this snapshot is not known yet."""
        st = self.state
        answer = work.answer_bound(st, nq, radius, cached_only=cheap)
        if answer is None:
            return None
        scan = work.plan_mode(st.main, radius, nq) == "scan"
        return work.work_of(nq, radius, self.bits, st.main.probe_count(radius, nq), scan,
                            st.main.ntotal, len(st.delta_ids), answer, None)

    # ---------------------------------------------------------------------------- items
    def get(self, ids) -> tuple[np.ndarray, np.ndarray]:
        return self.state.get(np.asarray(ids, dtype=np.int64).reshape(-1))

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        return self.state.items()

    def item_parts(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return self.state.item_parts()

    def sample(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, words)`` of ``min(n, live)`` live items, uniform without replacement: live
        positions of the main index (tombstones skipped) then the delta's, drawn by
        ``default_rng(seed).choice``; only the drawn rows are gathered."""
        st = self.state
        main_ids = np.asarray(st.main.ids, dtype=np.int64)
        main_pos = None  # every position of the main index is live (no array of N made)
        if len(st.tombstones) and len(main_ids):
            main_pos = np.flatnonzero(~np.isin(main_ids, st.tombstones))
        n_main = len(main_ids) if main_pos is None else len(main_pos)
        n_delta = len(st.delta_ids)
        pick = np.random.default_rng(seed).choice(n_main + n_delta,
                                                  size=min(n, n_main + n_delta), replace=False)
        from_main, from_delta = pick[pick < n_main], pick[pick >= n_main] - n_main
        if main_pos is not None:
            from_main = main_pos[from_main]
        width = n_words(self.bits)
        parts = [np.empty((0, width), dtype=np.uint64)]
        if len(from_main):
            parts.append(np.asarray(st.main.words, dtype=np.uint64).reshape(-1, width)[from_main])
        if len(from_delta):
            parts.append(np.asarray(st.delta_words, dtype=np.uint64).reshape(-1, width)[from_delta])
        ids = np.concatenate([main_ids[from_main],
                              np.asarray(st.delta_ids, dtype=np.int64)[from_delta]])
        return ids, np.ascontiguousarray(np.concatenate(parts))

    def query_sample(self, n: int, seed: int) -> np.ndarray:
        """``n`` query words: ``n // 2`` codes of live-or-recent items (main index and delta,
        drawn with replacement), the rest uniform random codes (all ``n`` of an empty
        index)."""
        rng = np.random.default_rng(seed)
        st = self.state
        pool = [np.asarray(st.main.words)] if st.main.ntotal else []
        if len(st.delta_words):
            pool.append(st.delta_words)
        n_random = n if not pool else n // 2
        parts = [pack_bits(rng.integers(0, 2, size=(n_random, self.bits), dtype=np.uint8))]
        if pool:
            words = np.concatenate(pool) if len(pool) > 1 else pool[0]
            parts.append(words[rng.integers(0, len(words), size=n - n_random)])
        return np.ascontiguousarray(np.concatenate(parts))

    # ------------------------------------------------------------------------ the shape
    def bucket_info(self) -> dict:
        """``distinct_codes``, ``code_space_fraction`` (distinct / 2^bits) and
        ``bucket_size_histogram`` (``[{"size", "buckets"}]``: how many distinct codes hold
        that many items of the main index)."""
        counts = work.bucket_size_counts(self.state.main)  # known from the build: no pass
        distinct = int(counts.sum())
        return {"distinct_codes": distinct,
                "code_space_fraction": math.ldexp(distinct, -self.bits),
                "bucket_size_histogram": [{"size": int(v), "buckets": int(counts[v])}
                                          for v in np.flatnonzero(counts)]}

    def memory_bytes(self) -> int:
        """Bytes of the main index's arrays, its id set (and its rows by id once a lookup by
        id built them), the delta's and the tombstones."""
        st = self.state
        by_id = getattr(st.main, "_id_rows", None)
        return int(st.main.memory_bytes() + st.main_ids.nbytes + st.delta_words.nbytes
                   + st.delta_ids.nbytes + st.tombstones.nbytes
                   + (by_id.nbytes if by_id is not None else 0))

    def probe_count(self, radius: int, nq: int = 1, max_probes: int | None = None) -> int:
        """Probes per query of a radius search of ``nq`` queries under ``max_probes`` (mode
        auto: of the plan it would run, 0 for a scan)."""
        return int(with_probe_limit(self.state.main, max_probes).probe_count(radius, nq))

    def probe_engine(self):
        """The table a search probes radius by radius: the main index, or mode auto's single
        table (the buckets of the RAMAP model)."""
        main = self.state.main
        return main.single if getattr(main, "kind", "") == "auto" else main

    def paper_engine(self):
        """The single table the paper's model describes (mode single: the main index; mode
        auto: the planner's), None for multi-index hashing or a scan."""
        engine = self.probe_engine()
        return engine if getattr(engine, "kind", "") == "single" else None

    # ----------------------------------------------------------------- the radius profile
    def default_profile_radius(self, queries: int, max_request_probes: int) -> int:
        """The largest ``r <= DEFAULT_PROFILE_RADIUS`` (and ``<= bits``) whose probes, all
        ``queries`` together, stay within DEFAULT_PROFILE_PROBES and ``max_request_probes``
        and one query's within the engine's guard."""
        engine, r = self.probe_engine(), 0
        limit = min(max_request_probes, DEFAULT_PROFILE_PROBES)
        while r < min(self.bits, DEFAULT_PROFILE_RADIUS) and \
                queries * engine.probe_count(r + 1) <= limit and \
                engine.probe_count(r + 1) <= engine.max_probes:
            r += 1
        return r

    def radius_profile(self, queries: int, max_distance: int | None, seed: int,
                       budget: Budget) -> RadiusProfile:
        """:class:`~bucketsearch.index.handle.RadiusProfile` of ``queries`` sampled queries
        (:meth:`query_sample`) as one radius search of :meth:`probe_engine` with statistics,
        its probes and work checked against ``budget`` first. A ball is empty when no live
        item lies within it: the table's results minus tombstones, and the delta scanned."""
        engine = self.probe_engine()
        if max_distance is None:
            max_distance = self.default_profile_radius(queries, budget.max_request_probes)
        self.check_radius(max_distance)
        per_query = engine.probe_count(max_distance)
        if queries * per_query > budget.max_request_probes:
            raise ValueError(f"max_distance: {queries} queries x {per_query:,} probes (radius "
                             f"{max_distance}) is more than max_request_probes="
                             f"{budget.max_request_probes:,}; use a smaller radius or fewer "
                             "queries")
        work.range_work(self.state, engine, queries, max_distance, budget.max_results).check(
            budget, f"radius-profile: {queries} queries of radius {max_distance}",
            "use fewer queries or a smaller max_distance")
        xq = self.query_sample(queries, seed)
        try:
            lims, D, I, st = engine.range_search(xq, max_distance, stats=True,
                                                 max_results=budget.max_results)
        except ResultLimitError as exc:
            raise ValueError(f"max_distance: radius {max_distance} returns at least "
                             f"{exc.reached:,} ids for {queries} queries, more than "
                             f"max_results={budget.max_results}; use a smaller radius") from None
        empty = self.empty_balls(xq, max_distance, (lims, D, I), budget.max_results)
        return RadiusProfile(max_distance, st, empty, getattr(engine, "kind", ""),
                             int(self.state.main.ntotal), self.ntotal,
                             planner_choices(self.state.main, max_distance))

    def empty_balls(self, xq: np.ndarray, radius: int, main_result: tuple,
                    max_results: int | None = None) -> list[int]:
        """Per r in 0..radius, the queries whose ball ``d <= r`` holds no live item: the main
        table's results (``main_result = lims, D, I``) minus tombstones, and the delta
        segment (its search capped at ``max_results`` ids too)."""
        st = self.state
        first = nearest_distances(*main_result, radius, st.tombstones)
        if st.delta is not None and len(st.delta_ids):
            try:
                lims, D, I = st.delta.range_search(xq, radius, max_results=max_results)[:3]
            except ResultLimitError as exc:
                raise ValueError(f"max_distance: radius {radius} finds at least "
                                 f"{exc.reached:,} recent (delta) items for {len(xq)} queries, "
                                 f"more than max_results={max_results}; use a smaller "
                                 "radius") from None
            first = np.minimum(first, nearest_distances(lims, D, I, radius))
        return [int((first > r).sum()) for r in range(radius + 1)]


def nearest_distances(lims: np.ndarray, D: np.ndarray, I: np.ndarray, radius: int,
                      excluded: np.ndarray | None = None) -> np.ndarray:
    """Per query, the smallest distance among its results whose id is not ``excluded``
    (``radius + 1`` for none)."""
    nq = len(lims) - 1
    first = np.full(nq, radius + 1, dtype=np.int64)
    query = np.repeat(np.arange(nq), np.diff(lims))
    keep = np.ones(len(I), dtype=bool) if excluded is None or not len(excluded) \
        else ~np.isin(I, excluded)
    np.minimum.at(first, query[keep], np.asarray(D, dtype=np.int64)[keep])
    return first


def planner_choices(main, radius: int) -> dict | None:
    """Mode auto: the plan of a one-query radius search at every r <= ``radius`` (the path the
    planner would run and the predicted ns of each path), whether it is calibrated, and the
    last plan it ran; None for another mode."""
    if getattr(main, "kind", "") != "auto":
        return None
    plans = []
    for r in range(radius + 1):
        plan = main.plan(max_distance=r, nq=1)
        plans.append({"radius": r, "mode": plan["mode"], "predicted_ns": plan["predicted_ns"],
                      "reason": plan["reason"]})
    return {"calibrated": bool(main.calibrated), "choices": plans, "last_plan": main.last_plan}
