"""Where the paper's model holds: the analysis of one study cell (issue 12 item 4).

A *cell* is one engine over one code set (distribution, N, Q) and one query batch, searched as
a radius-R range search for every ``R = 0..R_max``; ``searches[R]`` holds the statistics of
the radius-R search (every query, ``radii = R + 1``). Per search of query ``q`` at radius
``R`` the measured time ``T_q(R)`` is, by ``clock``:

* ``total``: the query's whole in-kernel time of the radius-R search (``total_ns``: what the
  search costs, sorting and emitting the results included);
* ``lookup``: the sum of its per-radius ``lookup_ns``, ``sum_{r<=R} T(r)`` (the docs' ``T(R)``:
  the rings of the Hamming ball only; zero for a scan, which has no rings).

The paper (Jiang, Li & Li) charges ``T(R) = t0 P(R)``, ``P(R) = sum_{i<=R} C(Q, i)``, so
``T(R)/T(0) = P(R)`` whatever ``t0`` is: the ratio RAMAP weights by. Per radius the cell
reports ``T(R)`` (p50, mean over the queries), ``T(R)_p50 / T(0)_p50`` beside ``P(R)``, the
modeled ``t0 P(R)`` over the measured p50 (``t0`` by the estimator ``radius_fit`` of the single
table of the same data, or of the cell), the engine's own probes, items, candidates and the
queries whose ball held no item, and the share of each term of the extended model in the
modeled mean ``T(R)``. The extended model is fitted on the cell's per-search samples with the
same clock on relative errors (:func:`fit_relative_query_model`); :func:`~.estimators.fit_all`
(every ``t0`` estimate, the plain ``query_model``) runs on the same samples and is kept in
``fits``.

Verdict (:func:`verdict`): the paper model *holds within X%* from ``R*`` when
``|t0 P(R) / T(R)_p50 - 1| <= tolerance`` for every measured ``R >= R*`` (X the largest such
error); every radius outside that tail *breaks*, and the reason is named from the extended
model: the engine does not probe ``P(R)`` buckets (multi-index hashing probes substrings, a scan
probes none), or the term that dominates the modeled time there (the fixed cost per query, the
per-item or per-non-empty-bucket cost, the per-candidate cost), or, when probes dominate, a per
probe cost away from ``t0``.

Goodness of fit of the paper model on the cell itself: ``t0`` fitted through the origin on the
per-radius ``(P(R), T(R)_p50)`` (:func:`~.paper.fit_t0`, the best ``t0`` the paper model can
pick for the cell) and ``R^2`` of ``t0 P(R)`` against ``T(R)_p50`` (:func:`~.paper.r_squared`),
also on log10 of both
(``r2_log``): ``P(R)`` grows geometrically, so the plain ``R^2`` is decided by the largest
radius alone and is near 1 whenever that one fits, whatever happens at small radii.
"""
from __future__ import annotations

import math

import numpy as np

from bucketsearch.index.base import stack_padded
from bucketsearch.index.costmodel.estimators import (QUERY_TERMS, TRIM_RULE, CostSamples,
                                                     as_samples, fit_all, summary, within_fence)
from bucketsearch.index.fits.paper import fit_t0, paper_probes, r_squared
from bucketsearch.index.fits.regression import fit_linear

STUDY = "paper_model_study"
CLOCKS = ("total", "lookup")
#: relative error of ``t0 P(R)`` against ``T(R)_p50`` within which the paper model holds
TOLERANCE = 0.25
#: the query model's terms in this study: every term the estimator knows
STUDY_TERMS = QUERY_TERMS
REASONS = {
    "fixed": "the fixed cost per query dominates",
    "probes": "probes dominate but the cost per probe is not t0",
    "items": "the per-item cost dominates",
    "nonempty_buckets": "the per-non-empty-bucket cost dominates",
    "candidates": "the per-candidate cost (multi-index hashing) dominates",
}


# ------------------------------------------------------------------------ samples
def concat_samples(parts) -> CostSamples:
    """One :class:`CostSamples` from several (each anything :func:`as_samples` takes): rows one
    after the other, per-radius arrays zero-padded to the widest; ``candidates`` and
    ``total_ns`` kept when every part has them."""
    parts = [as_samples(p) for p in parts]
    width = max(p.width for p in parts)

    names = ("probes", "nonempty_buckets", "empty_buckets", "items", "lookup_ns", "radii",
             "candidates", "total_ns")
    return CostSamples(**{n: stack_padded([getattr(p, n) for p in parts], width)
                          for n in names})


def fastest_repeat(runs):
    """Per query, the statistics of the repeat with the least ``total_ns`` (interference on a
    shared machine only ever adds time): ``runs`` are SearchStats of the same queries and
    radius, the result one SearchStats (``SearchStats.concat`` then ``rows``)."""
    if len(runs) == 1:
        return runs[0]
    nq = len(runs[0].total_ns)
    times = np.stack([np.asarray(r.total_ns) for r in runs])
    best = np.argmin(times, axis=0)
    return type(runs[0]).concat(list(runs)).rows(best * nq + np.arange(nq))


def search_times(samples: CostSamples, clock: str = "total") -> np.ndarray:
    """``T_q(R)`` of every row (one query's radius-R search) by ``clock``."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if clock == "total":
        if samples.total_ns is None:
            raise ValueError("clock 'total' needs total_ns, which these samples lack")
        return np.asarray(samples.total_ns, dtype=np.float64)
    return samples.per_query("lookup_ns").astype(np.float64)


# ------------------------------------------------------------------------ one cell
def term_shares(query_model: dict, features: dict[str, float]) -> dict:
    """Each fitted term's part of the modeled mean time of a radius: ``{term: coef * mean
    feature}`` in ns (``fixed``: its coefficient), the sum ``modeled_ns`` and the shares
    (fractions of the sum; a negative coefficient gives a negative share)."""
    parts = {}
    for name, term in query_model["terms"].items():
        x = 1.0 if name == "fixed" else float(features.get(name, 0.0))
        parts[name] = term["coef_ns"] * x
    total = sum(parts.values())
    shares = {k: (v / total if total else math.nan) for k, v in parts.items()}
    dominant = max(parts, key=lambda k: parts[k]) if parts else None
    return {"parts_ns": parts, "modeled_ns": total, "shares": shares, "dominant": dominant}


RELATIVE_MODEL = "query_model.relative"


def fit_relative_query_model(samples: CostSamples, times, scale, terms=STUDY_TERMS) -> dict:
    """The extended model ``T = fixed + t_probe P + t_item I + t_cand C + t_nonempty B`` fitted
    on *relative* errors: every row (one query's radius-R search) and its columns divided by
    ``scale`` (the p50 of ``T(R)`` of its radius), so that each radius weighs alike. The plain
    ``query_model`` (:func:`~.estimators.fit_query_model`, ordinary least squares) is decided
    by the largest radius, whose times are thousands of times the others': its intercept is
    then no fixed cost at all (it can be negative), and the shares of the terms at small radii
    are meaningless. Weighted least squares by row scaling (the same coefficients, the same
    identifiability rule and HC3 intervals, :func:`~.regression.fit_linear`); rows above the
    far-out fence of their radius left out. Returns the fit as a dict (``terms`` with
    ``coef_ns``, ``unidentified``, ``r2`` of the relative residuals, ``excluded``)."""
    times = np.asarray(times, dtype=np.float64)
    scale = np.maximum(np.asarray(scale, dtype=np.float64), 1.0)
    keep = within_fence(times, samples.radii)
    columns, missing = {"fixed": 1.0 / scale[keep]}, {}
    for t in terms:
        if t == "candidates" and samples.candidates is None:
            missing[t] = "not recorded (only multi-index hashing examines candidates)"
        elif t != "fixed":
            columns[t] = samples.per_query(t)[keep] / scale[keep]
    order = [t for t in terms if t not in missing]
    fit = fit_linear(columns, times[keep] / scale[keep], order)
    fit.unidentified.update(missing)
    return {"estimator": RELATIVE_MODEL, "excluded": int((~keep).sum()), "rule": TRIM_RULE,
            "weights": "1 / T(R)_p50 of the row's radius", **fit.to_dict()}


def analyse_cell(searches, bits: int, t0_ns: float | None = None, t0_source: str | None = None,
                 clock: str = "total", microbenchmark: dict | None = None,
                 tolerance: float = TOLERANCE, terms: tuple[str, ...] = STUDY_TERMS) -> dict:
    """The study's figures for one cell (see the module docstring); JSON-ready.

    ``searches[R]``: the statistics (SearchStats, CostSamples) of the radius-R search of the
    cell's queries, ``R = 0..len(searches) - 1``. ``t0_ns``: the paper's ``t0`` to judge by
    (``t0_source`` names it; default: the ``radius_fit`` of this cell, from :func:`fit_all`).
    ``microbenchmark``: a probe micro-benchmark of the single table, passed to :func:`fit_all`.
    """
    parts = [as_samples(s) for s in searches]
    if not parts:
        raise ValueError("searches: at least the radius-0 search is needed")
    for R, p in enumerate(parts):
        if not np.all(p.radii == R + 1):
            raise ValueError(f"searches[{R}]: every query must have searched radii 0..{R}")
    allsamp = concat_samples(parts)
    fits = fit_all(allsamp, bits, microbenchmark=microbenchmark, terms=terms, time=clock)
    if t0_ns is None:
        t0_ns, t0_source = fits["t0_ns"], f"radius_fit of this cell ({fits['t0_estimator']})"
    P = paper_probes(bits, len(parts) - 1)
    p50s = [float(np.percentile(search_times(p, clock), 50)) for p in parts]
    qm = fit_relative_query_model(
        allsamp, np.concatenate([search_times(p, clock) for p in parts]),
        np.concatenate([np.full(p.nq, p50s[R]) for R, p in enumerate(parts)]), terms)
    rows = []
    for R, p in enumerate(parts):
        t = search_times(p, clock)
        cum_items = p.per_query("items")
        feats = {"probes": float(p.per_query("probes").mean()),
                 "items": float(cum_items.mean()),
                 "nonempty_buckets": float(p.per_query("nonempty_buckets").mean())}
        if p.candidates is not None:
            feats["candidates"] = float(p.per_query("candidates").mean())
        rows.append({"radius": R, "queries": p.nq, "paper_probes": P[R],
                     "measured": summary(t), "engine": feats,
                     "empty_ball_queries": int((cum_items == 0).sum()),
                     "model": term_shares(qm, feats) if qm["terms"] else None})
    base = rows[0]["measured"]["p50_ns"]
    p50 = np.array([r["measured"]["p50_ns"] for r in rows], dtype=np.float64)
    for r in rows:
        m = r["measured"]["p50_ns"]
        r["measured_ratio"] = m / base if base else None
        r["paper_ratio"] = r["paper_probes"]
        r["ratio_over_paper"] = (r["measured_ratio"] / float(r["paper_probes"])
                                 if r["measured_ratio"] is not None else None)
        r["paper_ns"] = t0_ns * float(r["paper_probes"]) if t0_ns else None
        r["paper_over_measured"] = r["paper_ns"] / m if r["paper_ns"] and m else None
    ok = p50 > 0
    own_t0 = fit_t0([P[R] for R in range(len(parts))], p50)
    modeled = own_t0 * np.array([float(x) for x in P])
    with np.errstate(divide="ignore"):
        r2_log = (r_squared(np.log10(p50[ok]), np.log10(modeled[ok])) if own_t0 > 0
                  and ok.sum() > 1 else math.nan)
    return {"bits": int(bits), "clock": clock, "radii": rows,
            "max_radius": len(parts) - 1, "t0_ns": t0_ns, "t0_source": t0_source,
            "paper_fit": {"t0_ns": own_t0, "r2": r_squared(p50, modeled) if len(p50) > 1
                          else math.nan, "r2_log": r2_log,
                          "estimator": "fit_t0 through the origin on (P(R), T(R)_p50) over "
                                       "the radii; R^2 on the same"},
            "fits": fits, "extended_model": qm, "verdict": verdict(rows, tolerance)}


def _reason(row: dict) -> tuple[str, str]:
    """Why the paper model breaks at one radius (see the module docstring): ``(kind, text)``,
    ``kind`` one of ``engine`` (the engine does not probe ``P(R)`` buckets), a term of the
    extended model that dominates there, or ``none``."""
    eng = row["engine"]["probes"]
    P = float(row["paper_probes"])
    if not math.isclose(eng, P, rel_tol=1e-9):
        what = "no bucket" if eng == 0 else f"{eng:.3g} buckets"
        return "engine", f"engine probes {what} per query, not sum C(Q, i) = {P:.3g}"
    model = row["model"]
    dom = model["dominant"] if model else None
    if dom is None:
        return "none", "no extended model term identified"
    share = model["shares"][dom]
    return dom, f"{REASONS.get(dom, dom)} ({share:.0%} of the modeled time)"


def verdict(rows: list[dict], tolerance: float = TOLERANCE) -> dict:
    """Where ``t0 P(R)`` is within ``tolerance`` of ``T(R)_p50`` (rows from
    :func:`analyse_cell`): ``holds_from`` (the smallest R* with every measured R >= R*
    within), ``within`` (the largest relative error there), ``breaks`` (radius -> reason),
    ``paper_over_measured`` (radius -> ``t0 P(R) / T(R)_p50``) and ``text``."""
    err = {r["radius"]: (None if r["paper_over_measured"] is None
                         else r["paper_over_measured"] - 1.0) for r in rows}
    holds_from = None
    for r in sorted(err, reverse=True):
        if err[r] is None or abs(err[r]) > tolerance:
            break
        holds_from = r
    tail = [r for r in err if holds_from is not None and r >= holds_from]
    within = max(abs(err[r]) for r in tail) if tail else None
    factors = {r: (None if e is None else e + 1.0) for r, e in err.items()}
    broken = [r for r in rows if holds_from is None or r["radius"] < holds_from]
    reasons = {r["radius"]: _reason(r) for r in broken}
    if holds_from is None:
        text = f"breaks at every measured radius 0..{max(err)}"
    else:
        text = (f"holds within {100 * within:.0f}% for R = {holds_from}..{max(err)}"
                + (f"; breaks for R < {holds_from}" if holds_from > 0 else ""))
    if reasons:
        by_kind: dict[str, list[int]] = {}
        for r, (kind, _) in reasons.items():
            by_kind.setdefault(kind, []).append(r)
        parts = []
        for kind, rs in by_kind.items():
            f = [factors[r] for r in rs if factors[r] is not None]
            span = (f"t0 P(R)/T(R) = {_fmt(min(f))}" + (f"..{_fmt(max(f))}" if len(f) > 1
                                                        else "")) if f else ""
            if kind == "engine":
                probes = [next(x for x in rows if x["radius"] == r)["engine"]["probes"]
                          for r in rs]
                why = ("the engine probes no bucket (a scan)" if max(probes) == 0 else
                       f"the engine probes {_fmt(min(probes))}..{_fmt(max(probes))} buckets, "
                       "not sum C(Q, i)")
            else:
                why = REASONS.get(kind, kind)
            parts.append(f"R = {_span(rs)}: {why} ({span})")
        text += ": " + "; ".join(parts)
    return {"tolerance": tolerance, "holds_from": holds_from, "within": within,
            "paper_over_measured": factors,
            "breaks": {r: text for r, (_, text) in reasons.items()},
            "break_kinds": {r: kind for r, (kind, _) in reasons.items()}, "text": text}


def _span(rs: list[int]) -> str:
    rs = sorted(rs)
    return str(rs[0]) if len(rs) == 1 else f"{rs[0]}..{rs[-1]}" if rs == list(
        range(rs[0], rs[-1] + 1)) else ",".join(map(str, rs))


# ------------------------------------------------------------------------ rendering
def _fmt(v, spec=".3g") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, spec)


def _ns(v) -> str:
    if v is None:
        return "-"
    return (f"{v / 1e6:.3g} ms" if v >= 1e6 else f"{v / 1e3:.3g} us" if v >= 1e3
            else f"{v:.3g} ns")


def cell_markdown_row(cell: dict) -> str:
    """One line of the study's main table (``cell``: :func:`analyse_cell` plus ``dist``,
    ``n``, ``engine`` and ``plans``)."""
    rows = cell["radii"]
    last = rows[-1]
    r1 = rows[1] if len(rows) > 1 else None
    v = cell["verdict"]
    holds = ("never" if v["holds_from"] is None
             else f"R >= {v['holds_from']} (within {100 * v['within']:.0f}%)")
    runs: list[list] = []
    for r in rows:
        d = (r["model"] or {}).get("dominant") or "-"
        if runs and runs[-1][1] == d:
            runs[-1][0].append(r["radius"])
        else:
            runs.append([[r["radius"]], d])
    dom = ", ".join(f"{_span(rs)}: {d}" for rs, d in runs)
    return (f"| {cell['dist']} | {cell['n']:,} | {cell['bits']} | {cell['engine']}"
            f"{' (' + cell['plans'] + ')' if cell.get('plans') else ''} | {cell['max_radius']} | "
            f"{_ns(rows[0]['measured']['p50_ns'])} | "
            f"{_fmt(r1 and r1['measured_ratio'])} / {r1['paper_ratio'] if r1 else '-'} | "
            f"{_fmt(last['measured_ratio'])} / {last['paper_ratio']:,} | "
            f"{_fmt(cell['t0_ns'])} | {_fmt(cell['paper_fit']['r2'], '.3f')} / "
            f"{_fmt(cell['paper_fit']['r2_log'], '.2f')} | {holds} | {dom} |")


MARKDOWN_HEADER = (
    "| codes | N | Q | engine (plans) | R max | T(0) p50 | T(1)/T(0) / P(1) | "
    "T(Rmax)/T(0) / P(Rmax) | t0 ns | R^2 / R^2 log | paper model holds | "
    "dominant term per R |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


__all__ = ["CLOCKS", "STUDY", "STUDY_TERMS", "TOLERANCE", "MARKDOWN_HEADER", "analyse_cell",
           "cell_markdown_row", "concat_samples", "fastest_repeat", "search_times",
           "term_shares", "verdict"]
