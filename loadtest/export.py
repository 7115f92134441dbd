"""Time series of a load run: per-second rows (JSON report, ``--csv``) and an HDR histogram
interval log (``--hdr-log``, HdrHistogram's log format 1.2, read by ``hdrh.log.HistogramLogReader``
and HistogramLogAnalyzer).

Second ``s`` holds the measured requests whose *intended* send time falls in
``[measure_from + s, measure_from + s + 1)`` seconds (warm-up requests are left out), so a
server stall shows up in the seconds whose requests it delayed. Per second: requests, errors,
the CO-corrected latency p50 / p99 / max and the service-time p50 in ms (nearest rank over HDR
histograms, as :mod:`bucketsearch.loadtest.stats` defines them), and the ids returned. The HDR log
holds one interval histogram of latency per second, in microseconds (``Interval_Max`` in ms).
"""
from __future__ import annotations

import csv
import time
from pathlib import Path

from hdrh.log import HistogramLogWriter

from bucketsearch.loadtest.stats import Distribution, RequestResult

CSV_FIELDS = ("second", "requests", "errors", "latency_p50_ms", "latency_p99_ms",
              "latency_max_ms", "service_p50_ms", "results")
NS_PER_S = 1_000_000_000
US_PER_MS = 1000.0


def _by_second(results: list[RequestResult], measure_from_ns: int) -> dict[int, list]:
    seconds: dict[int, list] = {}
    for res in results:
        if res.intended_ns >= measure_from_ns:
            seconds.setdefault((res.intended_ns - measure_from_ns) // NS_PER_S, []).append(res)
    return seconds


def _latency_us(requests: list[RequestResult]) -> Distribution:
    dist = Distribution()
    for res in requests:
        dist.record(res.latency_ns // 1000)
    return dist


def per_second(results: list[RequestResult], measure_from_ns: int) -> list[dict]:
    """One row per second of the measured window (empty seconds included, as zeros and
    None percentiles), ordered by second; fields :data:`CSV_FIELDS`."""
    seconds = _by_second(results, measure_from_ns)
    rows = []
    for s in range(max(seconds) + 1 if seconds else 0):
        requests = seconds.get(s, [])
        latency = _latency_us(requests)
        service = Distribution()
        for res in requests:
            service.record(res.service_ns // 1000)
        lat = latency.summary(1 / US_PER_MS, percentiles=(50.0, 99.0))
        rows.append({"second": s, "requests": len(requests),
                     "errors": sum(not res.ok for res in requests),
                     "latency_p50_ms": lat["p50"], "latency_p99_ms": lat["p99"],
                     "latency_max_ms": lat["max"],
                     "service_p50_ms": service.summary(1 / US_PER_MS, (50.0,))["p50"],
                     "results": sum(res.n_results for res in requests if res.ok)})
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    """The per-second rows as CSV (header :data:`CSV_FIELDS`; an empty cell for None)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def write_hdr_log(results: list[RequestResult], measure_from_ns: int, path: Path,
                  start_unix_s: float | None = None) -> int:
    """One latency interval histogram (us) per measured second with requests; returns the
    number of intervals written. ``start_unix_s``: wall-clock time of the measured window's
    start (the log's StartTime; default: now minus the window's length)."""
    seconds = _by_second(results, measure_from_ns)
    if start_unix_s is None:
        start_unix_s = time.time() - (max(seconds) + 1 if seconds else 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        log = HistogramLogWriter(f)
        log.output_comment("bucketsearch-loadtest: CO-corrected request latency, microseconds")
        log.output_log_format_version()
        # the library's output_start_time formats the date with a method datetime lacks
        log.output_comment(f"[StartTime: {start_unix_s:.3f} (seconds since epoch)]")
        log.output_legend()
        for s in sorted(seconds):
            hist = _latency_us(seconds[s]).hist
            # start 0 would make the writer read the histogram's own timestamps: pass 1e-9
            log.output_interval_histogram(hist, start_time_stamp_sec=s or 1e-9,
                                          end_time_stamp_sec=s + 1,
                                          max_value_unit_ratio=US_PER_MS)
    return len(seconds)
