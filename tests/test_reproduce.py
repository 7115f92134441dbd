"""``bucketsearch reproduce``: the paper's Table 3 pinned, the claims (with claim (e): no time
penalty, no difference between LSH and LSH-SE), and the real-data table with measured cost."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bucketsearch.cli import main
from bucketsearch.index.evaluation import reproduce as rp
from bucketsearch.index.evaluation.datasets import synthetic_cifar


def test_table3_all_four_rows_pinned():
    rows = rp.table3_rows()
    # LSH as printed in the paper; SE / DE from the same precisions at Q + s bits / shifted
    expect = {"LSH": (8, [0.1896, 0.1040, 0.0706, 0.0533]),
              "LSH-SE(s=1)": (9, [0.1896, 0.1031, 0.0697, 0.0525]),
              "LSH-SE(s=8)": (16, [0.1896, 0.0997, 0.0668, 0.0501]),
              "LSH-DE(s=1)": (9, [0.0, 0.0095, 0.0075, 0.0059])}
    assert list(rows) == list(expect)
    for name, (bits, ramap) in expect.items():
        assert rows[name]["bits"] == bits
        assert np.round(rows[name]["ramap"], 4).tolist() == ramap, name


@pytest.fixture(scope="module")
def paper():
    data = synthetic_cifar(seed=1, n_db=3_000, n_queries=100, dim=64)
    return rp.paper_rows(data, bits=8, radius_max=4, seed=1)


def test_claims_hold_and_claim_e_is_checked(paper):
    checks = rp.check_claims(paper)
    assert [c["ok"] for c in checks] == [True] * 7
    assert any(c["claim"].startswith("(e) without the time penalty") for c in checks)
    # without the penalty RAMAP is the mean precision over radii 0..R: equal for LSH and SE
    lsh = paper["LSH"]
    assert np.allclose(lsh["ramap_no_penalty"],
                       np.cumsum(lsh["precision"]) / np.arange(1, 6))
    assert lsh["ramap_no_penalty"] == paper["LSH-SE(s=8)"]["ramap_no_penalty"]
    # ... and with it they differ: the penalty is what separates them
    assert lsh["ramap"][1] > paper["LSH-SE(s=8)"]["ramap"][1]


def test_claim_e_can_fail(paper):
    broken = {k: dict(v) for k, v in paper.items()}
    broken["LSH-SE(s=1)"]["ramap_no_penalty"] = [v * 0.9 for v in paper["LSH"]["ramap_no_penalty"]]
    checks = {c["claim"][:3]: c["ok"] for c in rp.check_claims(broken)}
    assert checks["(e)"] is False
    table3 = rp.table3_rows()
    table3["LSH"]["ramap"] = [v + 1e-3 for v in table3["LSH"]["ramap"]]
    assert rp.check_claims(paper, table3)[-1]["ok"] is False


def test_kendall_tau_matches_scipy():
    from scipy.stats import kendalltau
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.random(6), rng.random(6)
        assert rp.kendall_tau(a, b) == pytest.approx(kendalltau(a, b).statistic)
    assert rp.kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0


def test_measured_ball_times_are_cumulative_and_positive():
    rng = np.random.default_rng(2)
    db = rng.integers(0, 2, (2_000, 16), dtype=np.uint8)
    t = rp.measured_ball_times(db, db[:50], radius=3, repeats=2)
    assert t.shape == (4,) and (t > 0).all()
    assert (np.diff(t) >= 0).all()  # T(r) sums the rings 0..r
    assert t[3] > t[0]  # 697 probes cost more than one


def test_reproduce_mnist5k_quick_end_to_end(tmp_path, capsys):
    out = tmp_path / "out.json"
    rc = main(["reproduce", "--dataset", "mnist5k", "--quick", "--bits-list", "16",
               "--json", str(out), "--save-codes", str(tmp_path / "codes")])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "Table 2: MAP vs RAMAP@R" in text and "Table 3: precision, recall" in text
    assert text.count("[PASS]") == 7 and "[FAIL]" not in text
    res = json.loads(out.read_text())
    assert res["dataset"] == "mnist5k" and res["n_db"] == 4_500 and res["n_queries"] == 500
    cmp = res["compare"]
    assert cmp["runs"] == 2 and cmp["radius"] == 2 and cmp["bits_list"] == [16]
    rows = {r["method"]: r for r in cmp["rows"]}
    assert list(rows) == ["LSH", "LSH-SE", "LSH-DE", "ITQ"]
    assert [rows[m]["bits"] for m in rows] == [16, 17, 17, 16]
    for r in rows.values():
        for key in ("map", "precision", "recall", "ramap_modeled", "ramap_measured", "mlgap"):
            assert 0.0 <= r[key] <= 1.0 and key + "_std" in r
        assert len(r["measured_T_ns"]) == 3
    # extensions keep the ranking (MAP) and, for SE, P and R; the modeled cost orders them
    assert rows["LSH"]["map"] == pytest.approx(rows["LSH-SE"]["map"], abs=1e-12)
    assert rows["LSH"]["map"] == pytest.approx(rows["LSH-DE"]["map"], abs=1e-12)
    assert rows["LSH"]["precision"] == pytest.approx(rows["LSH-SE"]["precision"], abs=1e-12)
    assert rows["LSH"]["ramap_modeled"] > rows["LSH-SE"]["ramap_modeled"] \
        > rows["LSH-DE"]["ramap_modeled"]
    assert rows["ITQ"]["map"] > rows["LSH"]["map"]  # a learned code beats random hyperplanes
    agree = cmp["agreement"][0]
    assert agree["Q"] == 16 and sorted(agree["order_modeled"]) == sorted(rows)
    assert agree["same_order"] == (agree["order_modeled"] == agree["order_measured"])
    assert "Ranking by RAMAP@R, modeled vs measured cost" in text
    # the saved codes of the first split, evaluated with that split's labels by `eval --dataset`
    from bucketsearch.index.evaluation.datasets import load
    from bucketsearch.index.evaluation.relevance import from_labels
    from bucketsearch.index.metrics import hamming_histograms, ranking_metrics
    db, q = (np.load(tmp_path / "codes" / f"ITQ-16-{side}.npy") for side in ("db", "q"))
    assert db.shape == (4_500, 16) and q.shape == (500, 16)
    data = load("mnist5k", seed=0)
    expect = ranking_metrics(hamming_histograms(db, q, from_labels(data.yq, data.yb), ks=[1]))
    ev = tmp_path / "eval.json"
    assert main(["eval", "--db-codes", str(tmp_path / "codes" / "ITQ-16-db.npy"),
                 "--query-codes", str(tmp_path / "codes" / "ITQ-16-q.npy"),
                 "--dataset", "mnist5k:0", "--json", str(ev)]) == 0
    got = json.loads(ev.read_text())["map_all"]["tie_aware"]
    assert got == pytest.approx(expect["mean"]["map_all_tie_aware"], abs=1e-12)
    assert main(["eval", "--db-codes", str(tmp_path / "codes" / "ITQ-16-db.npy"),
                 "--query-codes", str(tmp_path / "codes" / "ITQ-16-q.npy"),
                 "--dataset", "digits"]) != 0
    assert "the db codes have 4500 rows" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--bits-list", "0,8"], "--bits-list must be comma-separated integers in [1, 64]"),
    (["--bits-list", "8", "--radius", "9"], "--radius must be in [0, 8]"),
    (["--runs", "0"], "--runs must be >= 1, got 0"),
    (["--bits", "70"], "--bits must be in [1, 64], got 70"),
])
def test_bad_arguments_one_clear_line(argv, message, capsys):
    assert main(["reproduce", "--quick", *argv]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_itq_with_a_shared_pca_basis_is_itq():
    from bucketsearch.index.evaluation.coding import itq, pca_basis
    data = synthetic_cifar(seed=2, n_db=500, n_queries=20, dim=40)
    basis = pca_basis(data.xb)
    for bits in (8, 16):
        a = itq(data.xb, data.xq, bits, n_iter=10, seed=3)
        b = itq(data.xb, data.xq, bits, n_iter=10, seed=3, basis=basis)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_swaps_within_noise_are_named():
    def row(method, modeled, measured, std):
        return {"method": method, "ramap_modeled": modeled, "ramap_measured": measured,
                "ramap_measured_std": std}
    rows = [row("A", 0.3, 0.20, 0.01), row("B", 0.2, 0.21, 0.01), row("C", 0.1, 0.30, 0.01)]
    # A/B swap by 0.01 < sqrt(2e-4 / 1) = 0.014 (one run): not resolved; A/C and B/C swap far
    # beyond their standard error; with 100 runs (0.0014) every swap is resolved
    assert rp._swapped_within_noise(rows, runs=1) == [["A", "B"]]
    assert rp._swapped_within_noise(rows, runs=100) == []
