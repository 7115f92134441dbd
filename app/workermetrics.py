"""Prometheus figures summed over the worker processes of ``bucketsearch serve --workers N``.

Each worker is its own process, so each has its own counters; a scrape reaches one worker.
prometheus-client's multiprocess mode solves this for its metric objects: with the environment
variable ``PROMETHEUS_MULTIPROC_DIR`` set before ``prometheus_client`` is imported, every
Counter, Histogram and Gauge keeps its value in a memory-mapped file of that directory, one per
process (``counter_<pid>.db``...), and ``MultiProcessCollector`` sums the files at each scrape.
``bucketsearch serve`` with ``--workers`` > 1 sets the variable to a fresh directory
(:func:`prepare_dir`) before uvicorn starts the workers, which inherit it.

What each kind of series becomes with several workers:

- HTTP request counters and latency histograms, guard rejections: prometheus-client files,
  summed over every worker that ever ran since the server started (a dead worker's counts
  stay: a counter never goes down). Exact at every scrape: a request is counted before its
  last byte leaves the server (``bucketsearch.app.metrics.RequestMetricsMiddleware``).
- Per-index, per-radius search figures (``bucketsearch_lookup_seconds``, ``_probes``,
  ``_empty_buckets``) live in each index's CostTracker, not in prometheus-client objects: each
  worker writes its totals to ``bucketsearch_search_<pid>.json`` in the same directory every
  :data:`PUBLISH_INTERVAL_S` seconds and at shutdown (:class:`Publisher`); a scrape adds the
  answering worker's live totals to the other workers' files. So another worker's searches of
  the last second may be missing from a scrape; they are never counted twice and never lost.
  A dead worker's file stays (counters are monotone).
- Per-index gauges (items, delta, merging, state...): every worker is a read-only replica of
  the same data directory (writes need the one process owning the write-ahead log; a replica
  follows that writer every ``BUCKETSEARCH_FOLLOW_INTERVAL_S``), so the answering worker's
  values are everyone's, up to that interval.
- Per-worker gauges (:data:`WORKER_SERIES`): ``bucketsearch_workers`` (multiprocess mode
  ``livesum``: each live worker contributes 1) and the process figures of each live worker
  (``liveall``: one series per worker, labelled ``pid``). "live": the files of a worker that
  exited are removed with ``prometheus_client.multiprocess.mark_process_dead``, by the worker
  itself at shutdown and, for a worker that was killed, by the next scrape
  (:func:`prune_dead_workers`).

With one worker none of this is used (the measured cost of a multiprocess counter increment is
in the README's "Metrics" section): the server's own registry is exact, and carries
prometheus-client's standard ``process_*`` series.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from prometheus_client import Gauge
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.process_collector import ProcessCollector

ENV = "PROMETHEUS_MULTIPROC_DIR"
#: seconds between two writes of a worker's search figures
PUBLISH_INTERVAL_S = 1.0
SEARCH_FILE_PREFIX = "bucketsearch_search_"
#: (name, help, multiprocess mode, sample of prometheus-client's ProcessCollector or None: 1)
WORKER_SERIES = (
    ("bucketsearch_workers", "live worker processes", "livesum", None),
    ("bucketsearch_worker_resident_memory_bytes", "resident memory of each live worker",
     "liveall", "process_resident_memory_bytes"),
    ("bucketsearch_worker_cpu_seconds", "CPU seconds used by each live worker", "liveall",
     "process_cpu_seconds_total"),
    ("bucketsearch_worker_open_fds", "open file descriptors of each live worker", "liveall",
     "process_open_fds"),
    ("bucketsearch_worker_start_time_seconds", "start of each live worker (Unix time)",
     "liveall", "process_start_time_seconds"),
)


def multiprocess_dir() -> Path | None:
    """The directory of multiprocess mode, or None (one process: nothing to aggregate).

    Raises RuntimeError when ``PROMETHEUS_MULTIPROC_DIR`` is set but prometheus-client was
    imported before it (its values then live in process memory: nothing would be summed) or
    names no directory."""
    path = os.environ.get(ENV)
    if not path:
        return None
    from prometheus_client import values
    if values.ValueClass is values.MutexValue:
        raise RuntimeError(f"{ENV}={path!r} was set after prometheus_client was imported, so "
                           "its metrics are not shared between processes; set it before the "
                           "server starts (bucketsearch serve --workers N does)")
    if not os.path.isdir(path):
        raise RuntimeError(f"{ENV}={path!r} is not a directory (allowed: an existing "
                           "directory, wiped at each server start)")
    return Path(path)


def prepare_dir(path: str | os.PathLike | None) -> tuple[Path, bool]:
    """The multiprocess directory of one server start: ``path`` (created if missing) with the
    metric files of an earlier start removed (``*.db`` and the search files, finished or not;
    nothing else is touched), or a new private temporary directory when ``path`` is None. Returns ``(dir,
    created)``: ``created`` means the caller removes the directory when the server stops."""
    if path is None:
        import tempfile
        return Path(tempfile.mkdtemp(prefix="bucketsearch-metrics-")), True
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{ENV}={str(path)!r} is not a directory (allowed: a directory for "
                         "the metric files of the workers, or unset for a temporary one)")
    directory.mkdir(parents=True, exist_ok=True)
    for stale in [*directory.glob("*.db"), *directory.glob(f"{SEARCH_FILE_PREFIX}*.json"),
                  *directory.glob(f"{SEARCH_FILE_PREFIX}*.tmp")]:
        stale.unlink(missing_ok=True)
    return directory, False


# ---------------------------------------------------------------------- search figures files
def search_file(directory: Path, pid: int) -> Path:
    return directory / f"{SEARCH_FILE_PREFIX}{pid}.json"


def write_search_file(directory: Path, pid: int, figures: dict[str, list[tuple[str, object]]]
                      ) -> None:
    """``{index: [(radius label, RadiusRecord)]}`` to this worker's file (write, then rename:
    a reader sees the previous or the new file, never a part)."""
    body = {"pid": pid, "indexes": {name: {label: rec.to_json() for label, rec in recs}
                                    for name, recs in figures.items()}}
    path = search_file(directory, pid)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def read_search_files(directory: Path, exclude_pid: int) -> list[dict[str, dict[str, object]]]:
    """The figures of every other worker, dead or alive: ``[{index: {label: RadiusRecord}}]``."""
    from bucketsearch.app.costfit import RadiusRecord
    out = []
    for path in sorted(directory.glob(f"{SEARCH_FILE_PREFIX}*.json")):
        if path.name == search_file(directory, exclude_pid).name:
            continue
        try:
            body = json.loads(path.read_text())
        except FileNotFoundError:  # pragma: no cover -- the directory is being wiped
            continue
        out.append({name: {label: RadiusRecord.from_json(rec) for label, rec in recs.items()}
                    for name, recs in body["indexes"].items()})
    return out


# ---------------------------------------------------------------------- worker liveness
def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie, exited but not yet reaped, is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover -- another user's process: it exists
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: kill(0) is all we know
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def prune_dead_workers(directory: Path) -> list[int]:
    """``mark_process_dead`` for every worker whose live-gauge files remain but which no longer
    runs (killed: its shutdown did not run); returns their pids."""
    dead = set()
    for path in directory.glob("gauge_live*_*.db"):
        pid_text = path.stem.rsplit("_", 1)[1]
        if pid_text.isdigit() and not pid_alive(int(pid_text)):
            dead.add(int(pid_text))
    for pid in sorted(dead):
        mark_process_dead(pid, str(directory))
    return sorted(dead)


class WorkerGauges:
    """The :data:`WORKER_SERIES` of this process (multiprocess-mode gauges), refreshed from
    prometheus-client's ProcessCollector."""

    def __init__(self):
        self.gauges = [(Gauge(name, doc, multiprocess_mode=mode, registry=None), sample)
                       for name, doc, mode, sample in WORKER_SERIES]
        self._process = ProcessCollector(registry=None)

    def refresh(self) -> None:
        values = {s.name: s.value for family in self._process.collect() for s in family.samples}
        for gauge, sample in self.gauges:
            if sample is None:
                gauge.set(1)
            elif sample in values:
                gauge.set(values[sample])


class Publisher:
    """A daemon thread writing this worker's search figures (``figures()``: ``{index: [(label,
    RadiusRecord)]}``) and refreshing its worker gauges every :data:`PUBLISH_INTERVAL_S`;
    :meth:`close` writes them a last time and removes this worker's live gauges."""

    def __init__(self, directory: Path, figures, gauges: WorkerGauges,
                 interval: float = PUBLISH_INTERVAL_S):
        self.directory, self.figures, self.gauges = directory, figures, gauges
        self.interval = interval
        self.pid = os.getpid()
        self._stop = threading.Event()
        self._last = None
        self._lock = threading.Lock()
        self.publish()
        self._thread = threading.Thread(target=self._run, name="bucketsearch-metrics",
                                        daemon=True)
        self._thread.start()

    def publish(self) -> None:
        with self._lock:
            self.gauges.refresh()
            figures = self.figures()
            key = {name: [(label, rec.n, rec.probes_total) for label, rec in recs]
                   for name, recs in figures.items()}
            if key != self._last:  # nothing searched since the last write: no write
                write_search_file(self.directory, self.pid, figures)
                self._last = key

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.publish()
            except Exception:  # noqa: BLE001 -- the next round retries; serving goes on
                logging.getLogger("bucketsearch.app").exception("publishing worker metrics")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.publish()
        mark_process_dead(self.pid, str(self.directory))
