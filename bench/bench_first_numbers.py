"""What ``HammingIndex`` alone costs at radius 4 against ``make_index(mode="auto")`` (README,
"The engine in Python"): 1M uniform 64-bit codes, queries of 2 flipped bits, one process.

    .venv/bin/python bench/bench_first_numbers.py
"""
from __future__ import annotations

import time

import numpy as np

from bucketsearch import HammingIndex, make_index


def main() -> None:
    xb = np.random.default_rng(0).integers(0, 2, (1_000_000, 64), dtype=np.uint8)
    xq = xb[:1000].copy()
    xq[:, :2] ^= 1
    for name, index, nq in (("auto", make_index(64, mode="auto"), 1000),
                            ("HammingIndex", HammingIndex(64), 100)):
        t = time.perf_counter()
        index.add(xb)
        build = time.perf_counter() - t
        index.range_search(xq[:2], 4)  # compiled, warm
        t = time.perf_counter()
        st = index.range_search(xq[:nq], 4, stats=True)[3]
        dt = time.perf_counter() - t
        print(f"{name}: build {build:.1f} s; radius 4, {nq} queries: {dt:.3f} s = "
              f"{dt / nq * 1e3:.3f} ms/query; ran {sorted(set(st.engine_names()))}")


if __name__ == "__main__":
    main()
