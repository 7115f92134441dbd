"""Issue 15: the dashboard in a real browser (headless Chromium from the distribution's
packages, driven by Playwright for Python; no browser download).

One browser and two real server processes per module: an open server holding indexes whose
counts are known, and a server with a read key and a write key. Every page is checked for
console errors (a Content-Security-Policy violation is one); the charts are checked for the
number of points the known counts give; a search typed in the query box against the API's own
answer; the key flow (no key: a prompt, a wrong key: a clear message, the read key: no write
controls). Screenshots go to out/ui/.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, ServerProcess, add_codes, create_index

from bucketsearch.index.codes import pack_bits, to_hex

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = ROOT / "out" / "ui"
BITS = 16
READ_KEY, WRITE_KEY = "dashboard-read-key", "dashboard-write-key"
#: the known index: bucket size -> number of buckets of that size
BUCKETS = {1: 5, 2: 3, 4: 2, 7: 1}
SEARCH_RADIUS = 3  # searches up to this radius feed the cost model before the page opens

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # slow: make test-long
try:
    from playwright import sync_api
except ImportError:  # the dev extra has it; CI must not skip the browser tests quietly
    if os.environ.get("CI"):
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)


def _chromium_or_skip() -> str:
    if CHROMIUM.exists():
        return str(CHROMIUM)
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser():
    executable = _chromium_or_skip()
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, args=[
            "--no-sandbox", "--js-flags=--expose-gc", "--enable-precise-memory-info"])
        yield b
        b.close()


def known_codes() -> tuple[np.ndarray, np.ndarray]:
    """(ids, words) of the known index: distinct random 16-bit codes, repeated as BUCKETS."""
    rng = np.random.default_rng(15)
    n_codes = sum(BUCKETS.values())
    values = rng.choice(2 ** BITS, size=n_codes, replace=False)
    sizes = [size for size, count in sorted(BUCKETS.items()) for _ in range(count)]
    rows = np.repeat(values, sizes)
    bits = ((rows[:, None] >> (BITS - 1 - np.arange(BITS))) & 1).astype(np.uint8)
    return np.arange(len(rows), dtype=np.int64), pack_bits(bits)


def start_server(tmp, name: str, **env) -> ServerProcess:
    data = tmp / name
    data.mkdir()
    return ServerProcess(data, {"BUCKETSEARCH_WARMUP": "0", **env},
                         log_path=tmp / f"{name}.log").start(timeout=300)


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    """A server without keys: index "known" (single table, BUCKETS, merged) searched up to
    SEARCH_RADIUS, and index "planned" (mode auto) for the planner chart."""
    srv = start_server(tmp_path_factory.mktemp("ui"), "open")
    ids, words = known_codes()
    try:
        with srv.client() as c:
            create_index(c, "known", BITS, mode="single")
            add_codes(c, "known", ids, words, BITS)
            assert c.post("/v1/indexes/known/merge").status_code == 200
            r = c.post("/v1/indexes/known/search",
                       json={"codes": to_hex(words[::3], BITS), "max_distance": SEARCH_RADIUS,
                             "stats": True})
            assert r.status_code == 200, r.text
            create_index(c, "planned", BITS, mode="auto")
            add_codes(c, "planned", ids, words, BITS)
            assert c.post("/v1/indexes/planned/merge").status_code == 200
            for body in [{"max_distance": r} for r in range(SEARCH_RADIUS + 1)] + [{"k": 5}]:
                r = c.post("/v1/indexes/planned/search",
                           json={"codes": to_hex(words[::5], BITS), "stats": True, **body})
                assert r.status_code == 200, r.text
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("ui-keys"), "keyed",
                       BUCKETSEARCH_READ_KEY=READ_KEY, BUCKETSEARCH_API_KEY=WRITE_KEY)
    try:
        with srv.client(headers={"Authorization": f"Bearer {WRITE_KEY}"}) as c:
            create_index(c, "known", BITS, mode="single")
            add_codes(c, "known", *known_codes(), BITS)
        yield srv
    finally:
        srv.stop()


class Console:
    """Console errors and uncaught exceptions of one page (a CSP violation is a console
    error)."""

    def __init__(self, page):
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def unexpected(self, allowed_statuses: tuple[int, ...] = ()) -> list[str]:
        """Errors except the browser's note of an API answer with an allowed status."""
        allowed = [f"status of {s}" for s in allowed_statuses]
        return [e for e in self.errors
                if not (e.startswith("Failed to load resource") and any(a in e for a in allowed))]


@pytest.fixture
def page_of(browser):
    """``page_of(key=None) -> (page, console)``: a fresh browser context
    (its own sessionStorage) with ``key`` typed into the session before any script runs."""
    contexts = []

    def make(key: str | None = None):
        context = browser.new_context(viewport={"width": 1300, "height": 1000})
        contexts.append(context)
        if key is not None:
            context.add_init_script(
                f"sessionStorage.setItem('bucketsearch.key', {json.dumps(key)})")
        page = context.new_page()
        page.set_default_timeout(60_000)
        return page, Console(page)

    yield make
    for context in contexts:
        context.close()


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def chart_data(page, chart_id: str) -> list[dict]:
    """The traces a chart holds as plotted: name, x, y and the point labels per trace."""
    return page.evaluate(
        """id => (document.getElementById(id).data || []).map(
               t => ({name: t.name, type: t.type || 'scatter', x: Array.from(t.x || []),
                      y: Array.from(t.y || []),
                      text: Array.isArray(t.text) ? Array.from(t.text) : []}))""", chart_id)


def wait_chart(page, chart_id: str, traces: int = 1) -> None:
    page.wait_for_function(
        "([id, n]) => { const el = document.getElementById(id);"
        " return el && el.data && el.data.length >= n && el._fullLayout; }",
        arg=[chart_id, traces])


# ----------------------------------------------------------------------------- the pages
def test_indexes_page_charts_the_known_bucket_sizes(open_server, page_of):
    page, console = page_of()
    response = page.goto(open_server.url + "/ui#/indexes")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.wait_for_selector("#indexes tbody tr[data-name='known']")
    page.click("#indexes tbody tr[data-name='known'] td:nth-child(2)")
    page.wait_for_function(
        "() => document.getElementById('hist-title').textContent.endsWith('known')")
    wait_chart(page, "hist-chart")
    (bars,) = chart_data(page, "hist-chart")
    assert bars["x"] == sorted(BUCKETS) and bars["y"] == [BUCKETS[s] for s in sorted(BUCKETS)]
    assert page.locator("#hist-chart .barlayer .point").count() == len(BUCKETS)
    # whole numbers of items: a category axis, never ticks at 0.6 .. 1.4 items (issue 26)
    assert page.evaluate("document.getElementById('hist-chart')._fullLayout.xaxis.type") \
        == "category"
    row = page.locator("#indexes tbody tr[data-name='known'] td")
    cells = row.all_inner_texts()
    n_items = sum(s * c for s, c in BUCKETS.items())
    assert cells[2] == str(n_items) and cells[3] == str(BITS) and cells[4] == "single"
    assert cells[5] == str(sum(BUCKETS.values()))
    assert float(cells[6]) == pytest.approx(sum(BUCKETS.values()) / 2 ** BITS, rel=1e-3)
    shot(page, "indexes")
    assert console.unexpected() == []


def test_index_page_charts_one_point_per_radius(open_server, page_of):
    page, console = page_of()
    page.goto(open_server.url + "/ui#/index/known")
    for chart in ("cost-chart", "cumulative-chart", "empty-chart", "live-chart"):
        wait_chart(page, chart)
    radii = list(range(SEARCH_RADIUS + 1))
    cost = {t["name"]: t for t in chart_data(page, "cost-chart")}
    assert cost["measured p50 (band to p99)"]["x"] == radii
    assert cost["p99"]["x"] == radii and cost["modeled t0 × probes"]["x"] == radii
    assert all(y > 0 for y in cost["measured p50 (band to p99)"]["y"])
    cumulative = {t["name"]: t for t in chart_data(page, "cumulative-chart")}
    assert cumulative["Σ_{i≤R} C(Q, i)"]["y"] == [1, 17, 137, 697]
    assert cumulative["measured T(R)/T(0)"]["y"][0] == 1
    # the empty-bucket chart against the API's own profile of the same sampled queries
    with open_server.client() as c:
        profile = c.get("/v1/indexes/known/radius-profile",
                        params={"max_distance": SEARCH_RADIUS}).json()
    empty = {t["name"]: t for t in chart_data(page, "empty-chart")}
    assert empty["empty buckets / probes"]["x"] == radii
    assert empty["empty-ball queries"]["y"] == [e["empty_ball_share"] for e in profile["radii"]]
    assert page.locator("#empty-chart .barlayer .point").count() == len(radii)
    assert page.locator("#radii tbody tr").count() == len(radii)
    assert "no planner" in page.inner_text("#planner-note")
    shot(page, "index")
    assert console.unexpected() == []


def test_planner_choices_of_an_auto_index(open_server, page_of):
    page, console = page_of()
    page.goto(open_server.url + "/ui#/index/planned")
    wait_chart(page, "planner-chart", 4)
    traces = {t["name"]: t for t in chart_data(page, "planner-chart")}
    # the chart covers every radius a range search reached, whichever engine the planner ran
    # (the single-table rows alone stopped at r = 1 when it chose MIH above)
    with open_server.client() as c:
        profile = c.get("/v1/indexes/planned/radius-profile",
                        params={"max_distance": SEARCH_RADIUS}).json()
    choices = profile["planner"]["choices"]
    assert traces["chosen"]["x"] == [e["radius"] for e in choices] == list(range(SEARCH_RADIUS + 1))
    assert traces["chosen"]["text"] == [e["mode"] for e in choices]
    assert set(traces) == {"predicted single", "predicted mih", "predicted scan", "chosen"}
    assert page.locator("#write-controls #calibrate").count() == 1  # no keys: writes are open
    assert console.unexpected() == []


def test_what_ran_table_with_its_legend_verdicts_and_the_t0_interval(open_server, page_of):
    """The auto index's engine table: one row per (class, radius, engine) of the API's
    ``engines``, every column defined (header tooltip and legend), the verdict per model, the
    k-NN class with its radius reached; the headline t0 names its estimator and interval."""
    page, console = page_of()
    page.goto(open_server.url + "/ui#/index/planned")
    page.wait_for_selector("#engines tbody tr")
    with open_server.client() as c:
        cm = c.get("/v1/indexes/planned/cost-model").json()
    rows = cm["engines"]["rows"]
    assert page.locator("#engines tbody tr").count() == len(rows)
    headers = page.locator("#engines th")
    names = headers.all_inner_texts()
    assert names[:3] == ["class", "R", "engine"] and "paper t0*sumC" in names
    assert "t0*P" not in names
    for i, name in enumerate(names):  # every column defined, one hover away and in the legend
        assert headers.nth(i).get_attribute("title") == cm["engines"]["legend"][name]
    legend = page.text_content("#engine-legend")  # in a closed <details>: not visible text
    assert all(name in legend for name in names)
    cells = page.locator("#engines tbody tr").first.locator("td").all_inner_texts()
    assert cells[0] == rows[0]["class"] and cells[2] == rows[0]["engine"]
    knn = [r for r in rows if r["k"]]
    assert knn and all(r["measured_p50_ns"] > 0 and r["radius_max"] >= r["radius"] for r in knn)
    assert {r["class"] for r in knn} == {"knn5"}
    # no per-radius row above the largest radius a range query searched
    assert max(r["radius"] for r in rows if not r["k"]) == SEARCH_RADIUS
    verdicts = page.locator("#engine-verdicts li").all_inner_texts()
    assert verdicts == cm["engines"]["verdicts"]["summary"] and verdicts
    headline = page.inner_text("#t0-headline")
    if cm["t0_ns"] is None:  # no query of this auto index ran single-table probing
        assert headline == "t0 not fitted yet"
    shot(page, "engines")
    # the single index, calibrated: the headline t0 names its estimator, interval, stability
    with open_server.client() as c:
        r = c.post("/v1/indexes/known/cost-model/calibrate",
                   json={"queries": 64, "max_distance": 2})
        assert r.status_code == 200, r.text
        cal = r.json()
    page.goto(open_server.url + "/ui#/index/known")
    page.wait_for_function("() => (document.getElementById('t0-headline') || {}).textContent"
                           "?.includes('calibration')")
    headline = page.inner_text("#t0-headline")
    lo, hi = cal["t0_ci_ns"]
    assert headline.startswith("t0 ") and " ns [" in headline
    assert f"[{cal['t0_estimator']}, 95% CI" in headline
    assert ("UNSTABLE" if not cal["calibration"]["stable"] else "stable") in headline
    assert cal["t0_estimator"] == "radius_fit, mean over repeated rounds" and lo < hi
    shot(page, "t0-interval")
    assert console.unexpected() == []


def test_live_refresh_stays_bounded(open_server, page_of):
    """Polling every 100 ms with a 10-point history: over 30 more refreshes the page's DOM
    nodes and (after a full garbage collection) its JS heap do not grow, and the live chart
    holds 10 points per series. (Axis ticks come and go with the data: a few nodes of
    jitter, never a trend.)"""
    page, console = page_of()
    page.goto(open_server.url + "/ui?refresh=100&history=10#/index/known")

    def sample(cycles: int) -> tuple[int, int]:
        page.wait_for_function("n => window.bsDashboard.cycles >= n", arg=cycles,
                               timeout=180_000)
        page.evaluate("() => window.gc()")
        return page.evaluate("() => [document.getElementsByTagName('*').length,"
                             " performance.memory.usedJSHeapSize]")

    (nodes0, heap0), *later = [sample(n) for n in (10, 20, 30, 40)]
    assert [len(t["x"]) for t in chart_data(page, "live-chart")] == [10, 10]
    for nodes, heap in later:
        assert abs(nodes - nodes0) <= 0.05 * nodes0, (nodes0, later)
        assert heap <= 1.25 * heap0, (heap0, later)
    print(f"DOM nodes {nodes0} -> {[n for n, _ in later]}; JS heap {heap0} -> "
          f"{[h for _, h in later]} bytes")
    assert console.unexpected() == []


def test_query_box_shows_the_api_ids(open_server, page_of):
    page, console = page_of()
    page.goto(open_server.url + "/ui#/query")
    page.wait_for_selector("#query-index option[value='known']", state="attached")
    page.select_option("#query-index", "known")
    _, words = known_codes()
    code = to_hex(words[6:7], BITS)[0]  # a code held by 2 items
    with open_server.client() as c:
        expected = c.post("/v1/indexes/known/search",
                          json={"codes": [code], "max_distance": 4}).json()["results"][0]
    assert len(expected["ids"]) >= 2

    def search(text: str, radius: str = "", k: str = "") -> list[list[str]]:
        page.fill("#query-code", text)
        page.fill("#query-radius", radius)
        page.fill("#query-k", k)
        page.evaluate("document.getElementById('query-results').replaceChildren()")
        page.click("#query-submit")
        page.wait_for_selector("#query-ids")
        rows = page.locator("#query-ids tbody tr")
        return [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]

    rows = search(code, radius="4")
    assert [int(r[1]) for r in rows] == expected["ids"]
    assert [int(r[2]) for r in rows] == expected["distances"]
    assert page.locator("#query-stats tbody tr").count() == 5  # radii 0..4
    bit_string = format(int(code, 16), f"0{BITS}b")
    assert [int(r[1]) for r in search(bit_string, radius="4")] == expected["ids"]
    assert [int(r[1]) for r in search(code, radius="4", k="3")] == expected["ids"][:3]
    with open_server.client() as c:
        knn = c.post("/v1/indexes/known/search", json={"codes": [code], "k": 5}).json()
    assert [int(r[1]) for r in search(code, k="5")] == knn["results"][0]["ids"]
    shot(page, "query")
    page.fill("#query-code", "abc")
    page.fill("#query-radius", "1")
    page.click("#query-submit")
    assert "needs exactly 4 hex digits" in page.inner_text("#query-message")
    assert console.unexpected() == []


def test_loadtest_report_page_renders_a_real_report(open_server, page_of, tmp_path):
    out = tmp_path / "load.json"
    run = subprocess.run([sys.executable, "-m", "bucketsearch.loadtest", "--url",
                          open_server.url, "--index", "known", "--mode", "open", "--rate", "40",
                          "--duration", "1.5", "--warmup", "0.3", "--radii", "0,1,2", "--knn",
                          "1", "--seed", "3", "--no-progress", "--json", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    page, console = page_of()
    page.goto(open_server.url + "/ui#/loadtest")
    page.set_input_files("#report-file", str(out))
    wait_chart(page, "report-cost-chart", 3)
    n_classes = len(report["per_radius"]) + len(report.get("knn") or [])
    assert page.locator("#report-classes tbody tr").count() == n_classes
    cost = {t["name"]: t for t in chart_data(page, "report-cost-chart")}
    radii = report["model"]["radii"]
    assert cost["measured T(R) p50 (band to p99)"]["x"] == [r["radius"] for r in radii]
    assert cost["measured T(R) p50 (band to p99)"]["y"] == pytest.approx(
        [r["measured_cumulative"]["p50_ns"] for r in radii])
    assert page.locator("#report-radii tbody tr").count() == len(radii) == 3
    estimators = page.inner_text("#report-t0")
    assert all(e["estimator"] in estimators for e in report["model"]["t0"])
    assert str(report["requests"]) in page.inner_text("#report-summary")
    shot(page, "loadtest")
    bad = tmp_path / "not-a-report.json"
    bad.write_text('{"hello": 1}')
    page.set_input_files("#report-file", str(bad))
    page.wait_for_function("() => document.getElementById('report-message').textContent"
                           ".includes('not a bucketsearch-loadtest --json report')")
    assert page.locator("#report-classes").count() == 0
    assert console.unexpected() == []


# ----------------------------------------------------------------------------- keys
def test_key_flow(keyed_server, page_of):
    page, console = page_of()
    response = page.goto(keyed_server.url + "/ui#/indexes")
    assert response.status == 200 and "content-security-policy" in response.headers
    page.wait_for_selector("#auth:not([hidden])")
    assert "needs a key" in page.inner_text("#auth-message")
    page.fill("#key-input", "not-the-key")
    page.click("#key-submit")
    page.wait_for_function("() => document.getElementById('auth-message').textContent"
                           ".includes('refused')")
    assert "invalid API key" in page.inner_text("#auth-message")
    shot(page, "wrong-key")
    page.fill("#key-input", READ_KEY)
    page.click("#key-submit")
    page.wait_for_selector("#indexes tbody tr[data-name='known']")
    assert page.is_hidden("#auth")
    assert page.inner_text("#key-state") == "read-only key"
    page.goto(keyed_server.url + "/ui#/index/known")
    wait_chart(page, "cost-chart")
    assert page.locator("#write-controls button").count() == 0
    assert page.evaluate("sessionStorage.getItem('bucketsearch.key')") == READ_KEY
    assert console.unexpected(allowed_statuses=(401, 403)) == []
    assert any("status of 403" in e for e in console.errors)  # the wrong key's answer

    page, console = page_of(key=WRITE_KEY)
    page.goto(keyed_server.url + "/ui#/index/known")
    page.wait_for_selector("#write-controls #calibrate")
    assert page.inner_text("#key-state") == "write key"
    page.click("#write-controls #calibrate")
    page.wait_for_function(
        "() => document.getElementById('write-result').textContent === 'done'")
    assert console.unexpected() == []


def test_screenshot_for_the_readme(open_server, page_of):
    """The index page of a realistic run (20,000 clustered 64-bit codes, searches at radii 0-3,
    a calibration): out/ui/readme-index.png, the picture in README.md (docs/dashboard.png is
    a copy)."""
    from bucketsearch.loadtest import dataset
    from bucketsearch.loadtest.demo import INDEX, load_index
    packed = dataset.clustered_codes(20_000, 64, seed=7)
    load_index(open_server.url, packed, 64, say=lambda *a: None)
    queries = dataset.to_hex(packed[::97][:100])
    with open_server.client() as c:
        for radius in range(4):
            for start in range(0, len(queries), 25):
                r = c.post(f"/v1/indexes/{INDEX}/search",
                           json={"codes": queries[start:start + 25], "max_distance": radius,
                                 "stats": True})
                assert r.status_code == 200, r.text
        r = c.post(f"/v1/indexes/{INDEX}/cost-model/calibrate",
                   json={"queries": 128, "max_distance": 3})
        assert r.status_code == 200, r.text
    page, console = page_of()
    page.goto(open_server.url + f"/ui?refresh=250#/index/{INDEX}")
    wait_chart(page, "cost-chart", 4)
    wait_chart(page, "empty-chart", 2)
    page.wait_for_function("() => window.bsDashboard.cycles >= 8")  # a few live points
    cost = {t["name"]: t for t in chart_data(page, "cost-chart")}
    assert cost["measured p50 (band to p99)"]["x"] == [0, 1, 2, 3]
    shot(page, "readme-index")
    assert console.unexpected() == []


def test_jobs_page_shows_a_job_as_the_api_does(open_server, page_of):
    import time

    import httpx
    job = httpx.post(open_server.url + "/v1/jobs", json={"index": "known", "radius": 1,
                                                         "output": "clusters"}).json()
    deadline = time.monotonic() + 120
    while (info := httpx.get(f"{open_server.url}/v1/jobs/{job['id']}").json())["state"] \
            == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert info["state"] == "completed"
    page, console = page_of()
    page.goto(open_server.url + "/ui#/jobs")
    page.wait_for_selector("#jobs tbody tr")
    cells = page.locator("#jobs tbody tr").first.locator("td").all_inner_texts()
    assert cells[0] == job["id"] and cells[1] == "known" and cells[4] == "completed"
    assert cells[5] == cells[6] == str(info["items"]) and cells[7] == str(info["pairs"])
    assert page.locator("#jobs tbody tr").first.locator("a").count() == 2  # ndjson, csv
    shot(page, "jobs")
    assert console.unexpected() == []
