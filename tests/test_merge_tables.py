"""Merges that reuse the main index's order (issue 28, items 2 and 4): the substring tables
merged from the old ones (:func:`bucketsearch.index.mih_tables.merge_tables`) are the tables a
build from scratch makes of the merged items, array by array (hypothesis: deletes and upserts,
direct and hashed tables, m = 1..4, 64- and 128-bit codes); the remap against its twin; and a
live index's merge by either path writes the same snapshot."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index import mih_tables
from bucketsearch.index.codes import unpack_words, word_widths
from bucketsearch.index.disk.store import load_arrays
from bucketsearch.index.mih import substring_ranges
from bucketsearch.index.storage import merging
from bucketsearch.index.storage.live import LiveIndex
from bucketsearch.index.table import merge_items, sort_items
from tests import naive


def _codes(rng, n: int, bits: int, spread: int) -> np.ndarray:
    """``(n, W)`` codes whose words take ``2^spread`` values at most (few distinct
    substrings: hashed tables of many items per value; spread 64: mostly distinct)."""
    W = (bits + 63) // 64
    top = min(spread, 64)
    words = rng.integers(0, 2**top - 1, (n, W), dtype=np.uint64, endpoint=True)
    if bits < 64:
        words &= np.uint64((1 << bits) - 1)
    return words


def remap_twin(old_ids, dropped, ids):
    """Twin of :func:`mih_tables.merge_remap`: each kept old id's row among ``ids`` (a
    dictionary), ``len(ids)`` for a dropped one; the other rows ascending."""
    row = {int(i): r for r, i in enumerate(ids)}
    remap = np.array([len(ids) if dropped[p] else row[int(i)] for p, i in enumerate(old_ids)],
                     dtype=np.int64)
    kept = set(remap[~dropped].tolist())
    return remap, np.array([r for r in range(len(ids)) if r not in kept], dtype=np.int64)


@st.composite
def merges(draw):
    """An old index's items, some dropped (deletes; an upsert drops the old copy and brings
    its id back with a new code) and new ones, of 40, 64 or 128 bits in m = 1..4 tables."""
    bits = draw(st.sampled_from([40, 64, 128]))
    m = draw(st.integers(2 if bits == 128 else 1, 4))
    n0, d = draw(st.integers(0, 400)), draw(st.integers(0, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    spread = draw(st.sampled_from([2, 8, 20, 64]))
    old_ids = rng.permutation(3 * (n0 + d) + 5)[:n0].astype(np.int64)
    dropped = rng.random(n0) < draw(st.sampled_from([0.0, 0.05, 0.5, 1.0]))
    upserts = old_ids[dropped][:draw(st.integers(0, 50))]
    free = np.setdiff1d(np.arange(3 * (n0 + d) + 5), old_ids)
    new_ids = np.concatenate([upserts, rng.permutation(free)[:d]]).astype(np.int64)
    if draw(st.booleans()):  # a delta added in id order
        new_ids = np.sort(new_ids)
    return (bits, m, _codes(rng, n0, bits, spread), old_ids, dropped,
            _codes(rng, len(new_ids), bits, spread), new_ids)


def untagged(tables, n):
    """``tables`` as a snapshot saved before the tags has them, read back: entries are rows,
    ``tables`` of 10 columns given their tag columns by ``with_tag_columns``."""
    rb = int(tables.tables[0, mih_tables.T_ROW_BITS])
    rows = tables.positions & tables.positions.dtype.type((1 << rb) - 1)
    old = tables.tables[:, :mih_tables.UNTAGGED_COLUMNS]
    return mih_tables.SubstringTables(rows, tables.starts, tables.slots, tables.bitmap,
                                      mih_tables.with_tag_columns(old, n), tables.ends,
                                      tables.distinct)


@settings(max_examples=150, deadline=None)
@given(case=merges(), threads=st.integers(1, 3), old_format=st.booleans())
def test_merged_tables_are_the_tables_built_from_scratch(case, threads, old_format):
    """Every array (positions, starts, slots, filters, end bits, table rows) and the distinct
    counts of the merged tables equal a build's of the merged items; the positions are the
    (substring, id) order (twin: lexsort). The old tables' tags are as wide as the merged
    ones', wider, narrower (fewer items, across a power of two), or absent (a snapshot
    saved before the tags)."""
    bits, m, old_codes, old_ids, dropped, new_codes, new_ids = case
    ww = np.array(word_widths(bits), dtype=np.int64)
    starts, widths = substring_ranges(bits, m)
    old_words, old_sorted_ids = sort_items(old_codes, old_ids)
    dropped_rows = np.isin(old_sorted_ids, old_ids[dropped])  # rows of the sorted items
    old = mih_tables.build_tables(bits, old_words, old_sorted_ids, starts, widths, ww)
    if old_format:
        old = untagged(old, len(old_sorted_ids))
    keep = ~dropped_rows
    if bits <= 64:
        words, ids = merge_items(old_words[keep], old_sorted_ids[keep], new_codes, new_ids)
    else:
        words, ids = sort_items(np.concatenate([old_words[keep], new_codes]),
                                np.concatenate([old_sorted_ids[keep], new_ids]))
    mapped = mih_tables.merge_remap(old_sorted_ids, dropped_rows, ids)
    assert mapped is not None
    twin = remap_twin(old_sorted_ids, dropped_rows, ids)
    assert (mapped[0] == twin[0]).all() and (mapped[1] == twin[1]).all()
    got = mih_tables.merge_tables(bits, words, ids, old, old_words, *mapped, starts, widths,
                                  ww, threads)
    want = mih_tables.build_tables(bits, words, ids, starts, widths, ww)
    assert got.distinct == want.distinct
    for name, a in want.arrays().items():
        b = got.arrays()[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert (a == b).all(), name
    n = len(ids)
    unpacked = unpack_words(words, bits) if n else np.zeros((0, bits), np.uint8)
    for j in range(m):
        s, w = int(starts[j]), int(widths[j])
        subs = [int("".join(map(str, row[s:s + w])), 2) for row in unpacked]
        want_pos = sorted(range(n), key=lambda p: (subs[p], ids[p]))
        assert got.rows(j).tolist() == want_pos


def test_the_remap_refuses_items_that_are_not_a_merge():
    """Merged ids that drop a kept old item, or hold it out of order: None (rebuild)."""
    old = np.array([5, 3, 9], dtype=np.int64)
    keep_all = np.zeros(3, dtype=bool)
    assert mih_tables.merge_remap(old, keep_all, np.array([5, 9, 7])) is None
    assert mih_tables.merge_remap(old, keep_all, np.array([3, 5, 9])) is None
    remap, rows = mih_tables.merge_remap(old, np.array([False, True, False]),
                                         np.array([1, 5, 9, 3]))
    assert remap.tolist() == [1, 4, 2] and rows.tolist() == [0, 3]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("n0,n", [(65_000, 66_000), (66_000, 65_000)])
def test_a_merge_across_a_power_of_two_changes_the_tags_width(m, n0, n):
    """65,000 and 66,000 items lie either side of 2^16: 16 and 17 row bits, tags of 16 and 15
    bits. Growing narrows the old tags (their first bits, direct tables of m = 4); shrinking
    widens them (read from the codes); both the tables a build makes, direct and hashed."""
    rng = np.random.default_rng(n0 + m)
    bits = 64
    ww = np.array(word_widths(bits), dtype=np.int64)
    starts, widths = substring_ranges(bits, m)
    old_words, old_ids = sort_items(_codes(rng, n0, bits, 64), np.arange(n0, dtype=np.int64))
    old = mih_tables.build_tables(bits, old_words, old_ids, starts, widths, ww)
    dropped = np.zeros(n0, dtype=bool)
    if n < n0:
        dropped[rng.choice(n0, n0 - n, replace=False)] = True
        new_codes, new_ids = old_words[:0], old_ids[:0]
    else:
        new_codes = _codes(rng, n - n0, bits, 64)
        new_ids = np.arange(n0, n, dtype=np.int64)
    words, ids = merge_items(old_words[~dropped], old_ids[~dropped], new_codes, new_ids)
    got = mih_tables.merge_tables(bits, words, ids, old, old_words,
                                  *mih_tables.merge_remap(old_ids, dropped, ids), starts,
                                  widths, ww)
    want = mih_tables.build_tables(bits, words, ids, starts, widths, ww)
    tag_bits = mih_tables.T_TAG_BITS
    assert list(old.tables[:, tag_bits]) != list(want.tables[:, tag_bits])
    for name, a in want.arrays().items():
        assert (a == got.arrays()[name]).all(), name


def _snapshot_arrays(live: LiveIndex) -> dict:
    snap = max(p for p in live.directory.iterdir() if p.name.startswith("snap-"))
    return load_arrays(snap)[2]


@pytest.mark.parametrize("mode,bits,m", [("mih", 64, None), ("auto", 64, None),
                                         ("mih", 128, 5)])
def test_a_live_merge_reusing_the_order_writes_the_snapshot_a_rebuild_writes(tmp_path, mode,
                                                                             bits, m):
    """Two live indexes given the same writes (adds, deletes, upserts over three merges), one
    merging by the old tables, one rebuilding: the same snapshot arrays, every merge; the
    reusing one really reused (the tables were not built again); searches exact against a
    scan of the live items after a reopen."""
    rng = np.random.default_rng(1)
    reuse = LiveIndex(tmp_path / "reuse", bits, mode, m, merge_threshold=10**9,
                      background_merge=False)
    rebuild = LiveIndex(tmp_path / "rebuild", bits, mode, m, merge_threshold=10**9,
                        background_merge=False)
    rebuild.reuse_order = False
    calls = []
    real = merging.merge_tables
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(merging, "merge_tables", lambda *a: calls.append(1) or real(*a))
        live_ids: set[int] = set()
        next_id = 0
        for step, n in enumerate((2000, 300, 200)):  # 64 bits: m = 6 throughout
            codes = _codes(rng, n, bits, 64 if step % 2 else 20)
            ids = np.arange(next_id, next_id + n)
            next_id += n
            for index in (reuse, rebuild):
                index.add(codes, ids)
            live_ids |= set(ids.tolist())
            if step:
                gone = rng.choice(sorted(live_ids), 60, replace=False)
                up = rng.choice(sorted(live_ids - set(gone.tolist())), 40, replace=False)
                up_codes = _codes(rng, len(up), bits, 64)
                for index in (reuse, rebuild):
                    index.delete(gone)
                    index.upsert(up_codes, up)
                live_ids -= set(gone.tolist())
            assert reuse.merge() and rebuild.merge()
            a, b = _snapshot_arrays(reuse), _snapshot_arrays(rebuild)
            assert a.keys() == b.keys()
            for name in a:
                assert a[name].dtype == b[name].dtype and (a[name] == b[name]).all(), name
            # nothing kept beside the tables: no more bytes than the rebuilt main index (auto
            # rebuilt calibrates by searching, which makes the multi-index's visit bitsets,
            # made at the first search either way)
            assert reuse.state.main.memory_bytes() <= rebuild.state.main.memory_bytes()
            if mode == "mih":
                assert reuse.state.main.memory_bytes() == rebuild.state.main.memory_bytes()
    assert len(calls) == 2  # the first merge builds (no main yet), the next two merge
    reuse.close()
    rebuild.close()
    again = LiveIndex(tmp_path / "reuse", bits, mode, m, background_merge=False)
    ids, words = again.state.items()
    xq = np.concatenate([words[:20], _codes(rng, 5, bits, 64)])
    lims, D, I, _ = again.range_search(xq, 3)
    rl, rd, ri = naive.range_search(xq, words, ids, bits, 3)
    assert np.array_equal(lims, rl) and np.array_equal(I, ri) and np.array_equal(D, rd)
    again.close()


def test_a_large_change_rebuilds():
    """More than REUSE_MAX_FRACTION of the merged items new or dropped: not reusable."""
    from bucketsearch.index.factory import make_index
    old = make_index(64, "mih")
    old.add(np.arange(1000, dtype=np.uint64).reshape(-1, 1))
    fresh = make_index(64, "mih")
    limit = int(merging.REUSE_MAX_FRACTION * 1100)
    assert merging.reusable(old, fresh, 1100, limit)
    assert not merging.reusable(old, fresh, 1100, limit + 1)
    assert not merging.reusable(old, make_index(64, "auto"), 1100, 10)
    assert not merging.reusable(old, make_index(64, "mih", substrings=4), 1100, 10)


def test_auto_keeps_its_calibration_over_merges_within_the_fraction(tmp_path):
    """An auto main index's calibration is carried over a merge (the data profiled again,
    the timings kept, anchored at the count they were taken at) while the item count stays
    within CALIBRATION_KEEP_FRACTION of it; past it the planner is calibrated again."""
    rng = np.random.default_rng(3)
    live = LiveIndex(tmp_path / "a", 64, "auto", merge_threshold=10**9, background_merge=False)
    live.add(_codes(rng, 4000, 64, 64), np.arange(4000))
    live.merge()
    first = live.state.main.calibration
    assert first["calibrated"] and "carried_over" not in first
    timed = live.state.main.models["mih"].to_dict()
    first_items = live.state.main.items_d.sum()
    live.add(_codes(rng, 500, 64, 64), np.arange(4000, 4500))
    live.merge()
    main = live.state.main
    assert main.calibration["carried_over"] and main.calibration["timed_ntotal"] == 4000
    assert main.calibration_state()["ntotal"] == 4500  # (a restart restores it)
    assert main.models["mih"].to_dict() == timed  # not timed again
    assert np.isclose(first_items, 4000) and np.isclose(main.items_d.sum(), 4500)  # profiled
    live.add(_codes(rng, 600, 64, 64), np.arange(4500, 5100))  # 5100 > 1.25 x 4000
    live.merge()
    again = live.state.main.calibration
    assert again["calibrated"] and "carried_over" not in again
    live.close()
    reopened = LiveIndex(tmp_path / "a", 64, "auto", background_merge=False)
    assert reopened.state.main.calibration.get("restored")
    reopened.close()
