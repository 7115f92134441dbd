"""A/B of the planner's k-NN calibration in a merge (bench/RESULTS.md section 23): the k-NN fit
timed on every calibration query (before) against the first ``KNN_CALIBRATION_QUERIES`` (after),
in one process, rounds interleaved. A merge of ``--n`` uniform 64-bit codes into an ``auto``
index holding 1,000; printed: each merge's CPU and wall seconds and the median CPU ratio.

    .venv/bin/python bench/ab_knn_calibration.py            # 500k codes, 3 rounds
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import bucketsearch.index.planner as planner
from bucketsearch.index.storage.live import LiveIndex

VARIANTS = (("before", 10**9), ("after", planner.KNN_CALIBRATION_QUERIES))


def merge_seconds(words: np.ndarray) -> tuple[float, float]:
    """(CPU s, wall s) of merging ``words`` into an auto index of their first 1,000."""
    with tempfile.TemporaryDirectory() as tmp:
        live = LiveIndex(tmp, 64, mode="auto", background_merge=False)
        live.add(words[:1000], np.arange(1000))
        live.merge()
        live.add(words[1000:], np.arange(1000, len(words)))
        cpu, wall = time.process_time(), time.perf_counter()
        live.merge()
        out = time.process_time() - cpu, time.perf_counter() - wall
        live.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    words = np.random.default_rng(0).integers(0, 2**63, (args.n, 1), dtype=np.int64) \
        .view(np.uint64)
    got = {name: [] for name, _ in VARIANTS}
    for _ in range(args.rounds):
        for name, queries in VARIANTS:
            planner.KNN_CALIBRATION_QUERIES = queries
            got[name].append(merge_seconds(words))
    for name, runs in got.items():
        print(f"{name:>6}: merge CPU s {[round(c, 2) for c, _ in runs]}, "
              f"wall s {[round(w, 2) for _, w in runs]}")
    ratio = np.median([c for c, _ in got["after"]]) / np.median([c for c, _ in got["before"]])
    print(f"median CPU ratio after/before: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
