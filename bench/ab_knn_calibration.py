#!/usr/bin/env python3
"""A/B of the planner's k-NN calibration queries: all calibration queries (before) vs
KNN_CALIBRATION_QUERIES (after), merge of 500k uniform 64-bit codes into an auto index."""
import time, numpy as np, tempfile
import bucketsearch.index.planner as P
from bucketsearch.index.storage.live import LiveIndex
rng = np.random.default_rng(0)
n = 500_000
w = rng.integers(0, 2**63, (n, 1), dtype=np.int64).view(np.uint64)
res = {"before": [], "after": []}
for rep in range(3):
    for name, q in (("before", 10**9), ("after", 8)):
        P.KNN_CALIBRATION_QUERIES = q
        li = LiveIndex(tempfile.mkdtemp(), 64, mode="auto", background_merge=False)
        li.add(w[:1000], np.arange(1000)); li.merge()
        li.add(w[1000:], np.arange(1000, n))
        c, t = time.process_time(), time.perf_counter()
        li.merge()
        res[name].append((time.process_time() - c, time.perf_counter() - t))
        li.close()
for k, v in res.items():
    print(k, "merge CPU s", [round(a, 2) for a, _ in v], "wall s", [round(b, 2) for _, b in v])
print("median CPU ratio after/before", round(np.median([a for a, _ in res["after"]]) / np.median([a for a, _ in res["before"]]), 3))
