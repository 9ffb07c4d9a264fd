"""The observability commands as a new user meets them: `proxy --control` (apply a
scenario over HTTP, stream through it, read /metrics, stop with Ctrl-C and get the
journal), `pcap`, `drill list|hint`, and the refusals that keep the control API safe."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import trio
from click.testing import CliRunner

from middlebox.cli.main import main
from middlebox.observe.prometheus import parse_text
from tests.shell.support import EVENTS, http, sse_upstream

SCENARIO = b"name: slow\npath:\n  - latency: {delay: 2ms}\n"


async def test_a_user_applies_a_scenario_over_the_control_api_and_watches_metrics(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.ndjson"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, sse_upstream, 0, host="127.0.0.1")
            )
            upstream = listeners[0].socket.getsockname()[1]
            process = await trio.lowlevel.open_process(
                [str(Path(sys.executable).parent / "middlebox"), "proxy", "--listen", "127.0.0.1:0",
                 "--upstream", f"http://127.0.0.1:{upstream}", "--control", "127.0.0.1:0",
                 "--journal", str(journal)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            assert process.stdout is not None
            first = b""
            while b"\n" not in first:
                data = await process.stdout.receive_some(4096)
                assert data, first
                first += data
            ports = re.findall(rb"http://127\.0\.0\.1:(\d+)", first)
            proxy_port, control_port = int(ports[0]), int(ports[1])

            status, body, _ = await http(control_port, "PUT", "/scenario", SCENARIO)
            assert status == 200, body
            status, body, _ = await http(proxy_port, "POST", "/v1/chat/completions", b"{}")
            assert status == 200 and body.endswith(b"0\r\n\r\n") and EVENTS[1] in body
            await trio.sleep(0.2)
            _, text, _ = await http(control_port, "GET", "/metrics")
            samples = parse_text(text.decode())
            assert samples['middlebox_faults_fired_total{fault="latency",action="delaying"}'] >= 1
            assert samples["middlebox_connections_total"] == 1

            process.send_signal(signal.SIGINT)
            rest = b""
            while data := await process.stdout.receive_some(4096):
                rest += data
            assert await process.wait() == 0, rest
            assert b"stopped: 1 connections" in rest
            nursery.cancel_scope.cancel()
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert any(line["type"] == "fault" and line["fault"] == "latency" for line in lines)


def test_the_control_api_will_not_listen_beyond_loopback_without_a_token() -> None:
    result = CliRunner().invoke(
        main,
        ["proxy", "--upstream", "http://127.0.0.1:1", "--control", "0.0.0.0:0"],
        env={"MIDDLEBOX_CONTROL_TOKEN": ""},
    )
    assert result.exit_code != 0
    assert "needs a token" in result.output


def test_the_scenario_header_needs_a_scenario_directory() -> None:
    result = CliRunner().invoke(
        main,
        ["proxy", "--upstream", "http://127.0.0.1:1", "--control", "127.0.0.1:0",
         "--allow-scenario-header"],
    )  # fmt: skip
    assert result.exit_code == 2 and "--scenario-dir" in result.output


def test_pcap_writes_packets_from_a_journal(tmp_path: Path) -> None:
    from middlebox.observe.journal import JournalStore
    from tests.observe.test_journal import one_exchange

    store = JournalStore(capture=True, clock_offset=0.0)
    one_exchange(store.observer(1, 0.0))
    store.write_ndjson(tmp_path / "j.ndjson")
    result = CliRunner().invoke(
        main, ["pcap", str(tmp_path / "j.ndjson"), "-o", str(tmp_path / "run.pcapng")]
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"wrote \d+ packets", result.output)
    assert (tmp_path / "run.pcapng").stat().st_size > 500


def test_pcap_of_a_file_that_is_no_journal_is_one_line_naming_it(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text('{"a": 1,\n"b": 2}\n')
    result = CliRunner().invoke(main, ["pcap", str(report), "-o", str(tmp_path / "x.pcapng")])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {report}:1: not a JSON line")
    assert result.output.endswith(
        "a journal (NDJSON: one JSON object a line, as `--journal` writes it) was expected\n"
    )
    assert result.output.count("\n") == 1 and result.exception is not None
    assert isinstance(result.exception, SystemExit)  # no traceback


def test_pcap_refuses_an_output_named_for_no_capture_format(tmp_path: Path) -> None:
    from middlebox.observe.journal import JournalStore
    from tests.observe.test_journal import one_exchange

    store = JournalStore(capture=True, clock_offset=0.0)
    one_exchange(store.observer(1, 0.0))
    store.write_ndjson(tmp_path / "j.ndjson")
    out = tmp_path / "out.txt"
    result = CliRunner().invoke(main, ["pcap", str(tmp_path / "j.ndjson"), "-o", str(out)])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: {out}: the capture's format comes from its name: end it in .pcapng "
        "(packets with comments) or .pcap (packets alone)\n"
    )
    assert not out.exists()


def test_drill_list_and_hint() -> None:
    runner = CliRunner()
    listing = runner.invoke(main, ["drill", "list"])
    assert listing.exit_code == 0 and "silent-truncation" in listing.output
    assert len(listing.output.strip().splitlines()) >= 6
    first = runner.invoke(main, ["drill", "hint", "silent-truncation", "1"])
    assert first.exit_code == 0 and "what the user saw" in first.output
    bad = runner.invoke(main, ["drill", "hint", "silent-truncation", "99"])
    assert bad.exit_code == 1 and "hints 1 to" in bad.output
