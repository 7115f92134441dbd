"""``bucketsearch serve``: run the HTTP service with uvicorn."""
from __future__ import annotations

import os
import shutil
import sys

HELP = "serve indexes over HTTP (FastAPI + uvicorn)"
EPILOG = """examples:
  bucketsearch serve --data-dir data --port 8000
  BUCKETSEARCH_API_KEY=secret bucketsearch serve --data-dir /data --host 0.0.0.0
  bucketsearch serve --data-dir data --workers 2      # read-only workers sharing mmap'ed arrays
  bucketsearch serve --data-dir data --shards 2       # indexes split over 2 Ray shard actors

Settings come from BUCKETSEARCH_* environment variables (see app/settings.py and the README's
"Limits" and "Auth" sections; an unknown BUCKETSEARCH_* name is reported at startup); the flags
below override them. With --workers > 1 every worker is read-only (writes need one process
owning the write-ahead log) and snapshot arrays are memory-mapped so the workers share them.
/metrics then sums every worker's series (prometheus-client's multiprocess mode): the workers
keep their metric files in PROMETHEUS_MULTIPROC_DIR, wiped at start, or, when it is unset, in
a temporary directory removed when the server stops."""


def add_arguments(parser) -> None:
    parser.add_argument("--data-dir", default=None, help="data directory (BUCKETSEARCH_DATA_DIR)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes (>1 implies read-only and mmap)")
    parser.add_argument("--shards", type=int, default=None,
                        help="split new indexes over N shard actors on Ray (BUCKETSEARCH_SHARDS;"
                             " docs/scale-out.md)")
    parser.add_argument("--ray-address", default=None,
                        help="with --shards: the Ray cluster (e.g. auto, ray://head:10001); "
                             "unset: a local Ray is started (BUCKETSEARCH_RAY_ADDRESS)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--no-access-log", dest="access_log", action="store_false",
                        help="no line per request (the start-up, merge and error lines stay)")


def run(args) -> int:
    import uvicorn

    from bucketsearch.app import workermetrics

    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.data_dir is not None:
        os.environ["BUCKETSEARCH_DATA_DIR"] = str(args.data_dir)
    if getattr(args, "shards", None) is not None:
        if args.shards < 1 or args.workers > 1:
            raise ValueError(f"--shards must be >= 1 with one worker (the ingress owns the "
                             f"shards), got --shards {args.shards} --workers {args.workers}")
        os.environ["BUCKETSEARCH_SHARDS"] = str(args.shards)
    if getattr(args, "ray_address", None):
        os.environ["BUCKETSEARCH_RAY_ADDRESS"] = args.ray_address
    if args.workers > 1:
        os.environ["BUCKETSEARCH_READ_ONLY"] = "1"
        os.environ["BUCKETSEARCH_MMAP"] = "1"
    from bucketsearch.app.settings import Settings, warn_unknown_env
    Settings()  # fail fast on a bad BUCKETSEARCH_* value
    # printed here, before uvicorn starts; create_app (in this process) does not repeat it
    warn_unknown_env(emit=lambda warning: print(f"warning: {warning}", file=sys.stderr,
                                                flush=True))
    metrics_dir, created = None, False
    if args.workers > 1 or os.environ.get(workermetrics.ENV):
        # before uvicorn starts the workers, which inherit it (app.workermetrics)
        metrics_dir, created = workermetrics.prepare_dir(os.environ.get(workermetrics.ENV))
        os.environ[workermetrics.ENV] = str(metrics_dir)
        print(f"metrics: /metrics sums the series of the {args.workers} worker"
              f"{'s' if args.workers > 1 else ''} ({workermetrics.ENV}={metrics_dir})",
              file=sys.stderr, flush=True)
    try:
        uvicorn.run("bucketsearch.app.main:create_app", factory=True, host=args.host,
                    port=args.port, workers=args.workers, log_level=args.log_level,
                    access_log=args.access_log, timeout_graceful_shutdown=10)
    finally:
        if created:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0
