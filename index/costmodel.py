"""Cost models of a search, calibrated from the index's own per-radius measurements.

1. The RAMAP paper's model (Jiang, Li & Li, "On the Evaluation Metric for Hashing"): a radius-R
   bucket search costs ``T(R) = t0 * P(R)`` with ``P(R) = sum_{r<=R} C(Q, r)`` probes. ``t0`` is
   fitted by least squares through the origin on samples ``(p_i, t_i)`` (probes and measured
   nanoseconds of one query at one radius): ``t0 = sum p_i t_i / sum p_i^2``
   (:func:`fit_t0`); or measured directly by a micro-benchmark of empty and non-empty probes
   (:func:`probe_microbenchmark`), mixed by the fraction of non-empty probes:
   ``t0 = (1 - f) t_empty + f t_nonempty``.
2. The extended model of one (query, radius) sample,
   ``t = c + a * probes + b * nonempty_buckets + d * items (+ e * candidates)``, fitted by
   ordinary least squares (:func:`fit_extended`).

Goodness of fit: ``R^2 = 1 - SS_res / SS_tot`` with ``SS_tot = sum (t_i - mean t)^2`` (the
centred form, also for the fit through the origin, so a constant predictor scores 0), and per
radius the relative error ``|mean modeled - mean measured| / mean measured``. The paper model's
R^2 is computed over the per-radius means (one point per radius), the extended model's over the
(query, radius) samples. Probe counts are exact Python ints (``math.comb``); they are turned
into floats only to multiply by a time.

:func:`cost_report` measures any index (single table, multi-index, scan, planner) radius by
radius and puts the measured cost next to the paper model and the extended model; it renders as
a dict, a rich console table (:func:`print_report`) and a PNG (:func:`plot_reports`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from bucketsearch.index._jit import monotonic_ns, njit
from bucketsearch.index.table import find_bucket, find_bucket_word

EXTENDED_TERMS = ("const", "probes", "nonempty_buckets", "items", "candidates")


def paper_probes(bits: int, max_radius: int) -> list[int]:
    """Exact cumulative probes ``P(R) = sum_{r<=R} C(Q, r)`` for ``R = 0..max_radius``."""
    out, total = [], 0
    for r in range(max_radius + 1):
        total += math.comb(bits, r)
        out.append(total)
    return out


def fit_t0(probes, times) -> float:
    """Least squares through the origin: ``t0 = argmin sum (t - t0 p)^2 = sum p t / sum p^2``
    (0.0 when every ``p`` is 0)."""
    p = np.array([float(x) for x in np.ravel(probes)], dtype=np.float64)
    t = np.asarray(times, dtype=np.float64).ravel()
    den = float(p @ p)
    return float(p @ t) / den if den > 0 else 0.0


def r_squared(measured, modeled) -> float:
    """``1 - sum (y - yhat)^2 / sum (y - mean y)^2`` (nan when every ``y`` is equal)."""
    y = np.asarray(measured, dtype=np.float64).ravel()
    yhat = np.asarray(modeled, dtype=np.float64).ravel()
    ss_tot = float(((y - y.mean()) ** 2).sum()) if len(y) else 0.0
    if ss_tot == 0:
        return float("nan")
    return 1.0 - float(((y - yhat) ** 2).sum()) / ss_tot


def relative_errors(measured, modeled) -> list[float]:
    """``|modeled - measured| / measured`` per entry (nan where measured is 0)."""
    y = np.asarray(measured, dtype=np.float64)
    yhat = np.asarray(modeled, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return [float(v) for v in np.where(y > 0, np.abs(yhat - y) / y, np.nan)]


# --------------------------------------------------------------------------- paper model
@dataclass
class PaperModel:
    """``T(R) = t0 * sum_{r<=R} C(Q, r)``, fitted on one radius range."""

    bits: int
    t0_ns: float
    radii: list[int] = field(default_factory=list)      # radii of the fit
    r2: float = float("nan")                            # over per-radius means
    max_rel_error: float = float("nan")
    rel_error: list[float] = field(default_factory=list)  # per radius of the fit

    def predict(self, max_radius: int) -> list[float]:
        """Modeled cumulative cost ``T(R)`` in ns for ``R = 0..max_radius``."""
        return [self.t0_ns * float(p) for p in paper_probes(self.bits, max_radius)]

    def to_dict(self) -> dict:
        return asdict(self)


def per_radius_means(stats, field_name: str) -> np.ndarray:
    """Mean of a per-radius statistic over the queries that reached each radius."""
    arr = getattr(stats, field_name)
    reached = np.arange(arr.shape[1])[None, :] < stats.radii[:, None]
    counts = np.maximum(reached.sum(axis=0), 1)
    return (np.where(reached, arr, 0).sum(axis=0) / counts).astype(np.float64)


def fit_paper_model(stats, bits: int, max_radius: int | None = None) -> PaperModel:
    """Fit ``t0`` on single-table statistics of a range search (``stats=True``).

    Per radius r the measured cost is the mean ``lookup_ns[:, r]``, the model ``t0 C(Q, r)``;
    ``t0`` is the least-squares slope through the origin over every (query, radius) sample, R^2
    and relative errors compare the cumulative per-radius means ``T(R)`` with ``t0 P(R)``.
    """
    width = stats.probes.shape[1] if max_radius is None else max_radius + 1
    radii = list(range(width))
    probes = np.array([[math.comb(bits, r) for r in radii]] * len(stats.radii), dtype=object)
    reached = np.arange(width)[None, :] < stats.radii[:, None]
    t0 = fit_t0(probes[reached], stats.lookup_ns[:, :width][reached])
    measured = np.cumsum(per_radius_means(stats, "lookup_ns")[:width])
    modeled = np.array([t0 * float(p) for p in paper_probes(bits, width - 1)])
    rel = relative_errors(measured, modeled)
    return PaperModel(bits, t0, radii, r_squared(measured, modeled),
                      float(np.nanmax(rel)) if rel else float("nan"), rel)


# --------------------------------------------------------------------------- micro-benchmark
@njit
def _time_probes(keys, codes, slots, bitmap, table_shift, filter_shift, direct, repeats):
    """Mean ns per lookup of ``keys`` (each a one- or several-word code), ``repeats`` passes."""
    W = keys.shape[1]
    found = 0
    t0 = monotonic_ns()
    for _ in range(repeats):
        for i in range(keys.shape[0]):
            if W == 1:
                b = find_bucket_word(keys[i, 0], codes, slots, bitmap, table_shift,
                                     filter_shift, direct)
            else:
                b = find_bucket(keys[i], W, codes, slots, bitmap, table_shift, filter_shift,
                                direct)
            found += b >= 0
    elapsed = monotonic_ns() - t0
    return elapsed / max(keys.shape[0] * repeats, 1), found


def probe_microbenchmark(table, n_keys: int = 20000, repeats: int = 5, seed: int = 0) -> dict:
    """Time empty probes (random codes absent from the table) and non-empty probes (codes of the
    table) of a :class:`~index.table.BucketTable`: ``{"empty_ns", "nonempty_ns", "fill"}`` where
    ``fill`` is the fraction of random codes that hit a bucket."""
    from bucketsearch.index.evaluation.synth import uniform_codes
    rng = np.random.default_rng(seed)
    keys = uniform_codes(n_keys, table.bits, seed=seed)
    args = table.lookup_args()
    _time_probes(keys[:1], *args, 1)  # compile / warm
    hits = _hit_mask(keys, table)
    empty = np.ascontiguousarray(keys[~hits])
    out = {"fill": float(hits.mean()) if len(hits) else 0.0, "empty_ns": float("nan"),
           "nonempty_ns": float("nan")}
    if len(empty):
        out["empty_ns"] = float(_time_probes(empty, *args, repeats)[0])
    if table.distinct_codes:
        full = np.ascontiguousarray(table.codes[rng.integers(0, table.distinct_codes, n_keys)])
        out["nonempty_ns"] = float(_time_probes(full, *args, repeats)[0])
    return out


def _hit_mask(keys, table):
    """Whether each key is a code of the table (by a sorted search, independent of the hash)."""
    if not table.distinct_codes:
        return np.zeros(len(keys), dtype=bool)
    codes = table.codes
    view_dtype = np.dtype((np.void, 8 * codes.shape[1]))
    a = np.ascontiguousarray(codes).view(view_dtype).ravel()
    b = np.ascontiguousarray(keys).view(view_dtype).ravel()
    return np.isin(b, a)


def microbenchmark_t0(table, fill: float | None = None, **kwargs) -> dict:
    """Paper ``t0`` from the micro-benchmark: ``(1 - f) t_empty + f t_nonempty`` where ``f`` is
    the fraction of non-empty probes (given, e.g. measured by a search, or the random fill)."""
    bench = probe_microbenchmark(table, **kwargs)
    f = bench["fill"] if fill is None else float(fill)
    empty = bench["empty_ns"] if not math.isnan(bench["empty_ns"]) else bench["nonempty_ns"]
    nonempty = bench["nonempty_ns"] if not math.isnan(bench["nonempty_ns"]) else empty
    return {**bench, "f": f, "t0_ns": (1 - f) * empty + f * nonempty}


# --------------------------------------------------------------------------- extended model
@dataclass
class ExtendedModel:
    """``t = c + a probes + b nonempty + d items (+ e candidates)`` per (query, radius) sample."""

    terms: tuple[str, ...]
    coef: dict[str, float]
    r2: float = float("nan")
    rel_error: list[float] = field(default_factory=list)   # per radius, of the means
    max_rel_error: float = float("nan")
    samples: int = 0

    def predict(self, features: dict) -> np.ndarray:
        """Modeled ns for arrays of features (``const`` is implied)."""
        out = self.coef.get("const", 0.0)
        for name in self.terms:
            if name != "const":
                out = out + self.coef[name] * np.asarray(features[name], dtype=np.float64)
        return np.asarray(out, dtype=np.float64)

    def to_dict(self) -> dict:
        return asdict(self)


def stats_features(stats) -> dict:
    """Per-(query, radius) feature arrays of a SearchStats (``candidates`` when recorded)."""
    feats = {name: getattr(stats, name) for name in ("probes", "nonempty_buckets", "items")}
    if getattr(stats, "candidates", None) is not None:
        feats["candidates"] = stats.candidates
    return feats


def fit_extended(stats, terms: tuple[str, ...] | None = None, nonnegative: bool = True,
                 relative: bool = False) -> ExtendedModel:
    """Least squares fit of the extended model on every (query, radius) sample of ``stats``.

    ``terms`` defaults to const, probes, nonempty_buckets, items (+ candidates when the stats
    have them). With ``nonnegative`` a term whose coefficient comes out negative is dropped and
    the fit redone (a cost is never negative; it keeps the extrapolation sane). With
    ``relative`` the squared *relative* residuals ``((t - that) / max(t, 50 ns))^2`` are
    minimised (weighted least squares), so cheap radii weigh as much as expensive ones (what a
    planner comparing costs needs); R^2 is always the plain one.
    """
    feats = stats_features(stats)
    if terms is None:
        terms = tuple(t for t in EXTENDED_TERMS if t == "const" or t in feats)
    reached = np.arange(stats.probes.shape[1])[None, :] < stats.radii[:, None]
    y = stats.lookup_ns[reached].astype(np.float64)
    active = list(terms)
    coef = dict.fromkeys(terms, 0.0)
    while active:
        X = np.column_stack([np.ones(len(y)) if t == "const" else
                             feats[t][reached].astype(np.float64) for t in active])
        wts = 1.0 / np.maximum(y, 50.0) if relative else np.ones(len(y))
        sol = (np.linalg.lstsq(X * wts[:, None], y * wts, rcond=None)[0] if len(y)
               else np.zeros(len(active)))
        bad = [t for t, c in zip(active, sol) if c < 0]
        if not nonnegative or not bad:
            coef.update({t: float(c) for t, c in zip(active, sol)})
            break
        active.remove(min(bad, key=lambda t: sol[active.index(t)]))
    model = ExtendedModel(tuple(terms), coef, samples=int(len(y)))
    full = {t: feats[t] for t in terms if t != "const"}
    yhat_all = model.predict(full) * np.ones(stats.lookup_ns.shape)
    model.r2 = r_squared(y, yhat_all[reached])
    counts = np.maximum(reached.sum(axis=0), 1)
    meas = np.where(reached, stats.lookup_ns, 0).sum(axis=0) / counts
    mod = np.where(reached, yhat_all, 0).sum(axis=0) / counts
    model.rel_error = relative_errors(meas, mod)
    finite = [e for e in model.rel_error if not math.isnan(e)]
    model.max_rel_error = max(finite) if finite else float("nan")
    return model


# --------------------------------------------------------------------------- report
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
    origin; pass the single table's model to see how far it is from mih or scan), and, for
    indexes with per-radius phases, ``lookup_ns`` is the mean cumulative per-radius time and
    ``extended_ns`` the extended model fitted on those phases. Radii whose single-table/mih
    probe count exceeds the index's limit are reported with ``measured_ns = None``.
    """
    mode = _mode_name(index)
    bits = index.bits
    xq = index._check_queries(queries)
    rows = []
    last_stats = None
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
    if last_stats is not None and mode in ("single", "mih"):
        ext = fit_extended(last_stats)
        cum = np.cumsum(_mean_prediction(ext, last_stats))
        for r in rows:
            if r["radius"] < len(cum):
                r["extended_ns"] = float(cum[r["radius"]])
        report["extended"] = ext.to_dict()
    return report


def _mean_prediction(model: ExtendedModel, stats) -> np.ndarray:
    reached = np.arange(stats.probes.shape[1])[None, :] < stats.radii[:, None]
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
    for col in ("R", "P(R)", "measured us", "paper us", "paper/measured", "extended us", "plan"):
        table.add_column(col, justify="right")
    for r in report["rows"]:
        def us(v):
            return "-" if v is None else f"{v / 1000:.2f}"
        table.add_row(str(r["radius"]), f"{r['probes_paper']:,}", us(r["measured_ns"]),
                      us(r["paper_ns"]),
                      "-" if r["paper_over_measured"] is None
                      else f"{r['paper_over_measured']:.2f}",
                      us(r.get("extended_ns")), r.get("plan", ""))
    console.print(table)


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
