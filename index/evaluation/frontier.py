"""Quality-vs-cost frontier: every operating point of one code set, placed by the cost the
engine measured and by its quality, with the Pareto frontier marked.

Operating points (each answers "which items does a query retrieve, and what did it cost"):

* ``single r``: one bucket table of all Q bits probed to radius r (:class:`~index.probe.
  HammingIndex`); retrieves the Hamming ball ``d <= r``. Modeled cost: ``sum_{i<=r} C(Q, i)``
  probes (the RAMAP cost of Jiang, Li & Li).
* ``mih r``: multi-index hashing (:class:`~bucketsearch.index.mih.MultiIndex`, Norouzi's number of
  substrings) at radius r: the same ball, another cost. Modeled: its exact substring probes.
* ``auto r``: the planner's choice (:class:`~bucketsearch.index.planner.AutoIndex`) at radius r.
* ``scan r``: the linear scan cut at r (the baseline every bucket search must beat).
  ``auto`` and ``scan`` have no modeled probe count (a plan may scan), so they are placed by
  measured cost only.
* ``tables K,L r``: L tables of K-bit segments probed to radius r each
  (:mod:`bucketsearch.index.evaluation.buckets`). Modeled: ``L * sum_{i<=r} C(K, i)`` probes.

Measured cost: the mean over queries of the kernel's whole-query time (``total_ns``: probing,
verification and result ordering; the scan's popcount pass), the fastest of ``repeats`` runs
after a warm-up. Quality: ``f_micro`` (F-beta of the pooled P and R), ``f_macro``, or
``recall_micro`` subject to a precision floor (points below the floor are not eligible).

A point is on the Pareto frontier when no other point has a cost <= its cost and a quality >=
its quality with one of the two strict (ties in both: the first listed is kept).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index.evaluation.buckets import (DEFAULT_MAX_PROBES, bit_array, evaluate_tables,
                                                   timed_search)
from bucketsearch.index.metrics.relevance import Relevance
from bucketsearch.index.metrics.conventions import DEFAULT, Conventions

QUALITIES = ("f_micro", "f_macro", "recall_micro")
MODES = ("single", "mih", "auto", "scan")


def pareto(cost, quality) -> np.ndarray:
    """Boolean mask of the points on the frontier (lower cost, higher quality; NaN quality:
    never on it). Sort by (cost, -quality); a point is kept when its quality beats every
    cheaper-or-equal point before it."""
    cost = np.asarray(cost, dtype=np.float64)
    quality = np.asarray(quality, dtype=np.float64)
    keep = np.zeros(len(cost), dtype=bool)
    order = np.lexsort((np.arange(len(cost)), -quality, cost))
    best = -np.inf
    for i in order:
        if not np.isnan(quality[i]) and quality[i] > best:
            keep[i] = True
            best = quality[i]
    return keep


def quality_of(point: dict, quality: str, precision_floor: float) -> float:
    """The chosen quality of one point (NaN when below the precision floor)."""
    if quality == "f_micro":
        return point["f_micro"]
    if quality == "f_macro":
        return point["f_macro"]
    if point["precision_micro"] is None or point["precision_micro"] < precision_floor:
        return float("nan")
    return point["recall_micro"]


def _ball_points(xb, xq, relevance, conv, radii, modes, max_probes, repeats) -> list[dict]:
    """Single / MIH / auto / scan points at each radius (quality of the Hamming ball)."""
    from bucketsearch.index.codes import as_words
    from bucketsearch.index.factory import make_index
    from bucketsearch.index.metrics import hamming_histograms, radius_metrics
    from bucketsearch.index.metrics.ramap import modeled_costs

    bits = xb.shape[1]
    hist = hamming_histograms(xb, xq, relevance, ks=[1], as_ranked=False, code_stats=False)
    rm = radius_metrics(hist, conv)
    n_ball = np.cumsum(hist.count, axis=1)
    wq = as_words(xq, bits)
    points = []
    for mode in modes:
        index = make_index(bits, mode, max_probes=max_probes)
        index.add(xb)
        for r in radii:
            planned = index.probe_count(r) if mode != "scan" else 0
            if planned > max_probes:
                continue
            st = timed_search(index, wq, r, repeats)
            points.append({
                "mode": mode, "K": None, "L": None, "radius": int(r),
                "label": f"{mode} r={r}",
                "cost_ns": float(st["total_ns"].mean()),
                "modeled_probes": (int(modeled_costs(bits, r)[-1]) if mode == "single"
                                   else int(planned) if mode == "mih" else None),
                "precision_micro": float(rm.precision_micro[r]),
                "recall_micro": float(rm.recall_micro[r]),
                "f_micro": float(rm.f_beta_micro[r]), "f_macro": float(rm.f_beta_macro[r]),
                "retrieved_mean": float(n_ball[:, r].mean())})
    return points


def measured_ramap(xb, xq, relevance, conv, radius_max, repeats=1) -> dict:
    """RAMAP@R with the modeled cost and with the cost measured on a single table: ``T(r)`` =
    mean over queries of the in-kernel lookup time of a radius-r search (rings 0..r)."""
    from bucketsearch.index.codes import as_words
    from bucketsearch.index.metrics import hamming_histograms, ramap
    from bucketsearch.index.probe import HammingIndex

    bits = xb.shape[1]
    index = HammingIndex(bits)
    index.add(xb)
    wq = as_words(xq, bits)
    times = []
    for r in range(radius_max + 1):
        if index.probe_count(r) > index.max_probes:
            break
        times.append(float(timed_search(index, wq, r, repeats)["lookup_ns"].mean()))
    top = len(times) - 1
    hist = hamming_histograms(xb, xq, relevance, ks=[1], as_ranked=False, code_stats=False)
    _, modeled = ramap(hist, conv)
    _, measured = ramap(hist, conv, measured_cost=times + [times[-1]] * (bits - top))
    return {"R": list(range(top + 1)), "T_ns": times,
            "ramap_modeled": modeled[:top + 1].tolist(),
            "ramap_measured": measured[:top + 1].tolist()}


def frontier(db_codes, query_codes, relevance: Relevance, *, radii=(0, 1, 2, 3),
             configs=None, table_radii=(0, 1), modes=MODES, quality: str = "f_micro",
             precision_floor: float = 0.0, conventions: Conventions = DEFAULT,
             max_probes: int = DEFAULT_MAX_PROBES, repeats: int = 1) -> dict:
    """Every operating point (module docstring) with its measured and modeled cost, its
    quality and whether it is on the Pareto frontier; plus RAMAP@R modeled vs measured."""
    if not conventions.radius_inclusive:
        raise ValueError("the frontier's searches retrieve d <= r; radius_inclusive=False "
                         "(--radius-exclusive) does not apply")
    if quality not in QUALITIES:
        raise ValueError(f"quality must be one of {QUALITIES}, got {quality!r}")
    if not 0.0 <= precision_floor <= 1.0:
        raise ValueError(f"precision floor must be in [0, 1], got {precision_floor}")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"modes must be among {MODES}, got {bad}")
    xb, xq = bit_array(db_codes, "db codes"), bit_array(query_codes, "query codes")
    bits = xb.shape[1]
    radii = sorted({int(r) for r in radii})
    if radii and not 0 <= radii[0] <= radii[-1] <= bits:
        raise ValueError(f"radii must be in [0, {bits}], got {radii}")
    points = _ball_points(xb, xq, relevance, conventions, radii, modes, max_probes, repeats)
    if configs is None or len(configs):
        tables = evaluate_tables(xb, xq, relevance, configs, conventions, table_radii,
                                 max_probes)
        for row in tables["configs"]:
            for m in row["measured"]:
                r = m["radius"]
                points.append({
                    "mode": "tables", "K": row["K"], "L": row["L"], "radius": r,
                    "label": f"K={row['K']},L={row['L']} r={r}",
                    "cost_ns": m["total_ns_mean"], "modeled_probes": row["probes"][r],
                    "precision_micro": row["precision_micro"][r],
                    "recall_micro": row["recall_micro"][r],
                    "f_micro": row["f_beta_micro"][r], "f_macro": row["f_beta_macro"][r],
                    "retrieved_mean": row["retrieved_mean"][r]})
    q = np.array([quality_of(p, quality, precision_floor) for p in points])
    cost = np.array([p["cost_ns"] for p in points])
    modeled = np.array([np.nan if p["modeled_probes"] is None else p["modeled_probes"]
                        for p in points], dtype=np.float64)
    on = pareto(cost, q)
    on_modeled = pareto(np.where(np.isnan(modeled), np.inf, modeled), q)
    for p, value, a, b in zip(points, q, on, on_modeled):
        p["quality"] = None if np.isnan(value) else float(value)
        p["pareto"] = bool(a)
        p["pareto_modeled"] = bool(b)
    return {"bits": bits, "n_db": len(xb), "n_queries": len(xq), "quality": quality,
            "precision_floor": precision_floor, "beta": conventions.beta,
            "conventions": conventions.as_dict(), "points": points,
            "ramap": measured_ramap(xb, xq, relevance, conventions,
                                    max(radii) if radii else 0, repeats)}


def format_frontier(res: dict) -> str:
    """The points sorted by measured cost; ``*`` on the frontier (measured cost), ``m`` on the
    frontier by modeled probes."""
    lines = [f"{res['n_queries']} queries x {res['n_db']} db items, Q = {res['bits']} bits; "
             f"quality = {res['quality']}"
             + (f" (precision >= {res['precision_floor']})" if res["quality"] == "recall_micro"
                else f" (beta = {res['beta']})"),
             "", f"{'point':>22s} {'cost_us':>10s} {'probes':>12s} {'P_micro':>8s} "
                 f"{'R_micro':>8s} {'quality':>8s} {'retrieved':>10s}  frontier"]
    fmt = lambda v: "       -" if v is None else f"{v:8.4f}"  # noqa: E731
    for p in sorted(res["points"], key=lambda p: p["cost_ns"]):
        probes = "-" if p["modeled_probes"] is None else f"{p['modeled_probes']:,}"
        mark = ("*" if p["pareto"] else " ") + ("m" if p["pareto_modeled"] else " ")
        lines.append(f"{p['label']:>22s} {p['cost_ns'] / 1e3:10.2f} {probes:>12s} "
                     f"{fmt(p['precision_micro'])} {fmt(p['recall_micro'])} "
                     f"{fmt(p['quality'])} {p['retrieved_mean']:10.1f}  {mark}")
    ra = res["ramap"]
    lines += ["", "RAMAP@R, modeled cost sum C(Q, i) vs measured single-table cost T(r)/T(0):"]
    for r, t, a, b in zip(ra["R"], ra["T_ns"], ra["ramap_modeled"], ra["ramap_measured"]):
        lines.append(f"  R={r}: T = {t / 1e3:9.2f} us  RAMAP modeled {a:.4f}  measured {b:.4f}")
    return "\n".join(lines)


def plot_frontier(res: dict, path: str) -> None:
    """Quality against measured cost (log scale), one marker per mode, the frontier as a step
    line; a second panel against modeled probes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = {"single": "o", "mih": "s", "auto": "D", "scan": "x", "tables": "."}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, key, front, xlabel in (
            (axes[0], "cost_ns", "pareto", "measured cost per query (ns, log)"),
            (axes[1], "modeled_probes", "pareto_modeled", "modeled probes per query (log)")):
        for mode, marker in markers.items():
            pts = [p for p in res["points"] if p["mode"] == mode and p["quality"] is not None
                   and p[key] is not None and p[key] > 0]
            if pts:
                ax.scatter([p[key] for p in pts], [p["quality"] for p in pts], marker=marker,
                           s=18 if mode == "tables" else 40, alpha=0.6, label=mode)
        fr = sorted((p for p in res["points"] if p[front] and p[key]), key=lambda p: p[key])
        if fr:
            ax.step([p[key] for p in fr], [p["quality"] for p in fr], where="post",
                    color="k", lw=1.2, label="Pareto frontier")
            for p in fr[::max(1, len(fr) // 12)]:
                ax.annotate(p["label"], (p[key], p["quality"]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(res["quality"])
        ax.legend(fontsize=7)
    fig.suptitle(f"quality vs cost: Q = {res['bits']} bits, {res['n_queries']} queries x "
                 f"{res['n_db']} items")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
