"""Issue 27: the self-join (index/join.py) and its kernels (index/join_kernels.py) against the
plain-numpy twins of tests/naive.py: every pair within r exactly once, in (a, b) order, over
every engine and a live state with deletes and a pending delta; clusters and keep-lists."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import naive
from bucketsearch.index import crossjoin, join
from bucketsearch.index import join_kernels as jk
from bucketsearch.index.codes import n_words, word_widths
from bucketsearch.index.factory import make_index
from bucketsearch.index.storage.idset import IdSet
from bucketsearch.index.storage.live import LiveIndex, LiveState

BITS = [8, 13, 16, 63, 64, 65, 100, 128, 256]


def _random_words(rng, n, bits):
    words = rng.integers(0, 2**64 - 1, size=(n, n_words(bits)), dtype=np.uint64, endpoint=True)
    last = word_widths(bits)[-1]
    if last < 64:
        words[:, -1] &= np.uint64((1 << last) - 1)
    return words


def _flip(rng, row, bits, flips):
    row = row.copy()
    widths = word_widths(bits)
    for j in rng.choice(bits, size=min(flips, bits), replace=False):
        w = int(j) // 64
        row[w] ^= np.uint64(1) << np.uint64(widths[w] - 1 - int(j) % 64)
    return row


def codes(seed: int, n: int, bits: int, kind: str) -> np.ndarray:
    """``uniform``, ``dups`` (a few distinct codes), ``clustered`` (centres with 0..4 flips),
    ``planted`` (uniform, a fifth of the items a copy of another with 0..radius+1 flips)."""
    rng = np.random.default_rng(seed)
    if kind == "uniform" or n == 0:
        return _random_words(rng, n, bits)
    if kind == "dups":
        return _random_words(rng, max(1, n // 6), bits)[rng.integers(0, max(1, n // 6), n)]
    if kind == "clustered":
        centres = _random_words(rng, max(1, n // 10), bits)
        return np.array([_flip(rng, centres[rng.integers(len(centres))], bits,
                               int(rng.integers(0, 5))) for _ in range(n)]).reshape(n, -1)
    words = _random_words(rng, n, bits)
    for i in rng.choice(n, size=n // 5, replace=False):
        words[i] = _flip(rng, words[rng.integers(n)], bits, int(rng.integers(0, 10)))
    return words


def collect(chunks):
    out = []
    for ch in chunks:
        assert ch.a.dtype == np.int64 and ch.b.dtype == np.int64 and ch.d.dtype == np.int32
        out += list(zip(ch.a.tolist(), ch.b.tolist(), ch.d.tolist()))
    return out


def check_chunks(chunks, chunk_size):
    """Chunk contract: at most chunk_size pairs unless one a alone has more; never an a split
    over two chunks; ordered by (a, b) within and across chunks."""
    last = None
    for ch in chunks:
        assert len(ch) > 0
        if len(ch) > chunk_size:
            assert ch.a[0] == ch.a[-1]
        if last is not None:
            assert ch.a[0] > last
        last = ch.last_a


kinds = st.sampled_from(["uniform", "dups", "clustered", "planted"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bits=st.sampled_from(BITS), radius=st.integers(0, 8), n=st.integers(0, 60),
       kind=kinds, seed=st.integers(0, 2**31), chunk=st.integers(1, 40),
       algorithm=st.sampled_from([None, "scan", "probe", "blocks"]))
def test_pairs_equal_brute_force(bits, radius, n, kind, seed, chunk, algorithm):
    radius = min(radius, bits)
    if algorithm == "blocks" and radius + 1 > bits:
        algorithm = "scan"
    if algorithm == "probe" and bits > 16 and radius > 3:
        radius = 3  # the probe enumerates C(Q, r): keep the example small
    words = codes(seed, n, bits, kind)
    ids = np.random.default_rng(seed).permutation(10 * n + 1)[:n].astype(np.int64)
    index = make_index(bits, "scan")
    index.add(words, ids)
    chunks = list(join.pairs(index, radius, chunk_size=chunk, algorithm=algorithm,
                             memory_pairs=max(1, chunk // 2)))
    assert collect(chunks) == naive.join_pairs(ids, words, bits, radius)
    check_chunks(chunks, chunk)


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(BITS), radius=st.integers(0, 8), n=st.integers(2, 50),
       kind=kinds, seed=st.integers(0, 2**31), data=st.data())
def test_every_block_scheme_emits_each_pair_once(bits, radius, n, kind, seed, data):
    """Any scheme ``b >= R + k`` finds every pair (pigeonhole), each once over its tables."""
    radius = min(radius, bits - 1)
    k = data.draw(st.integers(1, 3))
    b = data.draw(st.integers(min(radius + k, bits), min(radius + k + 3, bits)))
    k = min(k, b - radius)
    words = codes(seed, n, bits, kind)
    ids = np.arange(n, dtype=np.int64) * 3
    got = collect(join.pairs(_scan(bits, words, ids), radius, scheme=(b, k)))
    assert got == naive.join_pairs(ids, words, bits, radius)


def _scan(bits, words, ids):
    index = make_index(bits, "scan")
    index.add(words, ids)
    return index


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(BITS), radius=st.integers(0, 8), n=st.integers(0, 40),
       kind=kinds, seed=st.integers(0, 2**31), data=st.data())
def test_block_kernel_equals_its_twin(bits, radius, n, kind, seed, data):
    """:func:`hash_blocks` + :func:`block_pairs` table by table against
    ``naive.block_table_pairs``; the sort against ``naive.table_hash``."""
    radius = min(radius, bits - 1)
    k = data.draw(st.integers(1, 2))
    b = min(radius + k, bits)
    masks = join.block_masks(bits, b, min(k, b - radius))
    words = codes(seed, n, bits, kind)
    rows = np.arange(n, dtype=np.int64)
    table = join._BlockTable(words)
    for t in range(len(masks)):
        longest = table.sort(masks[t])
        assert sorted(table.order.tolist()) == list(range(n))
        assert np.array_equal(table.sorted_h, naive.table_hash(words[table.order], masks[t]))
        assert np.array_equal(table.sorted_w, words[table.order])
        top = table.sorted_h >> np.uint64(64 - table.top_bits)
        assert np.all(top[1:] >= top[:-1])
        out = join._buffers(max(longest, 1))
        tally = np.zeros(3, np.int64)
        got, p = [], 0
        while p < n:
            p, n_out = table.pairs(radius, t, masks, p, out, tally)
            got += list(zip(out[0][:n_out].tolist(), out[1][:n_out].tolist(),
                            out[2][:n_out].tolist()))
        assert sorted(got) == naive.block_table_pairs(words, bits, radius, masks, t)
    assert np.array_equal(rows, np.arange(n))


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([8, 13, 16, 64, 65, 128]), radius=st.integers(0, 3),
       n=st.integers(0, 40), kind=kinds, seed=st.integers(0, 2**31))
def test_probe_kernel_equals_its_twin(bits, radius, n, kind, seed):
    """:func:`probe_pairs` with tiny buffers (every resume path) against brute force."""
    words = codes(seed, n, bits, kind)
    rows = np.arange(n, dtype=np.int64)
    sink = join._SortedRuns(max(n, 1), radius, 1 << 20)
    stats = join.JoinStats()
    join._probe_into(words, bits, radius, sink, stats, 1)
    got = [(int(a), int(b), int(d)) for blk in sink.sorted_blocks(7) for a, b, d in zip(*blk)]
    assert got == naive.join_pairs(rows, words, bits, radius)
    assert stats.pairs == len(got)


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(BITS), radius=st.integers(0, 8), n=st.integers(0, 50),
       kind=kinds, seed=st.integers(0, 2**31), buffer=st.integers(1, 9))
def test_scan_kernel_equals_its_twin(bits, radius, n, kind, seed, buffer):
    words = codes(seed, n, bits, kind)
    ids = np.arange(n, dtype=np.int64) * 2 + 1
    out = join._buffers(buffer)
    tally = np.zeros(3, np.int64)
    got, i, j = [], 0, 0
    while i < n:
        i, j, n_out = jk.scan_pairs(words, ids, radius, i, j, n, *out, tally)
        got += list(zip(out[0][:n_out].tolist(), out[1][:n_out].tolist(),
                        out[2][:n_out].tolist()))
    assert got == naive.join_pairs(ids, words, bits, radius)
    assert tally[jk.T_CANDIDATES] == n * (n - 1) // 2


def _live_state(bits, mode, words, ids, rng):
    """A live state: main index of most items, a third of them deleted (tombstones, one id
    re-inserted into the delta with another code), the rest pending in the delta."""
    n = len(ids)
    n_main = n * 2 // 3
    main = make_index(bits, mode, **({"calibrate_on_build": False} if mode == "auto" else {}))
    main.add(words[:n_main], ids[:n_main])
    base = LiveState(bits, main, IdSet.of(ids[:n_main]), None, np.empty(0, np.int64),
                     np.empty((0, n_words(bits)), np.uint64), np.empty(0, np.int64))
    dead = np.sort(rng.choice(ids[:n_main], size=n_main // 3, replace=False)) if n_main \
        else np.empty(0, np.int64)
    d_ids, d_words = ids[n_main:], words[n_main:]
    if len(dead):  # an id deleted and inserted again: lives in the delta only
        d_ids = np.concatenate([d_ids, dead[:1]])
        d_words = np.concatenate([d_words, words[:1]])
    return base.with_delta(d_ids, d_words, dead)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bits=st.sampled_from([8, 16, 64, 65, 128, 256]), radius=st.integers(0, 8),
       n=st.integers(0, 50), kind=kinds, seed=st.integers(0, 2**31),
       mode=st.sampled_from(["single", "mih", "scan", "auto"]))
def test_live_state_pairs_cover_live_items_only(bits, radius, n, kind, seed, mode):
    rng = np.random.default_rng(seed)
    words = codes(seed, n, bits, kind)
    ids = rng.permutation(4 * n + 1)[:n].astype(np.int64)
    state = _live_state(bits, mode, words, ids, rng)
    live_ids, live_words = state.items()
    want = naive.join_pairs(live_ids, live_words, bits, radius)
    assert collect(state.pairs(radius, chunk_size=5)) == want
    assert collect(state.main.pairs(radius)) == naive.join_pairs(
        state.main.ids, state.main.words, bits, radius)
    # components and the keep-list, fed by the stream
    cids, labels = join.components(state, state.pairs(radius, chunk_size=3))
    nids, nlabels = naive.components(live_ids, want)
    assert np.array_equal(cids, nids) and np.array_equal(labels, nlabels)
    kept = join.keep_first(state, state.pairs(radius, chunk_size=3))
    assert np.array_equal(kept, naive.keep_first(live_ids, want))


@settings(max_examples=30, deadline=None)
@given(bits=st.sampled_from([16, 64, 128]), radius=st.integers(0, 6), n=st.integers(2, 60),
       kind=kinds, seed=st.integers(0, 2**31), data=st.data())
def test_min_id_resumes_after_a_chunk(bits, radius, n, kind, seed, data):
    """Chunks up to one ending at a = A, then min_id = A + 1: together exactly the pairs."""
    words = codes(seed, n, bits, kind)
    ids = np.arange(n, dtype=np.int64) * 5
    index = _scan(bits, words, ids)
    chunks = list(index.pairs(radius, chunk_size=4))
    if not chunks:
        return
    cut = data.draw(st.integers(0, len(chunks) - 1))
    resumed = list(index.pairs(radius, chunk_size=4, min_id=chunks[cut].last_a + 1))
    assert collect(chunks[:cut + 1]) + collect(resumed) == collect(chunks)
    assert all(ch.a.min() >= chunks[cut].last_a + 1 for ch in resumed)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bits=st.sampled_from(BITS), radius=st.integers(0, 8), n=st.integers(0, 70),
       kind=kinds, seed=st.integers(0, 2**31), chunk=st.integers(1, 40),
       batch=st.integers(1, 30), live=st.booleans(), method=st.sampled_from(crossjoin.METHODS))
def test_cross_pairs_equal_brute_force(bits, radius, n, kind, seed, chunk, batch, live, method):
    """The cross join of two disjoint sets (shards: ids interleaved) equals the twin, each
    pair once in (a, b) order with the chunk contract, and the self-joins of both sides plus
    their cross join are the self-join of the union. One side may be a live state (deletes, a
    pending delta)."""
    radius = min(radius, bits)
    rng = np.random.default_rng(seed)
    words = codes(seed, n, bits, kind)
    ids = rng.permutation(4 * n + 1)[:n].astype(np.int64)
    side = rng.random(n) < rng.random()
    left = _scan(bits, words[side], ids[side])
    if live:
        left = _live_state(bits, "single", words[side], ids[side], rng)
    right = _scan(bits, words[~side], ids[~side])
    l_ids, l_words = join.live_items(left)[1:]
    stats = join.JoinStats()
    chunks = list(crossjoin.cross_pairs(left, right, radius, chunk_size=chunk, batch=batch,
                                        memory_pairs=max(1, chunk // 2), method=method,
                                        stats=stats))
    got = collect(chunks)
    assert got == naive.cross_pairs(l_ids, l_words, ids[~side], words[~side], bits, radius)
    check_chunks(chunks, chunk)
    assert stats.pairs == len(got)  # the pairs across the sides only
    union = _scan(bits, np.concatenate([l_words, words[~side]]),
                  np.concatenate([l_ids, ids[~side]]))
    assert sorted(got + collect(join.pairs(left, radius)) + collect(join.pairs(right, radius))) \
        == collect(join.pairs(union, radius))


def test_cross_pairs_refuse_shared_ids_and_other_bits():
    a = _scan(64, codes(0, 5, 64, "uniform"), np.arange(5))
    with pytest.raises(ValueError, match="right: id 3 is on both sides"):
        list(crossjoin.cross_pairs(a, _scan(64, codes(1, 3, 64, "uniform"), np.arange(3, 6)), 2))
    with pytest.raises(ValueError, match="right: 32-bit codes, left has 64"):
        list(crossjoin.cross_pairs(a, _scan(32, codes(1, 3, 32, "uniform"), np.arange(9, 12)),
                                   2))
    with pytest.raises(ValueError, match="batch must be an int >= 1, got 0"):
        list(crossjoin.cross_pairs(a, a, 2, batch=0))
    with pytest.raises(ValueError, match="method must be one of auto, union, search, got 'x'"):
        list(crossjoin.cross_pairs(a, a, 2, method="x"))
    for method in ("union", "search"):
        stats = join.JoinStats()
        stats.cancel()
        with pytest.raises(join.JoinCancelled):
            list(crossjoin.cross_pairs(a, _scan(64, codes(1, 3, 64, "uniform"),
                                                np.arange(9, 12)), 2, stats=stats,
                                       method=method))


class Crash(Exception):
    """A process stopping right after a checkpoint was saved."""


@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(bits=st.sampled_from([8, 16, 64, 100]), radius=st.integers(0, 5), n=st.integers(2, 60),
       kind=kinds, seed=st.integers(0, 2**31), algorithm=st.sampled_from(["probe", "blocks"]),
       crash_at=st.integers(1, 6), memory=st.integers(1, 30))
def test_the_pair_search_resumes_from_a_checkpoint(tmp_path_factory, bits, radius, n, kind,
                                                   seed, algorithm, crash_at, memory):
    """Stopped right after its ``crash_at``-th checkpoint (runs durable, position handed out),
    the join resumed from that position finds exactly the pairs, each once, in order; the
    runs it resumed from are read, not found again (fewer tables searched)."""
    radius = min(radius, bits - 1)
    if algorithm == "probe" and bits > 16:
        radius = min(radius, 2)
    spill = tmp_path_factory.mktemp("spill")
    words = codes(seed, n, bits, kind)
    ids = np.arange(n, dtype=np.int64) * 2 + 1
    index = _scan(bits, words, ids)
    saved = []

    def checkpoint(position):
        saved.append(position)
        if len(saved) == crash_at:
            raise Crash

    want = naive.join_pairs(ids, words, bits, radius)
    try:
        got = collect(join.pairs(index, radius, algorithm=algorithm, memory_pairs=memory,
                                 spill_dir=spill, on_checkpoint=checkpoint, checkpoint_s=0))
    except Crash:
        stats = join.JoinStats()
        got = collect(join.pairs(index, radius, memory_pairs=memory, spill_dir=spill,
                                 resume=saved[-1], stats=stats))
        assert stats.algorithm == algorithm
        assert stats.params["resumed_at"] == {k: saved[-1][k] for k in ("tables_done", "u", "r")
                                              if k in saved[-1]}
    assert got == want


def test_a_resume_that_does_not_fit_is_refused(tmp_path):
    index = _scan(64, codes(0, 50, 64, "planted"), np.arange(50))
    saved = []
    list(join.pairs(index, 3, algorithm="blocks", spill_dir=tmp_path, on_checkpoint=saved.append,
                    checkpoint_s=0))
    other = _scan(64, codes(0, 40, 64, "planted"), np.arange(40))
    with pytest.raises(ValueError, match="resume: a checkpoint of a blocks join of 50 items"):
        list(join.pairs(other, 3, spill_dir=tmp_path, resume=saved[0]))
    with pytest.raises(ValueError, match="spill_dir"):
        list(join.pairs(index, 3, resume=saved[0]))
    with pytest.raises(ValueError, match="resume: not a checkpoint"):
        list(join.pairs(index, 3, spill_dir=tmp_path, resume={"algorithm": "blocks"}))


def test_spilled_runs_merge_in_order(tmp_path):
    """More pairs than memory_pairs: sorted runs on disk, merged; the files are removed."""
    bits = 16
    words = codes(3, 400, bits, "dups")
    ids = np.arange(400, dtype=np.int64)
    index = _scan(bits, words, ids)
    stats = join.JoinStats()
    got = collect(join.pairs(index, 2, algorithm="blocks", memory_pairs=100, chunk_size=100,
                             stats=stats, spill_dir=tmp_path))
    assert got == naive.join_pairs(ids, words, bits, 2)
    assert stats.spilled_runs > 1
    assert list(tmp_path.iterdir()) == []


def test_one_item_with_more_partners_than_a_chunk():
    words = np.zeros((50, 1), dtype=np.uint64)  # 50 copies of one code
    index = _scan(64, words, np.arange(50))
    chunks = list(index.pairs(0, chunk_size=10))
    check_chunks(chunks, 10)
    assert len(chunks[0]) == 49 and chunks[0].last_a == 0
    assert sum(len(c) for c in chunks) == 50 * 49 // 2


def test_real_live_index_with_delta_and_deletes(tmp_path):
    bits = 64
    words = codes(7, 300, bits, "planted")
    live = LiveIndex(tmp_path, bits, mode="single", background_merge=False)
    live.add(words[:200], np.arange(200))
    live.merge()
    live.add(words[200:], np.arange(200, 300))
    live.delete(np.arange(0, 200, 7))
    state = live.state
    assert state.delta is not None and len(state.tombstones)
    ids, w = state.items()
    stats = join.JoinStats()
    assert collect(state.pairs(4, stats=stats)) == naive.join_pairs(ids, w, bits, 4)
    assert stats.items == len(ids) and stats.finished is not None
    assert stats.items_done == len(ids)
    live.close()


def test_stats_report_measured_and_modeled_phases():
    bits = 64
    words = codes(11, 3000, bits, "planted")
    index = _scan(bits, words, np.arange(3000))
    pred = join.predict_join(index, 3)
    assert pred.items == 3000 and pred.seconds > 0 and pred.algorithm in join.ALGORITHMS
    assert set(pred.alternatives) >= {"scan", "probe"}
    stats = join.JoinStats()
    got = collect(index.pairs(3, stats=stats))
    assert stats.pairs == stats.pairs_emitted == len(got)
    assert pred.pairs == len(got)  # under RANGE_SAMPLE / PREDICT_SAMPLE items: counted exactly
    blocks = join.predict_join(index, 3, min_id=0)
    assert blocks.items == 3000
    assert stats.algorithm == pred.algorithm
    for phase in ("tables", "verify", "emit") if stats.algorithm != "scan" else ("verify",):
        assert stats.phases[phase]["measured_s"] >= 0
        assert stats.phases[phase]["modeled_s"] == pred.phases[phase]
        assert 0 <= stats.phases[phase]["measured_cpu_s"]
        assert stats.phases[phase]["modeled_cpu_s"] == pred.cpu_phases[phase]
    # the model is in CPU seconds; the wall prediction is that times the machine's slowdown
    assert pred.slowdown >= 1.0 and pred.seconds == pytest.approx(pred.cpu_seconds * pred.slowdown)
    assert sum(pred.phases.values()) == pytest.approx(pred.seconds)
    assert stats.remaining_s() == 0.0 and stats.progress == 1.0


def test_cancel_stops_the_join():
    words = codes(1, 2000, 64, "uniform")
    index = _scan(64, words, np.arange(2000))
    stats = join.JoinStats()
    stats.cancel()
    with pytest.raises(join.JoinCancelled):
        list(index.pairs(3, stats=stats, algorithm="blocks"))


@pytest.mark.parametrize("call, match", [
    (lambda ix: list(ix.pairs(65)), "radius must be an int in \\[0, 64\\], got 65"),
    (lambda ix: list(ix.pairs(-1)), "radius"),
    (lambda ix: list(ix.pairs(True)), "radius"),
    (lambda ix: list(ix.pairs(2, chunk_size=0)), "chunk_size must be an int >= 1, got 0"),
    (lambda ix: list(ix.pairs(2, algorithm="magic")), "algorithm must be one of"),
    (lambda ix: list(ix.pairs(3, scheme=(3, 1))), "scheme \\(b, k\\)"),
])
def test_bad_arguments_name_the_field(call, match):
    index = _scan(64, codes(0, 10, 64, "uniform"), np.arange(10))
    with pytest.raises(ValueError, match=match):
        call(index)


def test_keep_first_refuses_an_unordered_stream():
    with pytest.raises(ValueError, match="ordered by a"):
        join.keep_first(np.arange(5), [join.PairChunk(np.array([3, 1]), np.array([4, 2]),
                                                      np.array([0, 0], np.int32))])
    with pytest.raises(ValueError, match="not among the ids"):
        join.components(np.arange(3), [(np.array([0]), np.array([7]), np.array([0]))])
