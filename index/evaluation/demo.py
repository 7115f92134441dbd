"""``bucketsearch engine-demo``: the engine on the embedded synthetic data, radius by radius.

Builds a deterministic set of clustered 64-bit codes (near-duplicate shaped, generated from a
seed), indexes it, runs radius searches r = 0..R and k-NN with per-radius accounting, checks
every result against the linear scan, fits the RAMAP paper's cost model ``T(r) = t0 * C(Q, r)``
to the measured lookup times and prints the table.
"""
from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.table import Table

HELP = "engine demo on the embedded synthetic data: per-radius probes, empty buckets, lookup time"
EPILOG = """examples:
  bucketsearch engine-demo                  # 1M clustered 64-bit codes, radii 0..3
  bucketsearch engine-demo --n 200000 --radius 2   # smaller and faster
  bucketsearch engine-demo --bits 32 --uniform
"""


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=int, default=1_000_000, help="database codes (default 1M)")
    parser.add_argument("--bits", type=int, default=64, help="code length Q (default 64)")
    parser.add_argument("--queries", type=int, default=200, help="queries per radius")
    parser.add_argument("--radius", type=int, default=3, help="largest radius (default 3)")
    parser.add_argument("--k", type=int, default=10, help="k of the k-NN search (default 10)")
    parser.add_argument("--uniform", action="store_true", help="uniform codes, not clustered")
    parser.add_argument("--seed", type=int, default=0)


def _positive(name, value, low=1):
    if value < low:
        raise ValueError(f"--{name} must be >= {low}, got {value}")


def run(args) -> int:
    from bucketsearch.index.probe import HammingIndex
    from bucketsearch.index.scan import LinearScan
    from bucketsearch.index.synth import clustered_codes, queries_near, uniform_codes

    _positive("n", args.n)
    _positive("queries", args.queries)
    _positive("k", args.k)
    _positive("radius", args.radius, 0)
    console = Console(width=max(Console().width, 110))
    kind = "uniform" if args.uniform else "clustered"
    with console.status(f"generating {args.n:,} {kind} {args.bits}-bit codes (seed {args.seed})"):
        xb = (uniform_codes(args.n, args.bits, args.seed) if args.uniform else
              clustered_codes(args.n, args.bits, max(1, args.n // 100), 0.01, args.seed))
        xq = queries_near(xb, args.queries, args.bits, flips=1, seed=args.seed + 1)
    with console.status("building the bucket table"):
        t = time.perf_counter()
        index = HammingIndex(args.bits)
        index.add(xb)
        build_s = time.perf_counter() - t
    console.print(f"[bold]index[/]: {index.ntotal:,} codes, {index.table.distinct_codes:,} "
                  f"distinct, built in {build_s:.2f} s, "
                  f"{index.memory_bytes() / index.ntotal:.1f} bytes per item")
    with console.status("compiling and warming the kernels"):
        index.range_search(xq[:1], 0)
        index.range_search(xq[:1], 0, stats=True)
        index.search(xq[:1], args.k)
    with console.status(f"radius search r = 0..{args.radius}, {args.queries} queries"):
        lims, D, I, st = index.range_search(xq, args.radius, stats=True)
    scan = LinearScan(args.bits)
    scan.add(xb)
    with console.status("checking against the linear scan"):
        s_lims, s_D, s_I = scan.range_search(xq, args.radius)
        assert (lims == s_lims).all() and (I == s_I).all(), "probing differs from the scan"

    probes = st.probes[0].astype(float)
    lookup = np.median(st.lookup_ns, axis=0)
    t0 = float(probes @ lookup / (probes @ probes))  # least squares through the origin
    table = Table(title=f"per radius (median over {args.queries} queries), "
                        f"paper model T(r) = t0 * C(Q, r), t0 = {t0:.1f} ns")
    for col in ("r", "probes C(Q,r)", "non-empty", "empty", "items", "lookup ns",
                "ns/probe", "modeled ns", "measured/modeled"):
        table.add_column(col, justify="right")
    for r in range(args.radius + 1):
        modeled = t0 * probes[r]
        table.add_row(str(r), f"{int(probes[r]):,}",
                      f"{np.mean(st.nonempty_buckets[:, r]):.1f}",
                      f"{np.mean(st.empty_buckets[:, r]):,.1f}",
                      f"{np.mean(st.items[:, r]):.1f}", f"{lookup[r]:,.0f}",
                      f"{lookup[r] / probes[r]:.1f}", f"{modeled:,.0f}",
                      f"{lookup[r] / modeled:.2f}")
    console.print(table)
    with console.status(f"k-NN, k = {args.k}"):
        t = time.perf_counter()
        kD, kI, kst = index.search(xq, args.k, stats=True)
        knn_s = time.perf_counter() - t
    sD, sI = scan.search(xq, args.k)
    assert (kD == sD).all() and (kI == sI).all(), "k-NN differs from the scan"
    radii = np.bincount(kst.radii)
    console.print(f"[bold]k-NN[/] k={args.k}: {args.queries / knn_s:,.0f} queries/s, "
                  f"median {np.median(kst.total_ns) / 1e3:.1f} us; radii searched: "
                  + ", ".join(f"{c} queries up to r={r - 1}" for r, c in enumerate(radii) if c))
    console.print("[green]all results identical to the linear scan[/]")
    return 0
