"""Drive the server: open loop (scheduled arrivals) or closed loop (fixed concurrency).

Open loop. Request ``i`` has an intended send time ``t_i``: ``t_0 + i / rate`` (constant
arrivals) or ``t_0 + sum_{j<i} g_j`` with ``g_j ~ Exp(mean 1 / rate)`` (Poisson arrivals, seeded).
A scheduler coroutine sleeps until ``t_i`` and starts the request without waiting for earlier
ones; at most ``max_inflight`` requests are outstanding (further ones wait for a slot, and that
wait counts in their latency, since latency runs from ``t_i``; see
:mod:`bucketsearch.loadtest.stats`). The
scheduler's lateness (``dispatch - t_i``) is the *scheduler lag*: if it grows, or the client
process uses most of a core, the client itself is the bottleneck and the run says so.

Closed loop. ``concurrency`` workers each send a request, wait for the answer, and send the next:
the offered rate is whatever the server sustains, and a stall delays later requests instead of
showing up in their latency (coordinated omission), which is what the open loop corrects.

Both modes: requests intended before ``t_0 + warmup`` are sent but not measured; the run stops
after ``duration`` measured seconds or ``requests`` measured requests, whichever comes first,
then waits (up to the request timeout) for outstanding answers. With ``processes > 1`` the
rate (open) or concurrency (closed) is split over that many client processes sharing one start
time; their records are merged.

HTTP: ``httpx.AsyncClient`` with the ``httpx-aiohttp`` transport (``HttpxAiohttpClient``), whose
throughput on 2 cores is well above httpx's default transport. The requests are encoded by
:mod:`bucketsearch.loadtest.wire` (JSON or binary wire forms, with or without the per-radius
stats) and every request carries the run's headers (``api_key`` as ``Authorization: Bearer``,
and ``headers``). Each distinct request is built into an ``httpx.Request`` once and re-sent
(``client.send``), which saves URL parsing and header building on every request. The setup
requests (readiness, index info, sample, cost model) go through
:class:`bucketsearch.loadtest.client.Client`. The event loop is asyncio's (``--loop uvloop`` is
offered; asyncio's millisecond-rounded-up timers suit the open-loop scheduler better, see
:func:`_sleep_until`).
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass, field

import httpx
import numpy as np

from bucketsearch.loadtest.client import BucketsearchError, Client, Retry
from bucketsearch.loadtest.stats import QueryStats, RequestResult
from bucketsearch.loadtest.wire import search_summary
from bucketsearch.loadtest.workload import Workload

ARRIVALS = ("constant", "poisson")
MODES = ("open", "closed")
LOOPS = ("asyncio", "uvloop")
TRANSPORTS = ("aiohttp", "httpx")
#: a client process above this CPU share (of one core) during the run is saturated
CPU_SATURATION = 0.85
#: ... and so is one whose scheduler is late by more than this (p99) or sends < 95% of target
LAG_SATURATION_MS = 5.0
RATE_SHORTFALL = 0.95
#: the open-loop scheduler yields instead of sleeping for the last SPIN_NS before a send
SPIN_NS = 1_000_000


@dataclass
class RunConfig:
    """Parameters of one load run (recorded verbatim in the JSON report)."""

    url: str = "http://127.0.0.1:8000"
    index: str = "demo"
    mode: str = "open"
    rate: float = 200.0
    arrivals: str = "constant"
    concurrency: int = 8
    max_inflight: int = 256
    duration: float = 10.0
    requests: int | None = None
    warmup: float = 1.0
    timeout: float = 10.0
    processes: int = 1
    seed: int = 0
    loop: str = "asyncio"
    transport: str = "aiohttp"
    progress: bool = True
    #: sent as ``Authorization: Bearer``; never written to a report (see :func:`config_dict`)
    api_key: str | None = None
    #: extra request headers, ``(name, value)`` pairs (only the names are reported)
    headers: tuple = ()

    def request_headers(self) -> dict:
        """The headers of every request of the run: ``headers`` and the API key."""
        out = {name: value for name, value in self.headers}
        if self.api_key is not None:
            out["authorization"] = f"Bearer {self.api_key}"
        return out

    def validate(self) -> "RunConfig":
        def bad(flag, value, allowed):
            raise ValueError(f"{flag} {value!r} is not allowed: {allowed}")
        if self.mode not in MODES:
            bad("--mode", self.mode, "open or closed")
        if self.arrivals not in ARRIVALS:
            bad("--arrivals", self.arrivals, "constant or poisson")
        if self.mode == "open" and not (self.rate > 0):
            bad("--rate", self.rate, "requests per second > 0")
        if self.concurrency < 1:
            bad("--concurrency", self.concurrency, "an integer >= 1")
        if self.max_inflight < 1:
            bad("--max-inflight", self.max_inflight, "an integer >= 1")
        if not (self.duration > 0):
            bad("--duration", self.duration, "seconds > 0")
        if self.requests is not None and self.requests < 1:
            bad("--requests", self.requests, "an integer >= 1 (or omit it)")
        if self.warmup < 0:
            bad("--warmup", self.warmup, "seconds >= 0")
        if not (self.timeout > 0):
            bad("--timeout", self.timeout, "seconds > 0")
        if self.loop not in LOOPS:
            bad("--loop", self.loop, "asyncio or uvloop")
        if self.transport not in TRANSPORTS:
            bad("--transport", self.transport, "aiohttp or httpx")
        if self.processes < 1:
            bad("--processes", self.processes, "an integer >= 1")
        if self.mode == "closed" and self.processes > self.concurrency:
            bad("--processes", self.processes, f"at most --concurrency ({self.concurrency}) "
                "in closed mode")
        if self.api_key is not None and (not self.api_key
                                         or any(c.isspace() for c in self.api_key)):
            raise ValueError("--api-key: the key must be non-empty and without whitespace "
                             "(value not shown)")
        return self


@dataclass
class RunOutcome:
    """Raw outcome of a run: every request plus what the client observed about itself."""

    results: list[RequestResult]
    start_ns: int
    measure_from_ns: int
    wall_s: float
    cpu_s: list[float]               # per client process
    max_inflight_seen: int
    target_rate: float | None
    warnings: list[str] = field(default_factory=list)

    def cpu_share(self) -> float:
        """Busiest client process's CPU time over the wall time of the run (1.0 = one core)."""
        return max(self.cpu_s) / self.wall_s if self.wall_s > 0 and self.cpu_s else 0.0


class ServerError(RuntimeError):
    """The server is unreachable or answered a setup request with an error."""


def make_client(url: str, max_connections: int, timeout: float,
                transport: str = "aiohttp", headers: dict | None = None) -> httpx.AsyncClient:
    """httpx client, keep-alive connections up to ``max_connections``, ``headers`` on every
    request; ``transport`` "aiohttp" (``httpx_aiohttp.HttpxAiohttpClient``, the default) or
    "httpx" (httpx's own transport, the baseline of the benchmark)."""
    limits = httpx.Limits(max_connections=max_connections,
                          max_keepalive_connections=max_connections)
    kw = {"base_url": url, "limits": limits, "timeout": httpx.Timeout(timeout),
          "headers": headers}
    if transport == "httpx":
        return httpx.AsyncClient(**kw)
    from httpx_aiohttp import HttpxAiohttpClient

    return HttpxAiohttpClient(**kw)


def _parse_response(res: RequestResult, content: bytes, content_type: str = "") -> None:
    res.n_results, stats, info = search_summary(content, content_type)
    if stats:
        res.server = [QueryStats.from_server(rings, info[i] if info else None, res.k)
                      for i, rings in enumerate(stats)]


class _Shared:
    """Counters a run updates for the progress bar (a multiprocessing array across processes)."""

    def __init__(self, array=None, slot: int = 0):
        self.array = array
        self.slot = slot
        self.local = 0

    def bump(self):
        self.local += 1
        if self.array is not None:
            self.array[self.slot] = self.local


async def _send(client, path, req, res_list, intended, dispatch, sem, state, shared):
    sent, status, error, content, ctype = None, 0, None, None, ""
    try:
        async with sem:
            sent = time.monotonic_ns()
            state["inflight"] += 1
            state["max_inflight"] = max(state["max_inflight"], state["inflight"])
            try:
                http_req = state["prepared"].get(id(req))
                if http_req is None:
                    http_req = state["prepared"][id(req)] = client.build_request(
                        "POST", path, params=req.params or None, content=req.body,
                        headers=req.headers)
                resp = await client.send(http_req)
                content = resp.content
                status = resp.status_code
                ctype = resp.headers.get("content-type", "")
                if status >= 300:
                    error = f"HTTP {status}"
            except httpx.TimeoutException:
                error = "timeout"
            except (httpx.HTTPError, OSError) as exc:
                error = type(exc).__name__
            finally:
                state["inflight"] -= 1
    except asyncio.CancelledError:
        # still unanswered when the run ended (see _open_loop): an error, not a lost record
        error = "no answer before the end of the run"
        _record(req, res_list, intended, dispatch, sent, status, error, None, shared)
        raise
    _record(req, res_list, intended, dispatch, sent, status, error, content, shared, ctype)


def _record(req, res_list, intended, dispatch, sent, status, error, content, shared,
            ctype=""):
    done = time.monotonic_ns()
    if sent is None:
        sent = done
    q = req.qclass
    res = RequestResult(q.label, q.radius, q.k, req.n_queries, intended, dispatch, sent, done,
                        status, error)
    if error is None and content:
        try:
            _parse_response(res, content, ctype)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            res.error = f"bad response: {type(exc).__name__}"
    res_list.append(res)
    shared.bump()


async def _sleep_until(t_ns: int) -> None:
    """Return at monotonic time ``t_ns`` or just after, never before.

    Timer sleeps end on millisecond ticks (epoll), so the loop sleeps until about 1 ms before
    ``t_ns`` and yields (``sleep(0)``, letting responses be processed) for the rest: the lag is
    a few microseconds at the median instead of about half a millisecond, for little CPU. A
    request already late is preceded by one yield, so answers keep being read in a catch-up.
    """
    yielded = False
    while True:
        delay = t_ns - time.monotonic_ns()
        if delay <= 0:
            if not yielded:
                await asyncio.sleep(0)
            return
        yielded = True
        await asyncio.sleep((delay - SPIN_NS) / 1e9 if delay > SPIN_NS + 200_000 else 0)


def _arrival_offsets(cfg: RunConfig, rate: float, seed: int, n: int) -> np.ndarray:
    """Intended send offsets (ns after t_0) of the first ``n`` requests."""
    if cfg.arrivals == "constant":
        return (np.arange(n, dtype=np.float64) * (1e9 / rate)).astype(np.int64)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1e9 / rate, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]).astype(np.int64)


async def _open_loop(cfg, workload, start_ns, rate, seed, phase_ns, first_index, stride, shared,
                     cap):
    measure_from = start_ns + int(cfg.warmup * 1e9)
    end = measure_from + int(cfg.duration * 1e9)
    # schedule enough arrivals for warm-up + duration (+ slack for Poisson)
    n_sched = int((cfg.warmup + cfg.duration) * rate * 1.5) + 16
    offsets = _arrival_offsets(cfg, rate, seed, n_sched) + phase_ns
    results: list[RequestResult] = []
    state = {"inflight": 0, "max_inflight": 0, "prepared": {}}
    sem = asyncio.Semaphore(max(1, cfg.max_inflight // cfg.processes))
    path = f"/v1/indexes/{cfg.index}/search"
    tasks = set()
    measured = 0
    async with make_client(cfg.url, max(1, cfg.max_inflight // cfg.processes), cfg.timeout,
                           cfg.transport, cfg.request_headers()) as client:
        i = 0
        while True:
            if i >= len(offsets):  # (rare: more Poisson arrivals than 1.5x the mean)
                more = _arrival_offsets(cfg, rate, seed + i, len(offsets) + 1)
                offsets = np.concatenate([offsets, offsets[-1] + int(1e9 / rate) + more])
            intended = start_ns + int(offsets[i])
            if intended >= end or (cap is not None and measured >= cap):
                break
            await _sleep_until(intended)
            dispatch = time.monotonic_ns()
            if intended >= measure_from:
                measured += 1
            req = workload[first_index + i * stride]
            task = asyncio.create_task(_send(client, path, req, results, intended, dispatch,
                                             sem, state, shared))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            _, pending = await asyncio.wait(set(tasks), timeout=cfg.timeout + 5)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
    return results, state["max_inflight"]


async def _closed_loop(cfg, workload, start_ns, concurrency, first_index, stride, shared, cap):
    measure_from = start_ns + int(cfg.warmup * 1e9)
    end = measure_from + int(cfg.duration * 1e9)
    results: list[RequestResult] = []
    state = {"inflight": 0, "max_inflight": 0, "next": 0, "measured": 0, "prepared": {}}
    sem = asyncio.Semaphore(concurrency)
    path = f"/v1/indexes/{cfg.index}/search"

    async def worker(client):
        while True:
            now = time.monotonic_ns()
            if now >= end or (cap is not None and state["measured"] >= cap):
                return
            if now >= measure_from:
                state["measured"] += 1
            i = state["next"]
            state["next"] += 1
            await _send(client, path, workload[first_index + i * stride], results, now, now,
                        sem, state, shared)

    now = time.monotonic_ns()
    if start_ns > now:
        await asyncio.sleep((start_ns - now) / 1e9)
    async with make_client(cfg.url, concurrency, cfg.timeout, cfg.transport,
                           cfg.request_headers()) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return results, state["max_inflight"]


def _runner(loop: str):
    """``asyncio.run`` or ``uvloop.run``."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run
    return asyncio.run


def _run_one(cfg: RunConfig, workload: Workload, start_ns: int, proc: int, shared) -> tuple:
    """One client process's share of the run; returns (results, cpu_s, max_inflight)."""
    cpu0 = time.process_time()
    n = cfg.processes
    cap = None   # this process's share of the measured-request budget
    if cfg.requests is not None:
        cap = cfg.requests // n + (1 if proc < cfg.requests % n else 0)
    if cfg.mode == "open":
        rate = cfg.rate / n
        # constant arrivals of process k are shifted by k / rate so the processes interleave
        phase = int(proc * 1e9 / cfg.rate) if cfg.arrivals == "constant" else 0
        coro = _open_loop(cfg, workload, start_ns, rate, cfg.seed + 1000 * proc, phase, proc,
                          n, shared, cap)
    else:
        conc = cfg.concurrency // n + (1 if proc < cfg.concurrency % n else 0)
        coro = _closed_loop(cfg, workload, start_ns, conc, proc, n, shared, cap)
    results, max_inflight = _runner(cfg.loop)(coro)
    return results, time.process_time() - cpu0, max_inflight


def _child(cfg, workload, start_ns, proc, array, queue):
    try:
        out = _run_one(cfg, workload, start_ns, proc, _Shared(array, proc))
        queue.put((proc, out, None))
    except BaseException as exc:  # report, never hang the parent
        queue.put((proc, None, f"{type(exc).__name__}: {exc}"))


def _progress_loop(cfg, counts, start_ns, stop):
    """Show a rich progress bar over the run's time budget until ``stop()`` is true."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    total_s = cfg.warmup + cfg.duration
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                  transient=False) as bar:
        task = bar.add_task(f"{cfg.mode} loop", total=total_s, info="")
        while not stop():
            elapsed = max(0.0, (time.monotonic_ns() - start_ns) / 1e9)
            done = counts()
            phase = "warm-up" if elapsed < cfg.warmup else "measuring"
            rate = done / elapsed if elapsed > 0 else 0.0
            bar.update(task, completed=min(elapsed, total_s),
                       info=f"{phase}  {done} requests  {rate:,.0f}/s")
            time.sleep(0.2)
        bar.update(task, completed=total_s, info=f"done  {counts()} requests")


def run(cfg: RunConfig, workload: Workload) -> RunOutcome:
    """Run the load test described by ``cfg`` with the requests of ``workload``."""
    cfg.validate()
    wall0 = time.monotonic()
    start_ns = time.monotonic_ns() + int(0.05e9)
    if cfg.processes == 1:
        import threading

        shared = _Shared()
        finished = threading.Event()
        bar = None
        if cfg.progress:
            bar = threading.Thread(target=_progress_loop, daemon=True,
                                   args=(cfg, lambda: shared.local, start_ns, finished.is_set))
            bar.start()
        try:
            results, cpu, max_inflight = _run_one(cfg, workload, start_ns, 0, shared)
        finally:
            finished.set()
            if bar is not None:
                bar.join(timeout=2)
        cpu_s = [cpu]
    else:
        ctx = mp.get_context("spawn")
        array = ctx.Array("q", cfg.processes, lock=False)
        queue = ctx.Queue()
        # spawning and importing takes a while: start the schedule later
        start_ns = time.monotonic_ns() + int(1.5e9)
        procs = [ctx.Process(target=_child, args=(cfg, workload, start_ns, k, array, queue),
                             daemon=True) for k in range(cfg.processes)]
        for p in procs:
            p.start()
        outs: dict[int, tuple] = {}
        import threading

        bar = None
        if cfg.progress:
            bar = threading.Thread(target=_progress_loop, daemon=True,
                                   args=(cfg, lambda: int(sum(array)), start_ns,
                                         lambda: len(outs) == cfg.processes))
            bar.start()
        deadline = time.monotonic() + cfg.warmup + cfg.duration + cfg.timeout + 60
        try:
            errors = []
            while len(outs) + len(errors) < cfg.processes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError("client processes did not finish in time")
                try:
                    proc, out, err = queue.get(timeout=min(remaining, 1.0))
                except Exception:  # queue.Empty
                    if not any(p.is_alive() for p in procs) and queue.empty():
                        raise RuntimeError("a client process died without reporting") from None
                    continue
                if err:
                    errors.append(err)
                else:
                    outs[proc] = out
            if errors:
                raise RuntimeError("client process failed: " + "; ".join(errors))
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
            if bar is not None:
                outs.update({k: (None, 0, 0) for k in range(cfg.processes) if k not in outs})
                bar.join(timeout=2)
        results = [r for k in sorted(outs) for r in (outs[k][0] or ())]
        cpu_s = [outs[k][1] for k in sorted(outs)]
        max_inflight = sum(outs[k][2] for k in outs)
    wall = time.monotonic() - wall0
    outcome = RunOutcome(results, start_ns, start_ns + int(cfg.warmup * 1e9), wall, cpu_s,
                         max_inflight, cfg.rate if cfg.mode == "open" else None)
    return outcome


def saturation_warnings(cfg: RunConfig, outcome: RunOutcome, stats) -> list[str]:
    """Why the numbers may describe the client rather than the server (empty list if none)."""
    warnings = []
    share = outcome.cpu_share()
    if share >= CPU_SATURATION:
        warnings.append(f"client saturated: a client process used {share:.0%} of a core during "
                        "the run; use --processes N or a lower --rate")
    if cfg.mode == "open":
        lag_p99 = stats.sched_lag_us.percentile(99)
        if lag_p99 is not None and lag_p99 / 1000 > LAG_SATURATION_MS:
            if share >= CPU_SATURATION:
                warnings.append(f"client saturated: scheduler lag p99 {lag_p99 / 1000:.1f} ms "
                                f"(> {LAG_SATURATION_MS} ms) with the client at {share:.0%} of "
                                "a core: requests left the client late")
            else:
                warnings.append(f"scheduler lag p99 {lag_p99 / 1000:.1f} ms (> "
                                f"{LAG_SATURATION_MS} ms) with the client at only {share:.0%} of "
                                "a core: the machine's CPUs are oversubscribed (server, client "
                                "and other load); the latencies include this lag")
        send_rate = stats.send_rate()
        if send_rate is not None and send_rate < RATE_SHORTFALL * cfg.rate:
            warnings.append(f"send rate {send_rate:,.0f}/s is below {RATE_SHORTFALL:.0%} of the "
                            f"target {cfg.rate:,.0f}/s")
        if outcome.max_inflight_seen >= cfg.max_inflight:
            warnings.append(f"in-flight cap {cfg.max_inflight} reached: the server did not keep "
                            "up with the offered rate (latencies include the wait for a slot)")
    if cfg.requests is None and stats.requests == 0:
        warnings.append("no request was measured (is --duration shorter than the warm-up?)")
    return warnings


# -- setup requests (synchronous; small) ------------------------------------------------------
def setup_client(cfg: RunConfig, timeout: float = 30.0) -> Client:
    """The blocking :class:`~bucketsearch.loadtest.client.Client` of the setup requests, with
    the run's key and headers (reads retried twice)."""
    return Client(cfg.url, timeout=max(timeout, cfg.timeout), retry=Retry(attempts=2),
                  headers=cfg.request_headers())


def setup_error(client: Client, exc: BucketsearchError) -> ServerError:
    """A one-line :class:`ServerError` for a failed setup request, saying what to do."""
    if exc.status is None:
        return ServerError(f"cannot reach the server at {client.url} ({exc.detail})")
    hint = {401: "the server wants an API key: pass it with --api-key or BUCKETSEARCH_API_KEY",
            403: "the server refused the key sent (a wrong key, or the read key where the "
                 "write key is needed): check --api-key / BUCKETSEARCH_API_KEY"}.get(exc.status)
    return ServerError(f"{exc.method} {exc.path} -> {exc.status}: {exc.detail[:200]}"
                       + (f"; {hint}" if hint else ""))


def check_server(client: Client) -> None:
    """Raise :class:`ServerError` with a one-line message unless the server answers
    ``/readyz``."""
    try:
        client.ready()
    except BucketsearchError as exc:
        if exc.status == 503:
            raise ServerError(f"server at {client.url} is not ready: GET /readyz -> 503 "
                              f"({exc.detail[:200]})") from None
        raise setup_error(client, exc) from None


def get_index(client: Client, index: str) -> dict:
    """``GET /v1/indexes/{index}``; :class:`ServerError` if absent or unreachable."""
    try:
        return client.index(index)
    except BucketsearchError as exc:
        if exc.status == 404:
            raise ServerError(f"index {index!r} does not exist on {client.url} (GET "
                              f"/v1/indexes/{index} -> 404)") from None
        raise setup_error(client, exc) from None


def get_sample(client: Client, index: str, n: int, seed: int = 0) -> tuple[np.ndarray, int]:
    """``(packed rows, live size)``: up to ``n`` codes drawn uniformly from the index's live
    items (``GET /v1/indexes/{index}/sample``), packed ``(m, ceil(bits/8))`` uint8 rows;
    :class:`ServerError` if the server cannot give them."""
    try:
        _, packed, size = client.sample(index, n, seed)
    except BucketsearchError as exc:
        if exc.status == 405 or (exc.status == 404 and f"{index!r}" not in exc.detail):
            raise ServerError(f"{exc.method} {exc.path} -> {exc.status}: this server cannot "
                              "sample the index's codes (an older version?); pass --codes FILE "
                              "with codes of the index") from None
        raise setup_error(client, exc) from None
    return packed, size


def empty_bucket_warning(outcome: RunOutcome) -> str | None:
    """A warning when every bucket probed by every measured request was empty.

    Such a run measures only misses: the queries never reach the index's codes (codes of
    another data set, another bit order, or a seed that does not match the index)."""
    probes = empty = found = with_stats = 0
    for res in outcome.results:
        if res.intended_ns < outcome.measure_from_ns or res.error or not res.server:
            continue
        with_stats += 1
        probes += sum(q.probes for q in res.server)
        empty += sum(q.empty_buckets for q in res.server)
        found += res.n_results if res.radius is not None else 0
    if not with_stats or probes == 0 or empty < probes:
        return None
    if found:
        return (f"every one of the {probes:,} buckets probed was empty, yet radius queries "
                f"found {found:,} items: they are in the delta segment (inserted since the last "
                "merge; scanned, not probed), so the probe costs measured here are those of an "
                "empty main table; merge first (POST /v1/indexes/<index>/merge)")
    return (f"every one of the {probes:,} buckets probed (all {with_stats:,} measured requests) "
            "was empty and no radius query found an item: the queries never reached the "
            "index's codes, so this run measured misses only. Likely cause: --codes holds "
            "codes of another data set (or another bit order) than the index; omit --codes "
            "to draw queries from the index itself")


def get_cost_model(client: Client, index: str) -> dict | None:
    """``GET /v1/indexes/{index}/cost-model``, or None when the server gives none."""
    try:
        return client.cost_model(index)
    except BucketsearchError:
        return None


def config_dict(cfg: RunConfig) -> dict:
    """The run's parameters for the report: the API key only as whether one was sent, the
    extra headers by name only (their values may be secrets too)."""
    out = asdict(cfg)
    out["api_key"] = "(set)" if cfg.api_key is not None else None
    out["headers"] = [name for name, _ in cfg.headers]
    out["pid"] = os.getpid()
    return out
