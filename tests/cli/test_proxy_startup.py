"""`middlebox proxy` starting up as a user meets it: a busy port is one line naming the option
that set it (--listen, --control, --ui), not a traceback; an upstream that cannot be reached
is a warning at start; `--ready-file` holds the "listening on" line once the proxy accepts,
so a script waits for it."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from middlebox.cli.proxy import ready_file_writer, startup_error, upstream_problem
from middlebox.shell.server import Address, ListenError

MIDDLEBOX = [sys.executable, "-m", "middlebox"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_busy_port_is_one_line_naming_the_address_and_what_to_do() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*MIDDLEBOX, "proxy", "--listen", f"127.0.0.1:{port}", "--upstream",
             f"http://127.0.0.1:{closed_port()}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert error_lines == [
        f"Error: cannot listen on 127.0.0.1:{port} (--listen): address already in use (another "
        "proxy or server has it: stop it, or pick another port; port 0 picks a free one)"
    ]
    assert "warning: upstream http://127.0.0.1:" in result.stderr  # and the upstream is down


@pytest.mark.parametrize(
    ("option", "extra"), [("--control", []), ("--ui", []), ("--control", ["--workers", "2"])]
)
def test_a_busy_control_or_console_port_is_blamed_on_its_own_option(
    option: str, extra: list[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*MIDDLEBOX, "proxy", "--listen", "127.0.0.1:0", option, f"127.0.0.1:{port}",
             "--upstream", f"http://127.0.0.1:{closed_port()}", *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert error_lines == [
        f"Error: cannot listen on 127.0.0.1:{port} ({option}): address already in use (another "
        "proxy or server has it: stop it, or pick another port; port 0 picks a free one)"
    ]


def test_the_ready_file_holds_the_listening_line_once_the_proxy_accepts(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    upstream = f"http://127.0.0.1:{closed_port()}"
    process = subprocess.Popen(
        [*MIDDLEBOX, "proxy", "--listen", "127.0.0.1:0", "--upstream", upstream,
         "--ready-file", str(ready)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)  # another process's start-up: polled, this test's loop is its own
        line = ready.read_text()
        assert line.startswith("listening on http://127.0.0.1:") and line.endswith("\n")
        port = int(line.split("http://127.0.0.1:")[1].split()[0].rstrip("/"))
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # accepting as soon as the file is there
    finally:
        os.kill(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert f"warning: upstream {upstream} is not reachable now (connection refused)" in stderr


def test_startup_errors_are_found_inside_exception_groups() -> None:
    busy = OSError(errno.EADDRINUSE, "Address already in use")
    assert startup_error(ExceptionGroup("x", [busy]), "h:1") == startup_error(busy, "h:1")
    assert "permission denied" in str(startup_error(OSError(errno.EACCES, "no"), "h:80"))
    assert startup_error(ValueError("not a start-up failure"), "h:1") is None


def test_a_listeners_error_names_its_own_address_and_option_not_the_listen_ones() -> None:
    busy = OSError(errno.EADDRINUSE, "Address already in use")
    ui = ListenError("ui", Address("::1", 9002), busy)
    said = startup_error(ExceptionGroup("x", [ui]), "127.0.0.1:0")
    assert str(said).startswith("cannot listen on [::1]:9002 (--ui): address already in use")
    assert str(startup_error(busy, "127.0.0.1:0")).startswith(
        "cannot listen on 127.0.0.1:0 (--listen): "
    )
    assert "(--port): address not available on this machine (check the host)" in str(
        startup_error(OSError(errno.EADDRNOTAVAIL, "x"), "10.9.9.9:1", "--port")
    )


def test_a_reachable_upstream_gives_no_warning() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert upstream_problem(f"http://127.0.0.1:{server.getsockname()[1]}") is None
    assert "not reachable" in str(upstream_problem(f"http://127.0.0.1:{closed_port()}"))


def test_the_ready_line_is_written_once_and_other_lines_only_said(tmp_path: Path) -> None:
    said: list[str] = []
    say = ready_file_writer(str(tmp_path / "r"), said.append)
    say("scenario: none")
    assert not (tmp_path / "r").exists()
    say("listening on http://127.0.0.1:5 -> http://u")
    say("listening on http://127.0.0.1:6 -> http://u")
    assert (tmp_path / "r").read_text() == "listening on http://127.0.0.1:5 -> http://u\n"
    assert len(said) == 3 and list(tmp_path.iterdir()) == [tmp_path / "r"]
    assert ready_file_writer(None, said.append) == said.append


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999"])
def test_a_bad_upstream_port_is_reported_not_raised(url: str) -> None:
    assert "upstream http://127.0.0.1:99999" in str(upstream_problem(url))
