"""The model of what ran against an auto, an mih and a single index (issue 26): a server on a
temporary directory, one index per mode holding the same clustered codes, the load tester at
radii 0..4 and k-NN k = 10 against each (tables printed; JSON, PNG and the server's
/cost-model written to OUT).

    .venv/bin/python bench/bench_what_ran.py [N_CODES [MODES [SECONDS [OUT]]]]
    .venv/bin/python bench/bench_what_ran.py 200000 auto,mih,single 6 out/what_ran
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

from bucketsearch.loadtest import dataset
from bucketsearch.loadtest.cli import main as loadtest
from bucketsearch.loadtest.demo import ServerProcess, free_port

CHUNK = 50_000


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    modes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["auto", "mih", "single"]
    seconds = sys.argv[3] if len(sys.argv) > 3 else "8"
    out = Path(sys.argv[4] if len(sys.argv) > 4 else "out/what_ran")
    out.mkdir(parents=True, exist_ok=True)
    codes = dataset.clustered_codes(n, 64, seed=7)
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(Path(tmp), free_port(), out / "server.log")
        try:
            srv.wait_ready(300)
            with httpx.Client(base_url=srv.url, timeout=600) as c:
                for mode in modes:
                    c.post("/v1/indexes", json={"name": mode, "bits": 64,
                                                "mode": mode}).raise_for_status()
                    for s in range(0, n, CHUNK):
                        c.post(f"/v1/indexes/{mode}/items", params={"first_id": s},
                               content=np.ascontiguousarray(codes[s:s + CHUNK]).tobytes(),
                               headers={"content-type": "application/octet-stream"}
                               ).raise_for_status()
                    c.post(f"/v1/indexes/{mode}/merge").raise_for_status()
            for mode in modes:
                loadtest(["--url", srv.url, "--index", mode, "--mode", "closed",
                          "--concurrency", "2", "--duration", seconds, "--warmup", "1",
                          "--radii", "0,1,2,3,4", "--knn", "10", "--stats", "--seed", "5",
                          "--no-progress", "--json", str(out / f"{mode}.json"),
                          "--plot", str(out / f"{mode}.png")])
                cm = httpx.get(f"{srv.url}/v1/indexes/{mode}/cost-model", timeout=60).json()
                (out / f"{mode}.cost-model.json").write_text(json.dumps(cm, indent=1))
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
