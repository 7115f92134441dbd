"""The radius advisor: for one index and radii 0..R, what a radius search would return, what
it costs, and (given relevance) how good it is, with a recommended radius and its reason.

Inputs: the query codes ``xq`` (a sample of the index's own codes, or codes the user sent), the
database they are scored against ``xb`` (the index's live items; with ``holdout`` the sampled
items are left out, the query/database split of the literature, so the figures are those of
new items), optionally a :class:`~bucketsearch.index.evaluation.relevance.Relevance` over ``(xq,
xb)``,
and the index's :class:`~bucketsearch.index.storage.live.LiveState` (the engine whose cost is
measured).

Per radius r (every figure from the existing metrics package, no formula of its own):

* answers per query: ``N(q, r)``, the items within distance r (``ball_cumsum`` of the
  histogram pass :func:`~bucketsearch.index.metrics.histogram.hamming_histograms`): mean and
  p50/p90/p99; ``empty_share = empty_ball_queries[r] / nq``
  (:mod:`bucketsearch.index.metrics.space`);
* cost per query of the mode that runs: ``modeled_probes`` (the engine's own
  ``probe_count(r)``: sum C(Q, i) for a single table, substring probes for MIH, the plan's count
  for ``auto``), ``modeled_ns`` (``t0 x probes`` for single and MIH, the planner's predicted ns
  for ``auto``, whose chosen plan is ``plan``; null without a fitted t0), ``ramap_probes`` (the paper's ``sum_{i<=r} C(Q, i)``)
  and ``measured_ns``: the wall time of ``state.range_search`` of the first ``measure_queries``
  queries of the sample divided by their number, the fastest of ``repeats`` runs after one
  warm-up (null, with ``measured_note``, when
  the probe guard, the request probe budget or ``max_results`` refuses the radius);
* with relevance: precision / recall / F1 (macro, with a 95% percentile bootstrap interval of
  the mean over queries, :func:`~bucketsearch.index.evaluation.significance.bootstrap_ci`; and
  micro),
  RAMAP@r (:func:`~bucketsearch.index.metrics.ramap.ramap`, modeled cost) with its interval, from
  :func:`bucketsearch.index.metrics.evaluate` itself, so the numbers are ``bucketsearch eval``'s on
  the same
  codes. mAP (tie-aware, over the whole Hamming ranking) does not depend on the radius: it is
  given once, with its interval; RAMAP@r is the radius-aware mAP.

The recommendation (:func:`recommend`; ``RULE`` is its text, returned with the figures):

1. eligible radii: measured (or, when nothing was measured, modeled) cost known, cost per query
   ``<= budget_ns`` when a budget is given, and, with relevance, ``precision_macro >=
   min_precision``;
2. with relevance, quality ``q(r)`` is ``f1_macro`` (objective ``"f1"``) or ``recall_macro``
   (``"recall"``); ``best = max q(r)`` over eligible radii; the recommended radius is the
   smallest eligible r with ``q(r) >= best - min_gain``: larger radii add less than ``min_gain``
   of quality for their extra cost;
3. without relevance: with a budget, the largest eligible radius (the widest ball the budget
   pays for); without one, no recommendation (the reason says what to give).

The reason names the recommended radius's quality and cost, and what the next radius would add
and at what cost ratio (``cost(r+1) / cost(r)``). Pareto marks (:func:`~index.evaluation.
frontier.pareto`, lower cost and higher quality) place each radius on the quality-vs-cost
frontier; :func:`frontier_view` shapes them for
:func:`~bucketsearch.index.evaluation.frontier.plot_frontier`.
"""
from __future__ import annotations

import time

import numpy as np

from bucketsearch.index.evaluation.frontier import pareto
from bucketsearch.index.evaluation.significance import bootstrap_ci
from bucketsearch.index.metrics.conventions import DEFAULT, Conventions

OBJECTIVES = ("f1", "recall")
PERCENTILES = (50, 90, 99)
DEFAULT_RESAMPLES = 1_000
RULE = ("eligible radii: cost known (measured, else modeled), cost <= budget when given, "
        "precision_macro >= min_precision when relevance is given; with relevance, q(r) = "
        "f1_macro (objective f1) or recall_macro (objective recall), best = max q over eligible "
        "radii, recommended = the smallest eligible r with q(r) >= best - min_gain; without "
        "relevance, the largest eligible radius when a budget is given, else none")
_QUALITY_KEY = {"f1": "f1_macro", "recall": "recall_macro"}


def _interval(values: np.ndarray, resamples: int, seed: int) -> list[float] | None:
    """95% percentile bootstrap interval of the mean of ``values`` (NaN dropped)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if not len(v) or resamples == 0:
        return None
    return list(bootstrap_ci(v, np.zeros(len(v)), n_resamples=resamples, seed=seed))


def measure_radius(state, xq: np.ndarray, radius: int, *, max_probes: int | None,
                   max_results: int | None, repeats: int) -> tuple[float | None, str | None]:
    """``(ns per query, None)``: the fastest of ``repeats`` timed ``state.range_search`` of the
    sample after a warm-up run; ``(None, reason)`` when a limit refuses it (before any work for
    the probe limits, as the search route does)."""
    from bucketsearch.index.base import ProbeLimitError, ResultLimitError
    from bucketsearch.index.storage.reads import with_probe_limit

    nq = len(xq)
    main = state.main
    share = None if max_probes is None else max(max_probes // nq, 1)
    per_query = with_probe_limit(main, share).probe_count(radius, nq)
    if per_query > main.max_probes:
        return None, (f"not measured: {per_query:,} probes a query, above the probe guard "
                      f"max_probes={main.max_probes:,}")
    if max_probes is not None and nq * per_query > max_probes:
        return None, (f"not measured: {nq} queries x {per_query:,} probes, above "
                      f"max_request_probes={max_probes:,}")
    best = None
    try:
        for i in range(repeats + 1):
            t = time.perf_counter_ns()
            state.range_search(xq, radius, max_probes=share, max_results=max_results)
            if i:  # the first run warms caches and compiles
                best = min(best or np.inf, time.perf_counter_ns() - t)
    except ResultLimitError as exc:
        return None, (f"not measured: {nq} queries return at least {exc.reached:,} ids, above "
                      f"max_results={max_results:,}")
    except ProbeLimitError as exc:
        return None, f"not measured: {exc}"
    return float(best) / nq, None


def modeled_cost(main, radius: int, nq: int, t0_ns: float | None
                 ) -> tuple[int, float | None, str | None]:
    """``(probes a query, modeled ns a query or None, the planner's plan or None)`` of the
    engine ``main`` at ``radius`` (module docstring)."""
    probes = int(main.probe_count(radius, nq))
    if hasattr(main, "plan"):  # the planner: its prediction for the plan it would choose
        plan = main.plan(max_distance=radius, nq=nq)
        ns = plan["predicted_ns"].get(plan["mode"])
        return probes, None if ns is None else float(ns), plan["mode"]
    return probes, None if t0_ns is None else float(t0_ns) * probes, None


def radius_figures(hist, radius_max: int) -> dict:
    """Answers per query and the empty-ball share per radius 0..radius_max, from the
    histograms."""
    from bucketsearch.index.metrics.radius import ball_cumsum
    from bucketsearch.index.metrics.space import empty_ball_queries

    ball = ball_cumsum(hist.count)[:, :radius_max + 1]
    nq = max(hist.n_queries, 1)
    pct = np.percentile(ball, PERCENTILES, axis=0) if hist.n_queries else \
        np.full((len(PERCENTILES), radius_max + 1), np.nan)
    return {"answers_mean": ball.mean(axis=0) if hist.n_queries else np.zeros(radius_max + 1),
            **{f"answers_p{p}": pct[i] for i, p in enumerate(PERCENTILES)},
            "empty_share": empty_ball_queries(hist)[:radius_max + 1] / nq}


def recommend(radii: list[dict], *, relevance: bool, objective: str = "f1",
              min_gain: float = 0.01, min_precision: float = 0.0,
              budget_ns: float | None = None) -> dict:
    """The recommended radius and its reason from the per-radius figures alone (``RULE``)."""
    cost_key = "measured_ns" if any(r["measured_ns"] is not None for r in radii) \
        else "modeled_ns"
    qkey = _QUALITY_KEY[objective]
    eligible = []
    for row in radii:
        cost = row[cost_key]
        if cost is None or (budget_ns is not None and cost > budget_ns):
            continue
        if relevance and (row["precision_macro"] is None
                          or row["precision_macro"] < min_precision
                          or row[qkey] is None):
            continue
        eligible.append(row)
    out = {"radius": None, "cost": cost_key, "objective": objective if relevance else None,
           "min_gain": min_gain, "min_precision": min_precision, "budget_ns": budget_ns,
           "rule": RULE}
    if not eligible:
        out["reason"] = ("no radius is eligible: " + ("none has a known cost" if budget_ns is None
                         else f"none costs at most {budget_ns / 1e3:g} us a query")
                         + (f" with precision_macro >= {min_precision}" if relevance else ""))
        return out
    if relevance:
        best = max(row[qkey] for row in eligible)
        chosen = min((row for row in eligible if row[qkey] >= best - min_gain),
                     key=lambda row: row["radius"])
    elif budget_ns is not None:
        chosen = max(eligible, key=lambda row: row["radius"])
    else:
        out["reason"] = ("no relevance given: send labels or pairs marked duplicate / not "
                         "duplicate for a quality-based choice, or a cost budget for the "
                         "widest radius it pays for")
        return out
    r = chosen["radius"]
    out["radius"] = r
    cost = chosen[cost_key]
    if relevance:
        head = (f"r = {r}: {objective} {chosen[qkey]:.3f} (precision {chosen['precision_macro']:.3f}, "
                f"recall {chosen['recall_macro']:.3f}), {cost / 1e3:.3g} us a query")
    else:
        head = (f"r = {r}: {chosen['answers_mean']:.3g} answers a query, {cost / 1e3:.3g} us a "
                f"query, within the budget of {budget_ns / 1e3:g} us")
    nxt = next((row for row in radii if row["radius"] == r + 1), None)
    if nxt is None:
        tail = "the largest radius examined"
    elif nxt[cost_key] is None:
        tail = f"r = {r + 1} has no {cost_key.replace('_', ' ')} (a limit refused it)"
    else:
        ratio = nxt[cost_key] / cost if cost > 0 else float("inf")
        if relevance and nxt[qkey] is not None:
            tail = (f"r = {r + 1} adds {nxt[qkey] - chosen[qkey]:.3f} {objective} for "
                    f"{ratio:.1f}x the cost")
        else:
            tail = (f"r = {r + 1} costs {nxt[cost_key] / 1e3:.3g} us a query ({ratio:.1f}x)"
                    + (", over the budget" if budget_ns is not None
                       and nxt[cost_key] > budget_ns else ""))
    out["reason"] = f"{head}; {tail}"
    return out


def advise(view, xq: np.ndarray, xb: np.ndarray, relevance=None, *, radius_max: int,
           mode: str | None = None, conventions: Conventions = DEFAULT, t0_ns: float | None = None,
           objective: str = "f1", min_gain: float = 0.01, min_precision: float = 0.0,
           budget_ns: float | None = None, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
           max_request_probes: int | None = None, max_results: int | None = None,
           repeats: int = 3, measure_queries: int = 64) -> dict:
    """Every per-radius figure, the mAP, the recommendation and the frontier marks (module
    docstring) over one state of a live index (``view``: its
    :class:`~bucketsearch.index.storage.view.LiveView`). ``xq`` and ``xb`` are uint64 words of
    ``view.bits`` bits; ``relevance`` covers ``(len(xq), len(xb))``."""
    from bucketsearch.index.metrics.relevance import from_labels
    from bucketsearch.index.metrics import evaluate, hamming_histograms
    from bucketsearch.index.metrics.ramap import modeled_costs

    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    state = view.state
    bits = int(state.bits)
    if not 0 <= radius_max <= bits:
        raise ValueError(f"radius_max must be in [0, {bits}], got {radius_max}")
    if not conventions.radius_inclusive:
        raise ValueError("the advisor's searches retrieve d <= r: radius_inclusive must be true")
    nq, n_db = len(xq), len(xb)
    rel = relevance if relevance is not None else from_labels(np.zeros(nq, np.int64),
                                                              np.ones(n_db, np.int64))
    hist = hamming_histograms(xb, xq, rel, bits=bits, ks=(1,), as_ranked=False)
    n_r = radius_max + 1
    figures = radius_figures(hist, radius_max)
    quality = None
    if relevance is not None:
        quality = evaluate(None, None, rel, hist=hist, radius_max=radius_max, ks=(1,),
                           conventions=conventions, per_query=True)
    main = state.main
    ramap_probes = modeled_costs(bits, radius_max)
    radii = []
    for r in range(n_r):
        probes, modeled_ns, plan = modeled_cost(main, r, nq, t0_ns)
        measured, note = measure_radius(state, xq[:measure_queries], r,
                                        max_probes=max_request_probes,
                                        max_results=max_results, repeats=repeats) \
            if nq and measure_queries else (None, "not measured: no queries timed")
        row = {"radius": r, "answers_mean": float(figures["answers_mean"][r]),
               **{f"answers_p{p}": float(figures[f"answers_p{p}"][r]) for p in PERCENTILES},
               "empty_share": float(figures["empty_share"][r]),
               "modeled_probes": probes, "modeled_ns": modeled_ns,
               "ramap_probes": int(ramap_probes[r]), "measured_ns": measured, "plan": plan}
        if note is not None:
            row["measured_note"] = note
        if quality is not None:
            rad, pq = quality["radius"], quality["per_query"]["radius"]
            for key, pq_key in (("precision_macro", "precision_macro"),
                                ("recall_macro", "recall_macro"), ("f1_macro", "f1_macro"),
                                ("ramap", "ramap")):
                row[key] = rad[key][r]
                column = np.array([np.nan if v[r] is None else v[r] for v in pq[pq_key]])
                row[key + "_ci"] = _interval(column, resamples, seed)
            for key in ("precision_micro", "recall_micro", "f1_micro"):
                row[key] = rad[key][r]
        radii.append(row)
    result = {"bits": bits, "n_queries": nq, "n_db": n_db, "radius_max": radius_max,
              "measured_queries": min(nq, measure_queries),
              "mode": mode or type(main).__name__,
              "conventions": conventions.as_dict(), "resamples": resamples, "seed": seed,
              "percentiles": list(PERCENTILES), "radii": radii}
    if quality is not None:
        per_query_map = np.array([np.nan if v is None else v
                                  for v in quality["per_query"]["map_all"]["tie_aware"]])
        result["map"] = {"tie_aware": quality["map_all"]["tie_aware"],
                         "ci": _interval(per_query_map, resamples, seed)}
        result["n_no_relevant"] = quality["n_no_relevant"]
    result["recommendation"] = recommend(radii, relevance=quality is not None,
                                         objective=objective, min_gain=min_gain,
                                         min_precision=min_precision, budget_ns=budget_ns)
    mark_frontier(result)
    return result


def mark_frontier(result: dict) -> None:
    """``pareto`` (measured cost) and ``pareto_modeled`` (modeled probes) on every radius row,
    quality as the recommendation's objective (answers per query without relevance)."""
    rows = result["radii"]
    rec = result["recommendation"]
    qkey = _QUALITY_KEY[rec["objective"]] if rec["objective"] else "answers_mean"
    q = np.array([np.nan if row.get(qkey) is None else row[qkey] for row in rows], np.float64)
    cost = np.array([np.inf if row["measured_ns"] is None else row["measured_ns"]
                     for row in rows])
    modeled = np.array([float(row["modeled_probes"]) for row in rows])
    for row, a, b in zip(rows, pareto(cost, q), pareto(modeled, q)):
        row["pareto"] = bool(a) and row["measured_ns"] is not None
        row["pareto_modeled"] = bool(b)
    result["frontier_quality"] = qkey


def frontier_view(result: dict) -> dict:
    """The advice as :func:`~bucketsearch.index.evaluation.frontier.plot_frontier`'s input: one
    point per radius of the mode that runs."""
    mode = result["mode"]
    points = []
    for row in result["radii"]:
        if row["measured_ns"] is None:
            continue
        q = row.get(result["frontier_quality"])
        points.append({"mode": mode if mode in ("single", "mih", "auto", "scan") else "single",
                       "radius": row["radius"], "label": f"{mode} r={row['radius']}",
                       "cost_ns": row["measured_ns"], "modeled_probes": row["modeled_probes"],
                       "quality": q, "pareto": row["pareto"],
                       "pareto_modeled": row["pareto_modeled"]})
    return {"bits": result["bits"], "n_queries": result["n_queries"], "n_db": result["n_db"],
            "quality": result["frontier_quality"], "points": points}
