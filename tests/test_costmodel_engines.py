"""The cost model of what ran (index/costmodel/engines.py): per-engine models over their own
counters, the per-class table, verdicts per model; the engines tag every query they run; the
load tester's printed tables carry no product column that is not the product of its columns
(the old ``t0*P``: t0 x single-table probes beside a ``probes`` column of MIH probes)."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from bucketsearch.index.base import ENGINES, SearchStats
from bucketsearch.index.costmodel.engines import (LEGEND, TABLE_COLUMNS, QuerySamples, _ns,
                                                  describe, engine_report, sum_c)
from bucketsearch.index.factory import make_index

BITS = 64
#: the true per-query costs of the known run (ns)
TRUE = {"single": {"probes": 5.0, "items": 40.0},
        "mih": {"fixed": 300.0, "probes": 20.0, "candidates": 3.0},
        "scan": {"codes_compared": 1.5}}


def known_queries() -> list[dict]:
    """Range classes R = 0..4 (R <= 1 single table, R >= 2 multi-index hashing, as an auto
    index plans) and a k-NN class run by the scan, each query costing exactly its engine's
    TRUE model."""
    rng = np.random.default_rng(3)
    out = []
    for R in range(5):
        for _ in range(40):
            items = int(rng.integers(0, 5))
            if R <= 1:
                q = {"engine": "single", "probes": sum_c(BITS, R), "items": items}
            else:
                m = 4 ** (R - 1)
                q = {"engine": "mih", "probes": m, "candidates": int(rng.integers(m, 8 * m)),
                     "items": items}
            out.append({**q, "k": 0, "radius": R})
    for _ in range(30):
        out.append({"engine": "scan", "k": 10, "radius": int(rng.integers(10, 14)),
                    "codes_compared": 50_000, "items": 10})
    for q in out:
        coef = TRUE[q["engine"]]
        q["total_ns"] = coef.get("fixed", 0.0) + sum(
            c * q.get(t, 0) for t, c in coef.items() if t != "fixed")
    return out


def test_each_engine_recovers_its_own_model_and_the_table_says_what_ran():
    rep = engine_report(QuerySamples.from_queries(known_queries()), BITS, 2.0, "test",
                        {"holds_at": [0, 1], "fails_at": []})
    for engine, coef in TRUE.items():
        got = {t["term"]: t["coef_ns"] for t in rep["models"][engine]["terms"]}
        for term, value in coef.items():
            assert got[term] == pytest.approx(value, rel=1e-6), (engine, term)
        # one line per term, the counter it multiplies named
        assert all(t["counter"] for t in rep["models"][engine]["terms"])
    rows = rep["rows"]
    assert [(r["class"], r["radius"], r["engine"]) for r in rows] == \
        [("range", 0, "single"), ("range", 1, "single"), ("range", 2, "mih"),
         ("range", 3, "mih"), ("range", 4, "mih"), ("knn10", 11, "scan")]
    for r in rows:
        assert r["share"] == 1.0
        assert r["measured_over_modeled"] == pytest.approx(1.0, rel=1e-6) and r["holds"]
        if r["k"] == 0:  # the paper's column: exactly t0 x sum C(Q, i <= R), named as such
            assert r["sum_c"] == sum(math.comb(BITS, i) for i in range(r["radius"] + 1))
            assert r["paper_ns"] == 2.0 * r["sum_c"]
        else:  # a k-NN class: one row, its radius reached, no paper charge
            assert r["sum_c"] is None and r["paper_ns"] is None
            assert r["radius_max"] == 13 and r["mean_codes_compared"] == 50_000
    summary = rep["verdicts"]["summary"]
    assert "range: 40% of these queries ran single; single model holds at R = 0..1" in summary
    assert ("range: 60% of these queries ran mih: outside the paper's model; mih model holds "
            "at R = 2..4") in summary
    assert any(s.startswith("knn10: 100% of these queries ran scan: outside the paper's "
                            "model; scan model holds") for s in summary)
    assert "paper model (single-table range queries only): holds at R = 0..1" in summary
    assert set(rep["legend"]) == set(TABLE_COLUMNS)


def test_a_model_that_misses_is_judged_so():
    queries = known_queries()
    for q in queries:
        if q["engine"] == "mih" and q["radius"] == 4:
            q["total_ns"] *= 5  # a cost the mih model's counters do not explain
    rep = engine_report(QuerySamples.from_queries(queries), BITS, None)
    mih = rep["verdicts"]["engines"]["mih"]["range"]
    assert 4 in mih["fails_at"]
    for r in rep["rows"]:
        ratio = r["measured_over_modeled"]
        assert r["holds"] == (0.5 <= ratio <= 2)


def parse_table(text: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the plain-text table that starts with a ``class`` header."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["class", "R",
                                                                          "engine"])
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = []
    for line in lines[start + 1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(header):
            break
        rows.append(cells)
    return header, rows


def products_in(text: str) -> list[tuple[str, str]]:
    """Every ``a*b`` product column named in a printed table header."""
    return re.findall(r"\b(t0)\*(\w+)\b", text)


def check_products(text: str, t0: float) -> None:
    """Every printed product column names columns of its own table (t0 is the title's) and
    equals their product as printed."""
    header, rows = parse_table(text)
    named = products_in(text)
    assert named, "no product column printed"
    for _, factor in named:
        assert factor in header, f"t0*{factor}: {factor} is no column of the table {header}"
    col = header.index("paper t0*sumC")
    for row in rows:
        if row[header.index("sumC")] != "-":
            s = int(row[header.index("sumC")].replace(",", ""))
            assert row[col] == _ns(t0 * s), row
    assert rows


def test_the_printed_paper_column_is_the_product_of_its_columns():
    rep = engine_report(QuerySamples.from_queries(known_queries()), BITS, 2.5, "radius_fit")
    text = describe(rep)
    check_products(text, 2.5)
    assert "paper t0 [radius_fit] = 2.5 ns" in text
    for name, definition in LEGEND.items():  # every column defined in the output
        assert f"  {name}: {definition}" in text


def test_the_old_t0_times_p_column_fails_the_product_check():
    """The old per-class table printed ``probes`` (46, MIH's) beside ``t0*P`` (t0 x 679,121,
    single-table probes): ``P`` is no column, the product check refuses it."""
    old = ("measured vs modeled per query class (t0*P with t0 [radius_fit] = 391 ns)\n"
           "class  R  engine  probes       t0*P  sumC  paper t0*sumC\n"
           "r4     4  mih         46     266 ms  679,121  266 ms\n")
    with pytest.raises(AssertionError, match="t0\\*P: P is no column"):
        check_products(old, 391.0)


def test_load_tester_prints_the_model_of_what_ran_for_an_mih_run(capsys):
    """A load run whose radius-4 queries ran MIH (46 substring probes each): the printed
    tables hold no ``t0*P``; the paper's column is t0 x sumC; the verdict names MIH."""
    from rich.console import Console

    from bucketsearch.loadtest.report import build_report, print_report
    from bucketsearch.loadtest.stats import LoadStats, QueryStats, RequestResult

    results = []
    for i in range(30):
        rings = [{"radius": r, "probes": 46 // 5 + (r == 0), "nonempty_buckets": 1,
                  "empty_buckets": 0, "items": 1, "lookup_ns": 1000 + 10 * i,
                  "candidates": 20} for r in range(5)]
        q = QueryStats.from_server(rings, {"engine": "mih", "total_ns": 5000 + 50 * i,
                                           "codes_compared": 0}, 0)
        results.append(RequestResult("r4", 4, None, 1, i * 1000, i * 1000, i * 1000,
                                     i * 1000 + 500_000, 200, server=[q]))
    report = build_report(LoadStats().add_all(results), {"mode": "closed", "batch": 1}, BITS,
                          {"t0_ns": 391.0, "t0_estimator": "radius_fit", "t0_source": "x",
                           "estimates": []})
    model = report["model"]
    assert model["paper_scope"]["queries"] == 0 and "radii" not in model
    print_report(report, Console(width=200, force_terminal=False))
    text = capsys.readouterr().out
    assert "t0*P" not in text
    check_products(text, 391.0)
    assert ("range: 100% of these queries ran mih: outside the paper's model; mih model holds "
            "at R = 4") in text
    assert "the paper's model is not judged on this run" in text


@pytest.mark.parametrize("mode", ["single", "mih", "scan", "auto"])
def test_every_engine_tags_the_queries_it_ran(mode):
    """``engine``, ``k`` and ``codes_compared`` per query, for range and k-NN searches, and
    kept per query when batches of different engines are concatenated."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 2, size=(3000, BITS), dtype=np.uint8)
    index = make_index(BITS, mode=mode)
    index.add(codes)
    st_range = index.range_search(codes[:6], 2, stats=True)[3]
    st_knn = index.search(codes[:4], 5, stats=True)[2]
    for st, k in ((st_range, 0), (st_knn, 5)):
        names = st.engine_names()
        assert set(names) <= {"single", "mih", "scan"} and len(names) == len(st.radii)
        if mode != "auto":
            assert set(names) == {mode}
        assert (st.k == k).all()
        scanned = (np.array(names) == "scan") | (st.scanned_from >= 0)
        assert (st.codes_compared == np.where(scanned, index.ntotal, 0)).all()
    both = SearchStats.concat([st_range, st_knn])
    assert both.engine_names() == st_range.engine_names() + st_knn.engine_names()
    assert list(both.k) == [0] * 6 + [5] * 4
    samples = QuerySamples.from_stats([st_range, st_knn])
    assert list(samples.radius[:6]) == [2] * 6
    assert (samples.total_ns > 0).all()


def test_concat_keeps_the_candidates_of_mih_batches_beside_single_table_ones():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 2, size=(2000, BITS), dtype=np.uint8)
    single, mih = make_index(BITS, mode="single"), make_index(BITS, mode="mih")
    single.add(codes)
    mih.add(codes)
    a = single.range_search(codes[:3], 1, stats=True)[3]
    b = mih.range_search(codes[:3], 1, stats=True)[3]
    both = SearchStats.concat([a, b])
    assert both.candidates is not None
    assert (both.candidates[:3] == 0).all() and (both.candidates[3:] == b.candidates).all()
    assert list(both.engine) == [ENGINES.index("single")] * 3 + [ENGINES.index("mih")] * 3
