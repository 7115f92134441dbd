"""Timing helper of the in-process A/B benches (bench_ab.py, bench_mih_knn_ab.py,
bench_hugepages.py), imported from the bench folder (``python bench/<script>.py``)."""
from __future__ import annotations

import time


def best(fn, inner: int = 3) -> float:
    """Least thread CPU time of ``inner`` calls of ``fn`` (the machine is shared: CPU time
    leaves out the time the thread waited for a core; the searches run with threads = 1, so
    it is the whole search)."""
    b = float("inf")
    for _ in range(inner):
        t = time.thread_time()
        fn()
        b = min(b, time.thread_time() - t)
    return b
