"""A server's restart to ready (``/readyz`` 200) from its snapshot, phase by phase, beside
another checkout's server on the same data directory (issue 28, item 5: "restarted to ready
from its snapshot in seconds").

    .venv/bin/python -u bench/bench_restart.py --n 10000000 --base /tmp/base_tree
    .venv/bin/python -u bench/bench_restart.py --n 20000000 --base /tmp/base_tree --cold --mmap-too

One real server of this tree (``bucketsearch.app.main:create_app`` under uvicorn, default
settings but a 256 MiB body limit) bulk-loads ``--n`` uniform 64-bit codes over the binary
wire (``Client.add``) into a fresh data directory in ``--mode`` (default ``auto``), waits until
its merges are done and stops. Then, ``--rounds`` times, each tree's server (this one;
``--mmap-too``: this one with ``BUCKETSEARCH_MMAP=1``; ``--base DIR`` run by
``DIR/.venv/bin/python``, its own install and numba cache) is started on that data directory,
in alternating order, timed from ``Popen`` to ``/readyz`` 200, and stopped (SIGTERM). A first start of each tree, not counted, fills its numba cache.
``--cold`` drops the data directory's files from the page cache before each start
(``posix_fadvise(DONTNEED)``: the snapshot is read from the disk, as after a reboot or
when other processes took the memory).

Printed per start: time to ready, the phases the server logs (``startup``: ready after
start-up began; ``indexes``: every index loaded, of which ``snapshot``: the base snapshot read,
every checksum verified, its index made, and ``replay``: the log after it replayed; ``kernels``:
every kernel compiled or loaded from numba's cache; ``calibration``: each index touched and its
t0 calibrated; "-" where the base logs none), the
server's resident memory (VmRSS, VmHWM) and the load average; then per tree the median of the
rounds and the ratio this / base. The process start before start-up (imports) is the time to
ready minus "ready in".
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_serve_scale import rss_kib, start, wait_merged  # noqa: E402
from bench_server import free_port  # noqa: E402

from bucketsearch.loadtest.client import Client  # noqa: E402

BITS = 64
#: the phases a server logs, each a regular expression whose group 1 is its seconds
PHASES = {
    "snapshot": r"snapshot \d+ read, every checksum verified, in ([\d.]+) s",
    "replay": r"WAL records of \d+ segments replayed in ([\d.]+) s",
    "indexes": r"loading indexes: .* in ([\d.]+) s",
    "kernels": r"warm-up: \d+ kernel signatures .* in ([\d.]+) s",
    "calibration": r"calibration: \d+ indexes in ([\d.]+) s",
    "startup": r"ready in ([\d.]+) s",
}


def phases(log: str) -> dict[str, float | None]:
    """The seconds of each of :data:`PHASES` in a server's log (None: not logged)."""
    out = {}
    for name, pattern in PHASES.items():
        found = re.findall(pattern, log)
        out[name] = float(found[-1]) if found else None
    return out


def evict(data: Path) -> None:
    """Drop every file under ``data`` from the page cache (clean pages only: the files were
    written and synced long before)."""
    for path in data.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def restart(tree: tuple[str, dict], data: Path, cwd: Path, log_path: Path,
            timeout: float) -> dict:
    """Start a server of ``tree`` (its python, extra environment) on ``data``; the seconds to
    ``/readyz`` 200, its logged phases and resident memory; then stop it."""
    python, extra = tree
    port = free_port()
    env = {**os.environ, "BUCKETSEARCH_DATA_DIR": str(data),
           "BUCKETSEARCH_MAX_BODY_BYTES": str(256 << 20), "PYTHONPATH": "", **extra}
    with open(log_path, "w") as log:
        t = time.perf_counter()
        proc = subprocess.Popen(
            [python, "-m", "uvicorn", "bucketsearch.app.main:create_app", "--factory",
             "--host", "127.0.0.1", "--port", str(port), "--log-level", "info"],
            cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{python}: no /readyz 200 (exit {proc.returncode}); "
                                       f"log {log_path}:\n{log_path.read_text()[-3000:]}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)
            ready = time.perf_counter() - t
            mem = rss_kib(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
    return {"ready": ready, **phases(log_path.read_text()),
            "rss_gib": mem["VmRSS"] / 2**20, "hwm_gib": mem["VmHWM"] / 2**20,
            "load": float(open("/proc/loadavg").read().split()[0])}


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


COLUMNS = ("ready", "startup", "indexes", "snapshot", "replay", "kernels", "calibration")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000_000, help="codes loaded")
    ap.add_argument("--mode", default="auto", choices=("auto", "single", "mih", "scan"))
    ap.add_argument("--rounds", type=int, default=3, help="counted starts of each tree")
    ap.add_argument("--base", default="", metavar="DIR",
                    help="another checkout with its own .venv (make .venv/.installed there)")
    ap.add_argument("--mmap-too", action="store_true",
                    help="also this tree with BUCKETSEARCH_MMAP=1 (the snapshot mapped)")
    ap.add_argument("--cold", action="store_true",
                    help="drop the data directory from the page cache before each start")
    ap.add_argument("--batch", type=int, default=1_000_000, help="codes per add request")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--dir", help="parent of the data directory (default: the system's tmp)")
    args = ap.parse_args(argv)

    trees = {"this": (sys.executable, {})}
    if args.mmap_too:
        trees["mmap"] = (sys.executable, {"BUCKETSEARCH_MMAP": "1"})
    if args.base:
        trees["base"] = (str(Path(args.base).resolve() / ".venv" / "bin" / "python"), {})
    words = np.random.default_rng(0).integers(0, 2**64 - 1, size=args.n, dtype=np.uint64,
                                              endpoint=True)
    print(f"n = {args.n:,} uniform {BITS}-bit codes, mode {args.mode}; trees: "
          + ", ".join(f"{k} {v[0]} {v[1] or ''}".rstrip() for k, v in trees.items())
          + f"; page cache {'dropped before each start' if args.cold else 'as it is'}; "
          f"loadavg {open('/proc/loadavg').read().split()[0]}", flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        data, logs = Path(tmp) / "data", Path(tmp) / "logs"
        logs.mkdir()
        server = start(data, Path(tmp), args.batch)
        try:
            server.wait("/readyz", timeout=args.timeout)
            with Client(server.url, timeout=3600) as client:
                client.create_index("restart", BITS, mode=args.mode)
                t = time.perf_counter()
                client.add("restart", words.reshape(-1, 1), first_id=0, progress=False)
                wait_merged(server.url, "restart", args.timeout)
                print(f"loaded and merged in {time.perf_counter() - t:.1f} s", flush=True)
        finally:
            server.stop()
        del words
        snap = sum(f.stat().st_size for f in data.rglob("snap-*/*") if f.is_file())
        print(f"snapshots on disk: {snap / 2**30:.2f} GiB (both generations)", flush=True)
        for name, tree in trees.items():  # fill each tree's numba cache: not counted
            restart(tree, data, Path(tmp), logs / f"{name}-first.log", args.timeout)
        print(f"\n{'round':>5} {'tree':>4} " + " ".join(f"{c:>11}" for c in COLUMNS)
              + f" {'RSS GiB':>8} {'peak GiB':>8} {'loadavg':>7}", flush=True)
        results: dict[str, list[dict]] = {name: [] for name in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))  # alternating
            for name in order:
                if args.cold:
                    evict(data)
                got = restart(trees[name], data, Path(tmp), logs / f"{name}-{r}.log",
                              args.timeout)
                results[name].append(got)
                print(f"{r:>5} {name:>4} " + " ".join(f"{fmt(got[c]):>11}" for c in COLUMNS)
                      + f" {got['rss_gib']:>8.2f} {got['hwm_gib']:>8.2f} {got['load']:>7.2f}",
                      flush=True)
        print("\nmedians (s):")
        medians = {}
        for name, runs in results.items():
            medians[name] = {c: (statistics.median(v[c] for v in runs)
                                 if all(v[c] is not None for v in runs) else None)
                             for c in COLUMNS}
            print(f"  {name:>4} " + " ".join(f"{c} {fmt(medians[name][c])}" for c in COLUMNS))
        for name in ("this", "mmap") if "base" in medians else ():
            if name in medians:
                ratios = {c: medians[name][c] / medians["base"][c] for c in COLUMNS
                          if medians[name][c] is not None and medians["base"][c]}
                print(f"  {name} / base: "
                      + ", ".join(f"{c} {v:.2f}" for c, v in ratios.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
