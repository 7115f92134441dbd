"""Dedup on ingest over a sharded index (index/cluster/shards.py ShardedLive.add_dedup, both
partitionings, 2 shards on a local Ray): the literal twin's answer, and nothing written twice."""
from __future__ import annotations

import threading

import naive
import naive_dedup
import numpy as np
import pytest

from bucketsearch.index.codes import pack_bits

ray = pytest.importorskip("ray")
shards = pytest.importorskip("bucketsearch.index.cluster.shards")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # slow: make test-long
BITS, RADIUS = 16, 2


def clustered(rng, n):
    centers = rng.integers(0, 2, size=(4, BITS), dtype=np.uint8)
    rows = centers[rng.integers(0, 4, size=n)].copy()
    for row in rows:
        row[rng.choice(BITS, size=int(rng.integers(0, 4)), replace=False)] ^= 1
    return pack_bits(rows)


@pytest.mark.parametrize("partitioning", ["id_hash", "code_prefix"])
def test_sharded_dedup_equals_the_twin(ray_local, tmp_path, partitioning):
    live = shards.ShardedLive(tmp_path / partitioning, BITS, "single", None, 2, partitioning,
                              max_probes=10**7, merge_threshold=40)
    try:
        rng = np.random.default_rng(7)
        base = clustered(rng, 12)
        live.add(base, np.arange(12))
        batch = clustered(rng, 30)
        twin = naive_dedup.dedup_insert(base, np.arange(12), batch, None, BITS, RADIUS, 3, 12)
        got = live.add_dedup(batch, RADIUS, report=3)
        assert (got.inserted == twin[1]).all() and (got.ids == twin[0]).all()
        for j, (bi, bd) in enumerate(twin[2]):
            ids, d = got.blockers(j)
            assert ids.tolist() == bi.tolist() and d.tolist() == bd.tolist()
        # four senders of near-duplicates of the same new centres at once
        pool = clustered(np.random.default_rng(8), 40)
        threads = [threading.Thread(target=live.add_dedup, args=(pool[s::4], RADIUS))
                   for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ids, words = live.items()
        d = naive.hamming_matrix(words, words, BITS)
        np.fill_diagonal(d, BITS + 1)
        close = np.argwhere(d <= RADIUS)
        # the seeded items may be close to each other; no pair with an inserted item is
        inserted_ids = set(ids.tolist()) - set(range(12))
        assert not [(a, b) for a, b in close if ids[a] in inserted_ids or ids[b] in inserted_ids]
    finally:
        live.close()
