"""Empty-ball statistics and code-space utilization.

* ``empty_ball_queries[r]``: the number of queries whose Hamming ball of radius r holds no
  database item (their precision at r is the ``empty_precision`` convention). Every query
  counts, whatever ``no_relevant`` says.
* ``mean_empty_buckets[r]``: the mean over queries of the buckets probed up to radius r that
  hold no item, ``sum_{i<=r} C(Q, i) - #distinct occupied codes within distance r``: the wasted
  probes of a bucket search (as floats: beyond 2^53 they are rounded).
* utilization of the code space by the database: distinct codes, the bucket-size histogram
  (bucket size -> number of buckets), the entropy in bits of the code distribution
  ``-sum_c p_c log2 p_c`` (at most ``min(Q, log2 nb)``), and distinct codes / 2^Q.
"""
from __future__ import annotations

import math

import numpy as np

from bucketsearch.index.metrics.conventions import DEFAULT, Conventions
from bucketsearch.index.metrics.histogram import Histograms, distinct_codes
from bucketsearch.index.metrics.radius import ball_cumsum
from bucketsearch.index.metrics.ramap import modeled_costs


def empty_ball_queries(hist: Histograms, conv: Conventions = DEFAULT) -> np.ndarray:
    """Number of queries with an empty Hamming ball, per radius r = 0..Q."""
    return (ball_cumsum(hist.count, conv.radius_inclusive) == 0).sum(axis=0)


def mean_empty_buckets(hist: Histograms, conv: Conventions = DEFAULT) -> np.ndarray:
    """Mean number of empty buckets probed up to radius r, r = 0..Q."""
    if hist.code_count is None:
        raise ValueError("empty-bucket statistics need histograms computed with code_stats=True")
    occupied = ball_cumsum(hist.code_count, conv.radius_inclusive).mean(axis=0)
    probes = modeled_costs(hist.bits)
    if not conv.radius_inclusive:
        probes = [0] + probes[:-1]
    return np.array([float(p) for p in probes]) - occupied


def code_utilization(db_words: np.ndarray, bits: int) -> dict:
    """Distinct codes, bucket-size histogram, entropy (bits) and fraction of the 2^Q codes used."""
    _, counts = distinct_codes(np.ascontiguousarray(db_words, dtype=np.uint64))
    n = int(counts.sum())
    p = counts / max(n, 1)
    entropy = float(-(p * np.log2(p)).sum()) if n else 0.0
    sizes, n_buckets = np.unique(counts, return_counts=True)
    return {
        "distinct_codes": int(len(counts)),
        "bucket_sizes": {int(s): int(c) for s, c in zip(sizes, n_buckets)},
        "largest_bucket": int(counts.max()) if n else 0,
        "entropy_bits": entropy,
        "max_entropy_bits": float(min(bits, math.log2(n))) if n else 0.0,
        "utilization": len(counts) / float(2 ** bits),
    }
