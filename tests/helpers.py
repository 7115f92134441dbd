"""The helpers every test module shares, in one place (``tests/conftest.py`` makes fixtures of
them):

* :class:`ServerProcess`: the real server, uvicorn (or ``bucketsearch serve``) in a subprocess on
  127.0.0.1 and a free port; start, SIGKILL, stop, wait for exit, optional command prefix such
  as ``fiu-run -x``. For what needs a process: crashes, concurrency, load, the wire (slow or
  streamed bodies, keep-alive), libfiu, the CLI.
* :func:`app_client`: the app in process (FastAPI's ``TestClient`` on
  :func:`bucketsearch.app.main.create_app`), ready. For request/response behaviour: validation,
  error shapes, auth, docs, limits, results.
* :func:`wait_ready`: poll ``/readyz`` until 200 (either client).
* :func:`create_index`, :func:`add_codes`: create an index, write codes to it (either client).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]

#: Settings of an in-process app unless a test says otherwise: no warm-up (the kernels a test
#: reaches compile on first use, once per test process) and no start-up calibration.
APP_DEFAULTS = dict(warmup=False, calibration_queries=0)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: seconds a server may take to be ready: the first server of a fresh checkout compiles every
#: kernel in its warm-up (no numba cache yet), which a busy 2-core machine stretches past 2 min
READY_TIMEOUT_S = 300.0


def wait_ready(client, timeout: float = READY_TIMEOUT_S) -> dict:
    """Poll ``GET /readyz`` until 200 and return its JSON; ``client`` is a ``TestClient`` or an
    ``httpx.Client`` with a base URL. Fails with the last answer after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        r = client.get("/readyz")
        if r.status_code == 200:
            return r.json()
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready after {timeout} s: {r.status_code} {r.text}")
        time.sleep(0.02)


# ------------------------------------------------------------------------- in process
def app_settings(data_dir, **overrides):
    """``Settings`` of a test app on ``data_dir``: :data:`APP_DEFAULTS` updated by
    ``overrides`` (field names of :class:`bucketsearch.app.settings.Settings`)."""
    from bucketsearch.app.settings import Settings
    return Settings(data_dir=data_dir, **{**APP_DEFAULTS, **overrides})


def make_app(data_dir, **overrides):
    """The app of :func:`app_settings`, not started (``TestClient(app)`` starts it)."""
    from bucketsearch.app.main import create_app
    return create_app(app_settings(data_dir, **overrides))


@contextmanager
def app_client(data_dir, **overrides) -> Iterator:
    """A ``TestClient`` on :func:`make_app`, entered (lifespan run) and ready; closed after,
    which closes every index and releases the data-directory lock."""
    from fastapi.testclient import TestClient
    with TestClient(make_app(data_dir, **overrides)) as client:
        wait_ready(client)
        yield client


# --------------------------------------------------------------------------- a process
class ServerProcess:
    """One server process on a data directory.

    ``command="uvicorn"`` runs ``uvicorn <app> --factory`` (``app`` default
    ``bucketsearch.app.main:create_app``; another factory module can come through ``PYTHONPATH``
    in ``env``); ``command="serve"`` runs the CLI, ``python -m bucketsearch serve``.
    ``cmd_prefix`` is put before the python command (``["fiu-run", "-x"]`` runs the server under
    libfiu; such a prefix must ``exec`` python so that :attr:`pid` is the server's own pid).
    ``log_path`` defaults to ``<data_dir>-server.log`` beside the data directory; the log is
    appended to across restarts. :attr:`launches` counts the processes started in this test
    session (all instances)."""

    launches = 0

    def __init__(self, data_dir: Path, env: dict | None = None, *,
                 cmd_prefix: list[str] | None = None, log_path: Path | None = None,
                 command: str = "uvicorn", app: str = "bucketsearch.app.main:create_app"):
        if command not in ("uvicorn", "serve"):
            raise ValueError(f"command must be 'uvicorn' or 'serve', got {command!r}")
        self.data_dir = Path(data_dir)
        self.env = env or {}
        self.cmd_prefix = list(cmd_prefix or [])
        self.command = command
        self.app = app
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

    def argv(self) -> list[str]:
        if self.command == "serve":
            return [sys.executable, "-m", "bucketsearch", "serve", "--data-dir",
                    str(self.data_dir), "--port", str(self.port), "--log-level", "warning"]
        return [sys.executable, "-m", "uvicorn", self.app, "--factory", "--host", "127.0.0.1",
                "--port", str(self.port), "--log-level", "warning"]

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
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*self.cmd_prefix, *self.argv()], cwd=ROOT, env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
        ServerProcess.launches += 1
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S,
                   wait_for: str = "/readyz") -> ServerProcess:
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

    def start(self, timeout: float = READY_TIMEOUT_S,
              wait_for: str = "/readyz") -> ServerProcess:
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


# ------------------------------------------------------------------- writing codes
def create_index(client, name: str, bits: int, **fields) -> dict:
    """``POST /v1/indexes``; asserts 201 and returns the answer."""
    r = client.post("/v1/indexes", json={"name": name, "bits": bits, **fields})
    assert r.status_code == 201, r.text
    return r.json()


def add_codes(client, name: str, ids, words: np.ndarray, bits: int) -> dict:
    """``POST /v1/indexes/{name}/items`` of packed ``words`` (n, w) as hex with ``ids``; asserts
    200 and returns the answer."""
    from bucketsearch.index.codes import to_hex
    r = client.post(f"/v1/indexes/{name}/items",
                    json={"ids": [int(i) for i in ids], "codes": to_hex(words, bits)})
    assert r.status_code == 200, r.text
    return r.json()

class ShardedServer(ServerProcess):
    """``bucketsearch serve --shards 2`` (the CLI, a real process with its own local Ray)."""

    def argv(self):
        return [*super().argv(), "--shards", "2"]


def ray_processes(pid: int) -> dict[int, str]:
    """``{pid: command}`` of the running processes below ``pid`` (Ray's, for a server)."""
    from bucketsearch.index.cluster.raysession import alive, descendants
    out = {}
    for p in descendants(pid):
        try:
            cmd = (Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")
                   .decode(errors="replace"))
        except OSError:
            continue
        if alive(p):
            out[p] = cmd
    return out


def kill_left(procs: dict[int, str]) -> dict[int, str]:
    """SIGKILL those of ``procs`` still running; returns them."""
    from bucketsearch.index.cluster.raysession import alive
    left = {p: cmd for p, cmd in procs.items() if alive(p)}
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left
