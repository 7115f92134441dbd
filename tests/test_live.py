"""LiveIndex (main snapshot + delta + tombstones + WAL) against the brute-force twin."""
from __future__ import annotations

import threading

import naive
import numpy as np
import pytest

from bucketsearch.index.codes import pack_bits
from bucketsearch.index.factory import check_served_mode
from bucketsearch.index.storage.live import DuplicateIdError, LiveIndex


def _clustered(rng, n, bits, n_centers=8, flips=3):
    centers = rng.integers(0, 2, size=(n_centers, bits), dtype=np.uint8)
    rows = centers[rng.integers(0, n_centers, size=n)].copy()
    for row in rows:
        row[rng.choice(bits, size=int(rng.integers(0, flips + 1)), replace=False)] ^= 1
    return pack_bits(rows)


class Model:
    """What the live index should contain: a dict id -> words row."""

    def __init__(self, w):
        self.items, self.w = {}, w

    def arrays(self):
        ids = np.array(sorted(self.items), dtype=np.int64)
        words = np.array([self.items[i] for i in ids], dtype=np.uint64).reshape(-1, self.w)
        return ids, words


def _check(live, model, xq, bits, radius, k=None):
    ids, words = model.arrays()
    assert live.ntotal == len(ids)
    lims, D, I, _ = live.range_search(xq, radius)
    rl, rd, ri = naive.range_search(xq, words, ids, bits, radius)
    assert np.array_equal(lims, rl) and np.array_equal(I, ri) and np.array_equal(D, rd)
    if k is not None:
        D, I, _ = live.search(xq, k)
        nd, ni = naive.knn(xq, words, ids, bits, k)
        assert np.array_equal(I, ni) and np.array_equal(D, nd)


@pytest.mark.parametrize("bits", [20, 70])
def test_random_ops_with_merges_and_reopen(tmp_path, bits):
    rng = np.random.default_rng(bits)
    pool = _clustered(rng, 600, bits)
    xq = _clustered(rng, 12, bits)
    kw = dict(merge_threshold=10**9, background_merge=False, max_probes=2**22)
    live = LiveIndex(tmp_path, bits, **kw)
    model = Model(pool.shape[1])
    next_id = 0
    k = 5 if bits == 20 else None  # k-NN only where every radius fits the probe guard
    for step in range(30):
        action = rng.random()
        if action < 0.55:
            n = int(rng.integers(1, 40))
            ids = np.arange(next_id, next_id + n)
            next_id += n
            rows = pool[rng.integers(0, len(pool), size=n)]
            live.add(rows, ids)
            model.items.update({int(i): r for i, r in zip(ids, rows)})
        elif action < 0.8 and model.items:
            victims = rng.choice(sorted(model.items), size=min(8, len(model.items)),
                                 replace=False)
            victims = np.append(victims, 10**9)  # unknown ids are ignored
            assert live.delete(victims) == len(victims) - 1
            for v in victims[:-1]:
                del model.items[int(v)]
        elif action < 0.9:
            live.merge()
        else:
            live.close()
            live = LiveIndex(tmp_path, bits, **kw)
        _check(live, model, xq, bits, 3, k)
    live.merge()
    live.close()
    live = LiveIndex(tmp_path, bits, **kw)
    _check(live, model, xq, bits, 3, k)
    assert live.state.main.ntotal == len(model.items) and len(live.state.delta_ids) == 0


def test_reinsert_after_delete_and_duplicates(tmp_path):
    live = LiveIndex(tmp_path, 16, background_merge=False)
    live.add(np.array([[1], [2]], dtype=np.uint64), [10, 11])
    live.merge()
    with pytest.raises(DuplicateIdError, match="id 10 already exists"):
        live.add(np.array([[5]], dtype=np.uint64), [10])
    with pytest.raises(ValueError, match="id 3 appears more than once"):
        live.add(np.array([[5], [6]], dtype=np.uint64), [3, 3])
    assert live.delete([10]) == 1  # tombstone in main
    live.add(np.array([[7]], dtype=np.uint64), [10])  # same id again, new code, in the delta
    lims, D, I, _ = live.range_search(np.array([[7], [1]], dtype=np.uint64), 0)
    assert I.tolist() == [10] and lims.tolist() == [0, 1, 1]
    assert live.delete([10]) == 1 and live.ntotal == 1
    live.close()
    live = LiveIndex(tmp_path, 16, background_merge=False)
    assert live.ntotal == 1 and live.range_search(np.array([[2]], dtype=np.uint64), 0)[2] \
        .tolist() == [11]


def test_crash_between_snapshot_and_cleanup(tmp_path):
    """A snapshot renamed into place while older WAL segments still exist replays correctly."""
    live = LiveIndex(tmp_path, 32, background_merge=False)
    live.add(np.arange(10, dtype=np.uint64)[:, None], np.arange(10))
    live._cleanup = lambda: None  # simulate a crash right after the snapshot rename
    live.merge()
    live.add(np.arange(10, 15, dtype=np.uint64)[:, None], np.arange(10, 15))
    live.delete([0])
    (tmp_path / "snap-00000099.tmp").mkdir()  # an unfinished later snapshot is ignored
    again = LiveIndex(tmp_path, 32, background_merge=False)
    xq = np.arange(20, dtype=np.uint64)[:, None]
    assert sorted(again.range_search(xq, 0)[2].tolist()) == list(range(1, 15))


def test_torn_tail_recovers(tmp_path):
    live = LiveIndex(tmp_path, 64, background_merge=False)
    for i in range(5):
        live.add(np.array([[i]], dtype=np.uint64), [i])
    live.close()
    seg = sorted(tmp_path.glob("wal-*.log"))[-1]
    seg.write_bytes(seg.read_bytes()[:-7])  # tear the last record
    again = LiveIndex(tmp_path, 64, background_merge=False)
    assert again.recovery.torn_bytes > 0 and again.ntotal == 4
    again.add(np.array([[9]], dtype=np.uint64), [9])  # appends on a clean boundary
    again.close()
    assert LiveIndex(tmp_path, 64, background_merge=False).ntotal == 5


def test_readers_see_consistent_states_during_writes_and_background_merge(tmp_path):
    bits = 32
    rng = np.random.default_rng(5)
    batches = [_clustered(rng, 50, bits) for _ in range(40)]
    xq = _clustered(rng, 6, bits)
    live = LiveIndex(tmp_path, bits, merge_threshold=300)  # background merges kick in
    acked = [0]
    # expected range-search ids after each prefix of batches
    prefix_words = np.concatenate(batches)
    expected = []
    for j in range(len(batches) + 1):
        ids = np.arange(50 * j)
        expected.append(naive.range_search(xq, prefix_words[:50 * j], ids, bits, 2)[2].tolist()
                        if j else [])
    errors, checked = [], [0]
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            lo = acked[0]
            got = live.range_search(xq, 2)[2].tolist()
            hi = acked[0] + 1
            if not any(got == expected[j] for j in range(lo, min(hi, len(batches)) + 1)):
                errors.append((lo, hi))
            checked[0] += 1

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for j, batch in enumerate(batches):
        live.add(batch, np.arange(50 * j, 50 * j + 50))
        acked[0] = j + 1
    live.wait_for_merge()
    stop.set()
    for t in threads:
        t.join()
    assert not errors and checked[0] > 0
    assert live.merges >= 1 and live.last_merge_error is None
    assert live.range_search(xq, 2)[2].tolist() == expected[-1]


def test_modes():
    check_served_mode("single", 64, None)
    with pytest.raises(ValueError, match="substrings applies to mode 'mih'"):
        check_served_mode("single", 64, 4)
    with pytest.raises(ValueError, match="mode must be one of"):
        check_served_mode("lsh", 64, None)
    with pytest.raises(ValueError, match=r"substrings must be in \[1, 64\].*got 65"):
        check_served_mode("mih", 64, 65)
    with pytest.raises(ValueError, match=r"substrings must be in \[2, 128\].*got 1"):
        check_served_mode("mih", 128, 1)  # the create bug: a substring wider than 64 bits
    check_served_mode("mih", 64, 4)


@pytest.mark.parametrize("mode", ["single", "mih", "auto"])
def test_top_k_within_radius_over_main_delta_and_tombstones(tmp_path, mode):
    """search(k, max_distance) of main + delta - tombstones equals brute force over the live
    items, re-inserted ids answered once with their newest code; and every SearchStats field
    the engine records survives the live layer's merge of partial searches."""
    bits = 32
    rng = np.random.default_rng(7)
    pool = _clustered(rng, 400, bits)
    xq = np.concatenate([pool[:6], _clustered(rng, 4, bits)])
    live = LiveIndex(tmp_path, bits, mode, merge_threshold=10**9, background_merge=False,
                     max_probes=2**22)
    model = Model(pool.shape[1])
    live.add(pool[:300], np.arange(300))
    model.items.update({i: pool[i] for i in range(300)})
    live.merge()
    live.delete(np.arange(0, 300, 7))  # tombstones in the main table
    for i in range(0, 300, 7):
        del model.items[i]
    live.add(pool[300:], np.arange(300, 400))  # a delta
    model.items.update({i: pool[i] for i in range(300, 400)})
    moved = np.arange(14, 200, 21)  # tombstoned ids inserted again with another code
    live.add(pool[moved + 100], moved)
    model.items.update({int(i): pool[i + 100] for i in moved})
    ids, words = model.arrays()
    for k in (1, 5, 40, 500):
        for R in (0, 2, 6, bits):
            D, I, st_ = live.search(xq, k, max_distance=R, stats=True)
            nD, nI = naive.knn_within(xq, words, ids, bits, k, R)
            assert np.array_equal(D, nD) and np.array_equal(I, nI), (k, R)
            assert st_.delta_items == len(live.state.delta_ids) and st_.scanned_from is not None
            assert (st_.candidates is not None) == (mode == "mih") or mode == "auto"
            assert (st_.plan is not None) == (mode == "auto")
            assert len(st_.radii) == len(xq) and (st_.radii <= R + 1).all()
            if k in (1, 5) and R in (2, bits):  # one query at a time (its own path)
                for q in range(len(xq)):
                    D1, I1, st1 = live.search(xq[q:q + 1], k, max_distance=R, stats=True)
                    assert np.array_equal(D1[0], nD[q]) and np.array_equal(I1[0], nI[q])
                    assert len(st1.radii) == 1
    lims, D, I, st_ = live.range_search(xq, 3, stats=True)
    assert (st_.candidates is not None) == (mode == "mih") or mode == "auto"
    assert (st_.plan is not None) == (mode == "auto") and st_.delta_items > 0
    with pytest.raises(ValueError, match=r"max_distance must be in \[0, bits=32\], got 33"):
        live.search(xq, 3, max_distance=33)
    with pytest.raises(ValueError, match="k must be an int >= 1, got 0"):
        live.search(xq, 0)
    live.merge()  # no delta, no tombstones: the main index answers alone (k <= its items)
    for k in (1, 5, len(ids), len(ids) + 1):
        for R in (2, bits):
            D, I, st_ = live.search(xq, k, max_distance=R, stats=True)
            nD, nI = naive.knn_within(xq, words, ids, bits, k, R)
            assert np.array_equal(D, nD) and np.array_equal(I, nI), (k, R)
            assert (st_.plan is not None) == (mode == "auto") and st_.delta_items == 0
            D1, I1, _ = live.search(xq[3:4], k, max_distance=R)
            assert np.array_equal(D1[0], nD[3]) and np.array_equal(I1[0], nI[3])
    live.close()


def test_the_merge_count_is_read_back_after_a_restart(tmp_path):
    """Issue 26: the dashboard showed "merges 0" after a restart that followed three merges."""
    rng = np.random.default_rng(4)
    live = LiveIndex(tmp_path, 64, mode="single", background_merge=False)
    for i in range(3):
        live.add(pack_bits(rng.integers(0, 2, size=(50, 64), dtype=np.uint8)),
                 np.arange(50 * i, 50 * (i + 1)))
        assert live.merge()
    assert live.merges == 3
    live.close()
    again = LiveIndex(tmp_path, 64, mode="single", background_merge=False)
    assert again.merges == 3 and again.ntotal == 150
    again.add(pack_bits(rng.integers(0, 2, size=(5, 64), dtype=np.uint8)), np.arange(150, 155))
    assert again.merge() and again.merges == 4
    again.close()


def _sample_twin(main_ids, main_words, tombstones, delta_ids, delta_words, n, seed):
    """The sample by its definition: the live positions of the main index listed in full
    (tombstones skipped), then the delta's, drawn by ``default_rng(seed).choice``; the drawn
    items of the main index first, then the delta's."""
    main_pos = np.flatnonzero(~np.isin(main_ids, tombstones))
    pick = np.random.default_rng(seed).choice(len(main_pos) + len(delta_ids),
                                              size=min(n, len(main_pos) + len(delta_ids)),
                                              replace=False)
    rows = [main_pos[p] for p in pick if p < len(main_pos)]  # the main's first, then the delta's
    extra = [p - len(main_pos) for p in pick if p >= len(main_pos)]
    ids = [main_ids[r] for r in rows] + [delta_ids[d] for d in extra]
    words = [main_words[r] for r in rows] + [delta_words[d] for d in extra]
    return np.array(ids, dtype=np.int64), np.array(words, dtype=np.uint64).reshape(-1, 1)


def test_sample_draws_without_listing_every_position(tmp_path):
    """A sample of a few items of a main index without tombstones allocates no array of N
    (a restart's warm-up samples one item: at 100M items ``arange(N)`` took 1.7 s), and every
    sample, with tombstones and a delta too, is the one its definition draws (the twin)."""
    import tracemalloc
    n = 400_000
    words = np.random.default_rng(0).integers(0, 2**63, (n, 1), dtype=np.uint64)
    live = LiveIndex(tmp_path / "ix", 64, "single", merge_threshold=10**9,
                     background_merge=False)
    try:
        live.add(words, np.arange(n))
        live.merge()
        view = live.view()
        main_ids = np.asarray(view.state.main.ids)
        main_words = np.asarray(view.state.main.words)
        tracemalloc.start()
        ids, got = view.sample(3, 7)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < n  # bytes: an arange(N) of int64 would be 8 N
        want = _sample_twin(main_ids, main_words, np.empty(0, np.int64), [], [], 3, 7)
        assert np.array_equal(ids, want[0]) and np.array_equal(got, want[1])
        live.delete(np.arange(0, n, 3))
        live.add(words[:5] ^ np.uint64(1), np.arange(n, n + 5))
        view = live.view()
        for size, seed in ((1, 0), (50, 1), (10**6, 2)):
            ids, got = view.sample(size, seed)
            want = _sample_twin(main_ids, main_words, np.arange(0, n, 3),
                                np.arange(n, n + 5), words[:5] ^ np.uint64(1), size, seed)
            assert np.array_equal(ids, want[0]) and np.array_equal(got, want[1])
    finally:
        live.close()
