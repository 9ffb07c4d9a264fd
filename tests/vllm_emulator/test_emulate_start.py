"""`emulate` starting as a user meets it: a busy port, or a host it cannot listen on, is one
line naming the address and the option, as `middlebox proxy` says it, not a traceback; an
error after the banner is not a start-up failure and keeps its traceback."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

import vllm_emulator.cli
from vllm_emulator.cli import emulate, listen_error


def test_a_busy_port_is_one_line_naming_the_address_and_the_option() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(emulate, ["--port", str(port)])
    assert result.exit_code == 1 and result.exception is not None
    assert "Traceback" not in result.output
    assert result.output.splitlines() == [
        f"Error: cannot listen on 127.0.0.1:{port} (--port): address already in use"
    ]


def test_a_host_it_cannot_listen_on_says_why_in_the_resolvers_words() -> None:
    unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert listen_error(unknown, "no.such.host", 0) == (
        "cannot listen on no.such.host:0 (--port): name or service not known"
    )
    busy = OSError(errno.EADDRINUSE, "error while attempting to bind on address ('::1', 8000)")
    assert listen_error(busy, "::1", 8000) == (
        "cannot listen on [::1]:8000 (--port): address already in use"
    )


def test_an_error_after_the_banner_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def started_then_failed(
        config: Any, host: str, port: int, ready: Callable[[int], None]
    ) -> None:
        ready(8123)
        raise OSError(errno.EADDRINUSE, "not at start-up")

    monkeypatch.setattr(vllm_emulator.cli, "run_emulator", started_then_failed)
    result = CliRunner().invoke(emulate, ["--port", "0"])
    assert result.output == "listening on http://127.0.0.1:8123\n"
    assert isinstance(result.exception, OSError) and not isinstance(result.exception, SystemExit)
