"""Plain-numpy twin of dedup on ingest (index/storage/dedup.py): slow, obviously correct."""
from __future__ import annotations

import numpy as np
from naive import hamming_matrix


def dedup_insert(live_words, live_ids, words, ids, bits, radius, report, first_id=0):
    """Dedup on ingest, literally: items in request order, each inserted when no live item and
    no earlier inserted one lies within ``radius``; a rejected item lists every such item,
    ordered by (distance, id), the first ``report``. ``ids`` None: inserted items get
    ``first_id, first_id + 1, ...`` (-1 for rejected ones). Returns ``(ids, inserted,
    blockers)``, ``blockers`` a list of ``(ids, distances)`` arrays per item."""
    pool_w = [w for w in live_words]
    pool_i = [int(i) for i in live_ids]
    out_ids, inserted, blockers = [], [], []
    next_id = first_id
    for j, w in enumerate(words):
        if pool_w:
            d = hamming_matrix(w[None, :], np.array(pool_w, dtype=np.uint64), bits)[0]
        else:
            d = np.zeros(0, dtype=np.int64)
        pid = np.array(pool_i, dtype=np.int64)
        hit = np.flatnonzero(d <= radius)
        order = np.lexsort((pid[hit], d[hit]))[:report]
        if len(hit):
            out_ids.append(-1 if ids is None else int(ids[j]))
            inserted.append(False)
            blockers.append((pid[hit][order], d[hit][order]))
            continue
        new_id = next_id if ids is None else int(ids[j])
        next_id += ids is None
        out_ids.append(new_id)
        inserted.append(True)
        blockers.append((np.zeros(0, np.int64), np.zeros(0, np.int64)))
        pool_w.append(w)
        pool_i.append(new_id)
    return np.array(out_ids, dtype=np.int64), np.array(inserted, dtype=bool), blockers

# --- self-join (index/join.py, index/join_kernels.py) ---------------------------------------
