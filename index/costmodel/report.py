"""Modeled vs measured cost of any index, radius by radius (:func:`cost_report`), as a dict,
a rich table (:func:`print_report`) and a PNG (:func:`plot_reports`); the offline benchmark's
view (bench/bench_mih.py). The paper model's ``t0`` here is the ``radius_fit`` estimator's
formula; the extended column is the planner's ``step_model`` (:mod:`.stepmodel`).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index.fits.paper import (PaperModel, fit_t0, paper_probes, per_radius_means,
                                                r_squared, reached_mask)
from bucketsearch.index.costmodel.engines import QuerySamples, engine_report
from bucketsearch.index.fits.stepmodel import ExtendedModel, fit_extended, stats_features


def _mode_name(index) -> str:
    kind = getattr(index, "kind", "")
    return kind if kind in ("single", "mih", "scan", "auto") else type(index).__name__


def cost_report(index, queries, max_radius: int, paper: PaperModel | None = None,
                repeats: int = 1) -> dict:
    """Modeled vs measured cost per radius of any index (single, mih, scan, auto).

    For every ``R = 0..max_radius`` the queries are run as a radius-R range search with
    statistics (best of ``repeats`` runs); ``measured_ns`` is the mean whole-query time
    (``total_ns``), ``paper_ns = t0 * P(R)`` with ``t0`` from ``paper`` (default: the planner's
    single-table fit for ``auto``, else fitted on this index's own measurements through the
    origin; pass the single table's model to see how far it is from mih or scan), what ran
    (``engine``) with its own model's charge (``own_model_ns``, median, beside the median
    query time ``own_measured_ns``, ``own_holds``; the whole :mod:`.engines` report under
    ``engines``), and, for
    indexes with per-radius phases, ``lookup_ns`` is the mean cumulative per-radius time and
    ``extended_ns`` the extended model fitted on those phases. Radii whose single-table/mih
    probe count exceeds the index's limit are reported with ``measured_ns = None``.
    """
    mode = _mode_name(index)
    bits = index.bits
    xq = index._check_queries(queries)
    rows = []
    last_stats = None
    ran = []  # the best run of every radius: the model of what ran is fitted on them
    for R in range(max_radius + 1):
        row = {"radius": R, "probes_paper": paper_probes(bits, R)[-1]}
        try:
            best = None
            for _ in range(max(repeats, 1)):
                st = index.range_search(xq, R, stats=True)[3]
                mean = float(np.mean(st.total_ns)) if len(st.total_ns) else 0.0
                if best is None or mean < best[0]:
                    best = (mean, st)
            row["measured_ns"], st = best
            last_stats = st
            ran.append(st)
            row["probes_measured"] = int(st.probes.sum() // max(len(xq), 1))
            if st.plan is not None:
                row["plan"] = st.plan.get("mode")
            if mode in ("single", "mih"):
                row["lookup_ns"] = float(np.sum(per_radius_means(st, "lookup_ns")[:R + 1]))
        except ValueError as exc:  # probe limit
            row["measured_ns"] = None
            row["error"] = str(exc).split(";")[0]
        rows.append(row)
    ok = [r for r in rows if r["measured_ns"] is not None]
    if paper is None and getattr(index, "paper", None) is not None:
        paper = index.paper  # the planner's single-table fit
    if paper is None:
        paper = PaperModel(bits, fit_t0([r["probes_paper"] for r in ok],
                                        [r["measured_ns"] for r in ok]))
    for r in rows:
        r["paper_ns"] = paper.t0_ns * float(r["probes_paper"])
        r["paper_over_measured"] = (r["paper_ns"] / r["measured_ns"]
                                    if r["measured_ns"] else None)
    report = {"mode": mode, "bits": bits, "ntotal": index.ntotal, "nq": len(xq),
              "t0_ns": paper.t0_ns, "rows": rows,
              "paper_r2": r_squared([r["measured_ns"] for r in ok],
                                    [r["paper_ns"] for r in ok]) if len(ok) > 1 else None}
    if ran:  # each radius charged by the model of the engine that ran it (.engines)
        own = engine_report(QuerySamples.from_stats(ran), bits, paper.t0_ns, "paper")
        by_r = {r["radius"]: r for r in own["rows"] if r["k"] == 0}
        for r in rows:
            mine = by_r.get(r["radius"])
            if mine is not None:
                r["engine"], r["own_model_ns"] = mine["engine"], mine["modeled_p50_ns"]
                r["own_measured_ns"] = mine["measured_p50_ns"]
                r["own_holds"] = mine["holds"]
        report["engines"] = own
    if last_stats is not None and mode in ("single", "mih"):
        ext = fit_extended(last_stats)
        cum = np.cumsum(_mean_prediction(ext, last_stats))
        for r in rows:
            if r["radius"] < len(cum):
                r["extended_ns"] = float(cum[r["radius"]])
        report["extended"] = ext.to_dict()
    return report


def _mean_prediction(model: ExtendedModel, stats) -> np.ndarray:
    reached = reached_mask(stats)
    pred = model.predict({t: f for t, f in stats_features(stats).items()}) * np.ones(
        stats.lookup_ns.shape)
    return np.where(reached, pred, 0).sum(axis=0) / np.maximum(reached.sum(axis=0), 1)


def print_report(report: dict, console=None) -> None:
    """Render a :func:`cost_report` as a rich table."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"{report['mode']}: {report['bits']}-bit codes, N={report['ntotal']:,}, "
                        f"{report['nq']} queries, t0={report['t0_ns']:.2f} ns")
    for col in ("R", "P(R)", "measured us", "paper us", "paper/measured", "engine",
                "own p50 us", "own model us", "holds", "extended us"):
        table.add_column(col, justify="right")
    for r in report["rows"]:
        def us(v):
            return "-" if v is None else f"{v / 1000:.2f}"
        table.add_row(str(r["radius"]), f"{r['probes_paper']:,}", us(r["measured_ns"]),
                      us(r["paper_ns"]),
                      "-" if r["paper_over_measured"] is None
                      else f"{r['paper_over_measured']:.2f}", r.get("engine", "-"),
                      us(r.get("own_measured_ns")), us(r.get("own_model_ns")),
                      {None: "-", True: "yes", False: "no"}[r.get("own_holds")],
                      us(r.get("extended_ns")))
    console.print(table)
    console.print("P(R) = sum_{r<=R} C(Q, r); paper us = t0 x P(R) (the paper's single-table "
                  "model, t0 in the title); measured: mean whole-query time; engine: what ran "
                  "(auto: its plan); own p50 / own model: the median query time and the "
                  "median charge of that engine's own model (index.costmodel.engines), holds "
                  "when within a factor 2; extended: the planner's step model", markup=False,
                  highlight=False)


def plot_reports(reports: list[dict], path) -> None:
    """PNG: measured (solid) vs paper-modeled (dashed) cost per radius, one colour per report."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, rep in enumerate(reports):
        colour = f"C{i}"
        rows = [r for r in rep["rows"] if r["measured_ns"]]
        ax.plot([r["radius"] for r in rows], [r["measured_ns"] / 1000 for r in rows], "o-",
                color=colour, label=f"{rep['mode']} measured")
        ax.plot([r["radius"] for r in rep["rows"]], [r["paper_ns"] / 1000 for r in rep["rows"]],
                "--", color=colour, label=f"{rep['mode']} paper t0={rep['t0_ns']:.1f} ns")
    ax.set_yscale("log")
    ax.set_xlabel("radius R")
    ax.set_ylabel("time per query (us)")
    ax.set_title("modeled T(R) = t0 * sum C(Q, r) vs measured")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
