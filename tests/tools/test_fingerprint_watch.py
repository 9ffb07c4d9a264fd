"""`middlebox fingerprint --watch`'s gauges and rounds: the exposition names the front door on
every series and leaves out what no round measured (never a 0 that would read as "holds
nothing"); a dead path shows as up 0, a rising failure count and a stale last success; the
metrics server answers GET /metrics and nothing else; rounds that fail are counted and never
end the watch; the command line refuses options that do not go with --watch. Loopback only,
every socket with a timeout, rounds bounded by --count."""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from middlebox.observe.prometheus import parse_text
from middlebox.scenario.canary import Reading, Watch
from middlebox.shell.control import is_loopback
from middlebox.shell.server import Address
from middlebox.tools.fingerprint import FingerprintError
from middlebox.tools.fingerprint_watch import DEFAULT_METRICS, MetricsServer, exposition, watch
from middlebox.tools.probe_upstream import ProbeUpstream

DOOR = "https://edge.example/probe-llm/v1"
L = '{front_door="https://edge.example/probe-llm/v1"}'


def test_before_any_round_only_the_counts_and_a_zero_last_success_are_exported() -> None:
    samples = parse_text(exposition(DOOR, Watch()))
    assert samples == {
        f"middlebox_canary_up{L}": 0.0,
        f"middlebox_canary_last_success_timestamp_seconds{L}": 0.0,
        f"middlebox_canary_rounds_total{L}": 0.0,
        f"middlebox_canary_failures_total{L}": 0.0,
    }


def test_a_measured_round_exports_every_gauge_with_the_front_door() -> None:
    state = Watch()
    state.succeeded(Reading(0.3, 4096, 0.002, True), at=1_800_000_000.5, took=1.25)
    text = exposition(DOOR, state)
    samples = parse_text(text)
    assert samples[f"middlebox_canary_up{L}"] == 1.0
    assert samples[f"middlebox_canary_added_ttft_seconds{L}"] == 0.3
    assert samples[f"middlebox_canary_held_bytes{L}"] == 4096.0
    assert samples[f"middlebox_canary_cancel_propagation_seconds{L}"] == 0.002
    assert samples[f"middlebox_canary_cancel_learned{L}"] == 1.0
    assert samples[f"middlebox_canary_last_success_timestamp_seconds{L}"] == 1_800_000_000.5
    assert samples[f"middlebox_canary_round_duration_seconds{L}"] == 1.25
    assert samples[f"middlebox_canary_rounds_total{L}"] == 1.0
    assert "# TYPE middlebox_canary_held_bytes gauge" in text
    assert "# TYPE middlebox_canary_failures_total counter" in text


def test_a_path_that_holds_nothing_exports_zero_held_bytes() -> None:
    state = Watch()
    state.succeeded(Reading(0.0, 0, 0.001, True), at=1.0, took=1.0)
    assert parse_text(exposition(DOOR, state))[f"middlebox_canary_held_bytes{L}"] == 0.0


def test_a_failed_round_after_a_success_shows_the_path_down_and_keeps_the_last_numbers() -> None:
    state = Watch()
    state.succeeded(Reading(0.3, 4096, 0.002, True), at=100.0, took=1.0)
    state.failed("cannot connect", took=0.01)
    samples = parse_text(exposition(DOOR, state))
    assert samples[f"middlebox_canary_up{L}"] == 0.0
    assert samples[f"middlebox_canary_failures_total{L}"] == 1.0
    assert samples[f"middlebox_canary_rounds_total{L}"] == 2.0
    assert samples[f"middlebox_canary_last_success_timestamp_seconds{L}"] == 100.0
    assert samples[f"middlebox_canary_held_bytes{L}"] == 4096.0


def test_what_a_round_could_not_tell_is_left_out_not_written_as_zero() -> None:
    state = Watch()
    state.succeeded(Reading(None, None, None, None), at=1.0, took=1.0)
    text = exposition(DOOR, state)
    for name in ("added_ttft_seconds", "held_bytes", "cancel_propagation_seconds",
                 "cancel_learned"):  # fmt: skip
        assert f"middlebox_canary_{name}" not in text
    assert parse_text(text)[f"middlebox_canary_up{L}"] == 1.0


def test_a_leave_never_learned_exports_the_wait_and_learned_zero() -> None:
    state = Watch()
    state.succeeded(Reading(0.0, 0, 5.0, False), at=1.0, took=6.0)
    samples = parse_text(exposition(DOOR, state))
    assert samples[f"middlebox_canary_cancel_propagation_seconds{L}"] == 5.0
    assert samples[f"middlebox_canary_cancel_learned{L}"] == 0.0


def test_a_front_door_with_a_quote_is_escaped_in_the_label() -> None:
    text = exposition('http://h/"x"\\', Watch())
    assert 'middlebox_canary_up{front_door="http://h/\\"x\\"\\\\"} 0' in text


def test_the_metrics_listen_on_loopback_unless_told_otherwise() -> None:
    assert is_loopback(Address.parse(DEFAULT_METRICS).host)


def test_the_metrics_server_answers_get_metrics_and_nothing_else() -> None:
    server = MetricsServer(Address("127.0.0.1", 0), lambda: "middlebox_canary_up 1\n")
    try:
        url = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert answer.read() == b"middlebox_canary_up 1\n"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/journals", timeout=10)
        assert refused.value.code == 404
    finally:
        server.close()
    with pytest.raises(OSError):  # closed: nothing listens there any more
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_rounds_that_fail_are_counted_and_printed_and_the_watch_goes_on() -> None:
    lines: list[str] = []
    url = f"http://127.0.0.1:{closed_port()}/v1"
    state = watch(url, 0.5, metrics="127.0.0.1:0", count=3, say=lines.append)
    assert (state.rounds, state.failures, state.up) == (3, 3, False)
    assert lines[0].startswith(f"watching {url} every 0.5 s; metrics on http://127.0.0.1:")
    assert len(lines) == 4
    assert all(" failed (" in line and "cannot connect" in line for line in lines[1:])
    assert "round 3 failed (3 failures)" in lines[3]


def test_a_round_through_the_bare_probe_measures_nothing_held() -> None:
    lines: list[str] = []
    with ProbeUpstream("127.0.0.1", 0) as probe:
        state = watch(f"http://127.0.0.1:{probe.port}/v1", 0.5, metrics="127.0.0.1:0",
                      count=1, say=lines.append)  # fmt: skip
    assert (state.rounds, state.failures, state.up) == (1, 0, True)
    assert state.last is not None and state.last.bytes_held == 0
    assert state.last.cancel_learned is True
    assert " round 1: added TTFT " in lines[1] and "held 0 B" in lines[1]


def test_a_metrics_address_that_is_not_host_port_is_one_line() -> None:
    with pytest.raises(FingerprintError, match="--metrics-listen nowhere"):
        watch("http://127.0.0.1:9/v1", 1.0, metrics="nowhere", count=1)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "middlebox", "fingerprint", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_command_refuses_count_without_watch_and_watch_with_write() -> None:
    alone = run_cli("http://127.0.0.1:9/v1", "--count", "2")
    assert alone.returncode == 2 and "--count bounds the rounds of --watch" in alone.stderr
    mixed = run_cli("http://127.0.0.1:9/v1", "--watch", "1", "--write", "x.yaml")
    assert mixed.returncode == 2 and "--watch runs the canary alone" in mixed.stderr


def test_the_command_exits_1_when_a_counted_round_failed() -> None:
    done = run_cli(f"http://127.0.0.1:{closed_port()}/v1", "--watch", "0.5", "--count", "1",
                   "--metrics-listen", "127.0.0.1:0")  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "round 1 failed (1 failure)" in done.stdout
    assert "Traceback" not in done.stderr


def test_sigterm_ends_the_watch_as_ctrl_c_does() -> None:
    # a canary in a container ends with SIGTERM (docker stop, a pod's end)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "middlebox", "fingerprint", f"http://127.0.0.1:{closed_port()}/v1",
         "--watch", "0.5", "--metrics-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watcher.stdout is not None
        readable, _, _ = select.select([watcher.stdout], [], [], 30)
        assert readable and watcher.stdout.readline().startswith("watching ")
        watcher.send_signal(signal.SIGTERM)
        out, err = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate(timeout=10)
    assert watcher.returncode == 0, err
    assert out.rstrip().endswith("stopped") and "Traceback" not in err
