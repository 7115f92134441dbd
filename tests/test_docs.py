"""Operations (issue 18 item 7): /docs and /redoc without a CDN, the bearer scheme in
/openapi.json, and bounded metric label cardinality.

In-process (TestClient)."""
from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from helpers import make_app, wait_ready

from bucketsearch.app.guard import OPEN, AccessPolicy
from bucketsearch.app.main import DOCS_ASSETS_URL, access_policy
from bucketsearch.app.metrics import LOOKUP_OCTAVES
from bucketsearch.app.openapi import SCHEME

WRITE_KEY, READ_KEY = "docs-write-key", "docs-read-key"


def make_client(tmp_path, **settings) -> TestClient:
    """The app's client, not entered yet (``with``); /docs and /openapi.json answer before the
    app is ready, so only the tests that search wait for it."""
    return TestClient(make_app(tmp_path / "d", **settings))


def urls_in(html: str) -> list[str]:
    """Every URL a page loads or points Swagger UI / ReDoc at."""
    found = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]+)['"]""", html)
    found += re.findall(r"""(?:url|oauth2RedirectUrl)\s*:\s*['"]([^'"]+)['"]""", html)
    found += re.findall(r"""spec-url\s*=\s*['"]([^'"]+)['"]""", html)
    return found


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
@pytest.mark.parametrize("keys", [{}, {"api_key": WRITE_KEY, "read_key": READ_KEY}],
                         ids=["no-keys", "both-keys"])
def test_docs_pages_load_only_local_assets_that_answer_without_a_key(tmp_path, page, keys):
    with make_client(tmp_path, **keys) as c:
        r = c.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "cdn" not in r.text.lower() and "googleapis" not in r.text
        urls = urls_in(r.text)
        assert any(u.endswith(".js") for u in urls), urls
        for url in urls:
            assert url.startswith("/") and not url.startswith("//"), url  # local, no host
            assert c.get(url).status_code == 200, url  # no key sent: open like /docs
        if page == "/docs":
            assert f"{DOCS_ASSETS_URL}/swagger-ui-bundle.js" in urls
            assert f"{DOCS_ASSETS_URL}/swagger-ui.css" in urls
            js = c.get(f"{DOCS_ASSETS_URL}/swagger-ui-bundle.js")
            assert "SwaggerUIBundle" in js.text and len(js.content) > 100_000


def test_asset_prefix_is_open_but_nothing_else_is(tmp_path):
    with make_client(tmp_path, api_key=WRITE_KEY, read_key=READ_KEY) as c:
        policy: AccessPolicy = access_policy(c.app)
        assert policy.permission("GET", f"{DOCS_ASSETS_URL}/swagger-ui.css") == OPEN
        assert policy.permission("POST", f"{DOCS_ASSETS_URL}/swagger-ui.css") != OPEN
        assert policy.permission("GET", "/docs/assetsx") != OPEN
        assert c.get(f"{DOCS_ASSETS_URL}/nope.js").status_code == 404
        assert c.get("/v1/indexes").status_code == 401  # reads still need the key


@pytest.mark.parametrize("keys, secured", [
    ({}, set()),
    ({"api_key": WRITE_KEY}, {"write"}),
    ({"read_key": READ_KEY}, {"read", "write"}),
    ({"api_key": WRITE_KEY, "read_key": READ_KEY}, {"read", "write"}),
], ids=["no-keys", "write-key", "read-key", "both-keys"])
def test_openapi_has_a_bearer_scheme_when_a_key_is_set(tmp_path, keys, secured):
    with make_client(tmp_path, **keys) as c:
        spec = c.get("/openapi.json").json()
    schemes = spec.get("components", {}).get("securitySchemes", {})
    if not keys:
        assert SCHEME not in schemes
    else:
        assert schemes[SCHEME]["type"] == "http" and schemes[SCHEME]["scheme"] == "bearer"
    ops = [(path, op) for path, item in spec["paths"].items() for op in item.values()]
    for path, op in ops:
        needs = op.get("x-permission") in secured
        assert (op.get("security") == [{SCHEME: []}]) == needs, (path, op.get("x-permission"))
    if keys:  # the Authorize button has something to authorize
        assert any(op.get("security") for _, op in ops)


# ------------------------------------------------------------ bounded metric label cardinality
def test_radius_series_stay_bounded_after_searches_at_40_radii(tmp_path):
    """Searches at radii 0..39 (each also records every smaller radius) expose radius labels
    0..16 and gt16 only; the gt16 series hold the sum of the larger radii."""
    from bucketsearch.app.metrics import MAX_RADIUS_LABEL, RADIUS_OVERFLOW_LABEL

    with make_client(tmp_path, max_probes=10_000_000, max_request_probes=10_000_000) as c:
        wait_ready(c)
        assert c.post("/v1/indexes", json={"name": "ix", "bits": 64, "mode": "mih",
                                           "substrings": 4}).status_code == 201
        codes = [format(i * 0x9E3779B97F4A7C15 % 2**64, "016x") for i in range(50)]
        assert c.post("/v1/indexes/ix/items", json={"ids": list(range(50)),
                                                    "codes": codes}).status_code == 200
        assert c.post("/v1/indexes/ix/merge").status_code == 200
        for radius in range(40):
            r = c.post("/v1/indexes/ix/search", json={"codes": codes[:2],
                                                      "max_distance": radius})
            assert r.status_code == 200, r.text
        text = c.get("/metrics").text
        entry = c.app.state.registry.entries["ix"]
        raw = entry.cost.snapshot()
    assert max(raw) >= 39  # the engine did record the large radii
    labels = set(re.findall(r'bucketsearch_lookup_seconds_count\{index="ix",radius="([^"]+)"',
                            text))
    assert labels == {*map(str, range(MAX_RADIUS_LABEL + 1)), RADIUS_OVERFLOW_LABEL}
    series = [line for line in text.splitlines()
              if not line.startswith("#") and 'index="ix",radius=' in line]
    assert len(series) <= (MAX_RADIUS_LABEL + 2) * (len(LOOKUP_OCTAVES) + 3 + 2 * 2)
    over = [rec for radius, rec in raw.items() if radius > MAX_RADIUS_LABEL]
    count = re.search(r'bucketsearch_lookup_seconds_count\{index="ix",radius="gt16"\} (\S+)',
                      text)
    assert float(count.group(1)) == sum(rec.n for rec in over)
    probes = re.search(r'bucketsearch_probes_total\{index="ix",radius="gt16"\} (\S+)', text)
    assert float(probes.group(1)) == sum(rec.probes_total for rec in over)


def test_http_route_label_is_the_template(tmp_path):
    with make_client(tmp_path) as c:
        for name in ("a", "b", "c"):
            c.get(f"/v1/indexes/{name}")
        c.get(f"{DOCS_ASSETS_URL}/swagger-ui.css")
        text = c.get("/metrics").text
    routes = set(re.findall(r'bucketsearch_http_requests_total\{[^}]*route="([^"]+)"', text))
    assert "/v1/indexes/{name}" in routes
    assert not any(r.startswith("/v1/indexes/") and "{" not in r for r in routes), routes
    assert not any("swagger-ui.css" in r for r in routes), routes
