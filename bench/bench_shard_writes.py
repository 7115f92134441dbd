"""What all-or-nothing sharded writes cost (issue 31, index/cluster/shardwrites.py).

For each batch size, the latency of a sharded insert through :meth:`ShardedLive.add` (the
protocol: before-images from every shard, the intent fsynced, the parts, the intent removed
and the directory fsynced) against the baseline measured in the same run on the same index:
the same parts sent straight to the shard actors (``ShardedLive._send``: what an insert cost
before, each shard fsyncing its record, no lookup and no intent). Then the same for upserts
(half replaced) and deletes. 2 shards (id_hash), 64-bit codes, ``--rounds`` writes each,
p50 and p90 in ms, ratio of the p50s. The data directory is on disk (``--dir``), as a server's.

    .venv/bin/python bench/bench_shard_writes.py
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def _ms(values, q):
    return float(np.percentile(np.asarray(values) * 1e3, q))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 100, 10_000])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--dir", default=None, help="data directory parent (default: a temp "
                                                    "directory under the current one)")
    args = parser.parse_args(argv)

    import ray

    from bucketsearch.index.cluster.partitioning import id_shard
    from bucketsearch.index.cluster.shards import ShardedLive
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING")
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir or ".", prefix="bench-shard-writes-") as tmp:
        live = ShardedLive(f"{tmp}/idx", 64, "single", None, 2, "id_hash",
                           max_probes=10**7, merge_threshold=10**8, threads_per_shard=1)
        next_id = 0
        try:
            for batch in args.batches:
                times = {"protocol": [], "baseline": []}
                for i in range(2 * args.rounds + 2):  # alternate; the first two warm up
                    ids = np.arange(next_id, next_id + batch, dtype=np.int64)
                    next_id += batch
                    words = rng.integers(0, 2**63, size=(batch, 1), dtype=np.uint64)
                    kind = ("protocol", "baseline")[i % 2]
                    t = time.perf_counter()
                    if kind == "protocol":
                        live.add(words, ids)
                    else:
                        owner = id_shard(ids, live.n)
                        with live._write_lock:
                            live._send({s: (ids[:0], words[owner == s], ids[owner == s])
                                        for s in np.unique(owner).tolist()}, True, "add")
                    if i >= 2:
                        times[kind].append(time.perf_counter() - t)
                p50 = {k: _ms(v, 50) for k, v in times.items()}
                rows.append(("add", batch, p50["baseline"], _ms(times["baseline"], 90),
                             p50["protocol"], _ms(times["protocol"], 90),
                             p50["protocol"] / p50["baseline"]))
                for op in ("upsert", "delete"):
                    t_op = []
                    for _ in range(args.rounds):
                        old = rng.choice(next_id, size=max(1, batch // 2), replace=False)
                        ids = np.concatenate([old, np.arange(next_id, next_id + batch
                                                             - len(old))]).astype(np.int64)
                        next_id += batch
                        t = time.perf_counter()
                        if op == "upsert":
                            live.upsert(rng.integers(0, 2**63, size=(len(ids), 1),
                                                     dtype=np.uint64), ids)
                        else:
                            live.delete(ids)
                        t_op.append(time.perf_counter() - t)
                    rows.append((op, batch, None, None, _ms(t_op, 50), _ms(t_op, 90), None))
        finally:
            live.close()
            ray.shutdown()
    load = os.getloadavg()
    print(f"`.venv/bin/python bench/bench_shard_writes.py` (2 shards id_hash, 64-bit codes, "
          f"{args.rounds} writes per cell; load average after {load[0]:.2f}/{load[1]:.2f}/"
          f"{load[2]:.2f})\n")
    print("| write | batch | parts only p50 ms | p90 | all or nothing p50 ms | p90 | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for op, batch, bp50, bp90, pp50, pp90, ratio in rows:
        cell = (lambda v: "-" if v is None else f"{v:.2f}")
        print(f"| {op} | {batch:,} | {cell(bp50)} | {cell(bp90)} | {pp50:.2f} | {pp90:.2f} | "
              f"{'-' if ratio is None else f'{ratio:.2f}x'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
