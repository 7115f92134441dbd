"""Search limits, each checked before the work it limits (issue 10, item 4).

Engine level: the result cap stops the kernels early (ResultLimitError with a lower bound), a
cap above the true count changes nothing (hypothesis, against brute force), k-NN keeps to its
probe budget, ``probe_count(R, nq)`` is each engine's own count.

HTTP level (FastAPI's TestClient, in process): every limit (max_batch, max_k, nq x k <=
max_results, max_results of a radius search, max_request_probes, max_evaluate_pairs) on every
search route (radius search, k-NN, evaluate), with JSON and octet-stream bodies, in modes
single, mih and auto; the message names the field, the value and the limit.
"""
from __future__ import annotations

import math

import helpers
import naive
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.codes import pack_bits, to_hex, to_packed
from bucketsearch.index.mih import MultiIndex
from bucketsearch.index.planner import AutoIndex
from bucketsearch.index.probe import HammingIndex, ResultLimitError
from bucketsearch.index.scan import LinearScan
from bucketsearch.index.storage.live import with_probe_limit

BITS = 64
MODES = ("single", "mih", "auto")
ENGINES = {
    "single": lambda bits: HammingIndex(bits),
    "mih": lambda bits: MultiIndex(bits),
    "scan": lambda bits: LinearScan(bits),
    "auto": lambda bits: AutoIndex(bits, calibrate_on_build=False),
}


def clustered(seed: int, n: int, bits: int, centers: int = 3, flips: int = 2) -> np.ndarray:
    """Codes near a few centers: many results within a small radius."""
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, size=(centers, bits), dtype=np.uint8)
    rows = c[rng.integers(0, centers, size=n)].copy()
    for row in rows:
        row[rng.choice(bits, size=int(rng.integers(0, flips + 1)), replace=False)] ^= 1
    return pack_bits(rows)


# ---------------------------------------------------------------------------------- engines
@pytest.mark.parametrize("engine,bits,radius", [("single", 16, 16), ("mih", 64, 64),
                                                ("scan", 64, 64), ("auto", 64, 64)])
def test_cap_stops_early_on_identical_codes(engine, bits, radius):
    """A ball holding every item, 100k identical codes, 64 queries: the true count is 6.4M;
    with cap 1000 the kernels stop near the cap instead of building it."""
    n, nq, cap = 100_000, 64, 1000
    index = ENGINES[engine](bits)
    index.add(np.zeros((n, 1), dtype=np.uint64))
    index.threads = 2
    xq = np.zeros((nq, 1), dtype=np.uint64)
    with pytest.raises(ResultLimitError) as err:
        index.range_search(xq, radius, max_results=cap)
    exc = err.value
    assert exc.limit == cap and exc.reached > cap
    # a lower bound, counted by at most 2 chunks before they stopped: one bucket (all n items)
    # past the cap at most per chunk, nowhere near the 6.4M results of the whole batch
    assert exc.reached <= 2 * (cap + n) < nq * n
    assert "max_results=1000" in str(exc) and f"{exc.reached:,}" in str(exc)
    lims, D, I = index.range_search(xq[:1], radius, max_results=n)  # exactly at the cap: fine
    assert lims[-1] == n and (D == 0).all()
    with pytest.raises(ResultLimitError):
        index.range_search(xq[:1], radius, max_results=n - 1)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_cap_zero_and_bad_values(engine):
    index = ENGINES[engine](32)
    index.add(clustered(0, 50, 32))
    far = np.zeros((1, 1), dtype=np.uint64)
    lims, _, _ = index.range_search(far, 0, max_results=0)  # nothing found: within any cap
    assert lims[-1] == int((index.words[:, 0] == 0).sum()) == 0
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="max_results must be None or an int >= 0"):
            index.range_search(far, 0, max_results=bad)


@settings(max_examples=30, deadline=None)
@given(engine=st.sampled_from(sorted(ENGINES)), seed=st.integers(0, 10_000),
       n=st.integers(1, 300), nq=st.sampled_from([1, 3, 20, 40]), radius=st.integers(0, 6),
       cap_frac=st.floats(0.0, 2.0), stats=st.booleans())
def test_cap_above_true_count_changes_nothing_below_raises(engine, seed, n, nq, radius,
                                                            cap_frac, stats):
    bits = 32
    words = clustered(seed, n, bits, centers=2, flips=3)
    ids = np.arange(n, dtype=np.int64) * 7 + 3
    index = ENGINES[engine](bits)
    index.add(words, ids=ids)
    index.threads = 2  # nq >= 16 runs in two chunks sharing the stop flag
    xq = clustered(seed + 1, nq, bits, centers=2, flips=3)
    lims0, D0, I0 = naive.range_search(xq, words, ids, bits, radius)
    true = int(lims0[-1])
    cap = int(round(cap_frac * true))
    if cap >= true:
        out = index.range_search(xq, radius, stats=stats, max_results=cap)
        lims, D, I = out[:3]
        assert np.array_equal(lims, lims0) and np.array_equal(I, I0) and np.array_equal(D, D0)
        plain = index.range_search(xq, radius, stats=stats)
        assert all(np.array_equal(a, b) for a, b in zip(plain[:3], out[:3]))
    else:
        with pytest.raises(ResultLimitError) as err:
            index.range_search(xq, radius, stats=stats, max_results=cap)
        assert err.value.limit == cap < err.value.reached <= true  # a lower bound


@pytest.mark.parametrize("engine", ["single", "mih", "auto"])
def test_knn_keeps_to_the_probe_budget(engine):
    """k-NN under a per-query probe limit (the server's share of max_request_probes): every
    query probes at most that many buckets and the answer is still exact."""
    words = clustered(3, 2000, BITS, centers=20, flips=6)
    ids = np.arange(len(words), dtype=np.int64)
    index = ENGINES[engine](BITS)
    index.add(words, ids=ids)
    xq = clustered(4, 30, BITS, centers=20, flips=10)
    for budget in (1, 100, 3000):
        view = with_probe_limit(index, budget)
        D, I, stats = view.search(xq, 25, stats=True)
        assert (stats.probes.sum(axis=1) <= budget).all(), budget
        D0, _ = naive.knn(xq, words, ids, BITS, 25)
        assert np.array_equal(D, D0)
    assert index.max_probes == 10_000_000  # the view never touched the shared index


def test_probe_count_is_each_engines_own():
    words = clustered(5, 3000, BITS, centers=50, flips=8)
    single, mih, scan = HammingIndex(BITS), MultiIndex(BITS), LinearScan(BITS)
    auto = AutoIndex(BITS, calibrate_on_build=False)
    for index in (single, mih, scan, auto):
        index.add(words)
    for R in (0, 2, 3, 10):
        assert single.probe_count(R, 7) == single.probe_count(R) == sum(
            math.comb(BITS, r) for r in range(R + 1))
        assert mih.probe_count(R, 7) == mih.probe_count(R) == sum(mih.step_probes(R))
        assert scan.probe_count(R, 7) == scan.probe_count(R) == 0
        for limit in (10, 1000, 10_000_000):
            view = with_probe_limit(auto, limit)
            mode = view.plan(max_distance=R, nq=7)["mode"]
            count = view.probe_count(R, 7)
            assert count == {"single": auto.single, "mih": auto.mih,
                             "scan": auto.scan}[mode].probe_count(R)
            assert count <= limit


# ------------------------------------------------------------------------------------- HTTP
LIMITS = dict(max_batch=100, max_k=50, max_results=500, max_request_probes=10_000,
              max_evaluate_pairs=5_000)
RAW = {"content-type": "application/octet-stream"}
N_RANDOM = 300


@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    with helpers.app_client(tmp_path_factory.mktemp("limits"), **LIMITS) as client:
        yield client.app, client


CENTER = np.array([[0x0123456789ABCDEF]], dtype=np.uint64)


@pytest.fixture(scope="module")
def indexes(app_client):
    """Per mode an index 'lim-<mode>': main = 300 copies of CENTER (ids 0..299) + 300 random
    codes (ids 300..599); then 100 more copies of CENTER in the delta (ids 1000..1099) and
    ids 0..49 deleted (tombstones). A radius-0 search of CENTER finds 250 + 100 = 350 items."""
    app, client = app_client
    rng = np.random.default_rng(0)
    random = rng.integers(0, 2**63, size=(N_RANDOM, 1), dtype=np.uint64)
    for mode in MODES:
        name = f"lim-{mode}"
        helpers.create_index(client, name, BITS, mode=mode)
        words = np.concatenate([np.repeat(CENTER, 300, axis=0), random])
        for lo in range(0, 600, 100):  # batches of max_batch
            helpers.add_codes(client, name, range(lo, lo + 100), words[lo:lo + 100], BITS)
        assert client.post(f"/v1/indexes/{name}/merge").status_code == 200
        helpers.add_codes(client, name, range(1000, 1100), np.repeat(CENTER, 100, axis=0), BITS)
        r = client.post(f"/v1/indexes/{name}/items/delete", json={"ids": list(range(50))})
        assert r.status_code == 200, r.text
        state = app.state.registry.get(name).live.state
        assert state.main.ntotal == 600 and len(state.delta_ids) == 100 \
            and len(state.tombstones) == 50
    return random


def main_of(app, mode):
    return app.state.registry.get(f"lim-{mode}").live.state.main


def search(client, mode, xq, body: str, index: str | None = None, **params):
    """POST a search to ``index`` (default 'lim-<mode>') with a JSON or an octet-stream body;
    returns the response."""
    url = f"/v1/indexes/{index or f'lim-{mode}'}/search"
    if body == "json":
        return client.post(url, json={"codes": to_hex(xq, BITS), **params})
    query = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items()}
    return client.post(url, content=to_packed(xq, BITS).tobytes(), headers=RAW, params=query)


def far_queries(nq: int, seed: int = 7) -> np.ndarray:
    """Random queries at distance >= 28 from CENTER: few results (the probe-budget tests)."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < nq:
        q = rng.integers(0, 2**63, dtype=np.uint64)
        if bin(int(q ^ CENTER[0, 0])).count("1") >= 28:
            out.append(q)
    return np.array(out, dtype=np.uint64).reshape(-1, 1)


BODIES = ("json", "octet")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("kind", [{"max_distance": 1}, {"k": 3}])
def test_batch_limit_413(app_client, indexes, mode, body, kind):
    _, client = app_client
    r = search(client, mode, far_queries(LIMITS["max_batch"] + 1), body, **kind)
    assert r.status_code == 413
    field = "codes" if body == "json" else "body"
    assert r.json()["detail"].startswith(f"{field}: batch of 101 exceeds the limit max_batch=100")
    assert search(client, mode, far_queries(LIMITS["max_batch"]), body, **kind).status_code \
        == 200


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("body", BODIES)
def test_knn_max_k(app_client, indexes, mode, body):
    _, client = app_client
    r = search(client, mode, far_queries(1), body, k=51)
    assert r.status_code == 400
    assert r.json()["detail"] == "k: 51 exceeds the limit max_k=50"
    assert search(client, mode, far_queries(1), body, k=50).status_code == 200


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("body", BODIES)
def test_knn_nq_times_k_within_max_results(app_client, indexes, mode, body):
    _, client = app_client
    r = search(client, mode, far_queries(11), body, k=50)
    assert r.status_code == 400
    assert r.json()["detail"].startswith(
        "k: 11 queries x k=50 = 550 results, more than max_results=500;")
    r = search(client, mode, far_queries(10), body, k=50)
    assert r.status_code == 200 and sum(len(x["ids"]) for x in r.json()["results"]) == 500


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("body", BODIES)
def test_range_max_results_main_delta_and_tombstones(app_client, indexes, mode, body):
    """CENTER at radius 0: 250 live main items + 100 delta items. One query (350) passes, two
    (700) do not; the answer gives the count reached before the search stopped."""
    _, client = app_client
    r = search(client, mode, CENTER, body, max_distance=0)
    assert r.status_code == 200, r.text
    ids = r.json()["results"][0]["ids"]
    assert ids == list(range(50, 300)) + list(range(1000, 1100))
    r = search(client, mode, np.repeat(CENTER, 2, axis=0), body, max_distance=0)
    assert r.status_code == 400
    detail = r.json()["detail"]
    assert detail.startswith("max_distance: radius 0 returns at least ") and \
        "ids for 2 queries" in detail and "more than max_results=500;" in detail
    reached = int(detail.split("at least ")[1].split(" ids")[0].replace(",", ""))
    assert 500 < reached <= 700


@pytest.mark.parametrize("mode", MODES)
def test_range_max_results_counts_live_items_only(app_client, indexes, mode):
    """The cap counts what is returned: tombstoned main items do not count (the main index
    is searched with max_results + tombstones), delta items do."""
    app, client = app_client
    name = f"cap-{mode}"
    center = np.array([[0x0F0F0F0F0F0F0F0F]], dtype=np.uint64)
    helpers.create_index(client, name, BITS, mode=mode)
    for lo in range(0, 520, 100):
        hi = min(lo + 100, 520)
        helpers.add_codes(client, name, range(lo, hi), np.repeat(center, hi - lo, axis=0), BITS)
    assert client.post(f"/v1/indexes/{name}/merge").status_code == 200
    assert client.post(f"/v1/indexes/{name}/items/delete",
                       json={"ids": list(range(30))}).status_code == 200
    for body in BODIES:  # main: 520 found, 490 live
        r = search(client, mode, center, body, index=name, max_distance=0)
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["ids"] == list(range(30, 520))
    for new_ids, status in ((range(1000, 1010), 200), (range(1010, 1011), 400)):
        helpers.add_codes(client, name, new_ids, np.repeat(center, len(new_ids), axis=0), BITS)
        r = search(client, mode, center, "json", index=name, max_distance=0)
        assert r.status_code == status, r.text
    # 490 live in the main index, 11 in the delta: the delta scan stops at the cap
    assert r.json()["detail"].startswith("max_distance: radius 0 returns at least 501 ids "
                                         "for 1 queries")
    assert len(app.state.registry.get(name).live.state.delta_ids) == 11


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("body", BODIES)
def test_range_probe_budget(app_client, indexes, mode, body):
    """``max_request_probes`` with each engine's own count: single and mih refuse the batch
    up front; auto plans under the per-query share and answers, every query within it."""
    app, client = app_client
    budget = LIMITS["max_request_probes"]
    main = main_of(app, mode)
    probe_engine = main.mih if mode == "auto" else main
    # a radius at which a batch of at most max_batch queries passes the budget
    R = next(R for R in range(1, BITS) if budget // probe_engine.probe_count(R) + 1 <= 60)
    per_query = probe_engine.probe_count(R)
    nq_over = budget // per_query + 1
    xq = far_queries(nq_over)
    r = search(client, mode, xq, body, max_distance=R, stats=body == "json")
    if mode == "auto":
        assert r.status_code == 200, r.text
        share = budget // nq_over
        if body == "json":
            probes = [sum(rec["probes"] for rec in q) for q in r.json()["stats"]]
            assert max(probes) <= share and sum(probes) <= budget
        assert with_probe_limit(main, share).probe_count(R, nq_over) <= share
        return
    assert r.status_code == 400
    out = r.json()
    assert out["detail"].startswith(
        f"codes: {nq_over} queries x {per_query:,} probes (radius {R}, mode '{mode}') = "
        f"{nq_over * per_query:,} buckets, more than the per-request limit "
        f"max_request_probes={budget:,};")
    assert out["probes"] == nq_over * per_query and out["limit"] == budget \
        and out["radius"] == R
    r = search(client, mode, xq[:-1], body, max_distance=R)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("body", BODIES)
def test_knn_probe_budget_shared_by_the_queries(app_client, indexes, mode, body):
    """k-NN never fails on the budget: each query gets max_request_probes // nq probes and
    switches to a scan past them. The answers stay exact."""
    app, client = app_client
    nq = 40
    xq = far_queries(nq, seed=11)
    r = search(client, mode, xq, body, k=10, stats=True)
    assert r.status_code == 200, r.text
    out = r.json()
    share = LIMITS["max_request_probes"] // nq
    probes = [sum(rec["probes"] for rec in q) for q in out["stats"]]
    assert max(probes) <= share
    state = app.state.registry.get(f"lim-{mode}").live.state
    live_ids = np.concatenate([np.arange(50, 600), np.arange(1000, 1100)])
    words = np.concatenate([np.repeat(CENTER, 250, axis=0), indexes,
                            np.repeat(CENTER, 100, axis=0)])
    assert state.ntotal == len(live_ids)
    D0, I0 = naive.knn(xq, words, live_ids, BITS, 10)
    assert [q["distances"] for q in out["results"]] == D0.tolist()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("body", BODIES)
def test_knn_ties_beyond_k_do_not_build_the_whole_ball(app_client, indexes, mode, body):
    """k-NN of CENTER: the delta's k-th distance is 0, and the main index's radius-0 ball holds
    300 ties. That range search is capped at nq x (k + tombstones) results; past it the main
    index answers by k-NN instead. The answer: the k smallest live ids at distance 0."""
    _, client = app_client
    r = search(client, mode, CENTER, body, k=5, stats=body == "json")
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [{"ids": [50, 51, 52, 53, 54], "distances": [0] * 5}]


@pytest.mark.parametrize("body", BODIES)
def test_per_query_probe_guard_still_answers_first(app_client, indexes, body):
    """One query over the single table's own per-query guard (max_probes): its
    ProbeLimitError. (Multi-index hashing with 7 substrings of 64-bit codes probes at most
    about 7 x 2^10 buckets, and the planner always has a plan within the guard.)"""
    app, client = app_client
    main = main_of(app, "single")
    R = next(R for R in range(BITS + 1) if main.probe_count(R) > main.max_probes)
    r = search(client, "single", far_queries(1), body, max_distance=R)
    assert r.status_code == 400 and r.json()["limit"] == main.max_probes
    assert "max_probes=" in r.json()["detail"]


# ------------------------------------------------------------------------------- evaluate
def evaluate(client, mode, xq, **extra):
    body = {"codes": to_hex(xq, BITS), "relevant_ids": [[300]] * len(xq), **extra}
    return client.post(f"/v1/indexes/lim-{mode}/evaluate", json=body)


@pytest.mark.parametrize("mode", MODES)
def test_evaluate_batch_and_pairs_before_work(app_client, indexes, mode):
    _, client = app_client
    r = evaluate(client, mode, far_queries(101))
    assert r.status_code == 413 and r.json()["detail"] == \
        "codes: 101 queries exceed max_batch=100"
    n_db = 650  # live items
    nq = LIMITS["max_evaluate_pairs"] // n_db + 1
    r = evaluate(client, mode, far_queries(nq), radius_max=1)
    assert r.status_code == 400
    assert r.json()["detail"].startswith(
        f"codes: {nq} queries x {n_db} database items = {nq * n_db:,} distances, more than "
        "max_evaluate_pairs=5,000;")
    # checked before the database is gathered: an unknown db id is not even looked at
    r = evaluate(client, mode, far_queries(2), radius_max=1, db_ids=list(range(3000)))
    assert r.status_code == 400 and "max_evaluate_pairs" in r.json()["detail"]
    assert evaluate(client, mode, far_queries(nq - 1), radius_max=1).status_code == 200


@pytest.mark.parametrize("mode", MODES)
def test_evaluate_measurement_keeps_to_the_probe_budget_and_result_cap(app_client, indexes,
                                                                      mode):
    """The timed searches of RAMAP's measured cost: at most max_request_probes // per-query
    probes of queries (the single table for the planner), and a result cap (a note, not a
    failure: the metrics do not need them)."""
    app, client = app_client
    engine = getattr(main_of(app, mode), "single", main_of(app, mode))
    per_query = engine.probe_count(2)
    r = evaluate(client, mode, far_queries(7), radius_max=2)
    assert r.status_code == 200, r.text
    measured = r.json()["measured_cost"]
    assert measured["queries"] == min(7, LIMITS["max_request_probes"] // per_query)
    r = evaluate(client, mode, np.repeat(CENTER, 2, axis=0), radius_max=2)
    assert r.status_code == 200, r.text
    assert r.json()["measured_cost"] is None
    assert "more than max_results=500" in r.json()["measured_cost_note"]
