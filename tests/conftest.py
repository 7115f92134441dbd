"""Shared fixtures and helpers. ``bucketsearch_server_factory`` starts the real HTTP server:
uvicorn in a subprocess on 127.0.0.1 and a free port, ready once ``/readyz`` answers 200, killed
after. :class:`ServerProcess` is the one server-process helper of the tests (start, SIGKILL,
stop, wait for exit, optional command prefix such as ``fiu-run -x``)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_free_port = free_port  # the older name


class ServerProcess:
    """One uvicorn process serving ``app.main:create_app`` on a data directory.

    ``cmd_prefix`` is put before the python command (``["fiu-run", "-x"]`` runs the server under
    libfiu; such a prefix must ``exec`` python so that :attr:`pid` is the server's own pid).
    ``log_path`` defaults to ``<data_dir>-server.log`` beside the data directory; the log is
    appended to across restarts."""

    def __init__(self, data_dir: Path, env: dict | None = None, *,
                 cmd_prefix: list[str] | None = None, log_path: Path | None = None):
        self.data_dir = Path(data_dir)
        self.env = env or {}
        self.cmd_prefix = list(cmd_prefix or [])
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path = Path(log_path) if log_path is not None else \
            self.data_dir.parent / f"{self.data_dir.name}-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def launch(self) -> ServerProcess:
        """Spawn the process on a fresh port without waiting for it (see :meth:`wait_ready`).
        A restart never reuses the previous port, so a client still holding the old address
        cannot reach the new process by accident."""
        port = free_port()
        while port == self.port:
            port = free_port()
        self.port = port
        env = {**os.environ, "BUCKETSEARCH_DATA_DIR": str(self.data_dir),
               "BUCKETSEARCH_CALIBRATION_QUERIES": "8", **self.env}
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.cmd_prefix, sys.executable, "-m", "uvicorn", "bucketsearch.app.main:create_app",
             "--factory", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self

    def wait_ready(self, timeout: float = 120.0, wait_for: str = "/readyz") -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: "
                                   f"{self.log_text()[-3000:]}")
            try:
                if httpx.get(self.url + wait_for, timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout} s: {self.log_text()[-3000:]}")

    def start(self, timeout: float = 120.0, wait_for: str = "/readyz") -> ServerProcess:
        return self.launch().wait_ready(timeout, wait_for)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code, or None if the process still runs after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60.0, **kwargs)


@pytest.fixture
def bucketsearch_server_factory(tmp_path):
    """``make(data_dir=None, *, cmd_prefix=None, log_path=None, start=True, **env) ->
    ServerProcess``: started (ready) unless ``start=False``; every server is killed after."""
    servers: list[ServerProcess] = []

    def make(data_dir: Path | None = None, *, cmd_prefix: list[str] | None = None,
             log_path: Path | None = None, start: bool = True, **env) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path / f"data{len(servers)}",
                               {k: str(v) for k, v in env.items()}, cmd_prefix=cmd_prefix,
                               log_path=log_path)
        servers.append(server)
        return server.start() if start else server

    yield make
    for server in servers:
        server.kill()
