"""``bucketsearch demo`` (issue 18 item 8): the open-loop rate is one the demo's own client can
send (probed with the load tester's saturation warnings), the server log has content, and
``--keep-serving`` leaves the server up with its address printed last.

The rate choice on scripted probes (exact), then the real demo in a subprocess."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from conftest import ROOT, free_port

from bucketsearch.loadtest import demo
from bucketsearch.loadtest.demo import MIN_RATE, OPEN_SHARE_OF_CLOSED, PROBE_BACKOFF, Probe

pytestmark = pytest.mark.slow  # slow: make test-long

CLIENT_CPU = "client saturated: a client process used 97% of a core during the run"
SHORTFALL = "send rate 150/s is below 95% of the target 240/s"
MACHINE_LAG = ("scheduler lag p99 7.0 ms (> 5.0 ms) with the client at only 20% of a core: the "
               "machine's CPUs are oversubscribed")


def scripted(outcomes):
    """``probe(rate)`` answering from ``outcomes`` (warnings, lag) in turn; records the rates."""
    rates = []

    def probe(rate):
        warnings, lag = outcomes[len(rates)]
        rates.append(rate)
        return Probe(rate, warnings, 0.3, lag)
    return probe, rates


def test_a_clean_first_probe_keeps_the_share_of_the_closed_loop_rate():
    probe, rates = scripted([([], 1.0)])
    rate, why = demo.choose_rate(500.0, probe, say=lambda _: None)
    assert rates == [round(OPEN_SHARE_OF_CLOSED * 500)] and rate == rates[0]
    assert "no saturation warning" in why and "500 req/s" in why


def test_client_saturation_lowers_the_rate_until_a_probe_is_clean():
    probe, rates = scripted([([CLIENT_CPU], 30.0), ([SHORTFALL], 9.0), ([], 1.0)])
    rate, why = demo.choose_rate(1000.0, probe, say=lambda _: None)
    first = round(OPEN_SHARE_OF_CLOSED * 1000)
    assert rates == [first, round(first * PROBE_BACKOFF),
                     round(round(first * PROBE_BACKOFF) * PROBE_BACKOFF)]
    assert rate == rates[-1] and "lowered 2x" in why


def test_machine_lag_that_a_lower_rate_does_not_shorten_keeps_the_higher_rate():
    probe, rates = scripted([([MACHINE_LAG], 7.0), ([MACHINE_LAG], 6.5)])
    rate, why = demo.choose_rate(400.0, probe, say=lambda _: None)
    assert rate == rates[0] == 320 and len(rates) == 2
    assert "other load on the machine" in why


def test_machine_lag_that_a_lower_rate_shortens_is_followed_down():
    probe, rates = scripted([([MACHINE_LAG], 20.0), ([], 2.0)])
    rate, _ = demo.choose_rate(400.0, probe, say=lambda _: None)
    assert rate == rates[1] == round(320 * PROBE_BACKOFF)


def test_the_rate_never_goes_below_the_floor():
    probe, rates = scripted([([CLIENT_CPU], 50.0)] * demo.PROBES)
    rate, why = demo.choose_rate(12.0, probe, say=lambda _: None)
    assert rates == [MIN_RATE] and rate == MIN_RATE and "every probe warned" in why


def test_bad_port_is_refused_with_the_allowed_range(capsys):
    assert demo.main(["--port", "70000"]) == 2
    assert "--port 70000" in capsys.readouterr().err


@pytest.mark.serial  # an open-loop send rate: run alone (make test-long)
@pytest.mark.timeout(600)
def test_demo_runs_keeps_serving_and_stops_cleanly(tmp_path):
    out, port = tmp_path / "out", free_port()
    env = {**os.environ, "BUCKETSEARCH_CALIBRATION_QUERIES": "8", "COLUMNS": "200",
           "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bucketsearch", "demo", "--n", "20000", "--duration", "2",
         "--out", str(out), "--keep-serving", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    lines = []
    try:
        deadline = time.monotonic() + 540
        for line in proc.stdout:  # until the address line: the last line while it serves
            lines.append(line.rstrip())
            if line.startswith("server: http://") or time.monotonic() > deadline:
                break
        text = "\n".join(lines)
        url = f"http://127.0.0.1:{port}"
        assert lines[-1] == f"server: {url}", text
        assert f"dashboard {url}/ui" in text
        # still serving: the demo index, with every code
        assert httpx.get(url + "/readyz", timeout=10).status_code == 200
        assert httpx.get(url + "/v1/indexes/demo", timeout=10).json()["size"] == 20_000
        assert httpx.get(url + "/ui", timeout=10).status_code == 200  # the printed dashboard

        assert "open-loop rate" in text and "chose " in text, text
        summary = json.loads((out / "summary.json").read_text())
        open_run = summary["radius1_open"]
        assert open_run["errors"] == 0 and open_run["achieved_rate"] > 0
        client_bound = [w for w in open_run["warnings"] if w.startswith(demo.CLIENT_WARNINGS)]
        assert client_bound == [], text  # the client sent the rate it chose
        # what may remain is the scheduler lag of a machine busy with other work (the client
        # mostly idle): a probe a few seconds earlier can be clean and the run not
        assert all("oversubscribed" in w for w in open_run["warnings"]), open_run["warnings"]
        log = (out / "server.log").read_text()
        assert "ready in" in log and "merged 20000 items" in log  # a log with content
        assert "POST /v1/indexes/demo/search" not in log  # no line per request

        os.killpg(proc.pid, signal.SIGTERM)
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, rest
        assert "stopping the server" in rest
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/healthz", timeout=2)
        assert not list(tmp_path.glob("bucketsearch-demo-*"))  # its data directory is gone
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
