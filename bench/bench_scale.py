"""Memory and build speed at scale: bucketsearch's engines beside FAISS's hash indexes.

    .venv/bin/python bench/bench_scale.py                 # 10M uniform 64-bit codes
    .venv/bin/python bench/bench_scale.py --n 100000000   # 100M on request
    .venv/bin/python bench/bench_scale.py --only single,auto --threads 1
    .venv/bin/python bench/bench_scale.py --merge 2000000 --only single,auto   # a bulk add merged
    .venv/bin/python bench/bench_scale.py --base /tmp/base_tree --only single,auto,faiss_hash
    .venv/bin/python bench/bench_scale.py --only auto,auto_cal      # auto's calibration too

Every index is built in a subprocess of its own (the same codes, regenerated from the seed), so
its resident memory is the growth of that process's RSS from before the build to after it (the
data and the interpreter already counted before; ``gc`` run and the build's temporaries freed).
Per index: ``memory_bytes() / n`` and ``RSS delta / n`` (bytes per item), the wall and CPU
time of ``add`` (one thread unless ``--threads``) and items per CPU second: on a shared machine
the CPU time leaves out the time the build waited for a core, which the wall time does not. FAISS ``IndexBinaryHash(64, 64)`` and
``IndexBinaryMultiHash(64, 2, 32)`` are built the same way in the same run; the ratio columns
are build speed (per CPU second) over FAISS IndexBinaryHash's. ``auto`` is built with ``calibrate_on_build=False``
(the build itself); ``auto_cal`` with the calibration that follows a build by default, its
seconds printed apart. ``--base DIR`` builds each of our modes of ``--only`` with another
checkout's engine too (``base:<mode>``, through ``bench/oldtree.py``), in the same run.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def codes(n: int, bits: int, seed: int) -> np.ndarray:
    from bucketsearch.index.synth import uniform_codes
    return uniform_codes(n, bits, seed=seed)


def build_one(kind: str, n: int, bits: int, seed: int, threads: int, base: str = "") -> dict:
    """Build one index in this process: its bytes and build time. The resident growth is
    measured from before the codes are made to after they are dropped (so what the index keeps
    of them, copy or reference, is counted once)."""
    if kind.startswith("faiss"):
        import faiss
        from bucketsearch.index.codes import to_packed
        faiss.omp_set_num_threads(threads)
        index = (faiss.IndexBinaryHash(bits, bits) if kind == "faiss_hash"
                 else faiss.IndexBinaryMultiHash(bits, 2, bits // 2))
        gc.collect()
        rss0 = rss_bytes()
        xb8 = to_packed(codes(n, bits, seed), bits)
        t, c = time.perf_counter(), time.process_time()
        index.add(xb8)
        build_s, cpu_s = time.perf_counter() - t, time.process_time() - c
        del xb8
        gc.collect()
        return {"index": kind, "build_s": build_s, "cpu_s": cpu_s,
                "rss_per_item": (rss_bytes() - rss0) / n}
    label = kind
    if kind.startswith("base:"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import oldtree
        oldtree.install(base)
        from oldbs.index.factory import make_index
        kind = kind.split(":", 1)[1]
    else:
        from bucketsearch.index.factory import make_index
    mode = "auto" if kind == "auto_cal" else kind
    options = {"calibrate_on_build": kind == "auto_cal"} if mode == "auto" else {}
    index = make_index(bits, mode, **options)
    index.threads = threads
    # compile the build's kernels on a small index first (compilation is not build time),
    # big enough for the parallel paths (threads > 1) to be taken
    warm = make_index(bits, mode, **options)
    warm.threads = threads
    warm.add(codes(200_000, bits, seed + 1), np.arange(200_000, dtype=np.int64))
    del warm
    gc.collect()
    rss0 = rss_bytes()
    xb, ids = codes(n, bits, seed), np.arange(n, dtype=np.int64)
    t, c = time.perf_counter(), time.process_time()
    if kind == "auto_cal":  # the calibration timed apart, then the build as a whole
        calibrate, cal = index.calibrate, {}

        def timed_calibrate(*a, **k):
            t1, c1 = time.perf_counter(), time.process_time()
            out = calibrate(*a, **k)
            cal["s"], cal["cpu"] = time.perf_counter() - t1, time.process_time() - c1
            return out
        index.calibrate = timed_calibrate
    index.add(xb, ids)
    build_s, cpu_s = time.perf_counter() - t, time.process_time() - c
    del xb, ids
    gc.collect()
    if not label.startswith("base:"):  # the arrays made huge pages in the background (the
        # build does not wait for it; RSS is read once it is done)
        from bucketsearch.index.disk.hugepages import wait_for_collapse
        wait_for_collapse()
    out = {"index": label, "build_s": build_s, "cpu_s": cpu_s,
           "rss_per_item": (rss_bytes() - rss0) / n,
           "memory_per_item": index.memory_bytes() / n}
    if kind == "auto_cal":
        out["calibrate_s"], out["calibrate_cpu_s"] = cal["s"], cal["cpu"]
    return out


def merge_one(kind: str, n: int, bits: int, seed: int, delta: int, threads: int,
              base: str = "") -> dict:
    """A live index (``merge_<mode>``) of ``n`` codes gets ``delta`` more (a bulk add) and
    merges them: the merge's wall and CPU time (building the new main index from the main's
    sorted items and the delta, writing its snapshot, reading it back) beside a build of the
    same ``n + delta`` codes from scratch, on ``threads`` threads (``BUCKETSEARCH_THREADS``;
    the merge's default); ``base:merge_<mode>``: another checkout's."""
    import tempfile
    os.environ["BUCKETSEARCH_THREADS"] = str(threads)
    if kind.startswith("base:"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import oldtree
        oldtree.install(base)
        from oldbs.index.factory import make_index
        from oldbs.index.storage.live import LiveIndex
    else:
        from bucketsearch.index.factory import make_index
        from bucketsearch.index.storage.live import LiveIndex
    mode = kind.split("_", 1)[1]
    xb = codes(n + delta, bits, seed)
    ids = np.arange(n + delta, dtype=np.int64)
    with tempfile.TemporaryDirectory(dir=os.environ.get("SCALE_TMP")) as tmp:
        live = LiveIndex(tmp, bits, mode, merge_threshold=2**62, background_merge=False)
        live.add(xb[:n], ids[:n])
        live.merge()
        live.add(xb[n:], ids[n:])
        t, c = time.perf_counter(), time.process_time()
        live.merge()
        merge_s, merge_cpu = time.perf_counter() - t, time.process_time() - c
        live.close()
    index = make_index(bits, mode)
    t, c = time.perf_counter(), time.process_time()
    index.add(xb, ids)
    build_s, build_cpu = time.perf_counter() - t, time.process_time() - c
    return {"index": kind, "merge_s": merge_s, "merge_cpu_s": merge_cpu, "build_s": build_s,
            "build_cpu_s": build_cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="single,mih,auto,faiss_hash,faiss_multihash")
    ap.add_argument("--merge", type=int, default=0, metavar="DELTA",
                    help="instead: a live index of --n codes merges a bulk add of DELTA more "
                         "(modes of --only), beside a build of all of them from scratch")
    ap.add_argument("--base", default="", metavar="DIR",
                    help="also build our modes of --only with this checkout's engine")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        out = (merge_one(args.child, args.n, args.bits, args.seed, args.merge, args.threads,
                         args.base) if args.merge
               else build_one(args.child, args.n, args.bits, args.seed, args.threads, args.base))
        print(json.dumps(out))
        return
    if args.merge:
        print(f"n = {args.n:,} + a delta of {args.merge:,} uniform {args.bits}-bit codes, "
              f"threads = {args.threads}, loadavg {open('/proc/loadavg').read().split()[0]}")
        for mode in args.only.split(","):
            for kind in [f"merge_{mode}"] + ([f"base:merge_{mode}"] if args.base else []):
                out = subprocess.run([sys.executable, __file__, "--child", kind, "--n",
                                      str(args.n), "--bits", str(args.bits), "--seed",
                                      str(args.seed), "--merge", str(args.merge), "--threads",
                                      str(args.threads), "--base", args.base],
                                     check=True, capture_output=True, text=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                label = ("base " if kind.startswith("base:") else "") + mode
                print(f"{label:<11} merge {r['merge_s']:7.2f} s wall {r['merge_cpu_s']:7.2f} s "
                      f"CPU; "
                      f"build of all from scratch {r['build_s']:7.2f} s wall "
                      f"{r['build_cpu_s']:7.2f} s CPU", flush=True)
        return
    rows = []
    kinds = args.only.split(",")
    if args.base:  # each of our modes beside the base's, in the order given
        kinds = [k for kind in kinds
                 for k in ([kind, f"base:{kind}"] if not kind.startswith("faiss") else [kind])]
    for kind in kinds:
        out = subprocess.run([sys.executable, __file__, "--child", kind, "--n", str(args.n),
                              "--bits", str(args.bits), "--seed", str(args.seed),
                              "--threads", str(args.threads), "--base", args.base],
                             check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  built {kind}", file=sys.stderr, flush=True)
    faiss_rate = next((args.n / r["cpu_s"] for r in rows if r["index"] == "faiss_hash"), None)
    print(f"n = {args.n:,} uniform {args.bits}-bit codes, threads = {args.threads}, "
          f"loadavg {open('/proc/loadavg').read().split()[0]}")
    print(f"{'index':<18}{'memory_bytes/item':>18}{'RSS delta/item':>16}{'wall s':>8}"
          f"{'CPU s':>8}{'items/CPU s':>13}{'x FAISS hash':>14}")
    for r in rows:
        rate = args.n / r["cpu_s"]
        mem = f"{r['memory_per_item']:.1f}" if "memory_per_item" in r else "-"
        ratio = f"{rate / faiss_rate:.2f}" if faiss_rate else "-"
        print(f"{r['index']:<18}{mem:>18}{r['rss_per_item']:>16.1f}{r['build_s']:>8.2f}"
              f"{r['cpu_s']:>8.2f}{rate / 1e6:>12.2f}M{ratio:>14}")
        if "calibrate_s" in r:
            print(f"{'  of which calibration':<52}{r['calibrate_s']:>8.2f}"
                  f"{r['calibrate_cpu_s']:>8.2f}")


if __name__ == "__main__":
    main()
