"""The paper's ``t0`` by the estimator ``microbenchmark``: bucket probes timed apart from any
search, empty probes (random codes absent from the table) and non-empty probes (codes of the
table) separately, mixed by the fraction ``f`` of non-empty probes:
``t0 = (1 - f) t_empty + f t_nonempty``.

After one untimed warm-up pass, each of ``repeats`` passes times every key once; ``t_empty``
and ``t_nonempty`` are the means over the passes, and the interval is Student's t over the
per-pass mixes ``t0_k = (1 - f) t_empty,k + f t_nonempty,k`` (``repeats - 1`` degrees of
freedom).
"""
from __future__ import annotations

import math

import numpy as np

from bucketsearch.index._jit import monotonic_ns, njit
from bucketsearch.index.fits.paper import T0Estimate
from bucketsearch.index.fits.regression import CONFIDENCE, t_quantile
from bucketsearch.index.item_table import find_row, find_word
from bucketsearch.index.kernels import row_bounds

MICROBENCHMARK = "microbenchmark"
MICROBENCHMARK_FORMULA = ("t0 = (1 - f) t_empty + f t_nonempty, probes timed apart (f: "
                          "fraction of non-empty probes); interval over the timing passes")


@njit
def _time_probes(keys, words, slots, fp_bits, direct, bitmap, repeats):
    """Per pass, the mean ns of one lookup of ``keys`` (one- or several-word codes); and the
    lookups that found a bucket."""
    W = keys.shape[1]
    found = 0
    out = np.zeros(repeats, dtype=np.float64)
    for rep in range(-1, repeats):  # pass -1 warms the caches and is not kept
        t0 = monotonic_ns()
        for i in range(keys.shape[0]):
            if W == 1:
                b = find_word(keys[i, 0], words, slots, fp_bits, direct, bitmap)
            else:
                b = find_row(keys[i], W, words, slots, fp_bits, direct, bitmap)
            found += b >= 0
        if rep >= 0:
            out[rep] = (monotonic_ns() - t0) / max(keys.shape[0], 1)
    return out, found


def probe_microbenchmark(table, n_keys: int = 20000, repeats: int = 5, seed: int = 0) -> dict:
    """Time empty and non-empty probes of a single table
    (:class:`~bucketsearch.index.item_table.ItemTable`):
    ``{"empty_ns", "nonempty_ns", "fill", "empty_pass_ns", "nonempty_pass_ns"}`` (means, ``fill``
    the fraction of random codes that hit a bucket, the per-pass means; nan: no such key).
    Empty probes: random codes that hit no bucket; non-empty: the codes of random items."""
    from bucketsearch.index.synth import uniform_codes

    if repeats < 1 or n_keys < 1:
        raise ValueError(f"n_keys and repeats must be >= 1, got {n_keys} and {repeats}")
    rng = np.random.default_rng(seed)
    keys = uniform_codes(n_keys, table.bits, seed=seed)
    args = table.lookup_args()
    _time_probes(keys[:1], *args, 1)  # compile / warm
    words = np.asarray(table.words)
    first, end = row_bounds(words, keys)
    hits = end > first  # by a binary search of the code-sorted items, not the hash under test
    empty = np.ascontiguousarray(keys[~hits])
    out = {"fill": float(hits.mean()), "empty_ns": math.nan, "nonempty_ns": math.nan,
           "empty_pass_ns": [], "nonempty_pass_ns": []}
    if len(empty):
        passes = _time_probes(empty, *args, repeats)[0]
        out["empty_ns"], out["empty_pass_ns"] = float(passes.mean()), passes.tolist()
    if len(words):  # the codes of random items (a bucket drawn by its size): no pass over them
        full = np.ascontiguousarray(words[rng.integers(0, len(words), n_keys)])
        passes = _time_probes(full, *args, repeats)[0]
        out["nonempty_ns"], out["nonempty_pass_ns"] = float(passes.mean()), passes.tolist()
    return out


def mix_probe_times(bench: dict, fill: float | None = None,
                    confidence: float = CONFIDENCE) -> T0Estimate:
    """The ``microbenchmark`` estimate from a :func:`probe_microbenchmark` result; ``fill`` is
    the fraction of non-empty probes (default the benchmark's random fill; pass the fraction a
    search measured, ``sum nonempty_buckets / sum probes``, to weigh as that search did). A kind
    of probe the table cannot give (no code absent, or no code) stands in for the other."""
    f = bench["fill"] if fill is None else float(fill)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"fill must be in [0, 1], got {fill!r}")
    empty = np.asarray(bench["empty_pass_ns"] or bench["nonempty_pass_ns"], dtype=np.float64)
    nonempty = np.asarray(bench["nonempty_pass_ns"] or bench["empty_pass_ns"], dtype=np.float64)
    detail = {"empty_ns": bench["empty_ns"], "nonempty_ns": bench["nonempty_ns"], "f": f,
              "random_fill": bench["fill"], "passes": int(len(empty))}
    if not len(empty):
        return T0Estimate(MICROBENCHMARK, None, None, 0, MICROBENCHMARK_FORMULA, confidence,
                          detail)
    mixes = (1 - f) * empty + f * nonempty
    t0 = float(mixes.mean())
    ci = None
    if len(mixes) > 1:
        half = t_quantile((1 + confidence) / 2, len(mixes) - 1) * float(
            mixes.std(ddof=1)) / math.sqrt(len(mixes))
        ci = (t0 - half, t0 + half)
    return T0Estimate(MICROBENCHMARK, t0, ci, int(len(mixes)), MICROBENCHMARK_FORMULA,
                      confidence, detail)


def microbenchmark_t0(table, fill: float | None = None, **kwargs) -> dict:
    """:func:`probe_microbenchmark` and the mix: the benchmark's figures plus ``f``, ``t0_ns``
    and the named estimate ``estimate`` (a dict)."""
    bench = probe_microbenchmark(table, **kwargs)
    est = mix_probe_times(bench, fill)
    return {**bench, "f": est.detail["f"], "t0_ns": est.t0_ns, "estimate": est.to_dict()}
