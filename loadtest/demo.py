"""The main job: build the embedded data set, serve it, load-test it, compare with the model.

Steps (each printed as it runs):

1. generate the embedded synthetic data set (:mod:`loadtest.dataset`: 1,000,000 clustered
   64-bit codes by default, deterministic from ``--seed``);
2. start ``bucketsearch serve`` on 127.0.0.1 (a free port, a temporary data directory), in its
   own process group, and wait for ``/readyz``;
3. create the index, load the codes as raw ``application/octet-stream`` batches (hex JSON
   batches if the server refuses raw bodies), merge them into the main table and calibrate t0;
4. run the load test: (a) an open loop with Poisson arrivals over radii 0..3 and 1-NN, for the
   measured-vs-modeled table; (b) a closed loop of radius-1 single queries at
   ``--concurrency`` (what the server sustains); (c) an open loop of radius-1 single queries at
   ``--rate`` (default 80% of (b)'s rate: latencies of a server that keeps up);
5. print the tables and the paths of the JSON reports and plots, stop the server and delete the
   temporary directory, also on Ctrl-C or SIGTERM.

With the defaults it takes about a minute on 2 cores (about 40 s of load, 5 s of loading).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bucketsearch.loadtest import dataset
from bucketsearch.loadtest.cli import (_nonneg_int, _positive_float, _positive_int, execute,
                                       write_outputs)
from bucketsearch.loadtest.report import print_report
from bucketsearch.loadtest.runner import RunConfig
from bucketsearch.loadtest.workload import QueryClass, Workload

HELP = "load-test a local server on the embedded data set: measured vs modeled cost per radius"
EPILOG = """examples:
  bucketsearch demo                             # the full demo (1M codes, radii 0..3)
  bucketsearch demo --n 100000 --duration 4     # a quicker run
  bucketsearch demo --out out/demo --rate 300 --keep-data  # a fixed open-loop rate
"""
INDEX = "demo"
READY_TIMEOUT_S = 180.0
#: the server's default max_batch is 100,000 codes per request
LOAD_CHUNK = 100_000


class DemoError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(data_dir: Path, port: int) -> list[str]:
    """``bucketsearch serve`` (through ``python -m bucketsearch``)."""
    return [sys.executable, "-m", "bucketsearch", "serve", "--data-dir", str(data_dir),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]


class ServerProcess:
    """The server in its own process group; :meth:`stop` ends the whole group."""

    def __init__(self, data_dir: Path, port: int, log_path: Path, env: dict | None = None):
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.cmd = server_command(data_dir, port)
        full_env = {**os.environ, "BUCKETSEARCH_DATA_DIR": str(data_dir), **(env or {})}
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=full_env, start_new_session=True,
                                     cwd=Path(__file__).resolve().parent.parent)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise DemoError(f"the server exited with code {self.proc.returncode} before "
                                f"it was ready; its log ({self.log_path}) ends:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise DemoError(f"the server was not ready after {timeout:.0f} s; log ends:\n"
                        f"{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        else:  # the leader is gone; make sure no worker of its group survives
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


def _check(resp: httpx.Response, what: str) -> dict:
    if resp.status_code >= 300:
        raise DemoError(f"{what} -> HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.json() if resp.content else {}


def load_index(url: str, packed: np.ndarray, bits: int, say=print) -> dict:
    """Create index ``demo`` and insert ``packed`` with ids 0..n-1; merge; return its info."""
    with httpx.Client(base_url=url, timeout=300) as client:
        _check(client.post("/v1/indexes", json={"name": INDEX, "bits": bits, "mode": "single"}),
               "POST /v1/indexes")
        t0 = time.monotonic()
        for start in range(0, len(packed), LOAD_CHUNK):
            chunk = np.ascontiguousarray(packed[start:start + LOAD_CHUNK])
            _check(client.post(f"/v1/indexes/{INDEX}/items", params={"first_id": start},
                               content=chunk.tobytes(),
                               headers={"content-type": "application/octet-stream"}),
                   f"POST /v1/indexes/{INDEX}/items")
            done = start + len(chunk)
            say(f"  inserted {done:,}/{len(packed):,} codes ({time.monotonic() - t0:.1f} s)")
        _check(client.post(f"/v1/indexes/{INDEX}/merge"), f"POST /v1/indexes/{INDEX}/merge")
        info = _check(client.get(f"/v1/indexes/{INDEX}"), f"GET /v1/indexes/{INDEX}")
        say(f"  loaded and merged in {time.monotonic() - t0:.1f} s: size "
            f"{info.get('size', '?')}, distinct codes {info.get('distinct_codes', '?')}")
        return info


def calibrate(url: str, radius: int = 2, queries: int = 256) -> dict | None:
    with httpx.Client(base_url=url, timeout=120) as client:
        resp = client.post(f"/v1/indexes/{INDEX}/cost-model/calibrate",
                           json={"queries": queries, "max_distance": radius})
        return resp.json() if resp.status_code == 200 else None


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=_positive_int("--n"), default=dataset.DEFAULT_N,
                   help="codes in the data set (default %(default)s)")
    p.add_argument("--bits", type=_positive_int("--bits"), default=dataset.DEFAULT_BITS,
                   help="bits per code (default %(default)s)")
    p.add_argument("--seed", type=_nonneg_int("--seed"), default=dataset.DEFAULT_SEED,
                   help="data set seed (default %(default)s)")
    p.add_argument("--radii", default="0-3", help="radii of the mixed run (default %(default)s)")
    p.add_argument("--mixed-rate", type=_positive_float("--mixed-rate"), default=100.0,
                   help="open-loop rate of the mixed run, Poisson arrivals (default %(default)s)")
    p.add_argument("--rate", type=_positive_float("--rate"), default=None,
                   help="open-loop rate of the radius-1 run (default: 80%% of the rate the "
                        "closed-loop run achieved just before)")
    p.add_argument("--concurrency", type=_positive_int("--concurrency"), default=4,
                   help="workers of the closed-loop run (default %(default)s)")
    p.add_argument("--duration", type=_positive_float("--duration"), default=10.0,
                   help="measured seconds of each run (default %(default)s)")
    p.add_argument("--out", type=Path, default=Path("out/demo"),
                   help="directory of the reports and plots (default %(default)s)")
    p.add_argument("--keep-data", action="store_true",
                   help="keep the server's temporary data directory")


def _validate(args) -> None:
    def bad(flag, value, allowed):
        raise ValueError(f"{flag} {value!r} is not allowed: {allowed}")
    if args.n < 1:
        bad("--n", args.n, "an integer >= 1")
    if not 1 <= args.bits <= 64:
        bad("--bits", args.bits, "1..64 (the demo's radii assume short codes)")
    for flag, value in (("--mixed-rate", args.mixed_rate), ("--rate", args.rate),
                        ("--duration", args.duration)):
        if value is not None and not value > 0:
            bad(flag, value, "a number > 0")
    if args.concurrency < 1:
        bad("--concurrency", args.concurrency, "an integer >= 1")


def run(args) -> int:
    from bucketsearch.loadtest.report import make_console
    from bucketsearch.loadtest.workload import parse_radii

    _validate(args)
    radii = parse_radii(args.radii)
    console = make_console()
    say = console.print
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="bucketsearch-demo-"))
    server = None
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    try:
        say(f"[bold]1. data[/bold]: {args.n:,} clustered {args.bits}-bit codes (seed {args.seed})")
        packed = dataset.clustered_codes(args.n, args.bits, args.seed)
        say("[bold]2. server[/bold]: starting on 127.0.0.1")
        (tmp / "data").mkdir(exist_ok=True)
        server = ServerProcess(tmp / "data", free_port(), args.out / "server.log")
        ready_s = server.wait_ready()
        say(f"  {server.url} ready in {ready_s:.1f} s ({' '.join(server.cmd[1:4])} ...)")
        say("[bold]3. index[/bold]: loading")
        load_index(server.url, packed, args.bits, say)
        cal = calibrate(server.url)
        if cal:
            say(f"  calibrated t0 = {cal.get('t0_ns') or float('nan'):.3g} ns per probe")
        runs = [
            ("mixed", RunConfig(url=server.url, index=INDEX, mode="open", arrivals="poisson",
                                rate=args.mixed_rate, duration=args.duration, warmup=1.0,
                                seed=1),
             [QueryClass(radius=r) for r in radii] + [QueryClass(k=1)]),
            ("radius1_closed", RunConfig(url=server.url, index=INDEX, mode="closed",
                                         concurrency=args.concurrency, duration=args.duration,
                                         warmup=1.0, seed=3), [QueryClass(radius=1)]),
            ("radius1_open", RunConfig(url=server.url, index=INDEX, mode="open",
                                       rate=args.rate or 1.0, duration=args.duration,
                                       warmup=1.0, seed=2), [QueryClass(radius=1)]),
        ]
        summary = []
        for step, (name, cfg, classes) in enumerate(runs, start=4):
            if name == "radius1_open" and args.rate is None:
                closed_rate = summary[-1][1]["achieved_rate"] or 10.0
                cfg.rate = max(10.0, round(0.8 * closed_rate))
            say(f"\n[bold]{step}. load test '{name}'[/bold]: {cfg.mode} loop, "
                + (f"{cfg.rate:g} req/s {cfg.arrivals}" if cfg.mode == "open"
                   else f"concurrency {cfg.concurrency}")
                + f", {', '.join(q.label for q in classes)}, {cfg.duration:g} s")
            workload = Workload(packed, args.bits, classes, batch=1, seed=cfg.seed)
            report = execute(cfg, workload, args.bits,
                             {"data": {"n": args.n, "bits": args.bits, "seed": args.seed},
                              "run": name})
            print_report(report, console)
            paths = write_outputs(report, args.out / f"{name}.json", args.out / f"{name}.png")
            summary.append((name, report, paths))
        say("\n[bold]summary[/bold]")
        for name, report, paths in summary:
            lat = report["latency_ms"]
            say(f"  {name:15s} achieved {report['achieved_rate'] or 0:8,.1f} req/s"
                + (f" (target {report['target_rate']:,.0f})" if report["target_rate"] else "")
                + f"  latency p50 {lat['p50'] or 0:.3g} ms p99 {lat['p99'] or 0:.3g} ms"
                + f"  errors {report['errors']}  -> {', '.join(paths)}")
        (args.out / "summary.json").write_text(json.dumps(
            {name: {"achieved_rate": r["achieved_rate"], "target_rate": r["target_rate"],
                    "latency_ms": r["latency_ms"], "errors": r["errors"], "files": paths}
             for name, r, paths in summary}, indent=2) + "\n")
        say(f"  server log: {server.log_path}; total {time.monotonic() - t_start:.0f} s")
        return 0
    except KeyboardInterrupt:
        say("[yellow]interrupted: stopping the server[/yellow]")
        return 130
    except DemoError as exc:
        say(f"[red]demo failed:[/red] {exc}")
        return 1
    finally:
        if server is not None:
            server.stop()
        if not args.keep_data:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            say(f"  data kept in {tmp}")
        signal.signal(signal.SIGTERM, old_term)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bucketsearch.loadtest.demo", description=HELP,
                                     epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
