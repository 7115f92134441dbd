"""Hashtable-bucket evaluation: L tables of K-bit segments, measured in the real engine.

The protocol of hashing theses and papers that evaluate by hash lookup rather than by ranking
(e.g. the "hashtable bucket" paradigm of thesis chapter 3): the first ``K * L`` bits of each
code are cut into ``L`` contiguous segments of ``K`` bits (bit ``j*K .. j*K + K - 1`` for
table ``j``, most significant first; bits past ``K * L`` are unused), segment ``j`` keys table
``j``, and the retrieved set of a query is the union over the tables of the items whose
segment lies within Hamming radius ``r`` of the query's segment (``r = 0``: the items that
collide with the query in at least one table; ``r > 0``: the multi-probe variant).

With ``d_j(q, x)`` the Hamming distance of segment ``j`` and the *min-segment distance*
``m_L(q, x) = min_{j < L} d_j(q, x)``, item ``x`` is retrieved at per-table radius ``r`` iff
``m_L(q, x) <= r``. So one histogram of ``m_L`` per query gives the retrieved set at every
radius, exactly like the Hamming-distance histogram gives the Hamming ball at every radius, and
precision, recall and F-beta (macro and micro, every convention of
:mod:`bucketsearch.index.metrics.conventions`) come from
:func:`bucketsearch.index.metrics.radius.radius_metrics` applied
to it. Two special cases anchor the protocol to Hamming ranking: ``(K, L) = (Q, 1)`` at radius
``r`` is the Hamming ball ``d <= r``, and ``(1, Q)`` at radius 0 is the ball ``d <= Q - 1``; in
general the retrieved set holds the ball of radius ``L (r + 1) - 1`` (pigeonhole) and more.

The kernel visits every (query, item) pair once per segment width K and gets every L at once:
``m_L`` is a running minimum over the segments, and the pass records only where it drops (a
difference array over L), so the cost per pair is ``Q / K`` popcounts, stopping at the first
segment with distance 0.

Cost is measured in the engine: a :class:`~bucketsearch.index.mih.MultiIndex` with ``m = L``
substrings
over the ``K * L``-bit codes *is* this structure (L tables keyed by the K-bit segments), and its
range search to radius ``R = L (r + 1) - 1`` probes every table to radius exactly ``r`` (tight
pigeonhole rule, see :mod:`bucketsearch.index.mih`); its ``unique_candidates`` are the retrieved set
(checked
against the histogram), its ``lookup_ns`` the time of probing the L tables and verifying the
candidates by full distance, summed over the radius steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import prange

from bucketsearch.index._jit import pjit, popcount64
from bucketsearch.index.codes import as_words, word_widths
from bucketsearch.index.metrics.relevance import Relevance, dense
from bucketsearch.index.metrics.conventions import DEFAULT, Conventions
from bucketsearch.index.metrics.histogram import Histograms
from bucketsearch.index.metrics.radius import radius_metrics
from bucketsearch.index.mih import MAX_SUBSTRING_BITS, _substrings

#: queries per block of the dense relevance rows (block x n_db booleans in memory at a time)
QUERY_BLOCK = 64
#: results held by one engine range search (queries are searched in chunks below this)
ENGINE_RESULT_BUDGET = 4_000_000
DEFAULT_MAX_PROBES = 10_000_000


def bit_array(codes, what: str = "codes") -> np.ndarray:
    """``(n, Q)`` 0/1 uint8 from an ``(n, Q)`` array of {0,1} or {-1,+1}."""
    arr = np.asarray(codes)
    if arr.ndim != 2:
        raise ValueError(f"{what} must have shape (n, Q), got {arr.shape}")
    vals = set(np.unique(arr).tolist()) if arr.size else set()
    if not (vals <= {0, 1} or vals <= {-1, 1}):
        raise ValueError(f"{what} values must be in {{0,1}} or {{-1,+1}}, "
                         f"found {sorted(vals)[:6]}")
    return (arr > 0).astype(np.uint8)


def check_tables(bits: int, k: int, n_tables: int) -> tuple[int, int]:
    """Validate one configuration: ``1 <= K <= min(Q, 64)``, ``L >= 1``, ``K * L <= Q``."""
    for name, value in (("K", k), ("L", n_tables)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"tables: {name} must be an int >= 1, got {value!r}")
    if k > min(bits, MAX_SUBSTRING_BITS):
        raise ValueError(f"tables: K must be in [1, {min(bits, MAX_SUBSTRING_BITS)}] for "
                         f"{bits}-bit codes (one table key fits 64 bits), got K={k}")
    if k * n_tables > bits:
        raise ValueError(f"tables: K x L must be <= Q = {bits} bits, got K={k}, L={n_tables} "
                         f"(K x L = {k * n_tables})")
    return int(k), int(n_tables)


def full_grid(bits: int) -> list[tuple[int, int]]:
    """Every ``(K, L)`` with ``K <= min(Q, 64)`` and ``K * L <= Q``, by K then L."""
    return [(k, n) for k in range(1, min(bits, MAX_SUBSTRING_BITS) + 1)
            for n in range(1, bits // k + 1)]


def segments(bits01: np.ndarray, k: int, n_tables: int) -> np.ndarray:
    """``(n, L)`` uint64 values of the first L K-bit segments (most significant bit first)."""
    bits = bits01.shape[1]
    words = as_words(bits01, bits)
    starts = np.arange(n_tables, dtype=np.int64) * k
    widths = np.full(n_tables, k, dtype=np.int64)
    return _substrings(words, starts, widths, np.array(word_widths(bits), dtype=np.int64))


@pjit
def _min_segment_batch(qseg, bseg, rel, k, count, relevant):
    """For every query of the block and every L = 1..Lmax: the histogram over v = 0..K of
    ``m_L = min_{j < L} d_j`` (counts, and counts of relevant items). ``count[q, L-1, v]``
    receives +1 where an item's running minimum drops to v and -1 where it leaves its previous
    value (column K + 1 stands for "no segment yet"); a cumulative sum over L turns that into
    the exact histogram."""
    nq = qseg.shape[0]
    nb = bseg.shape[0]
    n_seg = qseg.shape[1]
    for q in prange(nq):
        for i in range(nb):
            cur = k + 1
            is_rel = rel[q, i]
            for j in range(n_seg):
                d = popcount64(qseg[q, j] ^ bseg[i, j])
                if d < cur:
                    count[q, j, d] += 1
                    count[q, j, cur] -= 1
                    if is_rel:
                        relevant[q, j, d] += 1
                        relevant[q, j, cur] -= 1
                    cur = d
                    if d == 0:
                        break


@pjit
def _min_segment_word(xq, xb, bits, ks, n_seg, base, masks, rel, count, relevant):
    """Codes of at most 64 bits (one word each): every segment width ``ks[t]`` in one pass over
    the pairs, ``x = q XOR b`` read once and the segments cut from it in registers. Same
    difference-array layout as :func:`_min_segment_batch`, width t's block at ``base[t]`` with
    ``n_seg[t]`` rows of ``ks[t] + 2`` columns."""
    nq = xq.shape[0]
    nb = xb.shape[0]
    n_k = ks.shape[0]
    for q in prange(nq):
        cq = count[q]
        rq = relevant[q]
        for i in range(nb):
            x = xq[q] ^ xb[i]
            is_rel = rel[q, i]
            for t in range(n_k):
                k = ks[t]
                mask = masks[t]
                step = np.uint64(k)
                shift = np.uint64(bits - k)
                o = base[t]
                stride = k + 2
                cur = k + 1
                for _ in range(n_seg[t]):
                    d = popcount64((x >> shift) & mask)
                    if d < cur:
                        cq[o + d] += 1
                        cq[o + cur] -= 1
                        if is_rel:
                            rq[o + d] += 1
                            rq[o + cur] -= 1
                        cur = d
                        if d == 0:
                            break
                    shift -= step
                    o += stride


def _check_pair(db_bits, query_bits, relevance: Relevance):
    xb, xq = bit_array(db_bits, "db codes"), bit_array(query_bits, "query codes")
    if xq.shape[1] != xb.shape[1]:
        raise ValueError(f"db codes have Q = {xb.shape[1]} bits but query codes have "
                         f"{xq.shape[1]}")
    if relevance.n_queries != len(xq) or relevance.n_db != len(xb):
        raise ValueError(f"relevance covers {relevance.n_queries} queries x {relevance.n_db} db "
                         f"items but the codes are {len(xq)} x {len(xb)}")
    return xb, xq


def min_segment_histograms(db_bits, query_bits, relevance: Relevance,
                           tables: dict[int, int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """For each segment width K of ``tables`` (K -> largest L wanted, Lmax): ``(count,
    relevant)``, each ``(nq, Lmax, K + 1)`` int64: for L = 1..Lmax (axis 1, index L - 1) and
    v = 0..K, the items (relevant items) whose min-segment distance ``m_L`` is v."""
    xb, xq = _check_pair(db_bits, query_bits, relevance)
    bits = xb.shape[1]
    ks = sorted(tables)
    for k in ks:
        check_tables(bits, k, tables[k])
    shapes = [(tables[k], k + 2) for k in ks]
    base = np.concatenate([[0], np.cumsum([a * b for a, b in shapes])]).astype(np.int64)
    nq = len(xq)
    count = np.zeros((nq, int(base[-1])), dtype=np.int64)
    relevant = np.zeros_like(count)
    if bits <= 64:
        wb, wq = as_words(xb, bits)[:, 0].copy(), as_words(xq, bits)[:, 0].copy()
        karr = np.array(ks, dtype=np.int64)
        masks = np.array([(1 << k) - 1 for k in ks], dtype=np.uint64)
        n_seg = np.array([tables[k] for k in ks], dtype=np.int64)
    else:
        segs = {k: (segments(xb, k, tables[k]), segments(xq, k, tables[k])) for k in ks}
    for s in range(0, nq, QUERY_BLOCK):
        e = min(nq, s + QUERY_BLOCK)
        rel = np.ascontiguousarray(
            dense(relevance.subset_queries(np.arange(s, e)), graded=False) > 0)
        if bits <= 64:
            _min_segment_word(wq[s:e], wb, bits, karr, n_seg, base, masks, rel, count[s:e],
                              relevant[s:e])
            continue
        for t, k in enumerate(ks):
            sb, sq = segs[k]
            block = (slice(s, e), slice(base[t], base[t + 1]))
            _min_segment_batch(sq[s:e], sb, rel, k, count[block].reshape(e - s, *shapes[t]),
                               relevant[block].reshape(e - s, *shapes[t]))
    out = {}
    for t, k in enumerate(ks):
        c, r = (a[:, base[t]:base[t + 1]].reshape(nq, *shapes[t]) for a in (count, relevant))
        out[k] = (np.cumsum(c, axis=1)[:, :, :k + 1], np.cumsum(r, axis=1)[:, :, :k + 1])
    return out


def as_histograms(count: np.ndarray, relevant: np.ndarray, n_db: int) -> Histograms:
    """One configuration's ``(nq, K + 1)`` min-segment histogram in the form the radius metrics
    read (``bits`` = K: the radius axis runs over 0..K)."""
    nq, width = count.shape
    rel = relevant.astype(np.float64)
    return Histograms(width - 1, n_db, False, count, relevant, rel, rel,
                      np.zeros(0, dtype=np.int64), np.zeros((nq, 0)))


@dataclass
class EngineCost:
    """What the engine measured for one (K, L, r): means over queries."""

    radius: int
    lookup_ns_mean: float
    lookup_ns_p50: float
    total_ns_mean: float
    probes: int
    candidates_mean: float
    retrieved_mean: float
    retrieved: np.ndarray  # (nq,) unique candidates: the retrieved set size per query


def timed_search(index, wq: np.ndarray, radius: int, repeats: int = 1) -> dict:
    """Per-query statistics of a range search of every query at ``radius`` on ``index`` (any
    engine): one warm-up search, then the fastest of ``repeats`` runs by mean ``total_ns``.
    Queries run in chunks so that no search holds more than ``ENGINE_RESULT_BUDGET`` results.
    Returns ``(nq,)`` arrays ``lookup_ns`` (summed over radius steps), ``total_ns`` (the whole
    query in the kernel) and, for multi-index hashing, ``candidates`` / ``unique_candidates``
    (summed over steps)."""
    chunk = max(1, ENGINE_RESULT_BUDGET // max(index.ntotal, 1))
    index.range_search(wq[:1], radius)  # warm-up (compilation, caches)
    best = None
    for _ in range(max(1, repeats)):
        parts = [index.range_search(wq[s:s + chunk], radius, stats=True)[3]
                 for s in range(0, len(wq), chunk)]
        out = {"total_ns": np.concatenate([p.total_ns for p in parts]),
               "lookup_ns": np.concatenate([p.lookup_ns.sum(axis=1) for p in parts])}
        for name in ("candidates", "unique_candidates"):
            if all(getattr(p, name) is not None for p in parts):
                out[name] = np.concatenate([getattr(p, name).sum(axis=1) for p in parts])
        if best is None or out["total_ns"].mean() < best["total_ns"].mean():
            best = out
    return best


def engine_cost(db_bits, query_bits, k: int, n_tables: int, radii,
                max_probes: int = DEFAULT_MAX_PROBES, repeats: int = 1) -> dict:
    """Build the L tables of K-bit segments as a :class:`~bucketsearch.index.mih.MultiIndex` (``m =
    L`` substrings of the ``K * L``-bit codes) and time a lookup at each per-table radius r by its
    range search to ``R = L (r + 1) - 1`` (module docstring). Returns ``{r: EngineCost}``;
    radii whose probes per query ``L * sum_{i<=r} C(K, i)`` exceed ``max_probes`` are left out."""
    from bucketsearch.index.mih import MultiIndex

    xb, xq = bit_array(db_bits, "db codes"), bit_array(query_bits, "query codes")
    k, n_tables = check_tables(xb.shape[1], k, n_tables)
    bits = k * n_tables
    index = MultiIndex(bits, substrings=n_tables, max_probes=max_probes)
    index.add(np.ascontiguousarray(xb[:, :bits]))
    wq = as_words(np.ascontiguousarray(xq[:, :bits]), bits)
    out = {}
    for r in radii:
        r = int(r)
        if not 0 <= r <= k:
            raise ValueError(f"table radius must be in [0, K={k}], got {r}")
        probes = n_tables * sum(math.comb(k, i) for i in range(r + 1))
        if probes > max_probes:
            continue
        st = timed_search(index, wq, min(n_tables * (r + 1) - 1, bits), repeats)
        lookup = st["lookup_ns"]
        out[r] = EngineCost(r, float(lookup.mean()), float(np.median(lookup)),
                            float(st["total_ns"].mean()), int(probes),
                            float(st["candidates"].mean()),
                            float(st["unique_candidates"].mean()), st["unique_candidates"])
    return out


def evaluate_tables(db_codes, query_codes, relevance: Relevance, configs=None,
                    conventions: Conventions = DEFAULT, measure_radii=(0,),
                    max_probes: int = DEFAULT_MAX_PROBES, per_query: bool = False,
                    check_engine: bool = True) -> dict:
    """Bucket evaluation of every ``(K, L)`` in ``configs`` (default :func:`full_grid`).

    Per configuration and per-table radius r = 0..K: macro and micro precision, recall and
    F-beta of the retrieved set ``{x : m_L(q, x) <= r}`` (conventions as in
    :func:`bucketsearch.index.metrics.radius.radius_metrics`: empty set precision
    ``empty_precision``, queries
    without relevant items per ``no_relevant``), the mean retrieved-set size, the modeled probes
    ``L * sum_{i<=r} C(K, i)``; and for each r in ``measure_radii`` (empty: none) the engine's
    measured cost (:func:`engine_cost`). ``check_engine`` raises if the engine's retrieved set
    sizes differ from the histogram's (they are the same set, computed two ways).
    """
    if not conventions.radius_inclusive:
        raise ValueError("the hashtable protocol probes each table to radius r inclusive "
                         "(d <= r); radius_inclusive=False (--radius-exclusive) does not apply")
    xb, xq = _check_pair(db_codes, query_codes, relevance)
    bits = xb.shape[1]
    configs = full_grid(bits) if configs is None else [check_tables(bits, k, n)
                                                       for k, n in configs]
    if not configs:
        raise ValueError("tables: no (K, L) configuration given")
    by_k: dict[int, list[int]] = {}
    for k, n in configs:
        by_k.setdefault(k, []).append(n)
    rows = []
    hists = min_segment_histograms(xb, xq, relevance, {k: max(n) for k, n in by_k.items()})
    for k in sorted(by_k):
        count, relevant = hists[k]
        for n in sorted(set(by_k[k])):
            hist = as_histograms(count[:, n - 1], relevant[:, n - 1], len(xb))
            rows.append(_config_row(hist, k, n, conventions, per_query))
            radii = [r for r in measure_radii if r <= k]
            if radii:
                measured = engine_cost(xb, xq, k, n, radii, max_probes)
                n_in = np.cumsum(hist.count, axis=1)
                for r, cost in measured.items():
                    if check_engine and not np.array_equal(cost.retrieved, n_in[:, r]):
                        raise RuntimeError(f"engine and histogram disagree on the retrieved "
                                           f"set of (K={k}, L={n}, r={r})")
                    rows[-1]["measured"].append(
                        {"radius": r, "lookup_ns_mean": cost.lookup_ns_mean,
                         "lookup_ns_p50": cost.lookup_ns_p50,
                         "total_ns_mean": cost.total_ns_mean,
                         "candidates_mean": cost.candidates_mean,
                         "retrieved_mean": cost.retrieved_mean})
    return {"bits": bits, "n_db": len(xb), "n_queries": len(xq),
            "conventions": conventions.as_dict(), "measure_radii": [int(r) for r in measure_radii],
            "configs": rows}


def _config_row(hist: Histograms, k: int, n_tables: int, conv: Conventions,
                per_query: bool) -> dict:
    """Metrics of one (K, L) at every per-table radius r = 0..K (see evaluate_tables)."""
    from bucketsearch.index.metrics import to_jsonable
    rm = radius_metrics(hist, conv)
    retrieved = np.cumsum(hist.count, axis=1)
    row = {"K": k, "L": n_tables, "bits_used": k * n_tables,
           "radius": list(range(k + 1)),
           "probes": [n_tables * sum(math.comb(k, i) for i in range(r + 1))
                      for r in range(k + 1)],
           "precision_macro": rm.precision_macro, "recall_macro": rm.recall_macro,
           "f_beta_macro": rm.f_beta_macro, "precision_micro": rm.precision_micro,
           "recall_micro": rm.recall_micro, "f_beta_micro": rm.f_beta_micro,
           "retrieved_mean": retrieved.mean(axis=0),
           "empty_queries": (retrieved == 0).sum(axis=0),
           "measured": []}
    if per_query:
        row["per_query"] = {"precision": rm.precision, "recall": rm.recall,
                            "f_beta": rm.f_beta, "retrieved": retrieved}
    return to_jsonable(row)


def format_tables(res: dict) -> str:
    """One line per (K, L, r) for the radii timed in the engine (r = 0, 1 when none were):
    modeled probes, mean retrieved set, micro and macro P / R / F-beta, measured lookup."""
    beta = res["conventions"]["beta"]
    lines = [f"hashtable buckets: {res['n_queries']} queries x {res['n_db']} db items, "
             f"Q = {res['bits']} bits; L tables of K-bit segments (first K*L bits), union of "
             f"the buckets within radius r of each table; F-beta with beta = {beta}", "",
             f"{'K':>3s} {'L':>3s} {'r':>2s} {'probes':>8s} {'retrieved':>10s} {'P_micro':>8s} "
             f"{'R_micro':>8s} {'F_micro':>8s} {'P_macro':>8s} {'R_macro':>8s} {'F_macro':>8s} "
             f"{'lookup_us':>10s}"]
    fmt = lambda v: "       -" if v is None else f"{v:8.4f}"  # noqa: E731
    for row in res["configs"]:
        measured = {m["radius"]: m for m in row["measured"]}
        for r in (sorted(measured) or [r for r in (0, 1) if r <= row["K"]]):
            m = measured.get(r)
            lines.append(
                f"{row['K']:3d} {row['L']:3d} {r:2d} {row['probes'][r]:8d} "
                f"{row['retrieved_mean'][r]:10.1f} {fmt(row['precision_micro'][r])} "
                f"{fmt(row['recall_micro'][r])} {fmt(row['f_beta_micro'][r])} "
                f"{fmt(row['precision_macro'][r])} {fmt(row['recall_macro'][r])} "
                f"{fmt(row['f_beta_macro'][r])} "
                f"{'-' if m is None else format(m['lookup_ns_mean'] / 1e3, '.2f'):>10s}")
    return "\n".join(lines)
