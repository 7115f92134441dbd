"""The start-up calibration's t0 over restarts of the same data (issue 26): a server is started
``--restarts`` times on one data directory holding a single-table and an auto index of the same
codes; after each start the t0 each index models with is read from ``GET .../cost-model`` (its
estimator, interval, rounds and stability). Prints, per index, every restart's t0 and
``max / min`` over the restarts (acceptance: <= 1.5, or each unstable calibration reported
with its interval).

    .venv/bin/python bench/bench_t0_restarts.py --codes 1000000 --restarts 5
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import httpx
import numpy as np

from bucketsearch.loadtest import dataset
from bucketsearch.loadtest.demo import ServerProcess, free_port

MODES = ("single", "auto")


def load(url: str, codes: np.ndarray) -> None:
    with httpx.Client(base_url=url, timeout=600) as c:
        for mode in MODES:
            c.post("/v1/indexes", json={"name": mode, "bits": 64, "mode": mode}).raise_for_status()
            for start in range(0, len(codes), 50_000):
                c.post(f"/v1/indexes/{mode}/items", params={"first_id": start},
                       content=np.ascontiguousarray(codes[start:start + 50_000]).tobytes(),
                       headers={"content-type": "application/octet-stream"}).raise_for_status()
            c.post(f"/v1/indexes/{mode}/merge").raise_for_status()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codes", type=int, default=1_000_000)
    ap.add_argument("--restarts", type=int, default=5)
    args = ap.parse_args()
    codes = dataset.clustered_codes(args.codes, 64, seed=7)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        seen = {mode: [] for mode in MODES}
        for i in range(args.restarts + 1):
            srv = ServerProcess(data, free_port(), Path(tmp) / f"server{i}.log")
            try:
                srv.wait_ready(600)
                if i == 0:  # the first start loads the data; the restarts calibrate it
                    load(srv.url, codes)
                    continue
                for mode in MODES:
                    cm = httpx.get(f"{srv.url}/v1/indexes/{mode}/cost-model", timeout=60).json()
                    cal = cm["calibration"]
                    seen[mode].append(cm["t0_ns"])
                    print(f"restart {i} {mode:6s}: t0 [{cm['t0_estimator']}] = "
                          f"{cm['t0_ns']:.2f} ns, CI {cm['t0_ci_ns'][0]:.2f} .. "
                          f"{cm['t0_ci_ns'][1]:.2f}, {len(cal['rounds'])} rounds, "
                          f"{cal['verdict']}", flush=True)
            finally:
                srv.stop()
    for mode, values in seen.items():
        print(f"{mode}: t0 over {len(values)} restarts {[round(v, 2) for v in values]}; "
              f"max/min = {max(values) / min(values):.3f}")


if __name__ == "__main__":
    main()
