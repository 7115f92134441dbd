"""Dedup on ingest (issue 27 item 6) in process: the kernel, the batch decision and
LiveIndex.add_dedup against the literal twin (tests/naive.py dedup_insert)."""
from __future__ import annotations

import threading

import naive
import naive_dedup
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.base import knn_to_csr
from bucketsearch.index.codes import n_words, pack_bits
from bucketsearch.index.kernels import keep_first_rows
from bucketsearch.index.storage.dedup import screen
from bucketsearch.index.storage.live import DuplicateIdError, LiveIndex


def keep_first_twin(blocked, rows, start):
    kept = []
    for j, row in enumerate(rows):
        kept.append(not blocked[j] and not any(p - start < j and kept[p - start] for p in row))
    return np.array(kept, dtype=bool)


@settings(max_examples=150, deadline=None)
@given(m=st.integers(0, 30), start=st.integers(0, 5), data=st.data())
def test_keep_first_rows_matches_the_twin(m, start, data):
    blocked = np.array(data.draw(st.lists(st.booleans(), min_size=m, max_size=m)), dtype=bool)
    rows = [sorted(set(data.draw(st.lists(st.integers(start, start + m - 1), max_size=6))) | {j + start})
            for j in range(m)]
    lims = np.zeros(m + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=lims[1:])
    P = np.array([p for r in rows for p in r], dtype=np.int64)
    assert (keep_first_rows(blocked, lims, P, start) == keep_first_twin(blocked, rows, start)).all()


def _codes(rng, n, bits, kind):
    """Uniform, clustered (near-duplicates around a few centres) or with exact repeats."""
    if kind == "uniform":
        rows = rng.integers(0, 2, size=(n, bits), dtype=np.uint8)
    else:
        centers = rng.integers(0, 2, size=(3, bits), dtype=np.uint8)
        rows = centers[rng.integers(0, 3, size=n)].copy()
        flips = 0 if kind == "repeats" else 4
        for row in rows:
            row[rng.choice(bits, size=int(rng.integers(0, flips + 1)), replace=False)] ^= 1
    return pack_bits(rows)


def _check(result, twin):
    ids, inserted, blockers = twin
    assert (result.inserted == inserted).all()
    assert (result.ids == ids).all()
    for j, (bi, bd) in enumerate(blockers):
        ri, rd = result.blockers(j)
        assert (ri == bi).all() and (rd == bd).all(), j


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([8, 16, 33, 64, 100, 256]), radius=st.integers(0, 8),
       n_live=st.integers(0, 25), n=st.integers(1, 40), report=st.sampled_from([1, 3, 50]),
       kind=st.sampled_from(["uniform", "clustered", "repeats"]), auto=st.booleans(),
       block=st.sampled_from([4, 7, 2048]), index_from=st.sampled_from([3, 16_384]),
       knn=st.sampled_from([None, "report"]), seed=st.integers(0, 2**31))
def test_screen_matches_the_twin(bits, radius, n_live, n, report, kind, auto, block,
                                 index_from, knn, seed):
    """Blocks of 4 or 7 items and kept items indexed from 3 on take every path of the
    within-batch check on small batches."""
    rng = np.random.default_rng(seed)
    knn = report if knn else None
    live = _codes(rng, n_live, bits, kind)
    words = _codes(rng, n, bits, kind)
    if n_live and kind != "uniform":  # some batch items repeat live ones exactly
        words[: n // 3] = live[rng.integers(0, n_live, size=n // 3)]
    live_ids = rng.permutation(1000)[:n_live].astype(np.int64)
    ids = None if auto else rng.permutation(np.arange(1000, 2000))[:n].astype(np.int64)
    if n_live:  # every live neighbour (a range search), or the k nearest (k-NN)
        found = naive.range_search(words, live, live_ids, bits, radius) if knn is None else \
            knn_to_csr(*naive.knn_within(words, live, live_ids, bits, knn, radius))
    else:
        found = (np.zeros(n + 1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64))
    result = screen(words, radius, bits, found, ids, first_id=5000, report=report, block=block,
                    index_from=index_from)
    _check(result, naive_dedup.dedup_insert(live, live_ids, words, ids, bits, radius, report, 5000))
    assert result.first_id == (5000 if auto else None)


@pytest.mark.parametrize("bits", [24, 64, 130])
def test_add_dedup_over_main_delta_and_tombstones(tmp_path, bits):
    """Main table, pending delta and deletes; after a reopen the index holds exactly the items
    answered as inserted."""
    rng = np.random.default_rng(bits)
    kw = dict(merge_threshold=10**9, background_merge=False, max_probes=2**22)
    live = LiveIndex(tmp_path, bits, "auto", **kw)
    model: dict[int, np.ndarray] = {}

    def arrays():
        ids = np.array(sorted(model), dtype=np.int64)
        return ids, np.array([model[i] for i in ids], dtype=np.uint64).reshape(-1, n_words(bits))

    for step in range(12):
        words = _codes(rng, int(rng.integers(1, 30)), bits, ["uniform", "clustered"][step % 2])
        radius = int(rng.integers(0, 6))
        auto = step % 3 == 0
        ids = None if auto else np.arange(1000 * step, 1000 * step + len(words))
        live_ids, live_words = arrays()
        twin = naive_dedup.dedup_insert(live_words, live_ids, words, ids, bits, radius, 4,
                                  live.state.next_id)
        result = live.add_dedup(words, radius, ids, report=4)
        _check(result, twin)
        for i, w in zip(result.ids[result.inserted], words[result.inserted]):
            model[int(i)] = w
        if step % 4 == 1 and model:  # deletes: tombstones of the main table, or delta drops
            gone = rng.choice(sorted(model), size=min(5, len(model)), replace=False)
            live.delete(gone)
            for i in gone:
                model.pop(int(i))
        if step == 5:
            live.merge()
    live.close()
    again = LiveIndex(tmp_path, bits, "auto", **kw)
    ids, words = arrays()
    got_ids, got_words = again.state.items()
    order = np.argsort(got_ids)
    assert (got_ids[order] == ids).all() and (got_words[order] == words).all()
    again.close()


def test_a_request_sent_twice_inserts_nothing_the_second_time(tmp_path):
    live = LiveIndex(tmp_path, 64, "single", background_merge=False)
    words = _codes(np.random.default_rng(1), 20, 64, "uniform")
    first = live.add_dedup(words, 2, np.arange(20))
    assert first.inserted.all()
    second = live.add_dedup(words, 2, np.arange(20))
    assert not second.inserted.any() and live.ntotal == 20
    for j in range(20):  # each blocked by its own first copy, at distance 0, nearest first
        ids, d = second.blockers(j)
        assert ids[0] == j and d[0] == 0
    live.close()


def test_an_inserted_item_whose_id_is_live_refuses_the_whole_batch(tmp_path):
    live = LiveIndex(tmp_path, 64, "single", background_merge=False)
    rng = np.random.default_rng(2)
    live.add(_codes(rng, 1, 64, "uniform"), [7])
    far = _codes(rng, 3, 64, "uniform")
    with pytest.raises(DuplicateIdError, match="id 7"):
        live.add_dedup(far, 1, [5, 6, 7])
    assert live.ntotal == 1
    with pytest.raises(ValueError, match="report"):
        live.add_dedup(far, 1, report=0)
    with pytest.raises(ValueError, match="radius"):
        live.add_dedup(far, 65)
    assert live.add_dedup(far[:0], 1).n_inserted == 0
    live.close()


def test_concurrent_dedup_inserts_never_admit_two_items_within_the_radius(tmp_path):
    """Eight threads insert near-duplicates of the same few centres at once: the index ends
    with no two items within the radius, and every item answered inserted is there. (Checked
    to fail when the search runs before the write lock is taken.)"""
    bits, radius = 64, 3
    live = LiveIndex(tmp_path, bits, "single", merge_threshold=40, background_merge=True)
    rng = np.random.default_rng(3)
    pool = _codes(rng, 8 * 25, bits, "clustered")  # near-duplicates of 3 centres, shared
    batches = [pool[t::8] for t in range(8)]
    answers = [None] * 8
    start = threading.Barrier(8)

    def worker(t):
        start.wait()
        step = 5 if t % 2 else 1  # batches and single items
        answers[t] = [live.add_dedup(batches[t][i:i + step], radius)
                      for i in range(0, 25, step)]

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    live.wait_for_merge()
    ids, words = live.state.items()
    d = naive.hamming_matrix(words, words, bits)
    np.fill_diagonal(d, bits + 1)
    assert (d > radius).all()
    inserted = np.concatenate([r.ids[r.inserted] for rs in answers for r in rs])
    assert sorted(inserted.tolist()) == sorted(ids.tolist())
    assert len(ids) < 8 * 25
    live.close()


def test_many_near_duplicates_or_a_probe_limit_take_the_knn_search(tmp_path, monkeypatch):
    """Past the range search's result cap (here 12 results: 1 item x report 3 x 4) or its
    probe limit (radius 3 of 64 bits is 43,745 probes, over 1,000), the k nearest within the
    radius decide and are reported: the twin's answer all the same."""
    from bucketsearch.index.storage import dedup
    monkeypatch.setattr(dedup, "DEDUP_RANGE_CAP", 1)
    rng = np.random.default_rng(4)
    code = _codes(rng, 1, 64, "uniform")
    live = LiveIndex(tmp_path / "cap", 64, "single", background_merge=False)
    live.add(np.repeat(code, 50, axis=0), np.arange(100, 150))
    got = live.add_dedup(code, 0, [7], report=3)
    assert not got.inserted[0] and got.blockers(0)[0].tolist() == [100, 101, 102]
    live.close()
    live = LiveIndex(tmp_path / "probes", 64, "single", max_probes=1000, background_merge=False)
    base = _codes(rng, 30, 64, "clustered")
    live.add(base, np.arange(30))
    batch = _codes(rng, 20, 64, "clustered")
    twin = naive_dedup.dedup_insert(base, np.arange(30), batch, None, 64, 3, 5, 30)
    _check(live.add_dedup(batch, 3, report=5), twin)
    live.close()
