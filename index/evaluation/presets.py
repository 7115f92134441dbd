"""Conventions of published code and papers as presets: every choice set at once, and said.

A number from another code base differs from ours when a convention differs: the AP@k
denominator, the order of tied items, the precision of an empty Hamming ball, macro or micro
averaging, the AUPRC form. A preset sets the
:class:`~bucketsearch.index.metrics.conventions.Conventions`
fields that source fixes, names the metrics it reports (``headline``, JSON paths of
``bucketsearch eval`` with ``@k`` / ``@R`` picking a cut-off or radius), and lists each choice
with the source's own code or formula, so a reader sees why a number moves.

Flags given explicitly on the command line override the preset's value (and the report says so).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from bucketsearch.index.metrics.conventions import DEFAULT, Conventions


@dataclass(frozen=True)
class Preset:
    name: str
    source: str
    conventions: dict
    headline: tuple[str, ...]
    choices: tuple[str, ...]


PRESETS = {p.name: p for p in (
    Preset(
        "deephash-pytorch",
        "DeepHash-pytorch (swuxyj/DeepHash-pytorch), utils/tools.py CalcTopMap(rB, qB, "
        "retrievalL, queryL, topk)",
        {"ap_denominator": "relevant-in-topk", "no_relevant": "zero"},
        ("ranking.map_ranked", "ranking.map_best", "ranking.map_worst"),
        ("relevance: gnd = (queryL . retrievalL^T > 0), i.e. sharing one label (binary)",
         "order: ind = np.argsort(hamm), numpy's default quicksort, NOT stable: tied items come "
         "in an order that depends on the data; ours is (distance, id), what a stable sort "
         "gives; map_best / map_worst bound every tie order",
         "AP@k denominator: tsum = relevant items in the top k (count / tindex averaged over "
         "them), not all relevant items",
         "a query with no relevant item in the top k: `continue`, yet the sum is divided by "
         "num_query, so it counts 0 (no_relevant = zero)",
         "averaging: macro (mean over queries)")),
    Preset(
        "talr",
        "He, Cakir, Bargal & Sclaroff, 'Hashing as Tie-Aware Learning to Rank', CVPR 2018 "
        "(tie-aware AP of McSherry & Najork, ECIR 2008)",
        {"ap_denominator": "all-relevant", "no_relevant": "zero"},
        ("map_all.tie_aware", "ranking.map_tie_aware", "ranking.ndcg_tie_aware"),
        ("order: none; every metric is the expectation over all orders of tied items "
         "(tie-aware), so no tie-break is needed",
         "AP denominator: all relevant items of the query",
         "averaging: macro (mean over queries)")),
    Preset(
        "thesis",
        "thesis chapter 3 (seed 003): precision, recall and F of Hamming-ball / hashtable "
        "lookup, pooled over queries, and its AUPRC",
        {"empty_precision": 0.0, "no_relevant": "zero", "radius_inclusive": True},
        ("radius.precision_micro", "radius.recall_micro", "radius.f1_micro", "auprc_thesis"),
        ("averaging: micro, P = sum_q TP / sum_q N and R = sum_q TP / sum_q REL (one pooled "
         "retrieved set), F from the pooled P and R",
         "empty retrieved set: precision 0 (pooled: 0 when every query's set is empty)",
         "radius inclusive: d <= r",
         "AUPRC: the micro PR curve over radius 1..Q, plain trapezoid, no point at recall 0 "
         "(auprc_thesis)",
         "hashtable buckets (eval --tables): L tables of K-bit segments, union of collisions, "
         "same pooled P, R, F")),
    Preset(
        "ramap-paper",
        "Jiang, Li & Li, 'On the Evaluation Metric for Hashing', arXiv:1905.10951 (RAMAP)",
        {"empty_precision": 0.0, "no_relevant": "zero", "radius_inclusive": True},
        ("radius.ramap", "radius.precision_macro", "radius.recall_macro"),
        ("RAAP(q, R) = 1/(R+1) sum_{r<=R} P(q, r) / c(r), c(r) = sum_{i<=r} C(Q, i) (modeled "
         "cost in probes; --measured-cost swaps in measured times)",
         "empty Hamming ball: precision 0",
         "radius inclusive: d <= r",
         "averaging: macro (RAMAP = mean over queries of RAAP)")),
)}

NAMES = tuple(PRESETS)
FIELDS = tuple(f.name for f in fields(Conventions))


def get(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"--preset must be one of {', '.join(NAMES)}, got {name!r}")
    return PRESETS[name]


def resolve(preset: str | None, explicit: dict) -> tuple[Conventions, list[str]]:
    """Conventions from ``explicit`` values (None: not given) over the preset over the
    defaults; returns them and the notes of explicit values that override the preset."""
    values = DEFAULT.as_dict()
    notes = []
    chosen = get(preset).conventions if preset else {}
    values.update(chosen)
    for name, value in explicit.items():
        if name not in FIELDS:
            raise ValueError(f"unknown convention {name!r}, allowed: {', '.join(FIELDS)}")
        if value is None:
            continue
        if name in chosen and chosen[name] != value:
            notes.append(f"{name}={value!r} given explicitly overrides the preset's "
                         f"{chosen[name]!r}")
        values[name] = value
    return Conventions(**values), notes


def describe(name: str) -> str:
    """The preset's choices as printed by ``bucketsearch eval --preset``."""
    p = get(name)
    lines = [f"preset {p.name}: {p.source}"]
    lines += [f"  - {c}" for c in p.choices]
    lines.append("  conventions: " + ", ".join(f"{k}={v}" for k, v in p.conventions.items()))
    lines.append("  reports: " + ", ".join(p.headline))
    return "\n".join(lines)
