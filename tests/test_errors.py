"""One error shape for every 4xx (issue 18 item 8): an invalid value gets 400 and
``{"detail": "<string>"}`` whichever layer caught it (our code's ValueError or FastAPI's
request validation), the latter with the per-field list under ``errors``; a LICENSE file;
README's http.client example survives uvicorn's keep-alive timeout.

In-process (TestClient)."""
from __future__ import annotations

import re
import time

import pytest
from helpers import ROOT, app_client

BITS = 64
RAW = {"content-type": "application/octet-stream"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with app_client(tmp_path_factory.mktemp("errors") / "data", max_k=1000) as c:
        assert c.post("/v1/indexes", json={"name": "ix", "bits": BITS}).status_code == 201
        r = c.post("/v1/indexes/ix/items", json={"ids": [1, 2], "codes": ["00" * 8, "ff" * 8]})
        assert r.status_code == 200, r.text
        yield c


def assert_invalid(r, field: str, *, listed: bool) -> dict:
    """400, ``detail`` a string naming ``field``, ``errors`` a list iff schema validation."""
    assert r.status_code == 400, (r.status_code, r.text)
    body = r.json()
    assert isinstance(body["detail"], str) and field in body["detail"], body
    if listed:
        assert isinstance(body["errors"], list) and body["errors"]
        for err in body["errors"]:
            assert set(err) == {"loc", "msg", "type"} and isinstance(err["loc"], list)
            assert isinstance(err["msg"], str) and isinstance(err["type"], str)
    else:
        assert "errors" not in body
    return body


SEARCH = "/v1/indexes/ix/search"


def test_wrong_hex_length_and_non_hex_get_the_same_status_and_shape(client):
    wrong_length = client.post(SEARCH, json={"codes": ["abc"], "max_distance": 1})
    non_hex = client.post(SEARCH, json={"codes": ["zz" * 8], "max_distance": 1})
    assert wrong_length.status_code == non_hex.status_code == 400
    a = assert_invalid(wrong_length, "codes", listed=False)
    b = assert_invalid(non_hex, "codes[0]", listed=True)
    assert "16" in a["detail"]  # the allowed length
    assert "'zz" in b["detail"]  # the value given
    assert b["errors"][0]["loc"] == ["body", "codes", 0]


def test_k_too_large_and_k_zero_get_the_same_status_and_shape(client):
    too_large = client.post(SEARCH, json={"codes": ["00" * 8], "k": 20000})
    zero = client.post(SEARCH, json={"codes": ["00" * 8], "k": 0})
    assert too_large.status_code == zero.status_code == 400
    assert "max_k=1000" in assert_invalid(too_large, "k", listed=False)["detail"]
    body = assert_invalid(zero, "k", listed=True)
    assert "greater than or equal to 1" in body["detail"] and "(got 0)" in body["detail"]
    # the same pair through the query string (octet-stream body): FastAPI's query validation
    too_large = client.post(SEARCH + "?k=20000", content=b"\x00" * 8, headers=RAW)
    zero = client.post(SEARCH + "?k=0", content=b"\x00" * 8, headers=RAW)
    assert too_large.status_code == zero.status_code == 400
    assert_invalid(too_large, "k", listed=False)
    assert_invalid(zero, "k", listed=True)


@pytest.mark.parametrize("method, path, kwargs, field", [
    ("post", "/v1/indexes", {"json": {"name": "ok", "bits": 0}}, "bits"),
    ("post", "/v1/indexes", {"json": {"name": "a b", "bits": 8}}, "name"),
    ("post", "/v1/indexes", {"json": {"name": "ok"}}, "bits"),
    ("post", "/v1/indexes/ix/items", {"json": {"ids": [-1], "codes": ["00" * 8]}}, "ids[0]"),
    ("post", "/v1/indexes/ix/items", {"json": {"ids": [1], "codes": ["00" * 8], "x": 1}}, "x"),
    ("post", "/v1/indexes/ix/items", {"content": b"{not json",
                                      "headers": {"content-type": "application/json"}}, "body"),
    ("post", SEARCH, {"json": {"codes": ["00" * 8], "stats": True}},
     "give max_distance (radius search), k (k-NN) or both"),
    ("post", SEARCH + "?max_distance=-1", {"content": b"\x00" * 8, "headers": RAW},
     "max_distance"),
    ("get", "/v1/indexes/b%20ad", {}, "name"),
])
def test_every_schema_validation_error_is_400_with_a_string_detail(client, method, path,
                                                                    kwargs, field):
    assert_invalid(getattr(client, method)(path, **kwargs), field, listed=True)


def test_other_statuses_keep_their_kind_and_the_string_detail(client):
    for r, status in [(client.get("/v1/indexes/nope"), 404),
                      (client.post("/v1/indexes", json={"name": "ix", "bits": 8}), 409),
                      (client.post(SEARCH, content=b"x", headers={"content-type": "text/csv"}),
                       415)]:
        assert r.status_code == status and isinstance(r.json()["detail"], str), r.text


def test_openapi_documents_400_not_422(client):
    spec = client.get("/openapi.json").json()
    for path, item in spec["paths"].items():
        for method, op in item.items():
            assert "422" not in op.get("responses", {}), (method, path)
    assert "400" in spec["paths"]["/v1/indexes"]["post"]["responses"]
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_license_is_mit():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 the bucketsearch authors" in text


# ------------------------------------------------------------- README's http.client example
def readme_http_client_example() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    return next(b for b in blocks if "http.client.HTTPConnection" in b)


def test_readme_http_client_example_survives_the_keep_alive_timeout(
        bucketsearch_server_factory):
    """uvicorn closes a keep-alive connection idle for 5 s: the example's second request,
    after 6 s idle, must still work (it reconnects). A real uvicorn process: the keep-alive
    timeout is uvicorn's."""
    server = bucketsearch_server_factory(BUCKETSEARCH_WARMUP=0,
                                         BUCKETSEARCH_CALIBRATION_QUERIES=0)
    with server.client() as c:
        assert c.post("/v1/indexes", json={"name": "photos", "bits": 64}).status_code == 201
        r = c.post("/v1/indexes/photos/items", json={"ids": [1, 2], "codes": [
            "00000000000000ff", "00000000000000fe"]})
        assert r.status_code == 200, r.text
    code = readme_http_client_example().replace('"127.0.0.1", 8000',
                                                f'"127.0.0.1", {server.port}')
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    assert ns["I"].tolist() == [1, 2, 2, 1] and ns["D"].tolist() == [0, 1, 0, 1]
    time.sleep(6)  # past uvicorn's 5 s keep-alive: the server has closed the connection
    again = ns["post"]("/v1/indexes/photos/search?max_distance=2",
                       ns["codes"].tobytes(),
                       {"Content-Type": "application/octet-stream",
                        "Accept": "application/octet-stream"})
    assert again == ns["body"]
    ns["conn"].close()
