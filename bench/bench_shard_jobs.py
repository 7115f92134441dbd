"""A near-duplicate job on a 2-shard index (index/cluster/, a local Ray) against the same job on
one unsharded live index (app/jobs.py), the same codes, one process driving both.

Data: bench_join's planted codes (``--n`` 64-bit items, r = 3). Figures: wall seconds from the
job's start to its completed state (the items' copy, the tasks or the join, the result), the
job's predicted seconds, and for the sharded job each task's algorithm and seconds (its second
job: the first on fresh actors also measures the join's constants in each, reported apart). Both
results are checked equal (the same file). Each shard actor runs one numba thread.

    NUMBA_NUM_THREADS=1 python bench/bench_shard_jobs.py [--n 1000000] [--radius 3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from bench_join import planted_codes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import app_settings  # noqa: E402

from bucketsearch.index.cluster import shards  # noqa: E402
from bucketsearch.app.jobs import JobManager  # noqa: E402
from bucketsearch.index.storage.live import LiveIndex  # noqa: E402


def run_job(manager, entry, radius):
    t = time.perf_counter()
    job = manager.start(entry, radius, "pairs")
    while job.state == "running":
        time.sleep(0.02)
    seconds = time.perf_counter() - t
    assert job.state == "completed", job.reason
    return job, seconds


def main():
    import ray
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--radius", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    words = planted_codes(args.n, 64, args.radius, args.seed)
    ids = np.arange(args.n, dtype=np.int64)
    root = Path(tempfile.mkdtemp(prefix="bench-shard-jobs-"))
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    manager = JobManager(app_settings(root / "data", job_max_result_bytes=1 << 40))
    one = LiveIndex(root / "one", 64, "single", merge_threshold=10**9)
    sharded = shards.ShardedLive(root / "two", 64, "single", None, 2, "id_hash",
                                 max_probes=10**7, merge_threshold=10**9, threads_per_shard=1)
    try:
        for s in range(0, args.n, 200_000):
            one.add(words[s:s + 200_000], ids[s:s + 200_000])
            sharded.add(words[s:s + 200_000], ids[s:s + 200_000])
        one.merge()
        sharded.merge()
        run_job(manager, SimpleNamespace(name="w", folder=root / "one", bits=64, live=one), 0)
        a, a_s = run_job(manager, SimpleNamespace(name="one", folder=root / "one", bits=64,
                                                  live=one), args.radius)
        entry = SimpleNamespace(name="two", folder=root / "two", bits=64, live=sharded)
        # the first job of fresh actors measures the join's constants in each (once a process)
        first, first_s = run_job(manager, entry, args.radius)
        b, b_s = run_job(manager, entry, args.radius)
        same = manager.result_path(a).read_bytes() == manager.result_path(b).read_bytes()
        print(f"{args.n:,} 64-bit codes, r = {args.radius}, {a.checkpoint['pairs']:,} pairs "
              f"(results equal: {same})")
        print(f"  unsharded job: {a_s:.2f} s (predicted {a.prediction['seconds']:.2f} s, "
              f"{a.join['algorithm']})")
        print(f"  2-shard job:   {b_s:.2f} s (predicted {b.prediction['seconds']:.2f} s; "
              f"ratio {b_s / a_s:.2f}); the first job on fresh actors {first_s:.2f} s")
        for t in b.join["tasks"]:
            print(f"    task {t['task']}: {t['algorithm']} {t['seconds']:.2f} s "
                  f"(modeled {t['modeled_s'] or 0:.2f} s), {t['pairs']:,} pairs")
    finally:
        manager.close()
        one.close()
        sharded.close()
        ray.shutdown()


if __name__ == "__main__":
    main()
