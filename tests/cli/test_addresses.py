"""Every address and port option, as a user types it: a port outside 0-65535 (or 0 for an
upstream, which cannot be dialled) is a usage error naming the option, exit 2, before
anything probes or listens; an address that is fine goes on to start. Nothing here starts:
each command's one function is replaced by one that says it was reached."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

import middlebox.cli.proxy
import middlebox.run.drills
import middlebox.run.serve
import middlebox.tools.fingerprint_watch
import middlebox.tools.probe_upstream
import middlebox.tools.record
import vllm_emulator.cli
from middlebox.cli.main import main

UPSTREAM = "http://127.0.0.1:8000"


class Started(Exception):
    """The command got past its options to the function that would start it."""


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The upstreams `proxy` probed for reachability; every command's start is stubbed."""

    def started(*args: Any, **kwargs: Any) -> Any:
        raise Started

    probes: list[str] = []

    def probe(upstream: str) -> None:
        probes.append(upstream)

    for module, name in [
        (middlebox.run.serve, "serve"),
        (middlebox.tools.record, "record"),
        (middlebox.tools.probe_upstream, "ProbeUpstream"),
        (middlebox.tools.fingerprint_watch, "watch"),
        (middlebox.run.drills, "run_live"),
        (vllm_emulator.cli, "run_emulator"),
    ]:
        monkeypatch.setattr(module, name, started)
    monkeypatch.setattr(middlebox.cli.proxy, "upstream_problem", probe)
    return probes


def proxy(*options: str) -> list[str]:
    return ["proxy", "--upstream", UPSTREAM, *options]


def record(*options: str) -> list[str]:
    return ["record", "--upstream", UPSTREAM, "--out", "tapes", *options]


def watch(address: str) -> list[str]:
    return ["fingerprint", "http://127.0.0.1:1/v1", "--watch", "1", "--metrics-listen", address]


# (the option the error names, the command line with its bad value)
OUT_OF_RANGE = [
    ("--listen", proxy("--listen", "127.0.0.1:99999")),
    ("--control", proxy("--listen", "127.0.0.1:0", "--control", "127.0.0.1:70000")),
    ("--ui", proxy("--listen", "127.0.0.1:0", "--ui", "127.0.0.1:70001")),
    ("--upstream", ["proxy", "--upstream", "http://127.0.0.1:99999"]),
    ("--upstream", ["proxy", "--upstream", "127.0.0.1:65536"]),
    ("--upstream", ["proxy", "--upstream", "http://127.0.0.1:0"]),
    ("--upstream", ["proxy", "--upstream", "127.0.0.1:0"]),
    ("--listen", record("--listen", "[::1]:123456")),
    ("--upstream", ["record", "--upstream", "127.0.0.1:0", "--out", "tapes"]),
    ("--metrics-listen", watch("127.0.0.1:65536")),
    ("--port", ["emulate", "--port", "70000"]),
    ("--port", ["probe-upstream", "--port", "70000"]),
    ("--port", ["drill", "start", "silent-truncation", "--port", "70000"]),
    ("--control-port", ["drill", "start", "silent-truncation", "--control-port", "-1"]),
    ("--ui-port", ["drill", "start", "silent-truncation", "--ui-port", "65536"]),
    # before the journal argument: click checks in the order typed, and j.ndjson is absent
    ("--listen-port", ["pcap", "--listen-port", "70000", "j.ndjson", "-o", "x.pcap"]),
    ("--upstream-port", ["pcap", "--upstream-port", "70000", "j.ndjson", "-o", "x.pcap"]),
]


@pytest.mark.parametrize(
    ("option", "args"), OUT_OF_RANGE, ids=lambda v: v if isinstance(v, str) else " ".join(v)
)
def test_a_port_out_of_range_is_a_usage_error_naming_the_option(
    probed: list[str], option: str, args: list[str]
) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert "Traceback" not in result.output and probed == []


# Every option above with a value that must go through to the command's start.
IN_RANGE: list[list[str]] = [
    proxy("--listen", "127.0.0.1:0"),
    proxy("--listen", "[::1]:65535", "--control", "127.0.0.1:0", "--ui", "localhost:9002"),
    ["proxy", "--upstream", "https://api.example"],
    ["proxy", "--upstream", "127.0.0.1:1", "--listen", "0.0.0.0:9000"],
    record("--listen", "127.0.0.1:0"),
    watch("127.0.0.1:0"),
    ["emulate", "--port", "65535"],
    ["probe-upstream", "--port", "0"],
    ["drill", "start", "silent-truncation", "--port", "65535", "--control-port", "0"],
]


@pytest.mark.parametrize("args", IN_RANGE, ids=" ".join)
def test_addresses_and_ports_in_range_go_on_to_start(probed: list[str], args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert isinstance(result.exception, Started), result.output


def test_an_upstream_that_is_not_an_address_is_refused_before_it_is_probed(
    probed: list[str],
) -> None:
    result = CliRunner().invoke(main, ["proxy", "--upstream", "notaurl"])
    assert result.exit_code == 2
    assert "Invalid value for '--upstream': expected HOST:PORT, got 'notaurl'" in result.output
    assert probed == [] and "not reachable" not in result.output
    reached = CliRunner().invoke(main, ["proxy", "--upstream", UPSTREAM])
    assert isinstance(reached.exception, Started) and probed == [UPSTREAM]
