"""``bucketsearch dedup``: every near-duplicate of a code file, in process (issue 27).

Reads the codes (``.npy``, raw packed rows, or hex lines: :mod:`bucketsearch.index.codefiles`; item
ids are
row numbers from 0), runs the self-join (:func:`bucketsearch.index.join.pairs`) with a progress bar,
and writes one of:

* ``pairs``: every pair within the radius once, ``a < b``, ordered by (a, b): CSV ``a,b,distance``
  with a header, or NDJSON ``{"a": .., "b": .., "distance": ..}`` (by the suffix of ``--out``:
  ``.ndjson`` / ``.jsonl``, else CSV; or ``--format-out``);
* ``clusters``: the connected components of the pair graph, one ``id,label`` row per item (the
  label is the smallest id of its component);
* ``keep``: the ids kept by the rule "keep the first item (lowest id), drop every later item
  within r of a kept one", one per line.

The result is written to ``FILE.partial`` and renamed to ``FILE`` only once complete. Bad input
is one line on stderr naming the flag and the value, exit status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

import numpy as np

from bucketsearch.index.codefiles import FORMATS, read_codes_file
from bucketsearch.index.codes import MAX_BITS, MIN_BITS
from bucketsearch.index.join import JoinStats, components, keep_first, pairs
from bucketsearch.index.scan import LinearScan

HELP = "all near-duplicate pairs, clusters or a keep-list of a code file, in process"
OUTPUTS = ("pairs", "clusters", "keep")
PAIR_FORMATS = ("csv", "ndjson")
EPILOG = """examples:
  # every pair of SimHash codes within 3 bits, as CSV (a,b,distance)
  bucketsearch dedup simhash.npy --bits 64 --radius 3 --output pairs --out pairs.csv
  # PDQ hashes, one hex code a line: clusters within 31 bits (id,label)
  bucketsearch dedup pdq.txt --bits 256 --radius 31 --output clusters --out clusters.csv
  # the ids to keep (first of each near-duplicate group), from raw packed 64-bit codes
  bucketsearch dedup codes.bin --bits 64 --radius 4 --output keep --out keep.txt
  # pairs as NDJSON on stdout, no progress bar
  bucketsearch dedup codes.npy --bits 64 --radius 2 --out - --format-out ndjson --no-progress
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("codes", metavar="CODES",
                   help="code file: .npy (bits, packed rows or uint64 words), raw packed rows "
                        "(.bin), or hex codes one per line; item ids are row numbers from 0")
    p.add_argument("--bits", required=True, metavar="Q", help=f"code length, {MIN_BITS}-{MAX_BITS}")
    p.add_argument("--radius", required=True, metavar="R",
                   help="Hamming radius: pairs with distance <= R")
    p.add_argument("--output", default="pairs", metavar="KIND",
                   help=f"what to write: {' | '.join(OUTPUTS)} (default pairs)")
    p.add_argument("--out", required=True, metavar="FILE", help="result file, '-' for stdout")
    p.add_argument("--format", default="auto", metavar="FMT",
                   help=f"input format: {' | '.join(FORMATS)} (default auto: .npy by its "
                        "magic, .bin/.packed/.raw/.u8 as raw packed rows, else hex lines)")
    p.add_argument("--format-out", default=None, metavar="FMT",
                   help=f"pairs and clusters as {' | '.join(PAIR_FORMATS)} (default: by the "
                        "suffix of --out, .ndjson/.jsonl as NDJSON, else CSV)")
    p.add_argument("--chunk-size", default="65536", metavar="N",
                   help="pairs per chunk of the stream (default 65536)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _int_flag(flag: str, value, lo: int, hi: int | None = None) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        out = None
    if out is None or out < lo or (hi is not None and out > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{flag} must be an int in {rng}, got {value!r}")
    return out


def _choice(flag: str, value, allowed) -> str:
    if value not in allowed:
        raise ValueError(f"{flag} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def run(args) -> int:
    bits = _int_flag("--bits", args.bits, MIN_BITS, MAX_BITS)
    radius = _int_flag("--radius", args.radius, 0, bits)
    output = _choice("--output", args.output, OUTPUTS)
    fmt = _choice("--format", args.format, FORMATS)
    chunk_size = _int_flag("--chunk-size", args.chunk_size, 1)
    out_fmt = args.format_out
    if out_fmt is None:
        out_fmt = "ndjson" if str(args.out).lower().endswith((".ndjson", ".jsonl")) else "csv"
    out_fmt = _choice("--format-out", out_fmt, PAIR_FORMATS)
    if args.out != "-":
        parent = Path(args.out).resolve().parent
        if not parent.is_dir():
            raise ValueError(f"--out {args.out!r}: the folder {str(parent)!r} does not exist")
    words = read_codes_file(args.codes, bits, flag="CODES", fmt=fmt)
    index = LinearScan.of_items_by_id(bits, words, np.arange(len(words), dtype=np.int64))
    stats = JoinStats()
    stream = pairs(index, radius, chunk_size=chunk_size, stats=stats)
    with _Progress(stats, enabled=not args.no_progress), _Output(args.out) as f:
        if output == "pairs":
            _write_pairs(f, stream, out_fmt)
        elif output == "clusters":
            ids, labels = components(index, stream)
            _write_rows(f, ("id", "label"), ids, labels, out_fmt)
        else:
            for i in keep_first(index, stream):
                f.write(f"{int(i)}\n")
    p = stats.prediction
    plan_s = stats.phases.get("plan", {}).get("measured_s", 0.0)
    print(f"dedup: {len(words):,} codes, radius {radius}: {stats.pairs:,} pairs "
          f"({stats.algorithm} {stats.params or ''}) in {stats.elapsed_s:.2f} s, of which the "
          f"plan {plan_s:.2f} s (the cost model's calibration, once a process, included)"
          + (f"; the join predicted {p.seconds:.2f} s, measured {stats.elapsed_s - plan_s:.2f} s"
             if p else "")
          + (f"; {output} written to {args.out}" if args.out != "-" else ""), file=sys.stderr)
    return 0


def _write_pairs(f, stream, fmt: str) -> None:
    if fmt == "csv":
        f.write("a,b,distance\n")
    for ch in stream:
        _write_rows(f, None, ch.a, ch.b, fmt, ch.d)


def _write_rows(f, header, x, y, fmt: str, z=None) -> None:
    names = ("a", "b", "distance") if header is None else header
    if fmt == "csv":
        if header is not None:
            f.write(",".join(header) + "\n")
        cols = (x, y) if z is None else (x, y, z)
        if len(x):
            np.savetxt(f, np.column_stack(cols), fmt="%d", delimiter=",")
        return
    cols = (x.tolist(), y.tolist()) + (() if z is None else (z.tolist(),))
    f.write("".join(json.dumps(dict(zip(names, row))) + "\n" for row in zip(*cols)))


class _Output:
    """A text file written as ``FILE.partial`` and renamed to ``FILE`` once complete (removed on
    an error), or stdout for ``-``."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        if self.path == "-":
            return sys.stdout
        self.tmp = f"{self.path}.partial"
        self.f = open(self.tmp, "w", encoding="utf-8")
        return self.f

    def __exit__(self, exc_type, *exc):
        if self.path == "-":
            sys.stdout.flush()
            return
        self.f.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            Path(self.tmp).unlink(missing_ok=True)


class _Progress:
    """A rich progress bar on stderr fed by a :class:`JoinStats` (polled by a thread): the
    fraction of the pair search done, pairs found, elapsed and the model's remaining time."""

    def __init__(self, stats: JoinStats, enabled: bool):
        self.stats, self.enabled = stats, enabled

    def __enter__(self):
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("[bold]dedup"), BarColumn(),
                                 TextColumn("{task.percentage:>5.1f}%"),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=False)
        self.task = self.progress.add_task("join", total=1.0, info="planning")
        self.progress.start()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _update(self):
        st = self.stats
        left = st.remaining_s()
        info = (f"{st.algorithm or 'planning'}: {st.pairs:,} pairs, {st.items_done:,}/"
                f"{st.items:,} items done"
                + (f", ~{left:.0f} s left (model)" if left is not None else ""))
        self.progress.update(self.task, completed=min(st.progress, 1.0), info=info)

    def _poll(self):
        while not self._stop.wait(0.2):
            self._update()

    def __exit__(self, *exc):
        if not self.enabled:
            return
        self._stop.set()
        self._thread.join()
        self._update()
        self.progress.stop()


__all__ = ["EPILOG", "HELP", "add_arguments", "run"]
