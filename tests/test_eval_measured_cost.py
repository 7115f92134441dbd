"""Issue 18 items 4-5: ``auto`` is the default mode of a served index, and ``bucketsearch eval
--measured-cost`` reads a list of times, the server's ``/cost-model`` JSON and the load-test JSON,
needing only the radii 0..--radius-max. Issue 12: from both JSONs ``T(R)`` is the cost model's
``radii[R].measured_cumulative.p50_ns`` (the p50 of each query's T(R), not a sum of per-ring
p50s); the shapes before issue 12 are refused with a message."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import app_client

from bucketsearch.cli import main
from bucketsearch.index.codes import pack_bits, to_hex
from bucketsearch.loadtest.report import build_report
from bucketsearch.loadtest.stats import LoadStats, QueryStats, RequestResult

BITS = 12  # the eval codes; the served index is 64-bit (the cost is measured on another index)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mcost")
    rng = np.random.default_rng(0)
    db = rng.integers(0, 2, (400, BITS))
    q = db[rng.integers(0, 400, 30)] ^ (rng.random((30, BITS)) < 0.15)
    paths = {"dir": d}
    for name, arr in (("db", db), ("q", q), ("yb", rng.integers(0, 5, 400)),
                      ("yq", rng.integers(0, 5, 30))):
        paths[name] = str(d / f"{name}.npy")
        np.save(paths[name], arr)
    return paths


def _eval(files, cost_path, radius_max, name):
    out = files["dir"] / f"{name}.json"
    argv = ["eval", "--db-codes", files["db"], "--query-codes", files["q"],
            "--db-labels", files["yb"], "--query-labels", files["yq"],
            "--measured-cost", str(cost_path), "--json", str(out)]
    if radius_max is not None:
        argv += ["--radius-max", str(radius_max)]
    rc = main(argv)
    return rc, (json.loads(out.read_text()) if rc == 0 else None)


def _expected_ramap(prec_macro, cost):
    """RAMAP@R = 1/(R+1) sum_r P_macro(r) * T(0) / T(r) (the mean over queries is linear)."""
    return [sum(prec_macro[r] * cost[0] / cost[r] for r in range(big + 1)) / (big + 1)
            for big in range(len(cost))]


# -- (a) a plain list of times per radius -----------------------------------------------------
@pytest.mark.parametrize("suffix", [".json", ".npy"])
def test_list_needs_only_the_reported_radii(files, suffix, capsys):
    cost = [100.0, 250.0, 900.0, 4000.0]  # radii 0..3 only (Q = 12 used to demand 13 values)
    path = files["dir"] / f"four{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(cost))
    else:
        np.save(path, np.array(cost))
    rc, res = _eval(files, path, 3, f"list{suffix[1:]}")
    assert rc == 0
    r = res["radius"]
    assert r["R"] == [0, 1, 2, 3] and len(r["ramap_measured"]) == 4
    assert r["ramap_measured"] == pytest.approx(_expected_ramap(r["precision_macro"], cost))
    assert res["measured_cost"]["T"] == cost
    assert "the times per radius given in" in capsys.readouterr().out


def test_too_few_values_name_the_count(files, capsys):
    path = files["dir"] / "three.json"
    path.write_text(json.dumps([1.0, 2.0, 3.0]))
    assert _eval(files, path, 3, "three")[0] == 2
    err = capsys.readouterr().err
    assert "3 values, but radii 0..3 need 4" in err and "--radius-max 2" in err


def test_unknown_json_shape_is_refused(files, capsys):
    path = files["dir"] / "odd.json"
    path.write_text(json.dumps({"hello": 1}))
    assert _eval(files, path, 2, "odd")[0] == 2
    assert "not a list of times per radius" in capsys.readouterr().err


# -- (b) the server's cost-model JSON; the default mode ---------------------------------------
@pytest.fixture(scope="module")
def server_client(tmp_path_factory):
    with app_client(tmp_path_factory.mktemp("srv") / "data") as c:
        yield c


def test_default_mode_is_auto(server_client):
    c = server_client
    r = c.post("/v1/indexes", json={"name": "dflt", "bits": 64})
    assert r.status_code == 201, r.text
    assert r.json()["mode"] == "auto"
    assert c.get("/v1/indexes/dflt").json()["mode"] == "auto"
    spec = c.get("/openapi.json").json()
    mode = spec["components"]["schemas"]["CreateIndex"]["properties"]["mode"]
    assert mode["default"] == "auto" and "until their engines land" not in json.dumps(spec)
    # an explicit mode is still honoured
    r = c.post("/v1/indexes", json={"name": "one", "bits": 64, "mode": "single"})
    assert r.status_code == 201 and r.json()["mode"] == "single"


def test_server_cost_model_json(server_client, files, capsys):
    c = server_client
    assert c.post("/v1/indexes", json={"name": "cm", "bits": 64,
                                       "mode": "single"}).status_code == 201
    rng = np.random.default_rng(5)
    words = pack_bits(rng.integers(0, 2, (2000, 64), dtype=np.uint8))
    r = c.post("/v1/indexes/cm/items", json={"ids": list(range(2000)),
                                             "codes": to_hex(words, 64)})
    assert r.status_code == 200, r.text
    assert c.post("/v1/indexes/cm/merge").status_code == 200
    for _ in range(3):
        r = c.post("/v1/indexes/cm/search", json={"codes": to_hex(words[:40], 64),
                                                  "max_distance": 2, "stats": True})
        assert r.status_code == 200, r.text
    model = c.get("/v1/indexes/cm/cost-model").json()
    assert [x["radius"] for x in model["radii"]] == [0, 1, 2]
    path = files["dir"] / "cost-model.json"
    path.write_text(json.dumps(model))

    rc, res = _eval(files, path, 2, "server")
    assert rc == 0
    # T(R): the p50 over queries of each query's cumulative lookup time (not a sum of p50s)
    expected_t = [x["measured_cumulative"]["p50_ns"] for x in model["radii"]]
    assert expected_t[0] < expected_t[1] < expected_t[2]
    assert res["measured_cost"]["T"] == pytest.approx(expected_t)
    assert "from the server's cost-model of index 'cm'" in res["measured_cost"]["source"]
    r = res["radius"]
    assert r["ramap_measured"] == pytest.approx(_expected_ramap(r["precision_macro"],
                                                                expected_t))
    out = capsys.readouterr().out
    assert "measured p50 of T(R) (per-query lookup ns of the ball up to R) from the server's" \
        in out

    # radius 3 was never measured: the error names it and the radius-max that would work
    assert _eval(files, path, 3, "server3")[0] == 2
    err = capsys.readouterr().err
    assert "no measured value for radius 3" in err and "--radius-max 2" in err

    # the shape before issue 12 (per-ring p50s only) is refused, saying why
    old = {"index": "cm", "radii": [{"radius": x["radius"], "measured": x["measured"]}
                                    for x in model["radii"]]}
    path.write_text(json.dumps(old))
    assert _eval(files, path, 2, "server-old")[0] == 2
    err = capsys.readouterr().err
    assert "has no measured_cumulative per radius" in err and "before issue 12" in err


# -- (c) the load-test JSON ---------------------------------------------------------------------
def _loadtest_report(stats: bool = True) -> dict:
    """Radius classes 0..3 of 20 queries each; ring j of every query takes 1000 (j + 1) ns, so
    each query's T(R) is 1, 3, 6, 10 us whatever its class."""
    records = []
    for radius in range(4):
        rings = [{"radius": j, "probes": math.comb(64, j), "nonempty_buckets": int(j == 0),
                  "empty_buckets": math.comb(64, j) - (j == 0), "items": int(j == 0),
                  "lookup_ns": 1_000 * (j + 1)} for j in range(radius + 1)]
        server = [QueryStats.from_server(rings)] if stats else None
        for i in range(20):
            t = i * 100_000
            records.append(RequestResult(f"r{radius}", radius, None, 1, t, t, t,
                                         t + 50_000, 200, None, 0, server))
    stats_ = LoadStats().add_all(records)
    return build_report(stats_, {"mode": "open", "rate": 100.0, "index": "x", "batch": 1,
                                 "stats": stats}, 64, {"t0_ns": 5.0})


def test_loadtest_json(files, capsys):
    report = _loadtest_report()
    path = files["dir"] / "loadtest-report.json"
    path.write_text(json.dumps(report))
    rc, res = _eval(files, path, 3, "load")
    assert rc == 0
    expected_t = [x["measured_cumulative"]["p50_ns"] for x in report["model"]["radii"]]
    # the p50 of each query's lookup time of the ball up to R: 1, 3, 6, 10 us exactly
    assert expected_t == [1_000, 3_000, 6_000, 10_000]
    assert res["measured_cost"]["T"] == pytest.approx(expected_t)
    r = res["radius"]
    assert r["ramap_measured"] == pytest.approx(_expected_ramap(r["precision_macro"],
                                                                expected_t))
    assert "from the load-test report's cost model (80 sampled queries)" in \
        capsys.readouterr().out
    # the default radius-max (min(Q, 10) = 10) needs radius 4: named in the error
    assert _eval(files, path, None, "load10")[0] == 2
    err = capsys.readouterr().err
    assert "no measured value for radius 4, 5, 6, 7, 8, 9, 10" in err and "--radius-max 3" in err


def test_loadtest_json_without_stats_or_of_the_old_shape_is_refused(files, capsys):
    path = files["dir"] / "loadtest-nostats.json"
    path.write_text(json.dumps(_loadtest_report(stats=False)))
    assert _eval(files, path, 2, "nostats")[0] == 2
    err = capsys.readouterr().err
    assert "has no server timings" in err and "--no-stats" in err
    old = _loadtest_report()
    old["model"] = {"available": True, "t0_ns": 5.0, "paper_fit": {}, "extended_fit": {}}
    path.write_text(json.dumps(old))
    assert _eval(files, path, 2, "oldshape")[0] == 2
    assert "shape before issue 12" in capsys.readouterr().err
