"""Write path of the live index, side by side with a baseline tree (e.g. an older commit).

Per round, in separate processes, alternating baseline and current: 300 single-item inserts
(each one WAL record, fsynced before it returns: latency p50/p99), 100 single-item deletes,
and 10 batches of 10,000 inserts (items/s). Ratios current / baseline are printed per figure
(median over rounds). The baseline tree is imported as it lays its modules out
(``bucketsearch.index.storage.live`` at the top level before the bucketsearch namespace).

    .venv/bin/python bench/bench_writes.py --baseline-tree /tmp/old --rounds 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = r"""
import json, sys, tempfile, time
import numpy as np
if sys.argv[1] == "baseline":
    sys.path.insert(0, sys.argv[2])
    from index.storage.live import LiveIndex
else:
    from bucketsearch.index.storage.live import LiveIndex
rng = np.random.default_rng(0)
with tempfile.TemporaryDirectory(dir=sys.argv[3]) as d:
    live = LiveIndex(d, 64, "single", merge_threshold=10**9, background_merge=False)
    codes = rng.integers(0, 2**63, (300, 1), dtype=np.uint64)
    single = []
    for i in range(300):
        t = time.perf_counter()
        live.add(codes[i:i + 1], [i])
        single.append(time.perf_counter() - t)
    dele = []
    for i in range(100):
        t = time.perf_counter(); live.delete([i]); dele.append(time.perf_counter() - t)
    t = time.perf_counter()
    for j in range(10):
        live.add(rng.integers(0, 2**63, (10_000, 1), dtype=np.uint64),
                 np.arange(10_000 * j + 1000, 10_000 * (j + 1) + 1000))
    batch = 100_000 / (time.perf_counter() - t)
    live.close()
single.sort(); dele.sort()
print(json.dumps({"insert_p50_ms": single[150] * 1e3, "insert_p99_ms": single[296] * 1e3,
                  "delete_p50_ms": dele[50] * 1e3, "batch_items_per_s": batch}))
"""


def run(kind: str, tree: str, tmp: str) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, kind, tree, tmp], capture_output=True,
                         text=True, check=True, cwd=tmp)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-tree", required=True, help="checkout of the baseline commit")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tmp", default=str(ROOT), help="directory for the index files (same disk)")
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for r in range(args.rounds):
            for kind in ("baseline", "current") if r % 2 == 0 else ("current", "baseline"):
                rows[kind].append(run(kind, args.baseline_tree, tmp))
    print(f"{'figure':<20}{'baseline':>12}{'current':>12}{'ratio':>8}")
    for key in rows["current"][0]:
        b = statistics.median(x[key] for x in rows["baseline"])
        c = statistics.median(x[key] for x in rows["current"])
        print(f"{key:<20}{b:>12.3f}{c:>12.3f}{c / b:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
