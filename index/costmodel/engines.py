"""The cost model of what actually ran: every engine's own model over its own counters, in one
form, and the per-class table every report prints (load tester, demo, ``GET .../cost-model``,
dashboard).

Each engine states ``T_query = sum_term coef_term x counter_term`` (ns per query; one line per
term, the counter it multiplies, summed over the radii the query searched):

* ``single`` (single-table probing): ``probes`` (bucket lookups, ``sum_{r<=R} C(Q, r)``: the
  paper's t0 term), ``items`` (ids emitted), ``flip_radii`` (radii r >= 1 probed: each sets up
  the enumeration of its flips; radius 0 is one direct lookup), ``codes_compared`` (a k-NN
  query that switched to a scan), ``knn`` (1 per k-NN query: its kernel's set-up), ``fixed``
  (1 per query);
* ``mih`` (multi-index hashing): ``probes`` (substring bucket lookups), ``candidates``
  (substring bucket entries examined, each verified at full distance), ``flip_search`` (1 for a
  query whose substring radius reached 1: the general kernel, whose per-query set-up the exact
  lookups of R < m do not pay), ``codes_compared``, ``knn``, ``fixed``;
* ``scan``: ``codes_compared`` (``ntotal`` per query), ``items``, ``knn``, ``fixed``.

``auto`` has no model of its own: each query is charged by the model of the plan it ran
(``SearchStats.engine``). The measured time is the query's whole in-kernel time
(``total_ns``). Coefficients: weighted least squares on the queries each engine ran (weights
``1 / max(t, 50 ns)``: relative residuals, so a 300 ns query weighs as much as a 50 us one),
queries above Tukey's far-out fence of their (class, radius) left out, a term with a negative
coefficient or one the data cannot identify left out and reported, intervals HC3.

Per (query class, radius) and engine (:func:`engine_rows`): the engine's ``share`` of the
class's queries, mean counters, ``modeled_p50_ns`` (median over the queries of the model's
charge), ``measured_p50_ns``, ``measured_over_modeled`` and ``holds`` (``1/2 <= ratio <= 2``,
:data:`HOLDS_FACTOR`). A k-NN class is keyed by the radius its expansion reached (the k-th
result's distance, ``radii - 1``). Beside it, named as such, the paper's single-table charge
``paper_ns = t0 x sum_C`` with ``sum_C = sum_{i<=R} C(Q, i)`` (exact) and the paper's t0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bucketsearch.index.base import ENGINES
from bucketsearch.index.costmodel.estimators import FENCE, HOLDS_FACTOR, within_fence
from bucketsearch.index.fits.regression import CONFIDENCE, fit_nonnegative

ENGINE_NAMES = ("single", "mih", "scan")
#: :data:`bucketsearch.index.base.ENGINES` as an array: engine codes to names in one indexing
_ENGINE_NAMES = np.array(ENGINES, dtype=object)
#: per engine, its terms in priority order and the counter each multiplies
ENGINE_TERMS = {
    "single": (("probes", "bucket probes, sum C(Q, r) over the radii searched (paper's t0)"),
               ("items", "ids emitted"),
               ("flip_radii", "radii r >= 1 probed (each enumerates its C(Q, r) flips: the "
                              "set-up of a radius)"),
               ("codes_compared", "codes compared by a k-NN query's switch to a scan"),
               ("knn", "1 per k-NN query (the k-NN kernel's set-up and its k-th-result bookkeeping)"),
               ("fixed", "1 per query")),
    "mih": (("probes", "substring bucket probes"),
            ("candidates", "candidates verified (substring bucket entries examined)"),
            ("flip_search", "1 per query that enumerated substring flips (substring radius "
                            ">= 1: the general kernel, with its per-query set-up)"),
            ("codes_compared", "codes compared by a k-NN query's switch to a scan"),
            ("knn", "1 per k-NN query (the k-NN kernel's set-up and its k-th-result bookkeeping)"),
            ("fixed", "1 per query")),
    "scan": (("codes_compared", "codes compared (ntotal per query)"),
             ("items", "ids emitted"),
             ("knn", "1 per k-NN query (the k-NN kernel's set-up and its k-th-result bookkeeping)"),
             ("fixed", "1 per query")),
}
COUNTERS = ("probes", "items", "candidates", "codes_compared", "flip_search", "flip_radii")
MIN_WEIGHT_NS = 50.0

#: every column of the per-class table, defined (printed under every rendering)
LEGEND = {
    "class": "query class: 'range' (max_distance = R) or 'knnK' (the K nearest)",
    "R": "range: the radius asked; k-NN: the radius its expansion reached (the k-th "
         "distance), median/largest over the class's queries",
    "engine": "the engine or plan that ran these queries (auto: the plan chosen per query)",
    "share": "fraction of the class's queries at this R that this engine ran",
    "n": "queries",
    "probes": "mean bucket probes per query (single: table buckets; mih: substring buckets)",
    "items": "mean ids emitted per query",
    "cand": "mean candidates verified per query (mih)",
    "codes": "mean codes compared per query (scan, or a k-NN query's switch to a scan)",
    "modeled": "median over the queries of the engine's own model: sum coef x counter",
    "measured": "median of the queries' in-kernel time (total_ns)",
    "meas/model": "measured / modeled; the model holds when within 1/2 .. 2",
    "sumC": "sum_{i<=R} C(Q, i): the single-table probes the paper's model charges",
    "paper t0*sumC": "the paper's single-table model: t0 x sumC (t0 named in the title); a "
                     "reference only for rows whose engine is not 'single'; none for k-NN "
                     "(the paper charges a radius asked)",
}


@dataclass
class QuerySamples:
    """Per query (arrays ``(nq,)``): engine name, ``k`` (0: range), radius (range: asked;
    k-NN: reached), the counters of :data:`COUNTERS` summed over its radii, and ``total_ns``."""

    engine: np.ndarray
    k: np.ndarray
    radius: np.ndarray
    total_ns: np.ndarray
    counters: dict

    @classmethod
    def from_stats(cls, stats) -> QuerySamples:
        """From a :class:`~bucketsearch.index.base.SearchStats` or a list of them (the server's
        recent searches, often one query each: joined by width, one ``np.concatenate`` per field and
        width, not one padded copy per part)."""
        parts = list(stats) if isinstance(stats, (list, tuple)) else [stats]
        by_width: dict[int, list] = {}
        for st in parts:
            by_width.setdefault(st.probes.shape[1], []).append(st)
        out = [cls._from_group(group) for group in by_width.values()]
        if len(out) == 1:
            return out[0]
        return cls(*(np.concatenate([getattr(p, f) for p in out])
                     for f in ("engine", "k", "radius", "total_ns")),
                   {c: np.concatenate([p.counters[c] for p in out]) for c in COUNTERS})

    @classmethod
    def _from_group(cls, parts: list) -> QuerySamples:
        """The SearchStats ``parts``, all of one per-radius width."""
        def cat(name, fill=0, dtype=np.int64):
            arrays = [getattr(p, name, None) for p in parts]
            have = [a for a in arrays if a is not None]
            if not have:
                return None
            if len(have) == len(arrays):
                return np.concatenate(arrays).astype(dtype, copy=False)
            tail = np.shape(have[0])[1:]
            return np.concatenate([np.asarray(a, dtype=dtype) if a is not None else np.full(
                (len(p.radii),) + tail, fill, dtype=dtype) for a, p in zip(arrays, parts)])

        radii = cat("radii")
        nq = len(radii)
        reached = np.arange(parts[0].probes.shape[1])[None, :] < radii[:, None]
        probed = np.where(reached, cat("probes"), 0)
        counters = {"probes": probed.sum(axis=1).astype(np.float64),
                    "flip_search": flip_search(probed),
                    "flip_radii": (probed > 1).sum(axis=1).astype(np.float64)}
        for name in ("items", "candidates"):
            arr = cat(name)
            counters[name] = (np.zeros(nq) if arr is None
                              else np.where(reached, arr, 0).sum(axis=1).astype(np.float64))
        codes = cat("codes_compared")
        counters["codes_compared"] = np.zeros(nq) if codes is None else codes.astype(np.float64)
        engine = cat("engine")
        k = cat("k")
        return cls(_ENGINE_NAMES[np.zeros(nq, dtype=np.int64) if engine is None else engine],
                   np.zeros(nq, dtype=np.int64) if k is None else k, radii - 1,
                   cat("total_ns").astype(np.float64), counters)

    @classmethod
    def from_queries(cls, queries: list[dict]) -> QuerySamples:
        """From per-query dicts ``{"engine", "k", "radius", "total_ns", "probes", "items",
        "candidates", "codes_compared"}`` (what the load tester keeps of each answer)."""
        def col(name, dtype=np.float64):
            return np.array([q.get(name) or 0 for q in queries], dtype=dtype)
        return cls(np.array([q.get("engine") or "" for q in queries], dtype=object),
                   col("k", np.int64), col("radius", np.int64), col("total_ns"),
                   {c: col(c) for c in COUNTERS})

    def __len__(self) -> int:
        return len(self.engine)

    def features(self, sel) -> dict:
        """The model's columns of the queries ``sel`` (an index array): the counters, ``knn``
        (1 for a k-NN query) and ``fixed`` (1)."""
        return {"fixed": np.ones(len(sel)), "knn": (self.k[sel] > 0).astype(np.float64),
                **{c: v[sel] for c, v in self.counters.items()}}


def flip_search(probes) -> np.ndarray:
    """Per query, 1.0 when a radius step probed more than one bucket (multi-index hashing:
    a substring radius >= 1, so the flips were enumerated), else 0.0; ``probes`` ``(nq, W)``,
    zero past the radii searched."""
    return (np.asarray(probes) > 1).any(axis=1).astype(np.float64)


def fit_engine(samples: QuerySamples, engine: str, confidence: float = CONFIDENCE) -> dict:
    """The model of ``engine`` fitted on the queries it ran (see the module docstring); a dict
    ``{engine, formula, terms: [{term, counter, coef_ns, ci_ns}], unidentified, samples,
    excluded}`` (``terms`` empty when the engine ran no query)."""
    sel = np.flatnonzero(samples.engine == engine)
    out = {"engine": engine, "formula": "T_query = sum_term coef_term x counter_term (ns)",
           "time": "total_ns of the query (in-kernel)", "terms": [], "unidentified": {},
           "samples": 0, "excluded": 0}
    if not len(sel):
        return out
    y = samples.total_ns[sel]
    groups = samples.k[sel] * 1000 + samples.radius[sel]
    keep = within_fence(y, groups, FENCE) if len(y) > 3 else np.ones(len(y), dtype=bool)
    sel, y = sel[keep], y[keep]
    w = 1.0 / np.maximum(y, MIN_WEIGHT_NS)
    feats = samples.features(sel)
    order = [t for t, _ in ENGINE_TERMS[engine]]
    fit, dropped = fit_nonnegative({t: feats[t] * w for t in order}, y * w, order, "HC3",
                                   confidence)
    counters = dict(ENGINE_TERMS[engine])
    out["terms"] = [{"term": t, "counter": counters[t], "coef_ns": fit.coef[t],
                     "ci_ns": list(fit.ci[t])} for t in fit.terms]
    out["unidentified"] = {**fit.unidentified, **dropped}
    out["samples"], out["excluded"] = int(len(sel)), int((~keep).sum())
    return out


def predict(model: dict, feats: dict) -> np.ndarray:
    """Modeled ns per query: ``sum_term coef x counter`` (0 without terms)."""
    n = len(feats["fixed"])
    out = np.zeros(n)
    for t in model["terms"]:
        out = out + t["coef_ns"] * np.asarray(feats[t["term"]], dtype=np.float64)
    return out


def sum_c(bits: int, radius: int) -> int:
    """``sum_{i<=R} C(Q, i)`` (exact)."""
    return sum(math.comb(bits, i) for i in range(min(radius, bits) + 1))


def class_label(k: int) -> str:
    return "range" if k == 0 else f"knn{k}"


def _mean(v) -> float | None:
    return float(np.mean(v)) if len(v) else None


def engine_rows(samples: QuerySamples, models: dict, bits: int, paper_t0: float | None,
                holds_factor: float = HOLDS_FACTOR) -> list[dict]:
    """Per (class, radius, engine): share, counters, modeled, measured, ratio, verdict, and
    the paper's single-table charge (see the module docstring); range classes first, by R.

    A k-NN class gets one row per engine (not per radius reached: a k-NN query adds no
    per-radius row): ``radius`` is the median radius its queries reached, ``radius_max`` the
    largest, and no paper column (the paper's model charges a radius asked, not reached)."""
    rows = []
    range_r = sorted({int(r) for k, r in zip(samples.k, samples.radius) if k == 0})
    keys = [(0, r) for r in range_r] + [(int(k), None) for k in sorted(set(samples.k.tolist()))
                                        if k]
    for k, r in keys:
        in_class = (samples.k == k) & ((samples.radius == r) if r is not None else True)
        n_class = int(in_class.sum())
        for engine in ENGINE_NAMES + ("",):
            sel = np.flatnonzero(in_class & (samples.engine == engine))
            if not len(sel):
                continue
            feats = samples.features(sel)
            model = models.get(engine)
            modeled = predict(model, feats) if model and model["terms"] else None
            measured = float(np.median(samples.total_ns[sel]))
            mod50 = float(np.median(modeled)) if modeled is not None else None
            ratio = measured / mod50 if mod50 else None
            reached = samples.radius[sel]
            s = sum_c(bits, r) if r is not None else None
            rows.append({
                "class": class_label(k), "k": k,
                "radius": r if r is not None else int(np.median(reached)),
                "radius_max": int(reached.max()), "engine": engine or "unknown",
                "share": len(sel) / n_class, "queries": int(len(sel)),
                **{f"mean_{c}": _mean(samples.counters[c][sel]) for c in COUNTERS},
                "modeled_p50_ns": mod50, "measured_p50_ns": measured,
                "measured_mean_ns": float(np.mean(samples.total_ns[sel])),
                "measured_over_modeled": ratio,
                "holds": None if ratio is None else bool(1 / holds_factor <= ratio
                                                         <= holds_factor),
                "sum_c": s, "paper_ns": paper_t0 * float(s) if paper_t0 and s is not None
                else None,
                "paper_applies": engine == "single" and k == 0})
    return rows


def _ranges(radii: list[int]) -> str:
    """[0, 1, 2, 4] -> "0..2, 4" (none -> "none")."""
    if not radii:
        return "none"
    parts, start, prev = [], radii[0], radii[0]
    for r in radii[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}..{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


def verdicts(rows: list[dict], paper: dict | None) -> dict:
    """Per engine: the radii (per class) where its own model holds / fails; and the paper's
    verdict with its scope: only queries that ran single-table probing. ``summary``: one
    sentence per class, e.g. "range: 92% of these queries ran mih: outside the paper's model;
    mih model holds at R = 2..4"."""
    per_engine, summary = {}, []
    for cls in dict.fromkeys(r["class"] for r in rows):
        mine = [r for r in rows if r["class"] == cls]
        n = sum(r["queries"] for r in mine)
        for engine in dict.fromkeys(r["engine"] for r in mine):
            er = [r for r in mine if r["engine"] == engine]
            share = sum(r["queries"] for r in er) / n
            holds = [r["radius"] for r in er if r["holds"]]
            fails = [r["radius"] for r in er if r["holds"] is False]
            per_engine.setdefault(engine, {})[cls] = {
                "share": share, "holds_at": holds, "fails_at": fails}
            head = f"{cls}: {share:.0%} of these queries ran {engine}"
            if engine != "single":
                head += ": outside the paper's model"
            elif cls != "range":
                head += " (k-NN: outside the paper's model, which charges a radius asked)"
            if cls == "range":
                summary.append(f"{head}; {engine} model holds at R = {_ranges(holds)}"
                               + (f", fails at R = {_ranges(fails)}" if fails else ""))
            else:
                summary.append(f"{head}; {engine} model "
                               + ("holds" if holds else "fails" if fails else "has no verdict")
                               + f" (radius reached: median {er[0]['radius']}, largest "
                                 f"{er[0]['radius_max']})")
    out = {"rule": f"a model holds at R when 1/{HOLDS_FACTOR:g} <= measured p50 / modeled p50 "
                   f"<= {HOLDS_FACTOR:g}",
           "engines": per_engine, "summary": summary}
    single_range = [r for r in rows if r["paper_applies"]]
    if paper is not None:
        out["paper_model"] = {**paper, "scope": f"{sum(r['queries'] for r in single_range)} "
                                                f"range queries that ran single-table probing"}
        if paper.get("holds_at") or paper.get("fails_at"):
            summary.append(f"paper model (single-table range queries only): holds at R = "
                           f"{_ranges(paper.get('holds_at', []))}"
                           + (f", fails at R = {_ranges(paper['fails_at'])}"
                              if paper.get("fails_at") else ""))
        elif not single_range:
            summary.append("paper model: no query ran single-table range probing: no verdict")
    return out


def engine_report(samples: QuerySamples, bits: int, paper_t0: float | None,
                  paper_t0_name: str | None = None, paper: dict | None = None) -> dict:
    """The whole cost model of what ran, JSON-ready: ``models`` (per engine that ran a query),
    ``rows`` (:func:`engine_rows`), ``verdicts`` (:func:`verdicts`; ``paper``: the paper
    model's verdict over single-table range queries, from :func:`~.estimators.fit_all`),
    ``paper_t0_ns`` with ``paper_t0_estimator``, and ``legend``."""
    engines = [e for e in ENGINE_NAMES if (samples.engine == e).any()]
    models = {e: fit_engine(samples, e) for e in engines}
    rows = engine_rows(samples, models, bits, paper_t0)
    return {"bits": int(bits), "queries": len(samples), "models": models, "rows": rows,
            "paper_t0_ns": paper_t0, "paper_t0_estimator": paper_t0_name,
            "verdicts": verdicts(rows, paper), "legend": dict(LEGEND)}


def _ns(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    v = float(v)
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g} ns"


def _num(v) -> str:
    return "-" if v is None else f"{v:.4g}" if v < 1000 else f"{v:,.0f}"


TABLE_COLUMNS = ("class", "R", "engine", "share", "n", "probes", "items", "cand", "codes",
                 "modeled", "measured", "meas/model", "sumC", "paper t0*sumC")


def table_cells(row: dict) -> list[str]:
    """The printed cells of one row, in :data:`TABLE_COLUMNS` order."""
    ratio = row["measured_over_modeled"]
    radius = (str(row["radius"]) if row["k"] == 0
              else f"{row['radius']}/{row['radius_max']}")
    return [row["class"], radius, row["engine"], f"{row['share']:.0%}",
            str(row["queries"]), _num(row["mean_probes"]), _num(row["mean_items"]),
            _num(row["mean_candidates"]) if row["engine"] == "mih" else "-",
            _num(row["mean_codes_compared"]), _ns(row["modeled_p50_ns"]),
            _ns(row["measured_p50_ns"]), "-" if ratio is None else f"{ratio:.3g}",
            "-" if row["sum_c"] is None else f"{row['sum_c']:,}", _ns(row["paper_ns"])]


def describe_models(report: dict) -> list[str]:
    """One line per term of every engine's model (the counter it multiplies)."""
    lines = []
    for engine, model in report["models"].items():
        lines.append(f"  [{engine}] {model['formula']}, over {model['samples']} queries "
                     f"({model['excluded']} outliers left out; time: {model['time']}):")
        for t in model["terms"]:
            lo, hi = t["ci_ns"]
            lines.append(f"    {t['coef_ns']:>10.4g} ns x {t['term']:<15} ({t['counter']}; "
                         f"95% CI {lo:.3g} .. {hi:.3g})")
        for name, why in model["unidentified"].items():
            lines.append(f"    {name}: left out ({why})")
    return lines


def engines_table(report: dict) -> str:
    """The title line and the per-class table, plain text (columns :data:`TABLE_COLUMNS`)."""
    head = ("measured vs modeled: each query charged by the model of the engine that ran it; "
            + (f"paper t0 [{report.get('paper_t0_estimator')}] = {_ns(report['paper_t0_ns'])}"
               if report["paper_t0_ns"] else "no paper t0 (no query ran single-table probing "
               "and the server has none: its column is empty)"))
    cells = [list(TABLE_COLUMNS)] + [table_cells(r) for r in report["rows"]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(TABLE_COLUMNS))]
    return "\n".join([head] + ["  ".join(c.rjust(w) for c, w in zip(row, widths))
                               for row in cells])


def describe(report: dict) -> str:
    """Plain-text rendering: the table, its legend, the models, the verdicts."""
    lines = [engines_table(report), "columns:"]
    lines += [f"  {k}: {v}" for k, v in report["legend"].items()]
    lines.append("models (one line per term: coefficient x the counter it multiplies):")
    lines += describe_models(report)
    lines.append(f"verdicts ({report['verdicts']['rule']}):")
    lines += [f"  {s}" for s in report["verdicts"]["summary"]]
    return "\n".join(lines)
