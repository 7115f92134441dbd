"""Issue 28.6: codes of 512 to 1,024 bits, exact in every mode against the numpy twins."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.codes import MAX_BITS, pack_bits
from bucketsearch.index.factory import make_index
from bucketsearch.index.mih import default_substrings
from tests import naive

LONG_BITS = [512, 576, 1024]
MAX_PROBES = 1_000_000  # the single table's ball of radius 2 at 1,024 bits: 524,801 probes


def long_data(bits, n, nq, seed):
    """Clusters of codes a few bits apart (so large radii find neighbours), ids shuffled,
    queries near items (0-6 flips) and at random."""
    rng = np.random.default_rng(seed)
    centers = rng.integers(0, 2, (max(1, n // 4), bits)).astype(np.uint8)
    xb = centers[rng.integers(0, len(centers), n)]
    xb = (xb ^ (rng.random(xb.shape) < 4.0 / bits)).astype(np.uint8)
    ids = rng.permutation(5 * n + 1)[:n].astype(np.int64) - 2
    src = xb[rng.integers(0, n, nq)] if n else rng.integers(0, 2, (nq, bits)).astype(np.uint8)
    xq = src.copy()
    for row in xq:
        row[rng.choice(bits, size=int(rng.integers(0, 7)), replace=False)] ^= 1
    xq[: nq // 3] = rng.integers(0, 2, (nq // 3, bits))
    words = pack_bits(xb) if n else np.empty((0, bits // 64 + (bits % 64 > 0)), np.uint64)
    return words, ids, pack_bits(xq)


def test_the_limit_is_1024_bits():
    assert MAX_BITS == 1024
    with pytest.raises(ValueError, match=r"bits must be in \[1, 1024\], got 1032"):
        make_index(1032, "single")


@pytest.mark.parametrize("mode", ["single", "mih", "auto", "scan"])
@settings(max_examples=12, deadline=None)
@given(bits=st.sampled_from(LONG_BITS), n=st.integers(0, 40), seed=st.integers(0, 2**31),
       data=st.data())
def test_long_codes_exact_in_every_mode(mode, bits, n, seed, data):
    """Range search (radius 0-2 in every mode; larger radii where the mode's probes allow) and
    k-NN equal brute force."""
    xb, ids, xq = long_data(bits, n, 5, seed)
    options = {"calibrate_on_build": False} if mode == "auto" else {}
    if mode in ("single", "mih", "auto"):
        options["max_probes"] = MAX_PROBES
    if mode == "mih" and data.draw(st.booleans()):
        options["substrings"] = data.draw(st.sampled_from([bits // 64, bits // 32, bits // 16]))
    index = make_index(bits, mode, **options)
    if n:
        index.add(xb, ids)
    radii = [0, 1, 2]
    if mode != "single":
        R = data.draw(st.integers(3, bits // 8))
        while mode == "mih" and index.probe_count(R) > MAX_PROBES:
            R -= 1  # the largest radius under the probe limit (its refusal: test_mih)
        radii.append(R)
    for R in radii:
        lims, D, I = index.range_search(xq, R)
        nl, nD, nI = naive.range_search(xq, xb, ids, bits, R)
        assert (lims == nl).all() and (D == nD).all() and (I == nI).all(), (mode, bits, R)
    k = data.draw(st.sampled_from([1, 3, 10]))
    D, I = index.search(xq, k)
    nD, nI = naive.knn(xq, xb, ids, bits, k) if n else \
        (np.full((5, k), -1), np.full((5, k), -1))
    assert np.array_equal(D, nD) and np.array_equal(I, nI), (mode, bits, k)


def test_default_substrings_at_1024_bits():
    """Norouzi's rule at 1,024 bits: 16 substrings of 64 bits at most (every substring one
    word), more as log2 N shrinks."""
    assert default_substrings(1024, 10**9) >= 16
    assert default_substrings(1024, 2**20) == round(1024 / 20)


def test_auto_calibrates_and_plans_at_1024_bits():
    """The planner's profile, calibration and plans at 1,024 bits (no float overflow in the
    uniform-code expectations, 2^-1024 C(Q, d)), answers exact."""
    xb, ids, xq = long_data(1024, 300, 8, 5)
    index = make_index(1024, "auto", calibration_queries=8)
    index.add(xb, ids)
    assert index.calibrated
    for R in (0, 3, 40):
        lims, D, I = index.range_search(xq, R)
        nl, nD, nI = naive.range_search(xq, xb, ids, 1024, R)
        assert (lims == nl).all() and (I == nI).all()


def test_server_serves_1024_bit_codes(tmp_path):
    """A 1,024-bit index over HTTP: created, filled and searched (hex codes)."""
    from fastapi.testclient import TestClient

    from bucketsearch.app.main import create_app
    from bucketsearch.app.settings import Settings
    from bucketsearch.index.codes import to_hex
    xb, ids, xq = long_data(1024, 50, 4, 9)
    app = create_app(Settings(data_dir=tmp_path, warmup=False, calibration_queries=0))
    with TestClient(app) as c:
        while c.get("/readyz").status_code != 200:
            pass
        r = c.post("/v1/indexes", json={"name": "long", "bits": 1024, "mode": "mih"})
        assert r.status_code == 201, r.text
        r = c.post("/v1/indexes/long/items",
                   json={"ids": ids.tolist(), "codes": to_hex(xb, 1024)})
        assert r.status_code == 200, r.text
        r = c.post("/v1/indexes/long/search", json={"codes": to_hex(xq, 1024), "max_distance": 20})
        assert r.status_code == 200, r.text
        nl, nD, nI = naive.range_search(xq, xb, ids, 1024, 20)
        for q, row in enumerate(r.json()["results"]):
            assert row["ids"] == nI[nl[q]:nl[q + 1]].tolist()
        r = c.post("/v1/indexes", json={"name": "too_long", "bits": 1032})
        assert r.status_code == 400 and "bits" in r.text


@pytest.mark.parametrize("mode", ["single", "mih", "auto"])
@pytest.mark.parametrize("bits", [72, 576, 1024])
def test_long_codes_through_merges_deletes_and_restarts(tmp_path, mode, bits):
    """The stored index's lifecycle at widths that are not a multiple of 64: a merged main
    index, a delta and tombstones on top, a reopen from the snapshot (read into memory, then
    mapped), a mode change; every step exact against brute force over the live items."""
    from bucketsearch.index.storage.live import LiveIndex
    xb, ids, xq = long_data(bits, 400, 12, bits)
    ids = ids + 2  # a stored index's ids are >= 0
    live = dict(zip(ids.tolist(), range(len(ids))))

    def check(index, step):
        keep = np.array(sorted(live.values()), dtype=np.int64)
        radius = 2 if index.mode == "single" else max(2, bits // 64)  # single: C(Q, <= 2) probes
        lims, D, I, _ = index.range_search(xq, radius)
        nl, nD, nI = naive.range_search(xq, xb[keep], ids[keep], bits, radius)
        assert (lims == nl).all() and (D == nD).all() and (I == nI).all(), step
        D, I, _ = index.search(xq, 5)
        nD, nI = naive.knn(xq, xb[keep], ids[keep], bits, 5)
        assert np.array_equal(D, nD) and np.array_equal(I, nI), step

    kw = dict(background_merge=False, merge_threshold=10**6)
    index = LiveIndex(tmp_path, bits, mode, **kw)
    index.add(xb[:300], ids[:300])
    index.merge()
    index.add(xb[300:], ids[300:])
    gone = ids[::7].tolist()
    index.delete(gone)
    for i in gone:
        del live[i]
    check(index, "delta and tombstones on a merged main")
    index.close()
    for mmap in (False, True):
        index = LiveIndex(tmp_path, bits, mode, mmap=mmap, **kw)
        check(index, f"reopened (mmap={mmap})")
        index.close()
    index = LiveIndex(tmp_path, bits, mode, **kw)
    index.merge()
    check(index, "merged after the restart")
    index.set_mode("mih" if mode != "mih" else "single")
    check(index, "after a mode change")
    index.close()
