"""Shared fixtures, made of the helpers in ``tests/helpers.py`` (imported from there; the names
``ROOT``, ``free_port`` and ``ServerProcess`` stay importable from ``conftest`` too).

* ``bucketsearch_server_factory``: real servers (uvicorn in a subprocess), ready once
  ``/readyz`` answers 200, killed after. In-process apps: ``with helpers.app_client(dir):``.
* ``ray_local``: a local Ray (``num_cpus=2``) for a test module's shard actors
  (``index/cluster/shards.py``), started once per module unless one runs already, shut down after.

``HYPOTHESIS_MAX_EXAMPLES=N`` caps every hypothesis test at N examples (``make
coverage-kernels`` runs the kernels as plain Python, ``NUMBA_DISABLE_JIT=1``, where the
examples the compiled kernels afford would take too long). The terminal summary reports how
many server processes the session started.

Markers (``pyproject.toml``): ``slow`` (the fault matrices, crash points, histories, kills, Ray,
the browser, ...) and ``serial`` (timing-sensitive: never beside another worker) are left out of
``make test`` (the quick set, on every core) and run by ``make test-long`` (one at a time); CI
runs both."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import ROOT, ServerProcess, free_port
from hypothesis import settings

__all__ = ["ROOT", "ServerProcess", "free_port"]  # re-exported for older imports


@pytest.fixture
def bucketsearch_server_factory(tmp_path):
    """``make(data_dir=None, *, cmd_prefix=None, log_path=None, start=True, command="uvicorn",
    **env) -> ServerProcess``: started (ready) unless ``start=False``; every server is killed
    after."""
    servers: list[ServerProcess] = []

    def make(data_dir: Path | None = None, *, cmd_prefix: list[str] | None = None,
             log_path: Path | None = None, start: bool = True, command: str = "uvicorn",
             **env) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path / f"data{len(servers)}",
                               {k: str(v) for k, v in env.items()}, cmd_prefix=cmd_prefix,
                               log_path=log_path, command=command)
        servers.append(server)
        return server.start() if start else server

    yield make
    for server in servers:
        server.kill()


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    if started:
        ray.shutdown()


def pytest_collection_modifyitems(config, items):
    cap = os.environ.get("HYPOTHESIS_MAX_EXAMPLES")
    if not cap:
        return
    if not cap.isdigit() or int(cap) < 1:
        raise pytest.UsageError(f"HYPOTHESIS_MAX_EXAMPLES must be a positive integer, got {cap!r}")
    for item in items:
        test = getattr(item, "obj", None)
        current = getattr(test, "_hypothesis_internal_use_settings", None)  # set by @given
        if current is not None and current.max_examples > int(cap):
            test._hypothesis_internal_use_settings = settings(current, max_examples=int(cap))


def pytest_terminal_summary(terminalreporter):
    if ServerProcess.launches:
        terminalreporter.write_line(f"server processes started: {ServerProcess.launches}")
