"""`middlebox fingerprint --watch` on a path that starts buffering after a deploy: a real
probe upstream, a real `middlebox proxy` passing through, the watch as its own process.
Its /metrics must say 0 bytes held and no added TTFT; then nginx-default's
`proxy_buffering` goes in through the proxy's control API (`POST /faults`, as a deploy
would change a live hop) and the same gauges must rise to the 4 KiB buffer and a first
token ~0.3 s late; Ctrl-C ends the watch with exit status 0. And a hop that stops passing
the client's close (`ignore_client_close`): the cancel gauge must go from learned at once to
not learned in its 5 s wait. Loopback only; every wait has a deadline and the rounds a
count."""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from middlebox.observe.prometheus import parse_text
from middlebox.tools.probe_upstream import ProbeUpstream
from tests.proxy_process import middlebox_proxy, stop

pytestmark = pytest.mark.e2e

ROUNDS_BOUND = 60  # --count: the watch ends by itself even if the test never stops it
WAIT = 40.0  # seconds for a gauge to show a change: a few rounds on a loaded machine
# nginx-default's proxy_buffering, as faults/presets.py writes it
NGINX_BUFFERING = {
    "proxy_buffering": {
        "buffer_size": "4KiB",
        "buffers_size": "4KiB",
        "proxy_http_version": "1.0",
        "postpone_output": 1460,
    }
}


def first_line(process: subprocess.Popen[str], within: float) -> str:
    """The watch's first stdout line (where its metrics are), or fail after `within` s."""
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], within)
    assert readable, "the watch said nothing"
    return process.stdout.readline()


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return parse_text(answer.read().decode())


def gauges_when(url: str, door: str, wanted: str, *, after_rounds: float) -> dict[str, float]:
    """The canary's gauges (by short name) once a round after `after_rounds` measured the
    path and `wanted` is among them; fails after WAIT seconds with the last scrape."""
    deadline = time.monotonic() + WAIT
    found: dict[str, float] = {}
    label = '{front_door="' + door + '"}'
    while time.monotonic() < deadline:
        samples = scrape(url)
        found = {series.removeprefix("middlebox_canary_").removesuffix(label): value
                 for series, value in samples.items() if series.endswith(label)}  # fmt: skip
        if found.get("rounds_total", 0) > after_rounds and found.get("up") and wanted in found:
            return found
        time.sleep(0.2)  # the next round's scrape, polled
    raise AssertionError(f"no round measured {wanted} within {WAIT} s: {found}")


def watch_process(door: str) -> subprocess.Popen[str]:
    """`middlebox fingerprint DOOR --watch 0.5` as its own process, its rounds bounded."""
    return subprocess.Popen(
        [sys.executable, "-m", "middlebox", "fingerprint", door, "--watch", "0.5",
         "--count", str(ROUNDS_BOUND), "--metrics-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def metrics_url(watcher: subprocess.Popen[str]) -> str:
    said = first_line(watcher, 30.0)
    metrics = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", said)
    assert metrics is not None, said
    return metrics[1]


def deploy(control: str, fault: dict[str, Any], metrics: str, door: str) -> float:
    """POST `fault` to the proxy's `/faults`; the rounds counted after it took effect (a
    round that began before the POST may still have passed through the old path)."""
    request = urllib.request.Request(
        f"{control}/faults", data=json.dumps(fault).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 201
    return scrape(metrics)[f'middlebox_canary_rounds_total{{front_door="{door}"}}'] + 1


@contextmanager
def watched_proxy(folder: Path, name: str) -> Iterator[tuple[str, str, str, subprocess.Popen[str]]]:
    """A probe upstream, a pass-through `middlebox proxy` with its control API, and the
    watch on it: (the control API's URL, the front door, the metrics URL, the watch)."""
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(folder, probe.port, "  []\n", name, ("--control", "127.0.0.1:0")) as port,
    ):
        ready = (folder / f"{name}.ready").read_text()
        control = re.search(r"control API on (http://127\.0\.0\.1:\d+)", ready)
        assert control is not None, ready
        door = f"http://127.0.0.1:{port}/v1"
        watcher = watch_process(door)
        try:
            yield control[1], door, metrics_url(watcher), watcher
        finally:
            if watcher.poll() is None:
                stop(watcher)


def test_a_path_that_starts_buffering_shows_on_the_canary_gauges(tmp_path: Path) -> None:
    with watched_proxy(tmp_path, "deploy") as (control, door, metrics, watcher):
        before = gauges_when(metrics, door, "held_bytes", after_rounds=0)
        assert before["held_bytes"] == 0, before
        assert before["added_ttft_seconds"] < 0.1, before
        assert before["cancel_learned"] == 1, before
        assert before["failures_total"] == 0, before
        deployed = deploy(control, NGINX_BUFFERING, metrics, door)
        after = gauges_when(metrics, door, "held_bytes", after_rounds=deployed)
        assert abs(after["held_bytes"] - 4096) <= 270, after
        assert 0.2 <= after["added_ttft_seconds"] <= 1.0, after
        assert after["cancel_learned"] == 1, after  # buffering holds data, not the close
        assert after["failures_total"] == 0, after
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    assert out.rstrip().endswith("stopped"), out
    assert "Traceback" not in err
    held = [int(n) for n in re.findall(r" round \d+: .*, held (\d+) B", out)]
    assert held[0] == 0 and max(held) > 3800, out  # one line per round, both stories


def test_a_path_that_stops_passing_the_cancel_shows_on_the_canary_gauges(tmp_path: Path) -> None:
    # `ignore_client_close: {until: never}` (a hop that drains the upstream to its end):
    # the probe never learns the client left, so the gauge reads the 5 s wait, learned 0
    never = {"ignore_client_close": {"until": "never"}}
    with watched_proxy(tmp_path, "cancel") as (control, door, metrics, _):
        before = gauges_when(metrics, door, "cancel_learned", after_rounds=0)
        assert before["cancel_learned"] == 1, before
        assert before["cancel_propagation_seconds"] < 0.5, before
        deployed = deploy(control, never, metrics, door)
        after = gauges_when(metrics, door, "cancel_learned", after_rounds=deployed)
    assert after["cancel_learned"] == 0, after
    assert after["cancel_propagation_seconds"] == 5.0, after
    assert after["held_bytes"] == 0 and after["failures_total"] == 0, after
