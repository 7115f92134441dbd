"""Issue 15: the dashboard's server side, in process: the page and its files pass the guard
without a key and carry their security and cache headers; the read-only figures the page draws
(``/v1/indexes/{name}/radius-profile``) match a plain-numpy twin; ``/v1/dashboard/session``
tells a write key from a read key; bad parameters get a 400 naming the field."""
from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import add_codes, app_client, create_index
from naive import hamming_matrix, per_radius_counts

from bucketsearch.app.routers.ui import CSP
from bucketsearch.app.ui.assets import AssetError, global_rules, map_stylesheet, plotly_assets
from bucketsearch.index.codes import pack_bits

BITS = 16
READ_KEY, WRITE_KEY = "ui-read", "ui-write"


def random_words(n: int, seed: int, distinct: int = 40) -> np.ndarray:
    """``n`` codes drawn from ``distinct`` random codes (so buckets hold several items)."""
    rng = np.random.default_rng(seed)
    pool = pack_bits(rng.integers(0, 2, size=(distinct, BITS), dtype=np.uint8))
    return pool[rng.integers(0, distinct, size=n)]


# ------------------------------------------------------------------------- page and files
def test_page_and_files_load_without_a_key_and_the_api_does_not(tmp_path):
    with app_client(tmp_path / "d", read_key=READ_KEY, api_key=WRITE_KEY) as c:
        page = c.get("/ui")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.headers["content-security-policy"] == CSP
        assert "'unsafe-inline'" not in CSP and "'unsafe-eval'" not in CSP
        assert page.headers["cache-control"] == "no-cache"
        assert page.headers["x-content-type-options"] == "nosniff"
        assert "<script>" not in page.text and " style=" not in page.text  # nothing inline
        assert "{{" not in page.text
        urls = re.findall(r'(?:src|href)="(/ui/[^"]+)"', page.text)
        assert len(urls) == 9
        for url in urls:
            r = c.get(url)
            assert r.status_code == 200, url
            assert r.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert c.get("/v1/indexes").status_code == 401
        assert c.get("/v1/dashboard/session").status_code == 401
        for missing in ("/ui/static/index.html", "/ui/static/nothing.js", "/ui/vendor/x.css",
                        "/ui/static/..%2Fassets.py", "/ui/elsewhere"):
            assert c.get(missing).status_code == 404, missing


def test_plotly_stylesheets_come_from_the_bundle():
    assets = plotly_assets()
    assert ".js-plotly-plot .plotly .modebar" in assets.global_css
    assert ".plotly-notifier" in assets.global_css
    assert re.fullmatch(r"[0-9a-f]{64}", assets.map_style_id)
    assert assets.map_css.startswith(".maplibregl")
    bundle = assets.path.read_text()
    assert bundle.count(assets.map_style_id) >= 2  # the id the bundle checks, then sets


def test_rule_table_parsing_worked_example():
    src = 'x={"X,X div":\'a:"b";\',Y:"c:d;","X:hover .m":"e:f;"};'
    assert global_rules(src) == [".js-plotly-plot .plotly:hover .m {e:f;}",
                                 ".plotly-notifier {c:d;}",
                                 '.js-plotly-plot .plotly,.js-plotly-plot .plotly div {a:"b";}']
    with pytest.raises(AssetError, match="rule table"):
        global_rules("no rules here")
    with pytest.raises(AssetError, match="unreadable CSS rule"):
        global_rules('{"X,X div":broken}')
    with pytest.raises(AssetError, match="map library"):
        map_stylesheet("nothing")


# ------------------------------------------------------------------------- session
@pytest.mark.parametrize("keys, token, status, can_write", [
    ({}, None, 200, True),
    ({"read_key": READ_KEY, "api_key": WRITE_KEY}, None, 401, None),
    ({"read_key": READ_KEY, "api_key": WRITE_KEY}, "wrong", 403, None),
    ({"read_key": READ_KEY, "api_key": WRITE_KEY}, READ_KEY, 200, False),
    ({"read_key": READ_KEY, "api_key": WRITE_KEY}, WRITE_KEY, 200, True),
    ({"read_key": READ_KEY}, READ_KEY, 200, False),
    ({"api_key": WRITE_KEY}, None, 200, False),
    ({"api_key": WRITE_KEY}, WRITE_KEY, 200, True),
    ({"read_only": True}, None, 200, False),
])
def test_session_says_whether_the_key_may_write(tmp_path, keys, token, status, can_write):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with app_client(tmp_path / "d", **keys) as c:
        r = c.get("/v1/dashboard/session", headers=headers)
        assert r.status_code == status, r.text
        if status == 200:
            body = r.json()
            assert body["can_write"] is can_write
            assert (body["why_not_write"] is None) == (can_write or keys.get("read_only", False))
            assert READ_KEY not in r.text and WRITE_KEY not in r.text


# ------------------------------------------------------------------------- radius profile
@pytest.mark.parametrize("mode", ["single", "auto", "mih"])
def test_radius_profile_matches_the_numpy_twin(tmp_path, mode):
    """Main table (merged), then a delta and tombstones: bucket counters are the main table's
    (deleted items stay in its buckets until the next merge), empty balls count live items."""
    radius, nq, seed = 3, 48, 5
    main_words, delta_words = random_words(400, 1), random_words(30, 2, distinct=30)
    main_ids = np.arange(400)
    deleted = main_ids[::7]
    with app_client(tmp_path / "d") as c:
        create_index(c, "p", BITS, mode=mode)
        add_codes(c, "p", main_ids, main_words, BITS)
        assert c.post("/v1/indexes/p/merge").status_code == 200
        add_codes(c, "p", 1000 + np.arange(30), delta_words, BITS)
        assert c.post("/v1/indexes/p/items/delete",
                      json={"ids": deleted.tolist()}).status_code == 200
        r = c.get("/v1/indexes/p/radius-profile",
                  params={"max_distance": radius, "queries": nq, "seed": seed})
        assert r.status_code == 200, r.text
        prof = r.json()
        xq = c.app.state.registry.get("p").live.query_sample(nq, seed)
    assert prof["max_distance"] == radius and len(prof["radii"]) == radius + 1
    assert prof["main_size"] == 400 and prof["live_size"] == 400 - len(deleted) + 30
    live_words = np.concatenate([np.delete(main_words, deleted, axis=0), delta_words])
    nearest = hamming_matrix(xq, live_words, BITS).min(axis=1)
    got = {f: [e[f] for e in prof["radii"]] for f in prof["radii"][0]}
    assert got["empty_ball_queries"] == [int((nearest > r).sum()) for r in range(radius + 1)]
    assert got["cumulative_paper_probes"] == [1, 17, 137, 697]
    if mode == "mih":
        assert prof["engine"] == "mih" and prof["planner"] is None
        return
    assert prof["engine"] == "single"
    probes, nonempty, items = per_radius_counts(xq, main_words, BITS, radius)
    np.testing.assert_allclose(got["probes"], probes.mean(axis=0))
    np.testing.assert_allclose(got["nonempty_buckets"], nonempty.mean(axis=0))
    np.testing.assert_allclose(got["empty_buckets"], (probes - nonempty).mean(axis=0))
    np.testing.assert_allclose(got["items"], items.mean(axis=0))
    np.testing.assert_allclose(got["empty_share"], ((probes - nonempty) / probes).mean(axis=0))
    if mode == "single":
        assert prof["planner"] is None
    else:
        choices = prof["planner"]["choices"]
        assert [e["radius"] for e in choices] == list(range(radius + 1))
        for e in choices:  # the cheapest allowed path is the one chosen
            allowed = {m: v for m, v in e["predicted_ns"].items() if v is not None}
            assert allowed[e["mode"]] == min(allowed.values())


def test_radius_profile_reports_served_searches_and_the_extended_model(tmp_path):
    words = random_words(300, 3)
    with app_client(tmp_path / "d") as c:
        create_index(c, "s", BITS, mode="single")
        add_codes(c, "s", np.arange(300), words, BITS)
        assert c.post("/v1/indexes/s/merge").status_code == 200
        from bucketsearch.index.codes import to_hex
        r = c.post("/v1/indexes/s/search", json={"codes": to_hex(words[:20], BITS),
                                                  "max_distance": 2, "stats": True})
        assert r.status_code == 200
        stats = r.json()["stats"]
        prof = c.get("/v1/indexes/s/radius-profile", params={"max_distance": 2}).json()
    served = {e["radius"]: e for e in prof["served"]}
    assert sorted(served) == [0, 1, 2]
    for rad, e in served.items():
        assert e["queries"] == 20
        assert e["empty_buckets"] == pytest.approx(np.mean([q[rad]["empty_buckets"]
                                                            for q in stats]))
    assert all(e["extended_ns"] is not None for e in prof["radii"])
    assert prof["extended_model"]["estimator"] == "query_model"
    assert prof["extended_model"]["source"].startswith("observed searches")


def test_radius_profile_default_radius_and_bad_parameters(tmp_path):
    with app_client(tmp_path / "d", max_request_probes=10_000) as c:
        create_index(c, "b", BITS, mode="single")
        add_codes(c, "b", np.arange(50), random_words(50, 4), BITS)
        prof = c.get("/v1/indexes/b/radius-profile", params={"queries": 64}).json()
        assert prof["max_distance"] == 2  # 64 x 697 probes (radius 3) > 10,000
        cases = {"max_distance=17": "max_distance", "max_distance=-1": "max_distance",
                 "queries=0": "queries", "queries=1025": "queries", "seed=x": "seed",
                 "max_distance=3&queries=64": "max_request_probes"}
        for query, named in cases.items():
            r = c.get(f"/v1/indexes/b/radius-profile?{query}")
            assert r.status_code == 400, (query, r.text)
            assert named in r.json()["detail"], (query, r.text)
        assert c.get("/v1/indexes/nope/radius-profile").status_code == 404


def test_extended_prediction_worked_example():
    """The per-query model: T(R) = fixed + sum_t coef_t sum_{r<=R} feature_t(r); per radius
    the step."""
    from bucketsearch.app.routers.dashboard import extended_prediction

    def model(**coef):
        return {"estimator": "query_model", "terms": {t: {"coef_ns": c, "ci_ns": [c, c]}
                                                      for t, c in coef.items()}}

    means = {"probes": np.array([1.0, 16.0, 120.0]), "items": np.array([2.0, 0.0, 4.0])}
    assert extended_prediction(model(fixed=100.0, probes=2.0, items=10.0), means, 3) == \
        ([122.0, 32.0, 280.0], [122.0, 154.0, 434.0])
    # items unidentified (left out of the fit): it adds nothing; no fixed term: none added
    assert extended_prediction(model(probes=1.0), means, 3) == ([1.0, 16.0, 120.0],
                                                               [1.0, 17.0, 137.0])
    assert extended_prediction(None, means, 2) == ([None, None], [None, None])
    # a model of the old per-(query, radius) shape (a "coef" dict, no terms) predicts nothing
    assert extended_prediction({"coef": {"const": 5.0, "probes": 1.0}}, means, 2) == \
        ([None, None], [None, None])
    unknown = model(fixed=1.0, candidates=3.0)  # a term the profile lacks
    assert extended_prediction(unknown, means, 2) == ([None, None], [None, None])
    # a negative coefficient making a time negative: no prediction there, not "-987 ns"
    assert extended_prediction(model(fixed=100.0, probes=2.0, items=-600.0), means, 3) == \
        ([None, 32.0, None], [None, None, None])


def test_the_wheel_ships_the_dashboard_files(tmp_path):
    import subprocess
    import sys
    import zipfile

    from helpers import ROOT

    from bucketsearch.app.ui.assets import STATIC_DIR
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    names = set(zipfile.ZipFile(next(tmp_path.glob("bucketsearch-*.whl"))).namelist())
    shipped = {f"bucketsearch/app/ui/static/{p.name}" for p in STATIC_DIR.iterdir()}
    assert len(shipped) == 7 and shipped <= names
    assert {"bucketsearch/app/ui/assets.py", "bucketsearch/app/routers/ui.py",
            "bucketsearch/app/routers/dashboard.py"} <= names
