"""``bucketsearch eval`` and ``bucketsearch reproduce`` end to end (in-process)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bucketsearch.cli import main

RADIUS_KEYS = ["R", "precision_macro", "recall_macro", "precision_micro", "recall_micro",
               "f1_macro", "ramap", "empty_ball_queries", "mlgap"]
RANKING_KEYS = ["k", "map_tie_aware", "map_best", "map_worst", "map_ranked",
                "precision_tie_aware", "recall_tie_aware", "ndcg_tie_aware"]
MAP_ALL_KEYS = ["tie_aware", "best", "worst", "ranked"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval")
    rng = np.random.default_rng(0)
    db = rng.integers(0, 2, (400, 12))
    q = db[rng.integers(0, 400, 30)] ^ (rng.random((30, 12)) < 0.15)
    yb = rng.integers(0, 5, 400)
    yq = rng.integers(0, 6, 30)  # class 5 has no relevant item in the database
    paths = {}
    for name, arr in (("db", db), ("q", q), ("yb", yb), ("yq", yq),
                      ("q_pm", np.where(q > 0, 1, -1)), ("q_bad", q * 2),
                      ("q_short", q[:, :10]), ("yb_short", yb[:-1]),
                      ("mh_b", (rng.random((400, 4)) < 0.3).astype(int)),
                      ("mh_q", (rng.random((30, 4)) < 0.3).astype(int))):
        paths[name] = str(d / f"{name}.npy")
        np.save(paths[name], arr)
    paths["dir"] = d
    return paths


def _args(f, **over):
    base = {"--db-codes": f["db"], "--query-codes": f["q"], "--db-labels": f["yb"],
            "--query-labels": f["yq"]}
    base.update(over)
    out = ["eval"]
    for k, v in base.items():
        if v is not None:
            out += [k, v]
    return out


def test_json_keys_and_per_query_shapes(files, capsys):
    out = str(files["dir"] / "out.json")
    rc = main(_args(files, **{"--radius-max": "4", "--k": "5,50", "--json": out}) +
              ["--per-query"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "RAMAP" in printed and "MAP@all" in printed
    res = json.loads(open(out).read())
    for key in ("bits", "n_db", "n_queries", "conventions", "auprc"):
        assert key in res
    assert res["bits"] == 12 and res["n_db"] == 400 and res["n_queries"] == 30
    assert res["conventions"]["ap_denominator"] == "all-relevant"
    for key in RADIUS_KEYS:
        assert len(res["radius"][key]) == 5, key
    for key in RANKING_KEYS:
        assert len(res["ranking"][key]) == 2, key
    for key in MAP_ALL_KEYS:
        assert isinstance(res["map_all"][key], float)
    pq = res["per_query"]
    assert len(pq["radius"]["ramap"]) == 30 and len(pq["radius"]["ramap"][0]) == 5
    assert len(pq["map_all"]["tie_aware"]) == 30
    assert len(pq["ranking"]["map_tie_aware"]) == 30 and len(pq["ranking"]["map_tie_aware"][0]) == 2
    # the per-query values average to the reported means
    assert np.mean(pq["map_all"]["tie_aware"]) == pytest.approx(res["map_all"]["tie_aware"])
    assert np.mean(pq["radius"]["ramap"], axis=0) == pytest.approx(res["radius"]["ramap"])


def test_exclude_gives_nulls_and_counts(files):
    out = str(files["dir"] / "excl.json")
    assert main(_args(files, **{"--no-relevant": "exclude", "--json": out}) + ["--per-query"]) == 0
    res = json.loads(open(out).read())
    n_none = sum(v is None for v in res["per_query"]["map_all"]["tie_aware"])
    assert n_none == res["n_excluded"] == res["n_no_relevant"] > 0
    vals = [v for v in res["per_query"]["map_all"]["tie_aware"] if v is not None]
    assert np.mean(vals) == pytest.approx(res["map_all"]["tie_aware"])


def test_measured_cost_adds_ramap_measured(files):
    cost = files["dir"] / "cost.json"
    cost.write_text(json.dumps([3.0 * (r + 1) for r in range(13)]))
    out = str(files["dir"] / "cost_out.json")
    assert main(_args(files, **{"--measured-cost": str(cost), "--radius-max": "3",
                                "--json": out})) == 0
    r = json.loads(open(out).read())["radius"]
    assert r["ramap_measured"][0] == pytest.approx(r["ramap"][0])  # radius 0 costs 1 in both
    prec = r["precision_macro"]
    assert r["ramap_measured"][1] == pytest.approx((prec[0] + prec[1] / 2) / 2)


def test_pm1_codes_graded_multihot_and_plot(files):
    out = str(files["dir"] / "pm.json")
    png = files["dir"] / "plot.png"
    assert main(_args(files, **{"--query-codes": files["q_pm"], "--json": out,
                                "--plot": str(png)})) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ref = str(files["dir"] / "ref.json")
    main(_args(files, **{"--json": ref}))
    assert json.loads(open(out).read())["map_all"] == json.loads(open(ref).read())["map_all"]
    g = str(files["dir"] / "graded.json")
    assert main(_args(files, **{"--db-labels": files["mh_b"], "--query-labels": files["mh_q"],
                                "--json": g}) + ["--graded"]) == 0
    assert json.loads(open(g).read())["graded"] is True


@pytest.mark.parametrize("over, message", [
    ({"--query-codes": "q_bad"}, "values must be in {0,1} or {-1,+1}"),
    ({"--query-codes": "q_short"}, "Q = 12 bits but query codes have Q = 10"),
    ({"--db-labels": "yb_short"}, "--db-labels has 399 rows"),
    ({"--db-codes": "missing"}, "no such file"),
    ({"--radius-max": "13"}, "--radius-max must be in [0, 12]"),
    ({"--k": "10,x"}, "--k must be comma-separated"),
    ({"--json": "no_folder"}, "--json: the folder of"),
    ({"--plot": "a_folder"}, "is a folder; give a file name"),
])
def test_bad_input_one_clear_line(files, capsys, over, message):
    special = {"missing": str(files["dir"] / "nope.npy"),
               "no_folder": str(files["dir"] / "nope" / "out.json"), "a_folder": str(files["dir"])}
    over = {k: files.get(v, special.get(v, v)) for k, v in over.items()}
    rc = main(_args(files, **over))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0
    assert len(err) == 1 and message in err[0], err


def test_reproduce_claims_pass(capsys):
    assert main(["reproduce"]) == 0
    out = capsys.readouterr().out
    assert "Table 2" in out and "Table 3" in out
    assert out.count("[PASS]") == 7 and "[FAIL]" not in out


def test_other_ground_truths_match_labels(files):
    # relevant pairs and a relevance matrix built from the labels give the labels' numbers
    yb, yq = np.load(files["yb"]), np.load(files["yq"])
    g = (yq[:, None] == yb[None, :]).astype(float)
    np.save(files["dir"] / "g.npy", g)
    np.save(files["dir"] / "pairs.npy", np.argwhere(g > 0))
    outs = {}
    for name, over in (("labels", {}),
                       ("matrix", {"--db-labels": None, "--query-labels": None,
                                   "--relevance-matrix": str(files["dir"] / "g.npy")}),
                       ("pairs", {"--db-labels": None, "--query-labels": None,
                                  "--relevant-pairs": str(files["dir"] / "pairs.npy")})):
        out = str(files["dir"] / f"gt_{name}.json")
        assert main(_args(files, **over, **{"--json": out})) == 0
        outs[name] = json.loads(open(out).read())
    for name in ("matrix", "pairs"):
        assert outs[name]["map_all"] == outs["labels"]["map_all"]
        assert outs[name]["radius"]["ramap"] == outs["labels"]["radius"]["ramap"]


def test_epsilon_ball_from_features(files, capsys):
    rng = np.random.default_rng(2)
    np.save(files["dir"] / "xb.npy", rng.standard_normal((400, 6)))
    np.save(files["dir"] / "xq.npy", rng.standard_normal((30, 6)))
    out = str(files["dir"] / "eps.json")
    assert main(_args(files, **{"--db-labels": None, "--query-labels": None,
                                "--db-features": str(files["dir"] / "xb.npy"),
                                "--query-features": str(files["dir"] / "xq.npy"),
                                "--json": out})) == 0
    assert json.loads(open(out).read())["n_queries"] == 30
    rc = main(_args(files, **{"--relevance-matrix": str(files["dir"] / "xb.npy")}))
    assert rc != 0 and "exactly one ground truth" in capsys.readouterr().err
