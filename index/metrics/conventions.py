"""The conventions every metric names explicitly, with their documented defaults.

* ``empty_precision`` (default 0.0): precision of an empty Hamming ball (no item within the
  radius). 0 is the convention of Jiang, Li & Li (RAMAP); some scripts use 1 or skip the query.
* ``no_relevant`` (default ``"zero"``): what a query with no relevant item contributes to a mean.
  ``"zero"`` keeps it, with its value computed as 0 (precision 0, recall 0, AP 0, NDCG 0);
  ``"exclude"`` leaves it out of every mean (its per-query values are NaN, reported as null) and
  counts it in ``n_excluded``.
* ``ap_denominator`` (default ``"all-relevant"``): the denominator of AP@k. ``"all-relevant"``
  divides by every relevant item of the query (TALR, trec_eval); ``"relevant-in-topk"`` divides
  by the relevant items within the top k (DeepHash-pytorch ``CalcTopMap``). AP over the whole
  ranking (MAP@all) is the same under both.
* ``radius_inclusive`` (default True): the ball of radius r holds items with ``d <= r``; with
  False it holds ``d < r`` (so radius 0 is always empty).
* ``beta`` (default 1.0): the F-beta weight.
* ``auprc_anchor`` (default ``"first"``): the point added at recall 0 before the trapezoid rule:
  ``"first"`` repeats the precision of radius 0 (a horizontal start), ``"one"`` adds precision 1.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

NO_RELEVANT = ("zero", "exclude")
AP_DENOMINATORS = ("all-relevant", "relevant-in-topk")
AUPRC_ANCHORS = ("first", "one")


@dataclass(frozen=True)
class Conventions:
    """See the module docstring for each field."""

    empty_precision: float = 0.0
    no_relevant: str = "zero"
    ap_denominator: str = "all-relevant"
    radius_inclusive: bool = True
    beta: float = 1.0
    auprc_anchor: str = "first"

    def __post_init__(self):
        if self.no_relevant not in NO_RELEVANT:
            raise ValueError(f"no_relevant must be one of {NO_RELEVANT}, got {self.no_relevant!r}")
        if self.ap_denominator not in AP_DENOMINATORS:
            raise ValueError(f"ap_denominator must be one of {AP_DENOMINATORS}, "
                             f"got {self.ap_denominator!r}")
        if self.auprc_anchor not in AUPRC_ANCHORS:
            raise ValueError(f"auprc_anchor must be one of {AUPRC_ANCHORS}, "
                             f"got {self.auprc_anchor!r}")
        if not 0.0 <= float(self.empty_precision) <= 1.0:
            raise ValueError(f"empty_precision must be in [0, 1], got {self.empty_precision}")
        if not float(self.beta) > 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")

    def as_dict(self) -> dict:
        return asdict(self)


DEFAULT = Conventions()


def apply_no_relevant(values: np.ndarray, has_relevant: np.ndarray,
                      conv: Conventions) -> np.ndarray:
    """Per-query values (first axis = queries) with excluded queries set to NaN under
    ``no_relevant="exclude"``; under ``"zero"`` values of queries with no relevant item are 0."""
    out = np.array(values, dtype=np.float64, copy=True)
    if conv.no_relevant == "exclude":
        out[~has_relevant] = np.nan
    else:
        out[~has_relevant] = 0.0
    return out


def mean_over_queries(values: np.ndarray) -> np.ndarray | float:
    """Mean over the query axis ignoring NaN (excluded queries); NaN when nothing is left."""
    values = np.asarray(values, dtype=np.float64)
    valid = ~np.isnan(values)
    n = valid.sum(axis=0)
    total = np.where(valid, values, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, total / np.maximum(n, 1), np.nan)
    return float(mean) if np.ndim(mean) == 0 else mean
