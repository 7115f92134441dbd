"""Sharded indexes on Ray (issue 14): one index split over N shard actors behind the same API.

:class:`ShardedLive` offers the part of :class:`~index.storage.live.LiveIndex`'s interface the
registry and the routers use (``add, upsert, delete, get, range_search, search, merge,
set_mode, state, ntotal, mode, substrings, failed, applied ...``) and delegates to N Ray actors
(:class:`ShardServer`), each holding its own ``LiveIndex`` in ``<index folder>/shard-<i>`` (own
WAL and snapshots). It implements the index handle protocol
(:class:`~bucketsearch.index.handle.IndexHandle`) as the live index does: searches fan out to
the shards and their answers are merged here; sizes and merge state are the shards' counts as
of the last write or refresh.

Partitioning, chosen per index at creation (stored in ``index.json``):

* ``id_hash``: an item lives on shard ``splitmix64(id) % N``. Every query goes to every shard,
  and every shard probes the whole ball: ``N x C(Q, <=r)`` probes in all. Balanced whatever
  the codes.
* ``code_prefix`` (N a power of two, ``P = log2 N``): the first ``P`` bits of a code pick its
  shard, and the shard stores only the remaining ``Q - P`` bits (a ``(Q-P)``-bit index). A
  radius-r query reaches shard ``s`` at prefix distance ``d = popcount(prefix(q) ^ s)`` and
  searches there to radius ``r - d`` (not at all when ``d > r``): the probes of the ball are
  split exactly, ``sum_s C(Q-P, <=r-d_s) = C(Q, <=r)``, with no engine change. Clustered codes
  skew it: a hot prefix puts its items and its queries' heavy part on one shard
  (:mod:`index.costmodel.shards` says which partitioning is cheaper).

Merging is exact: range results per query in (distance, id) order, k-NN the top k of every
shard's top k by (distance, id); per-radius stats summed (code_prefix: a shard's radius ``j``
is the ball's radius ``j + d``), the per-shard detail in ``stats.plan``.

Failure: the actors are created with ``max_restarts=-1``; a restarted actor reopens its
``LiveIndex`` from its WAL and snapshot. A call to a dead or restarting shard raises
:class:`ShardUnavailable` (an :class:`~bucketsearch.index.errors.IndexUnavailable`: HTTP 503 with
Retry-After); no partial answer is ever returned. Writes are all or nothing across the
shards: an intent with the before-images at the ingress, undone on every shard when any part
fails, before any shard serves again (:mod:`index.cluster.shardwrites`).
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from pathlib import Path

import numpy as np

from bucketsearch.index.cluster import shardwrites
from bucketsearch.index.cluster.partitioning import (PARTITIONINGS, id_shard, join_prefix,
                                            popcount_small, prefix_bits, split_prefix)
from bucketsearch.index.cluster.raysession import ensure_ray  # noqa: F401 -- the registry's entry
from bucketsearch.index.errors import IndexUnavailable
from bucketsearch.index.cluster.shardserver import ShardError, ShardServer
from bucketsearch.index.base import SearchStats
from bucketsearch.index import budget as work
from bucketsearch.index.codes import as_words, n_words, pack_bits
from bucketsearch.index.handle import (Budget, NotServed, RadiusProfile, Sizes, check_k,
                                       check_radius)
from bucketsearch.index.probe import ResultLimitError
from bucketsearch.index.storage.dedup import DEFAULT_REPORT, DedupResult, screen
from bucketsearch.index.storage.layout import shard_folder
from bucketsearch.index.storage.live import (DuplicateIdError, dedup_batch, dedup_neighbours,
                                             write_batch)

log = logging.getLogger("bucketsearch.app")

CALL_TIMEOUT_S = 120.0  # one shard call (a large batch or a merge can take seconds)
REPLICA_WAIT_S = 30.0  # after an undo: how long the replicas get to apply it (then 503)
_NO_IDS = np.zeros(0, dtype=np.int64)
#: Retry-After of a 503 for a shard that is down: Ray restarts a killed shard actor and it
#: reopens its live index from its snapshot and log in 1-3 s (tests/test_shards.py measures it)
RETRY_AFTER_S = 5


class ShardUnavailable(IndexUnavailable):
    """A shard actor is dead or restarting (or a failed write is being undone): the request is
    refused whole (503, ``Retry-After: RETRY_AFTER_S``)."""

    retry_after_s = RETRY_AFTER_S


# ------------------------------------------------------------------------------ Ray glue
def _get(refs, what: str):
    """``ray.get(refs)``: a dead or restarting shard raises :class:`ShardUnavailable`; an
    exception raised inside a shard is raised here as itself (ValueError, ProbeLimitError...)."""
    import ray
    from ray import exceptions as rex
    try:
        return ray.get(refs, timeout=CALL_TIMEOUT_S)
    except rex.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ShardError):
            raise cause.rebuild() from None
        if isinstance(cause, BaseException) and not isinstance(cause, rex.RayError):
            raise cause from None
        raise
    except (rex.RayActorError, rex.ActorUnavailableError, rex.GetTimeoutError,
            rex.ObjectLostError) as exc:
        raise ShardUnavailable(f"{what}: a shard is unavailable ({type(exc).__name__}); "
                               f"Ray restarts it from its log, retry in a few seconds") from None


class ShardedLive:
    """An index split over N shard actors (see the module docstring): an
    :class:`~bucketsearch.index.handle.IndexHandle`."""

    def __init__(self, folder: Path, bits: int, mode: str, substrings, shards: int,
                 partitioning: str, *, max_probes: int, merge_threshold: int,
                 threads_per_shard: int | None = None, actor_options: dict | None = None,
                 replicas: int = 0, follow_interval_s: float = 0.2):
        import ray
        if partitioning not in PARTITIONINGS:
            raise ValueError(f"partitioning must be one of {PARTITIONINGS}, got {partitioning!r}")
        self.folder, self.bits, self.n = Path(folder), int(bits), int(shards)
        self.partitioning, self.max_probes = partitioning, int(max_probes)
        self.p = prefix_bits(self.n) if partitioning == "code_prefix" else 0
        self.shard_bits = self.bits - self.p
        if self.shard_bits < 1:
            raise ValueError(f"partitioning: code_prefix over {self.n} shards takes {self.p} "
                             f"prefix bits, as many as the code has ({bits})")
        threads = threads_per_shard or max(1, (os.cpu_count() or 1) // self.n)
        # num_cpus=0: N shards of several indexes fit any cluster (each uses threads_per_shard
        # numba threads); SPREAD puts the shards of an index on different nodes
        options = {"max_restarts": -1, "max_task_retries": 0, "num_cpus": 0,
                   "scheduling_strategy": "SPREAD", "max_concurrency": 4,
                   **(actor_options or {})}
        cls = ray.remote(ShardServer).options(**options)
        self.actors = [cls.remote(str(shard_folder(self.folder, i)), self.shard_bits, mode,
                                  substrings, max_probes, merge_threshold, threads)
                       for i in range(self.n)]
        # read replicas (issue 14 item 2): followers of each shard's directory; searches go
        # round-robin over the primary and its replicas, writes and get() to the primary only
        self.replicas = [[cls.remote(str(shard_folder(self.folder, i)), self.shard_bits, mode,
                                     substrings, max_probes, merge_threshold, threads, True,
                                     follow_interval_s) for _ in range(replicas)]
                         for i in range(self.n)]
        self._turn = 0
        self._closed = False
        self._write_lock = threading.RLock()  # add_next holds it around add
        self._probe_cache: dict = {}
        self._totals: dict = {}
        self.follow_interval_s = float(follow_interval_s)
        # a failed write not undone yet (shardwrites.py): every request finishes it first
        self._undo: shardwrites.Intent | None = None
        self._undo_sent = True
        try:
            self.refresh()  # waits for every shard to open (recovery), or raises
            self._undo = shardwrites.read_intent(self.folder, self.n, self.bits)
            if self._undo is not None:  # the ingress stopped during a write: presumed aborted
                self._finish_undo()
        except BaseException:
            for a in self.actors + [r for rs in self.replicas for r in rs]:
                ray.kill(a, no_restart=True)
            raise

    # ------------------------------------------------------------------------- summary
    def refresh(self, full: bool = False) -> list[dict]:
        """Every shard's counts (``full``: its whole summary), one call each in parallel; the
        cached counts that ``state`` and the properties read (as of the last write or refresh:
        a shard's background merge is seen at the next one)."""
        shards = _get([a.summary.remote() if full else a.counts.remote()
                       for a in self.actors], "summary")
        self._set_counts(dict(enumerate(shards)))
        return shards

    def _set_counts(self, by_shard: dict) -> None:
        shards = list(getattr(self, "_shards", [None] * self.n))
        for i, c in by_shard.items():
            shards[i] = c
        self._shards = shards
        self._totals = {key: sum(s[key] for s in shards)
                        for key in ("size", "main_size", "delta_size", "tombstones")}
        self._probe_cache.clear()

    # ---------------------------------------------------------------- the handle's shape
    @property
    def shards(self) -> int:
        """The handle's ``shards``: how many shard actors hold the index."""
        return self.n

    def view(self) -> ShardedLive:
        """The handle's view: the index itself (each call fans out to the shards, each of
        which searches one consistent state of its own)."""
        return self

    @property
    def ntotal(self) -> int:
        return self._totals["size"]

    def sizes(self) -> Sizes:
        """The shards' counts summed (as of the last write or refresh)."""
        t = self._totals
        return Sizes(t["size"], t["main_size"], t["delta_size"], t["tombstones"])

    @property
    def mode(self) -> str:
        modes = {s["mode"] for s in self._shards}
        return modes.pop() if len(modes) == 1 else "mixed"

    @property
    def substrings(self):
        return self._shards[0]["substrings"] if self._shards else None

    @property
    def failed(self) -> str | None:
        bad = [f"shard {i}: {s['failed']}" for i, s in enumerate(self._shards) if s["failed"]]
        return "; ".join(bad) or None

    @property
    def merging(self) -> bool:
        return any(s["merging"] for s in self._shards)

    @property
    def merge_status(self) -> str:
        """The shards' merge state: ``running`` if one merges, ``pending`` if one waits for its
        merge, else ``none`` (:attr:`LiveIndex.merge_status`)."""
        states = {s.get("merge_status", "running" if s["merging"] else "none")
                  for s in self._shards}
        return next((m for m in ("running", "pending") if m in states), "none")

    @property
    def lag_ms(self) -> float:
        return 0.0

    @property
    def merges(self) -> int:
        return sum(s["merges"] for s in self._shards)

    @property
    def last_merge(self) -> float | None:
        return max((s["last_merge"] or 0.0 for s in self._shards), default=0.0) or None

    @property
    def last_merge_error(self) -> str | None:
        return next((f"shard {i}: {s['last_merge_error']}" for i, s in enumerate(self._shards)
                     if s["last_merge_error"]), None)

    def check_radius(self, radius: int) -> None:
        check_radius(radius, self.bits)

    # --------------------------------------------------------------------------- routing
    def _owner(self, ids: np.ndarray, words: np.ndarray):
        """``(shard per item, words to store)``: id hash, or the code prefix (suffix stored)."""
        if self.partitioning == "id_hash":
            return id_shard(ids, self.n), words
        return split_prefix(words, self.bits, self.p)

    def probe_count(self, radius: int, nq: int, max_probes: int | None) -> int:
        """Probes per query of the whole fan-out: id_hash, every shard's; code_prefix, each
        shard's share of the ball (``C(Q, <=r)`` in all for a single table)."""
        key = (radius, nq, max_probes, self.mode)
        hit = self._probe_cache.get(key)
        if hit is not None and time.monotonic() - hit[1] < 1.0:
            return hit[0]
        if self.mode == "single":
            if self.partitioning == "id_hash":
                count = self.n * sum(math.comb(self.bits, r) for r in range(radius + 1))
            else:
                count = sum(math.comb(self.bits, r) for r in range(radius + 1))
        elif self.partitioning == "id_hash":
            count = sum(_get([a.probe_count.remote(radius, nq, max_probes)
                              for a in self.actors], "probe count"))
        else:  # each shard at its share: radius - d for the d's of one query's prefix
            counts = _get([a.probe_count.remote(r, nq, max_probes)
                           for a in self.actors for r in range(min(radius, self.shard_bits) + 1)],
                          "probe count")
            per = np.array(counts).reshape(self.n, -1)
            d = popcount_small(np.arange(self.n))  # distances from prefix 0: same multiset
            count = int(sum(per[s, min(radius - d[s], self.shard_bits)]
                            for s in range(self.n) if d[s] <= radius))
        self._probe_cache[key] = (count, time.monotonic())
        return count

    # --------------------------------------------------------------------------- reading
    def range_search(self, xq, radius: int, stats: bool = False,
                     max_probes: int | None = None, max_results: int | None = None,
                     budget: Budget | None = None):
        """Radius search over every shard, merged in (distance, id) order; with a ``budget``,
        the fan-out's probes (each query's share, and the batch's), compares and memory are
        checked first (:mod:`bucketsearch.index.budget`, from the shards' counts)."""
        self.check_radius(radius)
        xq = as_words(xq, self.bits)
        if budget is not None:
            max_probes = self._check_range(len(xq), radius, budget)
            max_results = budget.max_results
        return self._range(xq, radius, stats, max_probes, max_results)

    def _check_range(self, nq: int, radius: int, budget: Budget) -> int | None:
        """The per-query probe limit a budgeted radius search runs with (None: a shard's own
        guard answers first, before any work too)."""
        return work.check_range(
            nq, radius, budget, self.max_probes, self.mode,
            lambda share: self.probe_count(radius, nq, share),
            lambda _, per_query: self._range_work(nq, radius, per_query, budget.max_results))

    def _range_work(self, nq: int, radius: int, per_query: int,
                    max_results: int | None) -> work.Work:
        """:func:`bucketsearch.index.budget.work_of` from the shards' counts: the largest
        bucket is not known here, so a ball may hold every item of the main indexes."""
        t = self._totals
        return work.work_of(nq, radius, self.bits, per_query, False, t["main_size"],
                            t["delta_size"], nq * (t["main_size"] + t["delta_size"]),
                            max_results)

    def search(self, xq, k: int, max_distance: int | None = None, stats: bool = False,
               max_probes: int | None = None, budget: Budget | None = None):
        """The k nearest over every shard (the top k of each shard's top k by (distance,
        id)); with a ``budget``, its compares and memory checked first and its probes shared
        out as each query's limit."""
        k = check_k(k)
        if max_distance is not None:
            self.check_radius(max_distance)
        xq = as_words(xq, self.bits)
        if budget is not None:
            t = self._totals
            max_probes = work.check_knn(len(xq), k, budget, work.knn_work_of(
                len(xq), k, self.bits, False, t["main_size"], t["delta_size"]))
        return self._knn(xq, k, max_distance, stats, max_probes)

    def range_estimate(self, nq: int, radius: int, cheap: bool = False) -> work.Work | None:
        """The most work of a radius search at the shards' probe guard; ``cheap``: None (the
        probe count of a mode other than single asks the shards: a Ray round trip)."""
        if cheap:
            return None
        return self._range_work(nq, radius, self.probe_count(radius, nq, None), None)

    def _reader(self, s: int):
        """The actor that answers shard ``s``'s part of this search: the primary or one of its
        replicas, in turn (a replica may lag by its ``lag_ms``)."""
        pool = self.replicas[s]
        if not pool:
            return self.actors[s]
        k = (self._turn + s) % (len(pool) + 1)
        return self.actors[s] if k == 0 else pool[k - 1]

    def replica_lag(self) -> list[list[dict]]:
        """Per shard, each replica's applied position and lag (one call each, in parallel)."""
        flat = [r for rs in self.replicas for r in rs]
        lags = iter(_get([r.lag.remote() for r in flat], "replicas") if flat else [])
        return [[next(lags) for _ in rs] for rs in self.replicas]

    def _plan(self, shard_stats: list) -> dict:
        detail = []
        for i, sts in enumerate(shard_stats):
            sts = [s for s in sts if s is not None]
            detail.append({"shard": i, "queries": int(sum(len(s.radii) for s in sts)),
                           "probes": int(sum(int(s.probes.sum()) for s in sts)),
                           "items": int(sum(int(s.items.sum()) for s in sts)),
                           "lookup_ns": int(sum(int(s.lookup_ns.sum()) for s in sts)),
                           "plans": [s.plan for s in sts if s.plan is not None][:2] or None})
        return {"partitioning": self.partitioning, "shards": self.n, "per_shard": detail}

    def _fan_out(self, xq, radius_of, call):
        """Per shard, the query groups it gets: ``[(rows, d, xq_part, radius), ...]``;
        ``call(actor, [(xq_part, radius), ...])`` is submitted for every shard with work (once
        no failed write is left to undo: :meth:`_settle`)."""
        self._settle()
        nq = len(xq)
        plans = []
        if self.partitioning == "id_hash":
            rows = np.arange(nq)
            plans = [[(rows, 0, xq, radius_of(0))] for _ in range(self.n)]
        else:
            prefix, suffix = split_prefix(xq, self.bits, self.p)
            for s in range(self.n):
                d = popcount_small(prefix ^ s)
                groups = []
                for dv in np.unique(d):
                    r = radius_of(int(dv))
                    if r < 0:
                        continue
                    rows = np.flatnonzero(d == dv)
                    groups.append((rows, int(dv), np.ascontiguousarray(suffix[rows]), r))
                plans.append(groups)
        self._turn += 1
        refs = [(s, call(self._reader(s), [(g[2], g[3]) for g in groups]))
                for s, groups in enumerate(plans) if groups]
        results = _get([ref for _, ref in refs], "search")
        return plans, [(s, res) for (s, _), res in zip(refs, results)]

    def _range(self, xq, radius, stats, max_probes, max_results):
        nq = len(xq)
        cap = max_results
        plans, results = self._fan_out(
            xq, lambda d: min(radius - d, self.shard_bits),
            lambda a, groups: a.range_groups.remote(groups, stats, max_probes, cap))
        qs, Ds, Is, shard_stats = [], [], [], []
        st_parts = []
        for s, res in results:
            sts = []
            for (rows, d, _, _), (lims, D, I, st) in zip(plans[s], res):
                counts = np.diff(lims)
                qs.append(np.repeat(rows, counts))
                Ds.append(np.asarray(D, dtype=np.int32) + d)
                Is.append(np.asarray(I, dtype=np.int64))
                sts.append(st)
                if st is not None:
                    st_parts.append((rows, d, st))
            shard_stats.append(sts)
        q = np.concatenate(qs) if qs else np.empty(0, np.int64)
        D = np.concatenate(Ds) if Ds else np.empty(0, np.int32)
        I = np.concatenate(Is) if Is else np.empty(0, np.int64)
        if max_results is not None and len(I) > max_results:
            raise ResultLimitError(max_results, len(I))
        order = np.lexsort((I, D, q))
        lims = np.zeros(nq + 1, dtype=np.int64)
        np.cumsum(np.bincount(q, minlength=nq), out=lims[1:])
        st = self._merge_stats(nq, radius + 1, st_parts, shard_stats) if stats else None
        return lims, D[order], I[order], st

    def _knn(self, xq, k, max_distance, stats, max_probes):
        nq = len(xq)
        R = self.bits if max_distance is None else int(max_distance)
        plans, results = self._fan_out(
            xq, lambda d: min(R - d, self.shard_bits),
            lambda a, groups: a.knn_groups.remote(groups, k, stats, max_probes))
        Dall = np.full((nq, 0), -1, dtype=np.int64)
        Iall = np.full((nq, 0), -1, dtype=np.int64)
        parts_D, parts_I, shard_stats, st_parts = [], [], [], []
        for s, res in results:
            sts = []
            # a shard's query groups hold disjoint rows: one (nq, k) block per shard
            Dfull = np.full((nq, k), -1, dtype=np.int64)
            Ifull = np.full((nq, k), -1, dtype=np.int64)
            parts_D.append(Dfull)
            parts_I.append(Ifull)
            for (rows, d, _, _), (D, I, st) in zip(plans[s], res):
                Dfull[rows] = np.where(np.asarray(I) >= 0, np.asarray(D, dtype=np.int64) + d, -1)
                Ifull[rows] = I
                sts.append(st)
                if st is not None:
                    st_parts.append((rows, d, st))
            shard_stats.append(sts)
        if parts_D:
            Dall, Iall = np.concatenate(parts_D, axis=1), np.concatenate(parts_I, axis=1)
        width = Dall.shape[1]
        key_d = np.where(Iall >= 0, Dall, np.iinfo(np.int64).max)
        row = np.repeat(np.arange(nq), width)
        order = np.lexsort((Iall.ravel(), key_d.ravel(), row)).reshape(nq, width)[:, :k]
        D_out = np.full((nq, k), -1, dtype=np.int32)
        I_out = np.full((nq, k), -1, dtype=np.int64)
        take = min(k, width)
        if take:
            flat = order[:, :take]
            I_sel = Iall.ravel()[flat]
            D_sel = Dall.ravel()[flat]
            D_out[:, :take] = np.where(I_sel >= 0, D_sel, -1)
            I_out[:, :take] = I_sel
        st = None
        if stats:
            width_r = max([p[2].probes.shape[1] + p[1] for p in st_parts], default=1)
            st = self._merge_stats(nq, width_r, st_parts, shard_stats)
        return D_out, I_out, st

    def _merge_stats(self, nq: int, width: int, st_parts, shard_stats) -> SearchStats:
        """Per-radius counters summed over shards; a code_prefix shard's radius ``j`` is the
        ball's radius ``j + d``. ``plan`` carries the per-shard detail."""
        fields = ("probes", "nonempty_buckets", "empty_buckets", "items", "lookup_ns")
        cand = all(p[2].candidates is not None for p in st_parts) and st_parts
        if cand:
            fields += ("candidates", "unique_candidates")
        out = {f: np.zeros((nq, width), dtype=np.int64) for f in fields}
        radii = np.zeros(nq, dtype=np.int64)
        total = np.zeros(nq, dtype=np.int64)
        scanned = np.full(nq, -1, dtype=np.int64)
        any_scan = False
        delta_items = delta_ns = 0
        # what ran: per query, the engine of the shard part that took longest (the engines
        # of its parts when they agree), k, and the codes compared summed over the shards
        engine = np.zeros(nq, dtype=np.int8)
        engine_ns = np.full(nq, -1, dtype=np.int64)
        k = np.zeros(nq, dtype=np.int32)
        codes = np.zeros(nq, dtype=np.int64)
        for rows, d, st in st_parts:
            if st.engine is not None:
                ns = np.asarray(st.total_ns, dtype=np.int64)
                longer = ns > engine_ns[rows]
                engine[rows] = np.where(longer, st.engine, engine[rows])
                engine_ns[rows] = np.maximum(engine_ns[rows], ns)
            if st.k is not None:
                k[rows] = np.maximum(k[rows], st.k)
            if st.codes_compared is not None:
                codes[rows] += st.codes_compared
            w = st.probes.shape[1]
            span = min(w, width - d)
            for f in fields:
                arr = getattr(st, f)
                if span > 0:
                    out[f][rows, d:d + span] += arr[:, :span]
            radii[rows] = np.maximum(radii[rows], np.asarray(st.radii) + d)
            total[rows] += st.total_ns
            if st.scanned_from is not None:
                any_scan = True
                sf = np.where(st.scanned_from >= 0, st.scanned_from + d, -1)
                cur = scanned[rows]
                scanned[rows] = np.where(cur < 0, sf, np.where(sf < 0, cur, np.minimum(cur, sf)))
            delta_items += st.delta_items
            delta_ns = max(delta_ns, st.delta_ns)
        return SearchStats(**out, radii=radii, total_ns=total,
                           **({} if cand else {"candidates": None, "unique_candidates": None}),
                           scanned_from=scanned if any_scan else None,
                           plan=self._plan(shard_stats), delta_items=delta_items,
                           delta_ns=delta_ns, engine=engine, k=k, codes_compared=codes)

    # ---------------------------------------------------------------------------- writes
    # Every write is all or nothing across the shards: shardwrites.py (the protocol).
    def add(self, codes, ids) -> int:
        """Insert: every id checked unique across the shards first (409 naming the first id
        already live), then each shard's part written, all or nothing (:meth:`_write`)."""
        ids, words = write_batch(codes, ids, self.bits)
        if not len(ids):
            return 0
        owner, stored = self._owner(ids, words)
        with self._write_lock:
            self._writable()
            self._settle()
            found, before = self._lookup(ids)
            if found.any():
                raise DuplicateIdError(f"ids: id {int(ids[found][0])} already exists in the "
                                       "index (delete it first, or upsert to replace it)")
            self._write("add", ids, found, before,
                        {s: (_NO_IDS, stored[owner == s], ids[owner == s])
                         for s in np.unique(owner).tolist()})
        return len(ids)

    def add_next(self, codes) -> tuple[int, int]:
        """Insert with the ids ``next_id, next_id + 1, ...``: one more than the largest id any
        shard has seen written (each shard keeps its mark durably), taken under the write
        lock. Returns ``(first_id, count)``."""
        with self._write_lock:
            self._writable()
            self._settle()
            first = max(s["next_id"] for s in self._shards)
            words = as_words(codes, self.bits)
            return first, self.add(words, np.arange(first, first + len(words), dtype=np.int64))

    def add_dedup(self, codes, radius: int, ids=None, *, report: int = DEFAULT_REPORT,
                  max_probes: int | None = None) -> DedupResult:
        """Dedup on ingest (:meth:`index.storage.live.LiveIndex.add_dedup`) over the shards:
        the search of every shard, the decision and the write of the inserted items (:meth:`add`:
        all or nothing over the shards) under the ingress's write lock, which every write of
        this index takes: two near-duplicates sent at the same time never both get in."""
        ids, words = dedup_batch(codes, ids, radius, report, self.bits)
        with self._write_lock:
            self._writable()
            self._settle()
            first = max(s["next_id"] for s in self._shards)
            if not len(words):
                return DedupResult.empty(None if ids is not None else first)
            found = dedup_neighbours(self, words, int(radius), int(report), max_probes)
            result = screen(words, int(radius), self.bits, found, ids, first, int(report))
            if result.inserted.any():
                self.add(words[result.inserted], result.ids[result.inserted])
        return result

    def upsert(self, codes, ids) -> tuple[int, int]:
        """Insert or replace, all or nothing (:meth:`_write`). code_prefix: an id whose new
        code has another prefix moves: the new shard upserts it and the old shard deletes it
        in the same write, so it is never live twice nor lost."""
        ids, words = write_batch(codes, ids, self.bits)
        if not len(ids):
            return 0, 0
        owner, stored = self._owner(ids, words)
        with self._write_lock:
            self._writable()
            self._settle()
            found, before = self._lookup(ids)
            home = np.full(len(ids), -1, dtype=np.int64)  # where each id lives now
            if found.any():
                home[found] = self._owner(ids[found], before[found])[0]
            moving = found & (home != owner)  # code_prefix only: id_hash keeps an id's shard
            parts = {s: (ids[moving & (home == s)], stored[owner == s], ids[owner == s])
                     for s in np.union1d(owner, home[moving]).tolist()}
            self._write("upsert", ids, found, before, parts)
        replaced = int(found.sum())
        return len(ids) - replaced, replaced

    def delete(self, ids) -> int:
        """Delete the live ones of ``ids`` (unknown ids are ignored), all or nothing
        (:meth:`_write`); returns how many were deleted."""
        ids = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
        if not len(ids):
            return 0
        with self._write_lock:
            self._writable()
            self._settle()
            found, before = self._lookup(ids)
            ids, before = ids[found], before[found]
            if not len(ids):
                return 0
            home = self._owner(ids, before)[0]
            self._write("delete", ids, np.ones(len(ids), dtype=bool), before,
                        {s: (ids[home == s], np.zeros((0, n_words(self.shard_bits)), np.uint64),
                             _NO_IDS)
                         for s in np.unique(home).tolist()})
        return len(ids)

    def _write(self, op: str, ids, found, before, parts: dict) -> None:
        """Send ``parts`` (per shard: ``(delete_ids, words, ids)``) all or nothing: the intent
        (the before-images ``found``/``before`` of ``ids``) is made durable first, removed
        once every shard answered (the commit); any failure undoes every part (:meth:`_abort`)
        and is raised. Called with the write lock held."""
        intent = shardwrites.Intent(op, time.time_ns(), tuple(sorted(parts)), ids,
                                    np.asarray(found, dtype=bool), before[found])
        sent = False
        try:
            shardwrites.write_intent(self.folder, intent)
            sent = True
            self._send(parts, add=op == "add", what=op)
            shardwrites.clear_intent(self.folder)
        except Exception:
            self._abort(intent, sent)
            raise

    def _send(self, parts: dict, add: bool, what: str) -> None:
        """Every shard's part in parallel; waits for every answer, then raises the first
        error. A part still running after :data:`CALL_TIMEOUT_S` gets its shard restarted
        (a fence: its part is then in the shard's log or not, never applied after the undo)."""
        import ray
        refs = [(s, self.actors[s].write.remote(d, w, i, add)) for s, (d, w, i) in parts.items()]
        errors = []
        for s, ref in refs:
            try:
                self._set_counts({s: _get(ref, what)})
            except Exception as exc:  # noqa: BLE001 -- raised once every part has answered
                errors.append(exc)
                if isinstance(exc, ShardUnavailable) and not ray.wait([ref], timeout=0)[0]:
                    ray.kill(self.actors[s], no_restart=False)
        if errors:
            raise errors[0]

    def _abort(self, intent: shardwrites.Intent, sent: bool) -> None:
        """Undo a failed write (every part, on every shard it touched: ``sent``) and remove
        its intent; what cannot be undone now (a shard down) stays pending: every request
        finishes it first (:meth:`_settle`) and answers 503 meanwhile."""
        self._undo, self._undo_sent = intent, sent
        try:
            self._finish_undo()
        except Exception as exc:  # noqa: BLE001 -- pending; the caller raises the write's error
            log.warning("index %s: the failed %s of %d ids is not undone yet (%s: %s); the "
                        "index answers 503 until it is", self.folder.name, intent.op,
                        len(intent.ids), type(exc).__name__, exc)

    def _finish_undo(self) -> None:
        intent = self._undo
        if self._undo_sent:
            parts = self._undo_parts(intent)
            self._send(parts, add=False, what="undo of a failed write")
            self._await_replicas(sorted(parts))
        shardwrites.clear_intent(self.folder)
        self._undo = None
        log.warning("index %s: undid the failed %s of %d ids on shards %s", self.folder.name,
                    intent.op, len(intent.ids), list(intent.shards))

    def _undo_parts(self, intent: shardwrites.Intent) -> dict:
        """Per shard, the write that puts every id of ``intent`` back to its before-image:
        upserted with its old code on the shard that held it, deleted on every other shard
        the write touched (where it was not live: everywhere)."""
        ids, found = intent.ids, intent.found
        home = np.full(len(ids), -1, dtype=np.int64)
        stored = np.zeros((len(ids), n_words(self.shard_bits)), dtype=np.uint64)
        if found.any():
            home[found], stored[found] = self._owner(ids[found], intent.words)
        # an id can be on: id_hash, its id's shard only; code_prefix, any shard written
        could = id_shard(ids, self.n) if self.partitioning == "id_hash" else None
        parts = {}
        for s in sorted(set(intent.shards) | set(home[found].tolist())):
            here = home == s
            gone = ~here if could is None else ~here & (could == s)
            parts[s] = (ids[gone], stored[here], ids[here])
        return parts

    def _await_replicas(self, shards: list[int]) -> None:
        """After an undo: wait until every replica of ``shards`` has applied its primary's
        log position, so that no replica serves the undone write afterwards; ShardUnavailable
        (the undo stays pending) past :data:`REPLICA_WAIT_S`."""
        shards = [s for s in shards if self.replicas[s]]
        if not shards:
            return
        target = dict(zip(shards, _get([self.actors[s].position.remote() for s in shards],
                                       "undo")))
        deadline = time.monotonic() + REPLICA_WAIT_S
        while True:
            lags = _get([r.lag.remote() for s in shards for r in self.replicas[s]], "undo")
            owners = [s for s in shards for _ in self.replicas[s]]
            if all(lag["applied"] >= target[s] for s, lag in zip(owners, lags)):
                return
            if time.monotonic() > deadline:
                raise ShardUnavailable(f"index {self.folder.name!r}: the replicas of shards "
                                       f"{shards} have not applied the undo of a failed write "
                                       f"within {REPLICA_WAIT_S:.0f} s")
            time.sleep(self.follow_interval_s)

    def _settle(self) -> None:
        """Before a read or a write: finish the undo of a failed write, if one is pending;
        ShardUnavailable (503) while it cannot be finished."""
        if self._undo is None:
            return
        with self._write_lock:
            if self._undo is None:
                return
            try:
                self._finish_undo()
            except ShardUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 -- an engine or disk error: 503 with why
                raise ShardUnavailable(f"index {self.folder.name!r}: a failed write is being "
                                       f"undone ({type(exc).__name__}: {exc}); retry "
                                       "later") from None

    # --------------------------------------------------------------------------- lookups
    def _lookup(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """``(found, words)`` of ``ids`` (full codes) from the shards that can hold them."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        words = np.zeros((len(ids), n_words(self.bits)), dtype=np.uint64)
        found = np.zeros(len(ids), dtype=bool)
        if self.partitioning == "id_hash":
            owner = id_shard(ids, self.n)
            shards = sorted(set(owner.tolist()))
            for s, (f, w) in zip(shards, _get([self.actors[s].get.remote(ids[owner == s])
                                               for s in shards], "get")):
                sel = np.flatnonzero(owner == s)
                found[sel], words[sel] = f, w
        else:
            for s, (f, w) in enumerate(_get([a.get.remote(ids) for a in self.actors], "get")):
                f = np.asarray(f)
                if f.any():
                    words[f] = join_prefix(s, np.asarray(w)[f], self.bits, self.p)
                    found |= f
        return found, words

    def get(self, ids):
        self._settle()
        return self._lookup(ids)

    def sample(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``min(n, live)`` live items drawn uniformly without replacement from every shard's
        items (seeded), in the order of :meth:`items`."""
        ids, words = self.items()
        pick = np.sort(np.random.default_rng(seed).choice(len(ids), min(n, len(ids)),
                                                          replace=False))
        return ids[pick], words[pick]

    def query_sample(self, n: int, seed: int) -> np.ndarray:
        """``n`` query words: ``n // 2`` codes of live items (drawn with replacement), the rest
        uniform random codes (all ``n`` of an empty index)."""
        rng = np.random.default_rng(seed)
        words = self.items()[1]
        n_random = n if not len(words) else n // 2
        parts = [pack_bits(rng.integers(0, 2, size=(n_random, self.bits), dtype=np.uint8))]
        if len(words):
            parts.append(words[rng.integers(0, len(words), size=n - n_random)])
        return np.ascontiguousarray(np.concatenate(parts))

    # the cost model's reads of a live index: its tables are in the shard actors
    def radius_profile(self, queries: int, max_distance: int | None, seed: int,
                       budget: Budget) -> RadiusProfile:
        raise NotServed(f"radius-profile: index {self.folder.name!r} is split over {self.n} "
                        "shards; the profile probes one table in one process")

    def paper_engine(self):
        """None: no single table in this process (t0 is not calibrated for a sharded
        index)."""
        return None

    def probe_engine(self):
        raise NotServed(f"index {self.folder.name!r} is split over {self.n} shards: its "
                        "tables are in the shard actors")

    def catch_up(self) -> bool:
        """Nothing: the shards' read replicas follow their primaries themselves."""
        return False

    def item_parts(self):
        """Each shard's live items, one segment a shard (nothing dropped)."""
        self._settle()
        parts = _get([a.items.remote() for a in self.actors], "items")
        W = n_words(self.bits)
        return [(np.asarray(i), (join_prefix(s, w, self.bits, self.p)
                                 if self.partitioning == "code_prefix" else np.asarray(w))
                 .reshape(-1, W), np.empty(0, dtype=np.int64))
                for s, (i, w) in enumerate(parts)]

    def items(self):
        parts = self.item_parts()
        return (np.concatenate([i for i, _, _ in parts]),
                np.concatenate([w for _, w, _ in parts]).reshape(-1, n_words(self.bits)))

    def job_snapshot(self, folder) -> list[int]:
        """A near-duplicate job's state (shardjobs.py): every shard writes its live items to
        ``folder/shard-<i>``, under the write lock, so no write falls between two shards'
        copies (one state of the whole index). Returns each shard's item count."""
        with self._write_lock:
            self._settle()
            return _get([a.job_snapshot.remote(str(shard_folder(folder, i)))
                         for i, a in enumerate(self.actors)], "job snapshot")

    def merge(self) -> bool:
        self._writable()
        out = any(_get([a.merge.remote() for a in self.actors], "merge"))
        self.refresh()
        return out

    def set_mode(self, mode: str, substrings) -> bool:
        from bucketsearch.index.factory import check_served_mode
        check_served_mode(mode, self.shard_bits, substrings, self.max_probes)
        self._writable()
        out = any(_get([a.set_mode.remote(mode, substrings) for a in self.actors], "set mode"))
        self._probe_cache.clear()
        self.refresh()
        return out

    def warm(self) -> None:
        """One tiny search of every kind on every shard (loads their kernels)."""
        xq = np.zeros((1, n_words(self.bits)), dtype=np.uint64)
        for stats in (False, True):
            self._range(xq, 1, stats, None, None)
            self._knn(xq, 3, None, stats, None)
            self._knn(xq, 3, 1, stats, None)

    def info(self) -> dict:
        """The IndexInfo fields of the whole index, with ``shard_detail`` per shard. Buckets
        are the shards' (``distinct_codes`` and ``bucket_size_histogram`` summed over them):
        with id_hash a code held on two shards is a bucket on each."""
        self._settle()
        shards = self.refresh(full=True)
        lags = self.replica_lag()
        hist: dict[int, int] = {}
        for s in shards:
            for size, count in s["histogram"].items():
                hist[size] = hist.get(size, 0) + count
        distinct = sum(s["distinct_codes"] for s in shards)
        return {
            "mode": self.mode, "substrings": self.substrings if self.mode != "single" else None,
            "size": self._totals["size"], "main_size": self._totals["main_size"],
            "delta_size": self._totals["delta_size"], "tombstones": self._totals["tombstones"],
            "distinct_codes": distinct, "code_space_fraction": math.ldexp(distinct, -self.bits),
            "bucket_size_histogram": [{"size": k, "buckets": v} for k, v in sorted(hist.items())],
            "memory_bytes": sum(s["memory_bytes"] for s in shards),
            "merges": self.merges, "merging": self.merging, "merge": self.merge_status,
            "last_merge": self.last_merge,
            "last_merge_error": self.last_merge_error,
            "applied_lsn": ",".join(s["applied_lsn"] for s in shards),
            "lag_ms": max((r["lag_ms"] for rs in lags for r in rs), default=0.0),
            "partitioning": self.partitioning,
            "shard_detail": [{"shard": i, **{k: s[k] for k in (
                "size", "main_size", "delta_size", "tombstones", "mode", "merges", "failed",
                "applied_lsn", "pid")}, **({"replicas": lag} if lag else {})}
                for i, (s, lag) in enumerate(zip(shards, lags))],
        }

    def _writable(self) -> None:
        """PermissionError once the index is closed (as a closed live index refuses)."""
        if self._closed:
            raise PermissionError(f"index {self.folder.name!r} is closed (deleted or shutting "
                                  "down)")

    def close(self) -> None:
        """Refuse writes from now on (a write under way finishes first: the write lock),
        close every shard's live index and stop the actors; a second call does nothing."""
        import ray
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
        try:
            ray.get([a.close.remote() for a in self.actors], timeout=30)
        except Exception:  # noqa: BLE001 -- the actors go anyway
            log.warning("index %s: closing a shard failed", self.folder.name)
        for a in self.actors + [r for rs in self.replicas for r in rs]:
            ray.kill(a, no_restart=True)
