"""The main job: build the embedded data set, serve it, load-test it, compare with the model.

Steps (each printed as it runs):

1. generate the embedded synthetic data set (:mod:`bucketsearch.loadtest.dataset`: 1,000,000
clustered
   64-bit codes by default, deterministic from ``--seed``);
2. start ``bucketsearch serve`` on 127.0.0.1 (a free port, a temporary data directory), in its
   own process group, and wait for ``/readyz``;
3. create the index, load the codes as raw ``application/octet-stream`` batches (hex JSON
   batches if the server refuses raw bodies), merge them into the main table and calibrate t0;
4. run the load test: (a) an open loop with Poisson arrivals over radii 0..3 and 1-NN, for the
   measured-vs-modeled table; (b) a closed loop of radius-1 single queries at
   ``--concurrency`` (what the server sustains); (c) an open loop of radius-1 single queries at
   ``--rate``, by default a rate both sides keep up with (:func:`choose_rate`): 80% of (b)'s
   rate, lowered until a short open-loop probe at that rate raises none of the load tester's
   saturation warnings (client CPU, scheduler lag, send-rate shortfall), so the latencies are
   those of a server that keeps up, sent by a client that keeps up;
5. print the tables and the paths of the JSON reports and plots, stop the server and delete the
   temporary directory, also on Ctrl-C or SIGTERM; with ``--keep-serving`` the server stays up
   (its address and the dashboard's are printed last) until Ctrl-C or SIGTERM.

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
from dataclasses import dataclass, replace
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
  bucketsearch demo --keep-serving --port 8000  # then explore http://127.0.0.1:8000/ui
"""
INDEX = "demo"
READY_TIMEOUT_S = 180.0
#: the demo prints a line at least this often while the server starts (first start: compiling)
PROGRESS_EVERY_S = 5.0
#: the server's default max_batch is 100,000 codes per request
LOAD_CHUNK = 100_000
#: the open-loop rate of run (c): this share of the closed-loop rate of run (b) at most ...
OPEN_SHARE_OF_CLOSED = 0.8
#: ... lowered by this factor after a probe with a saturation warning, at most PROBES times
PROBE_BACKOFF = 0.7
PROBES = 8  # a fast server's closed-loop rate can be 5-8x what one open-loop client sends
PROBE_S = 2.0
PROBE_WARMUP_S = 0.5
MIN_RATE = 10.0


class DemoError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(data_dir: Path, port: int) -> list[str]:
    """``bucketsearch serve`` (through ``python -m bucketsearch``): its log gets the start-up
    phases, merges and errors, not a line per request."""
    return [sys.executable, "-m", "bucketsearch", "serve", "--data-dir", str(data_dir),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "info",
            "--no-access-log"]


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

    def wait_ready(self, timeout: float = READY_TIMEOUT_S, say=None,
                   every_s: float = PROGRESS_EVERY_S) -> float:
        """Seconds until ``/readyz`` answered 200; with ``say``, every ``every_s`` seconds a
        line with the server log's last line (its start-up phase: compiling kernels,
        calibrating), so a first start that compiles is never a silent stretch."""
        t0 = time.monotonic()
        told = t0
        while time.monotonic() - t0 < timeout:
            if say is not None and time.monotonic() - told >= every_s:
                told = time.monotonic()
                last = self.log_tail(1).strip()
                say(f"  ... {told - t0:.0f} s, the server is still starting"
                    + (f": {last[-100:]}" if last else ""))
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


@dataclass
class Probe:
    """What a short open loop at ``rate`` showed: the load tester's saturation warnings, the
    client's CPU share of a core and the scheduler lag p99 (ms)."""

    rate: float
    warnings: list[str]
    cpu_share: float
    lag_p99_ms: float

    def client_bound(self) -> bool:
        """The client itself could not keep up (CPU or send-rate warning)."""
        return any(w.startswith(CLIENT_WARNINGS) for w in self.warnings)


#: saturation warnings (loadtest.runner.saturation_warnings) that a lower rate cures; the other
#: one, scheduler lag with the client mostly idle, comes from the machine's load
CLIENT_WARNINGS = ("client saturated", "send rate")


def run_probe(cfg: RunConfig, workload: Workload) -> Probe:
    """A short open loop at ``cfg.rate`` (:data:`PROBE_S` measured seconds, no progress bar)."""
    from bucketsearch.loadtest.runner import run as run_load
    from bucketsearch.loadtest.runner import saturation_warnings
    from bucketsearch.loadtest.stats import LoadStats

    probe = replace(cfg, duration=PROBE_S, warmup=PROBE_WARMUP_S, progress=False)
    outcome = run_load(probe, workload)
    stats = LoadStats(outcome.measure_from_ns).add_all(outcome.results)
    lag = stats.sched_lag_us.percentile(99)
    return Probe(cfg.rate, saturation_warnings(probe, outcome, stats), outcome.cpu_share(),
                 0.0 if lag is None else lag / 1000)


def choose_rate(closed_rate: float, probe, say=print) -> tuple[float, str]:
    """The open-loop rate of run (c) and why.

    Start at :data:`OPEN_SHARE_OF_CLOSED` of the closed-loop rate (what server and client
    sustain together) and probe it (``probe(rate) -> Probe``); after a probe with a saturation
    warning, lower the rate by :data:`PROBE_BACKOFF` (at most :data:`PROBES` probes, never
    below :data:`MIN_RATE`). One exception: when the only warning is scheduler lag and a lower
    rate did not shorten it (p99 not below 0.8x), the lag comes from other load on the machine,
    not from this rate: keep the higher rate."""
    rate = max(MIN_RATE, round(OPEN_SHARE_OF_CLOSED * closed_rate))
    basis = f"{OPEN_SHARE_OF_CLOSED:.0%} of the closed-loop rate {closed_rate:,.0f} req/s"
    previous = None

    def lowered(times: int) -> str:
        return f", lowered {times}x by {PROBE_BACKOFF:g} after probes that warned" if times \
            else ""

    for attempt in range(1, PROBES + 1):
        result = probe(rate)
        if not result.warnings:
            say(f"  probe {attempt}: {rate:,.0f} req/s sent on time, client at "
                f"{result.cpu_share:.0%} of a core, no saturation warning")
            return rate, (f"{basis}{lowered(attempt - 1)}; a {PROBE_S:g} s probe at this rate "
                          "raised no saturation warning")
        say(f"  probe {attempt}: {rate:,.0f} req/s -> {result.warnings[0]}")
        if (previous is not None and not result.client_bound() and not previous.client_bound()
                and result.lag_p99_ms >= 0.8 * previous.lag_p99_ms):
            return previous.rate, (
                f"{basis}{lowered(attempt - 2)}; at {rate:,.0f} req/s the scheduler lag (p99 "
                f"{result.lag_p99_ms:.1f} ms) was no shorter than at {previous.rate:,.0f} "
                f"(p99 {previous.lag_p99_ms:.1f} ms) with the client at "
                f"{result.cpu_share:.0%} of a core: other load on the machine, not the rate, "
                "delays the client; the run's latencies include that lag")
        if rate <= MIN_RATE:
            break
        previous = result
        rate = max(MIN_RATE, round(rate * PROBE_BACKOFF))
    return rate, (f"{basis}, lowered to {rate:,.0f} req/s; every probe warned (the machine is "
                  "busy): the run may warn too")


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
                        f"closed-loop run achieved just before, lowered while a {PROBE_S:g} s "
                        "probe at that rate draws a saturation warning; the choice is printed)")
    p.add_argument("--concurrency", type=_positive_int("--concurrency"), default=4,
                   help="workers of the closed-loop run (default %(default)s)")
    p.add_argument("--duration", type=_positive_float("--duration"), default=10.0,
                   help="measured seconds of each run (default %(default)s)")
    p.add_argument("--out", type=Path, default=Path("out/demo"),
                   help="directory of the reports and plots (default %(default)s)")
    p.add_argument("--keep-data", action="store_true",
                   help="keep the server's temporary data directory")
    p.add_argument("--keep-serving", action="store_true",
                   help="leave the server up after the demo (its address and the dashboard's "
                        "are printed last) until Ctrl-C or SIGTERM")
    p.add_argument("--port", type=_nonneg_int("--port"), default=0,
                   help="the server's port on 127.0.0.1 (default: a free port)")


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
    if not 0 <= args.port <= 65535:
        bad("--port", args.port, "0 (a free port) or 1..65535")


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
        server = ServerProcess(tmp / "data", args.port or free_port(), args.out / "server.log")
        ready_s = server.wait_ready(say=say)
        say(f"  {server.url} ready in {ready_s:.1f} s ({' '.join(server.cmd[1:4])} ...)")
        say("[bold]3. index[/bold]: loading")
        load_index(server.url, packed, args.bits, say)
        cal = calibrate(server.url)
        if cal:
            for est in cal.get("estimates") or []:  # every estimate, named, one answer each
                if est.get("t0_ns") is None:  # e.g. observed searches: none yet
                    continue
                ci = est.get("ci_ns")
                say(f"  t0 ({est.get('source')}, {est.get('estimator')}) = "
                    f"{est.get('t0_ns') or float('nan'):.3g} ns per probe"
                    + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else ""))
            say(f"  t0 used for the modeled cost: {cal.get('t0_ns') or float('nan'):.3g} ns "
                f"({cal.get('t0_source')}, {cal.get('t0_estimator')}); estimates "
                f"{(cal.get('verdicts') or {}).get('t0_agreement', {}).get('verdict', '')}")
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
            workload = Workload(packed, args.bits, classes, batch=1, seed=cfg.seed)
            if name == "radius1_open":
                if args.rate is None:
                    say(f"\n[bold]{step}. open-loop rate[/bold]: measuring what the client "
                        "sends without saturating")
                    cfg.rate, why = choose_rate(
                        summary[-1][1]["achieved_rate"] or MIN_RATE,
                        lambda rate: run_probe(replace(cfg, rate=rate), workload), say)
                    say(f"  chose {cfg.rate:,.0f} req/s: {why}")
                else:
                    say(f"\n[bold]{step}. open-loop rate[/bold]: {cfg.rate:g} req/s (--rate)")
                step += 1
            say(f"\n[bold]{step}. load test '{name}'[/bold]: {cfg.mode} loop, "
                + (f"{cfg.rate:g} req/s {cfg.arrivals}" if cfg.mode == "open"
                   else f"concurrency {cfg.concurrency}")
                + f", {', '.join(q.label for q in classes)}, {cfg.duration:g} s")
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
                    "latency_ms": r["latency_ms"], "errors": r["errors"],
                    "warnings": r["warnings"], "files": paths}
             for name, r, paths in summary}, indent=2) + "\n")
        say(f"  server log: {server.log_path}; total {time.monotonic() - t_start:.0f} s")
        if args.keep_serving:
            say(f"\n[bold]serving[/bold] index '{INDEX}' ({args.n:,} codes) until Ctrl-C; "
                f"dashboard {server.url}/ui, API docs {server.url}/docs")
            say(f"server: {server.url}")
            try:
                while server.proc.poll() is None:
                    time.sleep(0.5)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the way to end --keep-serving
                say("stopping the server")
                return 0
            raise DemoError(f"the server exited with code {server.proc.returncode}; its log "
                            f"({server.log_path}) ends:\n{server.log_tail()}")
        say(f"server: {server.url} (stopped; --keep-serving leaves it up)")
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
