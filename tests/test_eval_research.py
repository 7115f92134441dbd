"""``bucketsearch eval`` research modes end to end (in-process, real files): --tables,
--tables-grid, --frontier, --compare, --preset, --qrels and the TREC export; the Pareto
frontier against a brute-force twin."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_buckets import naive_metrics, naive_retrieved

from bucketsearch.cli import main
from bucketsearch.index.evaluation import buckets, frontier
from bucketsearch.index.evaluation.relevance import from_labels


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("research")
    rng = np.random.default_rng(0)
    db = rng.integers(0, 2, (600, 12))
    pick = rng.integers(0, 600, 30)
    q = db[pick] ^ (rng.random((30, 12)) < 0.1)
    yb = 2 * db[:, 0] + db[:, 1]     # labels that the codes carry: near codes share them
    yq = yb[pick]
    noisy = db ^ (rng.random(db.shape) < 0.3)
    paths = {"dir": d}
    for name, arr in (("db", db), ("q", q), ("yb", yb), ("yq", yq), ("yq_other", yq[::-1])):
        paths[name] = str(d / f"{name}.npy")
        np.save(paths[name], arr)
    paths["good"] = str(d / "good.npz")
    np.savez(paths["good"], db_codes=db, query_codes=q)
    paths["noisy"] = str(d / "noisy.npz")
    np.savez(paths["noisy"], db_codes=noisy, query_codes=q)
    return paths


def _eval(f, *extra, **over):
    base = {"--db-codes": f["db"], "--query-codes": f["q"], "--db-labels": f["yb"],
            "--query-labels": f["yq"]}
    base.update(over)
    argv = ["eval"]
    for k, v in base.items():
        if v is not None:
            argv += [k, v]
    return main(argv + list(extra))


def test_tables_json_matches_the_library(files, capsys):
    out = str(files["dir"] / "tables.json")
    assert _eval(files, "--tables", "4,3", "--tables", "6,2", "--table-radii", "0,1",
                 "--json", out) == 0
    printed = capsys.readouterr().out
    assert "hashtable buckets" in printed and printed.count("\n  4   3 ") == 2
    res = json.loads(open(out).read())
    want = buckets.evaluate_tables(np.load(files["db"]), np.load(files["q"]),
                                   from_labels(np.load(files["yq"]), np.load(files["yb"])),
                                   [(4, 3), (6, 2)], measure_radii=())
    for got, ref in zip(res["configs"], want["configs"]):
        assert (got["K"], got["L"]) == (ref["K"], ref["L"])
        assert got["f_beta_micro"] == pytest.approx(ref["f_beta_micro"])
        assert [m["radius"] for m in got["measured"]] == [0, 1]
        assert got["measured"][0]["retrieved_mean"] == pytest.approx(ref["retrieved_mean"][0])


def test_tables_grid_covers_every_configuration(files, capsys):
    out = str(files["dir"] / "grid.json")
    assert _eval(files, "--tables-grid", "--table-radii", "none", "--json", out) == 0
    res = json.loads(open(out).read())
    assert [(c["K"], c["L"]) for c in res["configs"]] == buckets.full_grid(12)
    assert all(c["measured"] == [] for c in res["configs"])


def test_frontier_writes_plot_json_and_consistent_marks(files, capsys):
    png, out = files["dir"] / "front.png", str(files["dir"] / "front.json")
    assert _eval(files, "--frontier", str(png), "--frontier-radii", "0,1,2", "--json", out) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = json.loads(open(out).read())
    modes = {p["mode"] for p in res["points"]}
    assert modes == {"single", "mih", "auto", "scan", "tables"}
    # default tables: every K dividing Q = 12 with L = 12 / K
    assert {(p["K"], p["L"]) for p in res["points"] if p["mode"] == "tables"} == \
        {(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)}
    # a Hamming-ball point has the same quality whatever engine answers it
    by = {(p["mode"], p["radius"]): p["quality"] for p in res["points"] if p["K"] is None}
    for r in range(3):
        assert by[("single", r)] == by[("mih", r)] == by[("scan", r)] == by[("auto", r)]
    cost = [p["cost_ns"] for p in res["points"]]
    quality = [np.nan if p["quality"] is None else p["quality"] for p in res["points"]]
    assert [p["pareto"] for p in res["points"]] == naive_pareto(cost, quality)
    assert len(res["ramap"]["ramap_measured"]) == 3
    assert res["ramap"]["ramap_measured"][0] == pytest.approx(res["ramap"]["ramap_modeled"][0])


def naive_pareto(cost, quality):
    """Brute force: on the frontier unless another point is at least as cheap and at least as
    good with one strict, or is identical and listed first."""
    out = []
    for i, (c, q) in enumerate(zip(cost, quality)):
        if np.isnan(q):
            out.append(False)
            continue
        dominated = any(
            not np.isnan(q2) and c2 <= c and q2 >= q and (c2 < c or q2 > q or j < i)
            for j, (c2, q2) in enumerate(zip(cost, quality)) if j != i)
        out.append(not dominated)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.one_of(st.integers(0, 5).map(float),
                                                       st.just(float("nan")))),
                min_size=1, max_size=12))
def test_pareto_matches_brute_force(points):
    cost = [float(c) for c, _ in points]
    quality = [q for _, q in points]
    assert frontier.pareto(cost, quality).tolist() == naive_pareto(cost, quality)


@settings(max_examples=8, deadline=None)
@given(st.integers(2, 9), st.integers(0, 2**31 - 1))
def test_frontier_points_match_brute_force(bits, seed):
    """Every point's retrieved set, micro P / R and F1 from literal sets: the Hamming ball for
    the engines' points, the union of segment collisions for the (K, L) points."""
    rng = np.random.default_rng(seed)
    db = rng.integers(0, 2, (60, bits))
    q = db[rng.integers(0, 60, 5)] ^ (rng.random((5, bits)) < 0.2)
    yb, yq = rng.integers(0, 3, 60), rng.integers(0, 3, 5)
    res = frontier.frontier(db, q, from_labels(yq, yb), radii=range(bits + 1),
                            configs=buckets.full_grid(bits), table_radii=(0, 1))
    gains = (yq[:, None] == yb[None, :]).astype(float)
    dist = (q[:, None, :] != db[None, :, :]).sum(2)
    for p in res["points"]:
        got = (dist <= p["radius"]) if p["K"] is None else \
            naive_retrieved(db, q, p["K"], p["L"], p["radius"])
        want = naive_metrics(got, gains)
        assert p["retrieved_mean"] == pytest.approx(want["retrieved_mean"]), p["label"]
        assert p["precision_micro"] == pytest.approx(want["precision_micro"]), p["label"]
        assert p["recall_micro"] == pytest.approx(want["recall_micro"]), p["label"]
        assert p["quality"] == pytest.approx(want["f_beta_micro"]), p["label"]
    cost = [p["cost_ns"] for p in res["points"]]
    assert [p["pareto"] for p in res["points"]] == naive_pareto(cost, [p["quality"]
                                                                      for p in res["points"]])


def test_compare_runs_and_codes(files, capsys):
    run = str(files["dir"] / "run_good.json")
    assert _eval(files, "--per-query", "--json", run) == 0
    capsys.readouterr()
    out, tex = str(files["dir"] / "cmp.json"), files["dir"] / "cmp.tex"
    rc = main(["eval", "--compare", f"exact={run}", files["noisy"], "--db-labels", files["yb"],
               "--query-labels", files["yq"], "--compare-metric", "ranking.map_tie_aware@100",
               "--resamples", "2000", "--latex", str(tex), "--json", out])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "exact" in printed and "noisy" in printed
    res = json.loads(open(out).read())
    (pair,) = res["pairs"]
    assert (pair["a"], pair["b"], pair["n"]) == ("exact", "noisy", 30)
    assert pair["diff"] > 0 and pair["significant"]       # 30% bit noise hurts, clearly
    assert r"\textbf{" in tex.read_text()


def test_the_compare_command_is_eval_compare(files, capsys):
    """``bucketsearch compare A B`` gives what ``eval --compare A B`` gives."""
    outs = [str(files["dir"] / f"cmp{n}.json") for n in (1, 2)]
    common = ["--db-labels", files["yb"], "--query-labels", files["yq"], "--resamples", "500"]
    assert main(["compare", files["good"], files["noisy"], *common, "--json", outs[0]]) == 0
    assert main(["eval", "--compare", files["good"], files["noisy"], *common,
                 "--json", outs[1]]) == 0
    first, second = (json.loads(open(o).read()) for o in outs)
    assert first["pairs"] == second["pairs"] and len(first["pairs"]) == 1
    assert main(["compare", files["good"], *common]) == 2  # one run: a clear error
    assert "--compare needs at least 2 runs" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--compare", "{good}"], "--compare needs at least 2 runs"),
    (["--compare", "{good}", "{noisy}", "--compare-metric", "ranking.nope@10"],
     "no 'nope' in the per-query values"),
    (["--compare", "{good}", "{noisy}", "--compare-metric", "ranking.map_tie_aware"],
     "pick one with @"),
    (["--compare", "{good}", "{dir}/missing.npz"], "no such file"),
    (["--tables", "5"], "--tables must be K,L"),
    (["--tables", "7,2"], "K x L must be <= Q = 12"),
    (["--frontier", "{dir}/x.png", "--frontier-radii", "13"],
     "--frontier-radii must be comma-separated integers in [0, 12]"),
    (["--table-radii", "0,x", "--tables", "4,3"], "--table-radii must be comma-separated"),
    (["--tables", "4,3", "--radius-exclusive"], "--radius-exclusive) does not apply"),
    (["--compare", "{good}", "{noisy}", "--resamples", "0"], "--resamples must be an integer >= 1"),
    (["--compare", "{good}", "{noisy}", "--alpha", "1"], "--alpha must be in (0, 1), got 1.0"),
    (["--trec-run", "{dir}/r.txt", "--trec-depth", "0"], "--trec-depth must be an integer >= 1"),
])
def test_bad_research_input_one_clear_line(files, capsys, extra, message):
    extra = [e.format(**files) for e in extra]
    rc = _eval(files, *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err


def test_compare_refuses_different_ground_truths(files, capsys):
    a, b = str(files["dir"] / "gt_a.json"), str(files["dir"] / "gt_b.json")
    assert _eval(files, "--per-query", "--json", a) == 0
    assert _eval(files, "--per-query", "--json", b, **{"--query-labels": files["yq_other"]}) == 0
    capsys.readouterr()
    assert main(["eval", "--compare", a, b]) == 2
    assert "different ground truths" in capsys.readouterr().err


def test_preset_prints_choices_and_headline(files, capsys):
    out = str(files["dir"] / "preset.json")
    assert _eval(files, "--preset", "deephash-pytorch", "--k", "10,50",
                 "--ap-denominator", "all-relevant", "--json", out) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("preset deephash-pytorch: DeepHash-pytorch")
    assert "np.argsort(hamm)" in printed and "overrides the preset's 'relevant-in-topk'" in printed
    assert "preset deephash-pytorch headline:" in printed and "ranking.map_ranked: k=[10, 50]" \
        in printed
    res = json.loads(open(out).read())
    assert res["preset"] == "deephash-pytorch"
    assert res["conventions"]["ap_denominator"] == "all-relevant"   # the explicit flag wins


def test_trec_files_and_qrels_ground_truth(files, capsys):
    run, qrels = files["dir"] / "run.txt", files["dir"] / "qrels.txt"
    ref = str(files["dir"] / "labels.json")
    assert _eval(files, "--trec-run", str(run), "--trec-qrels", str(qrels), "--trec-depth", "50",
                 "--json", ref) == 0
    lines = [x for x in run.read_text().splitlines() if not x.startswith("#")]
    assert len(lines) == 30 * 50 and lines[0].split()[1] == "Q0"
    via = str(files["dir"] / "qrels.json")
    assert _eval(files, "--json", via, **{"--db-labels": None, "--query-labels": None,
                                          "--qrels": str(qrels)}) == 0
    a, b = json.loads(open(ref).read()), json.loads(open(via).read())
    assert a["map_all"] == b["map_all"] and a["radius"]["ramap"] == b["radius"]["ramap"]
