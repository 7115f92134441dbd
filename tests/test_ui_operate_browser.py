"""Issue 30: the radius advisor and the exactness audit in the dashboard, in headless Chromium
(the browser, the console check and the chart helpers of tests/test_ui_browser.py).

One real server whose single-table engine drops the first id of every range answer (a factory
module put on PYTHONPATH patches ``HammingIndex.range_search`` before the app is made: a fault
below the index) and audits every search: the audit page must show the wrong answers with
their query; the advisor page, run with labels typed into its form, must show one row per
radius with the API's own figures, the recommendation and its frontier chart.
"""
from __future__ import annotations

import json
import textwrap

import httpx
import numpy as np
import pytest
from helpers import ServerProcess, add_codes, create_index
from test_ui_browser import browser, chart_data, page_of, shot, wait_chart  # noqa: F401

from bucketsearch.index.codes import pack_bits, to_hex

BITS = 16
N = 240
RADIUS = 4
FAULTY_APP = """
import numpy as np
from bucketsearch.index.probe import HammingIndex

_search = HammingIndex.range_search


def dropping_first_id(self, *args, **kwargs):
    lims, D, I, *rest = _search(self, *args, **kwargs)
    if len(I):
        counts = np.diff(lims)
        counts[np.flatnonzero(counts)[0]] -= 1
        lims = np.concatenate([[0], np.cumsum(counts)]).astype(lims.dtype)
        D, I = D[1:], I[1:]
    return (lims, D, I, *rest)


HammingIndex.range_search = dropping_first_id
from bucketsearch.app.main import create_app  # noqa: E402
"""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # slow: make test-long


def labeled_codes():
    rng = np.random.default_rng(30)
    centres = rng.integers(0, 2, size=(12, BITS), dtype=np.uint8)
    labels = rng.integers(0, 12, N)
    flips = (rng.random((N, BITS)) < 0.08).astype(np.uint8)
    return pack_bits(centres[labels] ^ flips), labels


@pytest.fixture(scope="module")
def faulty_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-operate")
    (tmp / "faulty_app.py").write_text(textwrap.dedent(FAULTY_APP))
    (tmp / "data").mkdir()
    srv = ServerProcess(tmp / "data", {"BUCKETSEARCH_WARMUP": "0", "BUCKETSEARCH_AUDIT_RATE": "1",
                                       "BUCKETSEARCH_AUDIT_CPU_SHARE": "1", "PYTHONPATH": str(tmp)},
                        log_path=tmp / "server.log", app="faulty_app:create_app").start(timeout=300)
    words, labels = labeled_codes()
    try:
        with srv.client() as c:
            create_index(c, "labeled", BITS, mode="single")
            add_codes(c, "labeled", range(N), words, BITS)
            assert c.post("/v1/indexes/labeled/merge").status_code == 200
            for i in range(3):
                r = c.post("/v1/indexes/labeled/search",
                           json={"codes": to_hex(words[i:i + 1], BITS), "max_distance": 1})
                assert r.status_code == 200
        yield srv
    finally:
        srv.stop()


def test_audit_page_shows_the_wrong_answers(faulty_server, page_of):
    page, console = page_of()
    page.goto(faulty_server.url + "/ui?refresh=1000#/audit")
    page.wait_for_selector("#audit-mismatch-table tbody tr")
    rep = httpx.get(faulty_server.url + "/v1/audit").json()
    assert rep["mismatched"] >= 1
    verdict = page.locator("#audit-verdict").inner_text()
    assert verdict.endswith("wrong answers found") and "one search in every 1 sampled" in \
        page.locator("#audit-summary").inner_text()
    counters = dict(r.split("\t") for r in page.locator("#audit-table tbody tr").all_inner_texts())
    assert int(counters["mismatched"]) >= 1 and int(counters["dropped (queue full)"]) == 0
    row = page.locator("#audit-mismatch-table tbody tr").first.locator("td").all_inner_texts()
    newest = rep["mismatches"][0]
    assert row[1] == "labeled" and row[2] == "range" and row[5] == newest["query"]
    assert row[8] == ", ".join(str(i) for i in newest["missing_ids"])
    shot(page, "audit")
    assert console.unexpected() == []


def test_advisor_page_runs_and_draws_the_frontier(faulty_server, page_of):
    words, labels = labeled_codes()
    page, console = page_of()
    page.goto(faulty_server.url + "/ui#/advise/labeled")
    page.wait_for_selector("#advise-form")
    assert page.locator("#advise-index").input_value() == "labeled"
    page.fill("#advise-sample", "60")
    page.fill("#advise-radius", str(RADIUS))
    relevance = {"db_ids": list(range(N)), "db_labels": labels.tolist()}
    page.fill("#advise-relevance", json.dumps(relevance))
    page.click("#advise-run")
    page.wait_for_function("() => document.getElementById('advise-status').textContent === 'done'")
    res = page.evaluate("() => window.bsAdvice")
    # the API's own figures (quality does not depend on timing): the same request again
    again = httpx.post(faulty_server.url + "/v1/indexes/labeled/advise", timeout=120, json={
        "sample": 60, "radius_max": RADIUS, "objective": "f1", "min_gain": 0.01,
        **relevance}).json()
    rows = page.locator("#advise-rows tbody tr")
    assert rows.count() == RADIUS + 1
    for r in range(RADIUS + 1):
        cells = rows.nth(r).locator("td").all_inner_texts()
        assert cells[0] == str(r)
        want = again["radii"][r]
        for col, key in ((8, "precision_macro"), (9, "recall_macro"), (10, "f1_macro")):
            shown = float(cells[col].split(" ")[0])  # 3 significant digits, 3 decimals at most
            assert shown == pytest.approx(want[key], abs=2e-3), (r, key)
    rec = res["recommendation"]
    assert page.locator("#advise-recommendation").inner_text() == \
        ("Recommended: " if rec["radius"] is not None else "No recommendation: ") + rec["reason"]
    assert page.locator("#advise-rows tbody tr.selected").count() == \
        (rec["radius"] is not None)
    wait_chart(page, "advise-frontier", 3)
    traces = {t["name"]: t for t in chart_data(page, "advise-frontier")}
    measured = [row for row in res["radii"] if row["measured_ns"] is not None]
    assert len(traces["radius"]["x"]) == len(measured)
    assert len(traces["Pareto frontier"]["x"]) == sum(row["pareto"] for row in measured)
    assert len(traces["recommended"]["x"]) == (rec["radius"] is not None)
    wait_chart(page, "advise-cost", 2)
    cost = {t["name"]: t for t in chart_data(page, "advise-cost")}
    assert cost["measured"]["x"] == list(range(RADIUS + 1))
    # a bad request shows the server's 400 in the form
    page.fill("#advise-radius", "99")
    page.click("#advise-run")
    page.wait_for_function(
        "() => document.getElementById('advise-status').textContent.startsWith('400')")
    assert "radius_max" in page.locator("#advise-status").inner_text()
    shot(page, "advise")
    assert console.unexpected(allowed_statuses=(400,)) == []
