"""`middlebox run --upstream` warns when a loopback server runs in another autogroup session.

A real listening process stands in for the server; the autogroup switch is a file of the test's
own, so the verdict does not depend on this machine's sysctl.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from middlebox.library import scenario_dir
from middlebox.run import sessions
from middlebox.run.sessions import listening_pids, other_session_warning
from middlebox.run.suite import run_suite

ROOT = Path(__file__).resolve().parents[2]

LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', 0))\n"
    "s.listen()\n"
    "print(s.getsockname()[1], flush=True)\n"
    "sys.stdin.read()\n"  # until the test closes our stdin
)


@contextmanager
def listener(new_session: bool) -> Iterator[tuple[int, int]]:
    """(pid, port) of a process listening on 127.0.0.1, in its own session or in ours."""
    process = subprocess.Popen(
        [sys.executable, "-c", LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        start_new_session=new_session, process_group=None if new_session else 0,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield process.pid, port
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(30)


def switch(tmp_path: Path, value: str) -> Path:
    path = tmp_path / "sched_autogroup_enabled"
    path.write_text(value + "\n")
    return path


def test_a_server_in_another_session_is_named_with_its_pid(tmp_path: Path) -> None:
    with listener(new_session=True) as (pid, port):
        assert listening_pids(port) == {pid}
        warning = other_session_warning(f"http://127.0.0.1:{port}", switch(tmp_path, "1"))
    assert warning is not None
    assert f"pid {pid}" in warning and "another session" in warning
    assert "sched_autogroup_enabled=0" in warning


def test_a_server_in_this_session_is_not_warned_about(tmp_path: Path) -> None:
    with listener(new_session=False) as (pid, port):
        assert os.getsid(pid) == os.getsid(0)
        assert other_session_warning(f"http://127.0.0.1:{port}", switch(tmp_path, "1")) is None


def test_nothing_is_said_with_autogroup_off_or_a_remote_server(tmp_path: Path) -> None:
    with listener(new_session=True) as (_pid, port):
        assert other_session_warning(f"http://127.0.0.1:{port}", switch(tmp_path, "0")) is None
        assert other_session_warning(f"http://127.0.0.1:{port}", tmp_path / "absent") is None
        # a remote server's scheduling is not this machine's
        assert other_session_warning(f"http://192.0.2.1:{port}", switch(tmp_path, "1")) is None


def test_a_port_nobody_listens_on_gives_no_pid(tmp_path: Path) -> None:
    with listener(new_session=True) as (_pid, port):
        pass  # closed again: the port is free now
    assert listening_pids(port) == set()
    assert other_session_warning(f"http://127.0.0.1:{port}", switch(tmp_path, "1")) is None


def test_middlebox_run_says_so_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a scenario that needs the emulator asks the server nothing: only the warning is tested
    monkeypatch.setattr(sessions, "AUTOGROUP", switch(tmp_path, "1"))
    scenario = str(scenario_dir() / "vllm-engine-error.yaml")
    with listener(new_session=True) as (pid, port), caplog.at_level(logging.WARNING):
        outcome = run_suite(
            [scenario], client_names=["raw"], upstream_url=f"http://127.0.0.1:{port}"
        )
    warned = [r.getMessage() for r in caplog.records if "another session" in r.getMessage()]
    assert len(warned) == 1 and f"pid {pid}" in warned[0]
    assert outcome.outcomes[0].needs_emulator
