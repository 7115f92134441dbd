"""Report of a load run: JSON document, rich console table, matplotlib PNG.

Measured vs modeled: one answer, :mod:`bucketsearch.index.costmodel`'s. Every measured query's
per-radius server counters (the search answers' ``stats`` records; a uniform sample of at most
20,000 queries, :class:`~bucketsearch.loadtest.stats.QueryReservoir`, described in
``model.sample``) go to :func:`~bucketsearch.index.costmodel.fit_all` once; ``model`` holds its
result: every ``t0`` estimate named by its estimator (``radius_fit``, ``query_model.probes``),
the per-query extended model (``query_model``: fixed, per probe, per item, per candidate; terms
the data cannot identify reported and left out), per radius ``radii`` (measured ``T(r)`` and
cumulative ``T(R)`` p50/p90/p99, ``t0 C(Q, r)`` and ``t0 sum_{i<=r} C(Q, i)``, ``T(R)/T(0)``
beside ``sum_{i<=R} C(Q, i)``, mean empty buckets, ``queries``, ``empty_ball_queries``) and the
verdicts (docs/cost-model.md). Beside it, ``model.server`` shows the server's own estimates
(``GET /v1/indexes/{name}/cost-model``: each with its ``source`` and ``estimator``).

What ran is charged by its own model: ``model.engines``
(:func:`~bucketsearch.index.costmodel.engines.engine_report`) charges every sampled query by the
model of the engine that ran it (single table, multi-index hashing, scan; an ``auto`` index's
plan per query), per class and radius with the engine's share, counters, modeled and measured
cost, their ratio and the verdict per model. The paper's model (``fit_all`` above) is judged
only on the range queries that ran single-table probing (``model.paper_scope``); beside every
row it stands as one column, ``paper_ns = t0 x sum_c`` with ``sum_c = sum_{i<=R} C(Q, i)`` and
the t0 named in ``model.modeled_with`` (this run's ``radius_fit``; else the server's).

Without the server's per-radius counters (a run with ``--no-stats``, the default of ``--wire
binary``) nothing of that is measured: the report says so (``model.available`` false and the
reason) and shows the client-side figures per class only, never zeros.

Thresholds (``--slo``, as k6's): ``[CLASS:]METRIC OP VALUE[UNIT]``, e.g. ``p99<20ms``,
``error_rate<0.1%``, ``rps>=500``, ``r2:p99<5ms``; see :data:`SLO_HELP`. A run breaching one
exits with status 99 (``SLO_EXIT``); a metric without a value (no measured request) counts as a
breach.
"""
from __future__ import annotations

import math
import operator
import platform
import re
import sys
from dataclasses import dataclass
from importlib import metadata

import numpy as np

from bucketsearch.index.costmodel import describe, fit_all
from bucketsearch.index.costmodel.engines import (LEGEND, QuerySamples, describe_models,
                                                  engine_report, engines_table)
from bucketsearch.index.metrics import to_jsonable
from bucketsearch.loadtest.stats import LoadStats
from bucketsearch.loadtest.workload import probes_upto

#: the percentiles of ``latency_spectrum_ms`` (the run's whole latency distribution)
SPECTRUM = (0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99)
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
def server_estimates(cost_model: dict | None) -> dict | None:
    """The server's t0 and its estimates out of its ``/cost-model`` answer (None without one):
    ``t0_ns`` (the t0 it models with) with its ``t0_estimator`` and ``t0_source``, and
    ``estimates``, every t0 it has, each with ``estimator`` and ``source``."""
    if not isinstance(cost_model, dict):
        return None
    return {"t0_ns": cost_model.get("t0_ns"), "t0_estimator": cost_model.get("t0_estimator"),
            "t0_source": cost_model.get("t0_source"),
            "estimates": list(cost_model.get("estimates") or [])}


def modeled_with(fit: dict | None, server: dict | None, queries: int) -> dict | None:
    """The t0 of the paper column (``paper_ns``): this run's ``radius_fit``, else the
    server's."""
    if fit is not None and fit.get("t0_ns"):
        return {"t0_ns": fit["t0_ns"], "estimator": fit["t0_estimator"],
                "source": f"this run ({queries} sampled queries)"}
    if server is not None and server["t0_ns"]:
        return {"t0_ns": server["t0_ns"], "estimator": server["t0_estimator"],
                "source": f"server ({server['t0_source']})"}
    return None


# -- the report document ----------------------------------------------------------------------
def _lat_ms(dist) -> dict:
    s = dist.summary(scale=1e-3)
    return {k: s[k] for k in ("p50", "p90", "p99", "p999", "max", "mean")}


def _class_entry(cls, bits: int, t0: float | None) -> dict:
    """One query class's figures: client latencies, the server's counters per query, and for a
    radius class the paper's single-table charge ``paper_ns = t0 x sum_c`` (``sum_c = sum_{i<=R}
    C(Q, i)``, named as such; what ran is charged by its own model in ``model.engines``)."""
    sum_c = probes_upto(bits, cls.radius) if cls.radius is not None else None
    probes = (sum(p * c for p, c in cls.probes.items()) / sum(cls.probes.values())
              if cls.probes else None)
    lookup = cls.lookup_ns.summary()
    kernel = cls.kernel_ns.summary()
    nq = cls.server_queries
    return {
        "label": cls.label, "radius": cls.radius, "k": cls.k,
        "probes": probes, "sum_c": sum_c,
        "paper_ns": t0 * sum_c if (t0 and sum_c is not None) else None,
        "engines": dict(sorted(cls.engines.items())),
        "server_lookup_ns": {"p50": lookup["p50"], "p99": lookup["p99"], "mean": lookup["mean"],
                             "count": lookup["count"]},
        "server_kernel_ns": {"p50": kernel["p50"], "p99": kernel["p99"], "mean": kernel["mean"],
                             "count": kernel["count"]},
        "radius_reached": _reached(cls.reached),
        "latency_ms": _lat_ms(cls.latency_us),
        "service_ms": _lat_ms(cls.service_us),
        "count": cls.requests, "queries": cls.queries, "errors": cls.errors,
        "items_per_query": cls.items_total / nq if nq else None,
        "results_per_query": cls.results / cls.queries if cls.queries else None,
        "empty_buckets_per_query": cls.empty_total / nq if nq else None,
        "nonempty_buckets_per_query": cls.nonempty_total / nq if nq else None,
        "empty_fraction": (cls.empty_total / (cls.empty_total + cls.nonempty_total)
                           if cls.empty_total + cls.nonempty_total else None),
    }


def _reached(counts) -> dict | None:
    """``{p50, max}`` of the radius each query reached (a Counter radius -> queries)."""
    if not counts:
        return None
    radii = sorted(counts)
    cum = np.cumsum([counts[r] for r in radii])
    return {"p50": int(radii[int(np.searchsorted(cum, (cum[-1] + 1) // 2))]), "max": radii[-1]}


def unavailable_reason(params: dict, sampled: int) -> str | None:
    """Why the per-radius server measurements are missing (None when ``sampled`` queries
    brought them)."""
    if sampled:
        return None
    if not params.get("stats", True):
        return ("the run did not ask for the server's per-radius counters (--no-stats, the "
                "default with --wire binary): lookup times, probes, empty buckets and the model "
                "fits were not measured; run with --stats to get them")
    return "no measured request returned the server's per-radius counters"


def paper_scope(kept: list) -> tuple[list, str]:
    """The sampled queries the paper's model is judged on: range queries that ran single-table
    probing (every range query when the server did not say which engine ran; the note says)."""
    if kept and not any(q.engine for q in kept):
        return ([q for q in kept if q.k == 0],
                "range queries (the server did not say which engine ran them)")
    return ([q for q in kept if q.k == 0 and q.engine == "single"],
            "range queries that ran single-table probing")


def build_model(stats: LoadStats, params: dict, bits: int, cost_model: dict | None) -> dict:
    """``report["model"]``: :func:`~bucketsearch.index.costmodel.fit_all` of the sampled range
    queries that ran single-table probing (the paper's model: keys spread in, ``paper_scope``),
    ``engines`` (:func:`~bucketsearch.index.costmodel.engines.engine_report`: every sampled
    query charged by the model of the engine that ran it), ``available``/``unavailable``,
    ``sample``, ``server`` and ``modeled_with`` (see the module docstring)."""
    reservoir = stats.reservoir
    missing = unavailable_reason(params, reservoir.seen)
    scope, scope_note = paper_scope(reservoir.kept)
    fit = None if missing or not scope else to_jsonable(
        fit_all([q.records() for q in scope], bits))
    server = server_estimates(cost_model)
    used = modeled_with(fit, server, len(scope))
    engines = None
    if not missing:
        paper = (fit or {}).get("verdicts", {}).get("paper_model")
        engines = to_jsonable(engine_report(
            QuerySamples.from_queries([q.query() for q in reservoir.kept]), bits,
            (used or {}).get("t0_ns"), (used or {}).get("estimator"),
            {**paper, "queries": len(scope)} if paper else {"holds_at": [], "fails_at": []}))
    return {"available": missing is None, "unavailable": missing, **(fit or {}),
            "paper_scope": {"queries": len(scope), "of": len(reservoir.kept),
                            "which": scope_note},
            "engines": engines, "sample": reservoir.describe(), "server": server,
            "modeled_with": used}


def build_report(stats: LoadStats, params: dict, bits: int, cost_model: dict | None = None,
                 warnings: list[str] | None = None, client: dict | None = None) -> dict:
    """The JSON report: params, versions, rates, latencies, ``per_radius`` and ``knn`` (per
    query class), ``model`` (:func:`build_model`) and the server's cost model as it answered."""
    model = build_model(stats, params, bits, cost_model)
    t0 = (model["modeled_with"] or {}).get("t0_ns")
    classes = stats.ordered_classes()
    per_radius = [_class_entry(c, bits, t0) for c in classes if c.radius is not None]
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
        "latency_spectrum_ms": stats.latency_us.summary(1e-3, SPECTRUM),
        "service_ms": _lat_ms(stats.service_us),
        "queueing_ms": _lat_ms(stats.queueing_us),
        "scheduler_lag_ms": _lat_ms(stats.sched_lag_us),
        "client": client or {},
        "warnings": list(warnings or []),
        "per_radius": per_radius,
        "knn": knn,
        "model": model,
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
    """Rich tables: run summary, measured vs modeled per query class, the cost model
    (:func:`~bucketsearch.index.costmodel.describe`), the server's estimates, warnings."""
    from rich.markup import escape
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
    spectrum = report.get("latency_spectrum_ms")
    if spectrum and spectrum.get("count"):
        console.print("latency spectrum ms: " + "  ".join(
            f"{key} {_fmt_ms(value)}" for key, value in spectrum.items()
            if key not in ("count", "mean")))
    model = report["model"]
    if model.get("available") is False:
        _print_client_side(report, console)
        return
    print_classes(report, console)
    print_engines(model.get("engines"), console)
    sample = model["sample"]
    console.print(f"sample: {sample['queries_kept']:,} of {sample['queries_seen']:,} measured "
                  f"queries (uniform, at most {sample['capacity']:,})", highlight=False)
    scope = model["paper_scope"]
    console.print(f"the paper's single-table model, judged on {scope['queries']:,} of the "
                  f"{scope['of']:,} sampled queries ({scope['which']}):", highlight=False)
    if model.get("radii"):
        console.print(describe(model), markup=False, highlight=False, soft_wrap=True)
    else:
        console.print("  no such query: the paper's model is not judged on this run",
                      highlight=False)
    _print_server_estimates(model.get("server"), console)
    for w in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}")


CLASS_LEGEND = {
    "class": "query class (rR: range search at radius R; knnK: k nearest)",
    "engines": "the engines that ran the class's queries, with their share",
    "reached": "k-NN: the radius its expansion reached (the k-th distance), p50 / max",
    "probes": "mean bucket probes per query, of the engine that ran it",
    "kernel p50": "median in-kernel time of a query (total_ns)",
    "lat p50/p99 ms": "client latency from the intended send",
    "n": "requests",
}


def print_classes(report: dict, console) -> None:
    """Per query class: what ran (engines, share), its work and times, client latencies."""
    from rich.table import Table

    t = Table(title="per query class (what ran)")
    for col in ("class", "engines", "reached", "probes", "kernel p50", "lat p50 ms",
                "lat p99 ms", "errors", "n"):
        t.add_column(col, justify="right")
    for e in report["per_radius"] + report["knn"]:
        n = sum(e["engines"].values())
        engines = ", ".join(f"{k} {v / n:.0%}" for k, v in e["engines"].items()) if n else "-"
        reached = e.get("radius_reached")
        t.add_row(e["label"], engines,
                  "-" if e["radius"] is not None or not reached
                  else f"{reached['p50']} / {reached['max']}",
                  "-" if e["probes"] is None else f"{e['probes']:.4g}" if e["probes"] < 1000
                  else f"{e['probes']:,.0f}",
                  _fmt_ns(e["server_kernel_ns"]["p50"]), _fmt_ms(e["latency_ms"]["p50"]),
                  _fmt_ms(e["latency_ms"]["p99"]), str(e["errors"]), str(e["count"]))
    console.print(t)
    console.print("  " + "; ".join(f"{k}: {v}" for k, v in CLASS_LEGEND.items()),
                  markup=False, highlight=False)


def print_engines(engines: dict | None, console) -> None:
    """The cost model of what ran (:mod:`bucketsearch.index.costmodel.engines`): the table, every
    column defined, the models line by line, the verdicts per model."""
    if not engines:
        return
    console.print(engines_table(engines), markup=False, highlight=False, soft_wrap=True)
    console.print("columns:", highlight=False)
    for key, text in LEGEND.items():
        console.print(f"  {key}: {text}", markup=False, highlight=False)
    console.print("models (one line per term: coefficient x the counter it multiplies):",
                  highlight=False)
    for line in describe_models(engines):
        console.print(line, markup=False, highlight=False)
    console.print(f"verdicts ({engines['verdicts']['rule']}):", markup=False, highlight=False)
    for line in engines["verdicts"]["summary"]:
        console.print(f"  {line}", markup=False, highlight=False)


def _t0_name(model: dict) -> str:
    """``t0 [estimator] = x ns, source`` of the paper column (or why there is none)."""
    used = model.get("modeled_with")
    if not used:
        return "no t0: neither this run nor the server measured one"
    return f"t0 [{used['estimator']}] = {_fmt_ns(used['t0_ns'])}, {used['source']}"


def _print_server_estimates(server: dict | None, console) -> None:
    """The server's own t0 estimates, each named by its source and estimator."""
    if not server or not server["estimates"]:
        console.print("server's t0 estimates: none (no cost model from the server)")
        return
    console.print("server's t0 estimates (GET /v1/indexes/{name}/cost-model):", markup=False)
    for e in server["estimates"]:
        ci = e.get("ci_ns")
        console.print(f"  t0 [{e.get('source')} / {e.get('estimator')}] = "
                      f"{_fmt_ns(e.get('t0_ns'))}"
                      + (f" (CI {_fmt_ns(ci[0])} .. {_fmt_ns(ci[1])})" if ci else ""),
                      markup=False, highlight=False)


def _print_client_side(report: dict, console) -> None:
    """Per class, what the client measured; the server-side part is unavailable (and why)."""
    from rich.table import Table

    model = report["model"]
    t = Table(title="per query class (client side)")
    for col in ("class", "sumC(Q,i<=R)", "paper t0*sumC", "lat p50 ms", "lat p99 ms",
                "svc p50 ms", "results/query", "errors", "n"):
        t.add_column(col, justify="right")
    for e in report["per_radius"] + report["knn"]:
        rpq = e.get("results_per_query")
        t.add_row(e["label"], "-" if e["sum_c"] is None else f"{e['sum_c']:,}",
                  _fmt_ns(e["paper_ns"]), _fmt_ms(e["latency_ms"]["p50"]),
                  _fmt_ms(e["latency_ms"]["p99"]), _fmt_ms(e["service_ms"]["p50"]),
                  "-" if rpq is None else f"{rpq:.3g}", str(e["errors"]), str(e["count"]))
    console.print(t)
    console.print(f"paper t0*sumC: the paper's single-table model, t0 x sum_(i<=R) C(Q, i), "
                  f"{_t0_name(model)}", markup=False, highlight=False)
    console.print(f"measured vs modeled per radius: unavailable ({model['unavailable']})")
    _print_server_estimates(model.get("server"), console)
    for w in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}")


# -- thresholds (--slo) -----------------------------------------------------------------------
SLO_EXIT = 99
SLO_HELP = ("[CLASS:]METRIC OP VALUE[UNIT] with OP one of < <= > >=; METRIC: p50, p90, p99, "
            "p99.9, max, mean (latency from the intended send; units ns, us, ms (default), s; "
            "service_p50 ... for the service time), error_rate (a fraction, or with %), rps "
            "(requests/s), qps (queries/s); CLASS: a query class such as r1 or knn10; e.g. "
            "p99<20ms, error_rate<0.1%, r2:p99<5ms, rps>=500")
_SLO_RE = re.compile(r"^(?:(?P<cls>[A-Za-z0-9_]+):)?(?P<metric>[a-z_]+[0-9.]*)\s*"
                     r"(?P<op><=|>=|<|>)\s*(?P<value>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"
                     r"(?P<unit>[a-z%/]*)$")
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_LATENCY_KEYS = {"p50": "p50", "p90": "p90", "p99": "p99", "p99.9": "p999", "p999": "p999",
                 "max": "max", "mean": "mean"}
_TIME_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3, "": 1.0}
_RATE_UNITS = {"%": 0.01, "": 1.0}
_THROUGHPUT = {"rps": "achieved_rate", "qps": "queries_per_s"}


@dataclass(frozen=True)
class Slo:
    """One threshold: ``metric op threshold`` (latencies in ms, error rates as fractions)."""

    text: str
    metric: str
    op: str
    threshold: float
    qclass: str | None = None

    def holds(self, value: float | None) -> bool:
        return value is not None and _OPS[self.op](value, self.threshold)


def parse_slos(text: str) -> list[Slo]:
    """``"p99<20ms,error_rate<0.1%"`` -> thresholds; ValueError naming the part and the
    grammar (:data:`SLO_HELP`)."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        m = _SLO_RE.match(part)
        bad = f"--slo {part!r}: "
        if m is None:
            raise ValueError(bad + f"not a threshold; allowed: {SLO_HELP}")
        metric, unit, value = m["metric"], m["unit"], float(m["value"])
        base = metric.removeprefix("service_")
        if base in _LATENCY_KEYS:
            if unit not in _TIME_UNITS_MS:
                raise ValueError(bad + f"unit {unit!r} of a latency; allowed: ns, us, ms, s")
            value *= _TIME_UNITS_MS[unit]
        elif metric in ("error_rate", "errors"):
            if unit not in _RATE_UNITS:
                raise ValueError(bad + f"unit {unit!r} of an error rate; allowed: % or none "
                                 "(a fraction)")
            value *= _RATE_UNITS[unit]
            metric = "error_rate"
        elif metric in _THROUGHPUT:
            if unit not in ("", "/s"):
                raise ValueError(bad + f"unit {unit!r} of a rate; allowed: /s or none")
            if m["cls"]:
                raise ValueError(bad + f"{metric} is measured for the whole run, not per class")
        else:
            raise ValueError(bad + f"unknown metric {metric!r}; allowed: {SLO_HELP}")
        out.append(Slo(part, metric, m["op"], value, m["cls"]))
    if not out:
        raise ValueError(f"--slo {text!r}: no threshold given; allowed: {SLO_HELP}")
    return out


def slo_value(report: dict, slo: Slo) -> tuple[float | None, str]:
    """The measured value of ``slo``'s metric in ``report`` and its display unit."""
    scope = report
    if slo.qclass is not None:
        scope = next((e for e in report["per_radius"] + report["knn"]
                      if e["label"] == slo.qclass), None)
        if scope is None:
            return None, ""
    if slo.metric in _THROUGHPUT:
        return scope.get(_THROUGHPUT[slo.metric]), "/s"
    if slo.metric == "error_rate":
        n = scope.get("requests", scope.get("count")) or 0
        return (scope["errors"] / n if n else None), ""
    dist = "service_ms" if slo.metric.startswith("service_") else "latency_ms"
    return scope[dist][_LATENCY_KEYS[slo.metric.removeprefix("service_")]], " ms"


def evaluate_slos(report: dict, slos: list[Slo]) -> list[dict]:
    """One record per threshold: the expression, the measured value, ``ok``."""
    out = []
    for slo in slos:
        value, unit = slo_value(report, slo)
        rec = {"slo": slo.text, "metric": slo.metric, "class": slo.qclass, "op": slo.op,
               "threshold": slo.threshold, "value": value, "ok": slo.holds(value)}
        if slo.metric == "error_rate" and value is not None:
            shown = f"{value:.4%}"
        else:
            shown = "no measured request" if value is None else f"{value:.4g}{unit}"
        rec["measured"] = shown
        out.append(rec)
    return out


def print_slos(results: list[dict], console=None) -> None:
    console = console or make_console()
    for r in results:
        status = "[green]ok[/green]" if r["ok"] else "[bold red]BREACHED[/bold red]"
        console.print(f"threshold {r['slo']}: {status} (measured {r['measured']})")


# -- plot -------------------------------------------------------------------------------------
def plot_report(report: dict, path) -> None:
    """PNG: per radius searched by a range class, what ran (each engine's measured p50 and its
    own model's charge), the single-table T(R) p50 beside the paper's ``t0 sum_{i<=R} C(Q, i)``
    (t0 named) and the client latency p50 of each radius class (log y); and empty vs non-empty
    buckets probed per query at each radius."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = report["model"]
    rows = model.get("radii") or []
    radii = [r["radius"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    if rows:
        cum = [r["measured_cumulative"] for r in rows]
        ax1.plot(radii, _nan([c["p50_ns"] for c in cum]), "s-",
                 label="single-table T(R) p50 (paper's scope)")
        if model.get("t0_ns"):
            ax1.plot(radii, _nan([r["paper_cumulative_ns"] for r in rows]), "o--",
                     label=f"paper t0 sum C(Q, i), t0 [{model['t0_estimator']}] = "
                           f"{_fmt_ns(model['t0_ns'])}")
    # what ran, by the model of the engine that ran it (range classes only: a k-NN class
    # adds no radius, so the axes stay those of the radii searched)
    ran = [r for r in (model.get("engines") or {}).get("rows", []) if r["k"] == 0]
    ticks = set(radii)
    for i, engine in enumerate(dict.fromkeys(r["engine"] for r in ran)):
        er = [r for r in ran if r["engine"] == engine]
        ax1.plot([r["radius"] for r in er], [r["measured_p50_ns"] for r in er], "D-",
                 color=f"C{i + 2}", label=f"{engine}: measured p50")
        ax1.plot([r["radius"] for r in er], _nan([r["modeled_p50_ns"] for r in er]), "x:",
                 color=f"C{i + 2}", label=f"{engine}: its model")
        ticks.update(r["radius"] for r in er)
    classes = [e for e in report["per_radius"] if e["latency_ms"]["p50"] is not None]
    if classes:
        ax1.plot([e["radius"] for e in classes], [e["latency_ms"]["p50"] * 1e6 for e in classes],
                 "^-", alpha=0.6, label="client latency p50 (radius-R class)")
    if rows or classes or ran:
        ax1.set_yscale("log")
        ax1.set_xticks(sorted(ticks | {e["radius"] for e in classes}))
        ax1.legend(fontsize=8)
    else:
        ax1.text(0.5, 0.5, "nothing measured", ha="center", va="center", transform=ax1.transAxes)
    ax1.set_xlabel("radius R")
    ax1.set_ylabel("ns per query")
    ax1.set_title("measured vs modeled T(R)")
    ax1.grid(True, which="both", alpha=0.3)
    if rows:
        x = np.arange(len(rows))
        empty = [r["mean_empty_buckets"] for r in rows]
        nonempty = [None if r["probes"] is None or e is None else r["probes"] - e
                    for r, e in zip(rows, empty)]
        ax2.bar(x - 0.2, _nan(empty), 0.4, label="empty buckets")
        ax2.bar(x + 0.2, _nan(nonempty), 0.4, label="non-empty buckets")
        ax2.set_xticks(x, [str(r) for r in radii])
        ax2.set_yscale("log")
        ax2.legend(fontsize=8)
    else:
        ax2.text(0.5, 0.5, "no server stats", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_xlabel("radius r")
    ax2.set_ylabel("buckets probed per query at r")
    ax2.set_title("empty buckets per radius")
    ax2.grid(True, which="both", axis="y", alpha=0.3)
    fig.suptitle(f"{report['params'].get('mode')} loop, "
                 f"{report['achieved_rate'] or 0:,.0f} req/s achieved")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _nan(values):
    return [math.nan if v is None else v for v in values]


__all__ = ["build_model", "build_report", "print_report", "plot_report", "versions"]
