"""``bucketsearch reproduce``: the argument of Jiang, Li & Li ("On the Evaluation Metric for
Hashing") on the embedded data set.

Heuristic coding strategies at Q = 8 bits: LSH, LSH-SE (same extension, s = 1 and s = 8 extra
1-bits on both sides) and LSH-DE (different extension, s = 1: 0 on the database side, 1 on the
query side). The extensions leave every Hamming ranking unchanged, so MAP cannot tell them
apart, while a bucket search pays for the extra bits: RAMAP orders them LSH >= LSH-SE > LSH-DE.
Prints the two tables of the paper (MAP vs RAMAP by radius; precision, recall and RAMAP by
radius), then checks the claims and exits non-zero if one fails.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

HELP = "reproduce the RAMAP paper's tables (LSH, LSH-SE, LSH-DE) on the embedded data"
EPILOG = """examples:
  bucketsearch reproduce                      # Q = 8, radius 0..4, seed 0
  bucketsearch reproduce --bits 12 --radius-max 6 --json repro.json
"""

TOL = 1e-12


def add_arguments(parser) -> None:
    parser.add_argument("--bits", type=int, default=8, help="LSH bits Q (default 8)")
    parser.add_argument("--radius-max", type=int, default=4, help="largest radius (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="data and hyperplane seed")
    parser.add_argument("--n-db", type=int, default=59_000, help="database size (default 59000)")
    parser.add_argument("--n-queries", type=int, default=1_000, help="queries (default 1000)")
    parser.add_argument("--json", metavar="OUT.json", help="write the tables and checks as JSON")


def strategies(xb, xq, bits: int, seed: int) -> dict:
    """name -> (db codes, query codes) for LSH, LSH-SE (s=1, 8), LSH-DE (s=1)."""
    from bucketsearch.index.evaluation.coding import different_extension, lsh_codes, same_extension
    b, q = lsh_codes(xb, xq, bits, seed=seed)
    return {
        "LSH": (b, q),
        "LSH-SE(s=1)": same_extension(b, q, 1),
        "LSH-SE(s=8)": same_extension(b, q, 8),
        "LSH-DE(s=1)": different_extension(b, q, 1),
    }


def compute(bits: int = 8, radius_max: int = 4, seed: int = 0, n_db: int = 59_000,
            n_queries: int = 1_000) -> dict:
    """MAP, precision, recall and RAMAP by radius for each strategy, and the claim checks."""
    from bucketsearch.index.evaluation.datasets import synthetic_cifar
    from bucketsearch.index.metrics import (hamming_histograms, radius_metrics, ramap,
                                            ranking_metrics)
    from bucketsearch.index.evaluation.relevance import from_labels

    data = synthetic_cifar(seed=seed, n_db=n_db, n_queries=n_queries)
    rel = from_labels(data.yq, data.yb)
    rows = {}
    for name, (b, q) in strategies(data.xb, data.xq, bits, seed).items():
        hist = hamming_histograms(b, q, rel, ks=[1], as_ranked=False, code_stats=False)
        rm = radius_metrics(hist)
        _, ram = ramap(hist)
        rk = ranking_metrics(hist)["mean"]
        n = radius_max + 1
        rows[name] = {"bits": hist.bits, "map": rk["map_all_tie_aware"],
                      "map_best": rk["map_all_best"], "map_worst": rk["map_all_worst"],
                      "precision": rm.precision_macro[:n].tolist(),
                      "recall": rm.recall_macro[:n].tolist(), "ramap": ram[:n].tolist()}
    return {"bits": bits, "radius_max": radius_max, "seed": seed, "n_db": n_db,
            "n_queries": n_queries, "strategies": rows, "checks": check_claims(rows)}


def check_claims(rows: dict) -> list[dict]:
    """The paper's claims, each with its outcome."""
    lsh, se1, se8, de = (rows[k] for k in ("LSH", "LSH-SE(s=1)", "LSH-SE(s=8)", "LSH-DE(s=1)"))
    maps = [r["map"] for r in rows.values()]
    same_pr = all(np.allclose(lsh[key], se[key], rtol=0, atol=TOL)
                  for se in (se1, se8) for key in ("precision", "recall"))
    ra = {k: np.array(v["ramap"]) for k, v in rows.items()}
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
    ]


def format_tables(res: dict) -> str:
    rows = res["strategies"]
    radii = range(res["radius_max"] + 1)
    out = [f"Embedded synthetic CIFAR-10-shaped data ({res['n_db']} db x {res['n_queries']} "
           f"queries, seed {res['seed']}), LSH with Q = {res['bits']} bits", "",
           "Table 1: MAP vs RAMAP@R",
           f"{'method':14s} {'bits':>4s} {'MAP':>8s} " + " ".join(f"{'R=' + str(r):>8s}"
                                                              for r in radii)]
    for name, row in rows.items():
        out.append(f"{name:14s} {row['bits']:4d} {row['map']:8.4f} "
                   + " ".join(f"{v:8.4f}" for v in row["ramap"]))
    out += ["", "Table 2: precision, recall and RAMAP by radius",
            f"{'method':14s} {'r':>2s} {'precision':>10s} {'recall':>10s} {'RAMAP':>10s}"]
    for name, row in rows.items():
        for r in radii:
            out.append(f"{name:14s} {r:2d} {row['precision'][r]:10.4f} {row['recall'][r]:10.4f} "
                       f"{row['ramap'][r]:10.4f}")
    out += ["", "Claims:"]
    out += [f"  [{'PASS' if c['ok'] else 'FAIL'}] {c['claim']}" for c in res["checks"]]
    return "\n".join(out)


def run(args) -> int:
    if not 1 <= args.bits <= 64:
        raise ValueError(f"--bits must be in [1, 64], got {args.bits}")
    if not 0 <= args.radius_max <= args.bits:
        raise ValueError(f"--radius-max must be in [0, {args.bits}], got {args.radius_max}")
    start = time.perf_counter()
    res = compute(args.bits, args.radius_max, args.seed, args.n_db, args.n_queries)
    print(format_tables(res))
    print(f"\n({time.perf_counter() - start:.1f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if all(c["ok"] for c in res["checks"]) else 1
