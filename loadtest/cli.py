"""``bucketsearch-loadtest`` (also ``python -m bucketsearch.loadtest``): drive a server.

Sends a seeded mix of radius and k-NN searches to ``POST /v1/indexes/{index}/search`` in an open
loop (scheduled arrivals, latency corrected for coordinated omission) or a closed loop (fixed
concurrency), then fetches the server's cost model and prints measured vs modeled cost per
radius. See :mod:`bucketsearch.loadtest.runner` and :mod:`bucketsearch.loadtest.stats` for the
definitions.

For a real deployment: ``--api-key`` (or ``BUCKETSEARCH_API_KEY``) and ``--header``, the
binary wire forms (``--wire binary``), ``--stats/--no-stats``, thresholds (``--slo``, exit
status 99 on a breach, :mod:`bucketsearch.loadtest.report`), a per-second CSV and an HDR histogram
log (:mod:`bucketsearch.loadtest.export`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from bucketsearch import __version__
from bucketsearch.index.codefiles import read_codes_file
from bucketsearch.index.codes import MAX_BITS, to_packed
from bucketsearch.loadtest import dataset
from bucketsearch.loadtest.export import per_second, write_csv, write_hdr_log
from bucketsearch.loadtest.report import (SLO_EXIT, SLO_HELP, build_report, evaluate_slos,
                                          parse_slos, plot_report, print_report, print_slos)
from bucketsearch.loadtest.runner import (ARRIVALS, LOOPS, MODES, TRANSPORTS, RunConfig,
                                          ServerError, check_server, config_dict,
                                          empty_bucket_warning, get_cost_model, get_index,
                                          get_sample, run, saturation_warnings, setup_client)
from bucketsearch.loadtest.stats import LoadStats
from bucketsearch.loadtest.wire import WIRES
from bucketsearch.loadtest.workload import QueryClass, Workload, parse_radii

#: ``--codes`` value naming the embedded data set
SYNTHETIC = "synthetic"
#: where ``--api-key`` is read from when the flag is not given
API_KEY_ENV = "BUCKETSEARCH_API_KEY"
#: the server's limit on one sample (app/routers/sample.py)
MAX_SAMPLE = 10_000

EXAMPLES = """examples:
  # open loop, 300 radius-1 single queries per second for 10 s, JSON report and plot
  bucketsearch-loadtest --url http://127.0.0.1:8000 --index demo --mode open --rate 300 \\
      --radii 1 --duration 10 --json out/load.json --plot out/load.png
  # closed loop, 8 concurrent clients, radii 0..3 and 10-NN, batches of 16 queries
  bucketsearch-loadtest --index demo --mode closed --concurrency 8 --radii 0-3 --knn 10 \\
      --batch 16 --requests 2000
  # Poisson arrivals from 2 client processes; queries drawn from your own codes
  bucketsearch-loadtest --index mine --rate 600 --arrivals poisson --processes 2 \\
      --codes my_codes.npy
  # a keyed deployment, binary wire forms, no stats (what production clients send); exit 99
  # when a threshold is breached
  BUCKETSEARCH_API_KEY=... bucketsearch-loadtest --url https://search.example --index mine \\
      --wire binary --rate 500 --slo 'p99<20ms' --slo 'error_rate<0.1%' \\
      --csv out/seconds.csv --hdr-log out/latency.hlog

Latency is measured from the intended send time (open loop: coordinated omission corrected),
service time from the actual send. Percentiles are nearest-rank over an HDR histogram.
Queries are codes drawn from the target index itself (GET /v1/indexes/{index}/sample, up to
--sample codes), or from --codes FILE, with exactly r bits flipped for a radius-r query (so
each finds its source code on its outermost ring) and none for k-NN. --codes takes what an
insert takes: a .npy of bits (n, bits) in {0,1} or {-1,+1}, packed uint8 rows
(n, ceil(bits/8)), or uint64 words (n, ceil(bits/64)); or a text file of hex codes, one per
line. `--codes synthetic` is the embedded data set (the one `demo` loads; --data-n,
--data-seed). A run whose every probed bucket was empty ends with a warning.

--wire json sends hex codes in JSON; --wire binary packed codes as application/octet-stream
with a binary answer. --stats asks for the server's per-radius counters (the measured vs
modeled table); it is the default with --wire json, --no-stats the default with --wire binary
(whose answer has no stats; with --stats the answers come as JSON). Without stats the report
gives the client-side figures only and says why. Exit status: 0, 1 (the server could not be
used or every request failed), 2 (invalid input), 99 (a --slo threshold was breached).
"""


def _int_at_least(flag, low):
    """argparse type: an integer >= ``low``; the error names the flag, the value and the rule."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: not an integer "
                                             f"(allowed: an integer >= {low})") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{flag} {value}: must be an integer >= {low}")
        return value
    return parse


def _int_in_range(flag, low, high):
    """argparse type: an integer in ``[low, high]``."""
    at_least = _int_at_least(flag, low)

    def parse(text):
        value = at_least(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{flag} {value}: above the limit {high} "
                                             f"(allowed: {low}..{high})")
        return value
    return parse


def _positive_int(flag):
    return _int_at_least(flag, 1)


def _nonneg_int(flag):
    return _int_at_least(flag, 0)


def _positive_float(flag, allow_zero=False):
    allowed = "a finite number " + (">= 0" if allow_zero else "> 0")

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: not a number "
                                             f"(allowed: {allowed})") from None
        if not math.isfinite(value) or not (value >= 0 if allow_zero else value > 0):
            raise argparse.ArgumentTypeError(f"{flag} {text}: not allowed (allowed: {allowed})")
        return value
    return parse


def _radii(text):
    try:
        return parse_radii(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _knn(text):
    out = []
    for part in str(text).split(","):
        if not part.strip():
            continue
        try:
            k = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--knn {text!r}: {part!r} is not an integer "
                                             "(allowed: comma-separated k >= 1)") from None
        if k < 1:
            raise argparse.ArgumentTypeError(f"--knn {text!r}: k must be >= 1")
        out.append(k)
    return sorted(set(out))


def _header(text):
    """argparse type: ``"Name: value"`` -> ``(name, value)``."""
    name, sep, value = str(text).partition(":")
    if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
        raise argparse.ArgumentTypeError(f"--header {text!r}: not 'Name: value' (allowed: a "
                                         "header name without spaces, a colon, the value)")
    return name.strip(), value.strip()


def _slo(text):
    try:
        return parse_slos(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The load-test flags (shared with the demo)."""
    g = p.add_argument_group("target")
    g.add_argument("--url", default="http://127.0.0.1:8000",
                   help="server base URL (default %(default)s)")
    g.add_argument("--index", default="demo", help="index name (default %(default)s)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"sent as 'Authorization: Bearer KEY' on every request (default: the "
                        f"{API_KEY_ENV} environment variable, if set)")
    g.add_argument("--header", type=_header, action="append", default=[], metavar="'N: V'",
                   help="an extra request header, e.g. 'X-Tenant: a' (repeatable)")
    g = p.add_argument_group("load")
    g.add_argument("--mode", choices=MODES, default="open",
                   help="open: scheduled arrivals at --rate; closed: --concurrency workers each "
                        "waiting for its answer (default %(default)s)")
    g.add_argument("--rate", type=_positive_float("--rate"), default=200.0,
                   help="open loop: target requests per second (default %(default)s)")
    g.add_argument("--arrivals", choices=ARRIVALS, default="constant",
                   help="open loop: constant intervals or Poisson arrivals (default %(default)s)")
    g.add_argument("--concurrency", type=_positive_int("--concurrency"), default=8,
                   help="closed loop: concurrent workers (default %(default)s)")
    g.add_argument("--max-inflight", type=_positive_int("--max-inflight"), default=256,
                   help="open loop: cap on outstanding requests / connections "
                        "(default %(default)s)")
    g.add_argument("--duration", type=_positive_float("--duration"), default=10.0,
                   help="measured seconds after the warm-up (default %(default)s)")
    g.add_argument("--requests", type=_positive_int("--requests"), default=None,
                   help="stop after this many measured requests (default: duration only)")
    g.add_argument("--warmup", type=_positive_float("--warmup", allow_zero=True), default=1.0,
                   help="seconds of load sent first and discarded (default %(default)s)")
    g.add_argument("--timeout", type=_positive_float("--timeout"), default=10.0,
                   help="per-request timeout in seconds (default %(default)s)")
    g.add_argument("--processes", type=_positive_int("--processes"), default=1,
                   help="client processes sharing the rate/concurrency (default %(default)s)")
    g.add_argument("--loop", choices=LOOPS, default="asyncio",
                   help="event loop; asyncio's timers let the open-loop scheduler keep its lag "
                        "to microseconds (default %(default)s)")
    g.add_argument("--transport", choices=TRANSPORTS, default="aiohttp",
                   help="HTTP transport under httpx: aiohttp (httpx-aiohttp, fast) or httpx's "
                        "own (a baseline) (default %(default)s)")
    g = p.add_argument_group("queries")
    g.add_argument("--radii", type=_radii, default=[0, 1, 2],
                   help="radius classes, e.g. 0,1,2 or 0-3 (default 0,1,2)")
    g.add_argument("--knn", type=_knn, default=[],
                   help="k-NN classes, e.g. 10 or 1,10 (default none)")
    g.add_argument("--batch", type=_positive_int("--batch"), default=1,
                   help="queries per request (default %(default)s)")
    g.add_argument("--wire", choices=WIRES, default="json",
                   help="json: hex codes in JSON; binary: packed codes as octet-stream and a "
                        "binary answer (default %(default)s)")
    g.add_argument("--stats", action=argparse.BooleanOptionalAction, default=None,
                   help="ask for the server's per-radius counters (default: yes with --wire "
                        "json, no with --wire binary)")
    g.add_argument("--seed", type=_nonneg_int("--seed"), default=0,
                   help="seed of the query mix and of Poisson arrivals (default %(default)s)")
    g.add_argument("--codes", default=None, metavar="PATH",
                   help="draw queries from these codes instead of the index's own: a .npy of "
                        "bits (n, bits) in {0,1} or {-1,+1}, packed uint8 rows "
                        "(n, ceil(bits/8)) or uint64 words (n, ceil(bits/64)); a text file of "
                        "hex codes, one per line; or 'synthetic' (the embedded data set). "
                        "Default: a sample of the target index's codes")
    g.add_argument("--sample", type=_int_in_range("--sample", 1, MAX_SAMPLE), default=MAX_SAMPLE,
                   help="codes sampled from the index when --codes is not given "
                        "(default %(default)s, at most the server's limit)")
    g.add_argument("--data-n", type=_positive_int("--data-n"), default=None,
                   help=f"with --codes {SYNTHETIC}: size of the embedded data set "
                        f"(default {dataset.DEFAULT_N})")
    g.add_argument("--data-seed", type=_nonneg_int("--data-seed"), default=None,
                   help=f"with --codes {SYNTHETIC}: seed of the embedded data set "
                        f"(default {dataset.DEFAULT_SEED})")
    g = p.add_argument_group("output")
    g.add_argument("--json", type=Path, default=None, metavar="OUT",
                   help="write the JSON report here")
    g.add_argument("--plot", type=Path, default=None, metavar="OUT",
                   help="write the PNG plot here")
    g.add_argument("--csv", type=Path, default=None, metavar="OUT",
                   help="write the per-second CSV here (requests, errors, latency p50/p99/max, "
                        "service p50, results of each measured second)")
    g.add_argument("--hdr-log", type=Path, default=None, metavar="OUT",
                   help="write an HDR histogram interval log of the latency here (one interval "
                        "per second, microseconds; HdrHistogram log format 1.2)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--slo", type=_slo, action="append", default=[], metavar="EXPR",
                   help=f"a pass/fail threshold, repeatable or comma-separated; exit status "
                        f"{SLO_EXIT} when one is breached. " + SLO_HELP.replace("%", "%%"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bucketsearch-loadtest",
        description="Load-test a bucketsearch server and compare measured with modeled cost.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"bucketsearch {__version__}")
    add_arguments(parser)
    return parser


def load_codes(path: str | None, bits: int, data_n: int | None = None,
               data_seed: int | None = None) -> np.ndarray:
    """Packed ``(n, ceil(bits/8))`` uint8 rows of ``--codes`` (a file, or ``synthetic``)."""
    if path is None or path == SYNTHETIC:
        return dataset.clustered_codes(dataset.DEFAULT_N if data_n is None else data_n, bits,
                                       dataset.DEFAULT_SEED if data_seed is None else data_seed)
    return to_packed(read_codes_file(path, bits), bits)


def query_source(args, cfg: RunConfig, bits: int) -> tuple[np.ndarray, str]:
    """The codes queries are drawn from and a sentence saying where they came from."""
    if args.codes != SYNTHETIC and (args.data_n is not None or args.data_seed is not None):
        raise ValueError(f"--data-n/--data-seed only apply with --codes {SYNTHETIC} (the "
                         "embedded data set)")
    if args.codes == SYNTHETIC:
        n = dataset.DEFAULT_N if args.data_n is None else args.data_n
        seed = dataset.DEFAULT_SEED if args.data_seed is None else args.data_seed
        return (load_codes(SYNTHETIC, bits, n, seed),
                f"{n:,} codes of the embedded synthetic data set (seed {seed}), NOT read from "
                f"index {cfg.index!r}")
    if args.codes is not None:
        packed = load_codes(args.codes, bits)
        return packed, f"{len(packed):,} codes of {args.codes}"
    with setup_client(cfg) as client:
        packed, size = get_sample(client, cfg.index, args.sample, args.seed)
    if not len(packed):
        raise ServerError(f"index {cfg.index!r} holds no items: there is nothing to draw "
                          "queries from; insert items first (POST /v1/indexes/"
                          f"{cfg.index}/items) or pass --codes FILE")
    return packed, (f"{len(packed):,} codes sampled from index {cfg.index!r} "
                    f"({size:,} live items, seed {args.seed})")


def api_key_of(args, environ=None) -> str | None:
    """``--api-key``, else the ``BUCKETSEARCH_API_KEY`` environment variable (empty: unset)."""
    environ = os.environ if environ is None else environ
    return args.api_key if args.api_key is not None else (environ.get(API_KEY_ENV) or None)


def config_from_args(args) -> RunConfig:
    headers = tuple(args.header)
    key = api_key_of(args)
    if key is not None and any(name.lower() == "authorization" for name, _ in headers):
        raise ValueError("--header Authorization and an API key (--api-key or "
                         f"{API_KEY_ENV}) both set the Authorization header; give one")
    return RunConfig(url=args.url.rstrip("/"), index=args.index, mode=args.mode, rate=args.rate,
                     arrivals=args.arrivals, concurrency=args.concurrency,
                     max_inflight=args.max_inflight, duration=args.duration,
                     requests=args.requests, warmup=args.warmup, timeout=args.timeout,
                     processes=args.processes, seed=args.seed, loop=args.loop,
                     transport=args.transport, progress=not args.no_progress,
                     api_key=key, headers=headers).validate()


def execute(cfg: RunConfig, workload: Workload, bits: int, extra_params: dict | None = None,
            fetch_cost_model: bool = True, hdr_log: Path | None = None) -> dict:
    """Run the load, fetch the cost model, return the report dict (no printing); with
    ``hdr_log``, also write the latency interval log there."""
    outcome = run(cfg, workload)
    if hdr_log is not None:
        write_hdr_log(outcome.results, outcome.measure_from_ns, hdr_log)
    stats = LoadStats(outcome.measure_from_ns).add_all(outcome.results)
    warnings = saturation_warnings(cfg, outcome, stats)
    empty = empty_bucket_warning(outcome)
    if empty:
        warnings.append(empty)
    cost_model = None
    if fetch_cost_model:
        with setup_client(cfg) as setup:
            cost_model = get_cost_model(setup, cfg.index)
    params = {**config_dict(cfg), **workload.describe(), **(extra_params or {})}
    client = {"cpu_share_of_core": outcome.cpu_share(), "cpu_s": outcome.cpu_s,
              "wall_s": outcome.wall_s, "max_inflight_seen": outcome.max_inflight_seen}
    report = build_report(stats, params, bits, cost_model, warnings, client)
    report["per_second"] = per_second(outcome.results, outcome.measure_from_ns)
    return report


def write_outputs(report: dict, json_path: Path | None, plot_path: Path | None,
                  csv_path: Path | None = None) -> list[str]:
    written = []
    if csv_path is not None:
        write_csv(report.get("per_second", []), csv_path)
        written.append(str(csv_path))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
        written.append(str(json_path))
    if plot_path is not None:
        plot_path.parent.mkdir(parents=True, exist_ok=True)
        plot_report(report, plot_path)
        written.append(str(plot_path))
    return written


def _json_default(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = parser.prog
    try:
        cfg = config_from_args(args)
        slos = [slo for group in args.slo for slo in group]
        with setup_client(cfg) as client:
            check_server(client)
            info = get_index(client, cfg.index)
        bits = int(info.get("bits") or 0)
        if not 1 <= bits <= MAX_BITS:
            raise ServerError(f"GET /v1/indexes/{cfg.index} gave no valid 'bits' ({info})")
        base, source = query_source(args, cfg, bits)
        print(f"queries: drawn from {source}; radius-r queries flip exactly r bits, k-NN "
              "queries are the codes themselves", flush=True)
        classes = [QueryClass(radius=r) for r in args.radii] + [QueryClass(k=k) for k in args.knn]
        stats = args.wire == "json" if args.stats is None else args.stats
        workload = Workload(base, bits, classes, batch=args.batch, seed=args.seed,
                            flips="exact", wire=args.wire, stats=stats)
        report = execute(cfg, workload, bits, {"codes": args.codes or "index sample",
                                                "query_source": source,
                                                "data_n": args.data_n}, hdr_log=args.hdr_log)
    except ServerError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    if slos:
        report["slo"] = evaluate_slos(report, slos)
    print_report(report)
    if slos:
        print_slos(report["slo"])
    for path in write_outputs(report, args.json, args.plot, args.csv):
        print(f"wrote {path}")
    if args.hdr_log is not None:
        print(f"wrote {args.hdr_log}")
    rc = 0
    ok = report["requests"] - report["errors"]
    if report["requests"] and ok == 0:
        print(f"{prog}: error: every measured request failed ({report['error_kinds']})",
              file=sys.stderr)
        rc = 1
    breached = [r for r in report.get("slo", ()) if not r["ok"]]
    if breached:
        print(f"{prog}: threshold breached: " + "; ".join(
            f"{r['slo']} (measured {r['measured']})" for r in breached), file=sys.stderr)
        rc = SLO_EXIT
    return rc


if __name__ == "__main__":
    sys.exit(main())
