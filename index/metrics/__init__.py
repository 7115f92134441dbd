"""Hashing evaluation metrics, all computed from per-query Hamming distance histograms.

One kernel pass (:func:`hamming_histograms`) gives, per query and distance, the number of items,
of relevant items and the sums of gains; every metric follows in O(Q + k) per query:

* :mod:`.radius`: precision / recall / F-beta at every radius (macro and micro), PR curve, AUPRC
  (anchored macro curve, and the thesis's micro curve over radius 1..Q);
* :mod:`.ramap`: RAMAP with the modeled (exact binomial) or a measured cost;
* :mod:`.lgap`: mLGAP, mean Local Group Average Precision (seed 004; needs the distinct-code
  histogram);
* :mod:`.ranking`: MAP tie-aware / best / worst / as-ranked, at k and over the whole ranking,
  P/R/F1/NDCG/ACG@k and reciprocal rank tie-aware, weighted mAP@k tie-aware and as-ranked,
  as-ranked NDCG@k;
* :mod:`.space`: empty-ball statistics and code-space utilization.

Conventions (:class:`Conventions`) are explicit parameters with documented defaults.
:func:`evaluate` runs everything and returns the nested dict the ``bucketsearch eval`` JSON holds.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from bucketsearch.index.metrics.conventions import DEFAULT, Conventions
from bucketsearch.index.metrics.histogram import Histograms, hamming_histograms, prepare_codes
from bucketsearch.index.metrics.lgap import LGAP_DENOMINATORS, lgap_from_balls, mlgap
from bucketsearch.index.metrics.radius import auprc, auprc_thesis, ball_cumsum, radius_metrics
from bucketsearch.index.metrics.ramap import modeled_costs, raap_from_precision, ramap
from bucketsearch.index.metrics.ranking import ranking_metrics
from bucketsearch.index.metrics.space import (code_utilization, empty_ball_queries,
                                              mean_empty_buckets)

__all__ = ["Conventions", "DEFAULT", "Histograms", "hamming_histograms", "evaluate",
           "radius_metrics", "ramap", "raap_from_precision", "modeled_costs", "mlgap",
           "lgap_from_balls", "LGAP_DENOMINATORS", "ranking_metrics", "auprc", "auprc_thesis",
           "empty_ball_queries", "mean_empty_buckets", "code_utilization", "to_jsonable"]

DEFAULT_KS = (10, 100, 1000)
#: ranking keys over the whole ranking (their own sections, not lists over k)
_WHOLE_RANKING = ("map_all", "mrr_all", "wmap_all")
DEFAULT_RADIUS_MAX = 10


def to_jsonable(obj):
    """Nested dicts/arrays -> plain lists, floats and ints; NaN -> None (JSON null)."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return None if math.isnan(obj) else float(obj)
    return obj


def _per_query_auprc(rm, anchor: str) -> np.ndarray:
    out = np.full(rm.recall.shape[0], np.nan)
    for q in range(rm.recall.shape[0]):
        if not np.isnan(rm.recall[q]).all():
            out[q] = auprc(rm.recall[q], rm.precision[q], anchor)
    return out


def evaluate(db_codes, query_codes, relevance, *, bits: int | None = None,
             radius_max: int | None = None, ks=DEFAULT_KS, graded: bool = False,
             conventions: Conventions = DEFAULT, measured_cost=None,
             per_query: bool = False, hist: Histograms | None = None,
             lgap_denominator: str = "all-codes") -> dict:
    """Every metric for one set of codes. Lists under ``radius`` are indexed by
    R = 0..radius_max, lists under ``ranking`` by the cut-offs ``ks``; ``map_all`` (with
    ``weighted_tie_aware``, the tie-aware weighted AP of graded gains) and ``mrr_all`` are over
    the whole ranking; ``auprc`` integrates the macro PR curve over radius
    0..Q (anchor ``conventions.auprc_anchor``), ``auprc_thesis`` the micro curve over radius
    1..Q (thesis chapter 3). ``f1_*`` is always F1; with ``beta != 1`` the F-beta values are
    added as ``fbeta_*`` (beta in ``conventions``). ``mlgap`` is the seed's mLGAP
    (``lgap_denominator="all-codes"``; ``"occupied-codes"`` for this project's earlier variant).
    With ``per_query`` the same nested keys are repeated under ``per_query`` with a leading
    axis over queries (NaN -> null in JSON; pooled micro values have no per-query version and
    are left out).
    """
    if hist is None:
        hist = hamming_histograms(db_codes, query_codes, relevance, bits=bits, ks=ks,
                                  graded=graded)
    bits = hist.bits
    if radius_max is None:
        radius_max = min(bits, DEFAULT_RADIUS_MAX)
    if not 0 <= int(radius_max) <= bits:
        raise ValueError(f"radius_max must be in [0, {bits}] for {bits}-bit codes, "
                         f"got {radius_max}")
    n_r = int(radius_max) + 1
    conv = conventions
    rm = radius_metrics(hist, conv)
    rm1 = rm if conv.beta == 1.0 else radius_metrics(hist, replace(conv, beta=1.0))
    raap, ramap_mean = ramap(hist, conv)
    lg, mlgap_mean = mlgap(hist, conv, lgap_denominator)
    rk = ranking_metrics(hist, conv)
    mean, pq = rk["mean"], rk["per_query"]
    result = {
        "bits": bits,
        "n_db": hist.n_db,
        "n_queries": hist.n_queries,
        "graded": bool(hist.graded),
        "conventions": conv.as_dict(),
        "n_excluded": int((hist.n_relevant == 0).sum()) if conv.no_relevant == "exclude" else 0,
        "n_no_relevant": int((hist.n_relevant == 0).sum()),
        "radius": {
            "R": list(range(n_r)),
            "precision_macro": rm.precision_macro[:n_r],
            "recall_macro": rm.recall_macro[:n_r],
            "precision_micro": rm.precision_micro[:n_r],
            "recall_micro": rm.recall_micro[:n_r],
            "f1_macro": rm1.f_beta_macro[:n_r],
            "f1_micro": rm1.f_beta_micro[:n_r],
            "ramap": ramap_mean[:n_r],
            "probes": [int(c) for c in modeled_costs(bits, n_r - 1)],
            "empty_ball_queries": empty_ball_queries(hist, conv)[:n_r],
            "mean_empty_buckets": mean_empty_buckets(hist, conv)[:n_r],
            "mlgap": mlgap_mean[:n_r],
        },
        "ranking": {"k": [int(k) for k in hist.ks]},
        "map_all": {
            "tie_aware": mean["map_all_tie_aware"],
            "best": mean["map_all_best"],
            "worst": mean["map_all_worst"],
            "ranked": mean.get("map_all_ranked", float("nan")),
            "weighted_tie_aware": mean["wmap_all_tie_aware"],
        },
        "mrr_all": {"tie_aware": mean["mrr_all_tie_aware"], "best": mean["mrr_all_best"],
                    "worst": mean["mrr_all_worst"]},
        "auprc": auprc(rm.recall_macro, rm.precision_macro, conv.auprc_anchor),
        "auprc_micro": auprc(rm.recall_micro, rm.precision_micro, conv.auprc_anchor),
        "auprc_thesis": auprc(rm.recall_micro[1:], rm.precision_micro[1:], anchor=None),
        "mlgap_denominator": lgap_denominator,
        "pr_curve": {"radius": list(range(bits + 1)), "recall": rm.recall_macro,
                     "precision": rm.precision_macro},
    }
    if measured_cost is not None:
        raap_m, ramap_m = ramap(hist, conv, measured_cost=measured_cost)
        result["radius"]["ramap_measured"] = ramap_m[:n_r]
    if conv.beta != 1.0:
        result["radius"]["fbeta_macro"] = rm.f_beta_macro[:n_r]
        result["radius"]["fbeta_micro"] = rm.f_beta_micro[:n_r]
    for name, value in mean.items():
        if not name.startswith(_WHOLE_RANKING):
            result["ranking"][name] = value
    if db_codes is not None:
        xb, _, _ = prepare_codes(db_codes, query_codes, bits)
        result["utilization"] = code_utilization(xb, bits)
    if per_query:
        result["per_query"] = {
            "radius": {
                "precision_macro": rm.precision[:, :n_r],
                "recall_macro": rm.recall[:, :n_r],
                "f1_macro": rm1.f_beta[:, :n_r],
                "ramap": raap[:, :n_r],
                "mlgap": lg[:, :n_r],
                "empty_ball": (ball_cumsum(hist.count, conv.radius_inclusive) == 0)[:, :n_r],
            },
            "ranking": {name: v for name, v in pq.items()
                        if not name.startswith(_WHOLE_RANKING)},
            "map_all": {"tie_aware": pq["map_all_tie_aware"], "best": pq["map_all_best"],
                        "worst": pq["map_all_worst"],
                        "ranked": pq.get("map_all_ranked",
                                         np.full(hist.n_queries, np.nan)),
                        "weighted_tie_aware": pq["wmap_all_tie_aware"]},
            "mrr_all": {"tie_aware": pq["mrr_all_tie_aware"], "best": pq["mrr_all_best"],
                        "worst": pq["mrr_all_worst"]},
            "auprc": _per_query_auprc(rm, conv.auprc_anchor),
        }
        if conv.beta != 1.0:
            result["per_query"]["radius"]["fbeta_macro"] = rm.f_beta[:, :n_r]
        if measured_cost is not None:
            result["per_query"]["radius"]["ramap_measured"] = raap_m[:, :n_r]
    return to_jsonable(result)
