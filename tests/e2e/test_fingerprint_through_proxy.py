"""`middlebox fingerprint` through a real `middlebox proxy` process with a known path in front
of a real probe upstream: it must find nginx's 4 KiB buffer within its stated tolerance,
that `X-Accel-Buffering: no` is honoured, and the header the path adds on each side; through
a bare path (no fault) it must find no hold and no header change. Bounded: each run has a
budget, every socket a timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from middlebox.tools.fingerprint import fingerprint
from middlebox.tools.probe_upstream import ProbeUpstream
from tests.proxy_process import middlebox_proxy

BUFFERING = (
    "  - set_header: {direction: request, headers: {X-Team: blue}}\n"
    "  - set_header: {direction: response, headers: {X-Served-By: edge-1}}\n"
    "  - proxy_buffering: {}\n"
)
BUDGET = 40.0


def test_the_fingerprint_finds_the_buffer_and_the_header_changes(tmp_path: Path) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(tmp_path, probe.port, BUFFERING, "buffering") as port,
    ):
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=BUDGET)
    measures = found["measures"]
    held = measures["hold"]["release"]
    assert held["by"] == "size" and abs(held["bytes"] - 4096) <= held["uncertainty"] <= 263
    assert measures["hold"]["x_accel_buffering_honoured"] is True
    assert measures["request_headers"]["added"] == [["X-Team", "blue"]]
    assert measures["response_headers"]["added"] == [["X-Served-By", "edge-1"]]
    assert measures["framing"]["rechunked"] is False
    assert measures["leave"]["learned"] is True
    assert found["summary"][1].startswith("It holds ~4.0 KiB")


def test_a_bare_path_shows_no_hold_and_no_header_change(tmp_path: Path) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        middlebox_proxy(tmp_path, probe.port, "  []\n", "bare") as port,
    ):
        found = fingerprint(
            f"http://127.0.0.1:{port}/v1", direct=f"http://127.0.0.1:{probe.port}/v1", budget=BUDGET
        )
    for side in (found, found["direct"]):
        measures = side["measures"]
        assert measures["hold"]["release"] == {"held": False, "by": "nothing"}
        assert "x_accel_buffering_honoured" not in measures["hold"]
        for headers in (measures["request_headers"], measures["response_headers"]):
            assert headers == {"added": [], "removed": [], "changed": []}
        assert measures["framing"]["rechunked"] is False


def test_the_command_prints_the_summary_and_writes_the_json(tmp_path: Path) -> None:
    out = tmp_path / "fp.json"
    with ProbeUpstream("127.0.0.1", 0) as probe:
        done = subprocess.run(
            [sys.executable, "-m", "middlebox", "fingerprint",
             f"http://127.0.0.1:{probe.port}/v1", "--budget", "20", "--json", str(out)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "It holds nothing" in done.stdout
    assert "fingerprint: measuring hold" in done.stderr
    assert json.loads(out.read_text())["summary"] == done.stdout.strip().splitlines()
