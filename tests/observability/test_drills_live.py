"""`middlebox drill start`: the incident runs live behind `middlebox proxy` with its control
API, on the port asked (`--port`), and every connection's journal the hints tell the
trainee to read is on the control port while it runs and written to a file when it stops
(real processes on 127.0.0.1, bounded in time)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from middlebox.run.drills import live_banner, start
from tests.observability.plugin_example import stream

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_live_drill_listens_where_asked_and_journals_what_the_trainee_sent(
    tmp_path: Path,
) -> None:
    port = free_port()
    journal = tmp_path / "drill.journal.ndjson"
    live = start("silent-truncation", port=port, journal=journal)
    try:
        assert live.proxy.url == f"http://127.0.0.1:{port}"
        banner = live_banner(live)
        assert f"OPENAI_BASE_URL=http://127.0.0.1:{port}/v1" in banner
        assert f"{live.proxy.control.url}/journals/ID" in banner and str(journal) in banner
        text, done = stream(live.proxy.base_url, live.model, max_tokens=200)
        assert text and not done  # the hidden duration cap: no [DONE]
        deadline = time.monotonic() + 5
        while not live.proxy.control.journals() and time.monotonic() < deadline:
            time.sleep(0.05)
        (summary,) = live.proxy.control.journals()
        assert summary["faults_fired"] == ["max_duration"]
        lines = live.proxy.control.journal(summary["connection"])
        assert any(line["type"] == "end" for line in lines)
    finally:
        live.stop()
    written = [json.loads(line) for line in journal.read_text().splitlines()]
    assert {line["type"] for line in written} >= {"read", "wrote", "fault", "end"}
    assert not live.proxy.process.running() and not live.emulator.running()


def test_drill_start_on_the_command_line_takes_a_port_and_names_the_journal_when_stopped(
    tmp_path: Path,
) -> None:
    port, journal = free_port(), tmp_path / "j.ndjson"
    child = subprocess.Popen(
        [sys.executable, "-m", "middlebox", "drill", "start", "mid-stream-reset",
         "--port", str(port), "--journal", str(journal)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip
    seen = ""
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 60
        while "Ctrl-C to stop" not in seen and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            seen += line
        assert f"OPENAI_BASE_URL=http://127.0.0.1:{port}/v1" in seen, seen
        os.kill(child.pid, signal.SIGINT)  # what Ctrl-C sends the foreground process
        rest, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, seen + rest
    assert f"stopped after 0 connections; journal: {journal}" in rest
    assert journal.exists()  # written, empty: nobody connected


def test_drill_start_offers_port_control_port_and_journal() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "middlebox", "drill", "start", "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0
    for option in ("--port", "--control-port", "--journal"):
        assert option in done.stdout
