"""One-query calls through each layer, this tree beside another checkout (issue 17 item 2).

p50 wall time of calls with one query, in process, single thread, every variant interleaved
call by call (``bench_small_radii.single_call_p50``): ``range_search`` at radius 0 and 2 and
``search(k=1)`` (the nearest item) of

* the engines (``single``, ``mih``, ``auto``) over ``--n`` uniform 64-bit codes;
* the live index of the server (``LiveIndex``, mode ``auto``), merged (the main index alone)
  and with a delta of ``--delta`` items and ``--deletes`` tombstones (a server taking writes).

Queries are database codes with ``i mod 4`` bits flipped. ``--base DIR`` runs the same calls on
the code of another checkout (e.g. a ``git worktree`` of the previous commit) on the same codes;
every answer of the two trees is checked identical. ``--json`` saves the figures.

    python bench/bench_single_query.py --base /tmp/base18
    python bench/bench_single_query.py --n 100000 --calls 100    # a quick run
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile

import numpy as np

from bench_small_radii import load_base_engine, make_queries, single_call_p50, timer_floor_ns
from bucketsearch.index.synth import uniform_codes
from bucketsearch.index.factory import make_index
from bucketsearch.index.storage.live import LiveIndex

MODES = ("single", "mih", "auto")
CALLS = {"range r=0": lambda ix, q: ix.range_search(q, 0)[:3],
         "range r=2": lambda ix, q: ix.range_search(q, 2)[:3],
         "search k=1": lambda ix, q: ix.search(q, 1)[:2]}


def live_indexes(live_cls, root: str, xb: np.ndarray, delta: int, deletes: int) -> dict:
    """Two live indexes of the same items: merged, and with a pending delta and tombstones."""
    n = len(xb)
    out = {}
    for name in ("merged", "delta"):
        live = live_cls(os.path.join(root, name), 64, mode="auto", background_merge=False,
                        merge_threshold=10**9)
        live.add(xb, np.arange(n))
        live.merge()
        if name == "delta":
            live.add(xb[:delta] ^ np.uint64(1 << 40), np.arange(n, n + delta))
            live.delete(np.arange(0, deletes * 7, 7))
        out[f"live {name}"] = live
    return out


def same(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=300, help="queries per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delta", type=int, default=1000)
    parser.add_argument("--deletes", type=int, default=1000)
    parser.add_argument("--base", default=None, help="checkout to compare with")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, single thread; loadavg "
          f"{open('/proc/loadavg').read().split()[:3]}; timer floor {timer_floor_ns():.0f} ns",
          flush=True)
    xb = uniform_codes(args.n, 64, 1)
    xq = make_queries(xb, args.calls, None)
    trees = {"new": (make_index, LiveIndex)}
    if args.base:
        load_base_engine(args.base)
        from oldbs.index.factory import make_index as old_make  # noqa: PLC0415
        from oldbs.index.storage.live import LiveIndex as OldLive  # noqa: PLC0415
        trees["old"] = (old_make, OldLive)
    variants = {}
    with tempfile.TemporaryDirectory() as root:
        for tree, (make, live_cls) in trees.items():
            for mode in MODES:
                ix = make(64, mode)
                ix.add(xb)
                ix.threads = 1
                variants[(tree, mode)] = ix
            for name, live in live_indexes(live_cls, os.path.join(root, tree), xb, args.delta,
                                           args.deletes).items():
                variants[(tree, name)] = live
        results = {}
        for call, fn in CALLS.items():
            for (tree, name), ix in variants.items():
                if tree == "old":
                    assert same(fn(ix, xq), fn(variants[("new", name)], xq)), (call, name)
            p50 = single_call_p50({key: (lambda q, ix=ix, fn=fn: fn(ix, q))
                                   for key, ix in variants.items()}, xq, rounds=args.rounds)
            results[call] = {f"{tree} {name}": v for (tree, name), v in p50.items()}
            print(f"\n{call}: p50 us", flush=True)
            for name in [n for t, n in variants if t == "new"]:
                new = p50[("new", name)]
                line = f"  {name:13s} {new / 1000:7.2f}"
                if ("old", name) in p50:
                    old = p50[("old", name)]
                    line += f"   old {old / 1000:7.2f}   new/old {new / old:.2f}"
                print(line, flush=True)
        for (tree, name), ix in variants.items():
            if name.startswith("live"):
                ix.close()
    print(f"\nloadavg at the end {open('/proc/loadavg').read().split()[:3]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "p50_ns": results}, f, indent=1)


if __name__ == "__main__":
    main()
