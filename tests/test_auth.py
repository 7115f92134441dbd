"""Auth fails closed (issue 10): the matrix route x key configuration x key sent, over every
route of the app (walked from ``app.routes``, so a new route cannot escape), checked against
the table in README.md; the key is checked before the body is read.

In-process (TestClient): the guard is pure ASGI, nothing here needs a socket."""
from __future__ import annotations

import itertools
import time
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from helpers import ROOT, app_client, make_app, wait_ready

from bucketsearch.app.guard import OPEN, READ, WRITE, Guard, flat_routes
from bucketsearch.app.main import access_policy
from bucketsearch.app.settings import Settings
from bucketsearch.index.storage import backup

BITS = 64
WRITE_KEY, READ_KEY, WRONG_KEY = "w-Secret_1", "r-Secret_2", "not-a-key"
SENT = {"none": None, "read": READ_KEY, "write": WRITE_KEY, "wrong": WRONG_KEY}
CONFIGS = {"no keys": {}, "api_key only": {"api_key": WRITE_KEY},
           "read_key only": {"read_key": READ_KEY},
           "both": {"api_key": WRITE_KEY, "read_key": READ_KEY}}
CODE = "00" * (BITS // 8)


def expected(permission: str, config: dict, sent: str) -> str:
    """The rule, written out: '2xx', '401' or '403'."""
    api, read = config.get("api_key"), config.get("read_key")
    key = SENT[sent]
    if permission == OPEN:
        return "2xx"
    if permission == WRITE:
        if api is None:
            return "2xx" if read is None else "403"  # read key alone: nobody writes
        return "401" if key is None else "2xx" if key == api else "403"
    if read is None:
        return "2xx"  # reads are open without a read key; a header is ignored
    return "401" if key is None else "2xx" if key in (api, read) else "403"


def readme_matrix() -> dict[tuple[str, str, str], str]:
    """The table after ``<!-- auth-matrix -->`` in README.md."""
    text = (ROOT / "README.md").read_text()
    rows = text.split("<!-- auth-matrix -->", 1)[1].strip().splitlines()
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert header == ["route group", "keys configured", "no key", "read key", "write key",
                      "wrong key"], header
    table = {}
    for row in rows[2:]:
        if not row.startswith("|"):
            break
        cells = [c.strip().strip("`") for c in row.strip().strip("|").split("|")]
        for sent, cell in zip(SENT, cells[2:]):
            table[(cells[0], cells[1], sent)] = cell
    return table


def test_readme_matrix_is_the_rule():
    table = readme_matrix()
    want = {(perm, name, sent): expected(perm, config, sent)
            for perm in (OPEN, READ, WRITE) for name, config in CONFIGS.items() for sent in SENT}
    assert table == want


# ----------------------------------------------------------------------------- the app
def seed(data_dir: Path) -> None:
    """Index 'ix' (100 items) and 'del-<key>' (one to delete per key sent), with no keys set;
    the configured app then opens the same directory."""
    with app_client(data_dir) as c:
        for name in ["ix", *(f"del-{sent}" for sent in SENT)]:
            assert c.post("/v1/indexes", json={"name": name, "bits": BITS}).status_code == 201
        codes = [format(i * 0x9E3779B97F4A7C15 % 2**64, "016x") for i in range(100)]
        r = c.post("/v1/indexes/ix/items", json={"ids": list(range(100)), "codes": codes})
        assert r.status_code == 200, r.text
        # snapshots of 'ix' under known names: 'ix-get.tar' to read, 'ix-<key>.tar' to delete
        snap = c.post("/v1/indexes/ix/snapshots").json()["snapshot"]
        registry = c.app.state.registry
        path = registry.snapshot_path(registry.get("ix"), snap)
        for name in ["get", *SENT]:
            shutil.copyfile(path, path.with_name(f"ix-{name}.tar"))
        path.unlink()
        # jobs: 'get' to read and cancel (a finished job: cancel is a no-op), one to delete per
        # key sent; an index per key sent to start one on
        for sent in SENT:
            assert c.post("/v1/indexes", json={"name": f"jobs-{sent}", "bits": BITS}
                          ).status_code == 201
        for name in ["get", *(f"del-{sent}" for sent in SENT)]:
            job = c.post("/v1/jobs", json={"index": "ix", "radius": 1}).json()
            while c.get(f"/v1/jobs/{job['id']}").json()["state"] == "running":
                time.sleep(0.02)
            JOB_IDS[name] = job["id"]


_fresh = itertools.count(10_000)
JOB_IDS: dict[str, str] = {}  # seed's jobs by use
#: a valid backup of an empty index (a restore's body is a backup file, not JSON)
EMPTY_BACKUP = backup.dump({"bits": BITS, "mode": "single"}, np.empty(0, dtype=np.int64),
                           np.empty((0, BITS // 64), dtype=np.uint64))

#: Every operation: (method, path template) -> (its group, written out here and in README, and
#: a function giving the request's (path, json body) for key ``sent``).
EXAMPLES = {
    ("GET", "/healthz"): (OPEN, lambda sent: ("/healthz", None)),
    ("GET", "/readyz"): (OPEN, lambda sent: ("/readyz", None)),
    ("GET", "/openapi.json"): (OPEN, lambda sent: ("/openapi.json", None)),
    ("GET", "/docs"): (OPEN, lambda sent: ("/docs", None)),
    ("GET", "/docs/oauth2-redirect"): (OPEN, lambda sent: ("/docs/oauth2-redirect", None)),
    ("GET", "/redoc"): (OPEN, lambda sent: ("/redoc", None)),
    ("GET", "/metrics"): (READ, lambda sent: ("/metrics", None)),
    ("GET", "/v1/indexes"): (READ, lambda sent: ("/v1/indexes", None)),
    ("GET", "/v1/indexes/{name}"): (READ, lambda sent: ("/v1/indexes/ix", None)),
    ("GET", "/v1/indexes/{name}/cost-model"): (READ, lambda sent: (
        "/v1/indexes/ix/cost-model", None)),
    ("GET", "/v1/indexes/{name}/sample"): (READ, lambda sent: ("/v1/indexes/ix/sample?n=5", None)),
    ("POST", "/v1/indexes/{name}/search"): (READ, lambda sent: (
        "/v1/indexes/ix/search", {"codes": [CODE], "max_distance": 1})),
    ("POST", "/v1/indexes/{name}/evaluate"): (READ, lambda sent: (
        "/v1/indexes/ix/evaluate", {"codes": [CODE], "relevant_ids": [[0]], "radius_max": 1,
                                    "ks": [1], "measure_queries": 0})),
    ("POST", "/v1/indexes"): (WRITE, lambda sent: (
        "/v1/indexes", {"name": f"new-{next(_fresh)}", "bits": BITS})),
    ("DELETE", "/v1/indexes/{name}"): (WRITE, lambda sent: (f"/v1/indexes/del-{sent}", None)),
    ("POST", "/v1/indexes/{name}/items"): (WRITE, lambda sent: (
        "/v1/indexes/ix/items", {"ids": [next(_fresh)], "codes": [CODE]})),
    ("POST", "/v1/indexes/{name}/items/delete"): (WRITE, lambda sent: (
        "/v1/indexes/ix/items/delete", {"ids": [99_999_999]})),
    ("POST", "/v1/indexes/{name}/merge"): (WRITE, lambda sent: ("/v1/indexes/ix/merge", None)),
    ("POST", "/v1/indexes/{name}/cost-model/calibrate"): (WRITE, lambda sent: (
        "/v1/indexes/ix/cost-model/calibrate", {"queries": 2, "max_distance": 1})),
    ("POST", "/v1/indexes/{name}/items/upsert"): (WRITE, lambda sent: (
        "/v1/indexes/ix/items/upsert", {"ids": [next(_fresh)], "codes": [CODE]})),
    ("POST", "/v1/indexes/{name}/items/dedup"): (WRITE, lambda sent: (
        "/v1/indexes/ix/items/dedup", {"codes": [CODE], "radius": 0})),
    ("POST", "/v1/jobs"): (WRITE, lambda sent: ("/v1/jobs", {"index": f"jobs-{sent}",
                                                             "radius": 0})),
    ("GET", "/v1/jobs"): (READ, lambda sent: ("/v1/jobs", None)),
    ("GET", "/v1/jobs/{job_id}"): (READ, lambda sent: (f"/v1/jobs/{JOB_IDS['get']}", None)),
    ("GET", "/v1/jobs/{job_id}/result"): (READ, lambda sent: (
        f"/v1/jobs/{JOB_IDS['get']}/result", None)),
    ("POST", "/v1/jobs/{job_id}/cancel"): (WRITE, lambda sent: (
        f"/v1/jobs/{JOB_IDS['get']}/cancel", None)),
    ("DELETE", "/v1/jobs/{job_id}"): (WRITE, lambda sent: (
        f"/v1/jobs/{JOB_IDS[f'del-{sent}']}", None)),
    ("POST", "/v1/indexes/{name}/items/get"): (READ, lambda sent: (
        "/v1/indexes/ix/items/get", {"ids": [0]})),
    ("PATCH", "/v1/indexes/{name}"): (WRITE, lambda sent: ("/v1/indexes/ix", {"mode": "auto"})),
    ("GET", "/v1/indexes/{name}/backup"): (READ, lambda sent: ("/v1/indexes/ix/backup", None)),
    ("POST", "/v1/indexes/{name}/restore"): (WRITE, lambda sent: (
        f"/v1/indexes/rest-{next(_fresh)}/restore", EMPTY_BACKUP)),
    ("POST", "/v1/indexes/{name}/snapshots"): (WRITE, lambda sent: (
        "/v1/indexes/ix/snapshots", None)),
    ("GET", "/v1/indexes/{name}/snapshots"): (READ, lambda sent: (
        "/v1/indexes/ix/snapshots", None)),
    ("GET", "/v1/indexes/{name}/snapshots/{snapshot}"): (READ, lambda sent: (
        "/v1/indexes/ix/snapshots/ix-get.tar", None)),
    ("DELETE", "/v1/indexes/{name}/snapshots/{snapshot}"): (WRITE, lambda sent: (
        f"/v1/indexes/ix/snapshots/ix-{sent}.tar", None)),
    ("GET", "/v1/limits"): (READ, lambda sent: ("/v1/limits", None)),
    ("POST", "/v1/indexes/{name}/advise"): (READ, lambda sent: (
        "/v1/indexes/ix/advise", {"query_ids": [0], "holdout": False, "radius_max": 1,
                                  "resamples": 0, "repeats": 1})),
    ("GET", "/v1/audit"): (READ, lambda sent: ("/v1/audit", None)),
    ("GET", "/ui"): (OPEN, lambda sent: ("/ui", None)),
    ("GET", "/ui/static/{name}"): (OPEN, lambda sent: ("/ui/static/dashboard.css", None)),
    ("GET", "/ui/vendor/plotly.min.js"): (OPEN, lambda sent: ("/ui/vendor/plotly.min.js", None)),
    ("GET", "/ui/vendor/{name}"): (OPEN, lambda sent: ("/ui/vendor/plotly.css", None)),
    ("GET", "/v1/dashboard/session"): (READ, lambda sent: ("/v1/dashboard/session", None)),
    ("GET", "/v1/indexes/{name}/radius-profile"): (READ, lambda sent: (
        "/v1/indexes/ix/radius-profile?max_distance=1&queries=4", None)),
}


def operations(app) -> set[tuple[str, str]]:
    """Every (method, path) the app routes (HEAD rides on GET)."""
    return {(m, r.path) for r in flat_routes(app.routes) for m in (r.methods or ()) if m != "HEAD"}


def test_every_route_is_in_the_table_and_the_guard_agrees(tmp_path):
    """A new route must be added to EXAMPLES (and README) with its group; the guard's
    permission of every route (and of each README group list) is the table's."""
    app = make_app(tmp_path / "d")
    assert operations(app) == set(EXAMPLES), "add the new route to EXAMPLES (and README)"
    policy = access_policy(app)
    for (method, path), (group, _) in EXAMPLES.items():
        assert policy.permission(method, path) == group, (method, path)
    readme = (ROOT / "README.md").read_text().split("## Auth", 1)[1].split("<!-- auth", 1)[0]
    for group in (OPEN, READ, WRITE):
        listed = re.search(rf"\*\*{group}\*\*:(.*?)(?=\n- \*\*|\n\n)", readme, re.S).group(1)
        for (method, path), (g, _) in EXAMPLES.items():
            if g == group and path != "/docs/oauth2-redirect":
                assert f"`{path}`" in listed or f"{method} {path}`" in listed, (group, path)


def _headers(sent: str) -> dict:
    key = SENT[sent]
    return {} if key is None else {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_auth_matrix_every_route(tmp_path, config_name):
    """Every route x every key sent, under one configuration. A request the matrix refuses
    carries a body that is not even JSON: it must be refused before the body is parsed."""
    config = CONFIGS[config_name]
    seed(tmp_path / "d")
    failures = []
    with app_client(tmp_path / "d", **config) as c:
        for (method, template), (group, example) in sorted(EXAMPLES.items()):
            for sent in SENT:
                want = expected(group, config, sent)
                path, body = example(sent)
                headers = _headers(sent)
                kwargs = {"json": body} if body is not None else {}
                if isinstance(body, bytes):
                    kwargs = {"content": body}
                    headers["content-type"] = "application/octet-stream"
                if want != "2xx" and method == "POST":
                    kwargs = {"content": b"{not json"}
                    headers["content-type"] = "application/json"
                r = c.request(method, path, **kwargs, headers=headers)
                got = "2xx" if 200 <= r.status_code < 300 else str(r.status_code)
                if got != want:
                    failures.append((method, template, sent, want, r.status_code, r.text[:200]))
                elif want == "401":
                    assert r.headers["www-authenticate"] == "Bearer"
                    assert "Authorization: Bearer" in r.json()["detail"]
    assert not failures, "\n".join(map(str, failures))


def test_read_key_alone_never_opens_writes(tmp_path):
    """The bug of issue 10: with only BUCKETSEARCH_READ_KEY set, anyone could write."""
    seed(tmp_path / "d")
    writes = [op for op, (group, _) in EXAMPLES.items() if group == WRITE]
    assert len(writes) >= 6
    with app_client(tmp_path / "d", read_key=READ_KEY) as c:
        size = c.get("/v1/indexes/ix", headers=_headers("read")).json()["size"]
        for (method, template), sent in itertools.product(writes, SENT):
            path, body = EXAMPLES[(method, template)][1](sent)
            kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
            r = c.request(method, path, **kwargs, headers=_headers(sent))
            assert r.status_code == 403, (method, path, sent, r.text)
            assert "BUCKETSEARCH_API_KEY" in r.json()["detail"]
            assert "writes are disabled" in r.json()["detail"]
        info = c.get("/v1/indexes", headers=_headers("read")).json()["indexes"]
        assert {i["name"] for i in info} == {"ix", *(f"{kind}-{s}" for s in SENT
                                                     for kind in ("del", "jobs"))}
        assert len(c.get("/v1/jobs", headers=_headers("read")).json()["jobs"]) == 1 + len(SENT)
        assert c.get("/v1/indexes/ix", headers=_headers("read")).json()["size"] == size


def test_unknown_routes_do_not_bypass_auth(tmp_path):
    with app_client(tmp_path / "d", api_key=WRITE_KEY, read_key=READ_KEY) as c:
        for method, path in [("POST", "/v1/indexes/ix/unknown"), ("PUT", "/v1/indexes/ix"),
                             ("PATCH", "/v1/indexes"), ("GET", "/v1/secret"),
                             ("GET", "/nothing-here"), ("POST", "/healthz"),
                             ("DELETE", "/v1/indexes/ix/items"), ("GET", "/v1/indexes/")]:
            r = c.request(method, path, content=b"{not json",
                          headers={"content-type": "application/json"})
            assert r.status_code == 401, (method, path, r.status_code)
            r = c.request(method, path, headers=_headers("read"))
            want_read_ok = method in ("GET", "HEAD")
            assert (r.status_code not in (401, 403)) == want_read_ok, (method, path, r.status_code)
            r = c.request(method, path, headers=_headers("write"))
            assert r.status_code not in (401, 403), (method, path)


@pytest.mark.parametrize("header", ["Bearer", "Bearer ", "Basic dy1TZWNyZXRfMQ==",
                                    f"Token {WRITE_KEY}", WRITE_KEY, f"Bearer {WRITE_KEY} x",
                                    f"Bearer {WRITE_KEY}x", f"Bearer {WRITE_KEY[:-1]}"])
def test_malformed_and_near_miss_keys(tmp_path, header):
    with app_client(tmp_path / "d", api_key=WRITE_KEY) as c:
        r = c.post("/v1/indexes", json={"name": "a", "bits": 8},
                   headers={"Authorization": header})
        assert r.status_code in (401, 403), r.text
        if r.status_code == 401:
            assert r.headers["www-authenticate"] == "Bearer"
        # the scheme is case-insensitive, spaces around the token are fine
        r = c.post("/v1/indexes", json={"name": "b", "bits": 8},
                   headers={"Authorization": f"  bEaReR   {WRITE_KEY} "})
        assert r.status_code == 201, r.text


def test_key_is_checked_before_the_body(tmp_path):
    """A 64 MB Content-Length, a malformed body or a slow body: none is read without the key."""
    with app_client(tmp_path / "d", api_key=WRITE_KEY, max_body_bytes=4096) as c:
        for path in ["/v1/indexes", "/v1/indexes/ix/items", "/v1/indexes/ix/items/delete",
                     "/v1/indexes/ix/cost-model/calibrate"]:
            r = c.post(path, content=b"x" * 10_000, headers={"content-type": "application/json"})
            assert r.status_code == 401, (path, r.status_code)
            assert r.headers.get("connection") == "close"  # the refused body is not drained
            r = c.post(path, content=b"[1, 2", headers={"content-type": "application/json"})
            assert r.status_code == 401, (path, r.status_code)

            def never():  # a body that would fail the test if it were read
                raise AssertionError("the body was read before the key was checked")
                yield b""
            r = c.post(path, content=never(), headers={"content-type": "application/json"})
            assert r.status_code == 401


def test_dependencies_enforce_without_the_guard(tmp_path):
    """ReadAuth/WriteAuth are a backstop: an app built without the guard still checks."""
    seed(tmp_path / "d")
    app = make_app(tmp_path / "d", read_key=READ_KEY)
    app.user_middleware = [m for m in app.user_middleware if m.cls is not Guard]
    with TestClient(app) as c:
        wait_ready(c)
        assert c.get("/v1/indexes").status_code == 401
        assert c.get("/v1/indexes", headers=_headers("wrong")).status_code == 403
        assert c.get("/v1/indexes", headers=_headers("read")).status_code == 200
        r = c.post("/v1/indexes/ix/merge", headers=_headers("read"))
        assert r.status_code == 403 and "BUCKETSEARCH_API_KEY" in r.json()["detail"]


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_openapi_documents_exactly_the_enforced_security(tmp_path, config_name):
    config = CONFIGS[config_name]
    app = make_app(tmp_path / "d", **config)
    with TestClient(app) as c:
        spec = c.get("/openapi.json").json()
    documented = {(m.upper(), p) for p, item in spec["paths"].items()
                  for m, op in item.items() if op.get("security")}
    protected = {(m, p) for (m, p), (group, _) in EXAMPLES.items()
                 if p in spec["paths"] and expected(group, config, "none") != "2xx"}
    assert documented == protected
    schemes = spec.get("components", {}).get("securitySchemes", {})
    assert ("HTTPBearer" in schemes) == bool(config)
    for method, path in documented:
        op = spec["paths"][path][method.lower()]
        assert {"401", "403"} <= set(op["responses"])


def test_keys_must_be_usable(tmp_path):
    for bad in ["", "two words", " "]:
        with pytest.raises(ValueError) as err:
            Settings(data_dir=tmp_path, api_key=bad)
        assert "unset the variable" in str(err.value)
        if bad.strip():
            assert bad not in str(err.value)  # a rejected key is not echoed into a log


def test_a_key_set_at_runtime_takes_effect(tmp_path):
    """The guard caches key digests per settings object and key: a change is seen at once."""
    with app_client(tmp_path / "d") as c:
        assert c.get("/v1/indexes").status_code == 200
        c.app.state.settings.read_key = Settings(data_dir=tmp_path, read_key=READ_KEY).read_key
        assert c.get("/v1/indexes").status_code == 401
        assert c.get("/v1/indexes", headers=_headers("read")).status_code == 200
        assert c.post("/v1/indexes", json={"name": "x", "bits": 8}).status_code == 403
