"""``bucketsearch eval``: every hashing metric for a set of database and query codes."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bucketsearch.index.metrics.conventions import (AP_DENOMINATORS, AUPRC_ANCHORS, NO_RELEVANT,
                                                    Conventions)

HELP = "evaluate hash codes: P/R at radius, RAMAP, mLGAP, tie-aware MAP/NDCG, empty balls"

EPILOG = """examples:
  bucketsearch eval --db-codes db.npy --query-codes q.npy --db-labels yb.npy --query-labels yq.npy
  bucketsearch eval --db-codes db.npy --query-codes q.npy --db-labels yb.npy \\
      --query-labels yq.npy --radius-max 4 --k 10,100,1000 --json out.json --plot out.png
  bucketsearch eval ... --ap-denominator relevant-in-topk --no-relevant exclude --per-query
  bucketsearch eval ... --graded            # multi-hot labels: gain = number of shared labels
  bucketsearch eval --db-codes db.npy --query-codes q.npy --db-features xb.npy \\
      --query-features xq.npy               # epsilon-ball ground truth from features

codes: .npy arrays of shape (n, Q) with values in {0,1} or {-1,+1}; labels: 1-D class ids or
2-D multi-hot {0,1} rows. Conventions (defaults): empty Hamming ball precision 0, radius
inclusive (d <= r), AP denominator all-relevant, queries with no relevant item kept as 0.

RAMAP (radius-aware mean average precision; Jiang, Li & Li, "On the Evaluation Metric for
Hashing", arXiv:1905.10951), as index/metrics/ramap.py computes it:
  RAAP(q, R) = 1/(R+1) * sum_{r=0..R} P(q, r) / c(r),   RAMAP@R = mean over queries of RAAP(q, R)
  P(q, r) = precision of the Hamming ball d <= r (empty ball: 0); c(r) = sum_{i=0..r} C(Q, i),
  the modeled cost t0 * sum C(Q, i) of probing the ball in units of t0 (so c(0) = 1).
  --measured-cost replaces c(r) with T(r) / T(0), T(r) the measured time to search the ball.
mLGAP, as index/metrics/lgap.py computes it:
  LGAP(q, r) = 1/(r+1) * sum_{k=0..r} P(q, k) * phi(S_k),   mLGAP@r = mean over queries
  phi(S_k) = A / B: A = items in the ball S_k, B = (largest number of items on one code in S_k)
  x (number of distinct OCCUPIED codes in S_k); phi = 1 for an empty ball.
  Note: the seed paper (issue 12: "mean Local Group Average Precision") divides by all the
  codes of the ball, sum_{i<=k} C(Q, i), not the occupied ones; this code does not (yet), so
  it gives no penalty when every item in the ball shares one code.
Which radius to report: RAMAP@R and mLGAP@R average over radii 0..R, so a value means nothing
without its R (and Q). The RAMAP paper lists RAMAP@R at several radii side by side (R = 0, 1,
2, ... at Q = 8; `bucketsearch reproduce` prints its tables the same way), not one number. We
recommend the same: the row for every R up to the radius your search really uses (this
command's table, or radius.* in the JSON), with R = 2, the usual hash-lookup radius, as the
headline when one number is needed; say whether the cost was modeled or measured.
"""


def add_arguments(parser) -> None:
    g = parser.add_argument_group("inputs")
    g.add_argument("--db-codes", required=True, metavar="DB.npy", help="database codes (n, Q)")
    g.add_argument("--query-codes", required=True, metavar="Q.npy", help="query codes (m, Q)")
    g.add_argument("--db-labels", metavar="L.npy", help="database labels (1-D ids or multi-hot)")
    g.add_argument("--query-labels", metavar="M.npy", help="query labels (same form)")
    g.add_argument("--relevance-matrix", metavar="G.npy",
                   help="explicit graded relevance (m, n), values >= 0 (instead of labels)")
    g.add_argument("--relevant-pairs", metavar="P.npy",
                   help="explicit relevant (query, db) index pairs, shape (p, 2)")
    g.add_argument("--db-features", metavar="XB.npy", help="epsilon-ball ground truth: db features")
    g.add_argument("--query-features", metavar="XQ.npy", help="epsilon-ball ground truth: queries")
    g.add_argument("--epsilon", type=float, default=None,
                   help="epsilon-ball radius (default: mean distance to the 50th NN of 100 "
                        "sampled db points)")
    g.add_argument("--measured-cost", metavar="T.npy|T.json",
                   help="measured cost per radius for RAMAP (adds radius.ramap_measured): a "
                        ".npy/JSON list of the times to search the ball of radius r, r = 0..R; "
                        "the server's GET /v1/indexes/{name}/cost-model JSON; or the load-test "
                        "JSON (bucketsearch-loadtest --json). Only radii 0..--radius-max are "
                        "needed")
    m = parser.add_argument_group("metrics")
    m.add_argument("--radius-max", type=int, default=None,
                   help="largest radius reported (default min(Q, 10))")
    m.add_argument("--k", default="10,100,1000", help="ranking cut-offs, comma separated")
    m.add_argument("--graded", action="store_true",
                   help="graded relevance (number of shared labels / matrix value) for the "
                        "NDCG family")
    c = parser.add_argument_group("conventions")
    c.add_argument("--ap-denominator", choices=AP_DENOMINATORS, default="all-relevant")
    c.add_argument("--no-relevant", choices=NO_RELEVANT, default="zero",
                   help="what a query with no relevant item contributes to a mean")
    c.add_argument("--empty-precision", type=float, default=0.0,
                   help="precision of an empty Hamming ball (default 0)")
    c.add_argument("--radius-exclusive", action="store_true",
                   help="ball of radius r holds d < r instead of d <= r")
    c.add_argument("--beta", type=float, default=1.0, help="F-beta weight (default 1)")
    c.add_argument("--auprc-anchor", choices=AUPRC_ANCHORS, default="first",
                   help="point added at recall 0: precision of radius 0, or 1")
    o = parser.add_argument_group("outputs")
    o.add_argument("--per-query", action="store_true", help="add per-query values to the JSON")
    o.add_argument("--json", metavar="OUT.json", help="write the results as JSON")
    o.add_argument("--plot", metavar="OUT.png",
                   help="plot RAMAP vs MAP, P/R vs radius, empty-ball queries vs radius")


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--k must be comma-separated integers >= 1, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise ValueError(f"--k must be comma-separated integers >= 1, got {text!r}")
    return ks


def _load(path: str, what: str) -> np.ndarray:
    from bucketsearch.index.evaluation.datasets import load_array
    try:
        return load_array(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: no such file: {path}") from None
    except (ValueError, OSError) as exc:
        raise ValueError(f"{what}: cannot read {path}: {exc}") from None


def _load_codes(path: str, what: str) -> np.ndarray:
    arr = _load(path, what)
    if arr.ndim != 2:
        raise ValueError(f"{what} {path}: expected shape (n, Q), got {arr.shape}")
    if not (arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer)
            or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{what} {path}: dtype {arr.dtype} is not numeric")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isin(arr, (-1.0, 0.0, 1.0)).all():
            raise ValueError(f"{what} {path}: values must be in {{0,1}} or {{-1,+1}}")
        arr = arr.astype(np.int8)
    vals = np.unique(arr) if arr.size else np.array([], dtype=np.int8)
    if not (set(vals.tolist()) <= {0, 1} or set(vals.tolist()) <= {-1, 1}):
        raise ValueError(f"{what} {path}: values must be in {{0,1}} or {{-1,+1}}, "
                         f"found {vals[:6].tolist()}")
    if not 1 <= arr.shape[1] <= 256:
        raise ValueError(f"{what} {path}: Q = {arr.shape[1]} bits, allowed 1..256")
    return arr


def _positive(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf"):
        raise ValueError(f"--measured-cost: {what} must be a number > 0, got {value!r}")
    return float(value)


def _by_radius(rows, what: str, radius_max: int, value) -> list[float]:
    """``value(row)`` for radius 0..radius_max out of ``rows`` (each with a ``radius``)."""
    found = {}
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get("radius"), int):
            v = value(row)
            if v is not None:
                found.setdefault(row["radius"], v)
    missing = [r for r in range(radius_max + 1) if r not in found]
    if missing:
        have = sorted(found)
        usable = next((r - 1 for r in range(radius_max + 2) if r not in found), -1)
        hint = f"; pass --radius-max {usable}" if usable >= 0 else ""
        raise ValueError(f"--measured-cost: the {what} has no measured value for radius "
                         f"{', '.join(map(str, missing))} (it has radii {have or 'none'}); "
                         f"measure those radii{hint}")
    return [_positive(found[r], f"the {what}'s value for radius {r}")
            for r in range(radius_max + 1)]


def load_measured_cost(path: str, radius_max: int) -> tuple[list[float], str]:
    """``T(0..radius_max)``, the time to search the Hamming ball of radius r, and what it is.

    Three formats:

    * a ``.npy`` array or a JSON list: ``T(r)`` for r = 0, 1, ... as given (at least
      ``radius_max + 1`` values);
    * the server's ``GET /v1/indexes/{name}/cost-model`` JSON: per radius the p50 over queries
      of the in-kernel lookup time of that radius's ring, ``radii[r].measured.p50_ns``, summed
      over rings 0..r (a sum of medians, not the median of the sums);
    * the load-test JSON (``bucketsearch-loadtest --json``): ``per_radius[].server_lookup_ns
      .p50``, the p50 of the server's lookup time of radius-R searches, already summed over
      rings 0..R in each query.
    """
    if path.endswith(".json"):
        try:
            doc = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"--measured-cost: no such file: {path}") from None
        except (ValueError, OSError) as exc:
            raise ValueError(f"--measured-cost: cannot read {path}: {exc}") from None
    else:
        doc = _load(path, "--measured-cost")
        if doc.ndim != 1:
            raise ValueError(f"--measured-cost {path}: expected a 1-D array of times per "
                             f"radius, got shape {doc.shape}")
        doc = doc.tolist()
    if isinstance(doc, list):
        if len(doc) < radius_max + 1:
            raise ValueError(f"--measured-cost {path}: {len(doc)} values, but radii "
                             f"0..{radius_max} need {radius_max + 1} (or pass --radius-max "
                             f"{len(doc) - 1})" if doc else
                             f"--measured-cost {path}: no values")
        values = [_positive(doc[r], f"value {r} (radius {r})") for r in range(radius_max + 1)]
        return values, f"the times per radius given in {path}"
    if isinstance(doc, dict) and isinstance(doc.get("radii"), list):
        rings = _by_radius(doc["radii"], "server's cost-model", radius_max,
                           lambda row: (row.get("measured") or {}).get("p50_ns"))
        values = np.cumsum(rings).tolist()
        name = doc.get("index")
        return values, ("measured p50 lookup ns per radius from the server's cost-model"
                        f"{f' of index {name!r}' if name else ''}, summed over radii 0..r")
    if isinstance(doc, dict) and isinstance(doc.get("per_radius"), list):
        values = _by_radius(doc["per_radius"], "load-test report", radius_max,
                            lambda row: (row.get("server_lookup_ns") or {}).get("p50"))
        return values, ("measured p50 server lookup ns of radius-R searches from the load-test "
                        "report (summed over rings 0..R in each query)")
    raise ValueError(f"--measured-cost {path}: not a list of times per radius, a server "
                     "cost-model (a 'radii' list) or a load-test report (a 'per_radius' list)")


def _relevance(args, nq: int, nb: int):
    from bucketsearch.index.evaluation import relevance as rel
    given = [name for name, v in (("labels", args.db_labels or args.query_labels),
                                  ("relevance-matrix", args.relevance_matrix),
                                  ("relevant-pairs", args.relevant_pairs),
                                  ("features", args.db_features or args.query_features)) if v]
    if len(given) != 1:
        raise ValueError("give exactly one ground truth: --db-labels/--query-labels, "
                         "--relevance-matrix, --relevant-pairs or --db-features/"
                         f"--query-features (got {given or 'none'})")
    kind = given[0]
    if kind == "labels":
        if not (args.db_labels and args.query_labels):
            raise ValueError("--db-labels and --query-labels must be given together")
        yb = _load(args.db_labels, "--db-labels")
        yq = _load(args.query_labels, "--query-labels")
        if len(yb) != nb:
            raise ValueError(f"--db-labels has {len(yb)} rows but --db-codes has {nb}")
        if len(yq) != nq:
            raise ValueError(f"--query-labels has {len(yq)} rows but --query-codes has {nq}")
        return rel.from_labels(yq, yb)
    if kind == "relevance-matrix":
        g = _load(args.relevance_matrix, "--relevance-matrix")
        if g.shape != (nq, nb):
            raise ValueError(f"--relevance-matrix has shape {g.shape}, expected "
                             f"(n_queries, n_db) = ({nq}, {nb})")
        return rel.from_graded_matrix(g)
    if kind == "relevant-pairs":
        p = _load(args.relevant_pairs, "--relevant-pairs")
        if p.ndim != 2 or p.shape[1] != 2:
            raise ValueError(f"--relevant-pairs must have shape (p, 2), got {p.shape}")
        return rel.from_pairs(p, nq, nb)
    if not (args.db_features and args.query_features):
        raise ValueError("--db-features and --query-features must be given together")
    xb = _load(args.db_features, "--db-features")
    xq = _load(args.query_features, "--query-features")
    if len(xb) != nb or len(xq) != nq:
        raise ValueError(f"features have {len(xb)} db / {len(xq)} query rows but the codes "
                         f"have {nb} / {nq}")
    r, _ = rel.from_features(xq, xb, epsilon=args.epsilon)
    return r


def _fmt(v) -> str:
    return "    -" if v is None else f"{v:.4f}"


def format_report(res: dict) -> str:
    """The readable tables printed by ``bucketsearch eval``."""
    lines = [f"{res['n_queries']} queries x {res['n_db']} db items, Q = {res['bits']} bits; "
             f"conventions: " + ", ".join(f"{k}={v}" for k, v in res["conventions"].items())]
    if res["n_excluded"]:
        lines.append(f"excluded {res['n_excluded']} queries with no relevant item")
    elif res["n_no_relevant"]:
        lines.append(f"{res['n_no_relevant']} queries have no relevant item (counted as 0)")
    r = res["radius"]
    lines.append("")
    lines.append("  R  P_macro  R_macro  P_micro  R_micro  F1_macro   RAMAP   mLGAP  empty  "
                 "probes")
    for i, radius in enumerate(r["R"]):
        lines.append(f"{radius:3d}   {_fmt(r['precision_macro'][i])}   "
                     f"{_fmt(r['recall_macro'][i])}   {_fmt(r['precision_micro'][i])}   "
                     f"{_fmt(r['recall_micro'][i])}    {_fmt(r['f1_macro'][i])}  "
                     f"{_fmt(r['ramap'][i])}  {_fmt(r['mlgap'][i])}  "
                     f"{r['empty_ball_queries'][i]:5d}  {r['probes'][i]}")
    if "ramap_measured" in r:
        lines.append("")
        lines.append("RAMAP@R with measured cost c(r) = T(r)/T(0), T = "
                     f"{res.get('measured_cost', {}).get('source', 'given times')}:")
        lines.append("  " + "  ".join(f"R{radius} {_fmt(v).strip()}"
                                      for radius, v in zip(r["R"], r["ramap_measured"])))
    k = res["ranking"]
    lines.append("")
    lines.append("      k  MAP_tie  MAP_best MAP_worst MAP_ranked  P_tie   R_tie  NDCG_tie")
    for i, kk in enumerate(k["k"]):
        lines.append(f"{kk:7d}   {_fmt(k['map_tie_aware'][i])}   {_fmt(k['map_best'][i])}   "
                     f"{_fmt(k['map_worst'][i])}   {_fmt(k['map_ranked'][i])}   "
                     f"{_fmt(k['precision_tie_aware'][i])}  {_fmt(k['recall_tie_aware'][i])}  "
                     f"{_fmt(k['ndcg_tie_aware'][i])}")
    m = res["map_all"]
    lines.append("")
    lines.append(f"MAP@all: tie-aware {_fmt(m['tie_aware'])}  best {_fmt(m['best'])}  "
                 f"worst {_fmt(m['worst'])}  as-ranked (distance, id) {_fmt(m['ranked'])}")
    lines.append(f"AUPRC over radius (macro, anchor={res['conventions']['auprc_anchor']}): "
                 f"{_fmt(res['auprc'])}")
    if "utilization" in res:
        u = res["utilization"]
        lines.append(f"codes: {u['distinct_codes']} distinct, largest bucket "
                     f"{u['largest_bucket']}, entropy {u['entropy_bits']:.2f} of "
                     f"{u['max_entropy_bits']:.2f} bits")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    """RAMAP vs MAP, precision/recall vs radius, empty-ball queries vs radius (one PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = res["radius"]
    radii = r["R"]
    nan = float("nan")
    clean = lambda xs: [nan if x is None else x for x in xs]  # noqa: E731
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    ax.plot(radii, clean(r["ramap"]), "o-", label="RAMAP@R")
    if "ramap_measured" in r:
        ax.plot(radii, clean(r["ramap_measured"]), "s--", label="RAMAP@R (measured cost)")
    ax.plot(radii, clean(r["mlgap"]), "^-", label="mLGAP@R")
    for name, style in (("tie_aware", "-"), ("best", ":"), ("worst", "--")):
        value = res["map_all"][name]
        if value is not None:
            ax.axhline(value, linestyle=style, color="gray", label=f"MAP@all {name}")
    ax.set_xlabel("radius R")
    ax.set_title("RAMAP vs MAP")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(radii, clean(r["precision_macro"]), "o-", label="precision (macro)")
    ax.plot(radii, clean(r["recall_macro"]), "s-", label="recall (macro)")
    ax.plot(radii, clean(r["precision_micro"]), "o--", label="precision (micro)")
    ax.plot(radii, clean(r["recall_micro"]), "s--", label="recall (micro)")
    ax.set_xlabel("radius r")
    ax.set_title("precision / recall vs radius")
    ax.legend(fontsize=7)
    ax = axes[2]
    ax.bar(radii, r["empty_ball_queries"])
    ax.set_xlabel("radius r")
    ax.set_ylabel("queries")
    ax.set_title("queries with an empty Hamming ball")
    fig.suptitle(f"Q = {res['bits']} bits, {res['n_queries']} queries x {res['n_db']} items")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args) -> int:
    from bucketsearch.index.metrics import DEFAULT_RADIUS_MAX, evaluate

    ks = _parse_ks(args.k)
    xb = _load_codes(args.db_codes, "--db-codes")
    xq = _load_codes(args.query_codes, "--query-codes")
    if xb.shape[1] != xq.shape[1]:
        raise ValueError(f"db codes have Q = {xb.shape[1]} bits but query codes have "
                         f"Q = {xq.shape[1]}")
    bits = xb.shape[1]
    if args.radius_max is not None and not 0 <= args.radius_max <= bits:
        raise ValueError(f"--radius-max must be in [0, {bits}] for {bits}-bit codes, "
                         f"got {args.radius_max}")
    relevance = _relevance(args, len(xq), len(xb))
    conv = Conventions(empty_precision=args.empty_precision, no_relevant=args.no_relevant,
                       ap_denominator=args.ap_denominator,
                       radius_inclusive=not args.radius_exclusive, beta=args.beta,
                       auprc_anchor=args.auprc_anchor)
    radius_max = args.radius_max if args.radius_max is not None else min(bits,
                                                                         DEFAULT_RADIUS_MAX)
    measured = source = None
    if args.measured_cost:
        measured, source = load_measured_cost(args.measured_cost, radius_max)
        # evaluate() takes costs for radii 0..Q; RAAP(q, R) uses only c(0..R), so the radii
        # above --radius-max (never reported) get the last measured value as a placeholder.
        measured = measured + [measured[-1]] * (bits - radius_max)
    res = evaluate(xb, xq, relevance, bits=bits, radius_max=radius_max, ks=ks,
                   graded=args.graded, conventions=conv, measured_cost=measured,
                   per_query=args.per_query)
    if measured is not None:
        res["measured_cost"] = {"source": source, "T": measured[:radius_max + 1]}
    print(format_report(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, allow_nan=False))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot(res, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
