"""Comparing methods on the same queries: paired significance tests and multiple comparisons.

Input: per-query values ``a[q]``, ``b[q]`` of one metric for two methods (code sets) on the
same queries and ground truth (``bucketsearch eval --per-query``); ``d[q] = a[q] - b[q]``.
Queries where either value is NaN (excluded under ``no_relevant="exclude"``) are dropped
pairwise, and the number kept is reported.

* Paired t-test (Student): ``t = mean(d) / (sd(d) / sqrt(n))``, ``sd`` with ``n - 1``,
  two-sided p from the t distribution with ``n - 1`` degrees of freedom. ``sd = 0``: p = 1 when
  ``mean(d) = 0``, else 0.
* Wilcoxon signed-rank (scipy, zero differences dropped: Wilcoxon's own convention; p = 1 when
  every difference is 0), two-sided.
* Fisher's randomization (paired permutation) test, as ranx and Smucker, Allan & Carterette
  (CIKM 2007) use it: under H0 each ``d[q]`` is equally likely to have either sign; statistic
  ``|mean(d)|``; with ``n_resamples`` random sign vectors from a fixed seed,
  ``p = (1 + #{|mean(s * d)| >= |mean(d)|}) / (1 + n_resamples)`` (never 0; Phipson & Smyth
  2010); when ``2^n <= n_resamples`` every sign vector is enumerated and p is exact,
  ``#{...} / 2^n``.
* Bootstrap confidence interval of ``mean(d)``: percentile interval over ``n_resamples``
  resamples of the queries with replacement (fixed seed).
* Multiple comparisons: Holm's step-down adjustment (default) or Bonferroni, over every pair
  compared: ``p_(i)^holm = max_{j <= i} min(1, (m - j + 1) p_(j))`` for the sorted p-values.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

TESTS = ("t-test", "wilcoxon", "randomization")
CORRECTIONS = ("holm", "bonferroni", "none")
DEFAULT_RESAMPLES = 10_000
#: sign vectors enumerated per block by the exact randomization test
_EXACT_BLOCK = 1 << 16


def paired(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Both vectors as float64 with the queries that are NaN in either dropped."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"per-query vectors must be 1-D of the same length, got {a.shape} and "
                         f"{b.shape}")
    keep = ~(np.isnan(a) | np.isnan(b))
    return a[keep], b[keep]


def paired_t(a, b) -> tuple[float, float]:
    """``(t, two-sided p)`` of the paired t-test (module docstring)."""
    from scipy import stats
    a, b = paired(a, b)
    d = a - b
    n = len(d)
    if n < 2:
        raise ValueError(f"the paired t-test needs at least 2 queries, got {n}")
    mean = d.mean()
    sd = d.std(ddof=1)
    if sd == 0:
        return (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    t = mean / (sd / math.sqrt(n))
    return float(t), float(2.0 * stats.t.sf(abs(t), n - 1))


def wilcoxon(a, b) -> tuple[float, float]:
    """``(W, two-sided p)`` of the Wilcoxon signed-rank test (zero differences dropped)."""
    from scipy import stats
    a, b = paired(a, b)
    d = a - b
    if not np.any(d != 0):
        return 0.0, 1.0
    res = stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided")
    return float(res.statistic), float(res.pvalue)


def randomization(a, b, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                  exact: bool | None = None) -> tuple[float, float]:
    """``(mean(d), two-sided p)`` of Fisher's paired randomization test (module docstring).
    ``exact=None`` enumerates every sign vector when ``2^n <= n_resamples``."""
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) \
            or n_resamples < 1:
        raise ValueError(f"n_resamples must be an int >= 1, got {n_resamples!r}")
    a, b = paired(a, b)
    d = a - b
    n = len(d)
    if n == 0:
        raise ValueError("the randomization test needs at least 1 query with values")
    observed = abs(d.sum())
    tol = 1e-12 * max(1.0, np.abs(d).sum())   # sums equal up to rounding count as ties
    if exact is None:
        exact = n < 63 and (1 << n) <= n_resamples
    if exact:
        if n > 30:
            raise ValueError(f"exact enumeration of 2^{n} sign vectors is too large")
        hits = 0
        total = 1 << n
        bits = np.arange(n, dtype=np.int64)
        for start in range(0, total, _EXACT_BLOCK):
            codes = np.arange(start, min(total, start + _EXACT_BLOCK), dtype=np.int64)
            signs = 1.0 - 2.0 * ((codes[:, None] >> bits[None, :]) & 1)
            hits += int((np.abs(signs @ d) >= observed - tol).sum())
        return float(d.mean()), hits / total
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_resamples, 1024):
        m = min(1024, n_resamples - start)
        signs = rng.choice(np.array([-1.0, 1.0]), size=(m, n))
        hits += int((np.abs(signs @ d) >= observed - tol).sum())
    return float(d.mean()), (1 + hits) / (1 + n_resamples)


def bootstrap_ci(a, b, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(a - b)`` (queries resampled with replacement)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    a, b = paired(a, b)
    d = a - b
    if len(d) == 0:
        raise ValueError("the bootstrap needs at least 1 query with values")
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    for start in range(0, n_resamples, 1024):
        m = min(1024, n_resamples - start)
        means[start:start + m] = d[rng.integers(0, len(d), (m, len(d)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def adjust(pvalues, method: str = "holm") -> np.ndarray:
    """Family-wise adjusted p-values: Holm's step-down, Bonferroni, or ``"none"``."""
    p = np.asarray(pvalues, dtype=np.float64)
    if method not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, got {method!r}")
    m = len(p)
    if method == "none" or m == 0:
        return p.copy()
    if method == "bonferroni":
        return np.minimum(1.0, p * m)
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = stepped
    return out


def compare(runs: dict[str, np.ndarray], test: str = "randomization",
            correction: str = "holm", alpha: float = 0.05, baseline: str | None = None,
            n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict:
    """Every pair of methods (or every method against ``baseline``) on one metric.

    ``runs``: method name -> per-query values (same queries, same order). Each pair gets the
    mean difference, its bootstrap interval, the three tests' p-values and the p-value of
    ``test`` adjusted by ``correction`` over all pairs; ``significant`` is ``adjusted < alpha``.
    """
    if test not in TESTS:
        raise ValueError(f"test must be one of {TESTS}, got {test!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    names = list(runs)
    if len(names) < 2:
        raise ValueError(f"compare needs at least 2 methods, got {len(names)}")
    lengths = {name: len(np.asarray(v)) for name, v in runs.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"methods have different numbers of queries: {lengths}")
    if baseline is not None and baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not one of the methods {names}")
    pairs = ([(baseline, n) for n in names if n != baseline] if baseline
             else list(itertools.combinations(names, 2)))
    rows = []
    for x, y in pairs:
        a, b = paired(runs[x], runs[y])
        t, p_t = paired_t(a, b)
        _, p_w = wilcoxon(a, b)
        diff, p_r = randomization(a, b, n_resamples, seed)
        lo, hi = bootstrap_ci(a, b, n_resamples, seed)
        rows.append({"a": x, "b": y, "n": len(a), "mean_a": float(a.mean()),
                     "mean_b": float(b.mean()), "diff": diff, "ci_low": lo, "ci_high": hi,
                     "t": t, "p_t": p_t, "p_wilcoxon": p_w, "p_randomization": p_r})
    key = {"t-test": "p_t", "wilcoxon": "p_wilcoxon", "randomization": "p_randomization"}[test]
    adjusted = adjust([r[key] for r in rows], correction)
    for row, p in zip(rows, adjusted):
        row["p_adjusted"] = float(p)
        row["significant"] = bool(p < alpha)
    means = {}
    for name in names:
        v = np.asarray(runs[name], dtype=np.float64)
        means[name] = float(np.nanmean(v)) if np.any(~np.isnan(v)) else None
    return {"test": test, "correction": correction, "alpha": alpha, "n_resamples": n_resamples,
            "seed": seed, "baseline": baseline, "means": means, "pairs": rows}


def format_table(res: dict, metric: str) -> str:
    """The comparison as text: one line per pair, ``*`` where the adjusted p < alpha."""
    lines = [f"{metric}: {res['test']} test, {res['correction']} correction over "
             f"{len(res['pairs'])} comparisons, alpha = {res['alpha']}, "
             f"{res['n_resamples']} resamples (seed {res['seed']})",
             "  " + "  ".join(f"{name} {mean:.4f}" if mean is not None else f"{name} -"
                              for name, mean in res["means"].items()), "",
             f"{'A':>14s} {'B':>14s} {'n':>5s} {'A-B':>8s} {'95% CI':>19s} {'p_t':>8s} "
             f"{'p_wilc':>8s} {'p_rand':>8s} {'p_adj':>8s}"]
    for r in res["pairs"]:
        lines.append(f"{r['a']:>14s} {r['b']:>14s} {r['n']:5d} {r['diff']:+8.4f} "
                     f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] {r['p_t']:8.2g} "
                     f"{r['p_wilcoxon']:8.2g} {r['p_randomization']:8.2g} "
                     f"{r['p_adjusted']:8.2g}{' *' if r['significant'] else ''}")
    return "\n".join(lines)


def to_latex(res: dict, metric: str) -> str:
    """A booktabs table: mean per method, and per pair the difference, its interval and the
    adjusted p-value; significant differences in bold."""
    esc = lambda s: str(s).replace("_", r"\_").replace("%", r"\%")  # noqa: E731
    out = [r"\begin{table}[t]", r"\centering",
           r"\caption{" + esc(metric) + f": {esc(res['test'])} test, {esc(res['correction'])} "
           f"correction, $\\alpha = {res['alpha']}$" + "}",
           r"\begin{tabular}{llrrrr}", r"\toprule",
           r"A & B & mean A & mean B & $\Delta$ [95\% CI] & $p_{adj}$ \\", r"\midrule"]
    for r in res["pairs"]:
        delta = f"{r['diff']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"
        if r["significant"]:
            delta = r"\textbf{" + delta + "}"
        out.append(f"{esc(r['a'])} & {esc(r['b'])} & {r['mean_a']:.4f} & {r['mean_b']:.4f} & "
                   f"{delta} & {r['p_adjusted']:.3g} \\\\")
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out)
