"""``bucketsearch advise``: which radius to use for an index being served, from the server's
radius advisor (``POST /v1/indexes/{name}/advise``, :meth:`Client.advise`): per radius the
answers per query, the empty-ball share, the modeled and measured cost per query and, with
labels or duplicate pairs, precision / recall / F1 / RAMAP with 95% intervals; the recommended
radius with its reason, and the quality-vs-cost frontier (``--plot``, drawn by
:func:`bucketsearch.index.evaluation.frontier.plot_frontier`).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bucketsearch.loadtest.backupcmd import _client, _common

HELP = "recommend a search radius for an index: answers, cost and quality per radius"
EPILOG = """examples:
  # 200 of the index's own items as queries, radii 0..6: answers, empty balls, cost
  bucketsearch advise photos --radius-max 6
  # with class labels of the items (ids.npy, labels.npy: one label per id)
  bucketsearch advise photos --db-ids ids.npy --db-labels labels.npy --objective recall
  # queries of your own with their labels, a cost budget of 50 us a query, the frontier drawn
  bucketsearch advise photos --queries q.npy --query-labels ql.npy --db-ids ids.npy \\
      --db-labels labels.npy --budget-us 50 --plot frontier.png --json advice.json
  # pairs marked duplicate (1) / not duplicate (0): rows (query position, item id, flag)
  bucketsearch advise photos --query-ids 17,42,99 --pairs pairs.npy
"""


def _add_arguments(parser) -> None:
    _common(parser)
    parser.add_argument("index", help="the index to advise on")
    q = parser.add_argument_group("queries (default: a seeded sample of the index's items)")
    q.add_argument("--sample", type=int, default=None, help="items drawn as queries (default "
                   "200, or the server's advise_max_queries if lower)")
    q.add_argument("--seed", type=int, default=0, help="seed of the sample and the bootstrap")
    q.add_argument("--query-ids", metavar="IDS", help="these items as the queries: comma "
                   "separated ids or an .npy file")
    q.add_argument("--queries", metavar="Q.npy", help="query codes: (n, bits) 0/1 or packed")
    q.add_argument("--no-holdout", action="store_true", help="keep item queries in the database "
                   "(each then finds itself at distance 0)")
    q.add_argument("--radius-max", type=int, default=None, help="radii 0..R (default min(bits, "
                   "10) within the server's advise_max_radius)")
    r = parser.add_argument_group("relevance (optional)")
    r.add_argument("--db-ids", metavar="IDS.npy", help="items the --db-labels belong to (default "
                   "ids 0..n-1)")
    r.add_argument("--db-labels", metavar="L.npy", help="class ids (1-D) or multi-hot rows (2-D)")
    r.add_argument("--query-labels", metavar="QL.npy", help="labels of the --queries codes")
    r.add_argument("--pairs", metavar="P.npy|P.csv", help="rows (query position, item id, "
                   "duplicate 0/1)")
    d = parser.add_argument_group("the rule")
    d.add_argument("--objective", choices=("f1", "recall"), default="f1")
    d.add_argument("--min-gain", type=float, default=0.01, help="quality a larger radius must "
                   "add (default 0.01)")
    d.add_argument("--min-precision", type=float, default=0.0, help="precision floor")
    d.add_argument("--budget-us", type=float, default=None, help="cost budget per query (us)")
    d.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (0: none)")
    d.add_argument("--repeats", type=int, default=3, help="timed runs per radius")
    d.add_argument("--measure-queries", type=int, default=64,
                   help="queries of the sample timed per radius (default 64)")
    o = parser.add_argument_group("outputs")
    o.add_argument("--json", metavar="OUT.json", help="write the whole answer as JSON")
    o.add_argument("--plot", metavar="OUT.png", help="draw the quality-vs-cost frontier")


def _array(path: str, flag: str) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{flag}: {path!r} does not exist")
    if p.suffix == ".csv":
        return np.loadtxt(p, delimiter=",", dtype=np.int64, ndmin=2)
    return np.load(p, allow_pickle=False)


def _ids(text: str, flag: str) -> list[int]:
    if text.endswith((".npy", ".csv")):
        return [int(i) for i in _array(text, flag).reshape(-1)]
    try:
        return [int(i) for i in text.split(",") if i.strip()]
    except ValueError:
        raise ValueError(f"{flag}: comma separated integers or an .npy file, got {text!r}") \
            from None


def request_options(args) -> tuple[dict, np.ndarray | None]:
    """``(Client.advise keyword arguments, query codes or None)`` from the flags."""
    opts = {"sample": args.sample, "seed": args.seed, "radius_max": args.radius_max,
            "holdout": not args.no_holdout, "objective": args.objective,
            "min_gain": args.min_gain, "min_precision": args.min_precision,
            "budget_us": args.budget_us, "resamples": args.resamples, "repeats": args.repeats,
            "measure_queries": args.measure_queries}
    queries = _array(args.queries, "--queries") if args.queries else None
    if args.query_ids:
        opts["query_ids"] = _ids(args.query_ids, "--query-ids")
    if args.db_labels:
        labels = _array(args.db_labels, "--db-labels")
        ids = _ids(args.db_ids, "--db-ids") if args.db_ids else list(range(len(labels)))
        if len(ids) != len(labels):
            raise ValueError(f"--db-ids: {len(ids)} ids for {len(labels)} labels")
        opts["db_ids"], opts["db_labels"] = ids, labels.tolist()
    elif args.db_ids:
        raise ValueError("--db-ids: give --db-labels with it")
    if args.query_labels:
        opts["query_labels"] = _array(args.query_labels, "--query-labels").tolist()
    if args.pairs:
        rows = _array(args.pairs, "--pairs")
        if rows.ndim != 2 or rows.shape[1] != 3:
            raise ValueError(f"--pairs: rows of (query position, item id, duplicate 0/1), got "
                             f"shape {rows.shape}")
        opts["pairs"] = [[int(q), int(i), bool(f)] for q, i, f in rows.tolist()]
    return opts, queries


def _us(ns) -> str:
    return "-" if ns is None else f"{ns / 1e3:.3g}"


def _q(row, key) -> str:
    v = row.get(key)
    ci = row.get(key + "_ci")
    if v is None:
        return "-"
    return f"{v:.3f}" + (f" [{ci[0]:.3f},{ci[1]:.3f}]" if ci else "")


def format_advice(res: dict) -> str:
    """The advice as text: one line per radius, then the recommendation."""
    quality = "precision_macro" in res["radii"][0]
    lines = [f"index {res['index']}: {res['n_queries']} queries x {res['n_db']} items, "
             f"{res['bits']} bits, mode {res['mode']}"
             + (", queries held out" if res.get("holdout") else ""), "",
             f"{'r':>3s} {'answers':>9s} {'p50':>7s} {'p99':>7s} {'empty':>6s} "
             f"{'probes':>10s} {'model_us':>9s} {'meas_us':>9s}"
             + ("  precision [95% CI]     recall [95% CI]        F1 [95% CI]            "
                "RAMAP" if quality else "") + "  frontier"]
    for row in res["radii"]:
        line = (f"{row['radius']:3d} {row['answers_mean']:9.3g} {row['answers_p50']:7.3g} "
                f"{row['answers_p99']:7.3g} {100 * row['empty_share']:5.1f}% "
                f"{row['modeled_probes']:10,d} {_us(row['modeled_ns']):>9s} "
                f"{_us(row['measured_ns']):>9s}")
        if quality:
            line += "  " + "  ".join(_q(row, k).ljust(21) for k in
                                     ("precision_macro", "recall_macro", "f1_macro")) \
                + f" {row['ramap']:.4g}"
        line += "  " + ("*" if row["pareto"] else " ")
        lines.append(line)
    if "map" in res:
        ci = res["map"]["ci"]
        lines.append(f"\nmAP (tie-aware, whole ranking) {res['map']['tie_aware']:.4f}"
                     + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""))
    rec = res["recommendation"]
    lines += ["", f"recommendation: {rec['reason']}", f"rule: {rec['rule']}"]
    return "\n".join(lines)


def _run(args) -> int:
    opts, queries = request_options(args)
    with _client(args) as client:
        res = client.advise(args.index, queries=queries, **opts)
    print(format_advice(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        from bucketsearch.index.evaluation.advisor import frontier_view
        from bucketsearch.index.evaluation.frontier import plot_frontier
        plot_frontier(frontier_view(res), args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


add_arguments, run = _add_arguments, _run
ADVISE = SimpleNamespace(HELP=HELP, EPILOG=EPILOG, add_arguments=_add_arguments, run=_run)
