"""``bucketsearch eval``: every hashing metric for a set of database and query codes."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bucketsearch.index.evaluation.presets import NAMES as PRESET_NAMES
from bucketsearch.index.metrics.conventions import AP_DENOMINATORS, AUPRC_ANCHORS, NO_RELEVANT

HELP = ("evaluate hash codes: P/R at radius, RAMAP, mLGAP, tie-aware MAP/NDCG, empty balls; "
        "hashtable buckets, quality-vs-cost frontier, method comparison, presets")

EPILOG = """examples:
  bucketsearch eval --db-codes db.npy --query-codes q.npy --db-labels yb.npy --query-labels yq.npy
  bucketsearch eval --db-codes db.npy --query-codes q.npy --db-labels yb.npy \\
      --query-labels yq.npy --radius-max 4 --k 10,100,1000 --json out.json --plot out.png
  bucketsearch eval ... --ap-denominator relevant-in-topk --no-relevant exclude --per-query
  bucketsearch eval ... --graded            # multi-hot labels: gain = number of shared labels
  bucketsearch eval --db-codes db.npy --query-codes q.npy --db-features xb.npy \\
      --query-features xq.npy               # epsilon-ball ground truth from features
research modes (docs/evaluation.md):
  bucketsearch eval ... --tables 8,4 --tables 16,2 --table-radii 0,1   # L tables of K-bit segments
  bucketsearch eval ... --tables-grid --json grid.json                # every (K, L), K x L <= Q
  bucketsearch eval ... --frontier front.png --json front.json        # quality vs measured cost
  bucketsearch eval --compare lsh=lsh.json itq=itq.json --compare-metric ranking.map_tie_aware@100
  bucketsearch eval --compare lsh.npz itq.npz --db-labels yb.npy --query-labels yq.npy --latex t.tex
  bucketsearch eval ... --preset deephash-pytorch     # or talr, thesis, ramap-paper
  bucketsearch eval ... --trec-run run.txt --trec-qrels qrels.txt     # for trec_eval / ranx

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
    g.add_argument("--db-codes", metavar="DB.npy",
                   help="database codes (n, Q); required except with --compare of runs")
    g.add_argument("--query-codes", metavar="Q.npy", help="query codes (m, Q); likewise")
    g.add_argument("--db-labels", metavar="L.npy", help="database labels (1-D ids or multi-hot)")
    g.add_argument("--query-labels", metavar="M.npy", help="query labels (same form)")
    g.add_argument("--dataset", metavar="NAME[:SEED]",
                   help="ground truth: the class labels of a named data set's class-balanced "
                        "split (synthetic, digits, mnist5k; seed 0 unless NAME:SEED), for codes "
                        "computed on it, e.g. by `bucketsearch reproduce --save-codes`")
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
                        "JSON (bucketsearch-loadtest --json). From both JSONs T(R) is "
                        "radii[R].measured_cumulative.p50_ns (the p50 over queries of each "
                        "query's lookup time of the ball up to R); their older shapes (before "
                        "issue 12, without it) are refused with a message. Only radii "
                        "0..--radius-max are needed")
    m = parser.add_argument_group("metrics")
    m.add_argument("--radius-max", type=int, default=None,
                   help="largest radius reported (default min(Q, 10))")
    m.add_argument("--k", default="10,100,1000", help="ranking cut-offs, comma separated")
    m.add_argument("--graded", action="store_true",
                   help="graded relevance (number of shared labels / matrix value) for the "
                        "NDCG family")
    c = parser.add_argument_group("conventions (explicit flags override --preset)")
    c.add_argument("--preset", choices=PRESET_NAMES,
                   help="set every convention as a published source does, print its choices "
                        "and its headline metrics (docs/evaluation.md)")
    c.add_argument("--ap-denominator", choices=AP_DENOMINATORS, default=None,
                   help="default all-relevant")
    c.add_argument("--no-relevant", choices=NO_RELEVANT, default=None,
                   help="what a query with no relevant item contributes to a mean (default "
                        "zero)")
    c.add_argument("--empty-precision", type=float, default=None,
                   help="precision of an empty Hamming ball (default 0)")
    c.add_argument("--radius-exclusive", action="store_true",
                   help="ball of radius r holds d < r instead of d <= r")
    c.add_argument("--beta", type=float, default=None, help="F-beta weight (default 1)")
    c.add_argument("--auprc-anchor", choices=AUPRC_ANCHORS, default=None,
                   help="point added at recall 0: precision of radius 0 (first, the default), "
                        "or 1")
    g.add_argument("--qrels", metavar="QRELS",
                   help="ground truth from a TREC qrels file (query ids q0.., doc ids d0.. or "
                        "plain row numbers; relevance > 0 is relevant, its value the gain)")
    _add_research_arguments(parser)
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
    return _check_code_array(_load(path, what), f"{what} {path}")


def _check_code_array(arr: np.ndarray, what: str) -> np.ndarray:
    """An ``(n, Q)`` code array of {0,1} or {-1,+1}, ``what`` naming it in errors."""
    if arr.ndim != 2:
        raise ValueError(f"{what}: expected shape (n, Q), got {arr.shape}")
    if not (arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer)
            or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{what}: dtype {arr.dtype} is not numeric")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isin(arr, (-1.0, 0.0, 1.0)).all():
            raise ValueError(f"{what}: values must be in {{0,1}} or {{-1,+1}}")
        arr = arr.astype(np.int8)
    vals = np.unique(arr) if arr.size else np.array([], dtype=np.int8)
    if not (set(vals.tolist()) <= {0, 1} or set(vals.tolist()) <= {-1, 1}):
        raise ValueError(f"{what}: values must be in {{0,1}} or {{-1,+1}}, "
                         f"found {vals[:6].tolist()}")
    if not 1 <= arr.shape[1] <= 256:
        raise ValueError(f"{what}: Q = {arr.shape[1]} bits, allowed 1..256")
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
    * the server's ``GET /v1/indexes/{name}/cost-model`` JSON and
    * the load-test JSON (``bucketsearch-loadtest --json``, its ``model``): both hold the
      cost model's per-radius rows (``bucketsearch.index.costmodel``), and ``T(R)`` is
      ``radii[R].measured_cumulative.p50_ns``, the p50 over queries of each query's in-kernel
      lookup time of the ball up to R (not a sum of per-ring medians). A JSON of the shape
      before issue 12 (no ``measured_cumulative``; a load-test ``model`` without ``radii``) is
      refused, saying so; so is a load test run without the server's counters.
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
        name = doc.get("index")
        what = f"server's cost-model{f' of index {name!r}' if name else ''}"
        return _cumulative_p50(doc["radii"], what, path, radius_max), (
            f"measured p50 of T(R) (per-query lookup ns of the ball up to R) from the {what}")
    if isinstance(doc, dict) and isinstance(doc.get("per_radius"), list):
        model = doc.get("model") or {}
        if model.get("available") is False:
            raise ValueError(f"--measured-cost {path}: the load-test report has no server "
                             f"timings: {model.get('unavailable')}")
        if not isinstance(model.get("radii"), list):
            raise ValueError(f"--measured-cost {path}: a load-test report of the shape before "
                             "issue 12 (its model has no 'radii' rows with measured_cumulative); "
                             "rerun the load test with this version")
        sample = model.get("sample") or {}
        what = "load-test report's cost model"
        return _cumulative_p50(model["radii"], what, path, radius_max), (
            f"measured p50 of T(R) (per-query lookup ns of the ball up to R) from the {what} "
            f"({sample.get('queries_kept', '?')} sampled queries)")
    raise ValueError(f"--measured-cost {path}: not a list of times per radius, a server "
                     "cost-model (a 'radii' list) or a load-test report (a 'per_radius' list)")


def _cumulative_p50(rows: list, what: str, path: str, radius_max: int) -> list[float]:
    """``radii[R].measured_cumulative.p50_ns`` for R = 0..radius_max (the cost model's rows);
    rows without ``measured_cumulative`` are the shape before issue 12: refused."""
    if rows and not any(isinstance(row, dict) and "measured_cumulative" in row for row in rows):
        raise ValueError(f"--measured-cost {path}: the {what} has no measured_cumulative per "
                         "radius (the shape before issue 12, whose per-ring p50s do not add up "
                         "to a p50 of T(R)); fetch it again from a current server")
    return _by_radius(rows, what, radius_max,
                      lambda row: (row.get("measured_cumulative") or {}).get("p50_ns"))


def _relevance(args, nq: int, nb: int):
    from bucketsearch.index.metrics import relevance as rel
    given = [name for name, v in (("labels", args.db_labels or args.query_labels),
                                  ("relevance-matrix", args.relevance_matrix),
                                  ("relevant-pairs", args.relevant_pairs),
                                  ("features", args.db_features or args.query_features),
                                  ("qrels", args.qrels), ("dataset", args.dataset)) if v]
    if given == ["dataset"]:
        from bucketsearch.index.evaluation.datasets import split_labels
        return rel.from_labels(*split_labels(args.dataset, nq, nb))
    if len(given) != 1:
        raise ValueError("give exactly one ground truth: --db-labels/--query-labels, "
                         "--relevance-matrix, --relevant-pairs, --db-features/"
                         f"--query-features, --qrels or --dataset (got {given or 'none'})")
    kind = given[0]
    if kind == "qrels":
        from bucketsearch.index.evaluation.trec import read_qrels
        return read_qrels(args.qrels, nq, nb)
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


def _conventions(args):
    """Conventions from explicit flags over ``--preset`` over the defaults, and the notes."""
    from bucketsearch.index.evaluation.presets import resolve
    return resolve(args.preset, {
        "empty_precision": args.empty_precision, "no_relevant": args.no_relevant,
        "ap_denominator": args.ap_denominator,
        "radius_inclusive": False if args.radius_exclusive else None, "beta": args.beta,
        "auprc_anchor": args.auprc_anchor})


def _inputs(args):
    """Codes, bits and relevance of a mode that evaluates one code set."""
    for flag, value in (("--db-codes", args.db_codes), ("--query-codes", args.query_codes)):
        if not value:
            raise ValueError(f"{flag} is required (except with --compare of eval runs)")
    xb = _load_codes(args.db_codes, "--db-codes")
    xq = _load_codes(args.query_codes, "--query-codes")
    if xb.shape[1] != xq.shape[1]:
        raise ValueError(f"db codes have Q = {xb.shape[1]} bits but query codes have "
                         f"Q = {xq.shape[1]}")
    bits = xb.shape[1]
    if args.radius_max is not None and not 0 <= args.radius_max <= bits:
        raise ValueError(f"--radius-max must be in [0, {bits}] for {bits}-bit codes, "
                         f"got {args.radius_max}")
    return xb, xq, bits, _relevance(args, len(xq), len(xb))


def _write_json(path, res) -> None:
    if path:
        Path(path).write_text(json.dumps(res, allow_nan=False))
        print(f"wrote {path}", file=sys.stderr)


def _check_research_flags(args) -> None:
    """Numeric flags of the research modes, each checked against its allowed range."""
    for flag, value, lo in (("--resamples", args.resamples, 1), ("--repeats", args.repeats, 1),
                            ("--trec-depth", args.trec_depth, 1),
                            ("--max-probes", args.max_probes, 1)):
        if value < lo:
            raise ValueError(f"{flag} must be an integer >= {lo}, got {value}")
    for flag, value in (("--alpha", args.alpha), ("--precision-floor", args.precision_floor)):
        if not 0.0 <= value <= 1.0 or (flag == "--alpha" and value in (0.0, 1.0)):
            raise ValueError(f"{flag} must be in {'(0, 1)' if flag == '--alpha' else '[0, 1]'}, "
                             f"got {value}")


#: the flags that name a file to write (their folders are checked before any work)
OUTPUT_FLAGS = ("json", "plot", "frontier", "latex", "trec_run", "trec_qrels")


def _check_outputs(args) -> None:
    """Every output file's folder exists, and the file is not a folder: checked before the
    evaluation, not after minutes of it."""
    for flag in OUTPUT_FLAGS:
        path = getattr(args, flag, None)
        if not path:
            continue
        name = "--" + flag.replace("_", "-")
        folder = Path(path).expanduser().absolute().parent
        if not folder.is_dir():
            raise FileNotFoundError(f"{name}: the folder of {path!r} ({folder}) does not exist")
        if Path(path).is_dir():
            raise IsADirectoryError(f"{name}: {path!r} is a folder; give a file name")


def run(args) -> int:
    from bucketsearch.index.evaluation import presets

    _check_research_flags(args)
    _check_outputs(args)
    conv, notes = _conventions(args)
    if args.preset:
        print(presets.describe(args.preset))
        for note in notes:
            print(f"  note: {note}")
        print()
    if args.compare:
        return _run_compare(args)
    xb, xq, bits, relevance = _inputs(args)
    if args.frontier:   # its (K, L) points come from --tables / --tables-grid
        return _run_frontier(args, xb, xq, bits, relevance, conv)
    if args.tables or args.tables_grid:
        return _run_tables(args, xb, xq, bits, relevance, conv)
    return _run_metrics(args, xb, xq, bits, relevance, conv)


def _run_metrics(args, xb, xq, bits, relevance, conv) -> int:
    from bucketsearch.index.metrics import DEFAULT_RADIUS_MAX, evaluate

    ks = _parse_ks(args.k)
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
    res["ground_truth_sha256"] = _fingerprint(relevance)
    if args.preset:
        res["preset"] = args.preset
    print(format_report(res))
    if args.preset:
        print(_headline(res, args.preset))
    if args.trec_run:
        from bucketsearch.index.evaluation.trec import write_run
        n = write_run(args.trec_run, xb, xq, depth=args.trec_depth)
        print(f"wrote {args.trec_run} ({n} lines)", file=sys.stderr)
    if args.trec_qrels:
        from bucketsearch.index.evaluation.trec import write_qrels
        n = write_qrels(args.trec_qrels, relevance, graded=args.graded)
        print(f"wrote {args.trec_qrels} ({n} lines)", file=sys.stderr)
    _write_json(args.json, res)
    if args.plot:
        plot(res, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------- research modes
def _add_research_arguments(parser) -> None:
    r = parser.add_argument_group(
        "research modes (docs/evaluation.md): hashtable buckets, frontier, comparing methods")
    r.add_argument("--tables", action="append", metavar="K,L",
                   help="hashtable-bucket evaluation: L tables keyed by K-bit segments of the "
                        "first K*L bits (repeatable)")
    r.add_argument("--tables-grid", action="store_true",
                   help="every (K, L) with K*L <= Q (K <= 64)")
    r.add_argument("--table-radii", default="0,1", metavar="R,...",
                   help="per-table radii whose lookup is timed in the engine (default 0,1; "
                        "'none': quality only); quality is computed for every radius 0..K")
    r.add_argument("--frontier", metavar="OUT.png",
                   help="quality-vs-cost frontier of every operating point: single table, MIH, "
                        "auto and scan at --frontier-radii, (K, L) tables from --tables / "
                        "--tables-grid (default: every K dividing Q with L = Q/K)")
    r.add_argument("--frontier-radii", default="0,1,2,3", metavar="R,...",
                   help="Hamming radii of the single/MIH/auto/scan points (default 0,1,2,3)")
    r.add_argument("--frontier-quality", choices=("f_micro", "f_macro", "recall_micro"),
                   default="f_micro", help="quality axis (F-beta uses --beta)")
    r.add_argument("--precision-floor", type=float, default=0.0,
                   help="recall_micro counts only where the micro precision is >= this")
    r.add_argument("--repeats", type=int, default=1,
                   help="timed runs per point, the fastest kept (default 1)")
    r.add_argument("--max-probes", type=int, default=10_000_000,
                   help="points probing more buckets per query are left out (default 1e7)")
    r.add_argument("--compare", nargs="+", metavar="[NAME=]RUN",
                   help="compare methods on the same queries: eval JSON runs written with "
                        "--per-query --json, or .npz files with arrays db_codes and "
                        "query_codes (evaluated here with the ground-truth flags)")
    r.add_argument("--compare-metric", default="map_all.tie_aware", metavar="PATH",
                   help="per-query metric compared: a JSON path, with @k or @R for lists "
                        "(e.g. ranking.map_tie_aware@100, radius.f1_macro@2; default "
                        "map_all.tie_aware)")
    r.add_argument("--test", choices=("randomization", "t-test", "wilcoxon"),
                   default="randomization", help="test deciding significance (all three are "
                                                  "reported)")
    r.add_argument("--correction", choices=("holm", "bonferroni", "none"), default="holm",
                   help="multiple-comparison correction over the pairs (default holm)")
    r.add_argument("--alpha", type=float, default=0.05)
    r.add_argument("--baseline", metavar="NAME", help="compare every method with this one only")
    r.add_argument("--resamples", type=int, default=10_000,
                   help="randomization and bootstrap resamples (default 10000)")
    r.add_argument("--seed", type=int, default=0, help="resampling seed (default 0)")
    r.add_argument("--latex", metavar="OUT.tex", help="write the comparison as a LaTeX table")
    t = parser.add_argument_group("TREC interop (pytrec_eval, ranx, trec_eval)")
    t.add_argument("--trec-run", metavar="OUT", help="write the ranking as a TREC run")
    t.add_argument("--trec-qrels", metavar="OUT", help="write the ground truth as TREC qrels")
    t.add_argument("--trec-depth", type=int, default=1000,
                   help="items per query in the run (default 1000)")


def _int_list(text: str, flag: str, lo: int, hi: int, allow_none: bool = False) -> list[int]:
    if allow_none and text.strip().lower() == "none":
        return []
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = None
    if not values or min(values) < lo or max(values) > hi:
        raise ValueError(f"{flag} must be comma-separated integers in [{lo}, {hi}]"
                         f"{' or none' if allow_none else ''}, got {text!r}")
    return sorted(set(values))


def _table_configs(args, bits: int):
    from bucketsearch.index.evaluation.buckets import check_tables, full_grid
    if args.tables_grid:
        return full_grid(bits)
    configs = []
    for text in args.tables or []:
        parts = text.split(",")
        try:
            k, n = (int(x) for x in parts)
        except ValueError:
            raise ValueError(f"--tables must be K,L (two integers), got {text!r}") from None
        configs.append(check_tables(bits, k, n))
    return configs


def _run_tables(args, xb, xq, bits, relevance, conv) -> int:
    from bucketsearch.index.evaluation.buckets import evaluate_tables, format_tables
    radii = _int_list(args.table_radii, "--table-radii", 0, min(bits, 64), allow_none=True)
    res = evaluate_tables(xb, xq, relevance, _table_configs(args, bits), conv, radii,
                          args.max_probes, per_query=args.per_query)
    res["ground_truth_sha256"] = _fingerprint(relevance)
    print(format_tables(res))
    _write_json(args.json, res)
    return 0


def _run_frontier(args, xb, xq, bits, relevance, conv) -> int:
    from bucketsearch.index.evaluation.frontier import format_frontier, frontier, plot_frontier
    radii = _int_list(args.frontier_radii, "--frontier-radii", 0, bits)
    table_radii = _int_list(args.table_radii, "--table-radii", 0, min(bits, 64),
                            allow_none=True)
    configs = _table_configs(args, bits) if (args.tables or args.tables_grid) else \
        [(k, bits // k) for k in range(1, min(bits, 64) + 1) if bits % k == 0]
    res = frontier(xb, xq, relevance, radii=radii, configs=configs, table_radii=table_radii,
                   quality=args.frontier_quality, precision_floor=args.precision_floor,
                   conventions=conv, max_probes=args.max_probes, repeats=args.repeats)
    print(format_frontier(res))
    plot_frontier(res, args.frontier)
    print(f"wrote {args.frontier}", file=sys.stderr)
    _write_json(args.json, res)
    return 0


def _fingerprint(relevance) -> str:
    """SHA-256 of the ground truth (runs compared must share it; their codes differ)."""
    import hashlib
    h = hashlib.sha256(relevance.mode.encode())
    for a in (relevance.query_labels, relevance.db_labels, relevance.indptr, relevance.indices,
              relevance.data):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def metric_vector(res: dict, path: str) -> np.ndarray:
    """The per-query values at ``path`` of an eval result with ``per_query`` (see
    ``--compare-metric``): ``a.b`` for a list over queries, ``a.b@x`` for a column of a list
    over cut-offs k (``ranking.*``) or radii R (``radius.*``)."""
    if "per_query" not in res:
        raise ValueError("the run has no per-query values: write it with eval --per-query --json")
    name, _, at = path.partition("@")
    node = res["per_query"]
    for key in name.split("."):
        if not isinstance(node, dict) or key not in node:
            have = sorted(node) if isinstance(node, dict) else []
            raise ValueError(f"--compare-metric {path!r}: no {key!r} in the per-query values "
                             f"(have {have})")
        node = node[key]
    arr = np.array([np.nan if v is None else v for v in node] if node and not isinstance(
        node[0], list) else [[np.nan if v is None else v for v in row] for row in node],
        dtype=np.float64)
    if arr.ndim == 1:
        if at:
            raise ValueError(f"--compare-metric {path!r}: {name} has one value per query, "
                             "drop the @")
        return arr
    axis = res["ranking"]["k"] if name.startswith("ranking.") else res["radius"]["R"]
    try:
        return arr[:, axis.index(int(at))]
    except ValueError:
        raise ValueError(f"--compare-metric {path!r}: {name} is a list over "
                         f"{'k' if name.startswith('ranking.') else 'R'} = {axis}; pick one "
                         "with @") from None


def _load_run(args, spec: str) -> tuple[str, dict]:
    """``[NAME=]PATH``: an eval JSON run, or an .npz of codes evaluated here."""
    name, sep, path = spec.partition("=")
    if not sep:
        name, path = Path(spec).stem, spec
    if path.endswith(".json"):
        try:
            return name, json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"--compare: no such file: {path}") from None
        except ValueError as exc:
            raise ValueError(f"--compare {path}: not JSON ({exc})") from None
    if not path.endswith(".npz"):
        raise ValueError(f"--compare {spec!r}: expected an eval JSON run (.json) or codes "
                         "(.npz with db_codes and query_codes)")
    from bucketsearch.index.metrics import evaluate
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("db_codes", "query_codes") if k not in z.files]
            if missing:
                raise ValueError(f"--compare {path}: missing arrays {missing} (has {z.files})")
            db, q = z["db_codes"], z["query_codes"]
    except FileNotFoundError:
        raise FileNotFoundError(f"--compare: no such file: {path}") from None
    xb = _check_code_array(db, f"--compare {path} db_codes")
    xq = _check_code_array(q, f"--compare {path} query_codes")
    relevance = _relevance(args, len(xq), len(xb))
    conv, _ = _conventions(args)
    res = evaluate(xb, xq, relevance, ks=_parse_ks(args.k), graded=args.graded,
                   conventions=conv, per_query=True,
                   radius_max=min(xb.shape[1], args.radius_max if args.radius_max is not None
                                  else 10))
    res["ground_truth_sha256"] = _fingerprint(relevance)
    return name, res


def _run_compare(args) -> int:
    from bucketsearch.index.evaluation.significance import compare, format_table, to_latex
    if len(args.compare) < 2:
        raise ValueError(f"--compare needs at least 2 runs, got {len(args.compare)}")
    runs = dict(_load_run(args, spec) for spec in args.compare)
    if len(runs) != len(args.compare):
        raise ValueError("--compare: two runs have the same name; name them NAME=PATH")
    prints = {n: r.get("ground_truth_sha256") for n, r in runs.items()}
    if len({p for p in prints.values() if p}) > 1:
        raise ValueError("--compare: the runs were evaluated against different ground truths "
                         f"(ground_truth_sha256 {prints}); compare methods on the same queries")
    vectors = {n: metric_vector(r, args.compare_metric) for n, r in runs.items()}
    res = compare(vectors, test=args.test, correction=args.correction, alpha=args.alpha,
                  baseline=args.baseline, n_resamples=args.resamples, seed=args.seed)
    res["metric"] = args.compare_metric
    print(format_table(res, args.compare_metric))
    if args.latex:
        Path(args.latex).write_text(to_latex(res, args.compare_metric) + "\n")
        print(f"wrote {args.latex}", file=sys.stderr)
    _write_json(args.json, res)
    return 0


def _headline(res: dict, preset: str) -> str:
    """The preset's headline metrics from an eval result."""
    from bucketsearch.index.evaluation.presets import get
    lines = [f"preset {preset} headline:"]
    for path in get(preset).headline:
        node = res
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, list):
            axis = (f"k={res['ranking']['k']}" if path.startswith("ranking.")
                    else f"R={res['radius']['R']}")
            node = f"{axis}: " + ", ".join(_fmt(v).strip() for v in node)
        elif isinstance(node, float):
            node = _fmt(node).strip()
        lines.append(f"  {path}: {'-' if node is None else node}")
    return "\n".join(lines)
