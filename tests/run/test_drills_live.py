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
from tests.process_tree import child_pids, command_line, gone, kill, survivors
from tests.run.plugin_example import stream

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


def ignoring_sigint() -> None:
    """The child starts with SIGINT ignored, as a background job of a non-interactive shell
    does (some CI runners start jobs so): Python keeps an inherited SIG_IGN."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_drill(port: int, journal: Path) -> tuple[subprocess.Popen[str], str]:
    """`middlebox drill start` on `port`, read up to its "Ctrl-C to stop" banner."""
    child = subprocess.Popen(
        [sys.executable, "-m", "middlebox", "drill", "start", "mid-stream-reset",
         "--port", str(port), "--journal", str(journal)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        preexec_fn=ignoring_sigint,
    )  # fmt: skip
    seen = ""
    assert child.stdout is not None
    deadline = time.monotonic() + 60
    while "Ctrl-C to stop" not in seen and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        seen += line
    return child, seen


def test_drill_start_on_the_command_line_takes_a_port_and_names_the_journal_when_stopped(
    tmp_path: Path,
) -> None:
    port, journal = free_port(), tmp_path / "j.ndjson"
    child, seen = start_drill(port, journal)
    rest = ""
    try:
        assert f"OPENAI_BASE_URL=http://127.0.0.1:{port}/v1" in seen, seen
        # what Ctrl-C sends the foreground process; it stops the drill even though the
        # drill was started with SIGINT ignored
        os.kill(child.pid, signal.SIGINT)
        try:
            rest, _ = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            rest, _ = child.communicate()
            pytest.fail(f"SIGINT did not stop the drill in 30 s; it said:\n{seen}{rest}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, seen + rest
    assert f"stopped after 0 connections; journal: {journal}" in rest
    assert journal.exists()  # written, empty: nobody connected


def test_a_sigkilled_drill_leaves_neither_its_emulator_nor_its_proxy_running(
    tmp_path: Path,
) -> None:
    child, seen = start_drill(free_port(), tmp_path / "j.ndjson")
    found: set[int] = set()
    try:
        assert "Ctrl-C to stop" in seen, seen
        found = child_pids(child.pid)
        commands = sorted(command_line(pid) for pid in found)
        assert len(found) == 2, commands
        assert any("vllm_emulator" in c for c in commands), commands
        assert any(" proxy " in c for c in commands), commands
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        # each got SIGTERM from the kernel; the proxy drains for its --grace (2 s) first
        assert survivors(found, timeout=20) == set(), [command_line(p) for p in found]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        kill(pid for pid in found if not gone(pid))


def test_drill_start_offers_port_control_port_and_journal() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "middlebox", "drill", "start", "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0
    for option in ("--port", "--control-port", "--journal"):
        assert option in done.stdout


@pytest.mark.parametrize(
    ("option", "proxy_option"),
    [("--port", "--listen"), ("--control-port", "--control"), ("--ui-port", "--ui")],
)
def test_a_busy_port_is_named_by_the_drill_start_option_that_asked_for_it(
    option: str, proxy_option: str
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "middlebox", "drill", "start", "mid-stream-reset",
             option, str(port)],
            capture_output=True, text=True, timeout=90, cwd=ROOT,
        )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("Error")]
    assert f"cannot listen on 127.0.0.1:{port} ({option})" in error
    assert f"({proxy_option})" not in error
