"""Small radii and single queries (issue 17): ours in every mode beside FAISS and a floor.

For uniform and clustered 64-bit codes (``bucketsearch.index.evaluation.synth``, the generators of
bench_engine.py: uniform seed 1, clustered N/100 centres with bit-flip probability 0.01, seed 2)
and radius 0..3, single thread (``threads = 1``, ``faiss.omp_set_num_threads(1)``):

* **batch**: per-query time of a batch of ``--nq`` queries (best of ``--rounds`` interleaved
  rounds) of our ``single``, ``mih`` and ``auto`` modes with ``stats`` off and on, FAISS
  ``IndexBinaryMultiHash`` 2x32 / 3x21 / 4x16 (``nflip = r // nhash``), ``IndexBinaryHash``
  (b = 64, ``nflip = r``) and ``IndexBinaryFlat`` (strict ``range_search``: given r + 1), and at
  radius 0 a minimal Numba open-addressing probe written here (the floor: a hash table of the
  distinct codes, linear probing, CSR buckets; nothing else);
* **single call**: p50 wall time of ``range_search`` of one query (``--single`` calls per mode,
  in process, interleaved rounds), beside the target ``3 x batch per query + 2 us``, and as a
  reference the same call to FAISS ``IndexBinaryHash`` (r = 0) / ``MultiHash 2x32`` (r = 1);
  per data set, the p50 of a one-query ``search(q, 1)`` (k-NN) of each mode;
* **the floors** (issue 28 item 7), both written here: the batch at radius 0 against the
  minimal probe (one hash, one 16-byte load: :class:`FloorProbe`; target 1.5x), and the
  one-query call (the index's method, Python entry) against a bare call of the Numba
  function of that probe (``floor bare``, given the query's word; targets 1.5x at r = 0,
  2x at r = 1, 2): at radius r the floor probes every code within r of the query that way
  (:func:`_floor_ball`: 65 probes at r = 1, 2,081 at r = 2; no filter, ids only).

Every result set is checked: our modes identical to each other (``lims, D, I``), FAISS and the
floor the same sets of ids per query. Queries: database codes with ``i mod 4`` random bits
flipped (query ``i``; ``--flips N``: all with N), so every radius has hits and misses.
``--base DIR`` also runs the engine of another checkout (e.g. a read-only ``git worktree`` of
the previous commit) in the same process on the same arrays (cells ``old single/mih/auto``).
Prints ratios measured in this run; ``--json`` saves every figure.

    python bench/bench_small_radii.py                  # 1M uniform + clustered
    python bench/bench_small_radii.py --quick          # 100k, fewer queries (a smoke run)
    python bench/bench_small_radii.py --big            # adds 10M (minutes, ~8 GiB)
    python bench/bench_small_radii.py --base /tmp/base17 --data clustered
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

import faiss
import numba
import numpy as np

import oldtree

from bucketsearch.index.codes import to_packed
from bucketsearch.index.synth import clustered_codes, queries_near, uniform_codes
from bucketsearch.index.factory import make_index

MODES = ("single", "mih", "auto")
WORD_ARGS = ("floor bare",)  # one-query calls given the query's word, not a (1, W) row
#: issue 28 item 7: batch radius 0 / the floor probe; one-query p50 / the floor's bare call
FLOOR_TARGETS = {"batch r=0": 1.5, 0: 1.5, 1: 2.0, 2: 2.0}
RADII = (0, 1, 2, 3)
FAISS_MULTI = ((2, 32), (3, 21), (4, 16))


# ----------------------------------------------------------------------------- the floor

FLOOR_EMPTY = np.uint64(2**64 - 1)  # an empty entry's bucket


@numba.njit(cache=True, nogil=True)
def _floor_fill(entries, codes, shift):
    mask = np.uint64(len(entries) - 1)
    for b in range(len(codes)):
        s = (codes[b] * np.uint64(0x9E3779B97F4A7C15)) >> shift
        while entries[s, 1] != FLOOR_EMPTY:
            s = (s + np.uint64(1)) & mask
        entries[s, 0] = codes[b]
        entries[s, 1] = b


@numba.njit(cache=True, nogil=True)
def _floor_probe(xq, entries, shift, offsets, ids):
    """Radius 0 by one open-addressing lookup per query (one hash, one load: an entry holds
    the code and its bucket, 16 bytes of one cache line), then the bucket's ids: ``(counts,
    I)``."""
    nq = len(xq)
    mask = np.uint64(len(entries) - 1)
    counts = np.zeros(nq, dtype=np.int64)
    out = np.empty(max(nq, 16), dtype=np.int64)
    n = 0
    for qi in range(nq):
        b = _floor_lookup(xq[qi], entries, shift, mask)
        if b >= 0:
            out, n = _floor_emit(b, offsets, ids, out, n)
            counts[qi] = offsets[b + 1] - offsets[b]
    return counts, out[:n].copy()


@numba.njit(inline="always")
def _floor_lookup(c, entries, shift, mask):
    """The floor's probe of code ``c``: its bucket, or -1 (one hash, one load; linear
    probing on a taken entry of another code)."""
    s = (c * np.uint64(0x9E3779B97F4A7C15)) >> shift
    while True:
        b = entries[s, 1]
        if b == FLOOR_EMPTY:
            return np.int64(-1)
        if entries[s, 0] == c:
            return np.int64(b)
        s = (s + np.uint64(1)) & mask


@numba.njit(inline="always")
def _floor_emit(b, offsets, ids, out, n):
    lo, hi = offsets[b], offsets[b + 1]
    if n + hi - lo > len(out):
        grown = np.empty(2 * (n + hi - lo), dtype=np.int64)
        grown[:n] = out[:n]
        out = grown
    for t in range(lo, hi):
        out[n] = ids[t]
        n += 1
    return out, n


@numba.njit(cache=True, nogil=True)
def _floor_ball(xq, R, entries, shift, offsets, ids):
    """Radius ``R`` <= 2 by the floor's probe (:func:`_floor_probe`'s, one hash and one load
    a code) of every code within ``R`` of each query: ``1 + 64 (+ 2,016)`` probes, the masks
    ``1 << i`` and ``1 << i | 1 << j`` (i < j), nothing else: no filter, no order within a
    radius, no distances (the ids of one query, radius by radius). ``(counts, I)``, as
    :func:`_floor_probe`."""
    nq = len(xq)
    mask = np.uint64(len(entries) - 1)
    one = np.uint64(1)
    counts = np.zeros(nq, dtype=np.int64)
    out = np.empty(max(nq, 16), dtype=np.int64)
    n = 0
    for qi in range(nq):
        q = xq[qi]
        start = n
        b = _floor_lookup(q, entries, shift, mask)
        if b >= 0:
            out, n = _floor_emit(b, offsets, ids, out, n)
        if R >= 1:
            for i in range(64):
                b = _floor_lookup(q ^ (one << np.uint64(i)), entries, shift, mask)
                if b >= 0:
                    out, n = _floor_emit(b, offsets, ids, out, n)
        if R >= 2:
            for i in range(63):
                qi_ = q ^ (one << np.uint64(i))
                for j in range(i + 1, 64):
                    b = _floor_lookup(qi_ ^ (one << np.uint64(j)), entries, shift, mask)
                    if b >= 0:
                        out, n = _floor_emit(b, offsets, ids, out, n)
        counts[qi] = n - start
    return counts, out[:n].copy()


class FloorProbe:
    """The minimal exact-match index: the distinct codes in an open-addressing table (load
    <= 1/2) of 16-byte entries (code, bucket), each bucket's ids a CSR run sorted by id.
    :meth:`search` is the batch floor; :meth:`bare` the one-query floor, a call of the Numba
    function itself (no Python around it)."""

    def __init__(self, words: np.ndarray):
        codes = np.ascontiguousarray(words[:, 0])
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        first = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        self.offsets = np.r_[first, len(codes)].astype(np.int64)
        self.ids = order.astype(np.int64)
        uniq = sorted_codes[first]
        size = 1 << max(4, int(2 * len(uniq)).bit_length())
        self.shift = np.uint64(64 - (size.bit_length() - 1))
        self.entries = np.zeros((size, 2), dtype=np.uint64)
        self.entries[:, 1] = FLOOR_EMPTY
        _floor_fill(self.entries, uniq, self.shift)

    def search(self, q1: np.ndarray):
        return _floor_probe(q1, self.entries, self.shift, self.offsets, self.ids)

    def ball(self, q1: np.ndarray, R: int):
        """Radius ``R`` (<= 2) by the floor's probes (:func:`_floor_ball`)."""
        return _floor_ball(q1, R, self.entries, self.shift, self.offsets, self.ids)

    def bare(self, R: int = 0):
        """``fn(q)``: the bare Numba call of the probes of radius ``R`` for one query ``q`` (a
        ``(1,)`` uint64 array of its word): :func:`_floor_probe` at radius 0,
        :func:`_floor_ball` at 1 and 2 (every code of the ball probed the floor's way)."""
        entries, shift, offsets, ids = self.entries, self.shift, self.offsets, self.ids
        if R == 0:
            return lambda q: _floor_probe(q, entries, shift, offsets, ids)
        return lambda q: _floor_ball(q, R, entries, shift, offsets, ids)


# ----------------------------------------------------------------------------- another checkout

def load_base_engine(base: str):
    """``make_index`` of the checkout at ``base``, imported as package ``oldbs``
    (bench/oldtree.py)."""
    oldtree.install(base)
    from oldbs.index.factory import make_index as old_make_index  # noqa: PLC0415
    return old_make_index


# ----------------------------------------------------------------------------- helpers

def make_queries(xb, nq, flips, seed=7):
    if flips is not None:
        return queries_near(xb, nq, 64, flips=flips, seed=seed)
    xq = np.empty((nq, 1), dtype=np.uint64)
    for f in range(4):
        part = queries_near(xb, nq, 64, flips=f, seed=seed + f)
        xq[f::4] = part[f::4]
    return xq


def sets_of(lims, I):
    return [sorted(I[lims[q]:lims[q + 1]].tolist()) for q in range(len(lims) - 1)]


def faiss_sets(lims, I):
    return sets_of(lims, I)


def best_times(fns: dict, rounds: int, min_time: float = 0.0) -> dict:
    """Least wall time of each ``fns[name]()`` over ``rounds`` interleaved rounds (at least
    ``min_time`` s of rounds); every timed call follows an untimed one of the same function,
    so each is timed with its own tables in cache (as bench_mih.py does)."""
    best = dict.fromkeys(fns, float("inf"))
    t_end = time.perf_counter() + min_time
    r = 0
    while r < rounds or time.perf_counter() < t_end:
        for name, fn in fns.items():
            fn()
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
        r += 1
    return best


def single_call_p50(fns: dict, queries: np.ndarray, rounds: int = 3) -> dict:
    """p50 wall ns of one-query calls ``fn(q)``, interleaved rounds: ``q`` a ``(1, W)`` row,
    or for the names in :data:`WORD_ARGS` a ``(1,)`` array of its first word (made before the
    clock starts)."""
    rows = [queries[i:i + 1] for i in range(len(queries))]
    words = [np.ascontiguousarray(queries[i, :1]) for i in range(len(queries))]
    times = {name: [] for name in fns}
    for name, fn in fns.items():  # warm
        fn(words[0] if name in WORD_ARGS else rows[0])
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for name, fn in fns.items():
            acc = times[name]
            for q in (words if name in WORD_ARGS else rows):
                t = clock()
                fn(q)
                acc.append(clock() - t)
    return {name: float(np.median(v)) for name, v in times.items()}


def timer_floor_ns() -> float:
    clock = time.perf_counter_ns
    acc = []
    for _ in range(2000):
        t = clock()
        acc.append(clock() - t)
    return float(np.median(acc))


# ----------------------------------------------------------------------------- one data set

def bench_dataset(name, xb, args, old_make):
    n = len(xb)
    bits = 64
    out = {"data": name, "n": n, "cells": {}}
    t = time.perf_counter()
    ours = {}
    for mode in MODES:
        ix = make_index(bits, mode)
        ix.add(xb)
        ix.threads = 1
        ours[mode] = ix
    out["build_s"] = time.perf_counter() - t
    old = {}
    if old_make is not None:
        for mode in MODES:
            ix = old_make(bits, mode)
            ix.add(xb)
            ix.threads = 1
            old[mode] = ix
    xb8 = to_packed(xb, bits)
    fx = {}
    for nh, b in FAISS_MULTI:
        f = faiss.IndexBinaryMultiHash(bits, nh, b)
        f.add(xb8)
        fx[f"faiss_mh_{nh}x{b}"] = f
    fh = faiss.IndexBinaryHash(bits, bits)
    fh.add(xb8)
    fx["faiss_hash"] = fh
    flat = faiss.IndexBinaryFlat(bits)
    flat.add(xb8)
    fx["faiss_flat"] = flat
    floor = FloorProbe(xb)

    xq = make_queries(xb, args.nq, args.flips)
    xq8 = to_packed(xq, bits)
    for r in args.radii:
        cell = {}
        ref = ours["single"].range_search(xq, r) if r <= 2 or args.nq <= 2000 else None
        # our engines: identical answers (and compiled) before timing
        fns = {}
        for mode, ix in ours.items():
            got = ix.range_search(xq, r)
            if ref is None:
                ref = got
            for a, b_ in zip(ref, got):
                assert np.array_equal(a, b_), f"{name} r={r}: {mode} differs from single"
            fns[mode] = (lambda ix=ix: ix.range_search(xq, r))
            fns[mode + "+stats"] = (lambda ix=ix: ix.range_search(xq, r, stats=True))
        for mode, ix in old.items():
            got = ix.range_search(xq, r)
            for a, b_ in zip(ref, got):
                assert np.array_equal(a, b_), f"{name} r={r}: old {mode} differs"
            fns["old " + mode] = (lambda ix=ix: ix.range_search(xq, r))
        ref_sets = sets_of(ref[0], ref[2])
        if r == 0:
            counts, fI = floor.search(xq[:, 0])
            flims = np.r_[0, np.cumsum(counts)]
            assert sets_of(flims, fI) == ref_sets, f"{name}: floor differs"
            xq0 = np.ascontiguousarray(xq[:, 0])
            fns["floor"] = lambda: floor.search(xq0)
        best = best_times(fns, args.rounds, args.min_time)
        cell.update({k: v / args.nq * 1e9 for k, v in best.items()})  # ns per query
        # FAISS: fewer queries where it is slow; sets checked on those
        for fname, f in fx.items():
            if fname == "faiss_flat":
                nqf = min(args.nq, args.flat_nq)
            elif fname == "faiss_hash":
                nqf = min(args.nq, max(10, {0: args.nq, 1: args.nq, 2: args.nq // 10,
                                            3: args.nq // 100}[r]))
            else:
                nqf = args.nq
            if fname.startswith("faiss_mh"):
                f.nflip = r // f.nhash
            elif fname == "faiss_hash":
                f.nflip = r
            q8 = xq8[:nqf]
            flims, _, fI = f.range_search(q8, r + 1)
            assert faiss_sets(flims, fI) == ref_sets[:nqf], f"{name} r={r}: {fname} differs"
            t = best_times({fname: lambda f=f, q8=q8: f.range_search(q8, r + 1)},
                           max(1, args.rounds // 2 if nqf == args.nq else 1))
            cell[fname] = t[fname] / nqf * 1e9
        # single calls
        sq = xq[:args.single]
        sfns = {mode: (lambda q, ix=ix: ix.range_search(q, r)) for mode, ix in ours.items()}
        sfns.update({mode + "+stats": (lambda q, ix=ix: ix.range_search(q, r, stats=True))
                     for mode, ix in ours.items()})
        sfns.update({"old " + mode: (lambda q, ix=ix: ix.range_search(q, r))
                     for mode, ix in old.items()})
        if r in FLOOR_TARGETS:  # the floor of this radius, its answers checked first
            if r > 0:
                counts, fI = floor.ball(np.ascontiguousarray(sq[:, 0]), r)
                assert sets_of(np.r_[0, np.cumsum(counts)], fI) == ref_sets[:len(sq)], \
                    f"{name} r={r}: floor ball differs"
            sfns["floor bare"] = floor.bare(r)
        if r <= 1:  # the fastest FAISS index for one query, as a reference (not a target)
            nh_f = "faiss_hash" if r == 0 else "faiss_mh_2x32"
            sfns[nh_f] = lambda q, f=fx[nh_f]: f.range_search(to_packed(q, bits), r + 1)
        p50 = single_call_p50(sfns, sq, rounds=args.single_rounds)
        cell.update({f"p50 {k}": v for k, v in p50.items()})
        cell["plan auto"] = ours["auto"].last_plan["mode"] if ours["auto"].last_plan else None
        out["cells"][r] = cell
        report_cell(name, r, cell, args)
    # one-query k-NN (k = 1): the nearest item, whatever its distance
    kfns = {mode: (lambda q, ix=ix: ix.search(q, 1)) for mode, ix in ours.items()}
    kfns.update({"old " + mode: (lambda q, ix=ix: ix.search(q, 1)) for mode, ix in old.items()})
    sq = xq[:args.single]
    for mode, ix in ours.items():
        assert np.array_equal(ix.search(sq, 1)[1], ours["single"].search(sq, 1)[1])
    out["knn1_p50"] = single_call_p50(kfns, sq, rounds=args.single_rounds)
    print(f"\n{name}: one-query search(k=1) p50 (us): " + "  ".join(
        f"{k}={v / 1000:.2f}" for k, v in out["knn1_p50"].items()), flush=True)
    return out


def report_cell(name, r, c, args):
    faiss_names = [k for k in c if isinstance(k, str) and k.startswith("faiss")]
    best_f = min(faiss_names, key=lambda k: c[k])
    us = lambda v: f"{v / 1000:.3f}"  # noqa: E731
    print(f"\n{name} r={r} (ns per query, batch {args.nq}; plan auto: {c['plan auto']})",
          flush=True)
    line = "  " + "  ".join(f"{m}={c[m]:.0f}" for m in MODES)
    line += "  |  " + "  ".join(f"{m}+stats={c[m + '+stats']:.0f}" for m in MODES)
    print(line)
    olds = [k for k in c if isinstance(k, str) and k.startswith("old ") ]
    if olds:
        print("  old: " + "  ".join(f"{k[4:]}={c[k]:.0f} (new/old {c[k[4:]] / c[k]:.2f})"
                                    for k in olds))
    print("  FAISS: " + "  ".join(f"{k[6:]}={c[k]:.0f}" for k in faiss_names))
    print(f"  auto x best FAISS ({best_f[6:]}): {c[best_f] / c['auto']:.1f}"
          + (f";  auto / floor: {c['auto'] / c['floor']:.2f}  (floor {c['floor']:.0f} ns)"
             if "floor" in c else ""))
    print("  stats cost: " + "  ".join(
        f"{m} {c[m + '+stats'] / c[m] - 1:+.0%} ({c[m + '+stats'] - c[m]:+.0f} ns)"
        for m in MODES))
    print("  single call p50 (us): " + "  ".join(
        f"{k[4:]}={us(v)}" for k, v in c.items() if isinstance(k, str) and k.startswith("p50")))
    print("  target p50 <= 3 x batch + 2 us: " + "  ".join(
        f"{m} {us(3 * c[m] + 2000)} ({'met' if c['p50 ' + m] <= 3 * c[m] + 2000 else 'not met'})"
        for m in MODES))
    met = lambda x, t: "met" if x <= t else "not met"  # noqa: E731
    if "floor" in c:
        t = FLOOR_TARGETS["batch r=0"]
        print(f"  floor, batch r=0 / floor probe (target <= {t}): " + "  ".join(
            f"{m} {c[m] / c['floor']:.2f} ({met(c[m] / c['floor'], t)})" for m in MODES))
    if r in FLOOR_TARGETS:
        t, bare = FLOOR_TARGETS[r], c["p50 floor bare"]
        print(f"  floor, one-query p50 / bare Numba call of the floor's radius-{r} probes "
              f"({us(bare)} us; target <= {t}): " + "  ".join(
                  f"{m} {c['p50 ' + m] / bare:.2f} ({met(c['p50 ' + m] / bare, t)})"
                  for m in MODES))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100k codes, 200 queries")
    parser.add_argument("--big", action="store_true", help="also 10M codes")
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--nq", type=int, default=1000)
    parser.add_argument("--data", default="uniform,clustered")
    parser.add_argument("--radii", default="0,1,2,3")
    parser.add_argument("--flips", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.5)
    parser.add_argument("--single", type=int, default=300)
    parser.add_argument("--single-rounds", type=int, default=3)
    parser.add_argument("--flat-nq", type=int, default=20)
    parser.add_argument("--base", default=None, help="checkout to compare with (old engine)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.quick:
        args.n, args.nq, args.rounds, args.min_time, args.single = 100_000, 200, 3, 0.1, 100
    args.radii = [int(r) for r in args.radii.split(",")]
    faiss.omp_set_num_threads(1)
    old_make = load_base_engine(args.base) if args.base else None
    sizes = [args.n] + ([10_000_000] if args.big else [])
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, single thread; "
          f"loadavg {open('/proc/loadavg').read().split()[:3]}; timer floor "
          f"{timer_floor_ns():.0f} ns", flush=True)
    results = []
    for n in sizes:
        for data in args.data.split(","):
            if data == "uniform":
                xb = uniform_codes(n, 64, 1)
            else:
                xb = clustered_codes(n, 64, n // 100, 0.01, 2)
            results.append(bench_dataset(f"{data}64-{n}", xb, args, old_make))
            del xb
    print(f"\nloadavg at the end {open('/proc/loadavg').read().split()[:3]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
