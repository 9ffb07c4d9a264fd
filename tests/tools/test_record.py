"""`middlebox record`: responses from a real server become cassettes in the emulator's
format (status, headers, timed body writes), and the emulator replays them."""

from __future__ import annotations

import base64
import json
import urllib.request
from functools import partial
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from middlebox.core.stream import DOWN, UP
from middlebox.observe.journal import ConnectionJournal
from middlebox.shell.server import Address
from middlebox.tools.record import cassettes, record
from tests.observe.test_journal import EVENT1, EVENT2, REQUEST, one_exchange
from tests.shell.support import EVENTS, http, sse_upstream


def body_of(cassette: dict[str, object]) -> bytes:
    return b"".join(base64.b64decode(data) for _, data in cassette["writes"])  # type: ignore[attr-defined]


def test_a_journaled_exchange_becomes_one_cassette_with_timed_dechunked_writes() -> None:
    journal = ConnectionJournal(1, 0.0, capture=True)
    one_exchange(journal)  # the server resets before its terminal chunk
    (cassette,) = cassettes(journal)
    assert cassette["status"] == 200
    assert cassette["truncated"] == "read_rst"
    assert ["content-type", "text/event-stream"] in cassette["headers"]
    assert body_of(cassette) == EVENT1 + EVENT2  # chunk framing removed
    # the request was written upstream at 1.2; the body reads came at 2.0, 3.0 and 4.0
    assert [at for at, _ in cassette["writes"]] == pytest.approx([0.8, 1.8, 2.8])
    request = cassette["request"]
    assert (request["method"], request["target"], request["body"]) == (
        "POST",
        "/v1/chat/completions",
        {},
    )
    assert ["Authorization", "[redacted]"] in request["headers"]
    assert REQUEST  # the journal's request carried a real bearer token


def test_a_response_still_open_is_not_a_cassette() -> None:
    journal = ConnectionJournal(1, 0.0, capture=True)
    journal.wrote("upstream", UP, REQUEST, 1.0)
    journal.read("upstream", DOWN, b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", 2.0)
    assert cassettes(journal) == []


async def test_the_recorder_writes_a_cassette_for_each_finished_response(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    written: list[Path] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, sse_upstream, 0, host="127.0.0.1")
            )
            upstream = Address("127.0.0.1", listeners[0].socket.getsockname()[1])
            port = await nursery.start(_record, upstream, tmp_path / "tapes", written.append)
            status, _, _ = await http(port, "POST", "/v1/chat/completions", b'{"a": 1}')
            assert status == 200
            while not written:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    (path,) = written
    cassette = json.loads(path.read_text())
    assert body_of(cassette) == b"".join(EVENTS)
    assert cassette["request"]["body"] == {"a": 1}


async def _record(
    upstream: Address, out: Path, on_cassette: object, *, task_status: object
) -> None:
    await record(
        Address("127.0.0.1", 0),
        upstream,
        out,
        ready=task_status.started,  # type: ignore[attr-defined]
        on_cassette=on_cassette,  # type: ignore[arg-type]
    )


@pytest.mark.e2e
def test_the_emulator_replays_a_recorded_cassette(tmp_path: Path) -> None:
    from middlebox.run.processes import EmulatorProcess

    journal = ConnectionJournal(1, 0.0, capture=True)
    one_exchange(journal)
    (cassette,) = cassettes(journal)
    cassette["writes"] = [[at / 100, data] for at, data in cassette["writes"]]  # quick replay
    tape = tmp_path / "tape.json"
    tape.write_text(json.dumps(cassette))
    emulator = EmulatorProcess({"cassette": str(tape)}, tmp_path)
    try:
        request = urllib.request.Request(
            f"{emulator.url}/v1/chat/completions",
            data=json.dumps({"model": "x", "messages": [], "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.read() == EVENT1 + EVENT2
    finally:
        emulator.stop()
