"""Report of a load run: JSON document, rich console table, matplotlib PNG.

Measured vs modeled. For a radius-R search the paper (Jiang, Li & Li, RAMAP) charges
``cost(R) = t0 * P(R)`` with ``P(R) = sum_{r<=R} C(Q, r)`` probed buckets. Per radius the report
puts beside it the server's measured lookup time (``lookup_ns`` summed over rings 0..R, p50 and
p99 over queries) and the client latency. Two fits to the measured p50 ``y_R`` over the radii of
the run:

* paper model ``y = t0 * P``: ``log t0 = mean_R(log y_R - log P_R)`` (least squares in log space,
  so every radius weighs the same whatever its magnitude);
* extended model ``y = c + t0 * P + t_item * I`` with ``I_R`` the mean items returned per query:
  non-negative least squares on relative errors (each row divided by ``y_R``).

Fit quality is ``R^2 = 1 - sum (log y - log yhat)^2 / sum (log y - mean log y)^2`` (log10 space;
1 is perfect, <= 0 is no better than a constant). With as many parameters as radii the extended
fit is exact by construction: ``n_points`` is recorded beside each ``r2``.

Where the paper's model holds: per radius the extended model splits the predicted cost into the
constant, per-probe and per-item terms; the model "holds" at radii where the per-probe term is at
least half the prediction and the measured p50 is within a factor 2 of ``t0 * P`` with the
extended fit's per-probe t0 (the paper's model with the right t0 explains that radius); elsewhere
the verdict names the term that dominates.
"""
from __future__ import annotations

import itertools
import math
import platform
import sys
from importlib import metadata

import numpy as np

from bucketsearch.loadtest.stats import LoadStats
from bucketsearch.loadtest.workload import probes_upto

HOLD_RATIO = 2.0
LIBRARIES = ("bucketsearch", "httpx", "httpx-aiohttp", "aiohttp", "hdrhistogram", "numpy",
             "rich", "matplotlib", "uvloop")


def versions() -> dict:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


# -- cost-model helpers -----------------------------------------------------------------------
def server_t0_ns(cost_model: dict | None) -> float | None:
    """The calibrated t0 (ns per probe) out of the server's ``/cost-model`` answer, if any."""
    if not cost_model:
        return None
    for key in ("t0_ns", "t0"):
        value = cost_model.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    for nested in ("paper", "model", "calibration"):
        sub = cost_model.get(nested)
        if isinstance(sub, dict):
            value = server_t0_ns(sub)
            if value is not None:
                return value
    return None


def r2_log(y, yhat) -> float | None:
    """``1 - SS_res / SS_tot`` of log10 values (None with fewer than 2 points or flat y)."""
    y = np.log10(np.asarray(y, dtype=float))
    yhat = np.log10(np.maximum(np.asarray(yhat, dtype=float), 1e-300))
    if len(y) < 2:
        return None
    ss_tot = float(((y - y.mean()) ** 2).sum())
    if ss_tot == 0:
        return None
    return 1.0 - float(((y - yhat) ** 2).sum()) / ss_tot


def fit_paper(probes, measured) -> dict:
    """Fit ``y = t0 * P`` in log space; ``{t0_ns, r2, n_points}``."""
    p = np.asarray(probes, dtype=float)
    y = np.asarray(measured, dtype=float)
    if not len(y):
        return {"t0_ns": None, "r2": None, "n_points": 0}
    t0 = float(10 ** np.mean(np.log10(y) - np.log10(p)))
    return {"t0_ns": t0, "r2": r2_log(y, t0 * p), "n_points": int(len(y))}


def fit_extended(probes, items, measured) -> dict:
    """Fit ``y = c + t0 * P + t_item * I`` (non-negative, relative errors); coefficients + r2."""
    y = np.asarray(measured, dtype=float)
    cols = {"c_ns": np.ones_like(y), "t0_ns": np.asarray(probes, dtype=float),
            "t_item_ns": np.asarray(items, dtype=float)}
    names = list(cols)
    best = None
    if len(y):
        for size in range(1, len(names) + 1):
            for subset in itertools.combinations(names, size):
                a = np.stack([cols[n] for n in subset], axis=1) / y[:, None]
                coef, *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
                if (coef < 0).any():
                    continue
                resid = float(((a @ coef - 1.0) ** 2).sum())
                if best is None or resid < best[0] - 1e-12:
                    best = (resid, dict(zip(subset, coef.tolist())))
    coef = {n: 0.0 for n in names}
    if best is not None:
        coef.update(best[1])
    pred = coef["c_ns"] + coef["t0_ns"] * cols["t0_ns"] + coef["t_item_ns"] * cols["t_item_ns"]
    return {**coef, "r2": r2_log(y, pred) if len(y) else None, "n_points": int(len(y))}


def verdict(entry: dict, ext: dict) -> str:
    """Where the paper's model holds or breaks at this radius (see the module docstring)."""
    y = (entry.get("server_lookup_ns") or {}).get("p50")
    if not y:
        return "no server timings"
    if ext["n_points"] < 2:
        return "needs at least 2 radii to fit"
    t0_fit = ext["t0_ns"]
    fixed = ext["c_ns"]
    per_probe = ext["t0_ns"] * entry["probes_model"]
    per_item = ext["t_item_ns"] * (entry.get("items_per_query") or 0.0)
    total = fixed + per_probe + per_item or 1.0
    ratio = y / (t0_fit * entry["probes_model"]) if t0_fit > 0 else math.inf
    if per_probe / total >= 0.5 and 1 / HOLD_RATIO <= ratio <= HOLD_RATIO:
        return f"holds: per-probe work is {per_probe / total:.0%} of the cost"
    # with few radii the fixed and per-item terms are hard to tell apart: report both
    return (f"breaks: per-probe work is only {per_probe / total:.0%} of the cost (fixed "
            f"{fixed / total:.0%}, per-item {per_item / total:.0%}); measured = "
            f"{ratio:.3g} x t0*P")


# -- the report document ----------------------------------------------------------------------
def _lat_ms(dist) -> dict:
    s = dist.summary(scale=1e-3)
    return {k: s[k] for k in ("p50", "p90", "p99", "p999", "max", "mean")}


def _class_entry(cls, bits: int, t0: float | None) -> dict:
    probes_model = probes_upto(bits, cls.radius) if cls.radius is not None else None
    if cls.probes:
        probes = sum(p * c for p, c in cls.probes.items()) / sum(cls.probes.values())
    else:
        probes = probes_model
    lookup = cls.lookup_ns.summary()
    nq = cls.server_queries
    entry = {
        "label": cls.label, "radius": cls.radius, "k": cls.k,
        "probes": probes, "probes_model": probes_model,
        "modeled_ns": t0 * probes_model if (t0 and probes_model is not None) else None,
        "server_modeled_ns": cls.modeled_ns_total / cls.modeled_count if cls.modeled_count
        else None,
        "server_lookup_ns": {"p50": lookup["p50"], "p99": lookup["p99"], "mean": lookup["mean"],
                             "count": lookup["count"]},
        "latency_ms": _lat_ms(cls.latency_us),
        "service_ms": _lat_ms(cls.service_us),
        "count": cls.requests, "queries": cls.queries, "errors": cls.errors,
        "items_per_query": cls.items_total / nq if nq else None,
        "results_per_query": cls.results / cls.queries if cls.queries else None,
        "empty_buckets_per_query": cls.empty_total / nq if nq else None,
        "nonempty_buckets_per_query": cls.nonempty_total / nq if nq else None,
        "empty_fraction": (cls.empty_total / (cls.empty_total + cls.nonempty_total)
                           if cls.empty_total + cls.nonempty_total else None),
        "rings": [{"ring": r, "queries": v[0], "probes_per_query": v[1] / v[0],
                   "empty_per_query": v[2] / v[0], "lookup_ns_per_query": v[3] / v[0]}
                  for r, v in sorted(cls.rings.items()) if v[0]],
    }
    if entry["modeled_ns"] and lookup["p50"]:
        entry["measured_over_modeled"] = lookup["p50"] / entry["modeled_ns"]
    else:
        entry["measured_over_modeled"] = None
    return entry


def build_report(stats: LoadStats, params: dict, bits: int, cost_model: dict | None = None,
                 warnings: list[str] | None = None, client: dict | None = None) -> dict:
    """The JSON report (see the issue: params, versions, rates, per_radius, model, ...)."""
    t0_server = server_t0_ns(cost_model)
    classes = stats.ordered_classes()
    radius_classes = [c for c in classes if c.radius is not None]
    pre = [_class_entry(c, bits, None) for c in radius_classes]
    fit_rows = [e for e in pre if e["server_lookup_ns"]["p50"]]
    paper = fit_paper([e["probes_model"] for e in fit_rows],
                      [e["server_lookup_ns"]["p50"] for e in fit_rows])
    ext = fit_extended([e["probes_model"] for e in fit_rows],
                       [e["items_per_query"] or 0.0 for e in fit_rows],
                       [e["server_lookup_ns"]["p50"] for e in fit_rows])
    t0 = t0_server or paper["t0_ns"]
    per_radius = [_class_entry(c, bits, t0) for c in radius_classes]
    for e in per_radius:
        e["verdict"] = verdict(e, ext)
    r2_server = None
    if t0_server and fit_rows:
        r2_server = r2_log([e["server_lookup_ns"]["p50"] for e in fit_rows],
                           [t0_server * e["probes_model"] for e in fit_rows])
    knn = [_class_entry(c, bits, None) for c in classes if c.radius is None]
    status = dict(sorted(stats.status_codes.items()))
    return {
        "params": params,
        "versions": versions(),
        "target_rate": params.get("rate") if params.get("mode") == "open" else None,
        "achieved_rate": stats.achieved_rate(),
        "send_rate": stats.send_rate(),
        "queries_per_s": stats.queries_per_s(),
        "requests": stats.requests,
        "warmup_requests": stats.warmup_requests,
        "window_s": stats.window_s(),
        "errors": stats.n_errors,
        "error_kinds": dict(stats.errors),
        "status_codes": status,
        "latency_ms": _lat_ms(stats.latency_us),
        "service_ms": _lat_ms(stats.service_us),
        "queueing_ms": _lat_ms(stats.queueing_us),
        "scheduler_lag_ms": _lat_ms(stats.sched_lag_us),
        "client": client or {},
        "warnings": list(warnings or []),
        "per_radius": per_radius,
        "knn": knn,
        "model": {
            "t0_ns": t0,
            "t0_source": "server calibration" if t0_server else "fitted to this run",
            "r2": r2_server if t0_server else paper["r2"],
            "paper_fit": paper,
            "r2_server_t0": r2_server,
            "extended_fit": ext,
            "definition": "cost(R) = t0 * sum_{r<=R} C(Q, r); r2 in log10 space over radii",
        },
        "server_cost_model": cost_model,
    }


# -- console ----------------------------------------------------------------------------------
def _fmt_ns(ns) -> str:
    if ns is None:
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.3g} us"
    return f"{ns:.3g} ns"


def _fmt_ms(ms) -> str:
    return "-" if ms is None else f"{ms:.3g}"


def make_console():
    """A rich console; 120 columns when the output is not a terminal (logs, pipes)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=120)


def print_report(report: dict, console=None) -> None:
    """Rich tables: run summary, measured vs modeled per radius, k-NN, model fits, warnings."""
    from rich.table import Table

    console = console or make_console()
    p = report["params"]
    rate = report["achieved_rate"]
    head = (f"[bold]{p.get('mode')} loop[/bold]  index {p.get('index')}  batch {p.get('batch')}"
            f"  requests {report['requests']}  achieved {rate or 0:,.1f} req/s"
            + (f" (target {report['target_rate']:,.0f})" if report["target_rate"] else "")
            + f"  {report['queries_per_s'] or 0:,.1f} queries/s  errors {report['errors']}"
            + f"  status {report['status_codes']}")
    console.print(head)
    lag = report["scheduler_lag_ms"]
    console.print(f"latency ms (from intended send) p50 {_fmt_ms(report['latency_ms']['p50'])}"
                  f"  p99 {_fmt_ms(report['latency_ms']['p99'])}  max "
                  f"{_fmt_ms(report['latency_ms']['max'])};  service ms p50 "
                  f"{_fmt_ms(report['service_ms']['p50'])}  p99 "
                  f"{_fmt_ms(report['service_ms']['p99'])};  scheduler lag ms p99 "
                  f"{_fmt_ms(lag['p99'])}")
    model = report["model"]
    t = Table(title=f"measured vs modeled (t0 = {_fmt_ns(model['t0_ns'])}/probe, "
                    f"{model['t0_source']})")
    for col in ("R", "probes", "t0*P", "lookup p50", "lookup p99", "lat p50 ms", "lat p99 ms",
                "meas/model", "empty", "n"):
        t.add_column(col, justify="right")
    for e in report["per_radius"]:
        lk = e["server_lookup_ns"]
        ratio = e["measured_over_modeled"]
        t.add_row(str(e["radius"]), f"{e['probes']:,.0f}" if e["probes"] is not None else "-",
                  _fmt_ns(e["modeled_ns"]), _fmt_ns(lk["p50"]), _fmt_ns(lk["p99"]),
                  _fmt_ms(e["latency_ms"]["p50"]), _fmt_ms(e["latency_ms"]["p99"]),
                  "-" if ratio is None else f"{ratio:.3g}",
                  "-" if e["empty_fraction"] is None else f"{e['empty_fraction']:.1%}",
                  str(e["count"]))
    for e in report["knn"]:
        lk = e["server_lookup_ns"]
        t.add_row(e["label"], f"{e['probes']:,.0f}" if e["probes"] is not None else "-", "-",
                  _fmt_ns(lk["p50"]), _fmt_ns(lk["p99"]), _fmt_ms(e["latency_ms"]["p50"]),
                  _fmt_ms(e["latency_ms"]["p99"]), "-",
                  "-" if e["empty_fraction"] is None else f"{e['empty_fraction']:.1%}",
                  str(e["count"]))
    console.print(t)
    pf, ext = model["paper_fit"], model["extended_fit"]
    console.print(
        f"paper model y = t0*P: fitted t0 {_fmt_ns(pf['t0_ns'])}, R^2 {_r2(pf['r2'])} "
        f"({pf['n_points']} radii)"
        + (f"; with the server's t0: R^2 {_r2(model['r2_server_t0'])}"
           if model["r2_server_t0"] is not None else ""))
    console.print(
        f"extended model y = c + t0*P + t_item*I: c {_fmt_ns(ext['c_ns'])}, t0 "
        f"{_fmt_ns(ext['t0_ns'])}, t_item {_fmt_ns(ext['t_item_ns'])}, R^2 {_r2(ext['r2'])} "
        f"({ext['n_points']} radii)")
    if len(report["per_radius"]) >= 2:
        console.print("where the paper's model holds (extended-fit decomposition of the p50):")
        for e in report["per_radius"]:
            console.print(f"  radius {e['radius']}: {e.get('verdict', '-')}")
    for w in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}")


def _r2(value) -> str:
    return "-" if value is None else f"{value:.3f}"


# -- plot -------------------------------------------------------------------------------------
def plot_report(report: dict, path) -> None:
    """PNG: modeled vs measured cost against radius (log y), and empty buckets per radius."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["per_radius"]
    radii = [e["radius"] for e in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    if rows:
        modeled = [e["modeled_ns"] for e in rows]
        p50 = [e["server_lookup_ns"]["p50"] for e in rows]
        p99 = [e["server_lookup_ns"]["p99"] for e in rows]
        lat = [e["latency_ms"]["p50"] * 1e6 if e["latency_ms"]["p50"] is not None else None
               for e in rows]
        t0 = report["model"]["t0_ns"]
        if any(m is not None for m in modeled):
            ax1.plot(radii, _nan(modeled), "o--", label=f"modeled t0*P (t0={_fmt_ns(t0)})")
        ax1.plot(radii, _nan(p50), "s-", label="server lookup p50")
        ax1.plot(radii, _nan(p99), "v:", label="server lookup p99")
        ax1.plot(radii, _nan(lat), "^-", alpha=0.6, label="client latency p50")
        ext = report["model"]["extended_fit"]
        if ext["n_points"]:
            pred = [ext["c_ns"] + ext["t0_ns"] * e["probes_model"]
                    + ext["t_item_ns"] * (e["items_per_query"] or 0) for e in rows]
            ax1.plot(radii, pred, "x", color="k", label="extended model")
        ax1.set_yscale("log")
        ax1.set_xticks(radii)
        ax1.legend(fontsize=8)
    ax1.set_xlabel("radius R")
    ax1.set_ylabel("cost per query (ns)")
    ax1.set_title("modeled vs measured cost")
    ax1.grid(True, which="both", alpha=0.3)
    empty = [e["empty_buckets_per_query"] for e in rows]
    nonempty = [e["nonempty_buckets_per_query"] for e in rows]
    if rows and any(v is not None for v in empty):
        x = np.arange(len(rows))
        ax2.bar(x - 0.2, _nan(empty), 0.4, label="empty buckets")
        ax2.bar(x + 0.2, _nan(nonempty), 0.4, label="non-empty buckets")
        ax2.set_xticks(x, [str(r) for r in radii])
        ax2.set_yscale("log")
        ax2.legend(fontsize=8)
    else:
        ax2.text(0.5, 0.5, "no server stats", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_xlabel("radius R")
    ax2.set_ylabel("buckets probed per query")
    ax2.set_title("empty buckets per radius")
    ax2.grid(True, which="both", axis="y", alpha=0.3)
    fig.suptitle(f"{report['params'].get('mode')} loop, "
                 f"{report['achieved_rate'] or 0:,.0f} req/s achieved")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _nan(values):
    return [math.nan if v is None else v for v in values]


__all__ = ["build_report", "print_report", "plot_report", "fit_paper", "fit_extended",
           "versions"]
