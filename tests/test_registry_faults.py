"""Creating and deleting an index under a storage fault or a crash at every storage call
(issue 10): create and delete either happen whole or not at all, an error leaves the index
as it was (writable again), and a restart sees exactly one of the two outcomes with no hidden
leftovers. Faults are injected beneath the real code (:mod:`bucketsearch.index.storage.fsio`)."""
from __future__ import annotations

import errno

import numpy as np
import pytest

from bucketsearch.app.registry import Registry
from bucketsearch.app.settings import Settings
from bucketsearch.index.storage import fsio
from bucketsearch.index.storage.fsio import FaultPlan, SimulatedCrash

XQ = np.array([[7], [9]], dtype=np.uint64)


def _open(data_dir) -> Registry:
    registry = Registry(Settings(data_dir=data_dir, warmup=False, calibration_queries=0))
    registry.load_all()
    return registry


def _crash(registry: Registry) -> None:
    """The process died: nothing is closed, only the kernel's flock goes with the process."""
    registry.data_lock.release()


def _hidden(data_dir) -> list:
    return [p.name for p in (data_dir / "indexes").iterdir() if p.name.startswith(".")]


def _filled(data_dir) -> None:
    registry = _open(data_dir)
    entry = registry.create("keep", 16, "single", None)
    entry.live.add(XQ, [1, 2])
    registry.close()


def _points(run) -> int:
    """Run ``run(n)`` for n = 1, 2, ... until a run ends with no fault fired; returns n - 1."""
    n = 1
    while run(n):
        n += 1
    return n - 1


@pytest.mark.parametrize("kind", ["error", "crash"])
def test_create_at_every_storage_call(tmp_path, kind):
    def run(n: int) -> bool:
        data = tmp_path / f"{kind}{n}"
        _filled(data)
        registry = _open(data)
        plan = FaultPlan(at=n, errno=errno.EIO, crash=kind == "crash")
        raised = False
        try:
            with fsio.inject(plan):
                registry.create("new", 64, "mih", None)
        except (OSError, SimulatedCrash):
            raised = True
        if kind == "crash":
            _crash(registry)
        else:
            # an error: the index is not there, in memory or on disk (a fault that create
            # absorbs, the best-effort commit position for followers, leaves it whole)
            assert ("new" in registry.entries) != raised and "new" not in registry.unavailable
            registry.close()
        again = _open(data)
        assert set(again.entries) in ({"keep"}, {"keep", "new"}) and not again.unavailable
        if kind == "error":
            assert set(again.entries) == ({"keep"} if raised else {"keep", "new"})
        assert again.entries["keep"].live.range_search(XQ, 0)[2].tolist() == [1, 2]
        if "new" in again.entries:
            again.entries["new"].live.add(XQ, [5, 6])  # a whole index
        assert _hidden(data) == []  # an unfinished create is cleaned at start
        again.close()
        return bool(plan.fired)

    points = _points(run)
    print(f"create, {kind}: {points} storage calls faulted")
    assert points >= 8


@pytest.mark.parametrize("kind", ["error", "crash"])
def test_delete_at_every_storage_call(tmp_path, kind):
    def run(n: int) -> bool:
        data = tmp_path / f"{kind}{n}"
        _filled(data)
        registry = _open(data)
        plan = FaultPlan(at=n, errno=errno.EIO, crash=kind == "crash")
        try:
            with fsio.inject(plan):
                registry.delete("keep")
        except (OSError, SimulatedCrash):
            pass
        if kind == "crash":
            _crash(registry)
        else:
            if "keep" in registry.entries:  # the delete failed before its rename: writable
                entry = registry.entries["keep"]
                entry.live.add(XQ, [3, 4])
                entry.live.delete([3, 4])
            registry.close()
        again = _open(data)
        assert set(again.entries) in (set(), {"keep"}) and not again.unavailable
        if kind == "error":
            assert set(again.entries) == set(registry.entries)  # the restart agrees
        if "keep" in again.entries:
            assert again.entries["keep"].live.range_search(XQ, 0)[2].tolist() == [1, 2]
        assert _hidden(data) == []
        again.close()
        return bool(plan.fired)

    points = _points(run)
    print(f"delete, {kind}: {points} storage calls faulted")
    assert points >= 2
