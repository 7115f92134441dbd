"""The schema is the contract (issue 31): the examples schemathesis found, one test each.

Booleans are not integers, integer bounds are stated exactly, 405 answers carry the path's
whole ``Allow``, cross-field rules are in the schema or the server accepts what it allows."""
from __future__ import annotations

import pytest
from helpers import app_client

from bucketsearch.app.schemas import MAX_ID


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with app_client(tmp_path_factory.mktemp("contract") / "d") as c:
        assert c.post("/v1/indexes", json={"name": "fz", "bits": 8}).status_code == 201
        c.post("/v1/indexes/fz/items", json={"ids": [0, 1, 2], "codes": ["00", "0f", "ff"]})
        c.post("/v1/indexes", json={"name": "one", "bits": 1})
        c.post("/v1/indexes/one/items", json={"ids": [0], "codes": ["80"]})
        yield c


@pytest.mark.parametrize("path,body,field", [
    ("/v1/indexes/fz/items/get", {"ids": [False]}, "ids[0]"),
    ("/v1/indexes/fz/items/delete", {"ids": [False]}, "ids[0]"),
    ("/v1/indexes/fz/search", {"codes": ["00"], "max_distance": False}, "max_distance"),
    ("/v1/indexes/fz/search", {"codes": ["00"], "k": True}, "k"),
    ("/v1/indexes/fz/search", {"codes": ["00"], "max_distance": 1, "stats": 1}, "stats"),
    ("/v1/indexes/fz/cost-model/calibrate", {"max_distance": False}, "max_distance"),
    ("/v1/indexes", {"name": "b", "bits": True}, "bits"),
    ("/v1/indexes/fz/items", {"ids": ["5"], "codes": ["00"]}, "ids[0]"),
])
def test_a_boolean_or_a_string_is_not_an_integer(client, path, body, field):
    """Before: ``false`` was taken as id 0 and as radius 0 (200)."""
    res = client.post(path, json=body)
    assert res.status_code == 400, res.text
    assert res.json()["detail"].startswith(field), res.json()["detail"]
    assert client.post("/v1/indexes/fz/items/get", json={"ids": [0]}).json()["codes"] == ["00"]


def test_an_integral_number_is_an_integer(client):
    """JSON Schema's integer takes 8.0: so does the server."""
    res = client.post("/v1/indexes/fz/search", json={"codes": ["00"], "max_distance": 0.0})
    assert res.status_code == 200 and res.json()["results"][0]["ids"] == [0]


def _schema(client):
    return client.get("/openapi.json").json()


def _body_schema(spec, path, method="post"):
    content = spec["paths"][path][method]["requestBody"]["content"]["application/json"]
    schema = content["schema"]
    if "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def test_integer_bounds_are_stated_exactly(client):
    """Before: ``maximum: 9.223372036854776e+18`` (a float, 2^63): schemathesis sent ids past
    int64 as schema-valid and the server refused them."""
    spec = _schema(client)
    ids = _body_schema(spec, "/v1/indexes/{name}/items/get")["properties"]["ids"]["items"]
    assert ids["maximum"] == MAX_ID and type(ids["maximum"]) is int
    assert ids["minimum"] == 0 and type(ids["minimum"]) is int
    text = client.get("/openapi.json").text
    assert "9.223372036854776e+18" not in text and '"ge"' not in text
    res = client.post("/v1/indexes/fz/items/get", json={"ids": [MAX_ID, MAX_ID + 1]})
    assert res.status_code == 400 and "ids[1]" in res.json()["detail"]


def test_search_rules_are_in_the_schema(client):
    """max_distance, k or both (the model's rule, now an anyOf), and k at most max_k."""
    spec = _schema(client)
    search = _body_schema(spec, "/v1/indexes/{name}/search")
    assert {tuple(o["required"]) for o in search["anyOf"]} == {("max_distance",), ("k",)}
    k = [o for o in search["properties"]["k"]["anyOf"] if o.get("type") == "integer"][0]
    assert k["maximum"] == client.app.state.settings.max_k
    res = client.post("/v1/indexes/fz/search", json={"codes": ["00"]})
    assert res.status_code == 400


@pytest.mark.parametrize("path,methods", [
    ("/v1/indexes", "GET, POST"), ("/v1/indexes/fz", "DELETE, GET, PATCH"),
    ("/v1/indexes/fz/snapshots", "GET, POST"),
    ("/v1/indexes/fz/snapshots/a.tar", "DELETE, GET")])
def test_a_405_names_every_method_of_the_path(client, path, methods):
    """Before: ``Allow`` named the methods of the first route matching the path only."""
    res = client.request("OPTIONS", path)
    assert res.status_code == 405
    assert res.headers["allow"] == methods


def test_empty_batches_are_accepted_as_the_schema_allows(client):
    assert client.post("/v1/indexes/fz/items", json={"ids": [], "codes": []}).json()[
        "inserted"] == 0
    assert client.post("/v1/indexes/fz/items/delete", json={"ids": []}).json()["deleted"] == 0
    assert client.post("/v1/indexes/fz/items/get", json={"ids": []}).json() == {
        "ids": [], "codes": []}


def test_first_id_with_a_json_body_gives_the_ids(client):
    """Before: 400 'first_id: only allowed with application/octet-stream' for a request the
    schema allows; now the JSON body without ids takes them from first_id, as the raw one."""
    res = client.post("/v1/indexes/fz/items?first_id=100", json={"codes": ["01", "02"]})
    assert res.status_code == 200, res.text
    got = client.post("/v1/indexes/fz/items/get", json={"ids": [100, 101]}).json()
    assert got["codes"] == ["01", "02"]
    res = client.post("/v1/indexes/fz/items?first_id=200", json={"ids": [7], "codes": ["01"]})
    assert res.status_code == 400 and "not both" in res.json()["detail"]


def test_calibrate_defaults_fit_a_small_index(client):
    """Before: the default max_distance 2 was refused for a 1-bit index (400 on an empty
    body the schema allows)."""
    res = client.post("/v1/indexes/one/cost-model/calibrate", json={})
    assert res.status_code == 200, res.text
    assert res.json()["calibration"]["max_distance"] == 1


def test_a_snapshot_name_pattern_is_in_the_schema(client):
    spec = _schema(client)
    params = spec["paths"]["/v1/indexes/{name}/snapshots/{snapshot}"]["get"]["parameters"]
    snapshot = [p for p in params if p["name"] == "snapshot"][0]
    assert snapshot["schema"]["pattern"].endswith(r"\.tar$")


def test_every_operation_declares_its_error_statuses(client):
    """One mechanism (app/openapi.py) adds the common answers: 400 where a parameter or a
    body can be invalid, 404 where the path names something."""
    for path, item in _schema(client)["paths"].items():
        for method, op in item.items():
            codes = set(op["responses"])
            if op.get("parameters") or "requestBody" in op:
                assert "400" in codes, (method, path)
            if "{" in path:
                assert "404" in codes, (method, path)
            assert "413" in codes and "422" not in codes, (method, path)
