"""Shared fixtures. ``bucketsearch_server_factory`` starts the real HTTP server: uvicorn in a
subprocess on 127.0.0.1 and a free port, ready once ``/readyz`` answers 200, killed after."""
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One uvicorn process serving ``app.main:create_app`` on a data directory."""

    def __init__(self, data_dir: Path, env: dict | None = None):
        self.data_dir = Path(data_dir)
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0, wait_for: str = "/readyz") -> ServerProcess:
        self.port = _free_port()
        env = {**os.environ, "BUCKETSEARCH_DATA_DIR": str(self.data_dir),
               "BUCKETSEARCH_CALIBRATION_QUERIES": "8", **self.env}
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory",
             "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + wait_for, timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout} s: "
                           f"{self.log_path.read_text()[-3000:]}")

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
    """``make(data_dir=None, **env) -> ServerProcess`` (started); every server is killed after."""
    servers: list[ServerProcess] = []

    def make(data_dir: Path | None = None, **env) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path / f"data{len(servers)}",
                               {k: str(v) for k, v in env.items()})
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.kill()
