"""The server process's Ray (``serve --shards``): started or joined once, by a thread that lives
as long as the process, and stopped with it.

Why a thread of its own. A local ``ray.init()`` starts Ray's processes (GCS server, raylet,
monitor, log monitor, dashboard head) with ``fate_share``: each child calls
``prctl(PR_SET_PDEATHSIG, SIGKILL)`` before it runs (``ray._private.services.start_ray_process``
-> ``set_kill_on_parent_death_linux``). Linux sends that signal when the *thread* that forked
the child exits, not when its process does (prctl(2): "the parent" is the creating thread). Run
from the start-up thread, Ray's processes were killed the moment start-up finished; the shard
actors were orphaned and the server exited a minute later ("Failed to connect to GCS").

So :func:`ensure_ray` runs ``ray.init`` in :data:`OWNER_THREAD_NAME`, a daemon thread that then
waits until :func:`stop_ray` (the end of the app's lifespan) and calls ``ray.shutdown()``
itself. If the process dies (SIGKILL), the thread dies with it and the kernel kills Ray's
processes. Not the main thread: ``ray.init`` there replaces uvicorn's SIGTERM handler by its
own ``sys.exit`` (no graceful shutdown: the shards would not be closed), blocks the event loop
for seconds, and an app under a test client has no main thread of its own.

``ray.shutdown()`` stops the processes ``ray.init`` started; their own children (the raylet's
dashboard and runtime-env agents, the workers) are left to the raylet, which is SIGKILLed after
a few seconds when slow, orphaning them (measured: two agents, ~100 MB each, left by every
stop). So the owner thread lists them before the shutdown and SIGKILLs those still alive after it (by pid: the processes ``ray.init`` started and their
descendants, nothing else).

Joining a cluster (``address``) starts nothing: ``ray.shutdown()`` only disconnects.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger("bucketsearch.app")

OWNER_THREAD_NAME = "ray-owner"
INIT_TIMEOUT_S = 300.0  # ray.init on a loaded 2-core machine takes 5-20 s
REAP_TIMEOUT_S = 10.0  # after ray.shutdown: how long its processes get before SIGKILL


class _Session:
    """The one Ray session of this process: its owner thread and the outcome of ``ray.init``."""

    def __init__(self, address: str | None, num_cpus: int | None):
        self.address, self.num_cpus = address, num_cpus
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._own, name=OWNER_THREAD_NAME, daemon=True)

    def _own(self) -> None:
        import ray
        before = set(children(os.getpid()))
        try:
            if self.address:
                ray.init(address=self.address, include_dashboard=False,
                         logging_level=logging.WARNING, log_to_driver=True)
            else:
                ray.init(num_cpus=self.num_cpus or os.cpu_count(), include_dashboard=False,
                         logging_level=logging.WARNING)
        except BaseException as exc:  # noqa: BLE001 -- raised again in ensure_ray's caller
            self.error = exc
            self.ready.set()
            return
        roots = [p for p in children(os.getpid()) if p not in before]  # what ray.init started
        self.ready.set()
        self.stop.wait()
        # listed before the shutdown, while the raylet's agents and workers are its children
        started = roots + [p for root in roots for p in descendants(root)]
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 -- the leftovers are killed below
            log.exception("ray.shutdown failed")
        reap(started, REAP_TIMEOUT_S)


_lock = threading.Lock()
_session: _Session | None = None


def _no_sigterm_warning(record: logging.LogRecord) -> bool:
    """Drop ray.init's warning that it set no SIGTERM handler off the main thread: uvicorn's
    handler is the one wanted (graceful shutdown, then :func:`stop_ray`)."""
    return "SIGTERM handler is not set" not in record.getMessage()


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to the Ray cluster at ``address``, or start a local Ray (``num_cpus`` = the
    cores), once per process, from the owner thread (see the module docstring); returns when
    Ray is up, or raises what ``ray.init`` raised. A Ray this process started otherwise (a
    test's ``ray.init``) is used as it is and never stopped here."""
    import ray
    global _session
    with _lock:
        if _session is None:
            if ray.is_initialized():
                return
            logging.getLogger("ray._private.worker").addFilter(_no_sigterm_warning)
            _session = _Session(address, num_cpus)
            _session.thread.start()
        session = _session
    if not session.ready.wait(INIT_TIMEOUT_S):
        raise TimeoutError(f"Ray did not start within {INIT_TIMEOUT_S:.0f} s")
    if session.error is not None:
        with _lock:
            if _session is session:
                _session = None  # the next call tries again
        raise session.error


def stop_ray(timeout: float = 60.0) -> None:
    """Shut down the Ray that :func:`ensure_ray` started (its owner thread calls
    ``ray.shutdown()`` and kills what is left of Ray's processes); a no-op when this process
    started none."""
    global _session
    with _lock:
        session, _session = _session, None
    if session is None:
        return
    session.stop.set()
    session.thread.join(timeout)
    if session.thread.is_alive():
        log.warning("Ray did not shut down within %.0f s", timeout)


# ------------------------------------------------------------------------------- processes
def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[1])  # after "pid (comm) state"


def _children_map() -> dict[int, list[int]]:
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return {}
    out: dict[int, list[int]] = {}
    for pid in pids:
        parent = _parent(pid)
        if parent is not None:
            out.setdefault(parent, []).append(pid)
    return out


def children(pid: int) -> list[int]:
    """The pids of the processes whose parent is ``pid`` (from ``/proc``)."""
    return _children_map().get(pid, [])


def descendants(root: int) -> list[int]:
    """The pids of every process below ``root`` (from ``/proc``; empty where there is none)."""
    tree = _children_map()
    out, todo = [], [root]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/pid/stat): a pid reused by a new process
    has another one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()[19].decode()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"


def reap(pids: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` s for ``pids`` to exit, then SIGKILL those still running (the
    same processes: a pid reused meanwhile is left alone). Returns the pids killed."""
    started = {pid: _start_time(pid) for pid in pids}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in started):
        time.sleep(0.1)
    killed = []
    for pid, start in started.items():
        if start is not None and alive(pid) and _start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    if killed:
        log.warning("stopping Ray: killed %d process(es) left running after ray.shutdown",
                    len(killed))
    return killed
