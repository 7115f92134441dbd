"""Paired significance tests against direct formulas and exact enumeration."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.evaluation import significance as sig

vectors = st.integers(2, 9).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0, 1, allow_nan=False), min_size=n, max_size=n),
    st.lists(st.floats(0, 1, allow_nan=False), min_size=n, max_size=n)))


def enumerate_randomization(a, b):
    """Two-sided p by listing every sign vector with itertools (the twin)."""
    d = np.asarray(a) - np.asarray(b)
    obs = abs(d.sum())
    tol = 1e-12 * max(1.0, np.abs(d).sum())
    hits = sum(abs(sum(s * x for s, x in zip(signs, d))) >= obs - tol
               for signs in itertools.product((-1, 1), repeat=len(d)))
    return hits / 2 ** len(d)


@settings(max_examples=80, deadline=None)
@given(vectors)
def test_exact_randomization_matches_enumeration(ab):
    a, b = ab
    _, p = sig.randomization(a, b, exact=True)
    assert p == pytest.approx(enumerate_randomization(a, b), abs=1e-12)


def test_monte_carlo_randomization_is_close_to_exact_and_seeded():
    rng = np.random.default_rng(0)
    a = rng.random(14)
    b = a - 0.05 + 0.1 * rng.random(14)
    _, exact = sig.randomization(a, b, exact=True)
    _, mc = sig.randomization(a, b, n_resamples=20_000, seed=3, exact=False)
    assert mc == pytest.approx(exact, abs=0.015)
    assert sig.randomization(a, b, 500, seed=3, exact=False) == \
        sig.randomization(a, b, 500, seed=3, exact=False)
    # never 0 when sampled (add-one estimate)
    _, p = sig.randomization(np.ones(40), np.zeros(40), 100, exact=False)
    assert p == pytest.approx(1 / 101)


@settings(max_examples=60, deadline=None)
@given(vectors)
def test_t_test_matches_the_formula(ab):
    a, b = np.array(ab[0]), np.array(ab[1])
    d = a - b
    n = len(d)
    t, p = sig.paired_t(a, b)
    sd = math.sqrt(sum((x - d.mean()) ** 2 for x in d) / (n - 1))
    if sd < 1e-12:
        return
    want = d.mean() / (sd / math.sqrt(n))
    assert t == pytest.approx(want, rel=1e-9)
    # p from the t density integrated numerically (no scipy): 2 * int_|t|^inf f(x) dx
    nu = n - 1
    c = math.gamma((nu + 1) / 2) / (math.sqrt(nu * math.pi) * math.gamma(nu / 2))
    x = np.linspace(abs(want), abs(want) + 2000, 2_000_001)
    f = c * (1 + x ** 2 / nu) ** (-(nu + 1) / 2)
    tail = float(np.sum((f[1:] + f[:-1]) / 2 * np.diff(x)))
    assert p == pytest.approx(2 * tail, abs=2e-3)


def test_t_test_known_value():
    # d = [1, 2, 3, 4]: mean 2.5, sd 1.29099, t = 3.87298; two-sided p (3 dof) = 0.030466
    t, p = sig.paired_t([1, 2, 3, 4], [0, 0, 0, 0])
    assert t == pytest.approx(3.872983, rel=1e-6)
    assert p == pytest.approx(0.030466, abs=1e-5)


def test_wilcoxon_exact_small_case():
    # d = [1, 2, 3, 4, 5] all positive: W- = 0, exact two-sided p = 2 / 2^5
    w, p = sig.wilcoxon([1, 2, 3, 4, 5], [0, 0, 0, 0, 0])
    assert w == 0 and p == pytest.approx(2 / 32)
    assert sig.wilcoxon([1, 2], [1, 2]) == (0.0, 1.0)


def test_nan_queries_are_dropped_pairwise():
    a = [0.5, np.nan, 0.7, 0.2]
    b = [0.1, 0.3, np.nan, 0.1]
    x, y = sig.paired(a, b)
    assert x.tolist() == [0.5, 0.2] and y.tolist() == [0.1, 0.1]


def test_holm_and_bonferroni():
    p = [0.01, 0.04, 0.03, 0.005]
    assert sig.adjust(p, "bonferroni").tolist() == pytest.approx([0.04, 0.16, 0.12, 0.02])
    # sorted 0.005, 0.01, 0.03, 0.04 -> 0.02, 0.03, 0.06, 0.06 (monotone)
    assert sig.adjust(p, "holm").tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    with pytest.raises(ValueError, match="correction must be one of"):
        sig.adjust(p, "fdr")


def test_bootstrap_ci_covers_the_mean_difference():
    rng = np.random.default_rng(1)
    a = rng.random(200)
    b = a - 0.1 + 0.05 * rng.standard_normal(200)
    lo, hi = sig.bootstrap_ci(a, b, 2000, seed=0)
    assert lo < (a - b).mean() < hi and 0.08 < lo < hi < 0.12


def test_compare_marks_real_differences_and_not_noise():
    rng = np.random.default_rng(2)
    base = rng.random(300)
    runs = {"itq": base + 0.05 + 0.02 * rng.standard_normal(300),
            "lsh": base.copy(), "lsh2": base + 0.001 * rng.standard_normal(300)}
    res = sig.compare(runs, n_resamples=2000)
    by = {(r["a"], r["b"]): r for r in res["pairs"]}
    assert by[("itq", "lsh")]["significant"] and by[("itq", "lsh2")]["significant"]
    assert not by[("lsh", "lsh2")]["significant"]
    assert all(r["p_adjusted"] >= r["p_randomization"] for r in res["pairs"])
    text = sig.format_table(res, "map")
    assert text.count(" *") == 2
    tex = sig.to_latex(res, "map_all.tie_aware")
    assert tex.count(r"\textbf{") == 2 and r"map\_all" in tex
    base_only = sig.compare(runs, baseline="lsh", n_resamples=200)
    assert [(r["a"], r["b"]) for r in base_only["pairs"]] == [("lsh", "itq"), ("lsh", "lsh2")]


@pytest.mark.parametrize("kwargs, message", [
    ({"test": "sign"}, "test must be one of"), ({"alpha": 1.5}, "alpha must be in (0, 1)"),
    ({"baseline": "nope"}, "baseline 'nope' is not one of")])
def test_compare_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sig.compare({"a": [1, 2, 3], "b": [1, 2, 4]}, **kwargs)
    with pytest.raises(ValueError, match="different numbers of queries"):
        sig.compare({"a": [1, 2, 3], "b": [1, 2]})
