"""``bucketsearch serve``: run the HTTP service with uvicorn."""
from __future__ import annotations

import os
import sys

HELP = "serve indexes over HTTP (FastAPI + uvicorn)"
EPILOG = """examples:
  bucketsearch serve --data-dir data --port 8000
  BUCKETSEARCH_API_KEY=secret bucketsearch serve --data-dir /data --host 0.0.0.0
  bucketsearch serve --data-dir data --workers 2      # read-only workers sharing mmap'ed arrays

Settings come from BUCKETSEARCH_* environment variables (see app/settings.py and the README's
"Limits" and "Auth" sections; an unknown BUCKETSEARCH_* name is reported at startup); the flags
below override them. With --workers > 1 every worker is read-only (writes need one process
owning the write-ahead log) and snapshot arrays are memory-mapped so the workers share them."""


def add_arguments(parser) -> None:
    parser.add_argument("--data-dir", default=None, help="data directory (BUCKETSEARCH_DATA_DIR)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes (>1 implies read-only and mmap)")
    parser.add_argument("--log-level", default="info")


def run(args) -> int:
    import uvicorn

    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.data_dir is not None:
        os.environ["BUCKETSEARCH_DATA_DIR"] = str(args.data_dir)
    if args.workers > 1:
        os.environ["BUCKETSEARCH_READ_ONLY"] = "1"
        os.environ["BUCKETSEARCH_MMAP"] = "1"
    from bucketsearch.app.settings import Settings, warn_unknown_env
    Settings()  # fail fast on a bad BUCKETSEARCH_* value
    # printed here, before uvicorn starts; create_app (in this process) does not repeat it
    warn_unknown_env(emit=lambda warning: print(f"warning: {warning}", file=sys.stderr,
                                                flush=True))
    uvicorn.run("bucketsearch.app.main:create_app", factory=True, host=args.host, port=args.port,
                workers=args.workers, log_level=args.log_level, timeout_graceful_shutdown=10)
    return 0
